"""The verification methods' learning tests at CI size, outside `make test`
(`make test-verification`): the default's reward models and search (best-of-16 reranked by
the PRM and the ORM against the vote, HGS-PRM against greedy decoding) and PF-PPO (BR)
against PPO-S, both rewarded by the default's BT-RM (config/tables.yaml's pfppo_vs_ppo_s at
this size), from tests/learning_start.py's seed-0 start on the frontier band's own
reward_models and ppo pools, each compared on held-out frontier test problems (paired
bootstrap CI, exact McNemar p, Holm over this file's four comparisons).

At this scale all four are nulls, each a strict xfail with its recorded numbers, so a method
that starts to pay off fails it: on this task checking a step takes the same skill as
writing it (issue 47 redoes them where verifying is easier than generating). They left CI's
learning lane because their runs were a third of its compute for four known nulls
(docs/experiment-design.md, "CI's learning lane without the verification nulls").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from learning_start import (
    FRONTIER,
    METHOD_SEED,
    assert_gain,
    assert_null_holds,
    greedy_eval,
    holm_family,
    learning_config,
    train_start,
)
from side_by_side import SideBySide

from reasonrl.config import validate_config
from reasonrl.stages.data import make_pool
from reasonrl.stages.report import search_scores
from reasonrl.stages.reward_models import (
    annotate_prm,
    best_of_n,
    hgs_search,
    sample_rm_data,
    train_reward_model,
)
from reasonrl.stats.comparisons import SEARCH_METRIC, compare, same_problems

# The SFT start alone took 731 s on an idle machine (2026-11-28), the BT-RM 270 s, then the
# other reward models with their search 450 s and PF-PPO and PPO-S 425 s each, side by side.
pytestmark = [pytest.mark.learning, pytest.mark.timeout(3600)]


# PF-PPO against PPO-S (config/tables.yaml's pfppo_vs_ppo_s) at this file's size: its
# variants' filters, each rewarded by the default's BT-RM (bt_rm_run's).
RM_PPO_VARIANTS = {"s": "ppo-s", "br": "br"}


def rm_ppo_training(start: dict, name: str) -> dict:
    """PPO of RM_PPO_VARIANTS' `name` rewarded by the BT-RM of `bt_rm_run`, with the
    verifier-rewarded run's settings otherwise (the default's ppo section: the same pool,
    iterations, samples, lr and selection of the best iteration), and its greedy evaluation
    on the frontier."""
    from reasonrl.stages.ppo import ppo as run_ppo

    root = start["root"]
    variants = [{"name": name, "filter": RM_PPO_VARIANTS[name]}]
    ppo = {**start["config"]["ppo"], "reward": "rm", "variants": variants}
    config = validate_config({**start["config"], "ppo": ppo})
    pool, out = str(root / "pool-ppo/problems.jsonl"), f"ppo-{name}"
    metrics = run_ppo(config, name, str(root / "sft"), str(root / "rm-bt"), pool, str(root / out))
    return {"metrics": metrics, "eval": {FRONTIER: greedy_eval(config, root, out, FRONTIER)}}


# Issue 18's search comparisons as config.yaml declares them: arm a, arm b (search arms).
SEARCH_COMPARISONS = {
    "prm_vs_maj": ("bon:prm-min@16", "bon:maj@16"),
    "orm_vs_maj": ("bon:orm@16", "bon:maj@16"),
    "hgs_vs_greedy": ("hgs", "bon:greedy"),
}


# The default's reward models (config.yaml's reward_models section: 100 prompts x 5 samples at
# T 0.7, Math-Shepherd labels from 4 completions per step of one solution per prompt, 40 steps
# each) from the seed-0 start on the frontier's own reward_models pool, in two runs: the
# samples and the BT-RM first, which the PF-PPO runs wait for; then the PRM and ORM, and the
# search with all three as the default DAG runs it.
RM_KINDS = ("bt", "orm", "prm")


def _rm_paths(root: Path) -> dict[str, str]:
    return {
        "pool": str(root / "pool-rm/problems.jsonl"),
        "sft": str(root / "sft"),
        "samples": str(root / "rm-samples/samples.jsonl"),
        **{kind: str(root / f"rm-{kind}") for kind in RM_KINDS},
    }


def bt_rm_run(start: dict) -> dict:
    """The reward models' samples of the frontier's reward_models pool, and the BT-RM on them."""
    root, config = start["root"], start["config"]
    make_pool(config, FRONTIER, "reward_models", str(root / "pool-rm"))
    paths = _rm_paths(root)
    sampled = sample_rm_data(config, paths["sft"], paths["pool"], str(root / "rm-samples"))
    trained = train_reward_model(
        config, "bt", paths["sft"], paths["pool"], paths["samples"], paths["bt"]
    )
    return {"sampled": sampled, "trained": trained}


def reward_model_runs(start: dict) -> dict:
    """After `bt_rm_run`: Math-Shepherd labels, the PRM and the ORM; best-of-16 on the first
    100 frontier test problems and HGS-PRM on the first 30, as the default DAG runs them."""
    root, config = start["root"], start["config"]
    paths = _rm_paths(root)
    pool, sft, samples = paths["pool"], paths["sft"], paths["samples"]
    shepherd = annotate_prm(config, sft, pool, samples, str(root / "rm-shepherd"))
    data = {"orm": samples, "prm": str(root / "rm-shepherd/prm.jsonl")}
    trained = {
        kind: train_reward_model(config, kind, sft, pool, data[kind], paths[kind]) for kind in data
    }
    models = {kind: paths[kind] for kind in RM_KINDS}
    test = str(root / "data" / FRONTIER / "test.jsonl")
    table = best_of_n(config, sft, test, models, str(root / "bon"))
    hgs_search(config, sft, models["prm"], test, str(root / "bon"), str(root / "hgs"))
    folders = {f"{FRONTIER}/best-of-n": str(root / "bon"), f"{FRONTIER}/hgs": str(root / "hgs")}
    declared = [{"a": a, "b": b, "task": FRONTIER} for a, b in SEARCH_COMPARISONS.values()]
    scores = {arm: arm_scores for (_, arm), arm_scores in search_scores(declared, folders).items()}
    return {"shepherd": shepherd, "trained": trained, "table": table, "scores": scores}


def search_rows(scores: dict[str, dict[str, float]]) -> list[dict]:
    """SEARCH_COMPARISONS' rows, each arm pair on the problems of the smaller (HGS-PRM runs
    on the first 30 of best-of-N's 100)."""
    return [
        compare(name, SEARCH_METRIC, a, b, *same_problems(scores[a], scores[b]))
        for name, (a, b) in SEARCH_COMPARISONS.items()
    ]


