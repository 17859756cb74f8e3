"""Best-of-N arithmetic and the HGS-PRM search order on a scripted model and PRM."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.search import (
    HGSSearch,
    best_of_n_expected,
    best_of_n_metrics,
    problem_accuracy,
    run_hgs,
    sample_then_filter,
    sample_to_budget,
)


def brute_force_best_of_n(scores, correct, n_pick):
    subsets = list(itertools.combinations(range(len(scores)), n_pick))
    wins = [correct[min(s, key=lambda i: (-scores[i], i))] for s in subsets]
    return sum(wins) / len(subsets)


@pytest.mark.parametrize("seed", range(5))
def test_best_of_n_expectation_equals_enumerating_subsets(seed):
    rng = random.Random(seed)
    n = 7
    scores = [rng.choice([0.1, 0.5, 0.9, rng.random()]) for _ in range(n)]  # with ties
    correct = [rng.random() < 0.4 for _ in range(n)]
    for n_pick in range(1, n + 1):
        assert best_of_n_expected(scores, correct, n_pick) == pytest.approx(
            brute_force_best_of_n(scores, correct, n_pick)
        )


def test_best_of_n_metrics_rows_and_a_perfect_scorer():
    groups = [
        {
            "correct": [False, True, False, False],
            "answers": ["1", "2", "1", "3"],
            "scores": {"oracle": [0.0, 1.0, 0.0, 0.0], "anti": [1.0, 0.0, 1.0, 1.0]},
        },
        {
            "correct": [True, True, False, False],
            "answers": ["5", "5", "4", None],
            "scores": {"oracle": [1.0, 1.0, 0.0, 0.0], "anti": [0.0, 0.0, 1.0, 1.0]},
        },
    ]
    table = best_of_n_metrics(groups, [1, 4, 8], ["oracle", "anti"])
    rows = {(r["N"], r["method"]): r for r in table["rows"]}
    assert {n for n, _ in rows} == {1, 4}  # N = 8 > samples is skipped
    assert rows[(4, "oracle@N")]["accuracy"] == 1.0
    assert rows[(4, "anti@N")]["accuracy"] == 0.0
    assert rows[(4, "pass@N")]["accuracy"] == 1.0
    assert rows[(4, "maj@N")]["accuracy"] == pytest.approx(0.5)  # "1" wins problem 1; "5" problem 2
    assert rows[(1, "pass@1")]["accuracy"] == pytest.approx((1 / 4 + 2 / 4) / 2)
    assert rows[(4, "oracle@N")]["ci_low"] <= 1.0 <= rows[(4, "oracle@N")]["ci_high"]


def test_best_of_n_metrics_weigh_the_vote_by_the_probability_scorers():
    # p0: three low-scored samples say 7, two high-scored ones say 9 (right); p1: the
    # scores agree with the count
    groups = [
        {
            "correct": [False, False, False, True, True],
            "answers": ["7", "7", "7", "9", "9"],
            "scores": {"prm-min": [0.1, 0.1, 0.1, 0.9, 0.9], "bt": [2.0, 1.0, 0.5, -1.0, -3.0]},
        },
        {
            "correct": [True, True, True, False, False],
            "answers": ["7", "7", "7", "9", "9"],
            "scores": {"prm-min": [0.6, 0.5, 0.7, 0.6, 0.5], "bt": [0.0] * 5},
        },
    ]
    table = best_of_n_metrics(groups, [5], ["bt", "prm-min"])
    rows = {r["method"]: r["accuracy"] for r in table["rows"]}
    assert list(rows) == ["pass@1", "pass@N", "maj@N", "vote-prm-min@N", "bt@N", "prm-min@N"]
    assert rows["maj@N"] == 0.5  # 7 both times: wrong on p0, right on p1
    assert rows["vote-prm-min@N"] == 1.0  # 9 on p0 (1.8 > 0.3), 7 on p1 (1.8 > 1.1)
    by_problem = [problem_accuracy(g, "vote-prm-min@N", 5, 5) for g in groups]
    assert by_problem == [1.0, 1.0]
    assert [problem_accuracy(g, "maj@N", 5, 5) for g in groups] == [0.0, 1.0]


def test_sample_then_filter_drops_samples_with_a_negative_step():
    labels = [[["+", "+"], ["+", "-"], ["~", "+"]], [["-"], ["-", "+"]]]
    correct = [[True, False, False], [True, False]]
    result = sample_then_filter(labels, correct)
    assert result["kept"] == 2 and result["samples"] == 5
    assert result["accuracy_before"] == pytest.approx(2 / 5)
    assert result["accuracy_after"] == pytest.approx(1 / 2)
    assert result["accuracy_per_problem"] == pytest.approx((1 / 2 + 0) / 2)


# --- HGS-PRM on a scripted model and PRM -------------------------------------------------


class ScriptedTree:
    """The model: the k-th expansion of a node named "a.b" is named "a.b.k" (k from 1); a
    step is final at `depth`. The PRM: labels looked up by name, "-" for unlisted steps."""

    def __init__(self, labels: dict[str, str], depth: int):
        self.labels, self.depth = labels, depth
        self.children: dict[str, int] = {}
        self.expanded: list[str] = []

    def expand(self, ids, paths, round_no):
        out = []
        for path in paths:
            parent = path[-1] if path else "r"
            self.children[parent] = self.children.get(parent, 0) + 1
            name = f"{parent}.{self.children[parent]}"
            self.expanded.append(name)
            out.append((name, name.count(".") == self.depth))
        return out

    def label(self, ids, paths, steps):
        return [self.labels.get(step, "-") for step in steps]


def search(labels, depth=2, bandwidth=3, iterations=20):
    tree = ScriptedTree(labels, depth)
    (result,) = run_hgs(1, tree.expand, tree.label, bandwidth, iterations)
    return result, tree.expanded


def test_hgs_accepts_the_first_positive_step_and_stops_at_a_final_one():
    result, expanded = search({"r.1": "+", "r.1.1": "+"})
    assert expanded == ["r.1", "r.1.1"]
    assert result.path() == ["r.1", "r.1.1"] and result.finished == "answer"


def test_hgs_samples_siblings_until_a_positive_one():
    result, expanded = search({"r.1": "-", "r.2": "~", "r.3": "+", "r.3.1": "+"})
    assert expanded == ["r.1", "r.2", "r.3", "r.3.1"]
    assert result.path() == ["r.3", "r.3.1"]


def test_hgs_falls_back_to_a_neutral_child_at_max_bandwidth():
    result, expanded = search({"r.1": "-", "r.2": "~", "r.3": "~", "r.2.1": "+"})
    assert expanded == ["r.1", "r.2", "r.3", "r.2.1"]  # the first neutral child is taken
    assert ("take-neutral", "r.2") in result.events
    assert result.path() == ["r.2", "r.2.1"] and result.finished == "answer"


def test_hgs_backtracks_when_every_child_is_negative():
    # r.1 is accepted but all its children are negative: back to the root, whose next child
    # r.2 leads to an answer.
    result, expanded = search({"r.1": "+", "r.2": "+", "r.2.1": "+"}, bandwidth=2)
    assert expanded == ["r.1", "r.1.1", "r.1.2", "r.2", "r.2.1"]
    assert ("backtrack", "r.1") in result.events
    assert result.path() == ["r.2", "r.2.1"]


def test_hgs_backtracking_a_neutral_fallback_tries_the_next_neutral():
    labels = {"r.1": "~", "r.2": "~", "r.2.1": "+"}
    result, expanded = search(labels, bandwidth=2)
    assert expanded == ["r.1", "r.2", "r.1.1", "r.1.2", "r.2.1"]
    kinds = [e[0] for e in result.events]
    assert kinds == [
        "neutral",
        "neutral",
        "take-neutral",
        "reject",
        "reject",
        "backtrack",
        "take-neutral",
        "accept",
    ]
    assert result.path() == ["r.2", "r.2.1"]


def test_hgs_stops_at_the_iteration_cap_and_an_exhausted_root():
    result, expanded = search({"r.1": "+", "r.1.1": "~"}, depth=5, iterations=4)
    assert len(expanded) == 4 and result.finished == "cap"
    assert result.events[-1] == ("cap",)
    assert result.path()[:1] == ["r.1"]  # answered from the current state
    result, expanded = search({}, bandwidth=2)
    assert expanded == ["r.1", "r.2"] and result.finished == "exhausted"


def test_hgs_searches_run_in_lockstep_one_batch_per_round():
    calls = []

    def expand(ids, paths, round_no):
        calls.append(list(ids))
        return [(f"s{round_no}", True) for _ in ids]

    labels = iter(["-", "+", "+"])  # problem 0 rejects its first child, problem 1 accepts
    searches = run_hgs(2, expand, lambda ids, paths, steps: [next(labels) for _ in ids], 3, 9)
    assert calls == [[0, 1], [0]]
    assert [s.finished for s in searches] == ["answer", "answer"]


def test_hgs_search_is_a_pure_state_machine():
    hgs = HGSSearch(max_bandwidth=1, max_iterations=math.inf)
    hgs.receive("x", "~", final=True)  # bandwidth 1: the neutral child is taken at once
    assert hgs.finished == "answer" and hgs.path() == ["x"]


def _settings(section: dict):
    """The stage's settings of a config whose reward_models section is `section`."""
    from reasonrl.config import validate_config
    from reasonrl.rewards.settings import RewardModelSettings

    return RewardModelSettings.from_section(
        validate_config({"reward_models": section})["reward_models"], 0
    )


