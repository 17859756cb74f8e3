"""Stages of workflow/rules/ppo.smk: PPO / PF-PPO training from the SFT policy (the run's
machinery is reasonrl.ppo.run), the R^2 strategy choice from the SFT policy (the paper's
Table 1 and Figure 1) and the table of variants (Tables 3 and 4)."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.generation import SamplingParams
from reasonrl.generation.hf import HFEngine
from reasonrl.interrupts import raise_interrupted
from reasonrl.io import read_json, read_jsonl, write_json, write_jsonl
from reasonrl.manifest import Provenance
from reasonrl.models import load_policy
from reasonrl.ppo.run import (
    BufferBatches,
    PPOObjectiveWithInfo,
    PPORun,
    Variant,
    action_tokens,
    check_buffer_steps,
    check_launch,
    compute_totals,
    find_variant,
    iteration_summary,
    plot_bins,
    strategy_rows,
)
from reasonrl.ppo.settings import PPORunSettings
from reasonrl.rewards.sequence import SequenceScorer
from reasonrl.rollout import RolloutEnvironment, RolloutSettings, run_rollouts
from reasonrl.rollout.generator_process import RolloutServer, RolloutSpec, generator_devices
from reasonrl.sandbox import Sandbox
from reasonrl.stages._train import TrainingRun
from reasonrl.stats.tables import frame, write_table
from reasonrl.training.loop import (
    LoopSettings,
    is_main_process,
    node_processes,
    with_accumulation,
)
from reasonrl.training.lora import LoraSettings

log = logging.getLogger(__name__)


def ppo(
    config: dict,
    variant_name: str,
    model_path: str,
    reward_model: str | None,
    problems_path: str,
    out_dir: str,
    generator_gpus: int = 0,
) -> dict:
    """Train one PPO variant from the SFT policy; write the best policy, metrics, manifest.
    Under accelerate launch the processes train data parallel (reasonrl.ppo.run).
    `generator_gpus` 1: the main process samples with a generator process on the job's GPU
    after the learner's, sent the policy's weights after each update."""
    check_launch(config, generator_gpus)
    section = with_accumulation(config["ppo"], "ppo")
    settings = PPORunSettings.from_section(section, config["seed"])
    variant = find_variant(section, variant_name)
    check_buffer_steps(settings, variant)
    environment = RolloutEnvironment.from_config(config)
    # A scheduler's SIGTERM unwinds like Ctrl-C, so the generator is stopped on the way out.
    previous = signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        with _server(environment, model_path, generator_gpus) as server:
            return _ppo(
                config, section, settings, environment, variant, model_path, reward_model,
                problems_path, out_dir, server, remote=bool(generator_gpus),
            )  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def _server(environment: RolloutEnvironment, model_path: str, generator_gpus: int) -> Iterator:
    """The main process's rollout server on the generator's own GPU, for the run; None on
    the other processes and without generator_gpus. Every process finds the generator's
    GPU, so a job without one fails on all of them alike (none waits on the main one)."""
    if not generator_gpus:
        yield None
        return
    visible = generator_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), node_processes())
    if not is_main_process():
        yield None
        return
    spec = RolloutSpec(environment, model_path, torch.get_num_threads(), visible)
    with RolloutServer(spec) as server:
        log.info("ppo samples with a generator process of its own (pid %s)", server.pid)
        yield server


def _ppo(
    config: dict,
    section: dict,
    settings: PPORunSettings,
    environment: RolloutEnvironment,
    variant: Variant,
    model_path: str,
    reward_model: str | None,
    problems_path: str,
    out_dir: str,
    server: RolloutServer | None,
    remote: bool,
) -> dict:
    """The run of `variant`: `section` is ppo with the job's grad_accum (provenance and the
    checkpoints' fingerprint hash it as it is), `settings` the same typed."""
    seed = settings.seed
    inputs = [model_path, problems_path] + ([reward_model] if reward_model else [])
    provenance = {"ppo": section, "policy": config["policy"]}
    lora = LoraSettings.from_config(section["lora"], "ppo.lora")
    run = TrainingRun(
        "ppo", out_dir, provenance, inputs, seed, variant.name, section, seed, lora=lora
    )
    problems = read_jsonl(problems_path, schema="problem")
    if not problems:
        raise ReasonRLError(f"{problems_path}: no problems to train on")
    dtype = config["policy"]["dtype"]
    policy, tokenizer = run.load_policy(model_path, dtype)
    reference = run.reference(policy, model_path, dtype)
    models = (policy, tokenizer, reference)
    critic_adapters = partial(run.adapt, task="FEATURE_EXTRACTION")  # a bare trunk
    ppo_run = PPORun(
        settings, environment, variant, models, reward_model, problems, run.checkpoints.folder,
        critic_adapters, start_path=model_path, server=server, remote=remote,
    )  # fmt: skip
    per = ppo_run.steps_per_iteration
    loop_settings = LoopSettings(
        max_steps=settings.iterations * per,
        lr=settings.policy_lr,
        grad_accum=settings.grad_accum,
        max_grad_norm=settings.max_grad_norm,
        lr_schedule=settings.lr_schedule,
        optimizer=settings.optimizer,
        gradient_checkpointing=settings.gradient_checkpointing,
        checkpoint_every=per * settings.checkpoint_iterations,
        log_every=per,
        seed=seed,
    )
    objective = PPOObjectiveWithInfo(settings.loss)
    loop = run.start(ppo_run.model, objective, loop_settings, loss_units=action_tokens)
    ppo_run.trained_by(loop.model)
    for iteration in range(loop.step // per, settings.iterations):
        info = ppo_run.start_iteration(iteration, fresh=iteration == 0)  # held-out score, best
        buffer = ppo_run.fill_buffer(iteration, info)  # generate -> score -> filter -> GAE
        loop.run(BufferBatches(ppo_run, iteration, buffer, info), per)  # the update
        ppo_run.policy_changed()
    result = loop.finish(gather=False)  # it saves the best iteration's weights
    final = ppo_run.evaluate(seed + 991)
    ppo_run.keep_if_best(settings.iterations, final)
    best = ppo_run.restore_best()
    iterations = iteration_summary(result["history"])
    identity = {
        "variant": variant.name,
        "filter": variant.filter.name,
        "label": variant.label,
        "steps_per_iteration": per,
    }
    extra = {
        "best_iteration": best["iteration"],
        "best_heldout": {"pass": best["key"][0], "reward": best["key"][1]},
        "final_heldout": final,
        "compute": compute_totals(iterations),
        "iterations": iterations,
    }
    metrics = run.metrics(result, identity, extra)
    summary = {"best_iteration": best["iteration"], "compute": metrics["compute"]}
    state = ppo_run.policy_state()  # the best weights gathered where ZeRO-3 shards them
    run.save(ppo_run.model.policy, ppo_run.tokenizer, metrics, state, summary=summary)
    return metrics


def ppo_r2(
    config: dict, model: str, reward_model: str, problems_path: str, out_dir: str
) -> list[dict]:
    """Sample N responses per prompt from the SFT policy, score them with the reward model and
    the verifier, and write R^2 of score ~ reward over reward bins for every ppo variant."""
    section, seed = config["ppo"], config["seed"]
    r2 = section["r2"]
    provenance = Provenance("ppo-r2", {"ppo": section}, [model, reward_model, problems_path], seed)
    problems = read_jsonl(problems_path, schema="problem")[: r2["prompts"]]
    if not problems:
        raise ReasonRLError(f"{problems_path}: no problems to sample")
    policy, tokenizer = load_policy(model, config["policy"]["dtype"])
    n = section["responses_per_prompt"]
    rows = run_rollouts(
        HFEngine(policy, tokenizer, config["generation"]["batch_size"]),
        problems,
        section["style"],
        n,
        SamplingParams.from_section(section, seed + 5),
        RolloutSettings.from_config(config["rollout"]),
        Sandbox.from_config(config["sandbox"]),
        Path(model).name,
    )
    rewards = SequenceScorer("rm", reward_model, config["policy"]["dtype"], "ppo.reward").rm(rows)
    groups = [rewards[p * n : (p + 1) * n] for p in range(len(problems))]
    correct = [float(r["correct"]) for r in rows]
    scores = [correct[p * n : (p + 1) * n] for p in range(len(problems))]
    variants = [Variant.from_config(v, section) for v in section["variants"]]
    table, points = strategy_rows(variants, groups, scores, r2["bins"])
    out = Path(out_dir)
    write_jsonl(out / "samples.jsonl", rows, schema="trajectory")
    write_json(out / "rewards.json", {"rewards": rewards})
    write_json(out / "r2.json", {"strategies": table, "bins": points})
    write_table(frame(table), out / "r2.csv", out / "r2.md")
    plot_bins(points, out / "score_by_reward_bin.png")
    provenance.write(out, {"samples": len(rows), "strategies": len(table)})
    return table


def ppo_table(
    sft_eval: str, variant_rows: list[tuple[str, str, str]], r2_path: str, out_dir: str
) -> list[dict]:
    """Held-out pass@1 (bootstrap 95% CI) of SFT and of each variant beside its R^2 from the
    SFT policy, its compute per iteration and its last iteration's held-out score.
    variant_rows: (name, eval metrics, model dir)."""
    r2 = {row["strategy"]: row["r2"] for row in read_json(r2_path)["strategies"]}
    rows = [_table_row("SFT", read_json(sft_eval), r2.get("unfiltered"), None)]
    for name, eval_path, model_dir in variant_rows:
        train_metrics = read_json(Path(model_dir) / "metrics.json")
        rows.append(_table_row(name, read_json(eval_path), r2.get(name), train_metrics))
    out = Path(out_dir)
    write_table(frame(rows), out / "table.csv", out / "table.md")
    return rows


def _table_row(name: str, metrics: dict, r2, train: dict | None) -> dict:
    low, high = metrics["greedy_pass@1_ci"]
    compute = (train or {}).get("compute", {})
    final = (train or {}).get("final_heldout", {})
    return {
        "method": train["label"] if train else name,
        "pass@1": round(metrics["greedy_pass@1"], 4),
        "ci_low": round(low, 4),
        "ci_high": round(high, 4),
        "n_problems": metrics["n_problems"],
        "r2_sft": r2,
        "queries/iter": compute.get("queries"),
        "responses/iter": compute.get("responses"),
        "rm_passes/iter": compute.get("rm_passes"),
        "policy_passes/iter": compute.get("policy_passes"),
        "critic_passes/iter": compute.get("critic_passes"),
        "best_iteration": (train or {}).get("best_iteration"),
        # The last iteration's policy on the held-out train prompts (the test-split pass@1
        # above is the best iteration's, which is the SFT policy when no iteration beat it).
        "final_heldout_pass": final.get("heldout_pass"),
        "final_heldout_reward": _rounded(final.get("heldout_reward")),
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
