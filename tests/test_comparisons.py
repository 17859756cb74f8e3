"""Paired comparisons: bootstrap CI, exact McNemar, Wilcoxon, Holm and McNemar's power."""

from __future__ import annotations

import re

import numpy as np
import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.stats.comparisons import (
    compare,
    holm,
    mcnemar_exact_p,
    mcnemar_power,
    paired_bootstrap_ci,
)
from reasonrl.stats.metrics import bootstrap_ci


def _scores(values) -> dict[str, float]:
    return {f"p{i:03d}": float(v) for i, v in enumerate(values)}


def test_mcnemar_is_the_exact_binomial_on_discordant_pairs():
    # 8 problems only a solves, 1 only b solves: p = 2 * P(X <= 1 | 9, 1/2) = 20 / 512.
    a = np.array([1] * 8 + [0] * 1 + [1] * 5 + [0] * 6)
    b = np.array([0] * 8 + [1] * 1 + [1] * 5 + [0] * 6)
    assert mcnemar_exact_p(a, b) == pytest.approx(20 / 512)
    assert mcnemar_exact_p(a, a) == 1.0


def test_pairing_sees_a_gain_that_separate_intervals_hide():
    # b solves half; a solves the same problems plus 12 more of 200: every discordant pair
    # favours a, so the paired CI excludes 0 while the two arms' own CIs overlap.
    b = np.array([1] * 100 + [0] * 100, dtype=float)
    a = b.copy()
    a[100:112] = 1
    low, high = paired_bootstrap_ci(a, b)
    assert 0 < low <= 0.06 <= high
    a_low, a_high = bootstrap_ci(a)
    b_low, b_high = bootstrap_ci(b)
    assert a_low < b_high


def test_paired_ci_is_zero_width_for_identical_arms_and_reruns_agree():
    a = np.array([1, 0, 1, 1, 0], dtype=float)
    assert paired_bootstrap_ci(a, a) == (0.0, 0.0)
    b = np.array([0, 0, 1, 0, 0], dtype=float)
    assert paired_bootstrap_ci(a, b) == paired_bootstrap_ci(a, b)


def test_compare_reports_difference_a_minus_b_with_power():
    a = _scores([1] * 30 + [0] * 10)
    b = _scores([1] * 20 + [0] * 20)
    row = compare("x_vs_y", "greedy_pass@1", "x", "y", a, b)
    assert row["n"] == 40
    assert row["value_a"] == 0.75 and row["value_b"] == 0.5
    assert row["diff"] == pytest.approx(0.25)
    assert row["test"] == "mcnemar_exact"
    assert row["p"] == pytest.approx(2 / 1024)
    assert 0 < row["power"] < 1


def test_compare_uses_signed_rank_for_real_scores():
    rng = np.random.default_rng(0)
    base = rng.normal(size=60)
    row = compare("r", "reward", "x", "y", _scores(base + 0.5), _scores(base))
    assert row["test"] == "wilcoxon_signed_rank"
    assert row["p"] < 1e-6
    assert "power" not in row
    assert row["ci_low"] == pytest.approx(0.5) and row["ci_high"] == pytest.approx(0.5)


def test_noninferiority_tests_the_shifted_null_one_sided():
    # b solves 200 of 400; a loses 4 of them (diff -0.01): within a 0.03 margin, shown;
    # losing 20 (diff -0.05) is beyond it; margin 0 keeps the two-sided McNemar test.
    b = np.array([1] * 200 + [0] * 200)
    close, far = b.copy(), b.copy()
    close[:4], far[:20] = 0, 0
    row = compare("easy", "greedy_pass@1", "x", "y", _scores(close), _scores(b), margin=0.03)
    assert row["test"] == "noninferiority_paired_t" and row["margin"] == 0.03
    assert row["diff"] == pytest.approx(-0.01) and row["ci_low"] > -0.03
    assert row["p"] < 1e-3
    assert compare("easy", "m", "x", "y", _scores(far), _scores(b), margin=0.03)["p"] > 0.5
    plain = compare("easy", "m", "x", "y", _scores(close), _scores(b))
    assert plain["test"] == "mcnemar_exact" and "margin" not in plain
    same = compare("easy", "m", "x", "y", _scores(b), _scores(b), margin=0.03)
    assert same["p"] == 0.0  # no spread: a - b = 0 > -0.03 for every problem


