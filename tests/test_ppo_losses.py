"""PPO loss module against values computed by hand from the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from reasonrl.errors import ReasonRLError
from reasonrl.models import load_policy
from reasonrl.training.ppo import (
    PolicyCritic,
    PPOObjective,
    PPOSettings,
    clipped_policy_loss,
    clipped_value_loss,
    gae,
    normalise,
    token_rewards,
)

# Models this small run ~40x faster on one thread than on two contended cores.
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def t(*rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_gae_by_hand():
    # gamma 0.9, lam 0.8; position 0 is a prompt token (no action).
    # t=3: delta = 1.0 - 0.2 = 0.8                  A = 0.8
    # t=2: delta = 0.2 + 0.9*0.2 - 0.3 = 0.08       A = 0.08 + 0.72*0.8 = 0.656
    # t=1: delta = 0.1 + 0.9*0.3 - 0.4 = -0.03      A = -0.03 + 0.72*0.656 = 0.44232
    rewards, values = t([0.0, 0.1, 0.2, 1.0]), t([0.5, 0.4, 0.3, 0.2])
    advantages, returns = gae(rewards, values, t([0, 1, 1, 1]), gamma=0.9, lam=0.8)
    assert advantages[0].tolist() == pytest.approx([0.0, 0.44232, 0.656, 0.8])
    assert returns[0].tolist() == pytest.approx([0.0, 0.84232, 0.956, 1.0])


def test_gae_skips_non_action_tokens():
    # An interpreter token between two actions is not a step: gamma = lam = 1,
    # t=2: A = 1 - 0.4 = 0.6; t=0: delta = 0.5 + 0.4 - 0.2 = 0.7, A = 0.7 + 0.6 = 1.3.
    advantages, _ = gae(t([0.5, 9.0, 1.0]), t([0.2, 7.0, 0.4]), t([1, 0, 1]), 1.0, 1.0)
    assert advantages[0].tolist() == pytest.approx([1.3, 0.0, 0.6])


def test_token_rewards_kl_penalty_and_score_on_last_action():
    # beta 0.1: the KL term -0.1 * (logp - ref) is 0 and +0.1 on the two actions; the
    # score 2.0 lands on the last action.
    rewards = token_rewards(
        torch.tensor([2.0]), t([-1.0, -2.0, -3.0]), t([-1.5, -2.0, -2.0]), t([0, 1, 1]), 0.1
    )
    assert rewards[0].tolist() == pytest.approx([0.0, 0.0, 2.1])


def test_token_rewards_reject_row_without_actions():
    with pytest.raises(ReasonRLError, match="no response token"):
        token_rewards(torch.tensor([1.0]), t([0.0, 0.0]), t([0.0, 0.0]), t([0, 0]), 0.1)


def test_clipped_policy_loss_by_hand():
    # ratios 1.5, 0.5, 1.1; advantages 1, -1, 2; eps 0.2:
    # max(-1.5, -1.2) = -1.2; max(0.5, 0.8) = 0.8; max(-2.2, -2.2) = -2.2; mean -2.6/3.
    logps = t(math.log(1.5), math.log(0.5), math.log(1.1))
    loss, clipped = clipped_policy_loss(logps, t(0, 0, 0), t(1, -1, 2), t(1, 1, 1), 0.2)
    assert float(loss) == pytest.approx(-2.6 / 3, abs=1e-6)
    assert float(clipped) == pytest.approx(2 / 3)


def test_clipped_value_loss_by_hand():
    # clipped values 0.7, 0.3; max((1-2)^2, (0.7-2)^2) = 1.69; max(0.36, 0.09) = 0.36.
    loss = clipped_value_loss(t(1.0, 0.0), t(0.5, 0.5), t(2.0, 0.6), t(1, 1), 0.2)
    assert float(loss) == pytest.approx(0.5 * (1.69 + 0.36) / 2)


def test_normalise_whitens_masked_entries_only():
    out = normalise(t(1.0, 2.0, 3.0, 100.0), t(1, 1, 1, 0))
    assert out.tolist() == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5), 0.0], rel=1e-5)


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_policy_critic_groups_and_one_ppo_step(tiny_policy, critic):
    policy, _ = load_policy(tiny_policy)
    model = PolicyCritic(policy, critic, policy_lr=1e-3, critic_lr=1e-2)
    groups = model.optimizer_groups()
    assert [g["lr"] for g in groups] == [1e-3, 1e-2]
    policy_ids = {id(p) for p in groups[0]["params"]}
    assert policy_ids.isdisjoint(id(p) for p in groups[1]["params"])
    assert len(policy_ids) + len(groups[1]["params"]) == len(list(model.parameters()))
    if critic == "separate":  # the critic starts as a copy of the SFT trunk, not a view of it
        assert torch.equal(model.critic_trunk.embed_tokens.weight, policy.model.embed_tokens.weight)
        assert model.critic_trunk.embed_tokens.weight is not policy.model.embed_tokens.weight
    ids = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    with torch.no_grad():
        old_logps, old_values = model(ids, attention)
    assert old_logps.shape == old_values.shape == (2, 4)
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "action_mask": torch.tensor([[0, 0, 1, 1], [0, 1, 0, 0]]),
        "old_logps": old_logps,
        "old_values": old_values,
        "advantages": torch.tensor([[0.0, 0.0, 1.0, -1.0], [0.0, 1.0, 0.0, 0.0]]),
        "returns": torch.ones(2, 4),
    }
    loss, stats = PPOObjective(PPOSettings())(model, batch)
    loss.backward()
    # on-policy: ratio 1, so the policy loss is -mean(A) over the 3 actions = -(1 - 1 + 1)/3
    assert stats["policy_loss"] == pytest.approx(-1 / 3, abs=1e-6)
    assert stats["clip_fraction"] == 0.0
    assert model.value_head.weight.grad.abs().sum() > 0
    assert policy.lm_head.weight.grad.abs().sum() > 0


def test_policy_critic_puts_its_value_head_on_the_policys_device(tiny_policy):
    policy, _ = load_policy(tiny_policy)
    model = PolicyCritic(policy.to("meta"), "shared", 1e-3, 1e-3)  # meta: any non-CPU device
    assert model.value_head.weight.device.type == "meta"


def test_unknown_critic_is_an_error(tiny_policy):
    policy, _ = load_policy(tiny_policy)
    with pytest.raises(ReasonRLError, match="unknown critic"):
        PolicyCritic(policy, "twin", 1e-3, 1e-3)
