"""The one training loop every trainer reuses.

accelerate for devices and precision, gradient accumulation, linear warm-up then a cosine or
constant learning rate, resumable checkpoints with exact resume: micro-batch number i is a
pure function of i (the batch source decides), and model, optimizer, scheduler and RNG states
are restored, so a killed run continues with the same step count, data position and random
state.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import torch
from accelerate import Accelerator, PartialState
from accelerate.utils import InitProcessGroupKwargs, gather_object, parse_flag_from_env
from tqdm import tqdm
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from reasonrl.errors import ReasonRLError
from reasonrl.io import follow_umask, replace_durably, write_csv, write_json, write_text
from reasonrl.models import save_folder_atomically, to_device
from reasonrl.tracking import NullTracker, Tracker

log = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
LossFn = Callable[[torch.nn.Module, Batch], tuple[torch.Tensor, dict[str, float]]]
StepHook = Callable[[int, torch.nn.Module, list[dict]], dict | None]
# What a micro-batch's loss is a mean over (target tokens, pairs, rows), counted: with it a
# step weighs each micro-batch by its part of the step's count, on every process, so the
# update is the loss of the step's whole batch; without it each has an even share.
LossUnits = Callable[[Batch], float]
# Stats that are counts: they add up over a step's micro-batches and processes (the rest
# are weighted means). Tokens seen, tokens a loss averaged over, rows passed forward and
# backward through a model (PPO's compute accounting).
COUNTED_STATS = frozenset({"tokens", "target_tokens", "policy_passes", "critic_passes"})
T = TypeVar("T")


@dataclass(frozen=True)
class LoopSettings:
    max_steps: int
    lr: float
    grad_accum: int = 1
    weight_decay: float = 0.0
    warmup_ratio: float = 0.0
    warmup_steps: int | None = None  # a count, where a paper gives one: overrides the ratio
    max_grad_norm: float = 1.0
    precision: str = "fp32"
    optimizer: str = "adamw"  # or adamw8bit: bitsandbytes' block-wise 8-bit AdamW states
    lr_schedule: str = "cosine"  # or constant, after the linear warm-up
    gradient_checkpointing: bool = False
    checkpoint_every: int = 50
    log_every: int = 10
    seed: int = 0

    @classmethod
    def from_config(cls, section: dict, seed: int) -> LoopSettings:
        names = cls.__dataclass_fields__.keys() - {"seed"}
        return cls(seed=seed, **{k: section[k] for k in names})


class CheckpointStore:
    """Checkpoints in an undeclared folder, stamped with a fingerprint of the run's inputs."""

    def __init__(self, folder: Path, fingerprint: str):
        self.folder = Path(folder)
        self.fingerprint = fingerprint

    def _stamp(self) -> str | None:
        stamp = self.folder / "fingerprint"
        return stamp.read_text() if stamp.exists() else None

    def latest(self) -> Path | None:
        if self._stamp() != self.fingerprint:
            return None
        steps = sorted(self.folder.glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
        return steps[-1] if steps else None

    def save(self, accelerator: Accelerator, step: int, history: list[dict]) -> None:
        """Every process writes its part of the state (DeepSpeed shards, RNG states); only
        the main process makes, publishes and prunes folders (under accelerate launch the
        processes share the folder)."""
        tmp = self.folder / f".tmp-step-{step}"
        if accelerator.is_main_process:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_text(self.folder / "fingerprint", self.fingerprint)
            if tmp.exists():
                shutil.rmtree(tmp)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(tmp))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            (tmp / "loop.json").write_text(json.dumps({"step": step, "history": history}))
            follow_umask(tmp)
            replace_durably(tmp, self.folder / f"step-{step}")
            for old in self.folder.glob("step-*"):
                if old.name != f"step-{step}":
                    shutil.rmtree(old)
        accelerator.wait_for_everyone()

    def discard_stale(self) -> None:
        """Remove checkpoints stamped with other inputs."""
        if self._stamp() not in (None, self.fingerprint):
            log.warning("checkpoints in %s are from other inputs; starting afresh", self.folder)
            shutil.rmtree(self.folder)

    def clear(self) -> None:
        if self.folder.exists():
            shutil.rmtree(self.folder)