def test_arms_on_different_problems_are_refused():
    with pytest.raises(ReasonRLError, match="comparison 'c'.*different problems.*'p001'"):
        compare("c", "m", "x", "y", {"p000": 1.0, "p001": 0.0}, {"p000": 1.0})


def test_holm_steps_down_over_the_declared_comparisons():
    rows = [{"name": n, "p": p} for n, p in (("a", 0.01), ("b", 0.04), ("c", 0.03))]
    adjusted = {row["name"]: row["p_holm"] for row in holm(rows)}
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})


def test_mcnemar_power_matches_simulation():
    n, p_a_only, p_b_only = 60, 0.15, 0.03
    rng = np.random.default_rng(1)
    draws = rng.multinomial(n, [p_a_only, p_b_only, 1 - p_a_only - p_b_only], size=4000)
    rejected = [
        mcnemar_exact_p(np.array([1] * x + [0] * y), np.array([0] * x + [1] * y)) <= 0.05
        for x, y, _ in draws
    ]
    assert mcnemar_power(n, p_a_only, p_b_only) == pytest.approx(np.mean(rejected), abs=0.03)
    assert mcnemar_power(n, 0.0, 0.0) == 0.0


def test_rows_match_the_comparison_schema(tmp_path):
    from reasonrl.io import read_jsonl, write_jsonl

    rows = holm(
        [
            compare("x_vs_y", "greedy_pass@1", "x", "y", _scores([1, 1, 0]), _scores([0, 1, 0])),
            compare("r", "reward", "x", "y", _scores([0.5, 0.2]), _scores([0.1, 0.2])),
        ]
    )
    write_jsonl(tmp_path / "c.jsonl", rows, schema="comparison")
    assert read_jsonl(tmp_path / "c.jsonl", schema="comparison") == rows


def _trajectories(path, outcomes: list[bool]) -> str:
    from reasonrl.io import write_jsonl

    rows = [
        {
            "problem_id": f"arith-test-{i:05d}",
            "task": "arith",
            "sample": 0,
            "messages": [{"role": "user", "content": "q"}],
            "final_answer": "1",
            "correct": correct,
            "finish_reason": "answer",
            "num_turns": 1,
            "num_tokens": 3,
            "tool_status": [],
            "decoding": "greedy",
        }
        for i, correct in enumerate(outcomes)
    ]
    # A sampled row must not count: only greedy rows are the policy's pass@1.
    rows.append({**rows[0], "sample": 1, "decoding": "sampled", "correct": not rows[0]["correct"]})
    write_jsonl(path, rows, schema="trajectory")
    return str(path)


