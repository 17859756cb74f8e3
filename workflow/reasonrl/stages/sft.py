"""Supervised fine-tuning: next-token loss on the model's own turns only."""

from __future__ import annotations

from reasonrl.chat import tokenize_chat
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl
from reasonrl.stages._train import TrainingRun
from reasonrl.tasks import prompt_messages, solution_messages
from reasonrl.training.data import MicroBatches
from reasonrl.training.lm_loss import masked_lm_loss, target_tokens
from reasonrl.training.loop import LoopSettings, steps_for_epochs, with_accumulation
from reasonrl.training.lora import LoraSettings
from reasonrl.training.packed_attention import use_packed_attention


def sft_samples(tokenizer, problems: list[dict], style: str, max_length: int) -> list:
    """Prompt + gold solution of each problem in `style`, tokenised with assistant-only masks."""
    samples = []
    for problem in problems:
        solution = solution_messages(problem, style)
        if solution:
            messages = prompt_messages(problem, style) + solution
            samples.append(tokenize_chat(tokenizer, messages, max_length))
    return samples


def sft(config: dict, style: str, model_path: str, train_files: list[str], out_dir: str) -> dict:
    """Train on the gold solutions in `style`; write the HF folder, metrics and manifest."""
    section, seed = with_accumulation(config["sft"], "sft"), config["seed"]
    sections = {"sft": section, "policy": config["policy"]}
    inputs = [model_path, *train_files]
    lora = LoraSettings.from_config(section["lora"], "sft.lora")
    run = TrainingRun("sft", out_dir, sections, inputs, seed, section, style, seed, lora=lora)
    model, tokenizer = run.load_policy(model_path, config["policy"]["dtype"])
    problems = [row for path in train_files for row in read_jsonl(path, schema="problem")]
    samples = sft_samples(tokenizer, problems, style, section["max_length"])
    if not samples:
        raise ReasonRLError(f"{', '.join(train_files)}: no gold '{style}' solutions to train on")
    batches = MicroBatches(
        samples,
        section["batch_size"],
        tokenizer.pad_token_id,
        seed,
        section["packing"],
        section["block_size"],
        section["group_by_length"],
    )
    if section["packing"]:
        use_packed_attention(model)
    steps = sft_steps(section, len(batches.items))
    settings = LoopSettings.from_config({**section, "max_steps": steps}, seed)
    result = run.fit(model, batches, masked_lm_loss, settings, loss_units=target_tokens)
    extra = {
        "tokens_per_second": _tokens_per_second(result["history"]),
        "num_samples": len(samples),
        "num_micro_batch_items": len(batches.items),
        "packing": section["packing"],
        "group_by_length": section["group_by_length"],
    }
    metrics = run.metrics(result, {"style": style}, extra)
    run.save(result["model"], tokenizer, metrics, state_dict=result["state_dict"])
    return metrics


def sft_steps(section: dict, items: int) -> int:
    """max_steps, or the steps of `epochs` passes over `items` micro-batch items (packed
    blocks or samples) when the section sets epochs."""
    if section["epochs"] is None:
        return section["max_steps"]
    return steps_for_epochs(section["epochs"], items, section["batch_size"], section["grad_accum"])


def _tokens_per_second(history: list[dict]) -> float:
    seconds = sum(h["seconds"] for h in history)
    return round(sum(h["tokens"] for h in history) / seconds, 1) if seconds else 0.0
