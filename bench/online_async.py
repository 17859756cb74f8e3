"""Online DPO wall-clock: asynchronous vs synchronous generation/learning, same work, one run.

python bench/online_async.py [--config config/config.yaml] [--steps 6] [--threads 2]
                             [--turn-tokens 32] [--repeats 1] [--loss dpo]

`--loss grpo` times the GRPO family's learner the same way (online_dpo's `loss: grpo` with its
default settings: GRPO's std-scaled group advantages, the per-sample mean, k3 KL at 0.04).

The policy is the config's tiny Llama, untrained (the timing does not depend on what it
learned: nearly every sample runs to the turn's token cap, so each round costs the same). The
generator and the learner get half the threads each in both modes; sync: they take turns;
async: they overlap.

Both modes train on the same prompts (checked: each step's problem ids), with the same number
of updates and samples (checked) and the same sampling settings and seeds; their generated
tokens are reported (equal in expectation: the policies differ by one update). The runs are
interleaved sync, async, async, sync (per repeat) so a change in the machine's load hits both
modes alike; each mode's numbers are the mean over its runs.

The ideal speedup (gen + train) / max(gen, train) comes from the sync runs' own phase times:
overlapping cannot do better. A measured speedup above it means the two modes did not do the
same work (or the machine's load changed under one of them): the bench says so and exits 1.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

from record import append

from reasonrl.config import load_config, validate_config
from reasonrl.io import write_jsonl
from reasonrl.models import build_tiny_policy
from reasonrl.stages.models import corpus_texts
from reasonrl.stages.online_dpo import online_dpo as run_online
from reasonrl.tasks import build_problems

MODES = ("sync", "async")


def bench_config(config_path: str, steps: int, turn_tokens: int, loss: str) -> dict:
    config = load_config(config_path)
    config["rollout"] = {
        "max_turns": 1,
        "max_turn_tokens": turn_tokens,
        "max_total_tokens": turn_tokens,
    }
    config["online_dpo"].update(
        steps=steps,
        checkpoint_every=steps,
        max_length=1024,
        variants=[
            {"name": mode, "mode": mode, "loss": loss, "off_policy": 1, "label": ""}
            for mode in MODES
        ],
    )
    return validate_config(config)  # the variants' defaults (their grpo keys)


def interleaved(repeats: int) -> list[str]:
    """sync, async, async, sync per repeat: a linear drift in load costs both modes alike."""
    return [*MODES, *reversed(MODES)] * repeats


def run_all(config: dict, order: list[str], threads: int) -> list[tuple[str, dict]]:
    with tempfile.TemporaryDirectory() as tmp:
        train, _ = build_problems("arith", config["tasks"]["arith"], config["seed"])
        write_jsonl(f"{tmp}/train.jsonl", train, schema="problem")
        texts = corpus_texts([f"{tmp}/train.jsonl"])
        build_tiny_policy(texts, config["policy"]["tiny"], 0, f"{tmp}/m")
        policy, problems = f"{tmp}/m", f"{tmp}/train.jsonl"
        return [
            (mode, run_online(config, mode, policy, problems, "tool", threads, f"{tmp}/{i}"))
            for i, mode in enumerate(order)
        ]


def same_work(runs: list[tuple[str, dict]]) -> None:
    """Every run trained on the same prompts per step, with the same updates and samples."""
    first = runs[0][1]
    for mode, m in runs[1:]:
        for key in ("prompts", "steps", "samples"):
            if m[key] != first[key]:
                sys.exit(
                    f"online_async: {mode} differs from {runs[0][0]} in '{key}': not the same work"
                )


def mean_over(runs: list[tuple[str, dict]], mode: str, key: str) -> float:
    return statistics.mean(m[key] for name, m in runs if name == mode)


def history_mean(runs: list[tuple[str, dict]], mode: str, key: str) -> float | None:
    """Mean of a per-step signal over the mode's runs (steps without it skipped)."""
    values = [h[key] for name, m in runs if name == mode for h in m["history"] if key in h]
    return statistics.mean(values) if values else None


def shown(value: float | None, digits: int = 3) -> str:
    return "n/a (no step had a pair)" if value is None else f"{value:.{digits}f}"