def test_hgs_labels_a_turn_by_the_prm_verdict_on_its_last_line(monkeypatch):
    """With line steps the PRM reads the whole trajectory cut into lines (as it was trained)
    and the expanded turn gets the verdict of the line that ends it."""
    import torch

    from reasonrl.search import tool_steps

    read = []

    def fake_score_steps(model, tokenizer, items, labels):
        read.extend(items)
        # P("+") falls line by line: 0.9 for the first line, 0.1 for the last.
        return [
            torch.tensor([[0.9, 0.1]] + [[0.5, 0.5]] * (len(s) - 2) + [[0.1, 0.9]])
            for _, s in items
        ]

    monkeypatch.setattr(tool_steps, "score_steps", fake_score_steps)
    model = tool_steps.ToolStepModel.__new__(tool_steps.ToolStepModel)
    model.settings = _settings({"step_splitter": "line", "hgs": {"neutral_band": [0.3, 0.7]}})
    model.prm = model.tokenizer = None
    model.labels, model.problems = ["+", "-"], [{"question": "Q"}]
    turn = "Intro.\n```python\nx = 3\nprint(x)\n```"
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": turn},
        {"role": "user", "content": "```output\n3\n```"},
    ]
    assert model.label([0], [[]], [{"messages": messages}]) == ["-"]
    assert read == [("Q", ["Intro.", "```python\nx = 3", "print(x)\n```\n```output\n3\n```"])]


