"""Training one reward model of each kind from the SFT policy, through the shared loop.

BT: a scalar head on the SFT policy, Bradley-Terry loss on preference pairs. ORM / PRM: the
policy answers "+"/"-" (or "~") after the solution / after each step, the masked LM loss on
those answers. Each returns (model, tokenizer, loop result, info, held-out metrics); `run` is
the stage's TrainingRun (stages._train): its loop call, so checkpoints and resume are its, and
its LoRA adapters (the section's `lora`), with the BT model's fresh score head trained in full.
Each takes the stage's RewardModelSettings (its train part with the job's grad_accum) and the
policy's dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import torch
from transformers import AutoModelForSequenceClassification

from reasonrl.chat import TokenizedChat, render
from reasonrl.models import DTYPES, from_pretrained, load_tokenizer, placed
from reasonrl.rewards.models import (
    label_only_chat,
    orm_rows,
    prm_label_set,
    prm_step_metrics,
    prm_training_chat,
)
from reasonrl.rewards.pairs import preference_pairs
from reasonrl.rewards.scoring import (
    bt_scores,
    encode_with_label_positions,
    label_probabilities,
    label_token_ids,
)
from reasonrl.rewards.settings import RewardModelSettings, RewardTrainSettings
from reasonrl.rewards.steps import NEGATIVE, POSITIVE, orm_messages
from reasonrl.training.data import MicroBatches
from reasonrl.training.lm_loss import masked_lm_loss, target_tokens
from reasonrl.training.loop import LoopSettings, steps_for_epochs
from reasonrl.training.reward import PairBatches, bradley_terry_loss

log = logging.getLogger(__name__)


class Run(Protocol):
    """What a trainer needs of the stage's TrainingRun."""

    def fit(
        self, model: torch.nn.Module, batches, loss_fn, settings: LoopSettings, loss_units=None
    ) -> dict:
        """The shared loop's result (history, model, ...)."""

    def adapt(
        self, model: torch.nn.Module, task: str = ..., trainable: tuple[str, ...] = ...
    ) -> torch.nn.Module:
        """`model` with the run's LoRA adapters, `trainable` trained in full; as it is
        without LoRA."""

    def load_policy(self, model_path: str, dtype: str) -> tuple[torch.nn.Module, object]:
        """The causal LM the run trains (with its adapters) and its tokenizer."""

    def load_options(self, dtype: str) -> dict:
        """from_pretrained's keywords for the model the run trains (a quantized base)."""


# What every trainer returns: the trained model, its tokenizer, the loop's result, the info
# the model's folder keeps and the held-out metrics.
TrainerOutput = tuple[torch.nn.Module, object, dict, dict, dict]


def loop_settings(train: RewardTrainSettings, rows: int) -> LoopSettings:
    """The shared loop's settings of a reward model trained on `rows` rows (pairs or
    solutions): train.max_steps, or the steps of train.epochs passes over them."""
    if train.epochs is None:
        return train.loop
    steps = steps_for_epochs(train.epochs, rows, train.batch_size, train.loop.grad_accum)
    return replace(train.loop, max_steps=steps)