def test_report_resolves_the_selected_round_and_writes_the_comparisons(tmp_path):
    import json

    from reasonrl.cli import main

    sft = _trajectories(tmp_path / "sft.jsonl", [True] * 10 + [False] * 30)
    round1 = _trajectories(tmp_path / "r1.jsonl", [True] * 25 + [False] * 15)
    best = tmp_path / "best.json"
    best.write_text(json.dumps({"best": "mdpo-round1", "rounds": []}))
    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        json.dumps({"policy": "sft-tool", "task": "arith", "greedy_pass@1": 0.25,
                    "greedy_pass@1_ci": [0.1, 0.4], "n_problems": 40})
    )  # fmt: skip
    config = {
        "comparisons": {
            "declared": [
                {"name": "mdpo_vs_sft", "a": "mdpo-best", "b": "sft-tool", "task": "arith"},
                {"name": "sft_vs_round1", "a": "sft-tool", "b": "mdpo-round1", "task": "arith"},
            ]
        }
    }
    out = tmp_path / "report"
    main(
        ["report", "--config-json", json.dumps(config), "--metrics", str(metrics),
         "--arm", f"arith/sft-tool={sft}", "--arm", f"arith/mdpo-round1={round1}",
         "--best", f"mdpo={best}", "--out-dir", str(out)]
    )  # fmt: skip
    rows = json.loads((out / "comparisons.json").read_text())
    assert [r["name"] for r in rows] == ["mdpo_vs_sft", "sft_vs_round1"]
    assert rows[0]["a"] == "mdpo-best (mdpo-round1)" and rows[0]["n"] == 40
    assert rows[0]["diff"] == pytest.approx(15 / 40) and rows[0]["ci_low"] > 0
    assert rows[0]["p"] == pytest.approx(2 * 0.5**15)
    assert rows[0]["p_holm"] == pytest.approx(2 * rows[0]["p"])
    assert "a > b" in (out / "comparisons.md").read_text()
    assert (out / "comparisons.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "comparisons.csv").read_text().startswith("name,metric,a,b,n,")
    index = (out / "index.md").read_text()
    assert "mdpo_vs_sft" in index and "comparisons.png" in index


def test_report_states_a_noninferiority_verdict(tmp_path):
    import json

    from reasonrl.cli import main

    sft = _trajectories(tmp_path / "sft.jsonl", [True] * 200 + [False] * 200)
    round1 = _trajectories(tmp_path / "r1.jsonl", [False] * 4 + [True] * 196 + [False] * 200)
    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        json.dumps({"policy": "sft-tool", "task": "arith", "greedy_pass@1": 0.5,
                    "greedy_pass@1_ci": [0.45, 0.55], "n_problems": 400})
    )  # fmt: skip
    declared = {"name": "easy_cost", "a": "mdpo-round1", "b": "sft-tool", "task": "arith"}
    config = {"comparisons": {"declared": [{**declared, "margin": 0.03}]}}
    out = tmp_path / "report"
    main(
        ["report", "--config-json", json.dumps(config), "--metrics", str(metrics),
         "--arm", f"arith/sft-tool={sft}", "--arm", f"arith/mdpo-round1={round1}",
         "--out-dir", str(out)]
    )  # fmt: skip
    [row] = json.loads((out / "comparisons.json").read_text())
    assert row["margin"] == 0.03 and row["p_holm"] < 0.05
    assert "a >= b - 0.03" in (out / "comparisons.md").read_text()
    assert ",0.03,noninferiority_paired_t," in (out / "comparisons.csv").read_text()


def test_a_policy_compared_on_two_tasks_is_scored_on_each(tmp_path):
    """A method's gain on the frontier and its cost on the easy band: the same two policies,
    each comparison on its own task's trajectories (not the last task's for both)."""
    import json

    from reasonrl.cli import main

    frontier = {
        "sft-tool": _trajectories(tmp_path / "f-sft.jsonl", [False] * 30 + [True] * 10),
        "mdpo-round1": _trajectories(tmp_path / "f-r1.jsonl", [True] * 40),
    }
    easy = {
        "sft-tool": _trajectories(tmp_path / "e-sft.jsonl", [True] * 20),
        "mdpo-round1": _trajectories(tmp_path / "e-r1.jsonl", [True] * 19 + [False]),
    }
    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        json.dumps({"policy": "sft-tool", "task": "arith", "greedy_pass@1": 1.0,
                    "greedy_pass@1_ci": [1.0, 1.0], "n_problems": 20})
    )  # fmt: skip
    pair = {"a": "mdpo-round1", "b": "sft-tool"}
    declared = [
        {"name": "gain", **pair, "task": "arith3"},
        {"name": "cost", **pair, "task": "arith", "margin": 0.1},
    ]
    arms = [f"arith3/{policy}={path}" for policy, path in frontier.items()]
    arms += [f"arith/{policy}={path}" for policy, path in easy.items()]
    out = tmp_path / "report"
    main(
        ["report", "--config-json", json.dumps({"comparisons": {"declared": declared}}),
         "--metrics", str(metrics), *[f"--arm={arm}" for arm in arms], "--out-dir", str(out)]
    )  # fmt: skip
    gain, cost = json.loads((out / "comparisons.json").read_text())
    assert (gain["n"], gain["diff"]) == (40, pytest.approx(30 / 40))
    assert (cost["n"], cost["diff"]) == (20, pytest.approx(-1 / 20))


