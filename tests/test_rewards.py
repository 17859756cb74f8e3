"""Reward models and process supervision: steps, Math-Shepherd labels, mutants, scoring,
Bradley-Terry pairs and loss, and the train-reward-model stage on tiny inputs."""

from __future__ import annotations

import contextlib
import itertools
import json
import math

import pytest
import torch

from reasonrl.chat import render
from reasonrl.errors import ReasonRLError
from reasonrl.generation import Completion, SamplingParams
from reasonrl.io import read_jsonl, write_jsonl
from reasonrl.models import load_policy
from reasonrl.rewards.annotation import annotate, shepherd_labels
from reasonrl.rewards.models import (
    label_only_chat,
    per_label_precision_recall,
    prm_training_chat,
)
from reasonrl.rewards.mutation import MUTATION_KINDS, mutants, mutation_rows
from reasonrl.rewards.pairs import edit_distance, farthest_pair, preference_pairs
from reasonrl.rewards.scoring import (
    aggregate,
    encode_with_label_positions,
    label_probabilities,
    label_token_ids,
    score_steps,
    score_steps_one_by_one,
    step_classes,
)
from reasonrl.rewards.steps import (
    STEP_TAG,
    from_rlhflow,
    orm_messages,
    prm_messages,
    split_text,
    to_rlhflow,
    trajectory_steps,
)
from reasonrl.rollout import RolloutSettings
from reasonrl.sandbox import Sandbox
from reasonrl.stages.reward_models import train_reward_model as run_train_reward_model
from reasonrl.training.reward import bradley_terry_loss

QUESTION = "Tom has 3 apples. He buys 4 more. How many apples does Tom have?"


def math_problem(pid: str = "p0", answer: str = "7") -> dict:
    return {
        "id": pid,
        "task": "arith",
        "split": "train",
        "question": QUESTION,
        "answer": answer,
        "solutions": {},
        "code": None,
        "meta": {},
    }


