"""Stages of workflow/rules/evaluate.smk: a policy's greedy pass@1, pass@k and maj@k on a
task, and the sandboxed verdicts of code completions (`code-eval`, the import path for
samples made elsewhere)."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from reasonrl.code_eval import evaluate_samples
from reasonrl.generation import SamplingParams, make_engine
from reasonrl.io import read_jsonl, write_csv, write_json, write_jsonl
from reasonrl.manifest import Provenance
from reasonrl.metrics import metrics_rows, summarize
from reasonrl.rollout import RolloutLimits, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.shards import ShardStore, fingerprint, shard_seed
from reasonrl.tasks.arith import copy_summary
from reasonrl.tasks.grading import normalize_answer

log = logging.getLogger(__name__)


def evaluate(
    config: dict, model: str, style: str, task: str, problems_path: str, policy: str, out_dir: str
) -> dict:
    """Trajectories and metrics of `policy` (the model at `model`) on `task`'s problems."""
    provenance = Provenance("evaluate", config, [model, problems_path], config["seed"])
    problems = read_jsonl(problems_path, schema="problem")
    out = Path(out_dir)
    shards = ShardStore(
        out, fingerprint("evaluate", config, provenance.hashes, style, task, policy)
    )
    trajectories, metrics = evaluate_policy(config, model, problems, style, policy, shards)
    metrics.update(policy=policy, task=task, style=style)
    write_jsonl(out / "trajectories.jsonl", trajectories, schema="trajectory")
    write_json(out / "metrics.json", metrics)
    write_csv(out / "metrics.csv", metrics_rows(metrics))
    provenance.write(out, {"greedy_pass@1": metrics["greedy_pass@1"]})
    shards.clear()
    log.info("%s on %s: greedy pass@1 %.3f", policy, task, metrics["greedy_pass@1"])
    return metrics


def evaluate_policy(
    config: dict, model: str, problems: list[dict], style: str, policy: str, shards: ShardStore
) -> tuple[list[dict], dict]:
    """Greedy trajectories for pass@1 and sampled ones for pass@k / maj@k, and their metrics;
    made shard by shard (`shards` keeps the finished ones)."""
    section = config["evaluation"]
    if section["max_problems"]:
        problems = problems[: section["max_problems"]]
    generation = config["generation"]
    engine = cache(
        lambda: make_engine(generation["engine"], model, generation, config["policy"]["dtype"])
    )
    sandbox = Sandbox.from_config(config["sandbox"])
    limits = RolloutLimits.from_config(config["rollout"])
    seed = config["seed"]

    def shard(part: list[dict], index: int) -> dict[str, list]:
        greedy_params = SamplingParams(seed=shard_seed(seed, index))
        greedy = run_rollouts(engine(), part, style, 1, greedy_params, limits, sandbox, policy)
        sampled = []
        if section["n_samples"]:
            params = SamplingParams(
                temperature=section["temperature"],
                top_p=section["top_p"],
                seed=shard_seed(seed + 1, index),
            )
            sampled = run_rollouts(
                engine(), part, style, section["n_samples"], params, limits, sandbox, policy
            )
        return {"greedy": greedy, "sampled": sampled}

    made = shards.map("problems", problems, generation["shard_size"], shard)
    greedy, sampled = made.get("greedy", []), made.get("sampled", [])
    metrics = summarize(greedy, sampled, section["k"], normalize=normalize_answer)
    if style == "tool" and all(_kind(config, p["task"]) == "arith" for p in problems):
        # whether the policy copies the question's numbers: the skill SFT seeds differ in
        metrics.update(copy_summary(problems, greedy))
    return greedy + sampled, metrics


def _kind(config: dict, task: str) -> str | None:
    return config["tasks"].get(task, {}).get("kind")


def code_eval(
    config: dict,
    task: str,
    problems_path: str,
    samples_path: str,
    k: tuple[int, ...],
    timeout: float | None,
    out_dir: str,
) -> dict:
    """Per-sample verdicts and pass@k of code completions, run in the sandbox."""
    kind = config["tasks"][task]["kind"] if task in config["tasks"] else None
    provenance = Provenance(
        "code-eval", {"sandbox": config["sandbox"]}, [problems_path, samples_path], config["seed"]
    )
    problems = read_jsonl(problems_path, schema="problem")
    samples = read_jsonl(samples_path)
    sandbox = Sandbox.from_config(config["sandbox"])
    rows, metrics = evaluate_samples(
        problems, samples, sandbox, kind, k, timeout=timeout, source=samples_path
    )
    metrics.update(task=task, suite=kind)
    out = Path(out_dir)
    write_jsonl(out / "verdicts.jsonl", rows, schema="code_verdict")
    write_json(out / "metrics.json", metrics)
    write_csv(out / "metrics.csv", metrics_rows(metrics))
    provenance.write(out, {key: value for key, value in metrics.items() if "pass@" in key})
    log.info("%s: %s", task, {key: v for key, v in metrics.items() if "pass@" in key})
    return metrics
