"""Pilot of the GRPO family on the learning tests' frontier (issue 48): tests/learning_start.py's
seed-0 SFT start, then GRPO variants with online DPO's learning-test budget (32 steps of 16
prompts x 4 samples at T 0.7, async, one step off-policy) on the frontier's online pool, each
scored by greedy pass@1 on a selection split that no arm trains on and that is not a test
split: the frontier's reward_models pool (100 prompts; only `make test-verification` uses it).
Tuning reads these numbers, never the test splits (docs/experiment-design.md, "GRPO on the
frontier: the pilot").

    python experiments/grpo_pilot.py OUT [--arms grpo,dr-grpo,dapo] [--lr 1e-5] [--seed 0]
        [--samples 4] [--temperature 0.7] [--sampling-batches 3]

OUT keeps the start (reused when present) and one folder per arm; prints one line per arm
(pass@1, paired difference to the start with its bootstrap CI and exact McNemar p, the run's
last-step signals) and writes them to OUT/pilot-lr{LR}-k{K}-t{T}.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from learning_start import FRONTIER, train_start  # noqa: E402

from reasonrl.config import validate_config  # noqa: E402
from reasonrl.stages.data import make_pool  # noqa: E402
from reasonrl.stages.evaluate import evaluate  # noqa: E402
from reasonrl.stats.comparisons import compare, greedy_correct  # noqa: E402

# The arms: a variant's grpo keys, as the papers set them (the KL coefficient, the std, the
# aggregation, clip-higher); the learning rate and the budget are the run's.
ARMS = {
    "grpo": {"beta": 0.04},  # DeepSeekMath
    "dr-grpo": {"scale_rewards": "none", "aggregation": "dr_grpo"},
    "dapo": {"aggregation": "dapo", "clip_high": 0.28, "dynamic_sampling": True},
}
BUDGET = {"steps": 32, "prompts_per_step": 16, "samples_per_prompt": 4, "temperature": 0.7}


def start(out: Path, seed: int) -> dict:
    """The SFT start (trained once, then read back) with its config."""
    done = out / "start.json"
    if done.exists():
        return {**json.loads(done.read_text()), "root": out / "start"}
    run = train_start(seed, out / "start", ())
    done.write_text(json.dumps({"config": run["config"]}))
    return run


def selection(config: dict, root: Path, policy: str) -> dict[str, float]:
    """Greedy correctness of `policy` on the frontier's reward_models pool."""
    pool = root / "pool-selection" / "problems.jsonl"
    if not pool.exists():
        make_pool(config, FRONTIER, "reward_models", str(pool.parent))
    out = root / f"selection-{policy}"
    evaluate(config, str(root / policy), "tool", FRONTIER, str(pool), policy, str(out))
    return greedy_correct(str(out / "trajectories.jsonl"))


def grpo_run(start_run: dict, arm: str, args: argparse.Namespace) -> dict:
    from reasonrl.stages.online_dpo import online_dpo as run_online

    root = start_run["root"]
    pool = root / "pool-online"
    if not pool.exists():
        make_pool(start_run["config"], FRONTIER, "online_dpo", str(pool))
    grpo = {**ARMS[arm], "max_sampling_batches": args.sampling_batches}
    variant = {"name": arm, "mode": "async", "loss": "grpo", "off_policy": 1, "grpo": grpo}
    sampling = {"samples_per_prompt": args.samples, "temperature": args.temperature}
    online = {**BUDGET, **sampling, "lr": args.lr, "task": FRONTIER, "variants": [variant]}
    config = validate_config({**start_run["config"], "online_dpo": online})
    name = f"grpo-{arm}-lr{args.lr:g}-k{args.samples}-t{args.temperature:g}"
    metrics = run_online(
        config, arm, str(root / "sft"), str(pool / "problems.jsonl"), "tool", 2, str(root / name)
    )
    return {"name": name, "config": config, "history": metrics["history"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--arms", default="grpo,dr-grpo,dapo")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=BUDGET["samples_per_prompt"])
    parser.add_argument("--temperature", type=float, default=BUDGET["temperature"])
    parser.add_argument("--sampling-batches", type=int, default=3)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start_run = start(args.out, args.seed)
    config, root = start_run["config"], start_run["root"]
    base = selection(config, root, "sft")
    report = {
        "start": sum(base.values()) / len(base),
        "settings": vars(args) | {"out": str(args.out)},
        "arms": {},
    }
    print(f"start: selection pass@1 {report['start']:.3f} ({len(base)} prompts)", flush=True)
    for arm in args.arms.split(","):
        run = grpo_run(start_run, arm, args)
        scores = selection(run["config"], root, run["name"])
        row = compare(f"{arm}_vs_sft", "greedy_pass@1", arm, "sft", scores, base)
        last = run["history"][-1]
        signals = {k: last.get(k) for k in ("reward", "kl_k3", "entropy", "clip_high_fraction")}
        signals["tied_groups"] = sum(h["tied_groups"] for h in run["history"]) / len(run["history"])
        report["arms"][arm] = {"comparison": row, "last_step": signals}
        print(
            f"{arm}: {row['value_a']:.3f} vs {row['value_b']:.3f}, diff {row['diff']:+.3f} "
            f"[{row['ci_low']:+.3f}, {row['ci_high']:+.3f}], p {row['p']:.3g}; {signals}",
            flush=True,
        )
    name = f"pilot-lr{args.lr:g}-k{args.samples}-t{args.temperature:g}.json"
    (args.out / name).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