class VerificationRuns:
    """The seed-0 start, then the BT-RM run, then the PF-PPO runs and the other reward models
    side by side (tests/side_by_side.py): all three wait for the BT-RM."""

    def __init__(self, pool: SideBySide, root: Path) -> None:
        start = pool.submit(train_start, METHOD_SEED, root, ()).result()
        make_pool(start["config"], FRONTIER, "ppo", str(root / "pool-ppo"))
        self.bt = pool.submit(bt_rm_run, start).result()
        self._ppo = {name: pool.submit(rm_ppo_training, start, name) for name in RM_PPO_VARIANTS}
        self._reward_models = pool.submit(reward_model_runs, start)

    def reward_models(self) -> dict:
        return self._reward_models.result()

    def ppo(self, name: str) -> dict:
        return self._ppo[name].result()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Iterator[VerificationRuns]:
    pool = SideBySide(workers=3)
    try:
        yield VerificationRuns(pool, tmp_path_factory.mktemp("start0"))
    finally:
        pool.close()


@pytest.fixture(scope="module")
def rm_run(runs) -> dict:
    bt, rest = runs.bt, runs.reward_models()
    return {**rest, "sampled": bt["sampled"], "trained": {"bt": bt["trained"], **rest["trained"]}}


@pytest.fixture(scope="module")
def rm_ppo_runs(runs) -> dict[str, dict]:
    return {name: runs.ppo(name) for name in RM_PPO_VARIANTS}


@pytest.fixture(scope="module")
def comparisons(rm_run, rm_ppo_runs) -> dict[str, dict]:
    """The file's pre-registered comparisons, Holm-adjusted together."""
    rows = search_rows(rm_run["scores"])
    rows.append(
        compare("pfppo_vs_ppo_s", "greedy_pass@1", "pfppo-br", "ppo-s",
                rm_ppo_runs["br"]["eval"][FRONTIER]["scores"],
                rm_ppo_runs["s"]["eval"][FRONTIER]["scores"])
    )  # fmt: skip
    return holm_family("test_verification_learning", rows)