def train(
    model: torch.nn.Module,
    micro_batch: Callable[[int], Batch],
    loss_fn: LossFn,
    settings: LoopSettings,
    checkpoints: CheckpointStore,
    on_step: StepHook | None = None,
    tracker: Tracker | None = None,
    loss_units: LossUnits | None = None,
) -> dict:
    """Run `settings.max_steps` optimizer steps; return {"history", "resumed_from", ...}.

    `micro_batch(i)` must return the i-th micro-batch deterministically.
    `loss_units(batch)`: what the loss of a micro-batch is a mean over (see LossUnits).
    `on_step(step, model, history)` is called once with the starting step (0, or the step
    resumed from) and after every optimizer step, whose history entry it may extend with the
    stats it returns (online trainers send the new weights to their generator there).
    `tracker` receives each step's history entry as it is made, and is closed at the end.
    """
    loop = TrainingLoop(model, loss_fn, settings, checkpoints, on_step, tracker, loss_units)
    loop.run(micro_batch, settings.max_steps - loop.step)
    return loop.finish()


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each decoder layer's activations in the backward pass (transformers' own
    implementation; non-reentrant, so frozen inputs and no_grad parts keep working)."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ReasonRLError(f"{type(model).__name__} has no gradient checkpointing")
    options = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(options)
    else:  # transformers before 5.21 (the GPU image's 5.20) has only the older name
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=options)


def fp32_master_weights(model: torch.nn.Module) -> list[tuple[torch.nn.Parameter, torch.dtype]]:
    """Hold the trained parameters of a bf16/fp16 model in fp32 and return them with their
    dtype: mixed precision (Micikevicius et al. 2018) without DeepSpeed, which keeps its own
    fp32 master copy. Autocast still computes in bf16, but AdamW updates and accumulates in
    fp32: a bf16 weight near 0.02 moves only in steps of 1.2e-4, so the updates of a 7B
    recipe's lr (4e-7) would round away."""
    low = (torch.bfloat16, torch.float16)
    held = [(p, p.dtype) for p in model.parameters() if p.requires_grad and p.dtype in low]
    for param, _ in held:
        param.data = param.data.float()
    return held


def make_optimizer(params, settings: LoopSettings) -> torch.optim.Optimizer:
    """AdamW over `params` (tensors or groups with their own lr): torch's, or bitsandbytes'
    8-bit AdamW (Dettmers et al. 2022: momentum and variance quantized block-wise, 2 bytes per
    parameter instead of 8)."""
    options = {"lr": settings.lr, "weight_decay": settings.weight_decay}
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(params, **options)
    try:
        import bitsandbytes
    except ImportError as error:
        raise ReasonRLError(
            f"optimizer {settings.optimizer} needs bitsandbytes, which this environment"
            f" ({sys.prefix}) lacks; install envs/lock-cpu.txt's or use optimizer: adamw"
        ) from error
    return bitsandbytes.optim.AdamW8bit(params, **options)


def make_scheduler(optimizer: torch.optim.Optimizer, settings: LoopSettings):
    """Linear warm-up over warmup_steps (or warmup_ratio of the steps), then cosine decay to 0
    or constant."""
    warmup = settings.warmup_steps
    if warmup is None:
        warmup = round(settings.warmup_ratio * settings.max_steps)
    if settings.lr_schedule == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    return get_cosine_schedule_with_warmup(optimizer, warmup, settings.max_steps)


