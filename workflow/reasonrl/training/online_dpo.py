"""Asynchronous online DPO losses on freshly sampled trajectories (asynchronous RLHF paper).

- Online DPO: per prompt, the best and the worst of K samples by reward make the pair (ties
  dropped and counted); the loss is the DPO loss of reasonrl.training.preference against a
  reference fixed at the SFT policy, log-probs summed over the model's own turns (M-DPO masks).
- PPO: policy plus a critic (value head on the policy's trunk), per-token KL penalty to the
  SFT policy, GAE with the critic's values from before the step, advantages whitened over the
  step, clipped surrogate with the generating policy as the old one, one epoch per mini-batch
  (the paper's setting), from reasonrl.training.ppo.
- Proximal RLOO (paper, appendix B): RLOO's leave-one-out advantage of the KL-penalised reward,
  with a PPO-style clipped importance ratio pi(y|x) / pi_gen(y|x) to the policy that generated
  the sample, so off-policy samples are corrected and large steps are cut.

Rewards come from the verifier (arith answer check), the Bradley-Terry RM, or both combined
(reasonrl.rewards.sequence), minus an EOS penalty for samples cut by a token cap (they never
ended their turn).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.sequences import MaskedSequence, pad_sequences, pad_with_action_logps, sequence_logps
from reasonrl.training.grpo import GRPOSettings, grpo_loss
from reasonrl.training.grpo import units as grpo_units
from reasonrl.training.loop import data_parallel_processes
from reasonrl.training.ppo import (
    PolicyCritic,
    PPOSettings,
    clipped_policy_loss,
    clipped_value_loss,
    gae,
    masked_mean,
    normalise,
    token_rewards,
)
from reasonrl.training.preference import LossSettings, PreferenceObjective

TRUNCATED = ("turn_token_cap", "total_token_cap")


def sample_reward(score: float, finish_reason: str, eos_penalty: float) -> float:
    """The sample's score (verifier or BT-RM), minus `eos_penalty` when a token cap cut it."""
    return score - (eos_penalty if finish_reason in TRUNCATED else 0.0)


@dataclass(frozen=True)
class PairChoice:
    """Indices (into one prompt's K samples) of the best and worst sample, or None on a tie."""

    best: int
    worst: int
    margin: float


def best_worst(rewards: list[float]) -> PairChoice | None:
    """Best vs worst of one prompt's samples (first index wins ties); None when all tie."""
    best = max(range(len(rewards)), key=lambda i: rewards[i])
    worst = min(range(len(rewards)), key=lambda i: rewards[i])
    if rewards[best] == rewards[worst]:
        return None
    return PairChoice(best, worst, rewards[best] - rewards[worst])


