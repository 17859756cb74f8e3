"""A generation engine in a process of its own, driven by a training job's main process.

A training job's main process can sample with an engine in a child process (spawned, its
own torch threads): without the launch's environment (a one-process program beside a
data-parallel job), on a GPU of its own where the job has one (`generator_devices`), killed
with its parent. The job's side (`GeneratorProcess`) sends requests and receives replies;
an error in the child comes back as one, and a child that died is noticed while waiting.
What the child does is its `main(spec, requests, replies, stop)`: online DPO's round loop
(online_dpo.actors), or `serve_rollouts`, which loads the weights it is sent and makes the
rollouts it is asked for (PPO's: `RolloutServer`).
"""

from __future__ import annotations

import ctypes
import logging
import os
import queue
import signal
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reasonrl.errors import ReasonRLError

if TYPE_CHECKING:
    from reasonrl.rollout.environment import RolloutEnvironment

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5
PR_SET_PDEATHSIG = 1

# What torchrun / accelerate launch tell a process of a data-parallel job. The generator,
# started by the main process of such a job, is a one-process program: with these it would
# take itself for the job's rank 0 and wait for the others to join it.
LAUNCH_VARIABLES = (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
)  # fmt: skip


def generator_devices(visible: str | None, learner_processes: int) -> str:
    """The GPU of a generator with one of its own, as its CUDA_VISIBLE_DEVICES: the job's
    first visible device after the learner's (local ranks 0..learner_processes-1 take the
    first ones; `visible` is the job's CUDA_VISIBLE_DEVICES, None: all of the node's)."""
    if visible is None:
        return str(learner_processes)
    devices = [d for d in visible.split(",") if d]
    if len(devices) <= learner_processes:
        raise ReasonRLError(
            f"the generator's GPU: CUDA_VISIBLE_DEVICES={visible} has no device after the"
            f" learner's {learner_processes}"
        )
    return devices[learner_processes]


def enter_generator_environment(visible_devices: str | None) -> None:
    """Before anything touches CUDA: leave the launch's environment (a one-process program)
    and take the GPU of the generator's own (`visible_devices`), where it has one."""
    for name in LAUNCH_VARIABLES:
        os.environ.pop(name, None)
    if visible_devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible_devices


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this process when its parent dies (even by SIGKILL)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        log.warning("prctl is not available: the generator may outlive a killed learner")


def next_request(requests: queue.Queue, stop):
    """The next request, or None once the job asked the child to stop."""
    while not stop.is_set():
        try:
            return requests.get(timeout=POLL_SECONDS)
        except queue.Empty:
            continue
    return None


def _child(main: Callable, spec, requests, replies, stop) -> None:
    """Process entry point: `main` with the generator's environment; errors go back as a
    reply. `spec` has the child's `threads` and `visible_devices`."""
    _die_with_parent()
    enter_generator_environment(spec.visible_devices)
    # Ctrl-C reaches the whole process group; the learner decides and stops us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(spec.threads)
    try:
        main(spec, requests, replies, stop)
    except Exception:
        replies.put(("error", traceback.format_exc()))


class GeneratorProcess:
    """The job's handle on a generator child running `main(spec, ...)`: send requests,
    receive replies, shut down.

    Used as a context manager: leaving it (success, error, Ctrl-C) stops the process and
    waits for it, so nothing outlives the learner.
    """

    def __init__(self, main: Callable, spec):
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self.requests = context.Queue()
        self.replies = context.Queue()
        self.stop = context.Event()
        self.process = context.Process(
            target=_child,
            args=(main, spec, self.requests, self.replies, self.stop),
            name="reasonrl-generator",
            daemon=True,
        )

    def __enter__(self) -> GeneratorProcess:
        self.process.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, request) -> None:
        self.requests.put(request)

    def reply(self):
        """The child's next reply (blocks); raises if it failed or died."""
        while True:
            try:
                kind, payload = self.replies.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if not self.process.is_alive():
                    raise ReasonRLError(
                        f"the generator process died (exit code {self.process.exitcode})"
                    ) from None
                continue
            if kind == "error":
                raise ReasonRLError(f"the generator process failed:\n{payload}")
            return payload

    def close(self) -> None:
        self.stop.set()
        self.process.join(timeout=5 * POLL_SECONDS)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        for channel in (self.requests, self.replies):
            channel.cancel_join_thread()
            channel.close()


@dataclass(frozen=True)
class RolloutSpec:
    """What a rollout server needs (picklable: it crosses the spawn): the rollouts'
    environment (engine, caps, sandbox, dtype); the start model its engine loads."""

    environment: RolloutEnvironment
    model_path: str
    threads: int
    visible_devices: str | None = None


def serve_rollouts(spec: RolloutSpec, requests, replies, stop) -> None:
    """The rollout server's main: an engine of generation.engine made from the start model;
    ("weight", name, tensor) requests collect a new state one entry at a time, ("load",)
    loads it into the engine, ("rollouts", problems, style, samples, params, policy) replies
    with run_rollouts' rows."""
    from reasonrl.generation import make_engine
    from reasonrl.rollout import run_rollouts
    from reasonrl.sandbox import Sandbox

    environment = spec.environment
    engine = make_engine(environment.generation, spec.model_path, environment.dtype)
    limits = environment.limits
    sandbox = Sandbox.from_settings(environment.sandbox)
    state: dict[str, torch.Tensor] = {}
    while (request := next_request(requests, stop)) is not None:
        kind, *body = request
        if kind == "weight":
            name, tensor = body
            state[name] = tensor
        elif kind == "load":
            engine.load_weights(state)
            state = {}
        else:
            problems, style, samples, params, policy = body
            rows = run_rollouts(engine, problems, style, samples, params, limits, sandbox, policy)
            replies.put(("rows", rows))


class RolloutServer(GeneratorProcess):
    """The job's handle on a `serve_rollouts` child."""

    def __init__(self, spec: RolloutSpec):
        super().__init__(serve_rollouts, spec)

    def load_weights(self, entries: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Send the policy's state one entry at a time (each (name, CPU tensor) may be made
        just before it is sent, so the sender need not hold them all), then load it."""
        for name, tensor in entries:
            self.send(("weight", name, tensor))
        self.send(("load",))

    def rollouts(self, problems: list[dict], style: str, samples: int, params, policy: str):
        """run_rollouts' rows of `samples` per problem, made by the child's engine."""
        self.send(("rollouts", problems, style, samples, params, policy))
        return self.reply()