class TrainingLoop:
    """train() in parts, for methods that make their data between updates (PPO's
    iterations, online DPO's rounds): set up and resume, then `run` a finite batch source for
    some steps, as often as needed, then `finish`. Micro-batch indices and checkpoints count
    steps over the whole run, so a resumed run continues at `step` exactly."""

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: LossFn,
        settings: LoopSettings,
        checkpoints: CheckpointStore,
        on_step: StepHook | None = None,
        tracker: Tracker | None = None,
        loss_units: LossUnits | None = None,
    ):
        self.loss_fn, self.settings, self.checkpoints = loss_fn, settings, checkpoints
        self.loss_units = loss_units
        self.on_step = on_step
        self.tracker = tracker or NullTracker()
        # Accumulation through accelerate: DDP skips the all-reduce and DeepSpeed the step on
        # all but a step's last micro-batch (the launcher's DeepSpeed configs leave the count
        # to this setting).
        accelerator = Accelerator(
            mixed_precision="bf16" if settings.precision == "bf16" else "no",
            gradient_accumulation_steps=settings.grad_accum,
            kwargs_handlers=process_group_options(),
        )
        plugin = accelerator.state.deepspeed_plugin
        if plugin is not None:
            # DeepSpeed's batch bookkeeping wants a micro-batch size, which accelerate takes
            # from a prepared data loader; this loop makes its own micro-batches (of rows or
            # packed blocks), so DeepSpeed counts each as one.
            plugin.deepspeed_config.update(
                train_micro_batch_size_per_gpu=1,
                gradient_accumulation_steps=settings.grad_accum,
                train_batch_size=settings.grad_accum * accelerator.num_processes,
            )
        torch.manual_seed(settings.seed)
        if settings.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        self.master_weights = (
            fp32_master_weights(model) if settings.precision == "bf16" and plugin is None else []
        )
        # A model with parts that learn at their own rates (PPO's policy and critic) names them.
        groups = model.optimizer_groups() if hasattr(model, "optimizer_groups") else None
        optimizer = make_optimizer(groups or model.parameters(), settings)
        scheduler = make_scheduler(optimizer, settings)
        # The schedule is stepped here once per optimizer step, unprepared: accelerate's
        # wrapper steps it once per process per step (the schedule of a run over N GPUs ended
        # after 1/N of its steps and the cosine rose again); checkpoints still hold it.
        self.model, self.optimizer = accelerator.prepare(model, optimizer)
        self.scheduler = scheduler
        accelerator.register_for_checkpointing(scheduler)
        self.accelerator = accelerator
        self.step, self.history = 0, []
        if accelerator.is_main_process:
            checkpoints.discard_stale()
        accelerator.wait_for_everyone()
        resume = checkpoints.latest()
        if resume is not None:
            accelerator.load_state(str(resume))
            state = json.loads((resume / "loop.json").read_text())
            self.step, self.history = state["step"], state["history"]
            log.info("resumed from %s at step %d", resume, self.step)
        self.resumed_from = self.step
        if on_step is not None:
            on_step(self.step, accelerator.unwrap_model(self.model), self.history)
        self.model.train()
        self.started = time.perf_counter()
        self.bar = tqdm(total=settings.max_steps, initial=self.step, desc="train", mininterval=5)

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        return self.accelerator.unwrap_model(self.model)

    def evaluate(self, fn: Callable[[torch.nn.Module, Batch], T], batch: Batch) -> T:
        """`fn(model, batch)` as the loss sees the model (the batch on its device, under the
        run's autocast) but without gradients: what a loss needs from a whole optimizer step
        before any of its micro-batches' backward (online PPO's critic values, for advantages
        whitened over the step)."""
        with torch.no_grad(), self.accelerator.autocast():
            return fn(self.model, to_device(batch, self.accelerator.device))

    def run(self, micro_batch: Callable[[int], Batch], steps: int) -> None:
        """Take `steps` optimizer steps on `micro_batch(i)`, i counted over the whole run."""
        settings, accelerator = self.settings, self.accelerator
        for _ in range(steps):
            t0 = time.perf_counter()
            batches = step_micro_batches(
                micro_batch, self.step, settings.grad_accum, accelerator.num_processes,
                accelerator.process_index, self.loss_units,
            )  # fmt: skip
            stats = _optimizer_step(
                self.model, batches, self.loss_fn, settings, self.optimizer, self.scheduler,
                accelerator,
            )  # fmt: skip
            self.step += 1
            stats.update(step=self.step, seconds=time.perf_counter() - t0)
            if "tokens" in stats:
                # a wall-clock rate: run comparisons drop keys that name seconds
                stats["tokens_per_second"] = stats["tokens"] / max(stats["seconds"], 1e-9)
            if self.on_step is not None:
                stats.update(self.on_step(self.step, self.unwrapped_model, self.history) or {})
            self.history.append(stats)
            self.tracker.log(self.step, stats)
            self.bar.update(1)
            if self.step % settings.log_every == 0 or self.step == settings.max_steps:
                recent = self.history[-settings.log_every :]
                mean_loss = sum(h["loss"] for h in recent) / len(recent)
                log.info("step %d loss %.4f lr %.2e", self.step, mean_loss, stats["lr"])
            if self.step % settings.checkpoint_every == 0 and self.step < settings.max_steps:
                self.checkpoints.save(accelerator, self.step, self.history)

    def finish(self, gather: bool = True) -> dict:
        """{"history", "resumed_from", "train_seconds", "model", "state_dict"}; the trained
        weights are back in the dtype the model came in. `gather=False`: no state_dict (None)
        for a caller that saves other weights than the last (PPO's best iteration), so
        ZeRO-3 does not gather the whole model to the main process's memory for nothing."""
        self.bar.close()
        for param, dtype in self.master_weights:
            param.data = param.data.to(dtype)
        self.tracker.close()
        self.accelerator.wait_for_everyone()
        return {
            "history": self.history,
            "resumed_from": self.resumed_from,
            "train_seconds": time.perf_counter() - self.started,
            "model": self.unwrapped_model,
            "state_dict": _gathered_state_dict(self.accelerator, self.model) if gather else None,
        }


