"""Stages of workflow/rules/preference.smk, the iterative preference rounds: augment, sample,
label, reference log-probs, train, select, table.

Each reads and writes files only (explicit paths), so a rule is one call.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.io import read_json, read_jsonl, write_csv, write_json, write_jsonl
from reasonrl.manifest import Provenance, scheduler_provenance
from reasonrl.shards import ONE_JOB, Split
from reasonrl.stats.tables import frame, write_table

log = logging.getLogger(__name__)


def variant_settings(config: dict, name: str) -> dict:
    """The preference variant called `name` (config key preference.variants)."""
    for variant in config["preference"]["variants"]:
        if variant["name"] == name:
            return variant
    names = ", ".join(v["name"] for v in config["preference"]["variants"])
    raise ReasonRLError(f"preference variant '{name}' is not in preference.variants ({names})")


# ---- augment_prompts ---------------------------------------------------------------------------


def augment_prompts(
    config: dict,
    task: str,
    train_path: str,
    eval_sets: dict[str, str],
    rounds: int,
    out_dir: str,
    sources: dict[str, str] | None = None,
) -> dict:
    """Augment `task`'s train questions, add the already augmented questions of `sources`
    (task name -> train problems JSONL: MetaMathQA, MMIQC); write round{r}.jsonl,
    selection.jsonl, stats."""
    from reasonrl.preference import augment as aug

    section = config["preference"]["prompts"]
    sources = sources or {}
    provenance = Provenance(
        "augment-prompts",
        {"preference": {"prompts": section}},
        [train_path, *sources.values(), *eval_sets.values()],
        config["seed"],
    )
    problems = read_jsonl(train_path, schema="problem")
    if section["source_size"]:
        problems = problems[: section["source_size"]]
    rephraser = _model_rephraser(config) if section["rephrase"] == "model" else None
    rows = aug.augment(problems, section, config["seed"], rephraser)
    own = {problem["question"]: problem["id"] for problem in problems}
    for name, path in sources.items():
        rows += [_sourced(p, name, own) for p in read_jsonl(path, schema="problem")]
    made = _count_by(rows, lambda r: r["meta"]["augmentation"])
    kept, dedup = aug.deduplicate(
        [r["question"] for r in rows], section["dedup_ngram"], section["near_duplicate_threshold"]
    )
    rows = [rows[i] for i in kept]
    eval_questions = {
        name: [p["question"] for p in read_jsonl(path, schema="problem")]
        for name, path in eval_sets.items()
    }
    hits = aug.contaminated(
        [r["question"] for r in rows], eval_questions, section["decontamination_ngram"]
    )
    dirty = set().union(*hits.values()) if hits else set()
    rows = [r for i, r in enumerate(rows) if i not in dirty]
    per_round, selection = aug.split_rounds(
        rows, rounds, section["per_round"], section["selection_size"], config["seed"]
    )
    out = Path(out_dir)
    for r, prompts in enumerate(per_round, start=1):
        write_jsonl(out / f"round{r}.jsonl", prompts, schema="problem")
    write_jsonl(out / "selection.jsonl", selection, schema="problem")
    stats = {
        "task": task,
        "source_questions": len(problems),
        "made": made,
        **dedup,
        "decontamination_ngram": section["decontamination_ngram"],
        "contaminated": {name: len(found) for name, found in hits.items()},
        "kept": len(rows),
        "per_round": [len(p) for p in per_round],
        "per_round_by_kind": [_count_by(p, lambda r: r["meta"]["augmentation"]) for p in per_round],
        "selection": len(selection),
    }
    write_json(out / "stats.json", stats)
    provenance.write(out, {"kept": len(rows)})
    log.info("%s: %d augmented prompts kept; %s", task, len(rows), stats)
    return stats


def _sourced(problem: dict, source: str, own: dict[str, str]) -> dict:
    """A prompt from a source of augmented prompts, its augmentation named by the source. The
    rounds are split by the question it was made from (MetaMathQA's original_question), so
    that variants of one question share a round or the selection set: the task's own
    question where it is one of its train questions (`own`: question -> id), else the
    source's; a prompt that names none is a group of its own."""
    from reasonrl.preference.augment import SOURCED

    original = problem["meta"].get("original_question")
    group = own.get(original) or (f"{source}:{original}" if original else problem["id"])
    meta = {**problem["meta"], "source": group, "augmentation": f"{SOURCED}{source}"}
    return {**problem, "meta": meta}


def _count_by(rows: list[dict], key) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[key(row)] = counts.get(key(row), 0) + 1
    return dict(sorted(counts.items()))


def _model_rephraser(config: dict):
    from reasonrl.generation import EngineSettings, SamplingParams, make_engine
    from reasonrl.preference.augment import model_rephrasings

    prompts = config["preference"]["prompts"]
    model = prompts["rephrase_model"]
    if not model:
        raise ReasonRLError(
            "config key 'preference.prompts.rephrase' is 'model' but rephrase_model is not set"
        )
    generation = EngineSettings.from_section(config["generation"])
    engine = make_engine(generation, model, config["policy"]["dtype"])
    params = SamplingParams.from_section(prompts["rephrase_sampling"], config["seed"])
    return lambda questions: model_rephrasings(engine, questions, params)


# ---- sample_round ------------------------------------------------------------------------------


def sample_round(
    config: dict,
    prompts_path: str,
    samplers: list[tuple[str, str, int]],
    round_no: int,
    out_dir: str,
    style: str = "tool",
    split: Split = ONE_JOB,
) -> dict:
    """N trajectories per prompt in solution `style`, mixed from several policies: samplers =
    (name, model, n) (or, as a part job of `split`, its share of the shards).

    The samples of one policy are numbered after those of the policies before it, and each
    policy gets its own seed stream.
    """
    from reasonrl.generation import EngineSettings, SamplingParams, make_engine
    from reasonrl.rollout import RolloutSettings, run_rollouts
    from reasonrl.sandbox import Sandbox
    from reasonrl.shards import ShardStore, fingerprint, shard_seed

    section = config["preference"]["sampling"]
    provenance = Provenance(
        "sample-round",
        {k: config[k] for k in ("preference", "rollout", "generation", "sandbox", "policy")},
        [prompts_path, *(model for _, model, _ in samplers)],
        config["seed"],
    )
    problems = read_jsonl(prompts_path, schema="problem")
    sandbox = Sandbox.from_config(config["sandbox"])
    limits = RolloutSettings.from_config(config["rollout"])
    generation = EngineSettings.from_section(config["generation"])
    stamp = fingerprint(
        "sample-round", provenance.config, provenance.hashes, samplers, round_no, style
    )
    shards = ShardStore(out_dir, stamp, split)
    rows: list[dict] = []
    offset = 0
    for k, (name, model, n) in enumerate(samplers):
        if n == 0:
            continue
        # Made on first use, so a sampler whose shards are all finished loads no model.
        engine = cache(lambda m=model: make_engine(generation, m, config["policy"]["dtype"]))

        def shard(part: list[dict], index: int, k=k, name=name, n=n, engine=engine) -> dict:
            seed = shard_seed(config["seed"] * 1000 + round_no * 10 + k, index)
            params = SamplingParams.from_section(section, seed)
            return {"rows": run_rollouts(engine(), part, style, n, params, limits, sandbox, name)}

        made = shards.map(f"sampler{k}", problems, generation.shard_size, shard)
        for row in made.get("rows", []):
            row["sample"] += offset
        rows += made.get("rows", [])
        offset += n
        del engine
    if split.is_part:
        return shards.publish_part(scheduler_provenance())
    out = Path(out_dir)
    write_jsonl(out / "samples.jsonl", rows, schema="trajectory")
    accuracy = sum(r["correct"] for r in rows) / len(rows) if rows else 0.0
    stats = {"prompts": len(problems), "trajectories": len(rows), "accuracy": accuracy}
    write_json(out / "sampling.json", stats)
    provenance.write(out, {**stats, **shards.adopted_parts()})
    shards.clear()
    log.info("round %d: %d trajectories, accuracy %.3f", round_no, len(rows), accuracy)
    return stats


# ---- label_preferences -------------------------------------------------------------------------


def label_preferences(config: dict, samples_path: str, round_no: int, out_dir: str) -> dict:
    from reasonrl.preference import labelling

    section = config["preference"]["labelling"]
    provenance = Provenance(
        "label-preferences", {"preference": {"labelling": section}}, [samples_path], config["seed"]
    )
    trajectories = read_jsonl(samples_path, schema="trajectory")
    pairs, unpaired, winners, stats = labelling.label_preferences(
        trajectories,
        section["max_tokens"],
        config["seed"] * 1000 + round_no,
        section["pairs_per_prompt"],
    )
    out = Path(out_dir)
    write_jsonl(out / "pairs.jsonl", pairs, schema="preference_pair")
    write_jsonl(out / "unpaired.jsonl", unpaired, schema="preference_unpaired")
    write_jsonl(out / "winners.jsonl", winners, schema="preference_unpaired")
    stats["round"] = round_no
    write_json(out / "stats.json", stats)
    provenance.write(out, {"coverage": stats["coverage"], "pairs": stats["pairs"]})
    log.info("round %d: %d pairs, coverage %.3f", round_no, stats["pairs"], stats["coverage"])
    return stats


# ---- reference log-probs and training ----------------------------------------------------------


def _training_rows(variant: dict, data_dir: str) -> list[dict]:
    """The rows a variant trains on: pairs (DPO family), unpaired (KTO), winners (RAFT)."""
    from reasonrl.training.preference import LOSSES

    family = LOSSES[variant["loss"]][0]
    name, schema = {
        "dpo": ("pairs.jsonl", "preference_pair"),
        "kto": ("unpaired.jsonl", "preference_unpaired"),
        "sft": ("winners.jsonl", "preference_unpaired"),
    }[family]
    return read_jsonl(Path(data_dir) / name, schema=schema)


def _sequences(tokenizer, variant: dict, rows: list[dict], max_length: int) -> list:
    from reasonrl.training.preference import LOSSES, pair_sequences, unpaired_sequences

    family, multi_turn = LOSSES[variant["loss"]]
    if family == "dpo":
        return pair_sequences(tokenizer, rows, multi_turn, max_length, variant["credit"])
    return unpaired_sequences(tokenizer, rows, multi_turn, max_length)


def reference_logps(
    config: dict, variant_name: str, model_path: str, data_dir: str, out_path: str
) -> int:
    """Reference log-probs of every training row, computed once for the round."""
    from reasonrl.models import load_policy
    from reasonrl.sequences import summed_logps
    from reasonrl.training.loop import map_over_processes
    from reasonrl.training.lora import LoraSettings
    from reasonrl.training.preference import LOSSES

    variant = variant_settings(config, variant_name)
    provenance = Provenance(
        "reference-logps",
        {"variant": variant, "train": config["preference"]["train"]},
        [model_path, data_dir],
        config["seed"],
    )
    rows = _training_rows(variant, data_dir)
    # under QLoRA the round trains on the quantized start model: its reference is that model
    train = config["preference"]["train"]
    lora = LoraSettings.from_config(train["lora"], "preference.train.lora")
    dtype = config["policy"]["dtype"]
    model, tokenizer = load_policy(model_path, dtype, **lora.load_options(dtype))
    seqs = _sequences(tokenizer, variant, rows, train["max_length"])
    pad_id = tokenizer.pad_token_id
    paired = LOSSES[variant["loss"]][0] == "dpo"
    flat = [s for pair in seqs for s in pair] if paired else seqs

    def score(part: list) -> list[float]:
        log.info("reference log-probs of %d of the %d sequences here", len(part), len(flat))
        return summed_logps(model, part, pad_id)

    # under accelerate launch each process scores its part; the main one writes them all
    values = map_over_processes(score, flat)
    if values is None:
        return 0
    width = 2 if paired else 1
    out_rows = [
        {"index": i, "problem_id": row["problem_id"], "logps": values[i * width : (i + 1) * width]}
        for i, row in enumerate(rows)
    ]
    write_jsonl(out_path, out_rows, schema="reference_logps")
    provenance.write(Path(out_path).parent, {"reference_rows": len(out_rows)})
    return len(out_rows)


def preference_train(
    config: dict,
    variant_name: str,
    model_path: str,
    data_dir: str,
    reference_path: str | None,
    out_dir: str,
) -> dict:
    """One round of a variant: its loss through the shared loop, from the previous policy."""
    from reasonrl.stages._train import TrainingRun
    from reasonrl.training.loop import LoopSettings, steps_for_epochs, with_accumulation
    from reasonrl.training.lora import LoraSettings
    from reasonrl.training.preference import (
        LOSSES,
        LossSettings,
        PreferenceBatches,
        PreferenceObjective,
    )

    variant = variant_settings(config, variant_name)
    section = with_accumulation(config["preference"]["train"], "preference.train")
    seed = config["seed"]
    inputs = [model_path, data_dir] + ([reference_path] if reference_path else [])
    sections = {"variant": variant, "train": section}
    lora = LoraSettings.from_config(section["lora"], "preference.train.lora")
    run = TrainingRun(
        "preference-train", out_dir, sections, inputs, seed, variant, section, lora=lora
    )
    rows = _training_rows(variant, data_dir)
    if not rows:
        raise ReasonRLError(f"{data_dir}: no training rows for variant '{variant_name}'")
    model, tokenizer = run.load_policy(model_path, config["policy"]["dtype"])
    family = LOSSES[variant["loss"]][0]
    batch_size = section["batch_size"]
    loss_units = None  # DPO and KTO micro-batches hold the same number of pairs or rows
    if family == "sft":
        batches, loss_fn, loss_units = _raft_batches(tokenizer, rows, section, seed)
    else:
        seqs = _sequences(tokenizer, variant, rows, section["max_length"])
        reference = _read_reference(reference_path, rows, family == "dpo")
        desirable = None if family == "dpo" else [r["desirable"] for r in rows]
        batches = PreferenceBatches(
            seqs, batch_size, tokenizer.pad_token_id, seed, desirable, reference
        )
        loss_fn = PreferenceObjective(
            LossSettings(variant["loss"], variant["beta"], variant["nll_weight"])
        )
    steps = steps_for_epochs(section["epochs"], len(rows), batch_size, section["grad_accum"])
    settings = LoopSettings.from_config(
        {**section, "lr": variant["lr"] or section["lr"], "max_steps": steps}, seed
    )
    result = run.fit(model, batches, loss_fn, settings, loss_units=loss_units)
    identity = {"variant": variant_name, "loss": variant["loss"], "rows": len(rows)}
    metrics = run.metrics(result, identity, {})
    run.save(result["model"], tokenizer, metrics, state_dict=result["state_dict"])
    return metrics


def _raft_batches(tokenizer, rows: list[dict], section: dict, seed: int):
    from reasonrl.chat import tokenize_chat
    from reasonrl.training.data import MicroBatches
    from reasonrl.training.lm_loss import masked_lm_loss, target_tokens

    samples = [tokenize_chat(tokenizer, r["messages"], section["max_length"]) for r in rows]
    batches = MicroBatches(
        samples, min(section["batch_size"], len(samples)), tokenizer.pad_token_id, seed, False, 16
    )
    return batches, masked_lm_loss, target_tokens


def _read_reference(path: str | None, rows: list[dict], paired: bool) -> list:
    if path is None:
        raise ReasonRLError("preference training needs the round's cached reference log-probs")
    cached = read_jsonl(path, schema="reference_logps")
    if len(cached) != len(rows):
        raise ReasonRLError(f"{path}: {len(cached)} rows, but the training data has {len(rows)}")
    for i, (entry, row) in enumerate(zip(cached, rows, strict=True)):
        if entry["index"] != i or entry["problem_id"] != row["problem_id"]:
            raise ReasonRLError(f"{path}:{i + 1}: does not belong to training row {i + 1}")
        if len(entry["logps"]) != (2 if paired else 1):
            raise ReasonRLError(f"{path}:{i + 1}: expected {2 if paired else 1} log-probs")
    return [tuple(e["logps"]) if paired else e["logps"][0] for e in cached]


# ---- best checkpoint and the table -------------------------------------------------------------


def select_best(selection_metrics: list[str], out_dir: str) -> dict:
    """The round with the highest held-out selection accuracy (the earliest on ties)."""
    rounds = []
    for path in selection_metrics:
        metrics = read_json(path)
        low, high = metrics["greedy_pass@1_ci"]
        rounds.append(
            {
                "policy": metrics["policy"],
                "selection_pass@1": metrics["greedy_pass@1"],
                "ci_low": low,
                "ci_high": high,
                "n_problems": metrics["n_problems"],
            }
        )
    best = max(rounds, key=lambda r: r["selection_pass@1"])
    result = {"best": best["policy"], "rounds": rounds}
    out = Path(out_dir)
    write_json(out / "best.json", result)
    write_csv(out / "best.csv", [{**r, "best": r is best} for r in rounds])
    return result


def preference_table(
    rows_in: list[tuple[str, str, str]], best_paths: list[str], out_dir: str
) -> list:
    """Held-out pass@1 with its bootstrap 95% CI per (label, policy, metrics path), as CSV and
    Markdown; marks the round each variant's held-out selection picked and whether a
    policy's CI lies wholly above the first row's (the SFT starting point)."""
    picked = {read_json(p)["best"] for p in best_paths}
    rows = []
    for label, policy, path in rows_in:
        metrics = read_json(path)
        low, high = metrics["greedy_pass@1_ci"]
        rows.append(
            {
                "method": label,
                "policy": policy,
                "pass@1": round(metrics["greedy_pass@1"], 4),
                "ci_low": round(low, 4),
                "ci_high": round(high, 4),
                "n_problems": metrics["n_problems"],
                "selected": policy in picked,
            }
        )
    baseline_high = rows[0]["ci_high"]
    for row in rows:
        row["ci_above_baseline"] = row["ci_low"] > baseline_high
    out = Path(out_dir)
    write_table(frame(rows), out / "table.csv", out / "table.md")
    return rows
