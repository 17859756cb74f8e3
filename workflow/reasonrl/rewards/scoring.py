"""Reward-model scores: P(label) of every PRM step in ONE forward pass, ORM and BT scores.

A PRM conversation holds a label answer after every step; the model's distribution at the
token before each answer is its verdict on that step. All verdicts of a solution are read
from one sequence (the causal mask makes the verdict on step i depend only on steps <= i),
so a solution costs one forward pass, not one per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reasonrl.chat import assistant_spans
from reasonrl.errors import ReasonRLError
from reasonrl.models import on_model_device, to_device
from reasonrl.rewards.steps import LABELS, NEGATIVE, NEUTRAL, POSITIVE, orm_messages, prm_messages

AGGREGATIONS = ("mean", "min", "last")


def label_token_ids(tokenizer, labels: Sequence[str] = LABELS) -> list[int]:
    """The single token of each label answer; an error if the tokenizer splits one."""
    ids = []
    for label in labels:
        encoded = tokenizer(label, add_special_tokens=False)["input_ids"]
        if len(encoded) != 1:
            raise ReasonRLError(f"the tokenizer splits the label {label!r} into {len(encoded)}")
        ids.append(encoded[0])
    return ids


def encode_with_label_positions(
    tokenizer, messages: list[dict], max_length: int | None = None
) -> tuple[list[int], list[int]]:
    """Token ids of the chat and the index of the label token of every assistant turn.

    Positions come from the template's assistant spans (never from hard-coded ids); an
    answer truncated away by `max_length` is left out.
    """
    text, spans = assistant_spans(tokenizer, messages)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = {start: i for i, (start, _) in enumerate(encoded["offset_mapping"])}
    positions = []
    for lo, _ in spans:
        if lo not in starts:
            raise ReasonRLError("a label answer does not start on a token boundary")
        positions.append(starts[lo])
    ids = encoded["input_ids"]
    if max_length is not None:
        ids = ids[:max_length]
        positions = [p for p in positions if p < max_length]
    return ids, positions


@torch.inference_mode()
def label_probabilities(
    model,
    sequences: list[tuple[list[int], list[int]]],
    label_ids: list[int],
    pad_id: int,
    batch_size: int = 16,
) -> list[torch.Tensor]:
    """For each (ids, label positions): softmax over the label tokens at every position.

    One forward pass per sequence (batched, right-padded); returns [positions, labels] each.
    Logits are made only at the tokens before the labels (transformers' logits_to_keep):
    the vocabulary projection of every other position would be thrown away.
    """
    out: list[torch.Tensor | None] = [None] * len(sequences)
    order = sorted(range(len(sequences)), key=lambda i: -len(sequences[i][0]))
    device = next(model.parameters()).device
    candidates = torch.tensor(label_ids, device=device)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(sequences[i][0]) for i in idx)
        ids = torch.full((len(idx), width), pad_id)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        verdicts = torch.zeros((len(idx), width), dtype=torch.bool)
        for row, i in enumerate(idx):
            seq, positions = sequences[i]
            ids[row, : len(seq)] = torch.tensor(seq)
            mask[row, : len(seq)] = 1
            verdicts[row, [p - 1 for p in positions]] = True
        enc = to_device({"input_ids": ids, "attention_mask": mask}, device)
        kept = verdicts.any(0).nonzero().flatten()
        logits = model(**enc, use_cache=False, logits_to_keep=kept.to(device)).logits
        # Boolean selection keeps positions in row-major order: each row's ascending labels.
        picked = logits[verdicts[:, kept].to(device)][:, candidates]
        probs = picked.float().softmax(-1).cpu()
        counts = verdicts.sum(-1).tolist()
        for i, rows in zip(idx, probs.split(counts), strict=True):
            out[i] = rows
    return out


def score_steps(
    model, tokenizer, solutions: list[tuple[str, list[str]]], labels: Sequence[str], **kw
) -> list[torch.Tensor]:
    """[steps, labels] probabilities of every step of every (question, steps) solution, one
    forward pass per solution."""
    label_ids = label_token_ids(tokenizer, labels)
    sequences = [
        encode_with_label_positions(tokenizer, prm_messages(question, steps))
        for question, steps in solutions
    ]
    return label_probabilities(model, sequences, label_ids, tokenizer.pad_token_id, **kw)


def score_steps_one_by_one(
    model, tokenizer, question: str, steps: list[str], labels: Sequence[str]
) -> torch.Tensor:
    """The same verdicts, one forward pass per step prefix (the slow reference)."""
    label_ids = label_token_ids(tokenizer, labels)
    rows = []
    for i in range(1, len(steps) + 1):
        ids, positions = encode_with_label_positions(tokenizer, prm_messages(question, steps[:i]))
        probs = label_probabilities(
            model, [(ids, positions[-1:])], label_ids, tokenizer.pad_token_id
        )
        rows.append(probs[0][0])
    return torch.stack(rows)


def orm_scores(model, tokenizer, solutions: list[tuple[str, list[str]]], **kw) -> list[float]:
    """P("+") of the ORM's single answer for each (question, steps) solution."""
    label_ids = label_token_ids(tokenizer, (POSITIVE, NEGATIVE))
    sequences = [
        encode_with_label_positions(tokenizer, orm_messages(question, steps))
        for question, steps in solutions
    ]
    probs = label_probabilities(model, sequences, label_ids, tokenizer.pad_token_id, **kw)
    return [float(p[-1, 0]) for p in probs]


# Conversations per Bradley-Terry forward pass.
BT_BATCH = 16


@torch.inference_mode()
def bt_scores(model, tokenizer, texts: list[str], batch_size: int = BT_BATCH) -> list[float]:
    """The Bradley-Terry model's scalar reward of each rendered conversation."""
    scores = []
    for start in range(0, len(texts), batch_size):
        enc = tokenizer(
            texts[start : start + batch_size],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        enc = on_model_device(enc, model)
        scores += model(**enc, use_cache=False).logits[:, 0].float().tolist()
    return scores


def step_goodness(probs: torch.Tensor, labels: Sequence[str]) -> list[float]:
    """Per step 1 - P("-"): P("+") for a "+"/"-" PRM; for the 3-class code PRM a neutral step
    (a change the tests cannot see) is not held against the solution."""
    return (1.0 - probs[:, list(labels).index(NEGATIVE)]).tolist()


def aggregate(step_positive: Sequence[float], how: str) -> float:
    """A solution's PRM score from its step scores: mean, min or last."""
    if how not in AGGREGATIONS:
        raise ReasonRLError(f"unknown PRM aggregation {how!r} (expected one of {AGGREGATIONS})")
    values = list(step_positive)
    if not values:
        raise ReasonRLError("cannot aggregate a solution without steps")
    if how == "mean":
        return sum(values) / len(values)
    return min(values) if how == "min" else values[-1]


def step_classes(
    probs: torch.Tensor, labels: Sequence[str], neutral_band: Sequence[float]
) -> list[str]:
    """A label per step: the argmax for a 3-class PRM; for a "+"/"-" PRM, P("+") above the band
    is "+", below it "-", inside it neutral (the band makes HGS-PRM's neutral fallback usable)."""
    if NEUTRAL in labels:
        return [labels[int(i)] for i in probs.argmax(-1)]
    low, high = neutral_band
    return [
        POSITIVE if p >= high else NEGATIVE if p < low else NEUTRAL
        for p in probs[:, labels.index(POSITIVE)].tolist()
    ]