def proximal_rloo_loss(
    logps: torch.Tensor,
    behaviour_logps: torch.Tensor,
    ref_logps: torch.Tensor,
    rewards: torch.Tensor,
    k: int,
    beta: float,
    clip: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Proximal RLOO over rows grouped K per prompt (prompt-major).

    reward' = reward - beta * (log pi_gen - log pi_ref)  (sequence KL penalty, no gradient)
    A_i = reward'_i - mean_{j != i} reward'_j            (leave-one-out baseline)
    rho_i = exp(log pi(y_i) - log pi_gen(y_i))
    loss = -mean_i min(rho_i A_i, clip(rho_i, 1 - clip, 1 + clip) A_i)
    """
    if k < 2 or logps.shape[0] % k:
        raise ReasonRLError(f"Proximal RLOO needs K >= 2 samples per prompt (got {k})")
    shaped = (rewards - beta * (behaviour_logps - ref_logps)).view(-1, k)
    baseline = (shaped.sum(1, keepdim=True) - shaped) / (k - 1)
    advantages = (shaped - baseline).reshape(-1).detach()
    ratio = torch.exp(logps - behaviour_logps)
    clipped = torch.clamp(ratio, 1 - clip, 1 + clip)
    loss = -torch.min(ratio * advantages, clipped * advantages).mean()
    stats = {
        "ratio_mean": float(ratio.detach().mean()),
        "clipped_fraction": float(((ratio - 1).abs() > clip).float().mean()),
    }
    return loss, stats


def online_ppo_settings(beta: float, clip: float) -> PPOSettings:
    """PPO's settings from online_dpo's keys: beta the KL penalty, clip the ratio's epsilon."""
    return PPOSettings(beta=beta, clip_ratio=clip)


def critic_values(model: PolicyCritic, batch: dict) -> torch.Tensor:
    """The critic's value of each prefix [B, T-1], in fp32 on the CPU beside the batch."""
    return model(batch["input_ids"], batch["attention_mask"])[1].float().cpu()


def add_ppo_targets(batches: list[dict], values: list[torch.Tensor], settings: PPOSettings) -> None:
    """Each micro-batch of one optimizer step gets its old values, returns and advantages,
    from `values` (critic_values before the step's update, one tensor per micro-batch):

    r_t = -beta (log pi_gen - log pi_sft) on each action, + the sequence reward on the last;
    advantages by GAE over each row's actions, whitened over the whole step's action tokens
    (not each micro-batch's), so the micro-batches train as the step's batch would in one.
    """
    raw = []
    for batch, old in zip(batches, values, strict=True):
        mask = batch["action_mask"].float()
        rewards = token_rewards(
            batch["scores"], batch["old_logps"], batch["ref_token_logps"], mask, settings.beta
        )
        advantages, returns = gae(rewards, old, mask, settings.gamma, settings.lam)
        batch.update(old_values=old, returns=returns)
        raw.append(advantages)
    actions = [batch["action_mask"].bool() for batch in batches]
    whitened = normalise(torch.cat([a[m] for a, m in zip(raw, actions, strict=True)]))
    parts = whitened.split([int(m.sum()) for m in actions])
    for batch, advantages, m, part in zip(batches, raw, actions, parts, strict=True):
        batch["advantages"] = torch.zeros_like(advantages).masked_scatter(m, part)


def online_ppo_loss(
    model: PolicyCritic, batch: dict, settings: PPOSettings
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO on a micro-batch of generated samples with its add_ppo_targets, the old policy
    being the one that generated them (so the ratio corrects the learner's lag behind the
    generator): clipped surrogate + value_coef * clipped value loss (PPO's,
    reasonrl.training.ppo), both means over the action tokens."""
    logps, values = model(batch["input_ids"], batch["attention_mask"])
    mask = batch["action_mask"].to(logps.dtype)
    policy_loss, clip_fraction = clipped_policy_loss(
        logps, batch["old_logps"], batch["advantages"], mask, settings.clip_ratio
    )
    value_loss = clipped_value_loss(
        values, batch["old_values"], batch["returns"], mask, settings.value_clip
    )
    stats = {
        "policy_loss": float(policy_loss.detach()),
        "value_loss": float(value_loss.detach()),
        "clip_fraction": float(clip_fraction),
        "ratio_mean": float(masked_mean(torch.exp(logps.detach() - batch["old_logps"]), mask)),
        "tokens": float(batch["attention_mask"].sum()),
    }
    return policy_loss + settings.value_coef * value_loss, stats


class OnlineObjective:
    """loss_fn(model, batch) for the shared loop: "dpo" (best/worst pairs, PreferenceObjective
    with M-DPO masks and cached SFT reference log-probs), "rloo" (Proximal RLOO), "ppo"
    (the model a PolicyCritic; one PPO epoch per mini-batch, as in the paper) or "grpo" (the
    GRPO family, reasonrl.training.grpo, with `grpo`'s options).

    A batch is one micro-batch of a step (whole prompts: a prompt's pair or K samples in one);
    each loss is a mean over its pairs, rows or action tokens (`units`, the loop's
    LossUnits), which weigh the step's micro-batches. A DPO micro-batch without a pair (every
    prompt tied) trains nothing.
    """

    def __init__(
        self, loss: str, beta: float, clip: float, k: int, grpo: GRPOSettings | None = None
    ):
        if (loss == "grpo") != (grpo is not None):
            raise ReasonRLError("online_dpo: the grpo options go with loss grpo, and only with it")
        self.loss = loss
        self.beta = beta
        self.clip = clip
        self.k = k
        self.dpo = PreferenceObjective(LossSettings(name="mdpo", beta=beta))
        self.ppo = online_ppo_settings(beta, clip)
        self.grpo = grpo

    def units(self, batch: dict) -> float:
        """What this loss is a mean over in `batch` (loss_normaliser; the GRPO family's
        aggregation says for grpo)."""
        if self.grpo is not None:
            return grpo_units(batch, self.grpo)
        return loss_normaliser(self.loss, batch)

    def __call__(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        if batch["input_ids"].shape[0] == 0:
            return no_rows_loss(model, data_parallel_processes()), {"tokens": 0.0}
        if self.loss == "dpo":
            return self.dpo(model, batch)
        if self.loss == "ppo":
            return online_ppo_loss(model, batch, self.ppo)
        if self.grpo is not None:
            return grpo_loss(model, batch, self.grpo)
        logps, _ = sequence_logps(model, batch)
        loss, stats = proximal_rloo_loss(
            logps,
            batch["behaviour_logps"],
            batch["ref_logps"],
            batch["rewards"],
            self.k,
            self.beta,
            self.clip,
        )
        stats["tokens"] = float(batch["attention_mask"].sum())
        return loss, stats


def no_rows_loss(model: torch.nn.Module, processes: int) -> torch.Tensor:
    """The loss of a micro-batch with no rows (every prompt of it tied: no DPO pair). Over
    several processes, zero times every trained weight, so that its backward still gives each
    a (zero) gradient: a process's backward joins the step's gradient reduction under
    DeepSpeed's ZeRO-2, which reduces what the backward produced, and a loss tied to no
    weight gives it nothing to reduce (its bucket is empty: IndexError) while the others
    wait. In one process, a loss tied to no weight: a step whose micro-batches all have no
    rows leaves every gradient None, so AdamW moves nothing (zero gradients would still move
    the weights by its momentum and weight decay)."""
    if processes == 1:
        return torch.zeros((), requires_grad=True)
    trained = [p for p in model.parameters() if p.requires_grad]
    return sum((p.sum() for p in trained), torch.zeros((), device=trained[0].device)) * 0.0


def loss_normaliser(loss: str, batch: dict) -> float:
    """What a micro-batch's loss is a mean over: its DPO pairs, RLOO rows or PPO action
    tokens (the count its share of the step's loss is made of)."""
    if loss == "ppo":
        return float(batch["action_mask"].sum())
    rows = batch["input_ids"].shape[0]
    return rows / 2 if loss == "dpo" else float(rows)


def dpo_batch(
    seqs: list[MaskedSequence], ref_logps: list[float], pairs: list[tuple[int, int]], pad_id: int
) -> dict:
    """Chosen rows first, then rejected (the PreferenceObjective layout), with reference
    log-probs; `pairs` index into `seqs`."""
    if not pairs:
        return {"input_ids": torch.zeros((0, 0), dtype=torch.long)}
    order = [c for c, _ in pairs] + [r for _, r in pairs]
    batch = pad_sequences([seqs[i] for i in order], pad_id)
    batch["ref_logps"] = torch.tensor([ref_logps[i] for i in order], dtype=torch.float32)
    return batch


def ppo_batch(
    seqs: list[MaskedSequence],
    behaviour_tokens: list[list[float]],
    ref_tokens: list[list[float]],
    rewards: list[float],
    pad_id: int,
) -> dict:
    """Padded rows with the shifted action mask (the model's own tokens), the generating
    policy's and the SFT reference's log-prob of each action, and the sequence rewards."""
    per_token = {"old_logps": behaviour_tokens, "ref_token_logps": ref_tokens}
    batch = pad_with_action_logps(seqs, per_token, pad_id)
    batch["scores"] = torch.tensor(rewards, dtype=torch.float32)
    return batch


def rloo_batch(
    seqs: list[MaskedSequence],
    ref_logps: list[float],
    behaviour_logps: list[float],
    rewards: list[float],
    pad_id: int,
) -> dict:
    batch = pad_sequences(seqs, pad_id)
    batch["ref_logps"] = torch.tensor(ref_logps, dtype=torch.float32)
    batch["behaviour_logps"] = torch.tensor(behaviour_logps, dtype=torch.float32)
    batch["rewards"] = torch.tensor(rewards, dtype=torch.float32)
    return batch
