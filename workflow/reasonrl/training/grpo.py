"""The GRPO family on freshly sampled groups, critic-free: GRPO (DeepSeekMath, Shao et al.
2024), Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-like training") and DAPO (Yu et al.
2025), as losses of the online learner.

Per prompt K samples make a group, each with its reward r_i (the verifier's, the RM's or both,
less the EOS penalty of a capped sample; DAPO's soft overlong penalty where asked):

    A_i = r_i - mean(group)                    scale_rewards none (Dr. GRPO)
    A_i = (r_i - mean(group)) / (std + 1e-4)   group (GRPO: the group's std), batch (the step's)

the same A_i on every token the model wrote (an interpreter turn is never an action: the chat
template's mask). Per action token t, against the policy that sampled it (pi_old, the
generator's, so an asynchronous round's lag is corrected) and the SFT reference:

    rho_t  = exp(log pi(y_t) - log pi_old(y_t))
    loss_t = -min(rho_t A_i, clip(rho_t, 1 - clip_low, 1 + clip_high) A_i) + beta * KL_t
    KL_t   = exp(ref_t - logp_t) - (ref_t - logp_t) - 1     (k3, DeepSeekMath eq. 4)

clip_high above clip_low is DAPO's clip-higher. The tokens' losses are aggregated as:

    grpo     mean over each sample's tokens, then over the samples (DeepSeekMath eq. 3)
    dapo     sum over the batch's tokens / its token count (DAPO's token-level loss)
    dr_grpo  sum over the batch's tokens / (samples x max_tokens), a constant (Dr. GRPO)

A micro-batch's loss is a mean over its samples (grpo, dr_grpo) or its tokens (dapo):
`units` says which, so a step accumulated over micro-batches is the step of one batch, as
TRL's GRPOTrainer computes it (`loss_type` grpo, dapo with its batch-wide token count, dr_grpo).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.sequences import MaskedSequence, pad_with_action_logps, predicting_logits

AGGREGATIONS = ("grpo", "dapo", "dr_grpo")
SCALES = ("group", "batch", "none")
OVERLONG = ("none", "filter", "soft")
STD_EPSILON = 1e-4  # TRL's and the papers' code: an all-equal group's advantages stay 0


@dataclass(frozen=True)
class GRPOSettings:
    scale_rewards: str = "group"  # group, batch or none (Dr. GRPO)
    aggregation: str = "grpo"  # grpo, dapo or dr_grpo
    clip_low: float = 0.2
    clip_high: float = 0.2  # DAPO's clip-higher: 0.28
    beta: float = 0.0  # the k3 KL's coefficient (DeepSeekMath 0.04; DAPO and Dr. GRPO 0)
    max_tokens: int = 2048  # Dr. GRPO's constant: the most tokens a sample may generate
    overlong: str = "none"  # none, filter (samples a token cap cut train nothing) or soft
    overlong_buffer: int = 0  # DAPO's L_cache: the soft penalty's ramp, in tokens
    dynamic_sampling: bool = False  # DAPO: drop tied groups, refill the round
    max_sampling_batches: int = 3  # a round's batches of prompts at most (the first included)

    def __post_init__(self) -> None:
        for key, value, allowed in (
            ("scale_rewards", self.scale_rewards, SCALES),
            ("aggregation", self.aggregation, AGGREGATIONS),
            ("overlong", self.overlong, OVERLONG),
        ):
            if value not in allowed:
                raise ReasonRLError(f"grpo.{key}: {value!r} is not one of {', '.join(allowed)}")
        if self.overlong == "soft" and not 0 < self.overlong_buffer < self.max_tokens:
            raise ReasonRLError(
                f"grpo.overlong_buffer: the soft penalty needs 0 < {self.overlong_buffer} < "
                f"the sample's token budget {self.max_tokens}"
            )

    @classmethod
    def from_section(cls, grpo: dict, clip: float, max_tokens: int) -> GRPOSettings:
        """From a variant's `grpo` keys; `clip`: online_dpo.clip (the lower range, and the
        upper where grpo.clip_high is null); `max_tokens`: rollout.max_total_tokens."""
        high = grpo["clip_high"]
        return cls(
            scale_rewards=grpo["scale_rewards"],
            aggregation=grpo["aggregation"],
            clip_low=clip,
            clip_high=clip if high is None else high,
            beta=grpo["beta"],
            max_tokens=max_tokens,
            overlong=grpo["overlong"],
            overlong_buffer=grpo["overlong_buffer"],
            dynamic_sampling=grpo["dynamic_sampling"],
            max_sampling_batches=grpo["max_sampling_batches"],
        )


def overlong_penalty(tokens: int, settings: GRPOSettings) -> float:
    """DAPO's soft overlong punishment (eq. 13) of a sample of `tokens` generated tokens: 0 up
    to max_tokens - overlong_buffer, then falling linearly to -1 at max_tokens, -1 beyond;
    0 unless overlong is soft."""
    if settings.overlong != "soft":
        return 0.0
    free = settings.max_tokens - settings.overlong_buffer
    if tokens <= free:
        return 0.0
    return max(-1.0, (free - tokens) / settings.overlong_buffer)


def shaped_rewards(rewards: list[float], tokens: list[int], settings: GRPOSettings) -> list[float]:
    """Each sample's reward plus DAPO's soft overlong penalty of its generated tokens (0
    unless overlong is soft): what its advantage and its group's tie are made from."""
    return [r + overlong_penalty(n, settings) for r, n in zip(rewards, tokens, strict=True)]


