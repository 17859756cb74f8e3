"""Do config/tables.yaml's rollout caps (4 turns, 256 tokens a turn, 1,024 in all: set for
pycode) change what GRPO trains on in the frontier band, against the default's (2, 128, 256)?
(docs/experiment-design.md, "Rollout caps on the frontier: the probe".)

Samples a policy's tool trajectories at GRPO's K and temperature under the larger caps, on a
pool no test split overlaps (the frontier's online_dpo pool, GRPO's own training prompts),
and counts the trajectories the default's caps would have cut, and how (a third model turn,
or a turn over 128 tokens), how many of those the verifier rewarded, and how many would get
another GRPO reward (the verifier's score minus online_dpo.eos_penalty where a token cap cut
the sample). Reads no test split.

    python experiments/rollout_caps_probe.py MODEL PROBLEMS [--prompts 100] [--samples 8]
        [--temperature 1.0] [--seed 0] [--out FILE.json]

MODEL: a policy folder (e.g. a tables run's results/models/sft-tool); PROBLEMS: its
results/data/arith3/pool-online_dpo/problems.jsonl.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from reasonrl.config import validate_config
from reasonrl.generation import EngineSettings, SamplingParams, make_engine
from reasonrl.io import read_jsonl
from reasonrl.rollout import RolloutSettings, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.training.online_dpo import sample_reward

CONFIG = Path(__file__).resolve().parents[1] / "config/config.yaml"

TABLES_CAPS = RolloutSettings(max_turns=4, max_turn_tokens=256, max_total_tokens=1024)
DEFAULT_CAPS = RolloutSettings(max_turns=2, max_turn_tokens=128, max_total_tokens=256)


def default_caps_ending(row: dict) -> str | None:
    """How the default's caps would have ended this trajectory before its own end (a
    finish_reason of the rollout loop), or None where they would not have cut it. Two turns of
    at most 128 tokens cannot pass 256 in all, so the total cap never comes first."""
    for ids in row["turn_token_ids"][: DEFAULT_CAPS.max_turns]:
        if len(ids) > DEFAULT_CAPS.max_turn_tokens:
            return "turn_token_cap"
    return "max_turns" if row["num_turns"] > DEFAULT_CAPS.max_turns else None


def reward_as_sampled(row: dict, eos_penalty: float) -> float:
    """GRPO's reward of the trajectory as it ended: the verifier's score, less the eos penalty
    where a token cap cut it."""
    return sample_reward(float(row["correct"]), row["finish_reason"], eos_penalty)


def reward_under_default_caps(row: dict, ending: str | None, eos_penalty: float) -> float:
    """GRPO's reward of the trajectory had the default's caps ended it at `ending`
    (default_caps_ending's): a cut one never reaches its answer (score 0), and a token cap
    costs the eos penalty."""
    if ending is None:
        return reward_as_sampled(row, eos_penalty)
    return sample_reward(0.0, ending, eos_penalty)


def caps_summary(rows: list[dict], eos_penalty: float) -> dict:
    """What the default's caps would have changed in these trajectories: how many they cut,
    and why; how many of those were correct; whose reward differs."""
    endings = [default_caps_ending(row) for row in rows]
    return {
        "samples": len(rows),
        "mean_tokens": sum(row["num_tokens"] for row in rows) / len(rows),
        "max_tokens": max(row["num_tokens"] for row in rows),
        "longest_turn": max(len(ids) for row in rows for ids in row["turn_token_ids"]),
        "cut_by_default_caps": {
            reason: endings.count(reason) for reason in ("max_turns", "turn_token_cap")
        },
        "cut_and_correct": sum(bool(r["correct"]) for r, e in zip(rows, endings, strict=True) if e),
        "reward_differs": sum(
            reward_as_sampled(row, eos_penalty) != reward_under_default_caps(row, e, eos_penalty)
            for row, e in zip(rows, endings, strict=True)
        ),
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
    config = validate_config(yaml.safe_load(CONFIG.read_text()), str(CONFIG))
    engine = make_engine(EngineSettings(), args.model, "float32")
    params = SamplingParams(temperature=args.temperature, seed=args.seed)
    sandbox = Sandbox.from_config(config["sandbox"])
    rows = run_rollouts(engine, problems, "tool", args.samples, params, TABLES_CAPS, sandbox)
    summary = caps_summary(rows, config["online_dpo"]["eos_penalty"])
    result = {"model": args.model, "temperature": args.temperature, **summary}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
