"""The learner side of online DPO / Proximal RLOO / PPO: rounds -> mini-batches -> updates.

`learn` is the loop: optimizer step i trains on mini-batch i % N of round i // N. Rounds
arrive from the generator and are also written to a rounds folder next to the checkpoints,
so a resumed run replays the rounds it had (exact resume) and the generator only makes the
missing ones.

Under accelerate launch (one process per GPU, data parallel) the main process owns the
generator and the rounds folder: it receives each round and broadcasts it, and sends the
generator its weights; each process scores its contiguous share of the step's samples with
the reference (all receive every row's), every process makes the step's micro-batches and
trains on its own share of them (the loop's micro-batch index), so a step over N processes
is the step of one.
"""

from __future__ import annotations

import math
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from reasonrl.errors import ReasonRLError
from reasonrl.io import read_json, write_json
from reasonrl.online_dpo.actors import GeneratorProcess, Schedule
from reasonrl.online_dpo.settings import OnlineDPOSettings
from reasonrl.sequences import MaskedSequence, sampled_trajectory, summed_logps, token_logps
from reasonrl.training.grpo import GroupTargets, group_targets, grpo_batch
from reasonrl.training.loop import (
    LoopSettings,
    MainBroadcast,
    TrainingLoop,
    data_parallel_processes,
    gathered_over_processes,
)
from reasonrl.training.online_dpo import (
    TRUNCATED,
    add_ppo_targets,
    best_worst,
    critic_values,
    dpo_batch,
    online_ppo_settings,
    ppo_batch,
    rloo_batch,
)
from reasonrl.training.ppo import PolicyCritic
from reasonrl.training.reference import Reference

# TrainingLoop.evaluate: fn(model, batch) without gradients, as the loss sees the model.
Evaluate = Callable[[Callable[[torch.nn.Module, dict], torch.Tensor], dict], torch.Tensor]


def micro_batches_per_step(settings: OnlineDPOSettings) -> int:
    """The micro-batches of each optimizer step (the loop's grad_accum); the last one has
    the prompts left over where micro_batch_prompts does not divide prompts_per_step."""
    return math.ceil(settings.prompts_per_step / settings.micro_batch_prompts)


