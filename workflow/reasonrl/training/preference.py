"""Preference losses over tool-integrated trajectories: M-DPO, M-KTO, and their baselines.

One module for the whole family. A trajectory's log-probability is summed over the tokens a
mask selects:

- multi-turn (M-DPO, M-KTO): only the model's own turns, from the chat-template spans
  (reasonrl.chat), so prompt and interpreter tokens never enter the log-ratio;
- single-turn (DPO, KTO baselines): every token after the prompt, interpreter output
  included, as if the whole trajectory were one response.

RAFT (SFT on correct trajectories) is the same masked next-token loss as SFT.
Reference log-probs are computed once per round (reasonrl.sequences.summed_logps) and cached
with the data, so training keeps only the policy resident; a live reference model is supported
for the benchmark that measures what the cache saves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from reasonrl.errors import ReasonRLError
from reasonrl.sequences import (
    encode_step_pair,
    encode_trajectory,
    pad_sequences,
    sequence_logps,
)

# loss name -> (family, multi_turn)
LOSSES = {
    "mdpo": ("dpo", True),
    "mkto": ("kto", True),
    "dpo": ("dpo", False),
    "kto": ("kto", False),
    "raft": ("sft", True),
}


@dataclass(frozen=True)
class LossSettings:
    name: str = "mdpo"
    beta: float = 0.1
    nll_weight: float = 0.0
    lambda_desirable: float = 1.0
    lambda_undesirable: float = 1.0

    @property
    def family(self) -> str:
        return LOSSES[self.name][0]

    @property
    def multi_turn(self) -> bool:
        return LOSSES[self.name][1]


def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float,
) -> torch.Tensor:
    """Per-pair -log sigma(beta * [(log pi/pi_ref)(chosen) - (log pi/pi_ref)(rejected)]).

    With log-probs summed over the model's turns this is the M-DPO loss (12) of the paper.
    """
    margin = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin)


def kto_loss(
    policy: torch.Tensor,
    reference: torch.Tensor,
    desirable: torch.Tensor,
    beta: float,
    lambda_desirable: float = 1.0,
    lambda_undesirable: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row lambda_y - v(x, y) of the (M-)KTO loss (13), and the reference point z0.

    z0 estimates the KL between policy and reference from the batch: the mean log-ratio of
    its rows, clipped at 0 and not differentiated (as in KTO). The rows are the batch's own
    trajectories, not completions shifted across prompts: in a multi-turn trajectory that
    would pair one prompt's interpreter outputs with another prompt's code.
    """
    ratio = policy - reference
    z0 = ratio.mean().clamp(min=0).detach()
    value = torch.where(
        desirable,
        lambda_desirable * torch.sigmoid(beta * (ratio - z0)),
        lambda_undesirable * torch.sigmoid(beta * (z0 - ratio)),
    )
    lambdas = torch.where(
        desirable,
        torch.full_like(ratio, lambda_desirable),
        torch.full_like(ratio, lambda_undesirable),
    )
    return lambdas - value, z0


class PreferenceObjective:
    """loss_fn(model, batch) for the shared training loop, for DPO- and KTO-family losses.

    A batch holds its rows' cached reference log-probs ("ref_logps"), unless the objective
    was given a live reference model (then they are computed here, every step).
    """

    def __init__(self, settings: LossSettings, reference_model: torch.nn.Module | None = None):
        if settings.family not in ("dpo", "kto"):
            raise ReasonRLError(f"loss '{settings.name}' is not a preference loss")
        self.settings = settings
        self.reference_model = reference_model

    def _reference(self, batch: dict) -> torch.Tensor:
        if self.reference_model is None:
            return batch["ref_logps"]
        with torch.no_grad():
            return sequence_logps(self.reference_model, batch)[0]

    def __call__(self, model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict]:
        logps, counts = sequence_logps(model, batch)
        ref = self._reference(batch)
        s = self.settings
        if s.family == "dpo":
            half = logps.shape[0] // 2
            losses = dpo_loss(logps[:half], logps[half:], ref[:half], ref[half:], s.beta)
            reward_chosen = s.beta * (logps[:half] - ref[:half]).detach()
            reward_rejected = s.beta * (logps[half:] - ref[half:]).detach()
            # Chosen and rejected apart: a margin that grows while both fall is DPO's
            # likelihood displacement (the chosen gets less likely too).
            stats = {
                "reward_margin": float((reward_chosen - reward_rejected).mean()),
                "reward_accuracy": float((reward_chosen > reward_rejected).float().mean()),
                "reward_chosen": float(reward_chosen.mean()),
                "reward_rejected": float(reward_rejected.mean()),
            }
            nll_rows = slice(0, half)
        else:
            desirable = batch["desirable"]
            losses, z0 = kto_loss(
                logps, ref, desirable, s.beta, s.lambda_desirable, s.lambda_undesirable
            )
            stats = {"kl_z0": float(z0)}
            nll_rows = desirable
        loss = losses.mean()
        if s.nll_weight > 0:
            nll = -(logps[nll_rows] / counts[nll_rows].clamp(min=1)).mean()
            loss = loss + s.nll_weight * nll
            stats["nll"] = nll.item()
        stats["tokens"] = float(batch["attention_mask"].sum())
        return loss, stats