def tied(rewards: list[float]) -> bool:
    """Whether a group's rewards all tie: its advantages are all 0 (no policy gradient)."""
    return all(r == rewards[0] for r in rewards)


def group_advantages(rewards: torch.Tensor, k: int, scale: str) -> torch.Tensor:
    """Each sample's reward less its group's mean (rows prompt-major, K a group), divided by
    the group's std (scale group), the whole batch's (batch) or nothing (none); stds are
    Bessel-corrected, as TRL's."""
    if k < 2 or rewards.shape[0] % k:
        raise ReasonRLError(f"GRPO needs groups of K >= 2 samples per prompt (got {k})")
    groups = rewards.view(-1, k)
    centred = (groups - groups.mean(1, keepdim=True)).reshape(-1)
    if scale == "none":
        return centred
    if scale == "group":
        std = groups.std(1).repeat_interleave(k)
    else:
        std = rewards.std().expand_as(rewards)
    return centred / (std + STD_EPSILON)


@dataclass(frozen=True)
class GroupTargets:
    """Each sample's advantage and whether it trains, and the step's signals of them."""

    advantages: list[float]
    trained: list[bool]
    signals: dict[str, float]


def group_targets(
    rewards: list[float], capped: list[bool], tokens: list[int], k: int, settings: GRPOSettings
) -> GroupTargets:
    """The advantages of a step's samples (rows prompt-major, K a group) from their rewards,
    DAPO's soft overlong penalty added (overlong soft) and capped samples left out of the loss
    (overlong filter; they still count in their group's mean and std). Signals: the
    advantages' spread, the share of groups whose rewards all tie (no policy gradient: DAPO's
    dynamic sampling would drop them), the share of samples filtered and the mean penalty."""
    shaped = shaped_rewards(rewards, tokens, settings)
    advantages = group_advantages(torch.tensor(shaped), k, settings.scale_rewards)
    trained = [not (settings.overlong == "filter" and cut) for cut in capped]
    ties = [tied(shaped[start : start + k]) for start in range(0, len(shaped), k)]
    signals = {
        "advantage_std": float(advantages.std()) if len(rewards) > 1 else 0.0,
        "advantage_abs_mean": float(advantages.abs().mean()),
        "tied_groups": sum(ties) / len(ties),
        "overlong_filtered": 1.0 - sum(trained) / len(trained),
        "overlong_penalty": sum(overlong_penalty(n, settings) for n in tokens) / len(tokens),
    }
    return GroupTargets(advantages.tolist(), trained, signals)


def grpo_batch(
    seqs: list[MaskedSequence],
    behaviour_tokens: list[list[float]],
    ref_tokens: list[list[float]],
    advantages: list[float],
    trained: list[bool],
    pad_id: int,
) -> dict:
    """Padded rows with the shifted action mask (the model's own tokens; none for a sample
    `trained` leaves out, e.g. an overlong one filtered), the sampling policy's and the
    reference's log-prob of each action, and each sample's advantage."""
    per_token = {"old_logps": behaviour_tokens, "ref_token_logps": ref_tokens}
    batch = pad_with_action_logps(seqs, per_token, pad_id)
    keep = torch.tensor(trained, dtype=torch.long).unsqueeze(1)
    batch["action_mask"] = batch["action_mask"] * keep
    batch["advantages"] = torch.tensor(advantages, dtype=torch.float32)
    return batch


