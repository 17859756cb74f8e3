"""Supervised fine-tuning: next-token loss on the model's own turns only."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from reasonrl.chat import tokenize_chat
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl
from reasonrl.manifest import Provenance
from reasonrl.models import load_policy
from reasonrl.tasks import prompt_messages, solution_messages
from reasonrl.training.data import IGNORE, MicroBatches
from reasonrl.training.loop import CheckpointStore, LoopSettings, save_trained_model, train

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


def masked_lm_loss(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
    """Mean cross-entropy over tokens whose label is not IGNORE (assistant tokens)."""
    inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
    logits = model(**inputs, use_cache=False).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    loss = F.cross_entropy(
        logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=IGNORE
    )
    stats = {
        "tokens": float(batch["num_tokens"].sum()),
        "target_tokens": float((targets != IGNORE).sum()),
    }
    return loss, stats


def sft_samples(tokenizer, problems: list[dict], style: str, max_length: int) -> list:
    """Prompt + gold solution of each problem in `style`, tokenised with assistant-only masks."""
    samples = []
    for problem in problems:
        solution = solution_messages(problem, style)
        if solution:
            messages = prompt_messages(problem, style) + solution
            samples.append(tokenize_chat(tokenizer, messages, max_length))
    return samples


def run_sft(
    config: dict, style: str, model_path: str, train_files: list[str], out_dir: str
) -> dict:
    """Train on the gold solutions in `style`; write the HF folder, metrics and manifest."""
    section = config["sft"]
    out = Path(out_dir)
    provenance = Provenance(
        "sft",
        {"sft": section, "policy": config["policy"]},
        [model_path, *train_files],
        config["seed"],
    )
    model, tokenizer = load_policy(model_path, config["policy"]["dtype"])
    problems = [row for path in train_files for row in read_jsonl(path, schema="problem")]
    samples = sft_samples(tokenizer, problems, style, section["max_length"])
    if not samples:
        raise ReasonRLError(f"{', '.join(train_files)}: no gold '{style}' solutions to train on")
    batches = MicroBatches(
        samples,
        section["batch_size"],
        tokenizer.pad_token_id,
        config["seed"],
        section["packing"],
        section["block_size"],
        section["group_by_length"],
    )
    fingerprint = hashlib.sha256(
        json.dumps([section, style, config["seed"], provenance.hashes], sort_keys=True).encode()
    ).hexdigest()
    checkpoints = CheckpointStore(out.parent / f".{out.name}.ckpt", fingerprint)
    result = train(
        model,
        batches,
        masked_lm_loss,
        LoopSettings.from_config(section, config["seed"]),
        checkpoints,
    )
    history = result["history"]
    metrics = {
        "name": out.name,
        "style": style,
        "steps": len(history),
        "resumed_from": result["resumed_from"],
        "final_loss": history[-1]["loss"],
        "train_seconds": round(result["train_seconds"], 3),
        "tokens_per_second": _tokens_per_second(history),
        "num_samples": len(samples),
        "num_micro_batch_items": len(batches.items),
        "packing": section["packing"],
        "group_by_length": section["group_by_length"],
        "history": history,
    }
    save_trained_model(
        out, result["model"], tokenizer, metrics, provenance, checkpoints,
        state_dict=result["state_dict"],
    )  # fmt: skip
    return metrics


def _tokens_per_second(history: list[dict]) -> float:
    seconds = sum(h["seconds"] for h in history)
    return round(sum(h["tokens"] for h in history) / seconds, 1) if seconds else 0.0
