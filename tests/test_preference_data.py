"""Prompt augmentation (rephrase, FOBAR, dedup, decontamination, splits) and labelling."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from reasonrl.errors import ReasonRLError
from reasonrl.preference import augment as aug
from reasonrl.preference.labelling import ignored_interpreter_error, label_preferences
from reasonrl.tasks import build_problems
from reasonrl.tasks.arith import run_program

SETTINGS = {"rephrase": "template", "rephrasings_per_question": 1, "backward_fraction": 1.0}


@pytest.fixture(scope="module")
def arith_problems():
    train, test = build_problems("arith", {"kind": "arith", "train_size": 80, "test_size": 20}, 3)
    return train, test


# ---- augmentation -------------------------------------------------------------------------


def test_arith_questions_parse_back_to_their_problems(arith_problems):
    train, _ = arith_problems
    for row in train:
        parsed = aug.parse_arith(row["question"])
        assert parsed is not None and parsed.question() == row["question"]
        assert run_program(parsed.program()) == row["answer"]
    assert aug.parse_arith("What is 2 + 3?") is None


def test_template_paraphrases_keep_the_answer_and_change_the_wording(arith_problems):
    train, _ = arith_problems
    rows = aug.augment(train, {**SETTINGS, "backward_fraction": 0.0}, seed=0)
    rephrased = [r for r in rows if r["meta"]["augmentation"] == "rephrase"]
    assert len(rephrased) == len(train)
    by_id = {r["id"]: r for r in train}
    changed = 0
    for row in rephrased:
        source = by_id[row["meta"]["source"]]
        parsed = aug.parse_arith(row["question"])
        assert run_program(parsed.program()) == source["answer"] == row["answer"]
        changed += row["question"] != source["question"]
    assert changed > len(train) // 2


def test_backward_questions_hide_one_number_and_ask_for_it(arith_problems):
    train, _ = arith_problems
    rows = aug.augment(train, {**SETTINGS, "rephrasings_per_question": 0}, seed=0)
    backward = [r for r in rows if r["meta"]["augmentation"] == "backward"]
    assert backward, "some backward questions must be unique"
    by_id = {r["id"]: r for r in train}
    for row in backward:
        source = by_id[row["meta"]["source"]]
        assert f"the answer to the above question is {source['answer']}," in row["question"]
        restored = row["question"].split(" If we know")[0].replace("X", row["answer"], 1)
        assert restored == source["question"]


def test_backward_question_with_several_solutions_is_dropped():
    # 10 // 4 == 11 // 4: hiding the start leaves two answers
    problem = aug.parse_arith(
        "Tom has 10 coins. Tom splits the coins into 4 equal piles and keeps one pile. "
        "How many coins does Tom have now?"
    )
    assert not aug.arith_backward_is_unique(problem, 0, 10)
    assert not aug.arith_backward_is_unique(problem, 1, 4)  # 10 // 5 == 2 as well
    unique = aug.parse_arith(
        "Tom has 10 coins. Tom buys 5 more coins. How many coins does Tom have now?"
    )
    assert aug.arith_backward_is_unique(unique, 0, 10)
    assert aug.arith_backward_is_unique(unique, 1, 5)


def test_model_rephrasings_must_keep_every_number_and_sample_as_configured():
    from reasonrl.config import validate_config
    from reasonrl.generation import SamplingParams

    used = []

    class Engine:
        tokenizer = None

        def generate(self, prompts, params):
            from reasonrl.generation import Completion

            used.append(params)
            texts = ["Ann owns 3 pens and buys 4 more; how many?", "Ann owns 3 pens. How many?"]
            return [Completion(t, 5, "eos") for t in texts]

    import reasonrl.chat

    section = validate_config({})["preference"]["prompts"]["rephrase_sampling"]
    params = SamplingParams.from_section(section, seed=3)
    original = reasonrl.chat.render
    reasonrl.chat.render = lambda tok, messages, add_generation_prompt=False: "prompt"
    try:
        out = aug.model_rephrasings(Engine(), ["Ann has 3 pens. She buys 4 more."] * 2, params)
    finally:
        reasonrl.chat.render = original
    assert out == ["Ann owns 3 pens and buys 4 more; how many?", None]
    # the defaults are the values the rephraser sampled at before they were settings
    assert used == [SamplingParams(temperature=0.7, top_p=1.0, max_new_tokens=256, seed=3)]


def test_exact_and_near_duplicates_are_removed():
    texts = [
        "Tom has 12 marbles. Tom buys 5 more marbles. How many marbles does Tom have now?",
        "tom has 12 marbles.  Tom buys 5 more marbles. How many marbles does Tom have now?",
        "Tom has 12 marbles! Tom buys 5 more marbles. How many marbles does Tom have now",
        "Anna owns 7 books. Anna loses 2 books. How many books does Anna have at the end?",
        "Tom has 12 marbles. Tom buys 5 more marbles. How many marbles does Tom have at last?",
    ]
    kept, counts = aug.deduplicate(texts, n=3, threshold=0.7)
    assert kept == [0, 3]
    assert counts == {"exact_duplicates": 2, "near_duplicates": 1}
    kept, counts = aug.deduplicate(texts, n=3, threshold=0.99)
    assert kept == [0, 3, 4] and counts["near_duplicates"] == 0


def test_decontamination_flags_shared_ngrams_per_evaluation_set():
    texts = [
        "Tom has 12 marbles. Tom buys 5 more marbles. How many marbles does Tom have now?",
        "Anna owns 7 books. Anna loses 2 books. How many books does Anna have at the end?",
        "A different question entirely about nothing at all here.",
    ]
    eval_sets = {
        "arith": ["Lily has 3 cards. Tom buys 5 more marbles. How many marbles does Tom have?"],
        "other": ["Anna owns 7 books."],
    }
    hits = aug.contaminated(texts, eval_sets, n=5)
    assert hits == {"arith": {0}, "other": {1}}
    # the shared run is 11 words long; a question shorter than n must appear whole
    assert aug.contaminated(texts, eval_sets, n=12) == {"arith": set(), "other": {1}}


def test_round_splits_are_disjoint_and_keep_variants_with_their_source(arith_problems):
    train, _ = arith_problems
    rows = aug.augment(train, SETTINGS, seed=0)
    rounds, selection = aug.split_rounds(rows, 3, 20, 10, seed=0)
    assert [len(r) for r in rounds] == [20, 20, 20]
    ids = [r["id"] for split in rounds for r in split] + [r["id"] for r in selection]
    assert len(ids) == len(set(ids))
    sources = [{r["meta"]["source"] for r in split} for split in [*rounds, selection]]
    for i, a in enumerate(sources):
        for b in sources[i + 1 :]:
            assert not a & b, "a question and its variants share one split"
    assert all(r["meta"]["augmentation"] == "original" for r in selection)
    assert len(selection) == 10
    again, _ = aug.split_rounds(rows, 3, 20, 10, seed=0)
    assert [r["id"] for r in again[0]] == [r["id"] for r in rounds[0]]
    with pytest.raises(ReasonRLError, match="not enough"):
        aug.split_rounds(rows[:30], 3, 20, 10, seed=0)


def test_a_round_the_pool_cannot_fill_is_warned_about(arith_problems, caplog):
    train, _ = arith_problems  # 80 questions: 10 for selection, 30 + 30 + 10 for the rounds
    rows = [r for r in aug.augment(train, SETTINGS, seed=0) if _original(r)]
    with caplog.at_level("WARNING", logger="reasonrl.preference.augment"):
        rounds, _ = aug.split_rounds(rows, 3, 30, 10, seed=0)
    assert [len(r) for r in rounds] == [30, 30, 10]
    assert [r.getMessage()[:24] for r in caplog.records] == ["round 3 gets 10 prompts,"]
    assert "preference.prompts.per_round = 30" in caplog.records[0].getMessage()


def _original(row: dict) -> bool:
    return row["meta"]["augmentation"] == "original"


# ---- labelling ----------------------------------------------------------------------------

PROMPT = [{"role": "user", "content": "q"}]


def trajectory(pid, sample, correct, status=("ok",), reason="answer", tokens=50, answer="7"):
    messages = PROMPT + [
        {"role": "assistant", "content": "```python\nprint(7)\n```"},
        {"role": "user", "content": "```output\n7\n```"},
        {"role": "assistant", "content": f"\\boxed{{{answer}}}"},
    ]
    return {
        "problem_id": pid, "task": "arith", "sample": sample, "messages": messages,
        "final_answer": answer, "correct": correct, "finish_reason": reason, "num_turns": 2,
        "num_tokens": tokens, "tool_status": list(status), "decoding": "sampled", "policy": "p",
    }  # fmt: skip


def test_winner_that_ignored_an_interpreter_error_is_dropped():
    assert ignored_interpreter_error(trajectory("a", 0, True, status=("error",)))
    assert not ignored_interpreter_error(trajectory("a", 0, True, status=("error", "ok")))
    rows = [trajectory("a", 0, True, status=("error",)), trajectory("a", 1, False)]
    pairs, unpaired, winners, stats = label_preferences(rows, 2048, seed=0)
    assert pairs == [] and winners == [] and stats["dropped_ignored_error"] == 1
    assert stats["coverage"] == 0.0


def test_over_cap_trajectories_are_dropped_from_both_sets():
    rows = [
        trajectory("a", 0, True, tokens=3000),
        trajectory("a", 1, False, reason="total_token_cap"),
        trajectory("a", 2, True),
        trajectory("a", 3, False),
    ]
    pairs, _, _, stats = label_preferences(rows, 2048, seed=0)
    assert stats["dropped_over_cap"] == 2
    assert len(pairs) == 1
    assert pairs[0]["chosen"] == rows[2]["messages"] and pairs[0]["rejected"] == rows[3]["messages"]


def test_one_random_pair_per_prompt_kto_rows_and_coverage():
    rows = []
    for pid, outcomes in {"a": [1, 1, 0, 0, 0], "b": [1, 1, 1], "c": [0, 0], "d": [0, 1]}.items():
        rows += [trajectory(pid, i, bool(c), answer=str(i)) for i, c in enumerate(outcomes)]
    pairs, unpaired, winners, stats = label_preferences(rows, 2048, seed=0)
    assert [p["problem_id"] for p in pairs] == ["a", "d"]
    assert stats["coverage"] == pytest.approx(2 / 4)
    assert stats["prompts_all_correct"] == 1 and stats["prompts_none_correct"] == 1
    for pair in pairs:
        assert pair["prompt"] == PROMPT
    assert [(u["problem_id"], u["desirable"]) for u in unpaired] == [
        ("a", True), ("a", False), ("d", True), ("d", False)
    ]  # fmt: skip
    assert sorted(w["problem_id"] for w in winners) == ["a", "b", "d"]
    assert all(w["desirable"] for w in winners)
    chosen = {
        label_preferences(rows, 2048, seed=s)[0][0]["chosen"][-1]["content"] for s in range(8)
    }
    assert len(chosen) == 2, "the winner is drawn at random (seeded)"
    again = label_preferences(rows, 2048, seed=0)[0]
    assert again == pairs


def test_labelled_rows_fit_their_schemas(tmp_path):
    from reasonrl.io import write_jsonl

    rows = [trajectory("a", 0, True), trajectory("a", 1, False)]
    pairs, unpaired, winners, _ = label_preferences(rows, 2048, seed=random.Random(0).randint(0, 9))
    write_jsonl(tmp_path / "p.jsonl", pairs, schema="preference_pair")
    write_jsonl(tmp_path / "u.jsonl", unpaired + winners, schema="preference_unpaired")


def test_more_pairs_per_prompt_take_distinct_losers_each_with_a_winner():
    outcomes = [1, 1, 0, 0, 0]
    rows = [trajectory("a", i, bool(c), answer=str(i)) for i, c in enumerate(outcomes)]
    rows.append(trajectory("b", 0, True))
    rows.append(trajectory("b", 1, False, answer="b1"))
    one = label_preferences(rows, 2048, seed=0)
    pairs, unpaired, _, stats = label_preferences(rows, 2048, seed=0, pairs_per_prompt=5)
    assert pairs[0] == one[0][0], "the first pair is the paper's one random pair"
    of_a = [p for p in pairs if p["problem_id"] == "a"]
    assert len(of_a) == 3 and len(pairs) == 4
    assert len({p["rejected"][-1]["content"] for p in of_a}) == 3, "distinct losers"
    assert {p["chosen"][-1]["content"] for p in of_a} <= {"\\boxed{0}", "\\boxed{1}"}
    assert unpaired == one[1], "KTO rows stay the first pair's"
    assert stats["pairs"] == 4 and stats["coverage"] == 1.0
    two = label_preferences(rows, 2048, seed=0, pairs_per_prompt=2)[0]
    assert [p["problem_id"] for p in two] == ["a", "a", "b"]


def test_default_config_pool_fills_every_round_after_decontamination(tmp_path):
    """config/config.yaml's preference pool of the frontier band, decontaminated against both
    test splits, still gives each round its per_round prompts (a short pool silently shrinks
    the last round)."""
    from reasonrl.config import load_workflow_config
    from reasonrl.io import write_jsonl
    from reasonrl.stages.preference import augment_prompts
    from reasonrl.tasks import build_splits

    repo = Path(__file__).resolve().parents[1]
    config = load_workflow_config([], default=str(repo / "config/config.yaml"))
    task = config["preference"]["task"]
    eval_sets = {}
    for name in config["evaluation"]["tasks"]:
        splits = build_splits(name, config["tasks"][name], config["seed"])
        eval_sets[name] = str(tmp_path / f"{name}-test.jsonl")
        write_jsonl(eval_sets[name], splits["test"], schema="problem")
        if name == task:
            write_jsonl(tmp_path / "pool.jsonl", splits["pool-preference"], schema="problem")
    rounds = config["preference"]["variants"][0]["rounds"]
    stats = augment_prompts(
        config, task, str(tmp_path / "pool.jsonl"), eval_sets, rounds, str(tmp_path / "out")
    )
    assert sum(stats["contaminated"].values()) > 0
    per_round = config["preference"]["prompts"]["per_round"]
    assert stats["per_round"] == [per_round] * rounds
    assert stats["selection"] == config["preference"]["prompts"]["selection_size"]


def test_a_prompt_source_joins_the_rounds_deduplicated_and_decontaminated(tmp_path):
    """MetaMathQA-style prompts from `sources` join the task's own: a copy of a test question
    is dropped, a near-copy of another prompt too, the rest fill the rounds named by source."""
    from reasonrl.config import validate_config
    from reasonrl.io import read_jsonl, write_jsonl
    from reasonrl.stages.preference import augment_prompts
    from reasonrl.tasks import build_problems

    own, test = build_problems("arith", {"kind": "arith", "train_size": 20, "test_size": 5}, 0)
    write_jsonl(tmp_path / "train.jsonl", own, schema="problem")
    write_jsonl(tmp_path / "test.jsonl", test, schema="problem")
    sourced, _ = build_problems("extra", {"kind": "arith", "train_size": 10, "test_size": 1}, 7)
    # MetaMathQA-style variants: two made from a train question of the task, two from another
    for i, original in ((2, own[3]["question"]), (3, own[3]["question"]), (4, "Q?"), (5, "Q?")):
        sourced[i]["meta"] = {**sourced[i]["meta"], "original_question": original}
    leaked = {**sourced[0], "question": test[0]["question"]}
    copied = {**sourced[1], "question": own[0]["question"]}
    write_jsonl(tmp_path / "extra.jsonl", [leaked, copied, *sourced[2:]], schema="problem")
    prompts = {"rephrase": "none", "backward_fraction": 0.0, "per_round": 0,
               "selection_size": 2, "sources": ["extra"]}  # fmt: skip
    config = validate_config({"preference": {"prompts": prompts}})
    stats = augment_prompts(
        config, "arith", str(tmp_path / "train.jsonl"), {"arith": str(tmp_path / "test.jsonl")},
        2, str(tmp_path / "out"), {"extra": str(tmp_path / "extra.jsonl")},
    )  # fmt: skip
    assert stats["made"]["source:extra"] == 10 and stats["contaminated"] == {"arith": 1}
    assert stats["kept"] == 20 + 10 - 2 == sum(stats["per_round"]) + stats["selection"]
    rows = [r for n in (1, 2) for r in read_jsonl(tmp_path / "out" / f"round{n}.jsonl")]
    kept = {r["id"] for r in rows if r["meta"]["augmentation"] == "source:extra"}
    selection = read_jsonl(tmp_path / "out" / "selection.jsonl")
    kept |= {r["id"] for r in selection if r["meta"]["augmentation"] == "source:extra"}
    assert kept == {p["id"] for p in sourced[2:]}
    # variants of one question share its split: a round or the selection set
    split_of = {r["id"]: r["meta"]["source"] for r in rows + selection}
    files = {
        r["id"]: name
        for name in ("round1", "round2", "selection")
        for r in read_jsonl(tmp_path / "out" / f"{name}.jsonl")
    }
    assert split_of[sourced[2]["id"]] == split_of[sourced[3]["id"]] == own[3]["id"]
    assert files[sourced[2]["id"]] == files[sourced[3]["id"]] == files[own[3]["id"]]
    assert files[sourced[4]["id"]] == files[sourced[5]["id"]]
