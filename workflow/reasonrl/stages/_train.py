"""The one trainer set-up every training stage shares.

A training stage reads its inputs and passes its loss and batch source; this module owns
the rest: loading the policy and its reference (a frozen copy, or under LoRA the policy with
its adapters off: training.reference), the provenance, the checkpoint store stamped with a
fingerprint of the inputs (so a run never resumes from a stale one), LoRA adapters on the
policy when the section asks for them, on a 4-bit base under QLoRA (training.lora), the loop
call (training.loop: optimizer, schedule, exact resume), the metrics every trainer reports,
and the atomic save of the output folder with its manifest (adapters merged: a plain HF
folder).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

import torch

from reasonrl.manifest import Provenance
from reasonrl.models import load_policy
from reasonrl.tracking import Tracker, open_tracker, settings_from_environment
from reasonrl.training.loop import (
    CheckpointStore,
    LoopSettings,
    LossFn,
    LossUnits,
    StepHook,
    TrainingLoop,
    close_process_group,
    is_main_process,
    save_trained_model,
    train,
)
from reasonrl.training.lora import LoraSettings, add_adapters, merged
from reasonrl.training.reference import Reference


class TrainingRun:
    """One training stage's output folder, provenance and resumable checkpoints.

    `fingerprint_parts` are the settings that make a checkpoint reusable; the input hashes
    and the LoRA setting are appended to them (a LoRA run never resumes a full one: their
    checkpoints hold different models). `lora`: the section's adapters (None: none).
    """

    def __init__(
        self,
        stage: str,
        out_dir: str | Path,
        sections: dict,
        inputs: list[str],
        seed: int,
        *fingerprint_parts,
        lora: LoraSettings | None = None,
    ):
        self.out = Path(out_dir)
        self.lora, self.seed = lora, seed
        self.provenance = Provenance(stage, sections, inputs, seed)
        parts = [*fingerprint_parts, self.provenance.hashes]
        if lora and lora.enabled:  # r 0 is full fine-tuning whatever alpha or targets say
            parts.append(asdict(lora))
        self.fingerprint = hashlib.sha256(
            json.dumps(parts, sort_keys=True, default=str).encode()
        ).hexdigest()
        self.checkpoints = CheckpointStore(
            self.out.parent / f".{self.out.name}.ckpt", self.fingerprint
        )

    def load_policy(self, model_path: str, dtype: str) -> tuple[torch.nn.Module, object]:
        """The causal LM the run trains, on this process's device, and its tokenizer; with
        LoRA adapters (only they train) when the run has them, on a quantized base under
        QLoRA."""
        model, tokenizer = load_policy(model_path, dtype, **self.load_options(dtype))
        return self.adapt(model), tokenizer

    def load_options(self, dtype: str) -> dict:
        """from_pretrained's keywords for the model the run trains: a quantized base under
        QLoRA (lora.quantize), none otherwise; `dtype` is the policy's, computed in."""
        return self.lora.load_options(dtype) if self.lora else {}

    def adapt(
        self, model: torch.nn.Module, task: str = "CAUSAL_LM", trainable: tuple[str, ...] = ()
    ) -> torch.nn.Module:
        """`model` with the run's LoRA adapters, its `trainable` modules (a fresh head) trained
        in full beside them (training.lora.add_adapters); as it is without LoRA."""
        return add_adapters(model, self.lora, self.seed, task, trainable) if self.lora else model

    def load_reference(self, model_path: str, dtype: str) -> torch.nn.Module:
        """A frozen copy of a policy: the fixed reference of a KL penalty or a DPO loss."""
        return load_policy(model_path, dtype)[0].eval().requires_grad_(False)

    def reference(self, policy: torch.nn.Module, model_path: str, dtype: str) -> Reference:
        """The fixed reference at the start model `model_path`, which `policy` is
        (load_policy's, before any step): under LoRA the policy with its adapters off, no
        second copy; full fine-tuning moves every weight, so it loads a frozen copy."""
        if self.lora and self.lora.enabled:
            return Reference.without_adapters(policy)
        return Reference.frozen(self.load_reference(model_path, dtype))

    def fit(
        self,
        model: torch.nn.Module,
        batches,
        loss_fn: LossFn,
        settings: LoopSettings,
        on_step: StepHook | None = None,
        loss_units: LossUnits | None = None,
    ) -> dict:
        """The shared loop: `batches(i)` is micro-batch i, `loss_fn(model, batch)` its loss,
        `loss_units(batch)` what that loss is a mean over (see training.loop.LossUnits)."""
        tracker = self.tracker()
        return train(
            model, batches, loss_fn, settings, self.checkpoints, on_step, tracker, loss_units
        )

    def start(
        self,
        model: torch.nn.Module,
        loss_fn: LossFn,
        settings: LoopSettings,
        on_step: StepHook | None = None,
        loss_units: LossUnits | None = None,
    ) -> TrainingLoop:
        """The shared loop, set up and resumed, for a stage that makes its data between
        updates: it calls `run(batches, steps)` per update, then `finish()` for fit's result."""
        tracker = self.tracker()
        return TrainingLoop(
            model, loss_fn, settings, self.checkpoints, on_step, tracker, loss_units
        )

    def tracker(self) -> Tracker | None:
        """The invocation's tracker (REASONRL_TRACKING), logging under RUN_NAME/JOB where JOB
        is the output folder less results/ (models/sft-tool, rm/arith/prm): unique per rule
        and wildcards. Only the main process of accelerate launch logs."""
        if not is_main_process():
            return None
        return open_tracker(settings_from_environment(os.environ), self.job)

    @property
    def job(self) -> str:
        out = self.out.resolve()
        parts = out.relative_to(Path.cwd()).parts if out.is_relative_to(Path.cwd()) else ()
        return "/".join(parts[1:] if parts[:1] == ("results",) else parts) or out.name

    def metrics(self, result: dict, identity: dict, extra: dict, timed: bool = True) -> dict:
        """metrics.json: name, the run's `identity`, steps, resume point, final loss, train
        seconds (unless the stage times itself: `timed` False), `extra`, then the history."""
        history = result["history"]
        metrics = {
            "name": self.out.name,
            **identity,
            "steps": len(history),
            "resumed_from": result["resumed_from"],
            "final_loss": history[-1]["loss"] if history else None,
        }
        if timed:
            metrics["train_seconds"] = round(result["train_seconds"], 3)
        return {**metrics, **extra, "history": history}

    def save(
        self,
        model: torch.nn.Module,
        tokenizer,
        metrics: dict,
        state_dict: dict | None = None,
        extra_json: dict[str, dict] | None = None,
        summary: dict | None = None,
    ) -> None:
        """Weights (LoRA adapters merged in), tokenizer, metrics and manifest, atomically;
        then drop the checkpoints. `state_dict`: the loop's gathered one (ZeRO-3), which
        holds the adapters of a LoRA run; only the main process writes. It is the job's last
        collective: every process waits for the writing, then the process group is closed."""
        if is_main_process():
            adapted = hasattr(model, "merge_and_unload")
            save_trained_model(
                self.out, merged(model, state_dict), tokenizer, metrics, self.provenance,
                self.checkpoints, extra_json=extra_json, summary=summary,
                state_dict=None if adapted else state_dict,
            )  # fmt: skip
        close_process_group()