class ScriptedEngine:
    """Completes a prompt by the first rule whose key the prompt ends with; each rule cycles
    through its completions (so K copies of one prefix get the scripted mix)."""

    def __init__(self, tokenizer, rules: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.rules = {key: itertools.cycle(texts) for key, texts in rules.items()}
        self.prompts: list[str] = []

    def conversation(self, calls=1):
        return contextlib.nullcontext()

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        self.prompts += prompts
        out = []
        for prompt in prompts:
            key = next(k for k in self.rules if prompt.rstrip().endswith(k))
            out.append(Completion(next(self.rules[key]), 5, "eos"))
        return out


# --- steps and formats ---------------------------------------------------------------------


def test_split_text_keeps_exact_prefixes_and_drops_empty_pieces():
    text = "Tom has 3. He buys 4.  So 7.\n\nThe answer is 7."
    spans = split_text(text, r"(?<=[.!?])\s+|\n+")
    pieces = [text[lo:hi].strip() for lo, hi in spans]
    assert pieces == ["Tom has 3.", "He buys 4.", "So 7.", "The answer is 7."]
    assert spans[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_turn_steps_pair_each_model_turn_with_its_interpreter_output():
    messages = [
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "code A"},
        {"role": "user", "content": "```output\n7\n```"},
        {"role": "assistant", "content": "The answer is \\boxed{7}."},
    ]
    steps = trajectory_steps(messages, "turn", "")
    assert [s.text for s in steps] == ["code A\n```output\n7\n```", "The answer is \\boxed{7}."]
    assert steps[0].messages == messages[:3] and steps[1].messages == messages


def test_prm_and_orm_chats_follow_the_rlhflow_layout():
    chat = prm_messages("Q?", ["s1", "s2"])
    assert chat == [
        {"role": "user", "content": "Q?\ns1"},
        {"role": "assistant", "content": STEP_TAG},
        {"role": "user", "content": "s2"},
        {"role": "assistant", "content": STEP_TAG},
    ]
    assert orm_messages("Q?", ["s1", "s2"], "-")[0]["content"] == "Q?\ns1\ns2"


TOOL_TURN = (
    "Let me compute this step by step with Python.\n```python\n# Tom has 3 apples.\nx = 3\n"
    "# Tom buys 4 more apples.\nx = x + 4\nprint(x)\n```"
)
TOOL_TRAJECTORY = [
    {"role": "user", "content": QUESTION},
    {"role": "assistant", "content": TOOL_TURN},
    {"role": "user", "content": "```output\n7\n```"},
    {"role": "assistant", "content": "The answer is \\boxed{7}. Done."},
]


def test_line_steps_are_code_lines_and_sentences_with_the_output_on_the_turn_end():
    steps = trajectory_steps(TOOL_TRAJECTORY, "line", "")
    assert [s.text for s in steps] == [
        "Let me compute this step by step with Python.",
        "```python\n# Tom has 3 apples.",
        "x = 3",
        "# Tom buys 4 more apples.",
        "x = x + 4",
        "print(x)\n```\n```output\n7\n```",
        "The answer is \\boxed{7}.",
        "Done.",
    ]
    # A mid-turn step resumes exactly after itself: the turn so far is its `partial`.
    assert steps[2].messages == TOOL_TRAJECTORY[:1]
    assert steps[2].partial == TOOL_TURN[: TOOL_TURN.index("# Tom buys")]
    assert steps[5].messages == TOOL_TRAJECTORY[:3] and steps[5].partial == ""
    assert steps[6].partial == "The answer is \\boxed{7}. "


def test_line_steps_keep_blank_lines_in_the_prefix_and_unknown_splitters_fail():
    turn = "Intro.\n\n```python\nx = 3\n\nprint(x)\n```"
    steps = trajectory_steps(
        [{"role": "user", "content": "Q"}, {"role": "assistant", "content": turn}], "line", ""
    )
    assert [s.text for s in steps] == ["Intro.", "```python\nx = 3", "print(x)\n```"]
    assert steps[1].partial == "Intro.\n\n```python\nx = 3\n\n"
    with pytest.raises(ReasonRLError, match="unknown step splitter"):
        trajectory_steps([], "sentence", "")


def test_the_prm_trains_on_exactly_the_input_it_is_scored_on(tiny_policy):
    """The old training chat showed the true earlier labels where scoring shows the tag."""
    _, tokenizer = load_policy(tiny_policy)
    steps, labels = ["a", "b", "c"], ["+", "-", "-"]
    chat = prm_training_chat(tokenizer, "Q?", steps, labels, 512)
    ids, positions = encode_with_label_positions(tokenizer, prm_messages("Q?", steps))
    assert chat.input_ids == ids
    plus, minus = label_token_ids(tokenizer, ["+", "-"])
    assert [chat.labels[p] for p in positions] == [plus, minus, minus]
    assert [i for i, label in enumerate(chat.labels) if label != -100] == positions
    cut = chat.truncated(positions[1] + 1)  # packing cuts long samples: targets go along
    assert cut.labels == chat.labels[: positions[1] + 1]
    with pytest.raises(ReasonRLError, match="label"):
        prm_training_chat(tokenizer, "Q?", ["s1"], ["?"], 512)


def test_rlhflow_format_round_trips_and_names_the_bad_row():
    row = to_rlhflow("Q?", [["a", "b"], ["c"]], [True, False])
    assert row == {"prompt": "Q?", "answers": ["a\n\nb", "c"], "labels": [1, 0]}
    assert from_rlhflow(row, "f.jsonl:1") == ("Q?", [["a", "b"], ["c"]], [True, False])
    with pytest.raises(ReasonRLError, match="f.jsonl:3: RLHFlow row lacks 'labels'"):
        from_rlhflow({"prompt": "Q", "answers": []}, "f.jsonl:3")


def test_aggregations_and_neutral_band():
    assert aggregate([0.9, 0.2, 0.7], "mean") == pytest.approx(0.6)
    assert aggregate([0.9, 0.2, 0.7], "min") == 0.2
    assert aggregate([0.9, 0.2, 0.7], "last") == 0.7
    with pytest.raises(ReasonRLError, match="aggregation"):
        aggregate([0.5], "max")
    probs = torch.tensor([[0.9, 0.1], [0.5, 0.5], [0.1, 0.9]])
    assert step_classes(probs, ["+", "-"], [0.3, 0.7]) == ["+", "~", "-"]
    three = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.3, 0.1]])
    assert step_classes(three, ["+", "-", "~"], [0.3, 0.7]) == ["~", "+"]


# --- Math-Shepherd annotation --------------------------------------------------------------


def test_shepherd_rule_hard_is_any_correct_soft_is_the_fraction():
    hard, soft = shepherd_labels([[False, True, False, False], [False] * 4, [True]])
    assert hard == ["+", "-", "+"]
    assert soft == [0.25, 0.0, 1.0]


def test_annotation_of_a_hand_made_trajectory_set_matches_the_rule(tiny_policy, tmp_path):
    _, tokenizer = load_policy(tiny_policy)
    right, wrong = "So \\boxed{7}.", "So \\boxed{8}."
    # Solution 1 (correct): step 1 -> 1 of 4 completions right, step 2 -> none, step 3 = end.
    # Solution 2 (wrong): step 1 -> all right, step 2 -> 2 of 4 right, step 3 = end (wrong).
    rules = {
        "Tom starts at 3.": [wrong, right, wrong, wrong],
        "Tom starts at 3. He adds 4.": [wrong],
        "Begin with 3.": [right],
        "Begin with 3. Add four.": [right, wrong],
    }
    engine = ScriptedEngine(tokenizer, rules)
    prompt = {"role": "user", "content": QUESTION}

    def solution(sample: int, text: str, correct: bool) -> dict:
        return {
            "problem_id": "p0",
            "task": "arith",
            "sample": sample,
            "messages": [prompt, {"role": "assistant", "content": text}],
            "correct": correct,
        }

    solutions = [
        solution(0, f"Tom starts at 3. He adds 4. {right}", True),
        solution(1, f"Begin with 3. Add four. {wrong}", False),
    ]
    rows, stats = annotate(
        {"p0": math_problem()},
        solutions,
        engine,
        sandbox=Sandbox.from_config({}),
        limits=RolloutSettings(2, 64, 128),
        completions=4,
        params=SamplingParams(temperature=1.0),
        splitter="regex",
        pattern=r"(?<=\.)\s+",
    )
    assert [r["labels"] for r in rows] == [["+", "-", "+"], ["+", "+", "-"]]
    assert [r["soft_labels"] for r in rows] == [[0.25, 0.0, 1.0], [1.0, 0.5, 0.0]]
    assert rows[0]["steps"] == ["Tom starts at 3.", "He adds 4.", right]
    assert stats.rollouts == 2 * 2 * 4  # 2 solutions x 2 non-final steps x K
    assert len(engine.prompts) == stats.rollouts  # all prefixes went out in batch(es)
    write_jsonl(tmp_path / "prm.jsonl", rows, schema="prm_steps")  # rows fit the schema