# The learner's own per-step signals, by loss.
SIGNALS = {
    "dpo": (("DPO reward margin (steps with a pair)", "reward_margin", 4),
            ("DPO reward accuracy (steps with a pair)", "reward_accuracy", 3)),
    "grpo": (("groups with tied rewards per step", "tied_groups", 2),
             ("clip fraction, high side", "clip_high_fraction", 4),
             ("k3 KL to the reference", "kl_k3", 5),
             ("entropy", "entropy", 3)),
}  # fmt: skip


def mode_rows(runs: list[tuple[str, dict]], mode: str, loss: str) -> list[tuple[str, str]]:
    def mean(key: str) -> float:
        return mean_over(runs, mode, key)

    def per_step(key: str, digits: int = 3) -> str:
        return shown(history_mean(runs, mode, key), digits)

    walls = ", ".join(f"{m['wall_seconds']:.1f}" for name, m in runs if name == mode)
    threads = f"{mean('threads_per_process'):.0f}"
    together = "taking turns" if mode == "sync" else "at the same time"
    sync_seconds = mean("weight_push_seconds") + mean("weight_load_seconds")
    measures = [
        ("wall-clock s (mean; each run)", f"{mean('wall_seconds'):.1f} ({walls})"),
        ("generation s", f"{mean('gen_seconds'):.1f}"),
        ("training s (incl. reference log-probs)", f"{mean('train_seconds'):.1f}"),
        ("learner waiting for data s", f"{mean('data_wait_seconds'):.1f}"),
        ("generator waiting for weights s", f"{mean('generator_weight_wait_seconds'):.1f}"),
        ("weight sync s (push + load)", f"{sync_seconds:.2f}"),
        ("torch threads generator / learner", f"{threads} / {threads}, {together}"),
        ("generated tokens per run", f"{mean('gen_tokens'):.0f}"),
        ("mean reward per step", per_step("reward")),
        ("mean KL to SFT per step", per_step("kl", 4)),
        *[(name, per_step(key, digits)) for name, key, digits in SIGNALS[loss]],
    ]
    return [(f"{mode}: {name}", value) for name, value in measures]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2, help="cores: half per process")
    parser.add_argument("--turn-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="sync, async, async, sync each")
    parser.add_argument("--loss", default="dpo", choices=tuple(SIGNALS))
    args = parser.parse_args()
    config = bench_config(args.config, args.steps, args.turn_tokens, args.loss)
    runs = run_all(config, interleaved(args.repeats), args.threads)
    same_work(runs)
    sync_gen = mean_over(runs, "sync", "gen_seconds")
    sync_train = mean_over(runs, "sync", "train_seconds")
    ideal = (sync_gen + sync_train) / max(sync_gen, sync_train)
    achieved = mean_over(runs, "sync", "wall_seconds") / mean_over(runs, "async", "wall_seconds")
    tokens = {mode: mean_over(runs, mode, "gen_tokens") for mode in MODES}
    section, first = config["online_dpo"], runs[0][1]
    rows = [
        ("order of the runs", ", ".join(mode for mode, _ in runs)),
        ("updates per run (same in both)", str(first["steps"])),
        ("samples per run (same in both)", str(first["samples"])),
        ("prompts per step (same ids in every run)", str(section["prompts_per_step"])),
        (
            "per step",
            f"{section['prompts_per_step']} prompts x K={section['samples_per_prompt']}, "
            f"at most {args.turn_tokens} new tokens per sample",
        ),
        *mode_rows(runs, "sync", args.loss),
        *mode_rows(runs, "async", args.loss),
        ("generated tokens async / sync", f"{tokens['async'] / tokens['sync']:.3f}"),
        ("ideal speedup (gen+train)/max(gen,train), sync timings", f"{ideal:.2f}x"),
        ("achieved speedup sync / async wall-clock (means)", f"{achieved:.2f}x"),
    ]
    plausible = achieved <= ideal
    invalid = "NO: async beat its ideal, so the work or the machine's load differed: not valid"
    rows.append(("check: achieved <= ideal", "yes" if plausible else invalid))
    learner = "Online DPO" if args.loss == "dpo" else f"The online learner, loss {args.loss}"
    goal = "goal >= 1.6x; " if args.loss == "dpo" else ""
    append(
        f"{learner}: asynchronous vs synchronous wall-clock (arith, tiny policy)",
        rows,
        f"async is {achieved:.2f}x sync ({goal}ideal from sync timings {ideal:.2f}x)",
    )
    if not plausible:
        sys.exit(f"online_async: achieved {achieved:.2f}x exceeds the ideal {ideal:.2f}x")


if __name__ == "__main__":
    main()
