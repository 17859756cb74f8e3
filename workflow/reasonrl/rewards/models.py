"""Reward-model training through the shared loop: Bradley-Terry, ORM and PRM.

BT: a scalar head on the SFT policy (sequence classification), loss -log sigma(r_w - r_l).
ORM / PRM: the SFT policy answers "+"/"-" (or "~") after the solution / after every step;
the next-token loss counts only those answer tokens (masked_lm_loss with a label-only mask).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from reasonrl.chat import TokenizedChat, render
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl
from reasonrl.manifest import Provenance
from reasonrl.models import DTYPES, execution_device, load_policy, load_tokenizer
from reasonrl.rewards.pairs import preference_pairs
from reasonrl.rewards.scoring import (
    bt_scores,
    encode_with_label_positions,
    label_probabilities,
    label_token_ids,
)
from reasonrl.rewards.steps import (
    NEGATIVE,
    NEUTRAL,
    POSITIVE,
    orm_messages,
    prm_messages,
    solution_step_texts,
)
from reasonrl.training.data import MicroBatches
from reasonrl.training.loop import CheckpointStore, LoopSettings, save_trained_model, train
from reasonrl.training.sft import masked_lm_loss

log = logging.getLogger(__name__)

KINDS = ("bt", "orm", "prm")
INFO_FILE = "reward_model.json"  # kind and label set, read by the scorers


def bradley_terry_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """-log sigma(r_w - r_l), mean over pairs; the first half of the batch is the chosen side."""
    rewards = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits[:, 0]
    chosen, rejected = rewards.float().chunk(2)
    loss = -F.logsigmoid(chosen - rejected).mean()
    stats = {
        "accuracy": float((chosen > rejected).float().mean().detach()),
        "margin": float((chosen - rejected).mean().detach()),
        "tokens": float(batch["attention_mask"].sum()),
    }
    return loss, stats


class PairBatches:
    """Micro-batch i of preference pairs, a pure function of i (as MicroBatches): chosen rows
    first, then the rejected rows in the same order, right-padded to one width."""

    def __init__(
        self, pairs: list[tuple[list[int], list[int]]], batch_size: int, pad_id: int, seed: int
    ):
        if not pairs:
            raise ReasonRLError("no preference pairs to train on")
        self.pairs, self.batch_size, self.pad_id, self.seed = pairs, batch_size, pad_id, seed
        self.per_epoch = max(1, len(pairs) // batch_size)

    def __call__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, position = divmod(index, self.per_epoch)
        order = list(range(len(self.pairs)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        chosen = [self.pairs[j] for j in order[position * self.batch_size :][: self.batch_size]]
        rows = [c for c, _ in chosen] + [r for _, r in chosen]
        width = max(map(len, rows))
        return {
            "input_ids": torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows]),
            "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        }


def label_only_chat(tokenizer, messages: list[dict], max_length: int) -> TokenizedChat:
    """The chat with a loss mask that is 1 only on the label answer tokens."""
    ids, positions = encode_with_label_positions(tokenizer, messages, max_length)
    mask = [0] * len(ids)
    for p in positions:
        mask[p] = 1
    return TokenizedChat(ids, mask)


def heldout_split(rows: list[dict], fraction: float, seed: int) -> tuple[list[dict], list[dict]]:
    """(train, held-out) by problem id, so no problem is on both sides."""
    ids = sorted({r["problem_id"] for r in rows})
    random.Random(seed).shuffle(ids)
    held = set(ids[: round(len(ids) * fraction)]) if len(ids) > 1 else set()
    return [r for r in rows if r["problem_id"] not in held], [
        r for r in rows if r["problem_id"] in held
    ]


def orm_rows(problems: dict[str, dict], samples: list[dict], section: dict) -> list[dict]:
    """One ORM example per sampled solution: its steps and the outcome label."""
    return [
        {
            "problem_id": s["problem_id"],
            "question": problems[s["problem_id"]]["question"],
            "steps": solution_step_texts(problems[s["problem_id"]], s["messages"], section),
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


def _settings(section: dict, seed: int) -> LoopSettings:
    train_section = section["train"]
    return LoopSettings(
        seed=seed, **{k: train_section[k] for k in LoopSettings.__dataclass_fields__ if k != "seed"}
    )


def _fingerprint(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def run_train_reward_model(
    config: dict, kind: str, model_path: str, problems_path: str, data_path: str, out_dir: str
) -> dict:
    """Train one reward model of `kind` from the SFT policy; write the folder, metrics, manifest.

    data_path: sampled trajectories (bt, orm) or PRM step rows (prm).
    """
    if kind not in KINDS:
        raise ReasonRLError(f"unknown reward model kind {kind!r} (expected one of {KINDS})")
    section, seed = config["reward_models"], config["seed"]
    out = Path(out_dir)
    provenance = Provenance(
        "train-reward-model",
        {"reward_models": section, "policy": config["policy"]},
        [model_path, problems_path, data_path],
        seed,
    )
    problems = {p["id"]: p for p in read_jsonl(problems_path, schema="problem")}
    schema = "prm_steps" if kind == "prm" else "trajectory"
    data = read_jsonl(data_path, schema=schema)
    unknown = sorted({r["problem_id"] for r in data} - problems.keys())
    if unknown:
        raise ReasonRLError(f"{data_path}: problem '{unknown[0]}' is not in {problems_path}")
    train_rows, held_rows = heldout_split(data, section["heldout_fraction"], seed)
    trainer = {"bt": _train_bt, "orm": _train_orm, "prm": _train_prm}[kind]
    checkpoints = CheckpointStore(
        out.parent / f".{out.name}.ckpt",
        _fingerprint(kind, section, seed, provenance.hashes),
    )
    model, tokenizer, result, info, heldout = trainer(
        config, model_path, problems, train_rows, held_rows, checkpoints
    )
    history = result["history"]
    metrics = {
        "name": out.name,
        "kind": kind,
        "steps": len(history),
        "resumed_from": result["resumed_from"],
        "final_loss": history[-1]["loss"] if history else None,
        "train_seconds": round(result["train_seconds"], 3),
        "heldout": heldout,
        **info,
        "history": history,
    }
    info_json = {"kind": kind, **{k: v for k, v in info.items() if k == "labels"}}
    save_trained_model(
        out, model, tokenizer, metrics, provenance, checkpoints,
        extra_json={INFO_FILE: info_json}, summary={"heldout": heldout},
    )  # fmt: skip
    return metrics


def _train_bt(config, model_path, problems, train_rows, held_rows, checkpoints):
    section, seed = config["reward_models"], config["seed"]
    tokenizer = load_tokenizer(model_path)
    torch.manual_seed(seed)  # the scalar head is initialised afresh: seeded, so reruns agree
    model = AutoModelForSequenceClassification.from_pretrained(
        model_path, num_labels=1, dtype=DTYPES[config["policy"]["dtype"]]
    )
    model.config.pad_token_id = tokenizer.pad_token_id
    max_length = section["train"]["max_length"]

    def encode(messages: list[dict]) -> list[int]:
        ids = tokenizer(render(tokenizer, messages), add_special_tokens=False)["input_ids"]
        return ids[-max_length:]  # keep the end: the head reads the last token

    train_pairs, ties = preference_pairs(train_rows)
    held_pairs, held_ties = preference_pairs(held_rows) if held_rows else ([], 0)
    if train_pairs:
        batches = PairBatches(
            [(encode(p["chosen"]), encode(p["rejected"])) for p in train_pairs],
            section["train"]["batch_size"],
            tokenizer.pad_token_id,
            seed,
        )
        result = train(model, batches, bradley_terry_loss, _settings(section, seed), checkpoints)
    else:
        # Every prompt's farthest pair was a tie (e.g. a policy that never solves anything):
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


def _train_label_model(config, model_path, chats, checkpoints):
    section, seed = config["reward_models"], config["seed"]
    model, tokenizer = load_policy(model_path, config["policy"]["dtype"])
    samples = [label_only_chat(tokenizer, m, section["train"]["max_length"]) for m in chats]
    batches = MicroBatches(
        samples, section["train"]["batch_size"], tokenizer.pad_token_id, seed, False, 0
    )
    result = train(model, batches, masked_lm_loss, _settings(section, seed), checkpoints)
    return result["model"].eval(), tokenizer, result


def _train_orm(config, model_path, problems, train_rows, held_rows, checkpoints):
    section = config["reward_models"]
    train_examples = orm_rows(problems, train_rows, section)
    chats = [orm_messages(e["question"], e["steps"], e["label"]) for e in train_examples]
    model, tokenizer, result = _train_label_model(config, model_path, chats, checkpoints)
    held = orm_rows(problems, held_rows, section)
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


def _train_prm(config, model_path, problems, train_rows, held_rows, checkpoints):
    labels = prm_label_set(train_rows + held_rows)
    chats = [prm_messages(r["question"], r["steps"], r["labels"]) for r in train_rows]
    model, tokenizer, result = _train_label_model(config, model_path, chats, checkpoints)
    heldout = {"steps": 0, "per_label": None}
    if held_rows:
        heldout = prm_step_metrics(model, tokenizer, held_rows, labels)
    info = {"labels": labels, "train_rows": len(train_rows)}
    return model, tokenizer, result, info, heldout


def prm_step_metrics(model, tokenizer, rows: list[dict], labels: list[str]) -> dict:
    """Per-label precision/recall of the PRM's argmax verdict on labelled steps, read as at
    inference: one pass per solution, earlier answers holding the "+" placeholder."""
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
        model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=DTYPES[dtype])
        return model.to(execution_device()).eval(), load_tokenizer(folder), info
    model, tokenizer = load_policy(folder, dtype)
    return model.eval(), tokenizer, info
