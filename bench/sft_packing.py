"""SFT tokens/s with packing, length-grouped padding and plain padding on the same arith data,
side by side in one run.

python bench/sft_packing.py [--steps 30] [--config config/config.yaml]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from record import append

from reasonrl.config import load_config
from reasonrl.io import write_jsonl
from reasonrl.models import build_tiny_policy, load_policy, on_model_device
from reasonrl.stages.models import corpus_texts
from reasonrl.stages.sft import sft_samples
from reasonrl.tasks import build_problems
from reasonrl.training.data import MicroBatches
from reasonrl.training.lm_loss import masked_lm_loss
from reasonrl.training.packed_attention import use_packed_attention


def tokens_per_second(model, runs: dict[str, MicroBatches], steps: int) -> dict[str, float]:
    """Real tokens/s of each way of batching, one step of each in turn, so all see the same
    load on a shared machine."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = dict.fromkeys(runs, 0.0)
    seconds = dict.fromkeys(runs, 0.0)
    for batches in runs.values():  # one step of each outside the clock (allocator, kernels)
        loss, _ = masked_lm_loss(model, on_model_device(batches(0), model))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for i in range(steps):
        for name, batches in runs.items():
            started = time.perf_counter()
            loss, stats = masked_lm_loss(model, on_model_device(batches(i), model))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if torch.cuda.is_available():
                torch.cuda.synchronize()  # a GPU step is timed to its end, not to its launch
            seconds[name] += time.perf_counter() - started
            tokens[name] += stats["tokens"]
    return {name: tokens[name] / seconds[name] for name in runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    config = load_config(args.config)
    sft = config["sft"]
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = build_problems("arith", config["tasks"]["arith"], config["seed"])
        write_jsonl(f"{tmp}/train.jsonl", train, schema="problem")
        build_tiny_policy(
            corpus_texts([f"{tmp}/train.jsonl"]), config["policy"]["tiny"], 0, f"{tmp}/m"
        )
        model, tokenizer = load_policy(f"{tmp}/m")
        use_packed_attention(model)  # as the sft stage does when packing; padded batches unaffected
        samples = sft_samples(tokenizer, train, "tool", sft["max_length"])
        ways = {"padded": (False, False), "length-grouped": (False, True), "packed": (True, False)}
        runs = {
            name: MicroBatches(
                samples,
                sft["batch_size"],
                tokenizer.pad_token_id,
                0,
                packing,
                sft["block_size"],
                group_by_length,
            )
            for name, (packing, group_by_length) in ways.items()
        }
        rates = tokens_per_second(model, runs, args.steps)
    packed, grouped = rates["packed"] / rates["padded"], rates["length-grouped"] / rates["padded"]
    append(
        "SFT throughput: packing and length-grouped padding vs padding (arith, tool solutions)",
        [
            ("real tokens/s, padded batches", f"{rates['padded']:.0f}"),
            ("real tokens/s, length-grouped padded batches", f"{rates['length-grouped']:.0f}"),
            ("real tokens/s, packed blocks", f"{rates['packed']:.0f}"),
            ("packing / padding", f"{packed:.2f}x"),
            ("length-grouped / padding", f"{grouped:.2f}x"),
            ("micro-batch", f"{sft['batch_size']} sequences or blocks of {sft['block_size']}"),
            ("steps timed each, interleaved", str(args.steps)),
        ],
        f"packing is {packed:.2f}x padding (target >= 1.5x); length-grouped padding {grouped:.2f}x",
    )


if __name__ == "__main__":
    main()