def test_line_annotation_resumes_every_prefix_exactly_after_its_line(tiny_policy):
    _, tokenizer = load_policy(tiny_policy)
    engine = ScriptedEngine(tokenizer, {"": ["The answer is \\boxed{7}."]})
    solution = {
        "problem_id": "p0",
        "task": "arith",
        "sample": 0,
        "messages": TOOL_TRAJECTORY,
        "correct": True,
    }
    rows, stats = annotate(
        {"p0": math_problem()},
        [solution],
        engine,
        sandbox=Sandbox.from_config({}),
        limits=RolloutSettings(3, 64, 256),
        completions=1,
        params=SamplingParams(temperature=1.0),
        splitter="line",
        pattern="",
    )
    steps = trajectory_steps(TOOL_TRAJECTORY, "line", "")
    expected = [
        render(tokenizer, s.messages, add_generation_prompt=True) + s.partial for s in steps[:-1]
    ]
    assert engine.prompts == expected
    assert rows[0]["steps"] == [s.text for s in steps] and stats.rollouts == len(steps) - 1


# --- code PRM by mutation ------------------------------------------------------------------

BODY = (
    "    total = 0\n"
    "    for x in xs[1:]:\n"
    "        if x > 2 and x < 10:\n"
    "            total += x * 2\n"
    "    return max(total, 0)\n"
)


def test_mutants_cover_every_kind_and_change_one_line_that_parses():
    found = mutants(BODY)
    assert {m.kind for m in found} == set(MUTATION_KINDS)
    lines = BODY.splitlines()
    for m in found:
        changed = [
            i for i, (a, b) in enumerate(zip(lines, m.source.splitlines(), strict=False)) if a != b
        ]
        assert changed == [m.line], m
        compile("def f(xs):\n" + m.source, "<mutant>", "exec")
    by_kind = {k: {m.mutated_line.strip() for m in found if m.kind == k} for k in MUTATION_KINDS}
    assert "for x in xs[2:]:" in by_kind["slice"]
    assert "if x >= 2 and x < 10:" in by_kind["comparison"]
    assert "if x > 2 or x < 10:" in by_kind["boolean"]
    assert "total += x * 3" in by_kind["constant"]
    assert "total -= x * 2" in by_kind["arithmetic"]
    assert "return max(0, total)" in by_kind["swap_args"]


def test_mutants_keep_precedence_with_parentheses():
    found = mutants("    return a * (b + c)\n", ("arithmetic",))
    assert "    return a * (b - c)" in {m.mutated_line for m in found}
    assert all(m.mutated_line != "    return a * b - c" for m in found)


def code_problem() -> dict:
    prompt = 'def f(xs: list) -> int:\n    """Twice the sum of xs[1:] in (2, 10), at least 0."""\n'
    test = (
        "def check(candidate):\n"
        "    assert candidate([1, 3, 4, 20]) == 14\n"
        "    assert candidate([5, 9, 1, 3]) == 24\n"
        "    assert candidate([]) == 0\n"
    )
    code = {"prompt": prompt, "test": test, "entry_point": "f", "canonical_solution": BODY}
    return {**math_problem("c0", ""), "task": "pycode", "question": prompt, "code": code}


def test_mutation_rows_label_original_positive_passing_neutral_failing_negative(tmp_path):
    sandbox = Sandbox.from_config({"cpu_seconds": 2, "wall_seconds": 5})
    rows, counts = mutation_rows([code_problem()], sandbox, 100, MUTATION_KINDS, 0)
    original = [r for r in rows if r["mutation"] == "original"]
    assert len(original) == 1 and set(original[0]["labels"]) == {"+"}
    assert len(original[0]["steps"]) == 5
    last = {(r["mutation"], r["steps"][-1].strip()): r["labels"] for r in rows}
    assert last[("swap_args", "return max(0, total)")] == ["+"] * 4 + ["~"]
    assert last[("comparison", "if x >= 2 and x < 10:")] == ["+", "+", "~"]  # no test has a 2
    assert last[("slice", "for x in xs[2:]:")] == ["+", "-"]
    assert {"+", "-", "~"} == {r["labels"][-1] for r in rows}
    assert counts["skipped_problems"] == 0
    write_jsonl(tmp_path / "prm.jsonl", rows, schema="prm_steps")  # rows fit the schema


