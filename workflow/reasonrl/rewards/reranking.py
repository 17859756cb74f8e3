"""Every reward model's score of every sampled solution (best-of-N reranking's input), and the
PRM's step verdicts."""

from __future__ import annotations

from reasonrl.chat import render
from reasonrl.rewards.models import load_reward_model
from reasonrl.rewards.scoring import (
    AGGREGATIONS,
    aggregate,
    bt_scores,
    orm_scores,
    score_steps,
    step_classes,
    step_goodness,
)
from reasonrl.rewards.settings import RewardModelSettings
from reasonrl.rewards.steps import solution_step_texts


def score_samples(
    settings: RewardModelSettings,
    dtype: str,
    problems: dict[str, dict],
    rows: list[dict],
    models: dict[str, str],
) -> list[dict]:
    """Every reward model's score of every sampled solution, and the PRM's step verdicts
    (`settings`: the steps' splitter and the neutral band; `dtype`: the policy's, the reward
    models are loaded in it)."""
    split = settings.step_splitter, settings.split_pattern
    items = [
        (
            problems[r["problem_id"]]["question"],
            solution_step_texts(problems[r["problem_id"]], r["messages"], *split),
        )
        for r in rows
    ]
    scored = [
        {
            "problem_id": r["problem_id"],
            "sample": r["sample"],
            "correct": r["correct"],
            "scores": {},
        }
        for r in rows
    ]
    for kind, folder in models.items():
        model, tokenizer, info = load_reward_model(folder, dtype)
        if kind == "bt":
            values = bt_scores(model, tokenizer, [render(tokenizer, r["messages"]) for r in rows])
            for s, v in zip(scored, values, strict=True):
                s["scores"]["bt"] = v
        elif kind == "orm":
            for s, v in zip(scored, orm_scores(model, tokenizer, items), strict=True):
                s["scores"]["orm"] = v
        else:
            labels = info["labels"]
            probs = score_steps(model, tokenizer, items, labels)
            for s, p in zip(scored, probs, strict=True):
                goodness = step_goodness(p, labels)
                for how in AGGREGATIONS:
                    s["scores"][f"prm-{how}"] = aggregate(goodness, how)
                s["step_labels"] = step_classes(p, labels, settings.hgs.neutral_band)
    return scored
