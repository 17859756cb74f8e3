"""The generator process and the learner's side of the channel to it.

The generator is a separate process (reasonrl.rollout.generator_process: spawned, its own torch
threads) that owns a generation engine. It makes generation rounds in order; round g is N
mini-batches of prompts, K samples each, sampled with the policy version the schedule names:

- synchronous: version g*N, the learner's newest weights (generate, then train, then generate);
- asynchronous: version (g-1)*N, so round g is sampled while the learner trains on round g-1.

Weights flow learner -> generator through `engine.load_weights` (no engine restart); rounds
flow back with the version that sampled them. Both modes run this same code: only the
version a round waits for differs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.rollout import generator_process
from reasonrl.rollout.generator_process import next_request
from reasonrl.training.lora import merged_state_dict

if TYPE_CHECKING:
    from reasonrl.online_dpo.settings import OnlineDPOSettings
    from reasonrl.rollout import RolloutEnvironment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Schedule:
    steps: int
    minibatches_per_round: int  # off-policyness N
    asynchronous: bool

    def __post_init__(self):
        if self.steps % self.minibatches_per_round:
            raise ReasonRLError(
                f"online_dpo: steps ({self.steps}) must be a multiple of "
                f"off_policy ({self.minibatches_per_round})"
            )

    @property
    def rounds(self) -> int:
        return self.steps // self.minibatches_per_round

    def round_of(self, step_index: int) -> tuple[int, int]:
        """(round, mini-batch within it) that 0-based optimizer step `step_index` trains on."""
        return divmod(step_index, self.minibatches_per_round)

    def generator_version(self, round_no: int) -> int:
        """The policy version (optimizer steps taken) that samples round `round_no`."""
        behind = 1 if self.asynchronous else 0
        return max(0, round_no - behind) * self.minibatches_per_round

    def needed_versions(self) -> set[int]:
        return {self.generator_version(g) for g in range(self.rounds)}


@dataclass(frozen=True)
class GeneratorSpec:
    """Everything the generator process needs (picklable: it crosses the spawn)."""

    settings: OnlineDPOSettings
    environment: RolloutEnvironment  # engine, caps, sandbox (it makes its own) and dtype
    model_path: str
    problems: list[dict]
    style: str
    schedule: Schedule
    first_round: int
    threads: int
    reward_model: str | None = None
    # CUDA_VISIBLE_DEVICES of the generator when it has a GPU of its own (generator_devices);
    # None: the learner's (its main process's GPU)
    visible_devices: str | None = None


def round_problems(spec: GeneratorSpec, round_no: int, batch: int = 0) -> list[dict]:
    """The prompts of a round: N x prompts_per_step from a seeded order of the train split,
    cycling when the rounds outnumber it. `batch` > 0: the round's refill batch of that
    number (the GRPO family's dynamic sampling), as many prompts drawn from the split by a
    seed of the round and the batch."""
    import random

    count = spec.schedule.minibatches_per_round * spec.settings.prompts_per_step
    order = list(range(len(spec.problems)))
    if batch:
        draw = random.Random(f"{spec.settings.seed}-refill-{round_no}-{batch}")
        return [spec.problems[draw.choice(order)] for _ in range(count)]
    random.Random(spec.settings.seed).shuffle(order)
    start = round_no * count
    return [spec.problems[order[(start + i) % len(order)]] for i in range(count)]


def _generate_rounds(spec: GeneratorSpec, weights, data, stop) -> None:
    from reasonrl.generation import make_engine
    from reasonrl.rewards.sequence import SequenceScorer
    from reasonrl.sandbox import Sandbox

    environment = spec.environment
    engine = make_engine(environment.generation, spec.model_path, environment.dtype)
    scorer = SequenceScorer(
        spec.settings.reward, spec.reward_model, environment.dtype, "online_dpo.reward"
    )
    sandbox = Sandbox.from_settings(environment.sandbox)
    version = None
    for round_no in range(spec.first_round, spec.schedule.rounds):
        need = spec.schedule.generator_version(round_no)
        waited, loading = 0.0, 0.0
        while version is None or version < need:
            t0 = time.perf_counter()
            message = next_request(weights, stop)
            if message is None:
                return
            t1 = time.perf_counter()
            version, state = message
            engine.load_weights(state)
            waited += t1 - t0
            loading += time.perf_counter() - t1
        if version > need:
            # Only after a resume: the weights of `need` are gone; the round says what it used.
            log.warning("round %d: sampling with version %d (wanted %d)", round_no, version, need)
        t0 = time.perf_counter()
        rows, counts = sample_round(engine, sandbox, scorer, spec, round_no)
        data.put(
            (
                "round",
                {
                    "round": round_no,
                    "version": version,
                    "rows": rows,
                    "sampling": counts,
                    "gen_seconds": time.perf_counter() - t0,
                    "weight_wait_seconds": waited,
                    "weight_load_seconds": loading,
                },
            )
        )
        if stop.is_set():
            return


def sample_round(
    engine, sandbox, scorer, spec: GeneratorSpec, round_no: int
) -> tuple[list[dict], dict]:
    """K tool-loop samples per prompt of the round (prompt-major), graded and scored by
    `scorer`, with their log-probs under the sampling policy (the denominator of Proximal
    RLOO's ratio) taken on the token ids it sampled; and the round's sampling counts.

    Under the GRPO family's dynamic sampling (DAPO) a group whose rewards all tie (no policy
    gradient) is dropped and the round refilled from further batches of prompts
    (round_problems' refill batches), up to grpo.max_sampling_batches batches in all; a round
    still short then keeps tied groups, first drawn first, to its size."""
    settings = spec.settings
    grpo = settings.grpo
    if grpo is None or not grpo.dynamic_sampling:
        return _sampled(engine, sandbox, scorer, spec, round_no, 0), {"sampling_batches": 1.0}
    from reasonrl.training.grpo import shaped_rewards, tied

    k = settings.samples_per_prompt
    size = spec.schedule.minibatches_per_round * settings.prompts_per_step
    kept: list[list[dict]] = []
    ties: list[list[dict]] = []
    batches = 0
    while len(kept) < size and batches < grpo.max_sampling_batches:
        rows = _sampled(engine, sandbox, scorer, spec, round_no, batches)
        batches += 1
        for start in range(0, len(rows), k):
            group = rows[start : start + k]
            rewards = [row["reward"] for row in group]
            shaped = shaped_rewards(rewards, [row["num_tokens"] for row in group], grpo)
            (ties if tied(shaped) else kept).append(group)
    groups = (kept + ties)[:size]
    tied_kept = len(groups) - min(len(kept), size)
    counts = {
        "sampling_batches": float(batches),
        "tied_groups_dropped": float(len(ties) - tied_kept),
        "tied_groups_kept": float(tied_kept),
    }
    return [row for group in groups for row in group], counts


def _sampled(engine, sandbox, scorer, spec: GeneratorSpec, round_no: int, batch: int) -> list[dict]:
    """One batch of a round's samples (batch 0: the round's prompts; then refills)."""
    from reasonrl.rollout import run_rollouts
    from reasonrl.sequences import sampled_trajectory
    from reasonrl.training.online_dpo import sample_reward

    settings = spec.settings
    seed = settings.seed * 1_000_003 + round_no
    params = replace(settings.sampling, seed=seed if not batch else seed * 7 + batch)
    rows = run_rollouts(
        engine,
        round_problems(spec, round_no, batch),
        spec.style,
        settings.samples_per_prompt,
        params,
        spec.environment.limits,
        sandbox,
        policy=f"round{round_no}" if not batch else f"round{round_no}-refill{batch}",
    )
    seqs = [
        sampled_trajectory(
            engine.tokenizer, row["messages"], row["turn_token_ids"], settings.max_length
        )
        for row in rows
    ]
    # PPO's and GRPO's ratios are per token; the other losses need sequence sums only.
    per_token = engine.token_logps(seqs) if settings.per_token else None
    behaviour = [sum(t) for t in per_token] if per_token else engine.sequence_logps(seqs)
    scores, _ = scorer(rows)
    out = [
        {
            "problem_id": row["problem_id"],
            "messages": row["messages"],
            "correct": row["correct"],
            "finish_reason": row["finish_reason"],
            "num_tokens": row["num_tokens"],
            "turn_token_ids": row["turn_token_ids"],
            "reward": sample_reward(score, row["finish_reason"], settings.eos_penalty),
            "behaviour_logp": logp,
        }
        for row, score, logp in zip(rows, scores, behaviour, strict=True)
    ]
    for row, tokens in zip(out, per_token or [], strict=False):
        row["behaviour_token_logps"] = tokens
    return out


class GeneratorProcess(generator_process.GeneratorProcess):
    """The learner's handle on the generator: push weights, receive rounds, shut down (a
    context manager: leaving it stops the process and waits for it)."""

    def __init__(self, spec: GeneratorSpec):
        super().__init__(_generate_rounds, spec)

    def push(self, version: int, model: torch.nn.Module) -> None:
        """Send `model`'s weights as version `version`: a LoRA policy's merged into the plain
        model's (the generator's engine is a plain model), the policy itself unchanged."""
        state = {k: v.detach().clone() for k, v in merged_state_dict(model).items()}
        self.send((version, state))

    def next_round(self) -> dict:
        """The next round the generator made (blocks); raises if it failed or died."""
        return self.reply()
