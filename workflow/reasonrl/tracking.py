"""Experiment tracking: the training loop's per-step metrics, sent to TensorBoard, Weights &
Biases or MLflow through those libraries themselves (or nowhere).

One workflow invocation is one run: the Snakefile resolves the `tracking` config section and
its run name once (`workflow_environment`) and puts it in the environment variable
REASONRL_TRACKING. Rule commands inherit it, SLURM jobs too (sbatch exports the submitting
environment), and the Snakemake a SLURM job starts keeps the name it inherits rather than
making a new one, so every job of one invocation logs under one run name: RUN_NAME/JOB, JOB
naming the rule's output. A command run by hand, without the variable, tracks nothing.

The backends' packages are imported only when chosen, so a missing optional one is one line
naming the backend and its pip package.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

from reasonrl.errors import ReasonRLError

ENV_VAR = "REASONRL_TRACKING"
# backend -> (the module it imports, the pip package that provides it)
PACKAGES = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow-skinny"),
}


@dataclass(frozen=True)
class TrackingSettings:
    """The `tracking` config section with its run name resolved."""

    backend: str
    dir: str
    project: str
    run_name: str
    offline: bool = True


class Tracker(Protocol):
    def log(self, step: int, metrics: Mapping[str, object]) -> None: ...

    def close(self) -> None: ...


def scalars(metrics: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers of a history entry, less its step (the x axis of every backend)."""
    return {
        key: float(value)
        for key, value in metrics.items()
        if key != "step"
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def new_run_name(config: Mapping, now: float | None = None) -> str:
    """UTC time of the invocation and a short hash of its config: sortable, and two
    invocations with different configs never share a name."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    digest = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()
    return f"{stamp}-{digest[:8]}"


def workflow_environment(config: Mapping, environ: Mapping[str, str]) -> str:
    """REASONRL_TRACKING's value for this invocation: config["tracking"] with its run name
    (the configured one, else the one an enclosing invocation passed down, else a new one)."""
    section = dict(config["tracking"])
    if not section["run_name"]:
        inherited = settings_from_environment(environ)
        section["run_name"] = inherited.run_name if inherited else new_run_name(config)
    return json.dumps(asdict(TrackingSettings(**section)), sort_keys=True)


def settings_from_environment(environ: Mapping[str, str]) -> TrackingSettings | None:
    """The invocation's settings, or None outside a workflow (nothing is tracked)."""
    raw = environ.get(ENV_VAR)
    if not raw:
        return None
    try:
        return TrackingSettings(**json.loads(raw))
    except (ValueError, TypeError) as err:
        raise ReasonRLError(f"environment variable {ENV_VAR}: {err}") from None


def _import(backend: str):
    module, package = PACKAGES[backend]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ReasonRLError(
            f"tracking.backend {backend}: cannot import {module} ({err}): "
            f"pip install {package}, or set tracking.backend: none"
        ) from None


class NullTracker:
    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardTracker:
    """Event files under DIR/RUN_NAME/JOB (`tensorboard --logdir DIR` shows every job)."""

    def __init__(self, settings: TrackingSettings, job: str):
        _import("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(settings.dir, settings.run_name, job)))

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, step)
        # A step takes seconds; flushing each keeps the curve of a killed job.
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run named RUN_NAME/JOB in group RUN_NAME; offline: files under DIR/wandb that
    `wandb sync` uploads later."""

    def __init__(self, settings: TrackingSettings, job: str):
        wandb = _import("wandb")
        Path(settings.dir).mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=settings.project,
            name=f"{settings.run_name}/{job}",
            group=settings.run_name,
            job_type=job.split("/")[0],
            dir=settings.dir,
            mode="offline" if settings.offline else "online",
            settings=wandb.Settings(silent=True, console="off"),
        )

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        self.run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MLflowTracker:
    """An MLflow run named RUN_NAME/JOB (tagged with RUN_NAME) in experiment PROJECT; offline:
    in the file store DIR/mlruns, else at mlflow's own tracking URI (MLFLOW_TRACKING_URI)."""

    def __init__(self, settings: TrackingSettings, job: str):
        mlflow = _import("mlflow")
        uri = None
        if settings.offline:
            # MLflow 3 keeps its file store in maintenance mode and refuses it unless asked:
            # it needs no database driver (mlflow-skinny has none) and `mlflow ui` reads it.
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
            uri = Path(settings.dir, "mlruns").resolve().as_uri()
        self.client = mlflow.MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(settings.project)
        experiment_id = (
            experiment.experiment_id
            if experiment is not None
            else self.client.create_experiment(settings.project)
        )
        self.run_id = self.client.create_run(
            experiment_id,
            run_name=f"{settings.run_name}/{job}",
            tags={"reasonrl.run_name": settings.run_name, "reasonrl.job": job},
        ).info.run_id
        self.metric = mlflow.entities.Metric

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        stamp = int(time.time() * 1000)
        batch = [self.metric(k, v, stamp, step) for k, v in scalars(metrics).items()]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS = {
    "tensorboard": TensorBoardTracker,
    "wandb": WandbTracker,
    "mlflow": MLflowTracker,
}


def open_tracker(settings: TrackingSettings | None, job: str) -> Tracker:
    """The tracker of one training job, logging under RUN_NAME/`job`."""
    if settings is None or settings.backend == "none":
        return NullTracker()
    if settings.backend not in BACKENDS:
        raise ReasonRLError(f"tracking.backend: unknown backend '{settings.backend}'")
    return BACKENDS[settings.backend](settings, job)