def _gathered_state_dict(accelerator: Accelerator, model) -> dict | None:
    """The full weights where the processes hold only shards of them (DeepSpeed ZeRO-3;
    every process must take part in gathering), else None: the unwrapped model has them."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None or plugin.zero_stage != 3:
        return None
    return accelerator.get_state_dict(model)


def micro_batch_index(
    step: int, micro: int, grad_accum: int, num_processes: int, process_index: int
) -> int:
    """Which micro-batch a process trains on: under data parallelism (accelerate launch)
    each process takes its own, so an optimizer step sees grad_accum x num_processes distinct
    micro-batches; with one process it is micro-batch step * grad_accum + micro."""
    return (step * grad_accum + micro) * num_processes + process_index


def step_micro_batches(
    micro_batch: Callable[[int], Batch],
    step: int,
    grad_accum: int,
    num_processes: int,
    process_index: int,
    loss_units: LossUnits | None = None,
) -> list[tuple[Batch, float]]:
    """This process's micro-batches of optimizer step `step`, each with its loss weight
    against an even share of the step (1.0 without `loss_units`).

    A loss that is a mean over units the micro-batches hold unevenly (target tokens of
    packed blocks, a ragged last micro-batch) weighs each by its part of the units of the
    whole step, every process's micro-batches counted (each is a pure function of its
    index): the accumulated and all-reduced gradient, and the step's logged means, are
    then those of the step's whole batch in one micro-batch on one process. A step with
    no units at all has even weights."""
    local = [
        micro_batch_index(step, micro, grad_accum, num_processes, process_index)
        for micro in range(grad_accum)
    ]
    if loss_units is None or grad_accum * num_processes == 1:
        return [(micro_batch(index), 1.0) for index in local]
    first = step * grad_accum * num_processes
    batches = {index: micro_batch(index) for index in local}
    units = {
        index: float(loss_units(batches[index] if index in batches else micro_batch(index)))
        for index in range(first, first + grad_accum * num_processes)
    }
    total = sum(units.values())
    even = grad_accum * num_processes
    return [(batches[i], units[i] / total * even if total else 1.0) for i in local]


def _optimizer_step(model, batches, loss_fn, settings, optimizer, scheduler, accelerator) -> dict:
    totals: dict[str, float] = {}
    summed = COUNTED_STATS
    for batch, weight in batches:
        batch = to_device(batch, accelerator.device)
        with accelerator.accumulate(model), accelerator.autocast():
            loss, stats = loss_fn(model, batch)
            # divided by grad_accum there (or in DeepSpeed's engine), and over processes
            accelerator.backward(loss * weight)
        stats = {"loss": loss.item(), **stats}
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + (value if key in summed else weight * value)
    grad_norm = accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    out = {k: v if k in summed else v / settings.grad_accum for k, v in totals.items()}
    if accelerator.num_processes > 1:
        out = _over_processes(out, accelerator, summed)
    out.update(lr=lr, grad_norm=float(grad_norm))
    return out


def _over_processes(stats: dict[str, float], accelerator: Accelerator, summed: set) -> dict:
    """A step's stats over the micro-batches of every process (each has those of its own):
    the mean of the processes' means, the sum of their counts. So the history of a run over
    N processes is that of one process with N times the gradient accumulation."""
    keys = sorted(stats)
    local = torch.tensor([stats[k] for k in keys], dtype=torch.float64, device=accelerator.device)
    mean = accelerator.reduce(local, reduction="mean").tolist()
    n = accelerator.num_processes
    return {k: v * n if k in summed else v for k, v in zip(keys, mean, strict=True)}


def process_group_options() -> list:
    """DeepSpeed launched on a machine without GPUs talks over gloo: told no backend there,
    accelerate counts one process while DeepSpeed has them all (and the batch checks fail)."""
    if torch.cuda.is_available() or not parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        return []
    return [InitProcessGroupKwargs(backend="gloo")]


def is_main_process() -> bool:
    """Whether this is the main process of accelerate launch (RANK 0), or the only one.
    Read from the environment: a PartialState made before the loop's Accelerator fixes
    accelerate's set-up, and made plainly on a CPU it is one process each (each then trained
    on every micro-batch alone), as the Accelerator, which reads ACCELERATE_USE_CPU, is not."""
    return int(os.environ.get("RANK", "0")) == 0


def map_over_processes(fn: Callable[[list], list], items: list) -> list | None:
    """`fn(items)`; under accelerate launch, `fn` of each process's contiguous part of
    `items`, the results gathered in order on the main process (None on the others). It is
    the job's last collective: the process group is closed after it."""
    if data_parallel_processes() == 1:
        return fn(items)
    accelerator = Accelerator(kwargs_handlers=process_group_options())
    with accelerator.split_between_processes(items) as part:
        done = fn(part)
    gathered = gather_object(done)
    close_process_group()
    return gathered if accelerator.is_main_process else None


