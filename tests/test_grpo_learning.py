"""GRPO's learning tests (issue 48) at CI size, outside `make test` (`make test-grpo`: the three
took 22 min 24 s alone on 2 cores, 2026-12-07): in the learning lane its GRPO run
took the lane from 39 to 64 minutes of a 66-minute CI, past CI's 60 with no margin for a
slower machine.

From tests/learning_start.py's seed-0 start (the learning lane's), config/tables.yaml's GRPO
variant (lr 1e-4, K 8, T 1.0, beta 0.04, async one step off-policy) with online DPO's
learning-test budget (32 steps of 16 prompts) on the frontier's online pool, compared with its
start on the frontier's 400 test problems and the easy band's 200 (non-inferiority at 0.03);
and the same variant at the samples of the default's PPO rewarded by the verifier, against
that PPO (non-inferiority at 0.03). Holm over this file's three comparisons
(docs/experiment-design.md, "GRPO in the default: measured, then moved to
config/tables.yaml", and "GRPO against PPO at equal samples: the pre-registration").
"""

from __future__ import annotations

import pytest
from learning_start import (
    EASY,
    FRONTIER,
    METHOD_SEED,
    assert_gain,
    assert_noninferior,
    holm_family,
    train_start,
)
from side_by_side import SideBySide
from test_preference_learning import NONINFERIORITY_MARGIN, online_training, ppo_training

from reasonrl.stages.data import make_pool
from reasonrl.stats.comparisons import compare

# The start (about 13 minutes alone), then side by side GRPO with its evaluations (about 12
# alone), PPO rewarded by the verifier (about 12) and GRPO at PPO's samples (about 4): the
# timeout guards against a hang.
pytestmark = [pytest.mark.learning, pytest.mark.timeout(3600)]

# GRPO at the sample budget of the default's PPO rewarded by the verifier (grpo_vs_ppo_oracle):
# PPO draws 12 iterations x 16 prompts x 4 samples = 768; tables.yaml's GRPO at its own K of 8
# draws as many over 12 steps of 8 prompts, one update a step against PPO's 2 epochs of 4
# minibatches an iteration.
PPO_SAMPLES = 12 * 16 * 4
MATCHED_BUDGET = {"steps": 12, "prompts_per_step": 8}


@pytest.fixture(scope="module")
def grpo(tmp_path_factory) -> dict:
    """The start; tables.yaml's GRPO run from it, PPO rewarded by the verifier (the default's
    ppo section) and GRPO at PPO's samples, side by side; and the file's comparisons."""
    start = train_start(
        METHOD_SEED, tmp_path_factory.mktemp(f"start{METHOD_SEED}"), (EASY, FRONTIER)
    )
    make_pool(start["config"], FRONTIER, "online_dpo", str(start["root"] / "pool-online"))
    pool = SideBySide(workers=3)
    try:
        futures = {
            "grpo": pool.submit(online_training, start, "grpo", (EASY, FRONTIER)),
            "ppo": pool.submit(ppo_training, start),
            "matched": pool.submit(
                online_training, start, "grpo", (FRONTIER,), "online-grpo-matched", MATCHED_BUDGET
            ),
        }
        runs = {name: future.result() for name, future in futures.items()}
    finally:
        pool.close()
    sft = start["eval"]
    grpo_eval, ppo_eval, matched_eval = (runs[n]["eval"] for n in ("grpo", "ppo", "matched"))
    rows = [
        compare("grpo_vs_sft", "greedy_pass@1", "grpo", "sft", grpo_eval[FRONTIER]["scores"],
                sft[FRONTIER]["scores"]),
        compare("grpo_easy_cost", "greedy_pass@1", "grpo", "sft", grpo_eval[EASY]["scores"],
                sft[EASY]["scores"], margin=NONINFERIORITY_MARGIN),
        compare("grpo_vs_ppo_oracle", "greedy_pass@1", "grpo-matched", "ppo-oracle",
                matched_eval[FRONTIER]["scores"], ppo_eval[FRONTIER]["scores"],
                margin=NONINFERIORITY_MARGIN),
    ]  # fmt: skip
    return {
        "history": runs["grpo"]["history"],
        "matched": runs["matched"],
        "ppo": runs["ppo"],
        "comparisons": holm_family("test_grpo_learning", rows),
    }


def test_grpo_beats_its_sft_start_on_the_frontier(grpo):
    # Pre-registered from the pilot on a selection split (docs/experiment-design.md, "GRPO on
    # the frontier", third round): +0.110, +0.100, +0.150 from three SFT starts, every CI above
    # 0 on 100 prompts; the share of tied groups (all right or all wrong) was 0.29-0.37. In the
    # default DAG (2026-12-07): +0.065 [+0.0325, +0.100] on the 400 test problems; here, with
    # grpo_vs_ppo_oracle in the family: +0.065 [+0.032, +0.098], p_holm 0.0006.
    history = grpo["history"]
    tied = sum(h["tied_groups"] for h in history) / len(history)
    assert tied < 0.9, f"the groups must carry a gradient: {tied:.2f} of them tied"
    assert max(h["clip_high_fraction"] for h in history) < 0.2, (
        "the updates must stay in the trust region"
    )
    assert_gain(grpo["comparisons"]["grpo_vs_sft"])


def test_grpo_costs_the_easy_band_at_most_the_margin(grpo):
    # GRPO trains on frontier prompts only, at ten times online DPO's learning rate; the pilot
    # did not measure the easy band (declared before its first measurement, 2026-12-07).
    assert_noninferior(grpo["comparisons"]["grpo_easy_cost"])


def test_grpo_does_as_well_as_ppo_with_the_verifiers_reward_at_equal_samples(grpo):
    """Critic-free against the critic (issue 48's grpo_vs_ppo_oracle): GRPO drawing the 768
    samples that PPO rewarded by the verifier draws loses at most the margin to it on the
    frontier."""
    # Pre-registered 2026-12-07 before its first run (docs/experiment-design.md, "GRPO against
    # PPO at equal samples: the pre-registration"): non-inferiority at 0.03. GRPO at 4,096
    # samples gained +0.065 on this start and PPO at 768 +0.015; GRPO at 768 was unmeasured.
    # With equal arms the power is about 0.5 at 10 % of problems discordant, 0.8 at 6 %.
    # Measured (2026-12-07, first run): GRPO 0.795 vs PPO 0.7875, +0.0075 [-0.018, +0.033],
    # one-sided p 0.0021 (p_holm 0.0021): non-inferior at 0.03.
    history = grpo["matched"]["history"]
    # one sampling batch a round (no dynamic-sampling refill): the rows trained are the draws
    assert sum(h["sampling_batches"] for h in history) == len({h["round"] for h in history})
    drawn = sum(h["samples"] for h in history)
    assert drawn == PPO_SAMPLES, drawn
    iterations = grpo["ppo"]["metrics"]["iterations"]
    assert sum(it["responses"] for it in iterations) == PPO_SAMPLES
    assert_noninferior(grpo["comparisons"]["grpo_vs_ppo_oracle"])
