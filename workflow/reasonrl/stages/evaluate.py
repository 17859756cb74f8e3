"""Stages of workflow/rules/evaluate.smk: a policy's greedy pass@1, pass@k and maj@k on a
task, and the sandboxed verdicts of code completions (`code-eval`, the import path for
samples made elsewhere)."""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from reasonrl.generation import EngineSettings, SamplingParams, make_engine
from reasonrl.io import read_jsonl, write_csv, write_json, write_jsonl
from reasonrl.manifest import Provenance, scheduler_provenance
from reasonrl.rollout import RolloutSettings, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.shards import ONE_JOB, ShardStore, Split, fingerprint, shard_seed
from reasonrl.stats.metrics import metrics_rows, summarize
from reasonrl.tasks.arith import copy_summary
from reasonrl.tasks.code_eval import evaluate_samples
from reasonrl.tasks.grading import normalize_answer

log = logging.getLogger(__name__)


def evaluate(
    config: dict,
    model: str,
    style: str,
    task: str,
    problems_path: str,
    policy: str,
    out_dir: str,
    split: Split = ONE_JOB,
) -> dict:
    """Trajectories and metrics of `policy` (the model at `model`) on `task`'s problems (or,
    as a part job of `split`, its share of the shards)."""
    provenance = Provenance("evaluate", config, [model, problems_path], config["seed"])
    problems = read_jsonl(problems_path, schema="problem")
    if config["evaluation"]["max_problems"]:
        problems = problems[: config["evaluation"]["max_problems"]]
    out = Path(out_dir)
    stamp = fingerprint("evaluate", config, provenance.hashes, style, task, policy)
    shards = ShardStore(out, stamp, split)
    greedy, sampled = policy_trajectories(config, model, problems, style, policy, shards)
    if split.is_part:
        return shards.publish_part(scheduler_provenance())
    metrics = trajectory_metrics(config, problems, style, greedy, sampled)
    metrics.update(policy=policy, task=task, style=style)
    write_jsonl(out / "trajectories.jsonl", greedy + sampled, schema="trajectory")
    write_json(out / "metrics.json", metrics)
    write_csv(out / "metrics.csv", metrics_rows(metrics))
    provenance.write(out, {"greedy_pass@1": metrics["greedy_pass@1"], **shards.adopted_parts()})
    shards.clear()
    log.info("%s on %s: greedy pass@1 %.3f", policy, task, metrics["greedy_pass@1"])
    return metrics


def policy_trajectories(
    config: dict, model: str, problems: list[dict], style: str, policy: str, shards: ShardStore
) -> tuple[list[dict], list[dict]]:
    """Greedy trajectories for pass@1 and sampled ones for pass@k / maj@k, made shard by
    shard (`shards` keeps the finished ones)."""
    section = config["evaluation"]
    generation = EngineSettings.from_section(config["generation"])
    engine = cache(lambda: make_engine(generation, model, config["policy"]["dtype"]))
    sandbox = Sandbox.from_config(config["sandbox"])
    limits = RolloutSettings.from_config(config["rollout"])
    seed = config["seed"]

    def shard(part: list[dict], index: int) -> dict[str, list]:
        greedy_params = SamplingParams(seed=shard_seed(seed, index))
        greedy = run_rollouts(engine(), part, style, 1, greedy_params, limits, sandbox, policy)
        sampled = []
        if section["n_samples"]:
            params = SamplingParams.from_section(section, shard_seed(seed + 1, index))
            sampled = run_rollouts(
                engine(), part, style, section["n_samples"], params, limits, sandbox, policy
            )
        return {"greedy": greedy, "sampled": sampled}

    made = shards.map("problems", problems, generation.shard_size, shard)
    return made.get("greedy", []), made.get("sampled", [])


def trajectory_metrics(
    config: dict, problems: list[dict], style: str, greedy: list[dict], sampled: list[dict]
) -> dict:
    """pass@1 (with its CI), pass@k and maj@k, behaviour counts, and for arith tool policies
    the copy accuracy."""
    metrics = summarize(greedy, sampled, config["evaluation"]["k"], normalize=normalize_answer)
    if style == "tool" and all(_kind(config, p["task"]) == "arith" for p in problems):
        # whether the policy copies the question's numbers: the skill SFT seeds differ in
        metrics.update(copy_summary(problems, greedy))
    return metrics


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
