"""The GRPO family's loss (reasonrl.training.grpo): each option against its formula on a
hand-made batch, and the loss against TRL's GRPOTrainer on the same batch and log-probs."""

from __future__ import annotations

import math

import pytest
import torch
from trl_grpo import trl_grpo_loss, trl_inputs, trl_model, trl_trainer

from reasonrl.errors import ReasonRLError
from reasonrl.models import load_policy
from reasonrl.sequences import MaskedSequence
from reasonrl.training.grpo import (
    GRPOSettings,
    action_logps_and_entropy,
    aggregate,
    group_advantages,
    grpo_batch,
    grpo_loss,
    grpo_token_losses,
    overlong_penalty,
    units,
)

# ---- advantages and the overlong penalty ---------------------------------------------------


def test_group_advantages_centre_on_the_group_and_scale_by_its_bessel_std():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])  # two groups of 3
    got = group_advantages(rewards, 3, "group")
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # both groups' (n - 1) std
    expected = [2 / 3, -1 / 3, -1 / 3, -2 / 3, 1 / 3, 1 / 3]
    assert got.tolist() == pytest.approx([e / (std + 1e-4) for e in expected], rel=1e-6)


def test_dr_grpo_advantages_are_the_centred_rewards_and_batch_scale_uses_the_steps_std():
    rewards = torch.tensor([2.0, 0.0, 1.0, 1.0])
    assert group_advantages(rewards, 2, "none").tolist() == [1.0, -1.0, 0.0, 0.0]
    batch_std = float(rewards.std())
    got = group_advantages(rewards, 2, "batch")
    assert got.tolist() == pytest.approx([1 / (batch_std + 1e-4), -1 / (batch_std + 1e-4), 0, 0])


def test_an_all_equal_group_has_zero_advantage_under_every_scale():
    for scale in ("group", "batch", "none"):
        assert group_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), 2, scale)[:2].tolist() == [
            0.0,
            0.0,
        ]


def test_groups_must_have_two_samples_and_divide_the_rows():
    with pytest.raises(ReasonRLError, match="K >= 2"):
        group_advantages(torch.zeros(3), 2, "group")
    with pytest.raises(ReasonRLError, match="K >= 2"):
        group_advantages(torch.zeros(3), 1, "group")


def test_dapos_soft_overlong_penalty_ramps_over_the_buffer():
    soft = GRPOSettings(overlong="soft", max_tokens=100, overlong_buffer=20)
    assert [overlong_penalty(n, soft) for n in (10, 80, 90, 100, 130)] == [0, 0, -0.5, -1, -1]
    assert overlong_penalty(130, GRPOSettings()) == 0.0


def test_bad_settings_are_refused_naming_the_key():
    with pytest.raises(ReasonRLError, match="grpo.aggregation"):
        GRPOSettings(aggregation="mean")
    with pytest.raises(ReasonRLError, match="grpo.overlong_buffer"):
        GRPOSettings(overlong="soft", max_tokens=100, overlong_buffer=0)


# ---- token losses and aggregation against their formulas ------------------------------------


def hand_batch():
    """Two samples of 3 and 2 action tokens (padded to 3)."""
    logps = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -1.5, 0.0]])
    old = torch.tensor([[-1.5, -0.5, -1.0], [-0.1, -1.0, 0.0]])
    ref = torch.tensor([[-1.2, -0.7, -1.9], [-0.3, -1.4, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logps, old, ref, mask


def test_token_losses_follow_the_clipped_surrogate_with_clip_higher_and_the_k3_kl():
    logps, old, ref, _ = hand_batch()
    advantages = torch.tensor([1.0, -2.0])
    settings = GRPOSettings(clip_low=0.2, clip_high=0.28, beta=0.04)
    losses, parts = grpo_token_losses(logps, old, ref, advantages, settings)
    for i in range(2):
        for t in range(3):
            r = math.exp(logps[i, t] - old[i, t])
            a = float(advantages[i])
            surrogate = min(r * a, min(max(r, 0.8), 1.28) * a)
            d = float(ref[i, t] - logps[i, t])
            kl = math.exp(d) - d - 1
            assert float(losses[i, t]) == pytest.approx(-surrogate + 0.04 * kl, rel=1e-6, abs=1e-7)
            assert float(parts["kl"][i, t]) == pytest.approx(kl, abs=1e-6)  # fp32
            assert bool(parts["clipped_high"][i, t]) == (r > 1.28 and a > 0)
            assert bool(parts["clipped_low"][i, t]) == (r < 0.8 and a < 0)
    # ratio e^0.5 = 1.65 on a positive advantage: clipped above 1.28, not above 1.65
    assert bool(parts["clipped_high"][0, 0])
    assert bool(parts["clipped_low"][1, 1])  # e^-0.5 = 0.61 on a negative advantage


def test_the_kl_term_is_absent_at_beta_zero():
    logps, old, ref, _ = hand_batch()
    advantages = torch.tensor([1.0, -1.0])
    with_kl, _ = grpo_token_losses(logps, old, ref, advantages, GRPOSettings(beta=0.1))
    without, parts = grpo_token_losses(logps, old, ref, advantages, GRPOSettings(beta=0.0))
    assert torch.allclose(with_kl - without, 0.1 * parts["kl"], atol=1e-6)


def test_each_aggregation_is_its_papers_normaliser():
    losses = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])
    _, _, _, mask = hand_batch()
    grpo = aggregate(losses, mask, GRPOSettings(aggregation="grpo"))
    assert float(grpo) == pytest.approx(((1 + 2 + 3) / 3 + (4 + 5) / 2) / 2)
    dapo = aggregate(losses, mask, GRPOSettings(aggregation="dapo"))
    assert float(dapo) == pytest.approx((1 + 2 + 3 + 4 + 5) / 5)
    dr = aggregate(losses, mask, GRPOSettings(aggregation="dr_grpo", max_tokens=10))
    assert float(dr) == pytest.approx((1 + 2 + 3 + 4 + 5) / (2 * 10))


@pytest.mark.parametrize("aggregation", ["grpo", "dapo", "dr_grpo"])
def test_micro_batches_weighted_by_their_units_make_the_whole_batchs_loss(aggregation):
    """The loop weighs each micro-batch's loss by its share of the step's units: the sum
    is the loss of the step's batch in one."""
    torch.manual_seed(0)
    losses = torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]])
    settings = GRPOSettings(aggregation=aggregation, max_tokens=7)
    whole = aggregate(losses, mask.float(), settings)
    parts = [(losses[:2], mask[:2]), (losses[2:], mask[2:])]
    sizes = [units({"action_mask": m, "input_ids": m}, settings) for _, m in parts]
    weighted = sum(
        aggregate(loss, m.float(), settings) * size / sum(sizes)
        for (loss, m), size in zip(parts, sizes, strict=True)
    )
    assert float(weighted) == pytest.approx(float(whole), rel=1e-6)