def gathered_over_processes(fn: Callable[[list], list], items: list) -> list:
    """`fn(items)`; under accelerate launch, `fn` of each process's contiguous share of
    `items` (possibly empty), the results gathered in order on every process. A collective:
    every process calls it, after the training loop is set up."""
    if data_parallel_processes() == 1:
        return fn(items)
    state = PartialState()
    part = contiguous_share(len(items), state.num_processes, state.process_index)
    return gather_object(fn(items[part.start : part.stop]))


# How long the other processes of a launched job wait for what the main one receives from
# its generator process (its start, a whole round or iteration of sampling), far past
# NCCL's 10 minutes.
GENERATOR_WAIT = timedelta(hours=24)


class MainBroadcast:
    """The main process's payload on every process of a launched job, over a gloo group of
    its own (made at the first call, which every process makes): the wait is the
    generator's (GENERATOR_WAIT), and the pickled payload stays off the GPUs."""

    def __init__(self):
        self._group = None

    def __call__(self, payload):
        if self._group is None:
            self._group = torch.distributed.new_group(backend="gloo", timeout=GENERATOR_WAIT)
        box = [payload]
        torch.distributed.broadcast_object_list(box, src=0, group=self._group)
        return box[0]


def refuse_zero3(rule: str, why: str) -> None:
    """Stop with one line, before anything is loaded, where accelerate launch set up
    DeepSpeed ZeRO-3 for a rule that cannot run under it (`why`)."""
    if os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3":
        raise ReasonRLError(
            f"{rule} cannot run under DeepSpeed ZeRO-3 ({why}): give rule {rule} resource"
            " deepspeed: zero2"
        )