def _counting_model(monkeypatch, turns_of_completion: int = 3, waves: int = 1):
    """A ToolStepModel whose rollouts are stubbed: every continuation is one 5-token turn, a
    completion `turns_of_completion` turns in all; the stubs record their calls."""
    from reasonrl.rollout import RolloutSettings
    from reasonrl.search import tool_steps

    calls = []

    def fake_continue(engine, prefixes, params, limits, sandbox):
        calls.append(("continue", len(prefixes), limits.max_turns, params.seed, limits.waves))
        turns = limits.max_turns if params.temperature else turns_of_completion
        return [{"messages": [], "finish_reason": "max_turns", "num_turns": turns,
                 "num_tokens": 5} for _ in prefixes]  # fmt: skip

    def fake_run(engine, problems, style, n, params, limits, sandbox):
        calls.append(("run", len(problems), limits.max_turns, params.seed, limits.waves))
        return [{"num_turns": limits.max_turns, "num_tokens": 7} for _ in problems]

    monkeypatch.setattr(tool_steps, "continue_rollouts", fake_continue)
    monkeypatch.setattr(tool_steps, "run_rollouts", fake_run)
    monkeypatch.setattr(tool_steps, "prompt_messages", lambda problem, style: [])
    model = tool_steps.ToolStepModel.__new__(tool_steps.ToolStepModel)
    model.settings = _settings({"temperature": 0.7, "top_p": 1.0, "style": "tool"})
    model.engine = model.sandbox = None
    model.limits = RolloutSettings(4, 512, 2048, waves=waves)
    return model.for_problems([{"id": "p0"}, {"id": "p1"}], seed=0), calls


def test_hgs_counts_its_policy_calls_and_tokens_per_problem(monkeypatch):
    """Each expansion is one call; completing a capped search counts the turns it adds."""
    model, _ = _counting_model(monkeypatch)
    labels = iter(["-", "+", "-", "-"])  # p0 rejects twice, p1 accepts at once (final)

    def expand(ids, paths, round_no):
        return [
            (step, i == 1)
            for i, (step, _) in zip(ids, model.expand(ids, paths, round_no), strict=True)
        ]

    searches = run_hgs(2, expand, lambda ids, paths, steps: [next(labels) for _ in ids], 9, 3)
    assert [s.finished for s in searches] == ["cap", "answer"]
    assert model.generated == [3, 1] and model.tokens == [15, 5]
    model.finish(searches)  # p0's completion: 3 turns from an empty path
    assert model.generated == [6, 1] and model.tokens == [20, 5]


def test_matched_samples_spend_exactly_each_problems_budget_at_hgs_temperature(monkeypatch):
    model, calls = _counting_model(monkeypatch)
    made = sample_to_budget([6, 1], model.sample)
    # p0: a 4-turn sample (the rollout cap), then one capped at the 2 calls left; p1: 1 call.
    assert [[r["num_turns"] for r in rows] for rows in made] == [[4, 2], [1]]
    assert [[r["sample"] for r in rows] for rows in made] == [[0, 1], [0]]
    assert [c[:3] for c in calls] == [("run", 1, 4), ("run", 1, 1), ("run", 1, 2)]
    # the seeds are the matched stream's, distinct from every search round's
    model.expand([0], [[]], 0)
    seeds = [c[3] for c in calls]
    assert len(set(seeds[:3])) == 2 and seeds[3] not in seeds[:3]


def test_search_and_matched_rollouts_keep_the_configs_waves(monkeypatch):
    model, calls = _counting_model(monkeypatch, waves=3)
    model.expand([0, 1], [[], [{"messages": []}]], 0)
    sample_to_budget([2, 1], model.sample)
    assert calls and {c[4] for c in calls} == {3}


def test_matched_sampling_refuses_a_sample_over_the_budget():
    def spendthrift(ids, calls_left, round_no):
        return [{"num_turns": left + 1} for left in calls_left]

    with pytest.raises(ReasonRLError, match="made 3 calls, with 2 left"):
        sample_to_budget([2], spendthrift)


def test_best_of_n_curves_take_powers_of_two_and_the_samples_drawn():
    from reasonrl.search import powers_of_two

    assert powers_of_two(16) == [1, 2, 4, 8, 16]
    assert powers_of_two(12) == [1, 2, 4, 8, 12]
    assert powers_of_two(1) == [1]
