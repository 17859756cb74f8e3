"""Stage bodies of the reward-model rules: sample RM data, Math-Shepherd annotation, code
mutation data (training is in rewards.training)."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.generation import SamplingParams, make_engine
from reasonrl.io import read_jsonl, write_json, write_jsonl
from reasonrl.manifest import Provenance
from reasonrl.rewards.annotation import annotate
from reasonrl.rewards.mutation import mutation_rows
from reasonrl.rollout import RolloutLimits, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.tasks import is_code_task

log = logging.getLogger(__name__)


def _engine(config: dict, model: str):
    generation = config["generation"]
    return make_engine(generation["engine"], model, generation, config["policy"]["dtype"])


def _params(section: dict, seed: int) -> SamplingParams:
    return SamplingParams(temperature=section["temperature"], top_p=section["top_p"], seed=seed)


def sample_rm_data(config: dict, model: str, problems_path: str, out_dir: str) -> dict:
    """`samples_per_prompt` SFT samples for each of the first `prompts` train problems."""
    section, seed = config["reward_models"], config["seed"]
    provenance = Provenance("sample-rm-data", config, [model, problems_path], seed)
    problems = read_jsonl(problems_path, schema="problem")[: section["prompts"]]
    if not problems:
        raise ReasonRLError(f"{problems_path}: no problems to sample")
    rows = run_rollouts(
        _engine(config, model),
        problems,
        section["style"],
        section["samples_per_prompt"],
        _params(section, seed + 11),
        RolloutLimits.from_config(config["rollout"]),
        Sandbox.from_config(config["sandbox"]),
        Path(model).name,
    )
    out = Path(out_dir)
    write_jsonl(out / "samples.jsonl", rows, schema="trajectory")
    stats = {"problems": len(problems), "samples": len(rows)}
    stats["accuracy"] = sum(r["correct"] for r in rows) / len(rows)
    write_json(out / "metrics.json", stats)
    provenance.write(out, stats)
    return stats


def annotate_prm(
    config: dict, model: str, problems_path: str, samples_path: str, out_dir: str
) -> dict:
    """Math-Shepherd labels for the first `annotation.solutions_per_prompt` samples per prompt."""
    section, seed = config["reward_models"], config["seed"]
    provenance = Provenance("annotate-prm", config, [model, problems_path, samples_path], seed)
    problems = {p["id"]: p for p in read_jsonl(problems_path, schema="problem")}
    samples = read_jsonl(samples_path, schema="trajectory")
    unknown = sorted({s["problem_id"] for s in samples} - problems.keys())
    if unknown:
        raise ReasonRLError(f"{samples_path}: problem '{unknown[0]}' is not in {problems_path}")
    if any(is_code_task(problems[s["problem_id"]]) for s in samples):
        raise ReasonRLError(f"{samples_path}: code tasks get PRM data from mutate-code-prm")
    keep = section["annotation"]["solutions_per_prompt"]
    chosen = [s for s in samples if s["sample"] < keep]
    rows, stats = annotate(
        problems,
        chosen,
        _engine(config, model),
        Sandbox.from_config(config["sandbox"]),
        RolloutLimits.from_config(config["rollout"]),
        section["annotation"]["completions"],
        _params(section, seed + 23),
        section["step_splitter"],
        section["split_pattern"],
    )
    out = Path(out_dir)
    write_jsonl(out / "prm.jsonl", rows, schema="prm_steps")
    labels = Counter(label for row in rows for label in row["labels"])
    metrics = {
        "solutions": stats.solutions,
        "steps": stats.steps,
        "rollouts": stats.rollouts,
        "seconds": round(stats.seconds, 3),
        "rollouts_per_second": round(stats.rollouts_per_second, 3),
        "labels": dict(sorted(labels.items())),
    }
    write_json(out / "metrics.json", metrics)
    provenance.write(out, metrics)
    log.info("annotated %d steps with %d rollouts", stats.steps, stats.rollouts)
    return metrics


def mutate_code_prm(config: dict, problems_path: str, out_dir: str) -> dict:
    """Code PRM rows from mutants of the first `mutation.max_problems` reference solutions."""
    section, seed = config["reward_models"], config["seed"]
    provenance = Provenance("mutate-code-prm", config, [problems_path], seed)
    problems = [
        p
        for p in read_jsonl(problems_path, schema="problem")
        if p["code"] and p["code"].get("canonical_solution")
    ][: section["mutation"]["max_problems"]]
    if not problems:
        raise ReasonRLError(f"{problems_path}: no code problems with a reference solution")
    mutation = section["mutation"]
    # Mutants loop forever easily (a flipped comparison in a while loop): a short CPU limit.
    limits = {**config["sandbox"], "cpu_seconds": mutation["cpu_seconds"]}
    limits["wall_seconds"] = max(limits["wall_seconds"], 2 * mutation["cpu_seconds"])
    rows, counts = mutation_rows(
        problems,
        Sandbox.from_config(limits),
        mutation["max_mutants_per_line"],
        tuple(mutation["kinds"]),
        seed,
    )
    out = Path(out_dir)
    write_jsonl(out / "prm.jsonl", rows, schema="prm_steps")
    metrics = {"problems": len(problems), "rows": len(rows), "counts": dict(sorted(counts.items()))}
    write_json(out / "metrics.json", metrics)
    provenance.write(out, metrics)
    return metrics
