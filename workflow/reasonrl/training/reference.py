"""The fixed reference of a KL penalty (PPO) or of an online DPO loss: the start model.

Full fine-tuning changes every weight, so the reference is a frozen copy of the start model
held beside the policy. Under LoRA the policy's frozen base weights *are* the start model,
so the reference is the policy with its adapters switched off (peft's disable_adapter; TRL
does the same for DPO with a peft model): no second copy of the weights. peft's switch
also puts every modules_to_save copy back to its original module, which holds the start's
weights too, so the whole model is the start's while it is off.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import torch

from reasonrl.errors import ReasonRLError


class Reference:
    """Where a run's reference log-probs come from: a frozen model, or the policy with its
    LoRA adapters off. Use it only inside `evaluating()`."""

    def __init__(self, model: torch.nn.Module, adapters_off: bool):
        self._model, self._adapters_off = model, adapters_off

    @classmethod
    def frozen(cls, model: torch.nn.Module) -> Reference:
        """A loaded copy of the start model that nothing trains (TrainingRun.load_reference)."""
        return cls(model, adapters_off=False)

    @classmethod
    def without_adapters(cls, policy: torch.nn.Module) -> Reference:
        """The LoRA `policy` (a peft model on the start model) with its adapters off."""
        if not hasattr(policy, "disable_adapter"):
            raise ReasonRLError(
                f"{type(policy).__name__} has no LoRA adapters to switch off for the reference"
            )
        return cls(policy, adapters_off=True)

    def sharded(self, shard: Callable[[torch.nn.Module], torch.nn.Module]) -> Reference:
        """This reference with its frozen copy replaced by `shard(copy)` (training.zero3.
        frozen_shards); itself where it is the policy with its adapters off, which the
        training loop shards with the policy."""
        return self if self._adapters_off else Reference.frozen(shard(self._model))

    @contextmanager
    def evaluating(self) -> Iterator[torch.nn.Module]:
        """The reference model in eval mode (dropout off) without gradients. The policy's
        adapters are off inside the block only (its own forward passes belong outside it);
        after it, adapters and train/eval mode are as they were."""
        model = self._model
        training = model.training
        switch = model.disable_adapter() if self._adapters_off else nullcontext()
        try:
            with switch, torch.no_grad():
                model.eval()
                yield model
        finally:
            model.train(training)
