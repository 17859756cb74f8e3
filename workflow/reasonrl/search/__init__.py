"""Search with reward models: best-of-N reranking (best_of_n), HGS-PRM decoding (hgs) and
HGS-PRM's step model for tool-integrated trajectories (tool_steps, imported on its own: it
drives the rollout loop and loads models)."""

from reasonrl.search.best_of_n import (
    best_of_n_curve,
    best_of_n_expected,
    best_of_n_groups,
    best_of_n_metrics,
    matched_accuracy,
    powers_of_two,
    problem_accuracy,
    read_best_of_n,
    read_matched,
    sample_then_filter,
    samples_per_problem,
    search_arm_scores,
)
from reasonrl.search.hgs import (
    Expander,
    HGSSearch,
    Labeler,
    Sampler,
    run_hgs,
    sample_to_budget,
)

__all__ = [
    "Expander",
    "HGSSearch",
    "Labeler",
    "Sampler",
    "best_of_n_curve",
    "best_of_n_expected",
    "best_of_n_groups",
    "best_of_n_metrics",
    "matched_accuracy",
    "powers_of_two",
    "problem_accuracy",
    "read_best_of_n",
    "read_matched",
    "run_hgs",
    "sample_then_filter",
    "sample_to_budget",
    "samples_per_problem",
    "search_arm_scores",
]
