"""Stage bodies of the PF-PPO rules besides training: strategy selection by R^2 from the SFT
policy (the paper's Table 1 and Figure 1) and the table of variants (Tables 3 and 4)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from reasonrl.errors import ReasonRLError
from reasonrl.generation import SamplingParams
from reasonrl.generation.hf import HFEngine
from reasonrl.io import (
    atomic_path,
    read_json,
    read_jsonl,
    write_csv,
    write_json,
    write_jsonl,
    write_text,
)
from reasonrl.manifest import Provenance
from reasonrl.models import load_policy
from reasonrl.rewards.sequence import SequenceScorer
from reasonrl.rollout import RolloutLimits, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.training.filtration import FilterSpec, r_squared, reward_bins, selection_probabilities
from reasonrl.training.ppo_trainer import Variant

log = logging.getLogger(__name__)


def strategy_rows(
    variants: list[Variant], groups: list[list[float]], scores: list[list[float]], bins: int
) -> tuple[list[dict], list[dict]]:
    """(one R^2 row per strategy, the reward-bin points of each) from rewards and true scores
    grouped per prompt. Every strategy weighs each response by its selection probability;
    bins are equal-width over the range of all rewards, shared by the strategies."""
    flat_rewards = [r for g in groups for r in g]
    flat_scores = [s for g in scores for s in g]
    edges = np.linspace(min(flat_rewards), max(flat_rewards), bins + 1)
    table, points = [], []
    unfiltered = Variant("unfiltered", FilterSpec("ppo-m"), "unfiltered (SFT policy)")
    for variant in [unfiltered, *variants]:
        probs = selection_probabilities(variant.filter, groups)
        weights = [w for g in probs for w in g]
        rows = reward_bins(flat_rewards, flat_scores, weights, edges)
        r2 = r_squared([b["reward"] for b in rows], [b["score"] for b in rows])
        table.append(
            {
                "strategy": variant.name,
                "label": variant.label,
                "filter": variant.filter.name,
                "r2": None if r2 is None else round(r2, 4),
                "bins": len(rows),
                "mean_score": round(float(np.average(flat_scores, weights=weights)), 4),
            }
        )
        points += [{"strategy": variant.name, **b} for b in rows]
    return table, points


def strategy_r2(
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
        SamplingParams(temperature=section["temperature"], top_p=1.0, seed=seed + 5),
        RolloutLimits.from_config(config["rollout"]),
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
    write_csv(out / "r2.csv", table)
    write_text(out / "r2.md", markdown(table))
    plot_bins(points, out / "score_by_reward_bin.png")
    provenance.write(out, {"samples": len(rows), "strategies": len(table)})
    return table


def markdown(rows: list[dict]) -> str:
    header = "| " + " | ".join(rows[0]) + " |"
    lines = [header, "|" + " --- |" * len(rows[0])]
    lines += ["| " + " | ".join(str(v) for v in row.values()) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def plot_bins(points: list[dict], path: Path) -> None:
    """Mean true score against the mean reward of each bin, one line per strategy (Fig. 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(p["strategy"] for p in points):
        mine = [p for p in points if p["strategy"] == name]
        ax.plot([p["reward"] for p in mine], [p["score"] for p in mine], marker="o", label=name)
    ax.set_xlabel("reward (bin mean)")
    ax.set_ylabel("true score (bin mean, unit tests passed)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)


def write_ppo_table(
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
    write_csv(out / "table.csv", rows)
    write_text(out / "table.md", markdown(rows))
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