def test_a_reference_that_fails_its_tests_labels_nothing():
    problem = code_problem()
    problem["code"] = {**problem["code"], "test": "def check(c):\n    assert c([3]) == 1\n"}
    sandbox = Sandbox.from_config({"cpu_seconds": 2, "wall_seconds": 5})
    rows, counts = mutation_rows([problem], sandbox, 1, ("constant",), 0)
    assert rows == [] and counts["skipped_problems"] == 1


# --- scoring ------------------------------------------------------------------------------


def test_one_pass_step_scores_equal_per_step_scores(tiny_policy):
    model, tokenizer = load_policy(tiny_policy)
    model.eval()
    steps = ["x = 12 + 30", "print(x)", "```output\n42\n```", "The answer is 42.", "Done."]
    short = steps[:2]
    one_pass = score_steps(model, tokenizer, [("Q?", steps), ("Q?", short)], ["+", "-"])
    assert [p.shape for p in one_pass] == [(5, 2), (2, 2)]
    reference = score_steps_one_by_one(model, tokenizer, "Q?", steps, ["+", "-"])
    torch.testing.assert_close(one_pass[0], reference, atol=1e-5, rtol=1e-4)
    # Right padding in the batch does not change the shorter solution's verdicts either.
    torch.testing.assert_close(one_pass[1], reference[:2], atol=1e-5, rtol=1e-4)


