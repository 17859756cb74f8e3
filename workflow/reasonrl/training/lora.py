"""LoRA fine-tuning through peft: adapters on a loaded policy, merged back for saving.

A training section's `lora` setting with r > 0 freezes the policy and trains low-rank
adapters on its target linears (Hu et al. 2021); r 0 is full fine-tuning. The saved folder
is the plain Hugging Face model with the adapters merged into its weights, so every later
rule loads it as it loads any policy. A model with a head of its own (a reward model's score,
a critic's trunk) names the task and the modules that train in full beside the adapters.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

import torch

from reasonrl.errors import ReasonRLError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraSettings:
    """A section's `lora` setting; `key` names it in errors (e.g. sft.lora)."""

    r: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    key: str = "lora"

    @classmethod
    def from_config(cls, lora: dict, key: str) -> LoraSettings:
        return cls(lora["r"], lora["alpha"], lora["dropout"], tuple(lora["target_modules"]), key)

    @property
    def enabled(self) -> bool:
        return self.r > 0


def add_adapters(
    model: torch.nn.Module,
    lora: LoraSettings,
    seed: int,
    task: str = "CAUSAL_LM",
    trainable: tuple[str, ...] = (),
) -> torch.nn.Module:
    """`model` with trainable LoRA adapters on its target linears and every other weight
    frozen but the `trainable` modules (a freshly initialised head: peft's modules_to_save
    trains a full copy of each); unchanged when `lora` is off. `task`: peft's task type of
    the model (CAUSAL_LM, SEQ_CLS, FEATURE_EXTRACTION for a bare trunk). The adapters' random
    start (A; B is zero) is drawn from `seed`, not from whatever the global generator holds,
    so a run is reproducible."""
    if not lora.enabled:
        return model
    # peft is imported only when adapters are asked for: environments that never train with
    # LoRA (the vLLM one) do not carry it
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as error:
        raise ReasonRLError(
            f"config key '{lora.key}.r' is {lora.r}: LoRA needs peft, which this environment "
            f"({sys.prefix}) lacks; install envs/lock-cpu.txt's peft or set r: 0"
        ) from error

    linears = {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    missing = [m for m in lora.target_modules if m not in linears]
    if missing:
        raise ReasonRLError(
            f"config key '{lora.key}.target_modules': {type(model).__name__} has no linear"
            f" named '{missing[0]}' (its linears: {', '.join(sorted(linears))})"
        )
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type=task,
        modules_to_save=list(trainable) or None,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        adapted = get_peft_model(model, config)
    trainable, total = adapted.get_nb_trainable_parameters()
    log.info(
        "LoRA r=%d on %s: %d of %d parameters trainable (%.2f%%)",
        lora.r, ",".join(lora.target_modules), trainable, total, 100 * trainable / total,
    )  # fmt: skip
    return adapted


def merged(model: torch.nn.Module) -> torch.nn.Module:
    """The plain model with its adapters merged into the weights (a model without adapters
    as it is). Duck-typed on peft's merge_and_unload, so that a process that never added
    adapters never imports peft."""
    merge = getattr(model, "merge_and_unload", None)
    return merge() if merge is not None else model


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights merged(model) would hold, keyed as in the plain model, with `model` left
    as it is: an online trainer sends them to its generator between steps. Each adapted
    linear is base + (alpha / r) B A (peft's own delta, so the sums are merge_and_unload's),
    a modules_to_save copy stands for its original; a model without adapters gives its own
    state dict."""
    if not hasattr(model, "merge_and_unload"):
        return model.state_dict()
    base = model.get_base_model()
    deltas = {
        f"{name}.base_layer.weight": module.get_delta_weight(module.active_adapters[0])
        for name, module in base.named_modules()
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")
    }
    state = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key or ".original_module." in key:
            continue
        plain = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        state[plain] = value + deltas[key] if key in deltas else value
    return state