def test_declared_arm_the_config_does_not_evaluate_is_one_line():
    from reasonrl.config import validate_config

    raw = {
        "comparisons": {
            "declared": [{"name": "x", "a": "kto-best", "b": "sft-tool", "task": "arith"}]
        }
    }
    with pytest.raises(
        ReasonRLError, match=r"'comparisons.declared.0.a': 'kto-best' is not a policy"
    ):
        validate_config(raw, "my.yaml")
    raw["comparisons"]["declared"][0].update(a="mdpo-best", task="pycode")
    with pytest.raises(ReasonRLError, match=r"declared.0.a': 'mdpo-best' is not .* on 'pycode'"):
        validate_config(raw, "my.yaml")


def test_an_online_arm_is_compared_on_its_task_and_the_evaluation_tasks_a_ppo_arm_on_its_own():
    from reasonrl.config import evaluated_arms, validate_config

    raw = {
        "tasks": {
            "arith": {"kind": "arith"},
            "arith3": {"kind": "arith"},
            "pycode": {"kind": "pycode"},
        },
        "evaluation": {"tasks": ["arith"]},
        "online_dpo": {"task": "arith3", "variants": [{"name": "async"}]},
        "ppo": {"task": "pycode", "variants": [{"name": "s", "filter": "ppo-s"}]},
    }
    arms = evaluated_arms(validate_config(raw))
    assert arms["online-async"] == ["arith3", "arith"]
    assert arms["ppo-s"] == ["pycode"]
    assert arms["sft-tool"] == ["arith", "pycode"]  # PPO's start, scored on its task too
    start = {"name": "ppo_vs_sft", "a": "ppo-s", "b": "sft-tool", "task": "pycode"}
    validate_config({**raw, "comparisons": {"declared": [start]}})
    cost = {"name": "cost", "a": "online-async", "b": "sft-tool", "task": "arith", "margin": 0.03}
    validate_config({**raw, "comparisons": {"declared": [cost]}})
    with pytest.raises(ReasonRLError, match=r"'ppo-s' is not a policy this config evaluates"):
        validate_config({**raw, "comparisons": {"declared": [{**cost, "a": "ppo-s"}]}})


def test_a_search_arm_scores_each_problem_as_the_best_of_n_table_does(tmp_path):
    from best_of_n_files import groups_by_hand, write_best_of_n

    from reasonrl.config import search_arm
    from reasonrl.search import best_of_n_metrics, search_arm_scores

    folder = write_best_of_n(tmp_path)
    table = best_of_n_metrics(groups_by_hand(), [2, 4], ["orm", "prm-min"])
    expected = {(row["method"], row["N"]): row["accuracy"] for row in table["rows"]}
    for arm, method, n in [
        ("bon:maj@4", "maj@N", 4),
        ("bon:prm-min@4", "prm-min@N", 4),
        ("bon:orm@2", "orm@N", 2),
        ("bon:pass@4", "pass@N", 4),
        ("bon:vote-prm-min@4", "vote-prm-min@N", 4),
        ("bon:vote-orm@2", "vote-orm@N", 2),
    ]:
        scores = search_arm_scores(search_arm(arm), folder)
        assert sorted(scores) == [f"arith-test-{i:05d}" for i in range(4)]
        assert np.mean(list(scores.values())) == pytest.approx(expected[method, n]), arm
    # By hand at N = 4: the vote wins p0, loses p1 and p2, splits the 8/9 tie of p3; the
    # PRM's top sample is right on p1 only.
    assert list(search_arm_scores(search_arm("bon:maj@4"), folder).values()) == [1, 0, 0, 0.5]
    assert list(search_arm_scores(search_arm("bon:prm-min@4"), folder).values()) == [0, 1, 0, 0]
    # Weighted by PRM-min: "4" (0.8) beats "3" (0.5) on p0, "6" (0.9) beats "7" (0.3) on p1,
    # "9" (0.9) beats "8" (0.7) on p3; by the ORM, "8" and "9" tie at 0.5 on p3.
    vote = search_arm_scores(search_arm("bon:vote-prm-min@4"), folder)
    assert list(vote.values()) == [0, 1, 0, 0]
    assert list(search_arm_scores(search_arm("bon:vote-orm@4"), folder).values()) == [1, 1, 0, 0.5]
    greedy = search_arm_scores(search_arm("bon:greedy"), folder)
    assert greedy == {"arith-test-00000": 1.0, "arith-test-00001": 0.0,
                      "arith-test-00002": 0.0, "arith-test-00003": 0.0}  # fmt: skip
    with pytest.raises(ReasonRLError, match="best-of-8 needs 8 samples, there are 4"):
        search_arm_scores(search_arm("bon:maj@8"), folder)