def loop_settings(settings: OnlineDPOSettings) -> LoopSettings:
    """The training loop's settings of an online run: a step per mini-batch, its
    micro-batches shared out over the job's data-parallel processes and accumulated on each."""
    micro, processes = micro_batches_per_step(settings), data_parallel_processes()
    if micro % processes:
        raise ReasonRLError(
            f"online_dpo: a step's {micro} micro-batches (prompts_per_step /"
            f" micro_batch_prompts) do not share out over {processes} processes"
        )
    return replace(settings.loop, grad_accum=micro // processes)


class RoundStore:
    """Received rounds as round-{g}.json, stamped with the run's fingerprint."""

    def __init__(self, folder: Path, fingerprint: str):
        self.folder = Path(folder)
        self.fingerprint = fingerprint

    def reset_unless_resuming(self, resuming: bool) -> None:
        stamp = self.folder / "fingerprint"
        stale = stamp.exists() and stamp.read_text() != self.fingerprint
        if self.folder.exists() and (stale or not resuming):
            shutil.rmtree(self.folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        stamp.write_text(self.fingerprint)

    def stored(self) -> int:
        """How many rounds 0, 1, ... are on disk without a gap."""
        count = 0
        while (self.folder / f"round-{count}.json").exists():
            count += 1
        return count

    def load(self, round_no: int) -> dict:
        return read_json(self.folder / f"round-{round_no}.json")

    def save(self, payload: dict) -> None:
        write_json(self.folder / f"round-{payload['round']}.json", payload)

    def step_prompts(self, schedule: Schedule, prompts_per_step: int, k: int) -> list[list[str]]:
        """The problem ids each optimizer step trained on, from the stored rounds (all of them
        are on disk until the run ends, a resumed run's too): rows are prompt-major, K each."""
        per_step = prompts_per_step * k
        steps = []
        for round_no in range(schedule.rounds):
            rows = self.load(round_no)["rows"]
            for part in range(schedule.minibatches_per_round):
                batch = rows[part * per_step : (part + 1) * per_step]
                steps.append([row["problem_id"] for row in batch[::k]])
        return steps

    def clear(self) -> None:
        if self.folder.exists():
            shutil.rmtree(self.folder)


def best_worst_pairs(
    rewards: list[float], k: int
) -> tuple[list[tuple[int, int]], list[float], int]:
    """The DPO pair of each prompt's k samples (consecutive rows): (best, worst) row indices,
    their reward margins, and how many prompts had no pair (all rewards tied)."""
    pairs, margins, ties = [], [], 0
    for start in range(0, len(rewards), k):
        choice = best_worst(rewards[start : start + k])
        if choice is None:
            ties += 1
            continue
        pairs.append((start + choice.best, start + choice.worst))
        margins.append(choice.margin)
    return pairs, margins, ties


class Learner:
    """The learner's side of the run: rounds in, mini-batches out, weights back.
    `generator`: the main process's; None on the other processes of a launched job (their
    rounds come from the main one)."""

    def __init__(
        self,
        generator: GeneratorProcess | None,
        store: RoundStore,
        schedule: Schedule,
        settings: OnlineDPOSettings,
        tokenizer,
        reference: Reference,
    ):
        self.generator = generator
        self.store = store
        self.schedule = schedule
        self.settings = settings
        self.tokenizer = tokenizer
        self.reference = reference
        self.started = time.perf_counter()  # the wall-clock counts the generator's start-up
        self.clock_offset = 0.0
        self.pushed_once = False
        self.step_metrics: dict = {}  # of the step being trained (micro_batches makes them)
        self.processes = data_parallel_processes()
        self._broadcast = MainBroadcast()  # the main process's rounds to the others

    # -- data ---------------------------------------------------------------------------------

    def receive(self, round_no: int) -> tuple[dict, float]:
        """The round's samples with their rewards and the seconds the learner waited for them:
        from the rounds folder when a resumed run had it, else from the generator (stored);
        on the main process, which sends it to the others of a launched job."""
        t0 = time.perf_counter()
        payload = None
        if self.generator is not None:
            payload = self._own_round(round_no)
        if self.processes > 1:
            payload = self._broadcast(payload)
        return payload, time.perf_counter() - t0

    def _own_round(self, round_no: int) -> dict:
        if (self.store.folder / f"round-{round_no}.json").exists():
            return self.store.load(round_no)
        payload = self.generator.next_round()
        if payload["round"] != round_no:
            raise RuntimeError(f"expected round {round_no}, got {payload['round']}")
        self.store.save(payload)
        return payload

    def micro_batches(
        self, payload: dict, step: int, waited: float, evaluate: Evaluate
    ) -> list[dict]:
        """Optimizer step `step`'s micro-batches from its mini-batch of the round: the
        reference's log-probs, then per micro-batch of online_dpo.micro_batch_prompts prompts
        (a prompt's K samples in one) the DPO pairs (best vs worst of each prompt) or the
        RLOO / PPO / GRPO rows (the loop weighs each by OnlineObjective.units). The step's
        metrics, of its whole mini-batch, wait in `step_metrics` for on_step (`waited`: the
        seconds this step waited for the round). `evaluate`: TrainingLoop.evaluate, for PPO's
        critic values."""
        _, part = self.schedule.round_of(step)
        k = self.settings.samples_per_prompt
        per_step = self.settings.prompts_per_step * k
        rows = payload["rows"][part * per_step : (part + 1) * per_step]
        t0 = time.perf_counter()
        # The samples as sampled (token ids, a capped turn without an end-of-turn token): the
        # KL below and the pairs are about what the policy produced. Capped samples stay in the
        # pairs: their EOS penalty ranks them, and dropping them would drop most pairs of a
        # policy that often hits the cap.
        seqs = [
            sampled_trajectory(
                self.tokenizer, row["messages"], row["turn_token_ids"], self.settings.max_length
            )
            for row in rows
        ]
        ref_tokens = None
        if self.settings.per_token:
            ref_tokens = self._reference(seqs, token_logps)
            ref = [sum(values) for values in ref_tokens]
        else:
            ref = self._reference(seqs, summed_logps)
        # GRPO's advantages are the step's: a `batch` scale spans its micro-batches
        targets = self._group_targets(rows) if self.settings.loss == "grpo" else None
        size = self.settings.micro_batch_prompts * k
        spans = [slice(i, i + size) for i in range(0, len(rows), size)]
        batches = [
            self._micro_batch(
                rows[s], seqs[s], ref[s], ref_tokens[s] if ref_tokens else None, targets, s
            )
            for s in spans
        ]
        if self.settings.loss == "ppo":
            # each process its share of the micro-batches; every one receives all values
            values = gathered_over_processes(
                lambda part: [evaluate(critic_values, batch) for batch in part], batches
            )
            ppo = online_ppo_settings(self.settings.beta, self.settings.clip)
            add_ppo_targets(batches, values, ppo)
        self.step_metrics = self._metrics(payload, step, rows, ref, seqs, waited)
        if targets is not None:
            self.step_metrics.update(targets.signals)
        # the step's batch: reference log-probs, pairs or rows, PPO's critic values
        self.step_metrics["reference_seconds"] = time.perf_counter() - t0
        return batches

    def _reference(self, seqs: list[MaskedSequence], logps: Callable) -> list:
        """`logps(reference, seqs, pad, rows)` of every sequence, in order, in forward passes
        of online_dpo.reference_rows sequences: over several processes each scores its
        contiguous share and every process receives all of them."""
        pad, rows = self.tokenizer.pad_token_id, self.settings.reference_rows
        with self.reference.evaluating() as reference:
            return gathered_over_processes(lambda part: logps(reference, part, pad, rows), seqs)

    def _group_targets(self, rows: list[dict]) -> GroupTargets:
        """The GRPO family's advantages of a step's samples (and which of them train)."""
        return group_targets(
            [row["reward"] for row in rows],
            [row["finish_reason"] in TRUNCATED for row in rows],
            [row["num_tokens"] for row in rows],
            self.settings.samples_per_prompt,
            self.settings.grpo,
        )

    def _micro_batch(
        self,
        rows: list[dict],
        seqs: list[MaskedSequence],
        ref: list[float],
        ref_tokens: list[list[float]] | None,
        targets: GroupTargets | None,
        span: slice,
    ) -> dict:
        """The DPO pairs, RLOO, PPO or GRPO rows of whole prompts' samples (`span` of the
        step's), with the reference's log-probs of those rows (summed; per token for PPO and
        GRPO) and GRPO's advantages (`targets`, the step's)."""
        pad = self.tokenizer.pad_token_id
        rewards = [row["reward"] for row in rows]
        if self.settings.loss == "dpo":
            pairs, _, _ = best_worst_pairs(rewards, self.settings.samples_per_prompt)
            return dpo_batch(seqs, ref, pairs, pad)
        old = [row.get("behaviour_token_logps") for row in rows]
        if self.settings.loss == "ppo":
            return ppo_batch(seqs, old, ref_tokens, rewards, pad)
        if targets is not None:
            advantages, trained = targets.advantages[span], targets.trained[span]
            return grpo_batch(seqs, old, ref_tokens, advantages, trained, pad)
        behaviour = [row["behaviour_logp"] for row in rows]
        return rloo_batch(seqs, ref, behaviour, rewards, pad)

    def _metrics(
        self,
        payload: dict,
        step: int,
        rows: list[dict],
        ref: list[float],
        seqs: list[MaskedSequence],
        waited: float,
    ) -> dict:
        """The step's metrics, of its whole mini-batch."""
        round_no, part = self.schedule.round_of(step)
        rewards = [row["reward"] for row in rows]
        behaviour = [row["behaviour_logp"] for row in rows]
        _, margins, ties = best_worst_pairs(rewards, self.settings.samples_per_prompt)
        tokens = sum(sum(s.mask) for s in seqs)
        version = payload["version"]
        return {
            "reward": sum(rewards) / len(rewards),
            "reward_std": statistics.pstdev(rewards),
            "correct": sum(row["correct"] for row in rows) / len(rows),
            "win_margin": sum(margins) / len(margins) if margins else 0.0,
            "pairs": float(len(margins)),
            "ties": float(ties),
            # KL(pi_gen || pi_sft) estimated on the samples, and the SFT policy's perplexity.
            # Both log-probs are at temperature 1: the estimate is on-sample only when
            # online_dpo.temperature is 1 and top_p 1 (the default).
            "kl": sum(b - r for b, r in zip(behaviour, ref, strict=True)) / len(rows),
            "ref_perplexity": math.exp(-sum(ref) / max(1, tokens)),
            # The work: samples and generated tokens of this mini-batch (sync and async
            # must match in expectation, or their wall-clocks do not compare).
            "samples": float(len(rows)),
            "gen_tokens": float(sum(row["num_tokens"] for row in rows)),
            "policy_version": float(version),
            "lag": float(step - version),
            "round": float(round_no),
            # the round's sampling (dynamic sampling's batches and tied groups), on its first
            # step as its generation time
            **{key: value if part == 0 else 0.0 for key, value in payload["sampling"].items()},
            "gen_seconds": payload["gen_seconds"] if part == 0 else 0.0,
            "generator_weight_wait_seconds": payload["weight_wait_seconds"] if part == 0 else 0.0,
            "weight_load_seconds": payload["weight_load_seconds"] if part == 0 else 0.0,
            "data_wait_seconds": waited,
        }

    # -- weights ------------------------------------------------------------------------------

    def on_step(self, step: int, model: torch.nn.Module, history: list[dict]) -> dict | None:
        """Push the weights a later round samples with; add the step's metrics (of its whole
        mini-batch) and its wall-clock to its history entry."""
        t0 = time.perf_counter()
        if isinstance(model, PolicyCritic):
            model = model.policy  # the generator samples with the policy, not the critic
        if not self.pushed_once:
            # The start (or the resumed step): the generator begins with these weights.
            self.pushed_once = True
            self.clock_offset = history[-1]["elapsed"] if history else 0.0
            self._push(step, model)
            return None
        if step in self.schedule.needed_versions():
            self._push(step, model)
        now = time.perf_counter()
        return {
            **self.step_metrics,
            "weight_push_seconds": now - t0,
            "elapsed": self.clock_offset + now - self.started,
        }

    def _push(self, step: int, model: torch.nn.Module) -> None:
        if self.generator is not None:  # the main process's (DDP / ZeRO-2: whole weights)
            self.generator.push(step, model)


def learn(loop: TrainingLoop, learner: Learner, schedule: Schedule) -> None:
    """The online loop, from the step the loop resumed at: per round, receive its samples
    (generated and scored in the generator process by the policy version the schedule names),
    then per mini-batch: reference log-probs -> pairs (or the RLOO / PPO rows) in micro-batches
    -> one update.
    After each step `learner.on_step` sends the weights a later round samples with."""
    n = schedule.minibatches_per_round
    for round_no in range(loop.step // n, schedule.rounds):
        payload, waited = learner.receive(round_no)
        for step in range(loop.step, (round_no + 1) * n):
            batches = learner.micro_batches(payload, step, waited, loop.evaluate)
            # One update over the step's micro-batches (the loop's grad_accum on each of its
            # processes): micro-batch index i of the run is the step's i % len(batches).
            loop.run(lambda index, batches=batches: batches[index % len(batches)], 1)
            waited = 0.0
