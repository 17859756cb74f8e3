"""Do config/tables.yaml's rollout caps (4 turns, 256 tokens a turn, 1,024 in all: set for
pycode) change what GRPO trains on in the frontier band, against the default's (2, 128, 256)?
(docs/experiment-design.md, "Rollout caps on the frontier: the probe".)

Samples a policy's tool trajectories at GRPO's K and temperature under the larger caps, on a
pool no test split overlaps (the frontier's online_dpo pool, GRPO's own training prompts),
and counts the samples the default's caps would have cut: more than 2 model turns, a turn
over 128 tokens, more than 256 tokens in all, and of those, the ones the verifier rewarded
(which the smaller caps would turn into failures). Reads no test split.

    python experiments/rollout_caps_probe.py MODEL PROBLEMS [--prompts 100] [--samples 8]
        [--temperature 1.0] [--seed 0] [--out FILE.json]

MODEL: a policy folder (e.g. a tables run's results/models/sft-tool); PROBLEMS: its
results/data/arith3/pool-online_dpo/problems.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from reasonrl.generation import EngineSettings, SamplingParams, make_engine
from reasonrl.io import read_jsonl
from reasonrl.rollout import RolloutSettings, run_rollouts
from reasonrl.sandbox import Sandbox

TABLES_CAPS = RolloutSettings(max_turns=4, max_turn_tokens=256, max_total_tokens=1024)
DEFAULT_CAPS = RolloutSettings(max_turns=2, max_turn_tokens=128, max_total_tokens=256)
SANDBOX = {"allow_unsandboxed": False, "cpu_seconds": 5, "wall_seconds": 10, "memory_mb": 1024}


def cut_by_default_caps(row: dict) -> bool:
    """Whether the default's caps would have stopped this trajectory before its end."""
    turns = row["turn_token_ids"]
    return (
        len(turns) > DEFAULT_CAPS.max_turns
        or any(len(ids) > DEFAULT_CAPS.max_turn_tokens for ids in turns)
        or row["num_tokens"] > DEFAULT_CAPS.max_total_tokens
    )


def probe(rows: list[dict]) -> dict:
    cut = [row for row in rows if cut_by_default_caps(row)]
    turns = [len(row["turn_token_ids"]) for row in rows]
    return {
        "samples": len(rows),
        "mean_tokens": sum(row["num_tokens"] for row in rows) / len(rows),
        "max_tokens": max(row["num_tokens"] for row in rows),
        "more_than_2_turns": sum(t > 2 for t in turns),
        "cut_by_default_caps": len(cut),
        "cut_and_correct": sum(bool(row["correct"]) for row in cut),
        "correct": sum(bool(row["correct"]) for row in rows),
        "finish_reasons": {
            reason: sum(row["finish_reason"] == reason for row in rows)
            for reason in sorted({row["finish_reason"] for row in rows})
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("problems")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    problems = read_jsonl(args.problems, schema="problem")[: args.prompts]
    engine = make_engine(EngineSettings(), args.model, "float32")
    params = SamplingParams(temperature=args.temperature, max_new_tokens=512, seed=args.seed)
    rows = run_rollouts(
        engine, problems, "tool", args.samples, params, TABLES_CAPS, Sandbox.from_config(SANDBOX)
    )
    result = {"model": args.model, "temperature": args.temperature, **probe(rows)}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