def test_reward_models_learn_from_the_frontier_pool_and_leave_the_vote_headroom(rm_run):
    """What the three search comparisons below stand on: real reward-model data, both
    Math-Shepherd labels, and best-of-16 samples a reranker could pick better from than the
    vote (pass@16 above maj@16)."""
    # Measured (2026-11-27): 500 samples (accuracy 0.694), labels 135 "+" / 65 "-", pass@16
    # 0.78 against maj@16 0.72 and greedy 0.70 on the first 100 frontier test problems.
    assert rm_run["sampled"]["samples"] == 500, rm_run["sampled"]
    labels = rm_run["shepherd"]["labels"]
    assert labels.get("+", 0) > 0 and labels.get("-", 0) > 0, labels
    rows = {row["method"]: row["accuracy"] for row in rm_run["table"]["rows"] if row["N"] == 16}
    assert rows["pass@N"] > rows["maj@N"] + 0.05, rows


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: prm-min@16 0.660 vs maj@16 0.740 on 100 problems, -0.080 "
    "[-0.150, -0.010], p 0.057, p_holm 0.23 over this file's four (2026-12-07); the PRM called "
    "every held-out step '+' (2026-11-27)",
)
def test_best_of_16_by_the_prm_beats_majority_vote_on_the_frontier(rm_run, comparisons):
    # Measured (2026-11-27): 200 Math-Shepherd steps of 100 solutions (2 per solution: the
    # program and the answer), "-" precision 0.91 and recall 1.00 against the steps' exact
    # correctness; the PRM after 40 steps predicts "+" for all 20 held-out steps. 13 % of the
    # problems are discordant (3 PRM-only, 10 vote-only): McNemar has 80 % power there only for
    # a gain of 0.105, and a +0.05 gain would need about 500 problems.
    assert_null_holds(comparisons["prm_vs_maj"], -0.150, -0.010)
    assert_gain(comparisons["prm_vs_maj"])


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: orm@16 0.690 vs maj@16 0.740 on 100 problems, -0.050 "
    "[-0.110, +0.010], p 0.23, p_holm 0.68 over this file's four (2026-12-07)",
)
def test_best_of_16_by_the_orm_beats_majority_vote_on_the_frontier(rm_run, comparisons):
    # Measured (2026-11-27): ORM held-out accuracy 0.66 on 50 solutions; 7 % of the problems
    # discordant (1 ORM-only, 6 vote-only), too few for any gain to reach 80 % power on 100
    # problems; a +0.05 gain at that discordance would need about 300.
    assert_null_holds(comparisons["orm_vs_maj"], -0.110, +0.010)
    assert_gain(comparisons["orm_vs_maj"])


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: HGS-PRM 0.800 vs greedy 0.867 on 30 problems, -0.067 "
    "[-0.167, +0.000], p 0.5, p_holm 1 over this file's four (2026-12-07); on 2026-11-27 the "
    "PRM accepted every step, so HGS never backtracked",
)
def test_hgs_prm_beats_greedy_decoding_on_the_frontier(rm_run, comparisons):
    # Measured (2026-11-27): 2 policy calls per problem (the program, the answer), 0
    # backtracks; the compute-matched sample (1 per problem) is 0.833 too. No problem is
    # discordant, so the test has no power at all at this scale. On 2026-12-07 greedy won 2
    # problems HGS lost and none the other way (power 0.01).
    assert_null_holds(comparisons["hgs_vs_greedy"], -0.167, +0.000)
    assert_gain(comparisons["hgs_vs_greedy"])


def test_ppo_rewarded_by_the_bt_rm_filters_and_stays_in_its_trust_region(rm_ppo_runs):
    """What pfppo_vs_ppo_s stands on: both variants train on the BT-RM's reward within the
    trust region, PPO-S on one response to each of N x the queries, PF-PPO (BR) on the best
    and a random one of each query's N (the paper's Table 4), whose buffer the RM rates
    above the samples it was drawn from."""
    ppo = learning_config(METHOD_SEED)["ppo"]
    prompts, n = ppo["prompts_per_iteration"], ppo["responses_per_prompt"]
    rows = {"s": prompts * n, "br": prompts * ppo["draws_per_prompt"]}
    for name, run in rm_ppo_runs.items():
        metrics = run["metrics"]
        assert max(h["clip_fraction"] for h in metrics["history"]) < 0.2, name
        assert {it["buffer_rows"] for it in metrics["iterations"]} == {rows[name]}, name
    # Measured (2026-11-29): buffers of 64 (PPO-S) and 32 (BR) rows every iteration; clip
    # fraction at most 0.003, KL to the start at most 0.50 (PPO-S) and 0.13 (BR); BR's buffer
    # rated 1.10 against its samples' 0.97 on average. The RM's reward of the samples rises
    # (PPO-S 0.71 -> 1.42, BR -0.14 -> 1.55) while held-out pass@1 stays at 0.69-0.72.
    filtered = rm_ppo_runs["br"]["metrics"]["iterations"]
    kept, drawn = (sum(it[key] for it in filtered) for key in ("reward_buffer", "reward_sampled"))
    assert kept > drawn, filtered


@pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="a null at this scale: PF-PPO (BR) 0.7725 vs PPO-S 0.780 on 400 problems, -0.0075 "
    "[-0.025, +0.008], p 0.55, p_holm 1 over this file's four (2026-12-07); on 2026-11-29 the "
    "default's BT-RM (15 pairs) ranked its 2 held-out pairs wrong, so both optimise a reward "
    "that does not track correctness",
)
def test_pf_ppo_beats_ppo_s_with_the_bt_rm_on_the_frontier(rm_ppo_runs, comparisons):
    # Measured (2026-11-29): best iterations 4 and 4 by held-out pass@1 (BR 0.72, PPO-S 0.70;
    # the start 0.70); against the start (0.730) BR +0.000 and PPO-S +0.005. 10 of 400
    # problems discordant (4 BR-only, 6 PPO-S-only): at that discordance McNemar has power
    # 0.15 for a +0.01 gain and 0.67 for +0.02 on 400 problems; +0.01 would need about 1,500.
    # The pilot with an all-pairs BT-RM (R^2 0.18, held-out pair accuracy 0.76) over three PPO
    # seeds: -0.020, 0.000, +0.005 (docs/experiment-design.md, "PF-PPO against PPO-S").
    assert_null_holds(comparisons["pfppo_vs_ppo_s"], -0.025, +0.008)
    assert_gain(comparisons["pfppo_vs_ppo_s"])
