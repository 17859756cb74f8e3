"""grpo_vs_sft over GRPO seeds (issue 48; docs/experiment-design.md, "grpo_vs_sft over three
GRPO seeds: the pre-registration"): config/tables.yaml's async GRPO variant, as
`make test-grpo` runs it (32 steps of 16 prompts x 8 at T 1.0, lr 1e-4, beta 0.04, one step
off-policy, on the frontier's online pool), from tests/learning_start.py's seed-0 SFT start,
once per run seed (the seed of its prompt order and its sampling; the start stays the same),
each compared with the start on the frontier's 400 test problems, Holm over the seeds.

    python experiments/grpo_seeds.py OUT [--seeds 0,1,2] [--start DIR]

OUT keeps the start (trained once, or DIR: a start folder `make test-grpo` left, holding sft/,
data/ and pool-online/) and one run folder per seed; a seed whose evaluation is already there
is not run again (seed 0's folder is `online-grpo`, the test's own). Prints the Holm family
and writes it to OUT/grpo-seeds.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from learning_start import (  # noqa: E402
    FAMILIES,
    FRONTIER,
    METHOD_SEED,
    greedy_eval,
    holm_family,
    learning_config,
    train_start,
)
from test_preference_learning import online_training  # noqa: E402

from reasonrl.stages.data import make_pool  # noqa: E402
from reasonrl.stats.comparisons import compare, greedy_correct  # noqa: E402


def start_folder(out: Path, given: Path | None) -> dict:
    """The seed-0 start in OUT/start: copied from `given`, else trained (about 13 minutes)."""
    root = out / "start"
    config = learning_config(METHOD_SEED)
    if not root.exists():
        if given is not None:
            shutil.copytree(given, root)
        else:
            train_start(METHOD_SEED, root, ())
    if not (root / "pool-online/problems.jsonl").exists():
        make_pool(config, FRONTIER, "online_dpo", str(root / "pool-online"))
    return {"root": root, "config": config}


def run_name(seed: int) -> str:
    """The run folder of `seed` (seed 0's is the learning test's own)."""
    return "online-grpo" if seed == METHOD_SEED else f"online-grpo-seed{seed}"


def frontier_scores(start: dict, seed: int) -> dict[str, float]:
    """The GRPO run of `seed`'s greedy frontier scores, running it unless its evaluation is
    already in the start's folder."""
    name = run_name(seed)
    done = start["root"] / f"eval-{name}-{FRONTIER}" / "trajectories.jsonl"
    if not done.exists():
        seeded = {**start, "config": {**start["config"], "seed": seed}}
        online_training(seeded, "grpo", (FRONTIER,), name)
    return greedy_correct(str(done))


def sft_scores(start: dict) -> dict[str, float]:
    """The start's greedy frontier scores (its evaluation read back where it is there)."""
    done = start["root"] / f"eval-sft-{FRONTIER}" / "trajectories.jsonl"
    if done.exists():
        return greedy_correct(str(done))
    return greedy_eval(start["config"], start["root"], "sft", FRONTIER)["scores"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--start", type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    start = start_folder(args.out, args.start)
    sft = sft_scores(start)
    seeds = [int(seed) for seed in args.seeds.split(",")]
    rows = [
        compare(f"grpo_seed{seed}_vs_sft", "greedy_pass@1", run_name(seed), "sft",
                frontier_scores(start, seed), sft)
        for seed in seeds
    ]  # fmt: skip
    family = holm_family("grpo_seeds", rows)
    print("\n".join(FAMILIES["grpo_seeds"]))
    (args.out / "grpo-seeds.json").write_text(json.dumps(family, indent=1) + "\n")


if __name__ == "__main__":
    main()