def test_label_probabilities_equal_the_softmax_of_the_full_logits(tiny_policy):
    """Logits made only before the labels give the verdicts of the whole sequence's logits,
    batched with padding and with a solution whose labels were all truncated away."""
    model, tokenizer = load_policy(tiny_policy)
    model.eval()
    label_ids = label_token_ids(tokenizer, ["+", "-"])
    solutions = [["x = 12 + 30", "print(x)", "Done."], ["The answer is 42."], ["a", "b"]]
    sequences = [
        encode_with_label_positions(tokenizer, prm_messages("Q?", steps)) for steps in solutions
    ]
    sequences.append((sequences[0][0][:3], []))
    got = label_probabilities(model, sequences, label_ids, tokenizer.pad_token_id, batch_size=3)
    projected = []
    hook = model.get_output_embeddings().register_forward_hook(
        lambda _module, args, _out: projected.append(args[0].shape[:2])
    )
    alone = label_probabilities(model, sequences, label_ids, tokenizer.pad_token_id, batch_size=1)
    hook.remove()
    # one by one, the vocabulary projection runs on the label positions only
    assert [n for _, n in projected] == sorted((len(p) for _, p in sequences), reverse=True)
    for one, batched in zip(alone, got, strict=True):
        torch.testing.assert_close(one, batched, atol=1e-5, rtol=1e-4)
    for (ids, positions), probs in zip(sequences, got, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        before = torch.tensor(positions, dtype=torch.long) - 1
        expected = logits[before][:, label_ids].softmax(-1)
        torch.testing.assert_close(probs, expected, atol=1e-5, rtol=1e-4)


def test_label_positions_come_from_the_template_spans(tiny_policy):
    _, tokenizer = load_policy(tiny_policy)
    ids, positions = encode_with_label_positions(tokenizer, orm_messages("Q?", ["a", "b"], "-"))
    assert [tokenizer.decode([ids[p]]) for p in positions] == ["-"]
    chat = label_only_chat(tokenizer, orm_messages("Q?", ["a", "b"], "-"), 512)
    assert [i for i, m in enumerate(chat.loss_mask) if m] == positions


# --- Bradley-Terry ------------------------------------------------------------------------


def bt_row(problem: str, sample: int, correct: bool, text: str = "") -> dict:
    """A sampled trajectory of `problem` (its answer `text`, by default s<sample>)."""
    answer = text or f"s{sample}"
    messages = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": answer}]
    return {
        "problem_id": problem,
        "task": "t",
        "sample": sample,
        "messages": messages,
        "correct": correct,
    }


def test_edit_distance_and_farthest_pair():
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance([], ["a", "b"]) == 2

    rows = [
        bt_row("p", 0, True, "a b c"),
        bt_row("p", 1, False, "a b d"),
        bt_row("p", 2, False, "x y z w v"),
    ]
    assert [r["sample"] for r in farthest_pair(rows)] == [0, 2]
    pairs, ties = preference_pairs(rows)
    assert ties == 0 and pairs[0]["chosen"] == rows[0]["messages"]
    pairs, ties = preference_pairs([bt_row("p", 0, True, "a"), bt_row("p", 1, True, "b c d")])
    assert pairs == [] and ties == 1  # both correct: no preference


def test_random_and_all_pairs_use_every_prompt_with_a_right_and_a_wrong_sample():
    # p: samples 0 and 2 are farthest apart and both wrong, so the paper's recipe drops p
    rows = [bt_row("p", 0, False), bt_row("p", 1, True), bt_row("p", 2, False)]
    rows[2]["messages"][1]["content"] = "x y z w"
    rows += [bt_row("q", 0, True), bt_row("q", 1, True)]  # no wrong sample: no pair
    assert preference_pairs(rows, "farthest") == ([], 2)
    pairs, ties = preference_pairs(rows, "random", seed=3)
    assert ties == 1 and [p["problem_id"] for p in pairs] == ["p"]
    assert pairs[0]["chosen"] == rows[1]["messages"]
    pairs, ties = preference_pairs(rows, "all")
    assert ties == 1 and [p["rejected"] for p in pairs] == [
        rows[0]["messages"],
        rows[2]["messages"],
    ]
    assert all(p["chosen"] == rows[1]["messages"] for p in pairs)


def test_random_pairs_are_seeded():
    rows = [bt_row("p", i, i < 3) for i in range(8)]
    assert preference_pairs(rows, "random", 1) == preference_pairs(rows, "random", 1)
    assert len({str(preference_pairs(rows, "random", seed)[0]) for seed in range(6)}) > 1


def test_unknown_pair_selection_is_named():
    rows = [bt_row("p", 0, True), bt_row("p", 1, False)]
    with pytest.raises(ReasonRLError, match="unknown pair selection 'nearest'"):
        preference_pairs(rows, "nearest")


class ScalarModel(torch.nn.Module):
    def __init__(self, rewards):
        super().__init__()
        self.rewards = torch.nn.Parameter(torch.tensor(rewards))

    def forward(self, input_ids, attention_mask, use_cache):
        return type("Out", (), {"logits": self.rewards[:, None]})()


def test_bradley_terry_loss_is_minus_log_sigmoid_of_the_margin():
    model = ScalarModel([2.0, 0.5, 1.0, 1.5])  # chosen: 2.0, 0.5; rejected: 1.0, 1.5
    batch = {"input_ids": torch.zeros(4, 3, dtype=torch.long), "attention_mask": torch.ones(4, 3)}
    loss, stats = bradley_terry_loss(model, batch)
    expected = -(math.log(1 / (1 + math.exp(-1.0))) + math.log(1 / (1 + math.exp(1.0)))) / 2
    assert loss.item() == pytest.approx(expected)
    assert stats["accuracy"] == 0.5


def test_per_label_precision_recall():
    result = per_label_precision_recall(["+", "+", "-", "~"], ["+", "-", "-", "+"], ["+", "-", "~"])
    assert result["+"] == {"precision": 0.5, "recall": 0.5, "support": 2}
    assert result["-"] == {"precision": 0.5, "recall": 1.0, "support": 1}
    assert result["~"] == {"precision": None, "recall": 0.0, "support": 1}


# --- the train-reward-model stage on tiny inputs ------------------------------------------


@pytest.fixture(scope="module")
def rm_inputs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rm-inputs")
    problems = [math_problem(f"p{i}", str(7 + i)) for i in range(6)]
    write_jsonl(folder / "problems.jsonl", problems, schema="problem")
    samples, prm_rows = [], []
    for p in problems:
        for s in range(3):
            correct = s == 0
            answer = p["answer"] if correct else "0"
            text = f"Add them. The answer is \\boxed{{{answer}}}." + " More words." * s
            samples.append(
                {
                    "problem_id": p["id"],
                    "task": "arith",
                    "sample": s,
                    "correct": correct,
                    "messages": [
                        {"role": "user", "content": p["question"]},
                        {"role": "assistant", "content": text},
                    ],
                    "final_answer": answer,
                    "finish_reason": "answer",
                    "num_turns": 1,
                    "num_tokens": 9,
                    "tool_status": [],
                }
            )
            prm_rows.append(
                {
                    "problem_id": p["id"],
                    "task": "arith",
                    "sample": s,
                    "question": p["question"],
                    "steps": ["Add them.", f"The answer is {answer}."],
                    "labels": ["+", "+" if correct else "-"],
                    "soft_labels": [1.0, float(correct)],
                    "source": "math-shepherd",
                }
            )
    write_jsonl(folder / "samples.jsonl", samples, schema="trajectory")
    write_jsonl(folder / "prm.jsonl", prm_rows, schema="prm_steps")
    return folder


def rm_config() -> dict:
    from reasonrl.config import validate_config

    return validate_config(
        {
            "reward_models": {
                "heldout_fraction": 0.34,
                "step_splitter": "regex",
                "split_pattern": r"(?<=\.)\s+",
                "train": {"max_steps": 3, "batch_size": 4, "checkpoint_every": 2},
            }
        }
    )


def test_reward_model_settings_are_the_section_typed(monkeypatch):
    """The stages read RewardModelSettings, typed once from the reward_models section: each
    field is the section's, the sampling its temperature and top_p, and the trainers' loop
    settings those of train (max_steps, or train.epochs' passes over the rows)."""
    from dataclasses import asdict, replace

    from reasonrl.config import validate_config
    from reasonrl.rewards.settings import RewardModelSettings
    from reasonrl.rewards.trainers import loop_settings
    from reasonrl.training.loop import LoopSettings

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    given = {
        "style": "cot",
        "prompts": 7,
        "samples_per_prompt": 3,
        "bt_pairs": "all",
        "temperature": 0.5,
        "top_p": 0.9,
        "step_splitter": "regex",
        "split_pattern": r"\n",
        "annotation": {"solutions_per_prompt": 2, "completions": 3},
        "mutation": {"max_problems": 5, "kinds": ["swap_args"], "cpu_seconds": 2},
        "train": {"max_steps": 9, "batch_size": 2, "grad_accum": 3, "lr": 1e-4},
        "best_of_n": {"n": [1, 8], "max_problems": 4},
        "hgs": {"max_bandwidth": 2, "neutral_band": [0.2, 0.6], "filter_samples": 3},
    }
    section = validate_config({"reward_models": given})["reward_models"]
    settings = RewardModelSettings.from_section(section, 5)
    scalars = ["style", "prompts", "samples_per_prompt", "bt_pairs", "heldout_fraction"]
    for key in [*scalars, "step_splitter", "split_pattern"]:
        assert getattr(settings, key) == section[key]
    assert settings.seed == 5
    assert settings.sampling == SamplingParams.from_section(section, 5)
    assert asdict(settings.annotation) == section["annotation"]
    assert asdict(settings.mutation) == {**section["mutation"], "kinds": ("swap_args",)}
    assert asdict(settings.best_of_n) == {"n": (1, 8), "max_problems": 4}
    hgs = {k: v for k, v in section["hgs"].items() if k != "tasks"}  # the DAG's, not a stage's
    assert asdict(settings.hgs) == {**hgs, "neutral_band": (0.2, 0.6)}
    train = section["train"]
    assert (settings.train.batch_size, settings.train.max_length) == (2, train["max_length"])
    assert loop_settings(settings.train, 100) == LoopSettings.from_config(train, 5)
    by_epochs = {**section, "train": {**train, "epochs": 2}}
    steps = round(2 * 100 / (2 * 3))  # 2 passes over 100 rows, 2 x 3 rows a step
    assert loop_settings(RewardModelSettings.from_section(by_epochs, 5).train, 100) == replace(
        LoopSettings.from_config(train, 5), max_steps=steps
    )


@pytest.mark.parametrize("kind", ["bt", "orm", "prm"])
def test_train_reward_model_writes_model_metrics_and_heldout(
    tiny_policy, rm_inputs, tmp_path, kind
):
    data = rm_inputs / ("prm.jsonl" if kind == "prm" else "samples.jsonl")
    out = tmp_path / f"model-{kind}"
    metrics = run_train_reward_model(
        rm_config(), kind, str(tiny_policy), str(rm_inputs / "problems.jsonl"), str(data), str(out)
    )
    assert metrics["steps"] == 3 and math.isfinite(metrics["final_loss"])
    info = json.loads((out / "reward_model.json").read_text())
    assert info["kind"] == kind
    assert (out / "manifest.json").is_file() and (out / "metrics.csv").is_file()
    heldout = metrics["heldout"]
    if kind == "bt":
        assert heldout["pairs"] == 2 and 0 <= heldout["accuracy"] <= 1
    elif kind == "orm":
        assert heldout["solutions"] == 6 and 0 <= heldout["accuracy"] <= 1
    else:
        assert heldout["steps"] == 12 and set(heldout["per_label"]) == {"+", "-"}
    assert not list(tmp_path.glob(".*.ckpt")), "checkpoints left behind"


def test_reward_models_on_a_backbone_of_their_own_read_the_policys_samples_as_text(
    smollm2_shaped_backbone, tiny_policy, rm_inputs, tmp_path
):
    """reward_models.base other than the policy: every kind trains from that backbone and
    keeps its tokenizer and chat template, and best-of-N's and PPO's scorers read the
    policy's samples (and the PRM their steps) as text through them."""
    from reasonrl.models import load_tokenizer
    from reasonrl.rewards.reranking import score_samples
    from reasonrl.rewards.sequence import SequenceScorer
    from reasonrl.rewards.settings import RewardModelSettings

    backbone, policy = load_tokenizer(smollm2_shaped_backbone), load_tokenizer(tiny_policy)
    assert len(backbone) == 49152 != len(policy)
    folders = {}
    for kind in ("bt", "orm", "prm"):
        data = rm_inputs / ("prm.jsonl" if kind == "prm" else "samples.jsonl")
        out = tmp_path / f"model-{kind}"
        metrics = run_train_reward_model(
            rm_config(), kind, str(smollm2_shaped_backbone), str(rm_inputs / "problems.jsonl"),
            str(data), str(out),
        )  # fmt: skip
        assert metrics["steps"] == 3 and math.isfinite(metrics["final_loss"])
        tokenizer = load_tokenizer(out)
        assert tokenizer.get_vocab() == backbone.get_vocab()
        assert "SmolLM" in tokenizer.chat_template and "SmolLM" not in policy.chat_template
        folders[kind] = str(out)
    rows = read_jsonl(rm_inputs / "samples.jsonl")
    problems = {p["id"]: p for p in read_jsonl(rm_inputs / "problems.jsonl")}
    settings = RewardModelSettings.from_section(rm_config()["reward_models"], 0)
    scored = score_samples(settings, "float32", problems, rows, folders)
    expected = {"bt", "orm", "prm-min", "prm-mean", "prm-last"}
    assert all(set(s["scores"]) == expected for s in scored)
    assert all(math.isfinite(v) for s in scored for v in s["scores"].values())
    values, passes = SequenceScorer("rm", folders["bt"], "float32", "ppo.reward")(rows)
    assert passes == len(rows) and all(math.isfinite(v) for v in values)
    assert values == pytest.approx([s["scores"]["bt"] for s in scored], abs=1e-5)


@pytest.mark.parametrize("kind", ["bt", "orm", "prm"])
def test_reward_model_epochs_and_global_batch_set_its_steps_from_its_training_rows(
    tiny_policy, rm_inputs, tmp_path, kind
):
    config = rm_config()
    # a global batch of 6: 2 micro-batches of 3 per step on this one process
    config["reward_models"]["train"].update(
        epochs=2, batch_size=3, global_batch_size=6, max_steps=999
    )
    data = rm_inputs / ("prm.jsonl" if kind == "prm" else "samples.jsonl")
    out = tmp_path / f"model-{kind}"
    metrics = run_train_reward_model(
        config, kind, str(tiny_policy), str(rm_inputs / "problems.jsonl"), str(data), str(out)
    )
    rows = metrics[{"bt": "train_pairs", "orm": "train_solutions", "prm": "train_rows"}[kind]]
    assert rows >= 3 and metrics["steps"] == max(1, round(2 * rows / 6))
    assert metrics["steps"] != round(2 * rows / 3)


def test_bt_training_is_the_same_whatever_the_callers_random_state(
    tiny_policy, rm_inputs, tmp_path
):
    weights = []
    for caller_seed in (1, 2):
        torch.manual_seed(caller_seed)  # a fresh process (or another job) starts elsewhere
        out = tmp_path / f"bt-{caller_seed}"
        run_train_reward_model(
            rm_config(), "bt", str(tiny_policy), str(rm_inputs / "problems.jsonl"),
            str(rm_inputs / "samples.jsonl"), str(out),
        )  # fmt: skip
        weights.append((out / "model.safetensors").read_bytes())
    assert weights[0] == weights[1]


def test_train_reward_model_names_an_unknown_problem(tiny_policy, rm_inputs, tmp_path):
    rows = read_jsonl(rm_inputs / "prm.jsonl")
    rows[0]["problem_id"] = "nope"
    write_jsonl(tmp_path / "prm.jsonl", rows)
    with pytest.raises(ReasonRLError, match=r"prm.jsonl: problem 'nope' is not in"):
        run_train_reward_model(
            rm_config(),
            "prm",
            str(tiny_policy),
            str(rm_inputs / "problems.jsonl"),
            str(tmp_path / "prm.jsonl"),
            str(tmp_path / "out"),
        )


def test_a_reward_model_on_two_tasks_is_one_on_their_union(tiny_policy, rm_inputs, tmp_path):
    """reward_models.pooled: the problems and PRM rows of two tasks' files train the model
    one file holding both would; a problem id in both files is a one-line error."""
    problems = read_jsonl(rm_inputs / "problems.jsonl")
    rows = read_jsonl(rm_inputs / "prm.jsonl")
    half = {p["id"] for p in problems[: len(problems) // 2]}
    parts = {}
    for name, mine in (("a", lambda i: i in half), ("b", lambda i: i not in half)):
        write_jsonl(tmp_path / f"{name}.problems.jsonl", [p for p in problems if mine(p["id"])])
        parts[name] = [r for r in rows if mine(r["problem_id"])]
        write_jsonl(tmp_path / f"{name}.prm.jsonl", parts[name])
    write_jsonl(tmp_path / "both.problems.jsonl", read_jsonl(tmp_path / "a.problems.jsonl")
                + read_jsonl(tmp_path / "b.problems.jsonl"))  # fmt: skip
    write_jsonl(tmp_path / "both.prm.jsonl", parts["a"] + parts["b"])
    assert parts["a"] and parts["b"]
    two = run_train_reward_model(
        rm_config(), "prm", str(tiny_policy),
        [str(tmp_path / "a.problems.jsonl"), str(tmp_path / "b.problems.jsonl")],
        [str(tmp_path / "a.prm.jsonl"), str(tmp_path / "b.prm.jsonl")], str(tmp_path / "two"),
    )  # fmt: skip
    one = run_train_reward_model(
        rm_config(), "prm", str(tiny_policy), str(tmp_path / "both.problems.jsonl"),
        str(tmp_path / "both.prm.jsonl"), str(tmp_path / "one"),
    )  # fmt: skip
    assert two["train_rows"] == one["train_rows"] > 0 and two["heldout"] == one["heldout"]
    assert [h["loss"] for h in two["history"]] == [h["loss"] for h in one["history"]]
    weights = [(tmp_path / n / "model.safetensors").read_bytes() for n in ("one", "two")]
    assert weights[0] == weights[1]
    both = str(tmp_path / "both.problems.jsonl")
    with pytest.raises(ReasonRLError, match=r"both.problems.jsonl: problem id '.+' is also in"):
        run_train_reward_model(
            rm_config(), "prm", str(tiny_policy), [str(tmp_path / "a.problems.jsonl"), both],
            [str(tmp_path / "a.prm.jsonl")], str(tmp_path / "dup"),
        )  # fmt: skip


def test_bt_scores_read_the_last_token_of_each_conversation(tiny_policy):
    from transformers import AutoModelForSequenceClassification

    from reasonrl.rewards.scoring import bt_scores

    _, tokenizer = load_policy(tiny_policy)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_policy, num_labels=1).eval()
    texts = [render(tokenizer, [{"role": "user", "content": t}]) for t in ("a", "a b c d e f")]
    batched = bt_scores(model, tokenizer, texts)
    alone = [bt_scores(model, tokenizer, [t])[0] for t in texts]
    assert batched == pytest.approx(alone, abs=1e-5)


def test_score_rlhflow_imports_the_format_and_reranks(tiny_policy, tmp_path):
    import shutil

    from reasonrl.config import validate_config
    from reasonrl.stages.reward_models import score_rlhflow

    models = {}
    for kind in ("orm", "prm"):
        folder = tmp_path / kind
        shutil.copytree(tiny_policy, folder)
        (folder / "reward_model.json").write_text(json.dumps({"kind": kind, "labels": ["+", "-"]}))
        models[kind] = str(folder)
    rows = [
        to_rlhflow("Q1?", [["a", "so \\boxed{1}"], ["b \\boxed{2}"]], [True, False]),
        to_rlhflow("Q2?", [["c \\boxed{3}"], ["d", "e \\boxed{3}"]], [False, False]),
    ]
    write_jsonl(tmp_path / "rlhflow.jsonl", rows)
    config = validate_config({"reward_models": {"best_of_n": {"n": [1, 2]}}})
    table = score_rlhflow(config, str(tmp_path / "rlhflow.jsonl"), models, str(tmp_path / "out"))
    assert table["n_problems"] == 2 and table["n_samples"] == 2
    by = {(r["N"], r["method"]): r["accuracy"] for r in table["rows"]}
    assert {"orm@N", "prm-mean@N", "prm-min@N", "prm-last@N", "maj@N"} <= {m for _, m in by}
    assert {"vote-orm@N", "vote-prm-mean@N", "vote-prm-min@N", "vote-prm-last@N"} <= {
        m for _, m in by
    }
    assert by[(2, "pass@N")] == 0.5 and by[(1, "pass@1")] == 0.25
    assert (tmp_path / "out/best_of_n.csv").is_file()


def test_code_prm_trains_three_classes_on_mutation_rows(tiny_policy, tmp_path):
    sandbox = Sandbox.from_config({"cpu_seconds": 2, "wall_seconds": 5})
    problems = [{**code_problem(), "id": f"c{i}"} for i in range(3)]
    rows, _ = mutation_rows(problems, sandbox, 2, MUTATION_KINDS, 0)
    write_jsonl(tmp_path / "problems.jsonl", problems, schema="problem")
    write_jsonl(tmp_path / "prm.jsonl", rows, schema="prm_steps")
    metrics = run_train_reward_model(
        rm_config(),
        "prm",
        str(tiny_policy),
        str(tmp_path / "problems.jsonl"),
        str(tmp_path / "prm.jsonl"),
        str(tmp_path / "model-prm"),
    )
    assert metrics["labels"] == ["+", "-", "~"]
    assert json.loads((tmp_path / "model-prm/reward_model.json").read_text())["labels"] == [
        "+",
        "-",
        "~",
    ]
    assert set(metrics["heldout"]["per_label"]) == {"+", "-", "~"}


def test_bt_without_decisive_pairs_writes_an_untrained_head_and_says_so(
    tiny_policy, rm_inputs, tmp_path
):
    rows = read_jsonl(rm_inputs / "samples.jsonl")
    for row in rows:
        row["correct"] = False  # a policy that never solves anything: every pair is a tie
    write_jsonl(tmp_path / "samples.jsonl", rows, schema="trajectory")
    metrics = run_train_reward_model(
        rm_config(), "bt", str(tiny_policy), str(rm_inputs / "problems.jsonl"),
        str(tmp_path / "samples.jsonl"), str(tmp_path / "model-bt"),
    )  # fmt: skip
    assert metrics["steps"] == 0 and metrics["final_loss"] is None
    assert metrics["train_pairs"] == 0 and metrics["tied_prompts"] == 6
    assert (tmp_path / "model-bt/reward_model.json").is_file()


def test_bt_trains_on_the_pairs_bt_pairs_selects(tiny_policy, rm_inputs, tmp_path):
    config = rm_config()
    config["reward_models"]["bt_pairs"] = "all"  # 1 right x 2 wrong samples a prompt: 2 pairs
    metrics = run_train_reward_model(
        config, "bt", str(tiny_policy), str(rm_inputs / "problems.jsonl"),
        str(rm_inputs / "samples.jsonl"), str(tmp_path / "model-bt"),
    )  # fmt: skip
    assert metrics["train_pairs"] == 8 and metrics["heldout"]["pairs"] == 4
