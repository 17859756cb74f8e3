"""PPO losses for RLHF (PPO-S, PPO-M and PF-PPO share them; filtration only changes sampling).

One module for the PPO family, written from the PF-PPO paper (eq. 4) and the usual RLHF PPO
recipe it follows:

- per-token reward: -beta * (log pi - log pi_SFT) on every response token, plus the
  (normalised) reward-model score on the last one;
- GAE over the response tokens only (prompt and interpreter tokens are not actions);
- advantage whitening over the buffer's response tokens;
- clipped surrogate for the policy and clipped value loss for the critic.

Tensors are "shifted": position j of a [B, T-1] tensor is the prediction of token j + 1 from
the prefix up to j, so log pi(token j+1), V(prefix up to j) and the action mask line up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AutoModel

from reasonrl.errors import ReasonRLError
from reasonrl.sequences import action_logps
from reasonrl.training.loop import enable_gradient_checkpointing
from reasonrl.training.lora import merged_state_dict

CRITIC_KINDS = ("separate", "shared")


@dataclass(frozen=True)
class PPOSettings:
    beta: float = 0.05  # the KL coefficient, named as in every method
    gamma: float = 1.0
    lam: float = 0.95
    clip_ratio: float = 0.2
    value_clip: float = 0.2
    value_coef: float = 0.5

    @classmethod
    def from_config(cls, section: dict) -> PPOSettings:
        return cls(**{k: section[k] for k in cls.__dataclass_fields__})


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


def normalise(values: torch.Tensor, mask: torch.Tensor | None = None, eps: float = 1e-8):
    """(values - mean) / std over the entries `mask` selects (all when None); the rest are 0."""
    if mask is None:
        mask = torch.ones_like(values)
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def token_rewards(
    scores: torch.Tensor,
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    action_mask: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Eq. 4 as per-token rewards: -beta * (log pi - log pi_SFT) on each action, plus the
    sequence score on the row's last action."""
    rewards = -beta * (logps - ref_logps) * action_mask
    positions = torch.arange(action_mask.shape[1], device=action_mask.device)
    last = (positions * action_mask.long()).argmax(dim=1)
    if bool((action_mask.sum(dim=1) == 0).any()):
        raise ReasonRLError("a PPO row has no response token to reward")
    rewards[torch.arange(len(scores)), last] += scores
    return rewards


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(advantages, returns) by generalised advantage estimation over the action positions.

    Non-action positions (interpreter turns in a multi-turn trajectory, padding) are skipped:
    the next action's value and the running estimate carry over them; after the last action
    the episode ends (next value 0).
    """
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        act = action_mask[:, t].bool()
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        step = delta + gamma * lam * running
        running = torch.where(act, step, running)
        next_value = torch.where(act, values[:, t], next_value)
        advantages[:, t] = torch.where(act, step, torch.zeros_like(step))
    return advantages, (advantages + values) * action_mask


def clipped_policy_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    clip_ratio: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean over actions of max(-A r, -A clip(r, 1-e, 1+e)), fraction of clipped actions)."""
    ratio = torch.exp(logps - old_logps)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_ratio, 1 + clip_ratio)
    loss = masked_mean(torch.maximum(unclipped, clipped), action_mask)
    clip_fraction = masked_mean((clipped > unclipped).float(), action_mask)
    return loss, clip_fraction


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    action_mask: torch.Tensor,
    value_clip: float,
) -> torch.Tensor:
    """0.5 * mean over actions of max((V - R)^2, (V_old + clip(V - V_old, +-e) - R)^2)."""
    clipped = old_values + (values - old_values).clamp(-value_clip, value_clip)
    worst = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return 0.5 * masked_mean(worst, action_mask)