def action_logps_and_entropy(
    model: torch.nn.Module, batch: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi of each action token and the entropy of pi where it was chosen, [B, T-1] each
    (fp32, zero off the actions); logits are made only at the positions that predict an
    action of some row."""
    actions = batch["action_mask"].bool()
    logits, kept = predicting_logits(model, batch, torch.nn.functional.pad(actions, (1, 0)))
    logps = logits.float().log_softmax(-1)
    targets = batch["input_ids"][:, 1:][:, kept]
    picked = logps.gather(2, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():  # a signal, not a loss term
        entropy = -(logps.exp() * logps).sum(-1)
    zeros = torch.zeros(actions.shape, dtype=picked.dtype, device=picked.device)
    logps_at = zeros.index_copy(1, kept, picked).masked_fill(~actions, 0.0)
    return logps_at, zeros.index_copy(1, kept, entropy).masked_fill(~actions, 0.0)


def grpo_token_losses(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    advantages: torch.Tensor,
    settings: GRPOSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each token's loss [B, T] (before the mask and the aggregation), and its parts: the
    ratio, the k3 KL, and which tokens the clip range cut below and above."""
    ratio = torch.exp(logps - old_logps)
    a = advantages.unsqueeze(1)
    clipped = ratio.clamp(1 - settings.clip_low, 1 + settings.clip_high)
    losses = -torch.min(ratio * a, clipped * a)
    log_ratio_ref = ref_logps - logps
    kl = torch.exp(log_ratio_ref) - log_ratio_ref - 1
    if settings.beta:
        losses = losses + settings.beta * kl
    parts = {
        "ratio": ratio.detach(),
        "kl": kl.detach(),
        "clipped_low": (ratio < 1 - settings.clip_low) & (a < 0),
        "clipped_high": (ratio > 1 + settings.clip_high) & (a > 0),
    }
    return losses, parts


def aggregate(losses: torch.Tensor, mask: torch.Tensor, settings: GRPOSettings) -> torch.Tensor:
    """The micro-batch's loss from its token losses (see the module's docstring)."""
    masked = losses * mask
    if settings.aggregation == "grpo":
        return (masked.sum(1) / mask.sum(1).clamp(min=1)).mean()
    if settings.aggregation == "dapo":
        return masked.sum() / mask.sum().clamp(min=1)
    return masked.sum() / (losses.shape[0] * settings.max_tokens)


def units(batch: dict, settings: GRPOSettings) -> float:
    """What a micro-batch's loss is a mean over: its action tokens (dapo), else its samples."""
    if settings.aggregation == "dapo":
        return float(batch["action_mask"].sum())
    return float(batch["input_ids"].shape[0])


def grpo_loss(
    model: torch.nn.Module, batch: dict, settings: GRPOSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO-family loss of a micro-batch (grpo_batch's) and its signals: the policy
    loss, the k3 KL to the reference, the clipped shares (low, high), the ratio's mean and
    the policy's entropy, each a mean over the loss's units (`units`: the step's tokens for
    dapo, else each sample's token mean over the samples), so that a step's micro-batches
    log what its whole batch would."""
    logps, entropy = action_logps_and_entropy(model, batch)
    mask = batch["action_mask"].to(logps.dtype)
    losses, parts = grpo_token_losses(
        logps, batch["old_logps"], batch["ref_token_logps"], batch["advantages"], settings
    )
    loss = aggregate(losses, mask, settings)

    def mean(values: torch.Tensor) -> float:
        values = values.to(mask.dtype) * mask
        if settings.aggregation == "dapo":
            return float(values.sum() / mask.sum().clamp(min=1))
        return float((values.sum(1) / mask.sum(1).clamp(min=1)).mean())

    stats = {
        "policy_loss": float(loss.detach()),
        "kl_k3": mean(parts["kl"]),
        "clip_low_fraction": mean(parts["clipped_low"]),
        "clip_high_fraction": mean(parts["clipped_high"]),
        "ratio_mean": mean(parts["ratio"]),
        "entropy": mean(entropy),
        "tokens": float(batch["attention_mask"].sum()),
    }
    return loss, stats