PAIR_CREDITS = ("trajectory", "step")


def pair_sequences(
    tokenizer, rows: list[dict], multi_turn: bool, max_length: int, credit: str = "trajectory"
) -> list:
    """(chosen, rejected) MaskedSequences of preference-pair rows.

    credit "trajectory": each side's log-prob sums over its whole trajectory (the model's turns
    for multi-turn losses). "step": over the step where the two first diverge only, in their
    shared context (Step-DPO); a pair that first differs outside a model turn keeps the
    trajectory masks, so every row keeps its place beside its cached reference values.
    """
    if credit not in PAIR_CREDITS:
        raise ReasonRLError(f"unknown pair credit {credit!r} (expected one of {PAIR_CREDITS})")
    return [_pair(tokenizer, row, multi_turn, max_length, credit) for row in rows]


def _pair(tokenizer, row: dict, multi_turn: bool, max_length: int, credit: str) -> tuple:
    if credit == "step":
        step = encode_step_pair(tokenizer, row["chosen"], row["rejected"], max_length)
        if step is not None:
            return step
    return (
        encode_trajectory(tokenizer, row["chosen"], multi_turn, max_length),
        encode_trajectory(tokenizer, row["rejected"], multi_turn, max_length),
    )


def unpaired_sequences(tokenizer, rows: list[dict], multi_turn: bool, max_length: int) -> list:
    return [encode_trajectory(tokenizer, row["messages"], multi_turn, max_length) for row in rows]


class PreferenceBatches:
    """Deterministic micro-batch i of pairs (chosen rows first, then rejected) or of
    unpaired rows (with their desirable flags); the epoch's order is shuffled by the seed.

    `reference` holds each row's cached reference log-probs ((chosen, rejected) per pair, one
    value per unpaired row), or None when the objective uses a live reference model.
    """

    def __init__(
        self,
        items: list,
        batch_size: int,
        pad_id: int,
        seed: int,
        desirable: list[bool] | None = None,
        reference: list | None = None,
    ):
        if not items:
            raise ReasonRLError("no preference rows to train on")
        self.items = items
        self.batch_size = min(batch_size, len(items))
        self.pad_id = pad_id
        self.seed = seed
        self.desirable = desirable
        self.reference = reference
        self.per_epoch = max(1, len(items) // self.batch_size)

    def __call__(self, index: int) -> dict[str, torch.Tensor]:
        epoch, position = divmod(index, self.per_epoch)
        order = list(range(len(self.items)))
        random.Random(self.seed * 100_003 + epoch).shuffle(order)
        chosen = order[position * self.batch_size :][: self.batch_size]
        paired = self.desirable is None
        if paired:
            seqs = [self.items[j][0] for j in chosen] + [self.items[j][1] for j in chosen]
        else:
            seqs = [self.items[j] for j in chosen]
        batch = pad_sequences(seqs, self.pad_id)
        if not paired:
            batch["desirable"] = torch.tensor([self.desirable[j] for j in chosen])
        if self.reference is not None:
            if paired:
                values = [self.reference[j][0] for j in chosen]
                values += [self.reference[j][1] for j in chosen]
            else:
                values = [self.reference[j] for j in chosen]
            batch["ref_logps"] = torch.tensor(values, dtype=torch.float32)
        return batch