class PolicyCritic(nn.Module):
    """The policy and its critic, trained together by the shared loop.

    critic="separate": the value head sits on its own copy of the SFT model (the paper's
    setup); critic="shared": on the policy's last hidden states (half the memory).
    The policy and the critic get their own learning rates (optimizer_groups). Under LoRA the
    policy comes with its adapters and `adapt` puts the run's on the separate critic's trunk
    (a copy of the policy's merged weights); the value head, new, always trains in full.
    """

    def __init__(
        self,
        policy: nn.Module,
        critic: str,
        policy_lr: float,
        critic_lr: float,
        adapt: Callable[[nn.Module], nn.Module] | None = None,
    ):
        super().__init__()
        if critic not in CRITIC_KINDS:
            raise ReasonRLError(f"unknown critic {critic!r} (expected one of {CRITIC_KINDS})")
        self.policy = policy
        self.critic_trunk = None
        if critic == "separate":
            trunk = AutoModel.from_config(policy.config)
            weights = merged_state_dict(policy)  # the plain model's keys, adapters or not
            trunk.load_state_dict(
                {k.removeprefix("model."): v for k, v in weights.items() if k.startswith("model.")}
            )
            self.critic_trunk = adapt(trunk) if adapt else trunk
        self.value_head = nn.Linear(policy.config.hidden_size, 1)
        nn.init.normal_(self.value_head.weight, std=1.0 / (policy.config.hidden_size + 1))
        nn.init.zeros_(self.value_head.bias)
        # The new critic parts join the policy on its device (the GPU load_policy chose).
        self.to(next(policy.parameters()).device)
        self.policy_lr, self.critic_lr = policy_lr, critic_lr

    supports_gradient_checkpointing = True  # for the loop's gradient_checkpointing

    def activation_checkpointing_enable(self, options: dict) -> None:
        """Recompute each decoder layer in the backward pass, in the policy and in a separate
        critic's trunk (transformers' own checkpointing on each model)."""
        for model in (self.policy, self.critic_trunk):
            if model is not None:
                enable_gradient_checkpointing(model)

    def critic_parameters(self) -> list[nn.Parameter]:
        trunk = list(self.critic_trunk.parameters()) if self.critic_trunk is not None else []
        return trunk + list(self.value_head.parameters())

    def optimizer_groups(self) -> list[dict]:
        """The policy's and the critic's parameters with their own learning rates."""
        return [
            {"params": list(self.policy.parameters()), "lr": self.policy_lr},
            {"params": self.critic_parameters(), "lr": self.critic_lr},
        ]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """(log pi of each next token [B, T-1], V of each prefix [B, T-1])."""
        shared = self.critic_trunk is None
        out = self.policy(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=shared,
            use_cache=False,
        )
        if shared:
            hidden = out.hidden_states[-1]
        else:
            hidden = self.critic_trunk(
                input_ids=input_ids, attention_mask=attention_mask, use_cache=False
            ).last_hidden_state
        values = self.value_head(hidden.float()).squeeze(-1)[:, :-1]
        return action_logps(out.logits, input_ids), values


class PPOObjective:
    """loss_fn(model, batch) for the shared training loop: policy + value_coef * critic loss.

    A batch holds input_ids, attention_mask, action_mask (shifted) and the buffer's
    old_logps, old_values, advantages and returns. Counted passes come back in the stats.
    """

    def __init__(self, settings: PPOSettings):
        self.settings = settings

    def __call__(self, model: PolicyCritic, batch: dict) -> tuple[torch.Tensor, dict]:
        s = self.settings
        logps, values = model(batch["input_ids"], batch["attention_mask"])
        mask = batch["action_mask"].to(logps.dtype)
        policy_loss, clip_fraction = clipped_policy_loss(
            logps, batch["old_logps"], batch["advantages"], mask, s.clip_ratio
        )
        value_loss = clipped_value_loss(
            values, batch["old_values"], batch["returns"], mask, s.value_clip
        )
        loss = policy_loss + s.value_coef * value_loss
        stats = {
            "policy_loss": float(policy_loss.detach()),
            "value_loss": float(value_loss.detach()),
            "clip_fraction": float(clip_fraction),
            "approx_kl": float(masked_mean(batch["old_logps"] - logps.detach(), mask)),
            "tokens": float(batch["attention_mask"].sum()),
        }
        return loss, stats
