"""PRM scoring in one forward pass vs one pass per step (same 5-step solutions), and
Math-Shepherd annotation rollouts per second, side by side in one run.

python bench/prm_scoring.py [--solutions 64] [--config config/config.yaml] [--model FOLDER]

Without --model a tiny policy of the config's size is built (random weights: the timings
do not depend on what the weights say; the annotation rollouts then run to their token caps).
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
from record import append

from reasonrl.config import load_config
from reasonrl.generation import SamplingParams
from reasonrl.generation.hf import HFEngine
from reasonrl.io import write_jsonl
from reasonrl.models import build_tiny_policy, load_policy
from reasonrl.rewards.annotation import annotate
from reasonrl.rewards.scoring import score_steps, score_steps_one_by_one
from reasonrl.rollout import RolloutSettings
from reasonrl.sandbox import Sandbox
from reasonrl.stages.models import corpus_texts
from reasonrl.tasks import build_problems, prompt_messages, solution_messages

STEP_PATTERN = r"(?<=\.)\s+"


def cot_steps(problem: dict) -> list[str]:
    text = solution_messages(problem, "cot")[0]["content"]
    return [s for s in text.split(". ") if s][:5]


def time_scoring(model, tokenizer, problems: list[dict]) -> tuple[float, float, int]:
    """Seconds of one-pass and of per-step scoring, solution by solution in turn (so both see
    the same load on a shared machine), after one warm-up of each outside the clock."""
    items = [(p["question"], cot_steps(p)) for p in problems]
    labels = ["+", "-"]
    one_pass = per_step = 0.0
    for i, (question, steps) in enumerate([items[0], *items]):
        started = time.perf_counter()
        score_steps(model, tokenizer, [(question, steps)], labels, batch_size=1)
        middle = time.perf_counter()
        score_steps_one_by_one(model, tokenizer, question, steps, labels)
        if i > 0:
            one_pass += middle - started
            per_step += time.perf_counter() - middle
    return one_pass, per_step, sum(len(s) for _, s in items)


def time_annotation(model, tokenizer, problems: list[dict], completions: int, cap: int):
    engine = HFEngine(model, tokenizer, batch_size=64)
    solutions = [
        {
            "problem_id": p["id"],
            "task": p["task"],
            "sample": 0,
            "messages": prompt_messages(p, "cot") + solution_messages(p, "cot"),
            "correct": True,
        }
        for p in problems
    ]
    rows, stats = annotate(
        {p["id"]: p for p in problems},
        solutions,
        engine,
        Sandbox.from_config({}),
        RolloutSettings(1, cap, cap),
        completions,
        SamplingParams(temperature=1.0, seed=0),
        "regex",
        STEP_PATTERN,
    )
    return stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--model", help="policy folder (default: a fresh tiny policy)")
    parser.add_argument("--solutions", type=int, default=64)
    parser.add_argument("--annotate", type=int, default=8, help="solutions to annotate")
    parser.add_argument("--completions", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    config = load_config(args.config)
    settings = {**config["tasks"]["arith"], "min_ops": 4, "max_ops": 4}
    train, _ = build_problems("arith", settings, config["seed"])
    problems = train[: args.solutions]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            write_jsonl(f"{tmp}/train.jsonl", train, schema="problem")
            folder = f"{tmp}/m"
            build_tiny_policy(
                corpus_texts([f"{tmp}/train.jsonl"]), config["policy"]["tiny"], 0, folder
            )
        model, tokenizer = load_policy(folder)
        model.eval()
        torch.set_grad_enabled(False)
        one_pass, per_step, steps = time_scoring(model, tokenizer, problems)
        stats = time_annotation(
            model, tokenizer, problems[: args.annotate], args.completions, args.max_tokens
        )
    ratio = per_step / one_pass
    append(
        "PRM step scoring: one forward pass vs one pass per step; annotation rollouts/s",
        [
            ("solutions (5 steps each, arith CoT)", f"{len(problems)} ({steps} steps)"),
            ("one pass per solution, s", f"{one_pass:.2f}"),
            ("one pass per step, s", f"{per_step:.2f}"),
            ("one-pass speed-up", f"{ratio:.2f}x"),
            ("annotation: solutions x K", f"{stats.solutions} x {args.completions}"),
            ("annotation rollouts (batched over all prefixes)", str(stats.rollouts)),
            ("annotation rollouts/s", f"{stats.rollouts_per_second:.2f}"),
            ("rollout token cap", str(args.max_tokens)),
            ("policy", args.model or "tiny, random weights, config size"),
        ],
        f"one-pass scoring is {ratio:.2f}x per-step scoring (goal >= 3x on 5-step solutions); "
        f"{stats.rollouts_per_second:.1f} annotation rollouts/s",
    )


if __name__ == "__main__":
    main()
