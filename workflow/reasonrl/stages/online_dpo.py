"""Stages of workflow/rules/online_dpo.smk, the asynchronous online DPO: train one variant
(sync or async), and the table."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import torch

from reasonrl.errors import ReasonRLError
from reasonrl.interrupts import raise_interrupted
from reasonrl.io import read_json, read_jsonl, write_json, write_text
from reasonrl.stats.tables import frame, markdown, write_csv

log = logging.getLogger(__name__)


def online_variant(config: dict, name: str) -> dict:
    """The variant called `name` (config key online_dpo.variants)."""
    for variant in config["online_dpo"]["variants"]:
        if variant["name"] == name:
            return variant
    names = ", ".join(v["name"] for v in config["online_dpo"]["variants"]) or "none"
    raise ReasonRLError(f"online_dpo variant '{name}' is not in online_dpo.variants ({names})")


def variant_section(config: dict, name: str) -> dict:
    """online_dpo with the variant's keys over the section's: a variant that sets its own lr,
    K or temperature (a loss tuned apart, as GRPO's) trains with them."""
    return {**config["online_dpo"], **online_variant(config, name)}


def online_dpo(
    config: dict,
    variant_name: str,
    model_path: str,
    train_path: str,
    style: str,
    threads: int,
    out_dir: str,
    reward_model: str | None = None,
    generator_gpus: int = 0,
) -> dict:
    """Online training from `model_path` (the SFT policy, also the fixed reference), samples
    scored per online_dpo.reward (`reward_model`: the BT-RM folder); writes the HF folder with
    per-step metrics (JSON + CSV) and the manifest. Under accelerate launch the learner is
    data parallel and the main process runs the generator (reasonrl.online_dpo.learner);
    `generator_gpus` 1: the generator samples on the job's GPU after the learner's."""
    from reasonrl.online_dpo.actors import GeneratorProcess, GeneratorSpec
    from reasonrl.online_dpo.learner import Learner, RoundStore, learn, loop_settings
    from reasonrl.online_dpo.settings import OnlineDPOSettings
    from reasonrl.rewards.sequence import SequenceScorer
    from reasonrl.rollout import RolloutEnvironment
    from reasonrl.rollout.generator_process import generator_devices
    from reasonrl.stages._train import TrainingRun
    from reasonrl.training.loop import is_main_process, node_processes, refuse_zero3
    from reasonrl.training.lora import LoraSettings
    from reasonrl.training.online_dpo import OnlineObjective
    from reasonrl.training.ppo import PolicyCritic

    refuse_zero3("online_dpo", "its generator is sent the main process's whole policy")
    main = is_main_process()
    section = variant_section(config, variant_name)
    max_tokens = config["rollout"]["max_total_tokens"]
    online = OnlineDPOSettings.from_section(section, config["seed"], max_tokens)
    sections = {k: config[k] for k in ("generation", "rollout", "sandbox", "policy")}
    SequenceScorer.check(online.reward, reward_model, "online_dpo.reward")
    inputs = [model_path, train_path] + ([reward_model] if reward_model else [])
    # Provenance and the checkpoints' fingerprint hash the sections as the config gives them.
    provenance = {"online_dpo": section, **sections}
    lora = LoraSettings.from_config(section["lora"], "online_dpo.lora")
    run = TrainingRun(
        "online-dpo", out_dir, provenance, inputs, config["seed"], section, sections, lora=lora
    )
    schedule = online.schedule
    # Generator and learner get half the cores each in both modes (sync: they take turns), so
    # the speedup measures the overlap alone. Sync with every thread in each phase was
    # measured 2-10x slower on a shared 2-core machine (OpenMP threads waiting on each other);
    # again on 2026-11-25: generation 11.6 and 27.0 s with 2 threads against 6.3 and 10.6 s
    # with 1 (3 steps, runs interleaved), so one thread per phase is the best sync there.
    per_process = max(1, threads // 2)
    dtype = config["policy"]["dtype"]
    with torch_threads(per_process):
        store = RoundStore(run.out.parent / f".{run.out.name}.rounds", run.fingerprint)
        spec = None
        if main:  # the rounds folder and the generator are the main process's
            store.reset_unless_resuming(run.checkpoints.latest() is not None)
            spec = GeneratorSpec(
                settings=online,
                environment=RolloutEnvironment.from_config(config),
                model_path=model_path,
                problems=read_jsonl(train_path, schema="problem"),
                style=style,
                schedule=schedule,
                first_round=store.stored(),
                threads=per_process,
                reward_model=reward_model,
                visible_devices=generator_devices(
                    os.environ.get("CUDA_VISIBLE_DEVICES"), node_processes()
                )
                if generator_gpus
                else None,
            )
        model, tokenizer = run.load_policy(model_path, dtype)
        reference = run.reference(model, model_path, dtype)
        if online.loss == "ppo":
            # The critic's value head on the policy's trunk: the learner holds no third model.
            # Its fresh weights are seeded: the same whatever ran in this process before.
            torch.manual_seed(online.seed)
            model = PolicyCritic(model, "shared", online.loop.lr, online.critic_lr)
        settings = loop_settings(online)
        objective = OnlineObjective(
            online.loss, online.beta, online.clip, online.samples_per_prompt, online.grpo
        )
        # A scheduler's SIGTERM unwinds like Ctrl-C, so the generator is stopped on the way out
        # (also when called without the CLI, which does the same).
        previous = signal.signal(signal.SIGTERM, raise_interrupted)
        try:
            with GeneratorProcess(spec) if main else nullcontext() as generator:
                learner = Learner(generator, store, schedule, online, tokenizer, reference)
                loop = run.start(model, objective, settings, learner.on_step, objective.units)
                learn(loop, learner, schedule)
                result = loop.finish()
        finally:
            signal.signal(signal.SIGTERM, previous)
        identity = {"variant": variant_name, "mode": online.mode, "loss": online.loss}
        identity.update(reward=online.reward, off_policy=online.off_policy)
        if online.grpo is not None:
            identity["grpo"] = asdict(online.grpo)
        # Which prompts each step trained on: a sync and an async run of the same config must
        # agree, or their wall-clocks measure different work.
        k = online.samples_per_prompt
        prompts = store.step_prompts(schedule, online.prompts_per_step, k) if main else []
        extra = {**timing_summary(result["history"]), "threads_per_process": per_process}
        metrics = run.metrics(result, identity, {**extra, "prompts": prompts}, timed=False)
        trained = result["model"]
        if isinstance(trained, PolicyCritic):
            run.save(trained.policy, tokenizer, metrics)
        else:
            run.save(trained, tokenizer, metrics, state_dict=result["state_dict"])
        if main:
            store.clear()
        return metrics


@contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count` inside, the caller's restored after: a caller
    in the same process (a test session, a notebook) keeps its own thread count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def timing_summary(history: list[dict]) -> dict:
    """Total wall-clock, time per phase, and the ideal async speedup from these timings."""
    gen = sum(h["gen_seconds"] for h in history)
    # The learner's own compute: each step's batch (reference log-probs, pairs) and update.
    train_s = sum(h["seconds"] + h["reference_seconds"] for h in history)
    return {
        "wall_seconds": round(history[-1]["elapsed"], 3),
        "gen_seconds": round(gen, 3),
        "train_seconds": round(train_s, 3),
        "weight_push_seconds": round(sum(h["weight_push_seconds"] for h in history), 3),
        "weight_load_seconds": round(sum(h["weight_load_seconds"] for h in history), 3),
        "data_wait_seconds": round(sum(h["data_wait_seconds"] for h in history), 3),
        "samples": _count(history, "samples"),
        "gen_tokens": _count(history, "gen_tokens"),
        "generator_weight_wait_seconds": round(
            sum(h["generator_weight_wait_seconds"] for h in history), 3
        ),
        "ideal_speedup": round((gen + train_s) / max(gen, train_s, 1e-9), 3),
    }


def _count(history: list[dict], key: str) -> int | None:
    """The total of a per-step count, or None (unknown) when some steps lack it: a run resumed
    from a checkpoint written before the count was logged."""
    if any(key not in h for h in history):
        return None
    return int(sum(h[key] for h in history))


# ---- online_dpo_table ---------------------------------------------------------------------------


def _final(history: list[dict], key: str) -> float:
    """Mean of the last quarter of the steps (one step alone is one noisy mini-batch)."""
    tail = history[-max(1, len(history) // 4) :]
    return sum(h[key] for h in tail) / len(tail)


def online_dpo_table(rows_in: list[tuple[str, str, str]], out_dir: str) -> list[dict]:
    """rows_in: (label, model folder, eval metrics.json). Writes table.md/.csv/.json and
    plot.png (reward and KL against wall-clock)."""
    out = Path(out_dir)
    runs = []
    for label, model_dir, eval_path in rows_in:
        train = read_json(Path(model_dir) / "metrics.json")
        runs.append((label, train, read_json(eval_path)))
    sync_walls = [t["wall_seconds"] for _, t, _ in runs if t["mode"] == "sync"]
    rows = []
    for label, train, evaluation in runs:
        history = train["history"]
        low, high = evaluation["greedy_pass@1_ci"]
        rows.append(
            {
                "method": label,
                "mode": train["mode"],
                "loss": train["loss"],
                "off_policy": train["off_policy"],
                "steps": train["steps"],
                "final_reward": round(_final(history, "reward"), 4),
                "final_kl": round(_final(history, "kl"), 4),
                "pass@1": evaluation["greedy_pass@1"],
                "pass@1_ci_low": low,
                "pass@1_ci_high": high,
                "wall_seconds": train["wall_seconds"],
                "gen_seconds": train["gen_seconds"],
                "train_seconds": train["train_seconds"],
                "ideal_speedup": train["ideal_speedup"] if train["mode"] == "sync" else None,
                "achieved_speedup": (
                    round(sync_walls[0] / train["wall_seconds"], 3) if sync_walls else None
                ),
            }
        )
    write_json(out / "table.json", rows)
    write_csv(frame(rows), out / "table.csv")
    write_text(out / "table.md", _markdown(rows))
    _plot([(label, train["history"]) for label, train, _ in runs], out / "plot.png")
    return rows


def _markdown(rows: list[dict]) -> str:
    table = frame(rows)

    def cell(value) -> str:
        return "" if value is None else f"{value}"

    def seconds(column: str) -> pd.Series:
        return table[column].map("{:.1f}".format)

    shown = pd.DataFrame(
        {
            "method": table["method"],
            "mode": table["mode"],
            "N": table["off_policy"],
            "steps": table["steps"],
            "final reward": table["final_reward"],
            "KL": table["final_kl"],
            "held-out pass@1 (95% CI)": [
                f"{r['pass@1']:.3f} [{r['pass@1_ci_low']:.3f}, {r['pass@1_ci_high']:.3f}]"
                for r in rows
            ],
            "wall-clock s": seconds("wall_seconds"),
            "gen s": seconds("gen_seconds"),
            "train s": seconds("train_seconds"),
            "ideal speedup (sync timings)": table["ideal_speedup"].map(cell),
            "achieved speedup": table["achieved_speedup"].map(cell),
        }
    )
    note = (
        "\nFinal reward and KL: mean of the last quarter of the steps. KL: mean log-ratio of "
        "the sampling policy to the SFT reference on the samples' sampled tokens. Achieved "
        "speedup: the first sync run's wall-clock over this run's.\n"
    )
    return markdown(shown) + note


def _plot(runs: list[tuple[str, list[dict]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for label, history in runs:
        clock = [h["elapsed"] for h in history]
        axes[0].plot(clock, [h["reward"] for h in history], marker=".", label=label)
        axes[1].plot(clock, [h["kl"] for h in history], marker=".", label=label)
    axes[0].set(xlabel="wall-clock (s)", ylabel="mean reward per step", title="Reward")
    axes[1].set(xlabel="wall-clock (s)", ylabel="KL to SFT (nats/sample)", title="KL")
    axes[0].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