def test_a_matched_arm_scores_all_of_each_problems_matched_samples(tmp_path):
    from best_of_n_files import write_matched

    from reasonrl.config import search_arm
    from reasonrl.search import search_arm_scores

    folder = write_matched(tmp_path, [3, 2, 1])
    # p0 ("3", "4", "3"): the vote is right, the PRM's top (0.8) wrong; p1 ("7", "6"): a
    # 1-1 tie, the PRM's top right; p2: its one sample is wrong.
    maj = search_arm_scores(search_arm("hgs-matched:maj"), folder)
    assert maj == {"arith-test-00000": 1.0, "arith-test-00001": 0.5, "arith-test-00002": 0.0}
    prm = search_arm_scores(search_arm("hgs-matched:prm-min"), folder)
    assert list(prm.values()) == [0.0, 1.0, 0.0]


def test_matched_selections_are_the_vote_oracle_and_the_prm_scorers():
    from reasonrl.config import MATCHED_SELECTIONS
    from reasonrl.rewards.scoring import AGGREGATIONS

    assert set(MATCHED_SELECTIONS) == {"pass", "maj"} | {f"prm-{how}" for how in AGGREGATIONS}


def test_search_arm_selections_are_the_scorers_the_reward_models_write():
    from reasonrl.config import BEST_OF_N_SELECTIONS
    from reasonrl.rewards.scoring import AGGREGATIONS

    probabilities = {"orm"} | {f"prm-{how}" for how in AGGREGATIONS}
    votes = {f"vote-{scorer}" for scorer in probabilities}  # the BT-RM's logit weighs none
    assert set(BEST_OF_N_SELECTIONS) == {"pass", "maj", "bt"} | probabilities | votes


@pytest.mark.parametrize(
    ("a", "b", "reward_models", "message"),
    [
        ("bon:vote@4", "bon:maj@4", {}, r"'bon:vote@4' selects by 'vote', not one of pass, maj"),
        ("bon:maj", "bon:greedy", {}, r"'bon:maj' is not bon:greedy or bon:SELECTION@N"),
        ("bon:maj@32", "bon:greedy", {}, r"'bon:maj@32' selects from 32 samples; .* draws 16"),
        ("hgs", "bon:greedy", {"tasks": []}, r"'hgs' needs best-of-N data of 'arith'"),
        ("bon:greedy", "hgs", {"hgs": {"tasks": []}}, r"\.b': 'hgs' needs the HGS-PRM search"),
        ("hgs-matched:orm", "hgs", {}, r"'hgs-matched:orm' selects by 'orm', not one of pass"),
        ("hgs-matched:", "hgs", {}, r"'hgs-matched:' selects by '', not one of pass, maj"),
        ("bon:greedy", "hgs-matched:maj", {"hgs": {"tasks": []}}, r"\.b': 'hgs-matched:maj' needs"),
        ("bon:maj@4", "sft-tool", {}, r"'comparisons.declared.0': pairs a policy with a search"),
    ],
)
def test_a_search_arm_the_config_does_not_produce_is_one_line(a, b, reward_models, message):
    from reasonrl.config import validate_config

    raw = {
        "tasks": {"arith": {"kind": "arith"}},
        "reward_models": {
            "tasks": ["arith"],
            "best_of_n": {"n": [1, 4, 16]},
            **reward_models,
            "hgs": {"tasks": ["arith"], **reward_models.get("hgs", {})},
        },
        "comparisons": {"declared": [{"name": "x", "a": a, "b": b, "task": "arith"}]},
    }
    with pytest.raises(
        ReasonRLError, match=r"^my\.yaml: config key 'comparisons\.declared\.0"
    ) as e:
        validate_config(raw, "my.yaml")
    assert "\n" not in str(e.value)
    assert re.search(message, str(e.value))


