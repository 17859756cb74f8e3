"""TRL's GRPOTrainer loss on reasonrl's rows: what tests/test_grpo_losses.py checks the GRPO
loss against and bench/grpo_step.py times it against. Rows share one prompt (so TRL's left
padding is none); each completion carries its tool mask (0 inside an interpreter turn)."""

from __future__ import annotations

import copy
from collections import defaultdict
from types import SimpleNamespace

import torch

from reasonrl.training.grpo import GRPOSettings

Completion = tuple[list[int], list[int]]  # (token ids, tool mask)


def trl_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` with TRL's fused LM head (log-probs and entropy, as GRPOTrainer
    computes them)."""
    from trl.trainer.utils import add_fused_lm_head

    copied = copy.deepcopy(model)
    add_fused_lm_head(copied, temperature=1.0, outputs=("log_probs", "entropy"))
    return copied


def trl_trainer(model: torch.nn.Module, settings: GRPOSettings) -> SimpleNamespace:
    """The attributes GRPOTrainer._compute_loss reads, as `settings` sets them."""
    from accelerate import Accelerator
    from trl import GRPOTrainer

    trainer = SimpleNamespace(
        model=model,
        accelerator=Accelerator(cpu=True),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        aux_loss_enabled=False,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        importance_sampling_level="token",
        loss_type={"grpo": "grpo", "dapo": "dapo", "dr_grpo": "dr_grpo"}[settings.aggregation],
        epsilon_low=settings.clip_low,
        epsilon_high=settings.clip_high,
        beta=settings.beta,
        max_completion_length=settings.max_tokens,
        current_gradient_accumulation_steps=1,
        use_vllm=False,
        temperature=1.0,
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )
    trainer._get_per_token_logps_and_entropies = (
        GRPOTrainer._get_per_token_logps_and_entropies.__get__(trainer)
    )
    return trainer


def trl_inputs(
    prompt: list[int],
    completions: list[Completion],
    old: list[list[float]],
    ref: list[list[float]],
    advantages: list[float],
) -> dict:
    """GRPOTrainer's inputs: prompt ids, completion ids with their mask, the tool mask, the
    sampling policy's and the reference's per-token log-probs (`old`, `ref`: one per kept
    token), and the advantages."""
    width = max(len(ids) for ids, _ in completions)

    def padded(values: list[int], fill: int = 0) -> list[int]:
        return values + [fill] * (width - len(values))

    completion_ids = torch.tensor([padded(ids) for ids, _ in completions])
    completion_mask = torch.tensor([padded([1] * len(ids)) for ids, _ in completions])
    tool_mask = torch.tensor([padded(mask) for _, mask in completions])

    def per_token(values: list[list[float]]) -> torch.Tensor:
        out = torch.zeros(completion_ids.shape)
        for i, (row, (_, mask)) in enumerate(zip(values, completions, strict=True)):
            out[i, torch.tensor(padded(mask)).bool()] = torch.tensor(row)
        return out

    return {
        "prompt_ids": torch.tensor([prompt] * len(completions)),
        "prompt_mask": torch.ones(len(completions), len(prompt), dtype=torch.long),
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor(advantages),
        "old_per_token_logps": per_token(old),
        "ref_per_token_logps": per_token(ref),
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }


def trl_grpo_loss(trainer: SimpleNamespace, inputs: dict) -> torch.Tensor:
    """GRPOTrainer._compute_loss on `inputs` with `trainer`'s model."""
    from trl import GRPOTrainer

    return GRPOTrainer._compute_loss(trainer, trainer.model, inputs)
