"""Run under torchrun by tests/test_training.py: the shared training loop in two CPU
processes (gloo) that share the checkpoint and output folders, as under accelerate launch.

    ACCELERATE_USE_CPU=true torchrun --nproc_per_node 2 tests/data_parallel_train.py \
        POLICY OUT [CRASH_AT]

CRASH_AT: a step at which every process exits (a preempted job).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import PartialState

from reasonrl.chat import TokenizedChat
from reasonrl.manifest import Provenance
from reasonrl.models import load_policy
from reasonrl.training.data import MicroBatches
from reasonrl.training.lm_loss import masked_lm_loss
from reasonrl.training.loop import CheckpointStore, LoopSettings, save_trained_model, train


def samples(n: int) -> list[TokenizedChat]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        length = int(torch.randint(5, 30, (1,), generator=g))
        ids = torch.randint(10, 255, (length,), generator=g).tolist()
        out.append(TokenizedChat(ids, [0] * (length // 2) + [1] * (length - length // 2)))
    return out


def main(policy: str, out: str, crash_at: int | None) -> None:
    model, tokenizer = load_policy(policy)
    batches = MicroBatches(samples(40), 4, 0, seed=1, packing=False, block_size=64)
    processes = int(os.environ["WORLD_SIZE"])  # PartialState() here would fix it before train()

    def micro_batch(i: int):
        if crash_at is not None and i // processes + 1 == crash_at:
            raise SystemExit(3)
        return batches(i)

    out_dir = Path(out)
    checkpoints = CheckpointStore(out_dir.parent / f".{out_dir.name}.ckpt", "inputs")
    settings = LoopSettings(max_steps=6, lr=1e-2, grad_accum=1, checkpoint_every=2, seed=5)
    result = train(model, micro_batch, masked_lm_loss, settings, checkpoints)
    history = result["history"]
    metrics = {"history": history, "final_loss": history[-1]["loss"]}
    metrics["resumed_from"] = result["resumed_from"]
    metrics["processes"] = PartialState().num_processes  # as train()'s Accelerator saw it
    provenance = Provenance("data-parallel-test", {}, [], 0)
    save_trained_model(
        out_dir, result["model"], tokenizer, metrics, provenance, checkpoints,
        state_dict=result["state_dict"],
    )  # fmt: skip
    print("RESULT " + json.dumps({"rank": PartialState().process_index}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else None)
