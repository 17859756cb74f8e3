"""Online DPO wall-clock: asynchronous vs synchronous generation/learning, same steps, one run.

python bench/online_async.py [--config config/config.yaml] [--steps 8] [--threads 2]

The policy is the config's tiny Llama, untrained (the timing does not depend on what it
learned: every sample runs to the turn's token cap, so each round costs the same). The
generator and the learner get half the threads each; sync: they take turns; async: they
overlap. The table splits the time into generation, training and the waits.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from record import append

from reasonrl.config import load_config
from reasonrl.io import write_jsonl
from reasonrl.models import build_tiny_policy
from reasonrl.stages.models import corpus_texts
from reasonrl.stages.online_dpo import online_dpo as run_online
from reasonrl.tasks import build_problems


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="cores: half per process")
    parser.add_argument("--turn-tokens", type=int, default=48)
    args = parser.parse_args()
    config = load_config(args.config)
    config["rollout"] = {
        "max_turns": 1,
        "max_turn_tokens": args.turn_tokens,
        "max_total_tokens": args.turn_tokens,
    }
    config["online_dpo"].update(
        steps=args.steps,
        checkpoint_every=args.steps,
        max_length=1024,
        variants=[
            {"name": "sync", "mode": "sync", "loss": "dpo", "off_policy": 1, "label": ""},
            {"name": "async", "mode": "async", "loss": "dpo", "off_policy": 1, "label": ""},
        ],
    )
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = build_problems("arith", config["tasks"]["arith"], config["seed"])
        write_jsonl(f"{tmp}/train.jsonl", train, schema="problem")
        build_tiny_policy(
            corpus_texts([f"{tmp}/train.jsonl"]), config["policy"]["tiny"], 0, f"{tmp}/m"
        )
        runs = {
            name: run_online(
                config,
                name,
                f"{tmp}/m",
                f"{tmp}/train.jsonl",
                "tool",
                args.threads,
                str(Path(tmp) / f"online-{name}"),
            )
            for name in ("sync", "async")
        }
    sync, run = runs["sync"], runs["async"]
    achieved = sync["wall_seconds"] / run["wall_seconds"]
    section = config["online_dpo"]
    rows = [
        ("steps (same in both)", str(args.steps)),
        (
            "per step",
            f"{section['prompts_per_step']} prompts x K={section['samples_per_prompt']}, "
            f"{args.turn_tokens} new tokens per sample",
        ),
    ]
    for name, m in runs.items():
        rows += [
            (f"{name}: wall-clock s", f"{m['wall_seconds']:.1f}"),
            (f"{name}: generation s", f"{m['gen_seconds']:.1f}"),
            (f"{name}: training s (incl. reference log-probs)", f"{m['train_seconds']:.1f}"),
            (f"{name}: learner waiting for data s", f"{m['data_wait_seconds']:.1f}"),
            (
                f"{name}: generator waiting for weights s",
                f"{m['generator_weight_wait_seconds']:.1f}",
            ),
            (
                f"{name}: weight sync s (push + load)",
                f"{m['weight_push_seconds'] + m['weight_load_seconds']:.2f}",
            ),
        ]
    rows += [
        ("ideal speedup (gen+train)/max(gen,train), sync timings", f"{sync['ideal_speedup']:.2f}x"),
        ("achieved speedup sync / async wall-clock", f"{achieved:.2f}x"),
    ]
    append(
        "Online DPO: asynchronous vs synchronous wall-clock (arith, tiny policy)",
        rows,
        f"async is {achieved:.2f}x sync (goal >= 1.6x; ideal from sync timings "
        f"{sync['ideal_speedup']:.2f}x)",
    )


if __name__ == "__main__":
    main()
