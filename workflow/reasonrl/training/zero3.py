"""Whole weights of a model that DeepSpeed ZeRO-3 shards over a job's processes.

Under ZeRO-3 each process holds a shard of every parameter, and hooks on each submodule
all-gather its parameters before its forward and free them after: a collective per layer
per forward, so every process must run the same forwards. Sampling cannot (each process
samples its own prompts, for as many tokens as they take), so it runs on the policy's
parameters gathered whole once, with the per-layer hooks off (as TRL's
unwrap_model_for_generation and DeepSpeed's own do): left on, the post-forward hook frees
the gathered parameters after the first token and the next forward all-gathers again.
Saving gathers the parameters too, and loading writes into the whole ones and sends the
main process's to every shard. A frozen model beside the trained one (PPO's reference and
reward model) is sharded alike (`frozen_shards`), so no process holds it whole.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 has partitioned `module`'s parameters (each has a ds_id)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


@contextmanager
def whole(module: torch.nn.Module, modifier_rank: int | None = None) -> Iterator[None]:
    """`module`'s parameters whole on every process inside the block: a collective, every
    process enters it. With `modifier_rank`, that process's values (changed in the block)
    go to every shard at its end; without, changes are dropped. Nothing where `module` is
    not sharded."""
    if not is_sharded(module):
        yield
        return
    import deepspeed  # slow to import: only where it sharded the model

    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=modifier_rank):
        yield


def state_entries(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """`module`'s state dict entries in order, each parameter whole while it is yielded:
    under ZeRO-3 gathered in turn (a collective per parameter, so every process runs the
    iteration through) and freed after, so no process holds a second whole copy."""
    for name, value in module.state_dict(keep_vars=True).items():
        if not hasattr(value, "ds_id"):
            yield name, value
            continue
        import deepspeed

        with deepspeed.zero.GatheredParameters([value]):
            yield name, value


@contextmanager
def for_generation(engine, module: torch.nn.Module) -> Iterator[None]:
    """`module` (a part of the DeepSpeed `engine`'s model) whole, without the engine's
    per-layer gather and free hooks, inside the block: forwards there run no collective,
    however many a process runs. A collective to enter and leave; nothing where `module` is
    not sharded."""
    if not is_sharded(module):
        yield
        return
    offload = engine.optimizer.parameter_offload
    with whole(module):
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        try:
            yield
        finally:
            offload._register_deepspeed_module(offload.module)  # the hooks, as set up


def frozen_shards(model: torch.nn.Module) -> torch.nn.Module:
    """`model`, which nothing trains, as a DeepSpeed ZeRO-3 engine without an optimizer under
    the job's DeepSpeed config (the trained model's, as accelerate resolved it when it
    prepared that one; as TRL's prepare_deepspeed does): each process holds a shard of its
    weights and every forward gathers them layer by layer, a collective that every process
    must run alike. Call it after the training loop has prepared its model."""
    import deepspeed
    from accelerate.state import AcceleratorState

    config = copy.deepcopy(AcceleratorState().deepspeed_plugin.deepspeed_config)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeed's eval() returns nothing
    return engine