# ---- on a model: masks, log-probs, entropy, and TRL's GRPOTrainer ---------------------------

PROMPT = [5, 17, 23, 42]  # every row's prompt: the same length, so TRL's left padding is none


@pytest.fixture(scope="module")
def policy(tiny_policy):
    model, tokenizer = load_policy(tiny_policy)
    return model.eval(), tokenizer


def rows() -> list[tuple[list[int], list[int]]]:
    """(completion ids, completion mask): the second and fourth hold an interpreter turn
    (mask 0 inside the completion), as a multi-turn tool trajectory does."""
    return [
        ([30, 31, 32, 33, 34], [1, 1, 1, 1, 1]),
        ([40, 41, 42, 43, 44, 45, 46], [1, 1, 0, 0, 0, 1, 1]),
        ([50, 51], [1, 1]),
        ([60, 61, 62, 63, 64, 65], [1, 0, 0, 1, 1, 1]),
    ]


def masked_sequences() -> list[MaskedSequence]:
    return [MaskedSequence(PROMPT + ids, [0] * len(PROMPT) + mask) for ids, mask in rows()]


def scored_logps(model, seqs: list[MaskedSequence], noise: float, seed: int) -> list[list[float]]:
    """Per-action log-probs of `model` plus noise: a policy that sampled them (or the
    reference) other than the one being trained."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for seq in seqs:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq.input_ids])).logits[0, :-1]
        logps = logits.log_softmax(-1).gather(1, torch.tensor(seq.input_ids[1:])[:, None])[:, 0]
        kept = [float(v) for v, m in zip(logps, seq.mask[1:], strict=True) if m]
        out.append([v + noise * float(torch.randn(1, generator=generator)) for v in kept])
    return out


def test_log_probs_and_entropy_come_only_from_the_models_own_tokens(policy):
    model, tokenizer = policy
    seqs = masked_sequences()
    zeros = [[0.0] * sum(s.mask) for s in seqs]
    batch = grpo_batch(seqs, zeros, zeros, [0.0] * 4, [True] * 4, tokenizer.pad_token_id)
    logps, entropy = action_logps_and_entropy(model, batch)
    expected = scored_logps(model, seqs, 0.0, 0)
    for i, seq in enumerate(seqs):
        actions = batch["action_mask"][i].bool()
        assert logps[i][actions].detach().tolist() == pytest.approx(expected[i], abs=1e-5)
        assert int(actions.sum()) == sum(seq.mask)
        assert bool((entropy[i][actions] > 0).all())
        assert float(logps[i][~actions].detach().abs().sum()) == 0.0


def test_a_filtered_sample_trains_nothing(policy):
    model, tokenizer = policy
    seqs = masked_sequences()
    old = scored_logps(model, seqs, 0.3, 1)
    advantages = [1.0, -1.0, 0.5, -0.5]
    kept = grpo_batch(seqs, old, old, advantages, [True, True, True, False], 0)
    assert int(kept["action_mask"][3].sum()) == 0
    settings = GRPOSettings(aggregation="dapo")
    loss, _ = grpo_loss(model, kept, settings)
    three = grpo_batch(seqs[:3], old[:3], old[:3], advantages[:3], [True] * 3, 0)
    alone, _ = grpo_loss(model, three, settings)
    assert loss.item() == pytest.approx(alone.item(), rel=1e-5)


@pytest.mark.parametrize(
    "settings",
    [
        GRPOSettings(aggregation="grpo", beta=0.04),
        GRPOSettings(aggregation="dapo", clip_low=0.2, clip_high=0.28),
        GRPOSettings(aggregation="dr_grpo", max_tokens=16, beta=0.0),
    ],
    ids=["grpo-kl", "dapo-clip-higher", "dr-grpo"],
)
def test_the_loss_equals_trls_grpo_trainer_on_the_same_batch(policy, settings):
    model, tokenizer = policy
    seqs = masked_sequences()
    old = scored_logps(model, seqs, 0.3, 1)  # large enough that some ratios clip
    ref = scored_logps(model, seqs, 0.2, 2)
    advantages = [1.0, -1.5, 0.5, -0.25]
    batch = grpo_batch(seqs, old, ref, advantages, [True] * 4, tokenizer.pad_token_id)
    ours, stats = grpo_loss(model, batch, settings)
    trainer = trl_trainer(trl_model(model), settings)
    theirs = trl_grpo_loss(trainer, trl_inputs(PROMPT, rows(), old, ref, advantages))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert stats["clip_low_fraction"] + stats["clip_high_fraction"] > 0, "some ratio must clip"
