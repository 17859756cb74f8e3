"""LoRA fine-tuning through peft: adapters on a loaded policy, merged back for saving.

A training section's `lora` setting with r > 0 freezes the policy and trains low-rank
adapters on its target linears (Hu et al. 2021); r 0 is full fine-tuning. The saved folder
is the plain Hugging Face model with the adapters merged into its weights, so every later
rule loads it as it loads any policy. A model with a head of its own (a reward model's score,
a critic's trunk) names the task and the modules that train in full beside the adapters.

QLoRA (Dettmers et al. 2023; `lora.quantize: nf4`): the frozen base is loaded in 4-bit
NormalFloat with double quantization (bitsandbytes), computing in the policy's dtype, and
only the adapters train. The adapters are merged into the start model loaded again
unquantized, as the paper's recipe does: merged into the 4-bit weights, the sum would be
quantized again. Everything that compares the policy with its start (a DPO reference, a KL
penalty's reference with the adapters off) sees the same quantized base as the policy.
"""

from __future__ import annotations

import copy
import logging
import sys
from collections.abc import Iterator
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
    quantize: str = "none"  # none, or nf4: the frozen base in 4-bit NormalFloat (QLoRA)

    @classmethod
    def from_config(cls, lora: dict, key: str) -> LoraSettings:
        settings = cls(
            lora["r"], lora["alpha"], lora["dropout"], tuple(lora["target_modules"]), key,
            lora.get("quantize", "none"),
        )  # fmt: skip
        if settings.quantize != "none" and not settings.enabled:
            raise ReasonRLError(
                f"config key '{key}.quantize' is {settings.quantize}: a quantized base trains"
                " only through adapters; set r > 0"
            )
        return settings

    @property
    def enabled(self) -> bool:
        return self.r > 0

    def load_options(self, dtype: str) -> dict:
        """from_pretrained's keywords for the base the adapters train on: QLoRA's 4-bit
        quantization (compute in `dtype`, the policy's), none otherwise."""
        if self.quantize == "none":
            return {}
        try:
            import bitsandbytes  # noqa: F401  (transformers' own message names no config key)
        except ImportError as error:
            raise ReasonRLError(
                f"config key '{self.key}.quantize' is {self.quantize}: it needs bitsandbytes,"
                f" which this environment ({sys.prefix}) lacks; install envs/lock-cpu.txt's"
            ) from error
        from transformers import BitsAndBytesConfig

        from reasonrl.models import DTYPES

        quantization = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.quantize,
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=DTYPES[dtype],
        )
        return {"quantization_config": quantization}


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
        from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
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
    if is_quantized(model):
        # norms and embeddings in fp32 for stable adapter training (the QLoRA recipe); the
        # training loop turns gradient checkpointing on itself
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        adapted = get_peft_model(model, config)
    trainable, total = adapted.get_nb_trainable_parameters()
    log.info(
        "LoRA r=%d on %s: %d of %d parameters trainable (%.2f%%)",
        lora.r, ",".join(lora.target_modules), trainable, total, 100 * trainable / total,
    )  # fmt: skip
    return adapted


def is_quantized(model: torch.nn.Module) -> bool:
    """Whether `model` (or a peft model's base) holds bitsandbytes-quantized weights."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return bool(getattr(base, "is_loaded_in_4bit", False) or getattr(base, "is_quantized", False))


def merged(model: torch.nn.Module, gathered: dict | None = None) -> torch.nn.Module:
    """The plain model with its adapters merged into the weights (a model without adapters
    as it is). From `gathered`, the full state dict ZeRO-3 gathers, when given (the model's
    own parameters are shards there); into the start model loaded again unquantized when the
    base is 4-bit. Duck-typed on peft's merge_and_unload, so that a process that never added
    adapters never imports peft."""
    merge = getattr(model, "merge_and_unload", None)
    if merge is None:
        return model
    if gathered is not None:
        return _merged_from_gathered(model, gathered)
    return _merged_unquantized(model) if is_quantized(model) else merge()


def _merged_from_gathered(model: torch.nn.Module, gathered: dict) -> torch.nn.Module:
    """A peft model like `model`, built plainly (not by from_pretrained, which ZeRO-3's
    set-up would partition across processes that have finished), holding `gathered`, merged."""
    from peft import get_peft_model

    base = model.get_base_model()
    with torch.random.fork_rng():  # its random start is overwritten: leave the seed as it was
        plain = type(base)(copy.deepcopy(base.config))
    adapted = get_peft_model(plain, copy.deepcopy(model.peft_config[model.active_adapter]))
    adapted.load_state_dict(gathered)
    return adapted.merge_and_unload()


def _merged_unquantized(model: torch.nn.Module) -> torch.nn.Module:
    """A QLoRA model's adapters (and modules_to_save copies) merged into its start model,
    loaded again from its folder in the compute dtype without quantization."""
    from peft import get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict

    from reasonrl.models import from_pretrained

    base = model.get_base_model()
    config = copy.deepcopy(base.config)
    compute_dtype = config.quantization_config.bnb_4bit_compute_dtype
    del config.quantization_config
    start = from_pretrained(type(base), config.name_or_path, config=config, dtype=compute_dtype)
    start = start.to(next(model.parameters()).device)
    name = model.active_adapter
    full = get_peft_model(start, copy.deepcopy(model.peft_config[name]))
    set_peft_model_state_dict(full, get_peft_model_state_dict(model, adapter_name=name))
    return full.merge_and_unload()


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The weights merged(model) would hold, keyed as in the plain model, with `model` left
    as it is: an online trainer sends them to its generator between steps. Each adapted
    linear is base + (alpha / r) B A (peft's own delta, so the sums are merge_and_unload's),
    a modules_to_save copy stands for its original; a model without adapters gives its own
    state dict. A 4-bit base weight is dequantized (its quantization state left out)."""
    if not hasattr(model, "merge_and_unload"):
        return model.state_dict()
    return dict(merged_state_entries(model))


def merged_state_entries(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """merged_state_dict's entries one at a time, in order: each adapted weight's delta is
    made only for its own entry, so a caller that copies each entry off the GPU and drops it
    holds one merged weight at a time beside the model, never a second whole copy."""
    if not hasattr(model, "merge_and_unload"):
        yield from model.state_dict().items()
        return
    base = model.get_base_model()
    quantized = {name: module for name, module in base.named_modules() if _is_4bit_linear(module)}
    quant_state_keys = tuple(f"{name}.weight." for name in quantized)
    adapted = {
        f"{name}.base_layer.weight": module
        for name, module in base.named_modules()
        if hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")
    }
    for key, value in base.state_dict().items():
        if ".lora_" in key or ".original_module." in key or key.startswith(quant_state_keys):
            continue
        owner = key.removesuffix(".weight")
        if owner in quantized:
            value = _dequantized(quantized[owner])
        plain = key.replace(".base_layer.", ".").replace(".modules_to_save.default.", ".")
        if key in adapted:
            module = adapted[key]
            value = value + module.get_delta_weight(module.active_adapters[0])
        yield plain, value


def _is_4bit_linear(module: torch.nn.Module) -> bool:
    """A bitsandbytes 4-bit linear itself (not peft's wrapper, which shows its weight)."""
    return not hasattr(module, "base_layer") and hasattr(
        getattr(module, "weight", None), "quant_state"
    )


def _dequantized(module: torch.nn.Module) -> torch.Tensor:
    from peft.utils.integrations import dequantize_bnb_weight

    return dequantize_bnb_weight(module.weight, state=module.weight.quant_state)
