"""Reward models: their training examples and held-out metrics, and loading a trained one.

BT: a scalar head on the SFT policy (sequence classification), trained on preference pairs.
ORM / PRM: the SFT policy answers "+"/"-" (or "~") after the solution / after every step;
the next-token loss counts only those answer tokens (a label-only mask). The PRM's training
input is its scoring input (every step answered by the step tag); the labels are only the
targets at the tags. The losses are in
training.reward and training.lm_loss; the training stage in stages.reward_models.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from transformers import AutoModelForSequenceClassification

from reasonrl.chat import TokenizedChat
from reasonrl.errors import ReasonRLError
from reasonrl.models import (
    DTYPES,
    execution_device,
    from_pretrained,
    load_policy,
    load_tokenizer,
)
from reasonrl.rewards.scoring import (
    encode_with_label_positions,
    label_probabilities,
    label_token_ids,
)
from reasonrl.rewards.steps import (
    NEGATIVE,
    NEUTRAL,
    POSITIVE,
    check_labels,
    prm_messages,
    solution_step_texts,
)

KINDS = ("bt", "orm", "prm")
INFO_FILE = "reward_model.json"  # kind and label set, read by the scorers


def label_only_chat(tokenizer, messages: list[dict], max_length: int) -> TokenizedChat:
    """The chat with a loss mask that is 1 only on the label answer tokens."""
    ids, positions = encode_with_label_positions(tokenizer, messages, max_length)
    mask = [0] * len(ids)
    for p in positions:
        mask[p] = 1
    return TokenizedChat(ids, mask)


def prm_training_chat(
    tokenizer, question: str, steps: list[str], labels: list[str], max_length: int
) -> TokenizedChat:
    """A PRM training example: the input is exactly what scoring reads (prm_messages, every
    step answered by the step tag) and the target at each tag is that step's label.

    Why not the true earlier labels in the input (RLHFlow's training chat): scoring cannot
    show them (they are what is being predicted), so a PRM trained on them sees a different
    input at test time, and learns to copy an earlier "-" instead of reading the step.
    Math-Shepherd's own design: the same tag after every step, the label predicted there.
    """
    check_labels(labels)
    ids, positions = encode_with_label_positions(
        tokenizer, prm_messages(question, steps), max_length
    )
    used = sorted(set(labels))
    label_ids = dict(zip(used, label_token_ids(tokenizer, used), strict=True))
    targets, mask = list(ids), [0] * len(ids)
    for position, label in zip(positions, labels, strict=False):  # answers cut by max_length
        targets[position], mask[position] = label_ids[label], 1
    return TokenizedChat(ids, mask, targets)


def heldout_split(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) by problem id, so no problem is on both sides."""
    ids = sorted({r["problem_id"] for r in rows})
    random.Random(seed).shuffle(ids)
    held = set(ids[: round(len(ids) * fraction)]) if len(ids) > 1 else set()
    return [r for r in rows if r["problem_id"] not in held], [
        r for r in rows if r["problem_id"] in held
    ]


def orm_rows(
    problems: dict[str, dict], samples: list[dict], splitter: str, pattern: str
) -> list[dict]:
    """One ORM example per sampled solution: its steps (solution_step_texts) and the outcome
    label."""
    return [
        {
            "problem_id": s["problem_id"],
            "question": problems[s["problem_id"]]["question"],
            "steps": solution_step_texts(
                problems[s["problem_id"]], s["messages"], splitter, pattern
            ),
            "label": POSITIVE if s["correct"] else NEGATIVE,
        }
        for s in samples
    ]


def prm_label_set(rows: list[dict]) -> list[str]:
    """ "+"/"-", plus "~" when the data has neutral steps (the 3-class code PRM)."""
    has_neutral = any(NEUTRAL in r["labels"] for r in rows)
    return [POSITIVE, NEGATIVE, NEUTRAL] if has_neutral else [POSITIVE, NEGATIVE]


def per_label_precision_recall(truth: list[str], predicted: list[str], labels: list[str]) -> dict:
    """Precision, recall and support of every label (None where undefined)."""
    out = {}
    for label in labels:
        hits = sum(t == label and p == label for t, p in zip(truth, predicted, strict=True))
        said, real = predicted.count(label), truth.count(label)
        out[label] = {
            "precision": hits / said if said else None,
            "recall": hits / real if real else None,
            "support": real,
        }
    return out


def prm_step_metrics(model, tokenizer, rows: list[dict], labels: list[str]) -> dict:
    """Per-label precision/recall of the PRM's argmax verdict on labelled steps, read as at
    inference (and as trained): one pass per solution, every answer holding the step tag."""
    ids = label_token_ids(tokenizer, labels)
    seqs = [
        encode_with_label_positions(tokenizer, prm_messages(r["question"], r["steps"]))
        for r in rows
    ]
    probs = label_probabilities(model, seqs, ids, tokenizer.pad_token_id)
    truth, predicted = [], []
    for row, p in zip(rows, probs, strict=True):
        truth += row["labels"][: len(p)]
        predicted += [labels[int(i)] for i in p.argmax(-1)]
    return {"steps": len(truth), "per_label": per_label_precision_recall(truth, predicted, labels)}


def load_reward_model(folder: str | Path, dtype: str = "float32"):
    """(model, tokenizer, info) of a trained reward model folder."""
    folder = Path(folder)
    info_path = folder / INFO_FILE
    if not info_path.is_file():
        raise ReasonRLError(f"{folder}: not a reward model folder (no {INFO_FILE})")
    info = json.loads(info_path.read_text())
    if info["kind"] == "bt":
        model = from_pretrained(AutoModelForSequenceClassification, folder, dtype=DTYPES[dtype])
        return model.to(execution_device()).eval(), load_tokenizer(folder), info
    model, tokenizer = load_policy(folder, dtype)
    return model.eval(), tokenizer, info
