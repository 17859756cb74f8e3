"""Stages of workflow/rules/reward_models.smk: reward-model data (samples, Math-Shepherd
annotation, code mutants), reward-model training, best-of-N reranking, HGS-PRM search and
their tables."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import asdict, fields, replace
from functools import cache
from pathlib import Path

import numpy as np

from reasonrl.config import MATCHED_SELECTIONS
from reasonrl.errors import ReasonRLError
from reasonrl.generation import EngineSettings, SamplingParams, make_engine
from reasonrl.io import read_json, read_jsonl, write_csv, write_json, write_jsonl, write_text
from reasonrl.manifest import Provenance, scheduler_provenance
from reasonrl.rewards.annotation import AnnotationStats, annotate
from reasonrl.rewards.models import (
    INFO_FILE,
    KINDS,
    heldout_split,
)
from reasonrl.rewards.mutation import mutation_rows
from reasonrl.rewards.reranking import score_samples
from reasonrl.rewards.settings import RewardModelSettings
from reasonrl.rewards.step_truth import annotation_label_quality
from reasonrl.rewards.steps import (
    from_rlhflow,
    solution_step_texts,
    to_rlhflow,
)
from reasonrl.rewards.trainers import TRAINERS
from reasonrl.rollout import RolloutSettings, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.search import (
    best_of_n_groups,
    best_of_n_metrics,
    matched_accuracy,
    run_hgs,
    sample_then_filter,
    sample_to_budget,
)
from reasonrl.search.tool_steps import ToolStepModel
from reasonrl.shards import ONE_JOB, ShardStore, Split, fingerprint, shard_seed
from reasonrl.stages._train import TrainingRun
from reasonrl.stats import tables
from reasonrl.stats.tables import frame, markdown
from reasonrl.tasks import is_code_task
from reasonrl.tasks.grading import extract_answer, normalize_answer
from reasonrl.training.loop import with_accumulation
from reasonrl.training.lora import LoraSettings

log = logging.getLogger(__name__)


def _engine(config: dict, model: str):
    """The engine, made on first call: a rerun whose shards are all finished loads no model."""
    generation = EngineSettings.from_section(config["generation"])
    return cache(lambda: make_engine(generation, model, config["policy"]["dtype"]))


def _shards(
    stage: str, config: dict, provenance: Provenance, out_dir: str, split: Split
) -> ShardStore:
    return ShardStore(out_dir, fingerprint(stage, config, provenance.hashes), split)


def _settings(config: dict) -> RewardModelSettings:
    """The reward_models section typed, once at a stage (train_reward_model types it with its
    job's grad_accum)."""
    return RewardModelSettings.from_section(config["reward_models"], config["seed"])


def sample_rm_data(
    config: dict, model: str, problems_path: str, out_dir: str, split: Split = ONE_JOB
) -> dict:
    """`samples_per_prompt` SFT samples for each of the first `prompts` train problems (or, as
    a part job of `split`, its share of the shards)."""
    settings, seed = _settings(config), config["seed"]
    provenance = Provenance("sample-rm-data", config, [model, problems_path], seed)
    problems = read_jsonl(problems_path, schema="problem")[: settings.prompts]
    if not problems:
        raise ReasonRLError(f"{problems_path}: no problems to sample")
    engine = _engine(config, model)
    limits = RolloutSettings.from_config(config["rollout"])
    sandbox = Sandbox.from_config(config["sandbox"])

    def shard(part: list[dict], index: int) -> dict[str, list]:
        params = replace(settings.sampling, seed=shard_seed(seed + 11, index))
        n = settings.samples_per_prompt
        rows = run_rollouts(
            engine(), part, settings.style, n, params, limits, sandbox, Path(model).name
        )
        return {"rows": rows}

    shards = _shards("sample-rm-data", config, provenance, out_dir, split)
    made = shards.map("problems", problems, config["generation"]["shard_size"], shard)
    if split.is_part:
        return shards.publish_part(scheduler_provenance())
    rows = made["rows"]
    out = Path(out_dir)
    write_jsonl(out / "samples.jsonl", rows, schema="trajectory")
    stats = {"problems": len(problems), "samples": len(rows)}
    stats["accuracy"] = sum(r["correct"] for r in rows) / len(rows)
    write_json(out / "metrics.json", stats)
    provenance.write(out, {**stats, **shards.adopted_parts()})
    shards.clear()
    return stats


def annotate_prm(
    config: dict,
    model: str,
    problems_path: str,
    samples_path: str,
    out_dir: str,
    split: Split = ONE_JOB,
) -> dict:
    """Math-Shepherd labels for the first `annotation.solutions_per_prompt` samples per prompt."""
    settings, seed = _settings(config), config["seed"]
    provenance = Provenance("annotate-prm", config, [model, problems_path, samples_path], seed)
    problems = {p["id"]: p for p in read_jsonl(problems_path, schema="problem")}
    samples = read_jsonl(samples_path, schema="trajectory")
    unknown = sorted({s["problem_id"] for s in samples} - problems.keys())
    if unknown:
        raise ReasonRLError(f"{samples_path}: problem '{unknown[0]}' is not in {problems_path}")
    if any(is_code_task(problems[s["problem_id"]]) for s in samples):
        raise ReasonRLError(f"{samples_path}: code tasks get PRM data from mutate-code-prm")
    keep = settings.annotation.solutions_per_prompt
    chosen = [s for s in samples if s["sample"] < keep]
    engine = _engine(config, model)
    sandbox = Sandbox.from_config(config["sandbox"])
    limits = RolloutSettings.from_config(config["rollout"])

    def shard(part: list[dict], index: int) -> dict[str, list]:
        rows, stats = annotate(
            problems,
            part,
            engine(),
            sandbox,
            limits,
            settings.annotation.completions,
            replace(settings.sampling, seed=shard_seed(seed + 23, index)),
            settings.step_splitter,
            settings.split_pattern,
        )
        return {"rows": rows, "stats": [asdict(stats)]}

    # Shards of solutions, about shard_size prompts' worth (`keep` solutions each).
    size = config["generation"]["shard_size"] * keep
    shards = _shards("annotate-prm", config, provenance, out_dir, split)
    made = shards.map("solutions", chosen, size, shard)
    if split.is_part:
        return shards.publish_part(scheduler_provenance())
    rows = made.get("rows", [])
    stats = AnnotationStats(
        **{f.name: sum(s[f.name] for s in made.get("stats", [])) for f in fields(AnnotationStats)}
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
    arith = {
        pid: p
        for pid, p in problems.items()
        if config["tasks"].get(p["task"], {}).get("kind") == "arith"
    }
    if any(row["problem_id"] in arith for row in rows):
        # Precision and recall of "-" against the steps' exact correctness (issue 18 item 2).
        metrics["label_truth"] = annotation_label_quality(
            arith, chosen, rows, settings.step_splitter, settings.split_pattern
        )
    write_json(out / "metrics.json", metrics)
    provenance.write(out, {**metrics, **shards.adopted_parts()})
    shards.clear()
    log.info("annotated %d steps with %d rollouts", stats.steps, stats.rollouts)
    return metrics


def mutate_code_prm(config: dict, problems_path: str, out_dir: str) -> dict:
    """Code PRM rows from mutants of the first `mutation.max_problems` reference solutions."""
    mutation, seed = _settings(config).mutation, config["seed"]
    provenance = Provenance("mutate-code-prm", config, [problems_path], seed)
    problems = [
        p
        for p in read_jsonl(problems_path, schema="problem")
        if p["code"] and p["code"].get("canonical_solution")
    ][: mutation.max_problems]
    if not problems:
        raise ReasonRLError(f"{problems_path}: no code problems with a reference solution")
    # Mutants loop forever easily (a flipped comparison in a while loop): a short CPU limit.
    limits = {**config["sandbox"], "cpu_seconds": mutation.cpu_seconds}
    limits["wall_seconds"] = max(limits["wall_seconds"], 2 * mutation.cpu_seconds)
    rows, counts = mutation_rows(
        problems,
        Sandbox.from_config(limits),
        mutation.max_mutants_per_line,
        mutation.kinds,
        seed,
    )
    out = Path(out_dir)
    write_jsonl(out / "prm.jsonl", rows, schema="prm_steps")
    metrics = {"problems": len(problems), "rows": len(rows), "counts": dict(sorted(counts.items()))}
    write_json(out / "metrics.json", metrics)
    provenance.write(out, metrics)
    return metrics


# ---- train_reward_model ----------------------------------------------------------------------


def train_reward_model(
    config: dict,
    kind: str,
    model_path: str,
    problems_paths: str | list[str],
    data_paths: str | list[str],
    out_dir: str,
) -> dict:
    """Train one reward model of `kind` from the SFT policy; write the folder, metrics, manifest.

    data_paths: sampled trajectories (bt, orm) or PRM step rows (prm) of the problems in
    problems_paths: one task's, or several tasks' for a reward model on their union
    (reward_models.pooled).
    """
    if kind not in KINDS:
        raise ReasonRLError(f"unknown reward model kind {kind!r} (expected one of {KINDS})")
    problems_paths, data_paths = _paths(problems_paths), _paths(data_paths)
    section, seed = config["reward_models"], config["seed"]
    train = with_accumulation(section["train"], "reward_models.train")
    settings = RewardModelSettings.from_section({**section, "train": train}, seed)
    # Provenance and the checkpoints' fingerprint hash the section as the config gives it.
    sections = {"reward_models": section, "policy": config["policy"]}
    inputs = [model_path, *problems_paths, *data_paths]
    lora = LoraSettings.from_config(section["train"]["lora"], "reward_models.train.lora")
    run = TrainingRun(
        "train-reward-model", out_dir, sections, inputs, seed, kind, section, seed, lora=lora
    )
    problems = _problems_by_id(problems_paths)
    schema = "prm_steps" if kind == "prm" else "trajectory"
    data = []
    for data_path in data_paths:
        rows = read_jsonl(data_path, schema=schema)
        unknown = sorted({r["problem_id"] for r in rows} - problems.keys())
        if unknown:
            named = " or ".join(problems_paths)
            raise ReasonRLError(f"{data_path}: problem '{unknown[0]}' is not in {named}")
        data += rows
    train_rows, held_rows = heldout_split(data, settings.heldout_fraction, seed)
    trainer = TRAINERS[kind]
    model, tokenizer, result, info, heldout = trainer(
        settings, config["policy"]["dtype"], model_path, problems, train_rows, held_rows, run
    )
    metrics = run.metrics(result, {"kind": kind}, {"heldout": heldout, **info})
    info_json = {"kind": kind, **{k: v for k, v in info.items() if k == "labels"}}
    run.save(
        model, tokenizer, metrics, extra_json={INFO_FILE: info_json}, summary={"heldout": heldout}
    )
    return metrics


def _paths(paths: str | list[str]) -> list[str]:
    return [paths] if isinstance(paths, str) else list(paths)


def _problems_by_id(paths: list[str]) -> dict[str, dict]:
    """The problems of every file by id; an id two files share is a one-line error (the
    rows of one could not be told from the other's)."""
    problems, where = {}, {}
    for path in paths:
        for problem in read_jsonl(path, schema="problem"):
            if problem["id"] in where:
                raise ReasonRLError(
                    f"{path}: problem id '{problem['id']}' is also in {where[problem['id']]}"
                )
            problems[problem["id"]], where[problem["id"]] = problem, path
    return problems


# ---- best_of_n, hgs_search, score_rlhflow -----------------------------------------------------


def _test_problems(path: str, limit: int) -> list[dict]:
    problems = read_jsonl(path, schema="problem")
    return problems[:limit] if limit else problems


def _group(rows: list[dict]) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["sample"]):
        groups.setdefault(row["problem_id"], []).append(row)
    return groups


def best_of_n(
    config: dict,
    policy: str,
    problems_path: str,
    reward_models: dict[str, str],
    out_dir: str,
    split: Split = ONE_JOB,
) -> dict:
    """Sample max(N) solutions per test problem (and a greedy one), score them with every
    reward model, and tabulate pass@1, maj@N and RM@N with bootstrap CIs (or, as a part job
    of `split`, its share of the shards)."""
    settings, seed = _settings(config), config["seed"]
    inputs = [policy, problems_path, *reward_models.values()]
    provenance = Provenance("best-of-n", config, inputs, seed)
    problems = _test_problems(problems_path, settings.best_of_n.max_problems)
    n_max = max(settings.best_of_n.n)
    engine = _engine(config, policy)
    sandbox = Sandbox.from_config(config["sandbox"])
    limits = RolloutSettings.from_config(config["rollout"])
    style = settings.style

    def shard(part: list[dict], index: int) -> dict[str, list]:
        greedy_params = SamplingParams(seed=shard_seed(seed, index))
        params = replace(settings.sampling, seed=shard_seed(seed + 101, index))
        return {
            "greedy": run_rollouts(engine(), part, style, 1, greedy_params, limits, sandbox),
            "sampled": run_rollouts(engine(), part, style, n_max, params, limits, sandbox),
        }

    shards = _shards("best-of-n", config, provenance, out_dir, split)
    made = shards.map("problems", problems, config["generation"]["shard_size"], shard)
    if split.is_part:
        return shards.publish_part(scheduler_provenance())
    greedy, sampled = made["greedy"], made["sampled"]
    by_id = {p["id"]: p for p in problems}
    scored = score_samples(settings, config["policy"]["dtype"], by_id, sampled, reward_models)
    scorers = sorted({k for s in scored for k in s["scores"]})
    groups = []
    for pid, rows in _group(sampled).items():
        scores = {s["sample"]: s["scores"] for s in scored if s["problem_id"] == pid}
        groups.append(
            {
                "correct": [r["correct"] for r in rows],
                "answers": [
                    None if r["final_answer"] is None else normalize_answer(r["final_answer"])
                    for r in rows
                ],
                "scores": {k: [scores[r["sample"]][k] for r in rows] for k in scorers},
            }
        )
    table = best_of_n_metrics(groups, settings.best_of_n.n, scorers)
    greedy_correct = np.array([float(r["correct"]) for r in greedy])
    table["greedy_pass@1"] = float(greedy_correct.mean())
    out = Path(out_dir)
    write_jsonl(out / "greedy.jsonl", greedy, schema="trajectory")
    write_jsonl(out / "samples.jsonl", sampled, schema="trajectory")
    write_jsonl(out / "scores.jsonl", scored)
    split = settings.step_splitter, settings.split_pattern
    rlhflow = [
        to_rlhflow(
            by_id[pid]["question"],
            [solution_step_texts(by_id[pid], r["messages"], *split) for r in rows],
            [r["correct"] for r in rows],
        )
        for pid, rows in _group(sampled).items()
    ]
    write_jsonl(out / "rlhflow.jsonl", rlhflow)
    write_json(out / "best_of_n.json", table)
    write_csv(out / "best_of_n.csv", table["rows"])
    provenance.write(out, {"greedy_pass@1": table["greedy_pass@1"], **shards.adopted_parts()})
    shards.clear()
    return table


def hgs_search(
    config: dict,
    policy: str,
    prm: str,
    problems_path: str,
    best_of_n_dir: str,
    out_dir: str,
    split: Split = ONE_JOB,
) -> dict:
    """HGS-PRM vs greedy vs sample-then-filter on the same test problems (greedy decoding and
    the samples come from the best-of-N stage; a part job of `split` makes its share of the
    shards), and HGS's compute-matched baseline: per problem, samples at HGS's temperature
    until the policy calls HGS made there are spent (matched.jsonl), scored by the same PRM
    (matched_scores.jsonl) for the hgs-matched:SELECTION arms."""
    settings, seed = _settings(config), config["seed"]
    bon = Path(best_of_n_dir)
    inputs = [policy, prm, problems_path, str(bon / "scores.jsonl")]
    provenance = Provenance("hgs-search", config, inputs, seed)
    problems = _test_problems(problems_path, settings.hgs.max_problems)
    ids = {p["id"] for p in problems}
    greedy = [
        r for r in read_jsonl(bon / "greedy.jsonl", schema="trajectory") if r["problem_id"] in ids
    ]
    samples = [
        r for r in read_jsonl(bon / "samples.jsonl", schema="trajectory") if r["problem_id"] in ids
    ]
    scores = {(s["problem_id"], s["sample"]): s for s in read_jsonl(bon / "scores.jsonl")}
    if len(greedy) != len(problems):
        raise ReasonRLError(f"{bon}/greedy.jsonl: has no greedy run of some of the problems")
    engine = _engine(config, policy)
    hgs, dtype = settings.hgs, config["policy"]["dtype"]
    limits = RolloutSettings.from_config(config["rollout"])
    stepper = cache(
        lambda: ToolStepModel(
            settings, engine(), prm, limits, Sandbox.from_config(config["sandbox"]), dtype
        )
    )

    def shard(part: list[dict], index: int) -> dict[str, list]:
        model = stepper().for_problems(part, shard_seed(seed, index))
        searches = run_hgs(
            len(part), model.expand, model.label, hgs.max_bandwidth, hgs.max_iterations
        )
        rows = model.finish(searches)  # counts the steps of the greedy completions too
        summaries = [
            {
                "problem_id": problem["id"],
                "finished": s.finished,
                "backtracks": sum(e[0] == "backtrack" for e in s.events),
                "generated": generated,
                "tokens": tokens,
            }
            for problem, s, generated, tokens in zip(
                part, searches, model.generated, model.tokens, strict=True
            )
        ]
        matched = sample_to_budget(model.generated, model.sample)
        return {"rows": rows, "searches": summaries, "matched": [r for m in matched for r in m]}

    shards = _shards("hgs-search", config, provenance, out_dir, split)
    made = shards.map("problems", problems, config["generation"]["shard_size"], shard)
    if split.is_part:
        return shards.publish_part(scheduler_provenance())
    rows, searches, matched = made["rows"], made["searches"], made["matched"]
    by_id = {p["id"]: p for p in problems}
    stepper.cache_clear()  # score_samples loads the PRM afresh: do not hold two copies
    matched_scores = score_samples(settings, dtype, by_id, matched, {"prm": prm})
    matched_groups = best_of_n_groups(matched, matched_scores).values()
    n_filter = hgs.filter_samples
    kept = [g[:n_filter] for g in _group(samples).values()]
    filtered = sample_then_filter(
        [[scores[(r["problem_id"], r["sample"])]["step_labels"] for r in g] for g in kept],
        [[r["correct"] for r in g] for g in kept],
    )
    metrics = {
        "n_problems": len(problems),
        "greedy": {
            "accuracy": float(np.mean([r["correct"] for r in greedy])),
            "steps_per_problem": float(np.mean([r["num_turns"] for r in greedy])),
        },
        "hgs": {
            "accuracy": float(np.mean([r["correct"] for r in rows])),
            "steps_per_problem": float(np.mean([s["generated"] for s in searches])),
            "calls_total": sum(s["generated"] for s in searches),
            "tokens_per_problem": float(np.mean([s["tokens"] for s in searches])),
            "tokens_total": sum(s["tokens"] for s in searches),
            "calls": {s["problem_id"]: s["generated"] for s in searches},
            "finished": {
                k: sum(s["finished"] == k for s in searches) for k in ("answer", "cap", "exhausted")
            },
            "backtracks": sum(s["backtracks"] for s in searches),
        },
        "matched": {
            "samples_per_problem": len(matched) / len(problems),
            "calls_total": sum(r["num_turns"] for r in matched),
            "tokens_total": sum(r["num_tokens"] for r in matched),
            **{
                f"{selection}_accuracy": matched_accuracy(matched_groups, f"{selection}@N")
                for selection in MATCHED_SELECTIONS
            },
        },
        "sample_then_filter": {
            **filtered,
            "n": n_filter,
            "steps_per_problem": float(np.mean([sum(r["num_turns"] for r in g) for g in kept])),
        },
    }
    out = Path(out_dir)
    write_jsonl(out / "trajectories.jsonl", rows, schema="trajectory")
    write_jsonl(out / "matched.jsonl", matched, schema="trajectory")
    write_jsonl(out / "matched_scores.jsonl", matched_scores)
    write_json(out / "hgs.json", metrics)
    write_csv(
        out / "hgs.csv",
        [
            {"method": "greedy", **metrics["greedy"]},
            {
                "method": "hgs-prm",
                "accuracy": metrics["hgs"]["accuracy"],
                "steps_per_problem": metrics["hgs"]["steps_per_problem"],
            },
            {
                "method": f"sample{n_filter}-then-filter",
                "accuracy": filtered["accuracy_after"],
                "steps_per_problem": metrics["sample_then_filter"]["steps_per_problem"],
            },
            *matched_rows(metrics),
        ],
    )
    provenance.write(out, {"hgs_accuracy": metrics["hgs"]["accuracy"], **shards.adopted_parts()})
    shards.clear()
    return metrics


def score_rlhflow(config: dict, path: str, reward_models: dict[str, str], out_dir: str) -> dict:
    """Best-of-N of an RLHFlow evaluation file (prompt, answers, labels: e.g. their
    MATH500 / GSM8K test sets) reranked by our reward models; answers are split into steps
    at blank lines, as the RLHFlow evaluation scripts do."""
    settings = replace(_settings(config), step_splitter="regex", split_pattern=r"\n\s*\n")
    provenance = Provenance(
        "score-rlhflow", config, [path, *reward_models.values()], config["seed"]
    )
    problems, rows = {}, []
    for lineno, row in enumerate(read_jsonl(path), start=1):
        question, solutions, correct = from_rlhflow(row, f"{path}:{lineno}")
        pid = f"rlhflow-{lineno:05d}"
        problems[pid] = {"id": pid, "question": question, "code": None}
        for sample, (steps, right) in enumerate(zip(solutions, correct, strict=True)):
            messages = [
                {"role": "user", "content": question},
                {"role": "assistant", "content": "\n\n".join(steps)},
            ]
            rows.append(
                {"problem_id": pid, "sample": sample, "messages": messages, "correct": right}
            )
    scored = score_samples(settings, config["policy"]["dtype"], problems, rows, reward_models)
    scorers = sorted({k for s in scored for k in s["scores"]})
    groups = []
    for pid, members in _group(rows).items():
        scores = {s["sample"]: s["scores"] for s in scored if s["problem_id"] == pid}
        answers = [extract_answer(r["messages"][-1]["content"]) for r in members]
        groups.append(
            {
                "correct": [r["correct"] for r in members],
                "answers": [None if a is None else normalize_answer(a) for a in answers],
                "scores": {k: [scores[r["sample"]][k] for r in members] for k in scorers},
            }
        )
    table = best_of_n_metrics(groups, settings.best_of_n.n, scorers)
    out = Path(out_dir)
    write_json(out / "best_of_n.json", table)
    write_csv(out / "best_of_n.csv", table["rows"])
    provenance.write(out, {"n_problems": table["n_problems"]})
    return table


# ---- reward_tables ---------------------------------------------------------------------------


def _task_of(path: Path) -> str:
    return path.parent.parent.name  # results/search/{task}/{stage}/file


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _markdown(rows: list[dict], columns: list[str]) -> str:
    shown = frame(rows)[columns]
    return markdown(shown.map(lambda v: _fmt(v) if v is None or isinstance(v, float) else v))


def best_of_n_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in map(Path, paths):
        table = read_json(path)
        task = _task_of(path)
        rows.append(
            {
                "task": task,
                "N": 1,
                "method": "greedy",
                "accuracy": table["greedy_pass@1"],
                "ci_low": None,
                "ci_high": None,
            }
        )
        rows += [{"task": task, **row} for row in table["rows"]]
    return rows


def hgs_rows(paths: list[str]) -> list[dict]:
    rows = []
    for path in map(Path, paths):
        metrics = read_json(path)
        task = _task_of(path)
        stf = metrics["sample_then_filter"]
        rows += [
            {"task": task, "method": "greedy", **metrics["greedy"]},
            {
                "task": task,
                "method": "hgs-prm",
                "accuracy": metrics["hgs"]["accuracy"],
                "steps_per_problem": metrics["hgs"]["steps_per_problem"],
            },
            {
                "task": task,
                "method": f"sample{stf['n']}-then-filter",
                "accuracy": stf["accuracy_after"],
                "steps_per_problem": stf["steps_per_problem"],
            },
            *({"task": task, **row} for row in matched_rows(metrics)),
        ]
    return rows


def matched_rows(metrics: dict) -> list[dict]:
    """hgs.json's compute-matched baseline, one row per selection (its steps per problem are
    HGS's policy calls, which it spends exactly)."""
    matched = metrics["matched"]
    calls = matched["calls_total"] / metrics["n_problems"]
    return [
        {
            "method": f"hgs-matched:{selection}",
            "accuracy": matched[f"{selection}_accuracy"],
            "steps_per_problem": calls,
        }
        for selection in MATCHED_SELECTIONS
    ]


def prm_rows(folders: list[str]) -> list[dict]:
    rows = []
    for folder in map(Path, folders):
        heldout = read_json(folder / "metrics.json")["heldout"]
        for label, stats in (heldout.get("per_label") or {}).items():
            rows.append({"prm": folder.name, "task": folder.parent.name, "label": label, **stats})
    return rows


def reward_tables(best_of_n: list[str], hgs: list[str], prms: list[str], out_dir: str) -> None:
    """Tables of best-of-N per task and N, HGS-PRM vs greedy vs sample-then-filter, and the
    PRM's held-out per-label precision/recall (Markdown + CSV)."""
    out = Path(out_dir)
    bon = best_of_n_rows(best_of_n)
    search = hgs_rows(hgs)
    prm = prm_rows(prms)
    tables.write_csv(frame(bon), out / "best_of_n.csv")
    tables.write_csv(frame(search or [{"task": "", "method": ""}]), out / "hgs.csv")
    tables.write_csv(frame(prm or [{"prm": ""}]), out / "prm_precision_recall.csv")
    text = ["# Reward models and search", "", "## Best-of-N (accuracy, 95% bootstrap CI)", ""]
    for row in bon:
        row["ci"] = "" if row["ci_low"] is None else f"[{row['ci_low']:.3f}, {row['ci_high']:.3f}]"
    text.append(_markdown(bon, ["task", "N", "method", "accuracy", "ci"]))
    text += ["## HGS-PRM vs greedy vs sample-then-filter", ""]
    text.append(
        _markdown(search, ["task", "method", "accuracy", "steps_per_problem"])
        if search
        else "(none)\n"
    )
    text += ["## PRM held-out steps: per-label precision / recall", ""]
    text.append(
        _markdown(prm, ["task", "label", "precision", "recall", "support"]) if prm else "(none)\n"
    )
    write_text(out / "reward_models.md", "\n".join(text))