def contiguous_share(count: int, processes: int, index: int) -> range:
    """Process `index`'s part of `count` items split in order over `processes`: the first
    count % processes parts have one more (as accelerate's split_between_processes)."""
    size, extra = divmod(count, processes)
    start = index * size + min(index, extra)
    return range(start, start + size + (index < extra))


def close_process_group() -> None:
    """Every process of a multi-process job meets here and the process group ends, on all of
    them together: a process that left with it still open aborted at exit ("terminate called
    without an active exception") while the main one was still writing, failing the job.
    Nothing without a process group."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def data_parallel_processes() -> int:
    """How many processes accelerate launch (or torchrun) started for this job, 1 without it.
    Read from the environment as accelerate reads it: building accelerate's PartialState
    before the loop would fix its distributed set-up before the loop's Accelerator is made."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def node_processes() -> int:
    """How many of the job's data-parallel processes run on this node (all of them on one
    node; a job over several nodes, reasonrl.training.launch, starts as many on each)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", data_parallel_processes()))


def with_accumulation(section: dict, name: str) -> dict:
    """`section` (sft, preference.train, reward_models.train: `name`) with the grad_accum
    this job trains with: its own, or, where global_batch_size is set, the micro-batches per
    process that make it with this job's data-parallel processes (a recipe's global batch,
    as the papers give it, holds on 1 GPU or 8)."""
    wanted = section["global_batch_size"]
    if wanted is None:
        return section
    per_step = section["batch_size"] * data_parallel_processes()
    if wanted % per_step:
        raise ReasonRLError(
            f"'{name}.global_batch_size' ({wanted}) is not a multiple of batch_size x processes"
            f" ({section['batch_size']} x {data_parallel_processes()})"
        )
    return {**section, "grad_accum": wanted // per_step}


def steps_for_epochs(epochs: float, rows: int, batch_size: int, grad_accum: int) -> int:
    """Optimizer steps that pass over `rows` `epochs` times: a step takes batch_size rows per
    micro-batch, grad_accum micro-batches per process, on every data-parallel process."""
    per_step = batch_size * grad_accum * data_parallel_processes()
    return max(1, round(epochs * rows / per_step))


def save_trained_model(
    out: Path,
    model: torch.nn.Module,
    tokenizer,
    metrics: dict,
    provenance,
    checkpoints: CheckpointStore,
    extra_json: dict[str, dict] | None = None,
    summary: dict | None = None,
    state_dict: dict | None = None,
) -> None:
    """Write a trainer's output folder atomically (weights, tokenizer, `extra_json` files,
    metrics.json, the history as metrics.csv, the manifest with the final loss and
    `summary`), then drop the run's resumable checkpoints. Under accelerate launch only the
    main process writes; `state_dict` is train()'s gathered one where weights were sharded."""
    if not is_main_process():
        return

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp, state_dict=state_dict)
        tokenizer.save_pretrained(tmp)
        for name, data in (extra_json or {}).items():
            write_json(tmp / name, data)
        write_json(tmp / "metrics.json", metrics)
        write_csv(tmp / "metrics.csv", metrics["history"])
        provenance.write(tmp, {"final_loss": metrics["final_loss"], **(summary or {})})

    save_folder_atomically(out, save)
    checkpoints.clear()