def test_declared_search_arms_validate():
    from reasonrl.config import validate_config

    declared = [
        {"name": "prm_vs_maj", "a": "bon:prm-min@16", "b": "bon:maj@16", "task": "arith"},
        {"name": "hgs_vs_greedy", "a": "hgs", "b": "bon:greedy", "task": "arith"},
        {"name": "hgs_vs_matched", "a": "hgs", "b": "hgs-matched:prm-min", "task": "arith"},
    ]
    raw = {
        "reward_models": {"tasks": ["arith"], "best_of_n": {"n": [1, 4, 16]}},
        "comparisons": {"declared": declared},
    }
    assert validate_config(raw, "my.yaml")["comparisons"]["declared"][0]["a"] == "bon:prm-min@16"


def test_report_writes_the_search_comparisons(tmp_path):
    import json

    from best_of_n_files import write_best_of_n, write_hgs, write_matched

    from reasonrl.cli import main

    best_of_n = write_best_of_n(tmp_path / "search/arith/best-of-n")
    hgs = write_hgs(tmp_path / "search/arith/hgs", [True, True, False])
    write_matched(hgs, [3, 2, 1])
    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        json.dumps({"policy": "sft-tool", "task": "arith", "greedy_pass@1": 0.25,
                    "greedy_pass@1_ci": [0.1, 0.4], "n_problems": 4})
    )  # fmt: skip
    declared = [
        {"name": "prm_vs_maj", "a": "bon:prm-min@4", "b": "bon:maj@4", "task": "arith"},
        {"name": "orm_vs_maj", "a": "bon:orm@4", "b": "bon:maj@4", "task": "arith"},
        {"name": "hgs_vs_greedy", "a": "hgs", "b": "bon:greedy", "task": "arith"},
        {"name": "hgs_vs_matched", "a": "hgs", "b": "hgs-matched:prm-min", "task": "arith"},
    ]
    out = tmp_path / "report"
    main(
        ["report", "--config-json", json.dumps({"comparisons": {"declared": declared}}),
         "--metrics", str(metrics), "--search", f"arith/best-of-n={best_of_n}",
         "--search", f"arith/hgs={hgs}", "--out-dir", str(out)]
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads((out / "comparisons.json").read_text())}
    prm = rows["prm_vs_maj"]
    assert (prm["a"], prm["b"], prm["metric"], prm["n"]) == ("bon:prm-min@4", "bon:maj@4",
                                                             "accuracy", 4)  # fmt: skip
    assert prm["value_a"] == 0.25 and prm["value_b"] == 0.375
    assert prm["test"] == "wilcoxon_signed_rank"  # the tied vote scores 0.5
    assert rows["orm_vs_maj"]["value_a"] == 0.5
    # HGS ran on the first 3 problems: greedy is paired on those (1, 0, 0), not all 4.
    hgs_row = rows["hgs_vs_greedy"]
    assert hgs_row["n"] == 3 and hgs_row["test"] == "mcnemar_exact"
    assert hgs_row["value_a"] == pytest.approx(2 / 3) and hgs_row["value_b"] == pytest.approx(1 / 3)
    matched = rows["hgs_vs_matched"]  # HGS (1, 1, 0) vs the matched PRM pick (0, 1, 0)
    assert (matched["b"], matched["n"]) == ("hgs-matched:prm-min", 3)
    assert matched["value_a"] == pytest.approx(2 / 3)
    assert matched["value_b"] == pytest.approx(1 / 3)
    assert all("p_holm" in row for row in rows.values())
    assert "hgs_vs_greedy" in (out / "comparisons.md").read_text()
    assert "bon:prm-min@4" in (out / "comparisons.csv").read_text()


def test_report_names_a_search_arm_without_its_folder(tmp_path, capsys):
    import json

    from reasonrl.cli import main

    metrics = tmp_path / "metrics.json"
    metrics.write_text(
        json.dumps({"policy": "sft-tool", "task": "arith", "greedy_pass@1": 0.25,
                    "greedy_pass@1_ci": [0.1, 0.4], "n_problems": 4})
    )  # fmt: skip
    declared = [{"name": "h", "a": "hgs", "b": "bon:greedy", "task": "arith"}]
    with pytest.raises(SystemExit):
        main(
            ["report", "--config-json", json.dumps({"comparisons": {"declared": declared}}),
             "--metrics", str(metrics), "--out-dir", str(tmp_path / "report")]
        )  # fmt: skip
    assert "comparison arm 'hgs': no hgs folder of 'arith'" in capsys.readouterr().err