def train_bt(
    settings: RewardModelSettings,
    dtype: str,
    model_path: str,
    problems: dict[str, dict],
    train_rows: list[dict],
    held_rows: list[dict],
    run: Run,
) -> TrainerOutput:
    seed = settings.seed
    tokenizer = load_tokenizer(model_path)
    torch.manual_seed(seed)  # the scalar head is initialised afresh: seeded, so reruns agree
    model = from_pretrained(
        AutoModelForSequenceClassification,
        model_path,
        num_labels=1,
        dtype=DTYPES[dtype],
        **placed(run.load_options(dtype)),
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    model = run.adapt(model, "SEQ_CLS", trainable=("score",))  # the head learns from scratch
    max_length = settings.train.max_length

    def encode(messages: list[dict]) -> list[int]:
        ids = tokenizer(render(tokenizer, messages), add_special_tokens=False)["input_ids"]
        return ids[-max_length:]  # keep the end: the head reads the last token

    selection = settings.bt_pairs
    train_pairs, ties = preference_pairs(train_rows, selection, seed)
    held_pairs, held_ties = preference_pairs(held_rows, selection, seed) if held_rows else ([], 0)
    if train_pairs:
        batches = PairBatches(
            [(encode(p["chosen"]), encode(p["rejected"])) for p in train_pairs],
            settings.train.batch_size,
            tokenizer.pad_token_id,
            seed,
        )
        loop = loop_settings(settings.train, len(train_pairs))
        result = run.fit(model, batches, bradley_terry_loss, loop)
    else:
        # No prompt gave a pair (e.g. a policy that never solves anything):
        # no preference to learn. The untrained head is still written, and the metrics say
        # so, so that the rest of the DAG runs and the tables show it.
        log.warning("no decisive preference pairs: the BT-RM head stays untrained")
        result = {"history": [], "resumed_from": 0, "train_seconds": 0.0, "model": model}
    model = result["model"].eval()
    heldout = {"pairs": len(held_pairs), "accuracy": None}
    if held_pairs:
        texts = [render(tokenizer, p[side]) for p in held_pairs for side in ("chosen", "rejected")]
        scores = bt_scores(model, tokenizer, texts)
        wins = [won > lost for won, lost in zip(scores[::2], scores[1::2], strict=True)]
        heldout["accuracy"] = sum(wins) / len(wins)
    info = {"train_pairs": len(train_pairs), "tied_prompts": ties + held_ties}
    return model, tokenizer, result, info, heldout


def _train_label_model(
    settings: RewardModelSettings,
    dtype: str,
    model_path: str,
    encode: Callable[[object, int], list[TokenizedChat]],
    run: Run,
) -> tuple[torch.nn.Module, object, dict]:
    """Train the policy on the examples `encode(tokenizer, max_length)` makes."""
    train = settings.train
    model, tokenizer = run.load_policy(model_path, dtype)
    samples = encode(tokenizer, train.max_length)
    batches = MicroBatches(
        samples, train.batch_size, tokenizer.pad_token_id, settings.seed, False, 0
    )
    loop = loop_settings(train, len(samples))
    result = run.fit(model, batches, masked_lm_loss, loop, loss_units=target_tokens)
    return result["model"].eval(), tokenizer, result


def train_orm(
    settings: RewardModelSettings,
    dtype: str,
    model_path: str,
    problems: dict[str, dict],
    train_rows: list[dict],
    held_rows: list[dict],
    run: Run,
) -> TrainerOutput:
    split = settings.step_splitter, settings.split_pattern
    train_examples = orm_rows(problems, train_rows, *split)
    chats = [orm_messages(e["question"], e["steps"], e["label"]) for e in train_examples]

    def encode(tokenizer, max_length: int) -> list[TokenizedChat]:
        return [label_only_chat(tokenizer, m, max_length) for m in chats]

    model, tokenizer, result = _train_label_model(settings, dtype, model_path, encode, run)
    held = orm_rows(problems, held_rows, *split)
    heldout = {"solutions": len(held), "accuracy": None}
    if held:
        ids = label_token_ids(tokenizer, (POSITIVE, NEGATIVE))
        seqs = [
            encode_with_label_positions(tokenizer, orm_messages(e["question"], e["steps"]))
            for e in held
        ]
        probs = label_probabilities(model, seqs, ids, tokenizer.pad_token_id)
        right = [
            (float(p[-1, 0]) >= 0.5) == (e["label"] == POSITIVE)
            for p, e in zip(probs, held, strict=True)
        ]
        heldout["accuracy"] = sum(right) / len(right)
    info = {"labels": [POSITIVE, NEGATIVE], "train_solutions": len(train_examples)}
    return model, tokenizer, result, info, heldout


def train_prm(
    settings: RewardModelSettings,
    dtype: str,
    model_path: str,
    problems: dict[str, dict],
    train_rows: list[dict],
    held_rows: list[dict],
    run: Run,
) -> TrainerOutput:
    labels = prm_label_set(train_rows + held_rows)

    def encode(tokenizer, max_length: int) -> list[TokenizedChat]:
        return [
            prm_training_chat(tokenizer, r["question"], r["steps"], r["labels"], max_length)
            for r in train_rows
        ]

    model, tokenizer, result = _train_label_model(settings, dtype, model_path, encode, run)
    heldout = {"steps": 0, "per_label": None}
    if held_rows:
        heldout = prm_step_metrics(model, tokenizer, held_rows, labels)
    info = {"labels": labels, "train_rows": len(train_rows)}
    return model, tokenizer, result, info, heldout


TRAINERS = {"bt": train_bt, "orm": train_orm, "prm": train_prm}
