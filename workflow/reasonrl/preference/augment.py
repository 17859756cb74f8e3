"""Prompt augmentation for the preference rounds (MetaMath / MMIQC style).

Rephrased questions (arith: template-level paraphrases; any math task: a configured model
rewrites them, kept only when every number survives), backward questions in the FOBAR style
(hide one number, give the answer, ask for the hidden number), exact and near-duplicate
removal (MinHash LSH on word n-grams, confirmed by exact Jaccard), decontamination against
every evaluation set (word n-gram overlap), and disjoint per-round splits plus a held-out
selection set. Augmented prompts stay in the split of the question they came from.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np

from reasonrl.errors import ReasonRLError
from reasonrl.tasks import arith

if TYPE_CHECKING:
    from reasonrl.generation import SamplingParams

log = logging.getLogger(__name__)

WORD = re.compile(r"[a-z0-9]+")
NUMBER = re.compile(r"\d+")
FOBAR_SUFFIX = (
    " If we know the answer to the above question is {answer}, "
    "what is the value of the unknown variable X?"
)
# The augmentation of a prompt from a source of augmented prompts (preference.prompts.sources)
# is SOURCED + the source task's name.
SOURCED = "source:"
MINHASH_PERMUTATIONS = 64
MINHASH_BANDS = 16
MERSENNE = (1 << 61) - 1


# ---- arith: questions back into their steps, and re-phrased ---------------------------------


def _template_regex(template: str) -> re.Pattern:
    fields = {
        "name": r"(?P<name>[A-Z][a-z]+)",
        "item": r"(?P<item>[a-z]+)",
        "box": r"(?P<box>[a-z]+)",
        "a": r"(?P<a>\d+)",
        "b": r"(?P<b>\d+)",
    }
    parts = re.split(r"\{(\w+)\}", template)
    pattern, seen = "", set()
    for i, part in enumerate(parts):
        if i % 2 == 0:
            pattern += re.escape(part)
        elif part in seen:
            pattern += f"(?P={part})"
        else:
            pattern += fields[part]
            seen.add(part)
    return re.compile(pattern + r"$")


START_PATTERNS = [(t, _template_regex(t)) for t in arith.START]
QUESTION_PATTERNS = [(t, _template_regex(t)) for t in arith.QUESTION]
STEP_PATTERNS = [
    (kind, t, _template_regex(t)) for kind, op in arith.OPERATIONS.items() for t in op.phrasings
]


def _match(patterns, sentence: str):
    for *key, regex in patterns:
        found = regex.match(sentence)
        if found:
            return (*key, found.groupdict())
    return None


def parse_arith(question: str) -> arith.ArithProblem | None:
    """The ArithProblem that renders to `question`, or None if it is not an arith question."""
    sentences = re.split(r"(?<=[.?]) ", question.strip())
    if len(sentences) < 3:
        return None
    start = _match(START_PATTERNS, sentences[0])
    end = _match(QUESTION_PATTERNS, sentences[-1])
    steps = [_match(STEP_PATTERNS, s) for s in sentences[1:-1]]
    if start is None or end is None or any(s is None for s in steps):
        return None
    boxes = [fields["box"] for *_, fields in steps if "box" in fields]
    problem = arith.ArithProblem(
        name=start[1]["name"],
        item=start[1]["item"],
        box=boxes[0] if boxes else arith.CONTAINERS[0],
        start=int(start[1]["a"]),
        start_phrasing=start[0],
        steps=tuple(
            arith.Step(kind, int(f.get("a", 0)), int(f.get("b", 0)), phrasing)
            for kind, phrasing, f in steps
        ),
        question_phrasing=end[0],
    )
    return problem if problem.question() == question.strip() else None


def paraphrase_arith(problem: arith.ArithProblem, rng: random.Random) -> arith.ArithProblem:
    """The same problem with every sentence in a (possibly) different template phrasing."""
    steps = tuple(
        arith.Step(s.kind, s.a, s.b, rng.choice(arith.OPERATIONS[s.kind].phrasings))
        for s in problem.steps
    )
    return arith.ArithProblem(
        name=problem.name,
        item=problem.item,
        box=problem.box,
        start=problem.start,
        start_phrasing=rng.choice(arith.START),
        steps=steps,
        question_phrasing=rng.choice(arith.QUESTION),
    )


def _arith_total(problem: arith.ArithProblem) -> int:
    total = problem.start
    for step in problem.steps:
        total = arith.OPERATIONS[step.kind].apply(total, step.a, step.b)
    return total


def _with_number(problem: arith.ArithProblem, slot: int, value: int) -> arith.ArithProblem:
    """`problem` with its slot-th number (0 = start, then each step's a and b) set to value."""
    if slot == 0:
        return arith.ArithProblem(**{**problem.__dict__, "start": value})
    steps, index = list(problem.steps), 1
    for i, step in enumerate(steps):
        for field in ("a", "b") if step.b else ("a",):
            if index == slot:
                steps[i] = arith.Step(**{**step.__dict__, field: value})
            index += 1
    return arith.ArithProblem(**{**problem.__dict__, "steps": tuple(steps)})


def arith_backward_is_unique(problem: arith.ArithProblem, slot: int, value: int) -> bool:
    """Whether the hidden number is the only value (up to 10x the largest) giving the answer.

    Integer sharing (x // a) can make several starting values reach one answer; such a
    backward question has no single answer and is dropped.
    """
    answer = _arith_total(problem)
    top = 10 * max([problem.start] + [max(s.a, s.b) for s in problem.steps]) + 10
    for candidate in range(1, top):
        if candidate == value:
            continue
        try:
            if _arith_total(_with_number(problem, slot, candidate)) == answer:
                return False
        except ZeroDivisionError:
            continue
    return True


# ---- any math task ---------------------------------------------------------------------------


def backward_question(question: str, answer: str, rng: random.Random) -> tuple[str, str] | None:
    """FOBAR: one number of the question replaced by X, the answer given; returns
    (question, hidden number) or None when the question has no number."""
    numbers = list(NUMBER.finditer(question))
    if not numbers:
        return None
    hidden = rng.choice(numbers)
    masked = question[: hidden.start()] + "X" + question[hidden.end() :]
    return masked + FOBAR_SUFFIX.format(answer=answer), hidden.group()


def _number_slot(question: str, position: int) -> int:
    return sum(1 for m in NUMBER.finditer(question) if m.start() < position)


def same_numbers(original: str, rephrased: str) -> bool:
    """A model's rephrasing is kept only if it states exactly the original's numbers."""
    return sorted(NUMBER.findall(original)) == sorted(NUMBER.findall(rephrased))


REPHRASE_INSTRUCTION = (
    "Rephrase the question above in other words. Keep every number and the quantity asked "
    "for. Write only the new question."
)


def model_rephrasings(engine, questions: list[str], params: SamplingParams) -> list[str | None]:
    """One sampled rephrasing per question from a generation engine (None if rejected)."""
    from reasonrl.chat import render

    prompts = [
        render(
            engine.tokenizer,
            [{"role": "user", "content": f"{q}\n{REPHRASE_INSTRUCTION}"}],
            add_generation_prompt=True,
        )
        for q in questions
    ]
    outputs = [c.text.strip() for c in engine.generate(prompts, params)]
    return [
        out if out and out != q and same_numbers(q, out) else None
        for q, out in zip(questions, outputs, strict=True)
    ]


# ---- de-duplication and decontamination --------------------------------------------------------


def normalize(text: str) -> str:
    return " ".join(WORD.findall(text.lower()))


def ngrams(text: str, n: int) -> set[str]:
    words = normalize(text).split()
    if len(words) < n:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def _minhash(shingles: set[str], a: np.ndarray, b: np.ndarray) -> np.ndarray:
    values = np.array([_stable_hash(s) % MERSENNE for s in shingles], dtype=object)
    if len(values) == 0:
        return np.zeros(len(a), dtype=np.int64)
    hashed = (np.outer(a, values) + b[:, None]) % MERSENNE
    return np.array([int(row.min()) for row in hashed], dtype=np.int64)


def deduplicate(texts: list[str], n: int, threshold: float) -> tuple[list[int], dict]:
    """Indices of the texts to keep (first occurrence wins) and counts of what was dropped.

    Exact duplicates after normalisation go first; near duplicates are candidate pairs from
    MinHash LSH (banded signatures of word n-grams) confirmed by exact Jaccard >= threshold.
    """
    seen: dict[str, int] = {}
    exact_kept = []
    for i, text in enumerate(texts):
        key = normalize(text)
        if key not in seen:
            seen[key] = i
            exact_kept.append(i)
    rng = np.random.default_rng(12345)
    a = np.array([int(x) for x in rng.integers(1, 1 << 61, MINHASH_PERMUTATIONS)], dtype=object)
    b = np.array([int(x) for x in rng.integers(0, 1 << 61, MINHASH_PERMUTATIONS)], dtype=object)
    rows = MINHASH_PERMUTATIONS // MINHASH_BANDS
    buckets: dict[tuple, list[int]] = defaultdict(list)
    shingles = {i: ngrams(texts[i], n) for i in exact_kept}
    kept: list[int] = []
    for i in exact_kept:
        signature = _minhash(shingles[i], a, b)
        bands = range(MINHASH_BANDS)
        keys = [(band, *signature[band * rows : (band + 1) * rows]) for band in bands]
        candidates = {j for key in keys for j in buckets.get(key, [])}
        if any(jaccard(shingles[i], shingles[j]) >= threshold for j in candidates):
            continue
        kept.append(i)
        for key in keys:
            buckets[key].append(i)
    counts = {
        "exact_duplicates": len(texts) - len(exact_kept),
        "near_duplicates": len(exact_kept) - len(kept),
    }
    return kept, counts


def contaminated(texts: list[str], eval_sets: dict[str, list[str]], n: int) -> dict[str, set[int]]:
    """For each evaluation set, the indices of texts sharing a word n-gram with one of its
    questions (a question shorter than n words: containing all of it)."""
    normalized = [f" {normalize(t)} " for t in texts]
    hits: dict[str, set[int]] = {}
    for name, questions in eval_sets.items():
        short = [f" {normalize(q)} " for q in questions if len(normalize(q).split()) < n]
        grams = set().union(*(ngrams(q, n) for q in questions if len(normalize(q).split()) >= n))
        hits[name] = {
            i
            for i, text in enumerate(texts)
            if ngrams(text, n) & grams or any(q in normalized[i] for q in short if q.strip())
        }
    return hits


# ---- the whole augmentation ------------------------------------------------------------------


def augment(
    problems: list[dict],
    settings: dict,
    seed: int,
    rephrase_with_model: Callable[[list[str]], list[str | None]] | None = None,
) -> list[dict]:
    """Originals followed by their rephrased and backward variants (problem rows).

    Each row's meta records its source problem and how it was made.
    """
    rng = random.Random(f"{seed}:augment")
    rows: list[dict] = []
    model_texts = (
        rephrase_with_model([p["question"] for p in problems])
        if (rephrase_with_model and settings["rephrase"] == "model")
        else [None] * len(problems)
    )
    for problem, model_text in zip(problems, model_texts, strict=True):
        rows.append(_variant(problem, problem["question"], problem["answer"], "original"))
        rows.extend(_rephrasings(problem, settings, rng, model_text))
        if rng.random() < settings["backward_fraction"]:
            backward = _backward(problem, rng)
            if backward is not None:
                rows.append(backward)
    return rows


def _variant(problem: dict, question: str, answer: str, how: str, k: int = 0) -> dict:
    suffix = "" if how == "original" else f"-{how}{k}"
    meta = {**(problem.get("meta") or {}), "source": problem["id"], "augmentation": how}
    solutions = problem["solutions"] if how == "original" else {}
    return {**problem, "id": problem["id"] + suffix, "question": question, "answer": answer,
            "solutions": solutions, "meta": meta}  # fmt: skip


def _rephrasings(problem: dict, settings: dict, rng: random.Random, model_text) -> list[dict]:
    if settings["rephrase"] == "model":
        return [] if model_text is None else [
            _variant(problem, model_text, problem["answer"], "rephrase")
        ]  # fmt: skip
    if settings["rephrase"] != "template":
        return []
    parsed = parse_arith(problem["question"])
    if parsed is None:
        return []
    out = []
    for k in range(settings["rephrasings_per_question"]):
        text = paraphrase_arith(parsed, rng).question()
        out.append(_variant(problem, text, problem["answer"], "rephrase", k))
    return out


def _backward(problem: dict, rng: random.Random) -> dict | None:
    if problem.get("code") is not None or not problem["answer"]:
        return None
    made = backward_question(problem["question"], problem["answer"], rng)
    if made is None:
        return None
    question, hidden = made
    parsed = parse_arith(problem["question"])
    if parsed is not None:
        slot = _number_slot(problem["question"], question.index("X"))
        if not arith_backward_is_unique(parsed, slot, int(hidden)):
            return None
    return _variant(problem, question, hidden, "backward")


def split_rounds(
    rows: list[dict], rounds: int, per_round: int, selection_size: int, seed: int
) -> tuple[list[list[dict]], list[dict]]:
    """Disjoint per-round prompt sets and a held-out selection set of original questions.

    Rows are grouped by source question, so a question and its variants share one split.
    per_round = 0 deals every remaining group out evenly.
    """
    groups: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        groups[row["meta"]["source"]].append(row)
    order = sorted(groups)
    random.Random(f"{seed}:splits").shuffle(order)
    selection_groups, rest = order[:selection_size], order[selection_size:]
    selection = [r for g in selection_groups for r in groups[g] if _is_original(r)]
    prompts_of = _deal(rest, groups, rounds, per_round)
    if any(not p for p in prompts_of):
        raise ReasonRLError(
            f"not enough augmented prompts for {rounds} rounds after {selection_size} "
            "selection questions; lower preference.prompts.selection_size or raise train_size"
        )
    _warn_short_rounds(prompts_of, per_round)
    return prompts_of, selection


def _warn_short_rounds(prompts_of: list[list[dict]], per_round: int) -> None:
    """A round with fewer prompts than asked learns from fewer pairs: said, not hidden."""
    for index, prompts in enumerate(prompts_of, start=1):
        if per_round and len(prompts) < per_round:
            log.warning(
                "round %d gets %d prompts, not preference.prompts.per_round = %d: the pool "
                "ran out; raise its size or lower per_round",
                index, len(prompts), per_round,
            )  # fmt: skip


def _is_original(row: dict) -> bool:
    """A question as its source gives it: the task's own, or one of a prompt source's (already
    augmented there, not here)."""
    how = row["meta"]["augmentation"]
    return how == "original" or how.startswith(SOURCED)


def _deal(order: list[str], groups: dict, rounds: int, per_round: int) -> list[list[dict]]:
    splits: list[list[dict]] = [[] for _ in range(rounds)]
    if per_round == 0:
        for i, group in enumerate(order):
            splits[i % rounds].extend(groups[group])
        return splits
    groups_iter: Iterable[str] = iter(order)
    for split in splits:
        for group in groups_iter:
            split.extend(groups[group])
            if len(split) >= per_round:
                break
    return [split[:per_round] for split in splits]
