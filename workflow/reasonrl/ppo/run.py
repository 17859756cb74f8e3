"""One PPO / PF-PPO run on the shared training loop: its models, prompts and experience.

The stage (stages/ppo.py: ppo) runs the iterations; each one scores the live policy on the
held-out prompts and keeps the best (`PPORun.start_iteration`), fills its buffer
(`PPORun.fill_buffer`: sample N responses per prompt through the rollout loop, score them,
filter them, compute old log-probs, values, SFT log-probs, per-token rewards and GAE), then
updates on it: the shared loop walks the buffer for `ppo_epochs` epochs (`BufferBatches`,
loss training.ppo.PPOObjective). Checkpoints fall on iteration boundaries, so a resumed run
refills the same buffer from the same policy and seeds: exact resume.

Under accelerate launch (one process per GPU, data parallel) each process samples and scores
its contiguous share of the prompts with its own copy of the policy (the HF engine), and
computes the buffer's forward passes for its share of the kept rows; the rows, scores and
buffer parts are gathered in order, so every process filters, normalises and whitens the
same whole buffer as one process would, then trains on its own micro-batches of it. Under
DeepSpeed ZeRO-3, which shards the policy and critic, each process samples with the
policy's parameters gathered whole (training.zero3), runs as many buffer forward passes as
the process with the most rows (idle ones on a dummy row), and the best iteration's weights
are gathered to save and sent back into the shards to restore. The frozen reference (a
copy, not LoRA's adapters-off policy) and the reward model are sharded alike
(training.zero3.frozen_shards), so each of their forwards is a collective too: a process
that scores fewer samples runs idle reward-model forwards up to the most any process runs,
as the buffer's idle forwards cover the reference's. A vLLM engine in each process is not
supported over several processes (check_launch: it would start its own process group
inside the job's).

With a generator on a GPU of its own (resource generator_gpus: 1) the main process drives
one rollout server (generator_process.RolloutServer, with generation.engine's engine): it
sends it the policy's weights after each update (under ZeRO-3 gathered one parameter at a
time, so no process holds a second whole copy; LoRA's merged one weight at a time over the
policy gathered whole), has it sample all the prompts with the one-process seed and shares
the rollouts out to every process, which scores its contiguous share of them (the reward
model's forwards in step, as above).

Compute accounting rides in each step's stats (summed per iteration in metrics.json):
queries, responses, reward-model passes, policy and critic forward-backward passes.
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from accelerate import PartialState

from reasonrl.chat import tokenize_chat
from reasonrl.errors import ReasonRLError
from reasonrl.generation import SamplingParams, make_engine
from reasonrl.generation.hf import HFEngine
from reasonrl.io import atomic_path
from reasonrl.memory_plan import buffer_rows, buffer_steps_message
from reasonrl.ppo.filtration import (
    FilterSpec,
    r_squared,
    reward_bins,
    select,
    selection_probabilities,
)
from reasonrl.ppo.settings import PPORunSettings
from reasonrl.rewards.sequence import SequenceScorer
from reasonrl.rollout import RolloutEnvironment, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.sequences import action_logps
from reasonrl.training.loop import (
    MainBroadcast,
    data_parallel_processes,
    gathered_over_processes,
)
from reasonrl.training.lora import merged_state_dict, merged_state_entries
from reasonrl.training.ppo import (
    PolicyCritic,
    PPOObjective,
    gae,
    normalise,
    token_rewards,
)
from reasonrl.training.zero3 import (
    for_generation,
    frozen_shards,
    is_sharded,
    state_entries,
    whole,
)

if TYPE_CHECKING:
    from reasonrl.rollout.generator_process import RolloutServer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    name: str
    filter: FilterSpec
    label: str

    @classmethod
    def from_config(cls, entry: dict, section: dict) -> Variant:
        spec = FilterSpec(
            entry["filter"],
            draws=section["draws_per_prompt"],
            k=entry.get("k", 1.0),
            top=section["thresholds"]["top"],
            bottom=section["thresholds"]["bottom"],
        )
        return cls(entry["name"], spec, entry.get("label") or entry["name"])


def find_variant(section: dict, name: str) -> Variant:
    for entry in section["variants"]:
        if entry["name"] == name:
            return Variant.from_config(entry, section)
    raise ReasonRLError(f"ppo.variants has no variant named {name!r}")


def rows_per_iteration(variant: Variant, settings: PPORunSettings) -> int:
    """Buffer rows an iteration nominally trains on (memory_plan.buffer_rows)."""
    return buffer_rows(
        variant.filter.name,
        settings.prompts_per_iteration,
        settings.responses_per_prompt,
        settings.draws_per_prompt,
    )


def check_launch(config: dict, generator_gpus: int = 0) -> None:
    """Stop with one line, before anything is loaded, where this job's launch cannot run PPO:
    over several processes with a vLLM engine in each."""
    engine = config["generation"]["engine"]
    if data_parallel_processes() > 1 and engine != "hf" and not generator_gpus:
        raise ReasonRLError(
            f"ppo over several GPUs samples with the hf engine, not generation.engine"
            f" {engine} (one engine per job): give rule ppo resource generator_gpus: 1"
        )


def check_buffer_steps(settings: PPORunSettings, variant: Variant) -> None:
    """Stop with one line, before anything is loaded, where the variant's buffer is not a
    whole number of this job's optimizer steps (BufferBatches would wrap each epoch's last
    step round and train rows twice); memory_plan.check_ppo_buffers plans it alike."""
    rows = rows_per_iteration(variant, settings)
    size, accum, processes = settings.batch_size, settings.grad_accum, data_parallel_processes()
    if rows % (size * accum * processes):
        raise ReasonRLError(buffer_steps_message(variant.name, rows, size, accum, processes))


def micro_batches_per_step(settings: PPORunSettings, processes: int) -> int:
    """Micro-batches of one optimizer step over every process."""
    return settings.grad_accum * processes


def steps_per_iteration(variant: Variant, settings: PPORunSettings, processes: int = 1) -> int:
    """ppo_epochs passes over the iteration's nominal rows, batch_size x grad_accum x
    processes rows per optimizer step."""
    rows_per_step = settings.batch_size * micro_batches_per_step(settings, processes)
    rows = rows_per_iteration(variant, settings)
    return settings.ppo_epochs * math.ceil(rows / rows_per_step)


def action_tokens(batch: dict) -> float:
    """What a PPO micro-batch's losses are means over: its response tokens (the loop's
    LossUnits, so a step's micro-batches weigh by them on every process)."""
    return float(batch["action_mask"].sum())


class BufferBatches:
    """The micro-batches of one iteration's update: ppo_epochs seeded shuffles of the buffer,
    `batch_size` rows each. Micro-batch i is the run's i-th (the loop counts over the run and
    its processes); an epoch is a whole number of optimizer steps, its micro-batches past the
    buffer's end taking the shuffle's first rows again. The micro-batches of the iteration's
    first step carry its counts and held-out score (`info`) into the history."""

    def __init__(self, run: PPORun, iteration: int, buffer: dict, info: dict[str, float]):
        self.run, self.iteration, self.buffer, self.info = run, iteration, buffer, info
        self.per_step = micro_batches_per_step(run.settings, run.processes)
        self.first = iteration * run.steps_per_iteration * self.per_step

    def __call__(self, index: int) -> dict[str, torch.Tensor]:
        micro = index - self.first
        rows = len(self.buffer["input_ids"])
        bs = min(self.run.settings.batch_size, rows)
        per_epoch = self.per_step * math.ceil(rows / (bs * self.per_step))
        epoch, position = divmod(micro, per_epoch)
        order = list(range(rows))
        seed = self.run.settings.seed
        random.Random(seed * 100_003 + self.iteration * 1_009 + epoch).shuffle(order)
        # past the buffer's end (an epoch's last step over several micro-batches): the
        # shuffle's next rows, wrapped round
        start = position * bs if position * bs < rows else (position * bs) % rows
        chosen = order[start:][:bs]
        batch = {k: v[chosen] for k, v in self.buffer.items()}
        first_step = micro < self.per_step
        info = dict(self.info) if first_step else dict.fromkeys(ITERATION_KEYS, 0.0)
        info.update(iteration=float(self.iteration), policy_passes=float(len(chosen)))
        info["critic_passes"] = float(len(chosen))
        batch["info"] = info
        return batch


ITERATION_KEYS = (
    "queries",
    "responses",
    "rm_passes",
    "buffer_rows",
    "reward_sampled",
    "reward_buffer",
    "reward_std",
    "heldout_pass",
    "heldout_reward",
)


class PPORun:
    """Everything one PPO run holds: policy + critic, frozen SFT reference, scorer, prompts.

    `environment`: what its rollouts need (engine, caps, sandbox, dtype). `models`: the
    SFT policy (with its LoRA adapters where the run has them), its tokenizer and the
    reference at the SFT policy (a frozen copy, or the LoRA policy with its adapters off:
    training.reference); `adapt` puts the run's adapters on a separate critic's trunk
    (PolicyCritic). `start_path`: the SFT policy's folder, which a vLLM generator
    (generation.engine vllm) loads once before it is sent the policy's weights. `remote`:
    the run samples with a generator process of its own, `server` the main process's
    handle on it (None on the others)."""

    def __init__(
        self,
        settings: PPORunSettings,
        environment: RolloutEnvironment,
        variant: Variant,
        models,
        reward_model,
        problems,
        ckpt,
        adapt: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
        start_path: str = "",
        server: RolloutServer | None = None,
        remote: bool = False,
    ):
        self.settings, self.variant = settings, variant
        self.generation, self.dtype = environment.generation, environment.dtype
        self.start_path = start_path
        self._generator = None  # the vLLM engine, made at the first rollouts
        self.server, self.remote = server, remote
        self._sent = False  # whether the server samples with the policy's current weights
        self._broadcast = MainBroadcast()
        policy, self.tokenizer, self.reference = models
        torch.manual_seed(settings.seed)  # the value head is initialised afresh: seeded
        lrs = settings.policy_lr, settings.critic_lr
        self.model = PolicyCritic(policy, settings.critic, *lrs, adapt)
        self.scorer = SequenceScorer(settings.reward, reward_model, self.dtype, "ppo.reward")
        held = settings.heldout_prompts
        if len(problems) <= held:
            raise ReasonRLError(
                f"ppo.heldout_prompts={held} leaves no training prompts of {len(problems)}"
            )
        self.train_problems = problems[: len(problems) - held]
        self.heldout = problems[len(problems) - held :]
        self.sandbox = Sandbox.from_settings(environment.sandbox)
        self.limits = environment.limits
        self.processes = data_parallel_processes()
        self.steps_per_iteration = steps_per_iteration(variant, settings, self.processes)
        self.best_path = Path(ckpt) / "best.pt"
        self.engine = None  # the training loop's prepared model (DeepSpeed's engine): trained_by

    def trained_by(self, prepared: torch.nn.Module) -> None:
        """The training loop's prepared model: under ZeRO-3, the DeepSpeed engine whose
        per-layer hooks sampling switches off (training.zero3.for_generation); the frozen
        reference and reward model are then sharded too."""
        self.engine = prepared
        if is_sharded(prepared):
            self.reference = self.reference.sharded(frozen_shards)
            self.scorer.shard(frozen_shards)
            log.info("the frozen reference and reward model are sharded under ZeRO-3")

    # --- sampling ---------------------------------------------------------------------------
    def scored_rollouts(
        self, problems: list[dict], samples: int, params: SamplingParams
    ) -> tuple[list[dict], list[float], int]:
        """(rollouts, their rewards, reward-model passes) of `samples` per problem, in the
        problems' order. Over several processes each samples and scores its contiguous share
        of the problems (seeded apart) and all receive the whole; where ZeRO-3 shards the
        reward model, each then runs idle forwards up to the most any process runs. With a
        generator of its own (`remote`) it samples them all and every process scores its
        share of the rollouts."""
        if self.remote:
            rows = self._remote_rollouts(problems, samples, params)
            return (rows, *self._scored(rows))
        most = math.ceil(len(problems) / self.processes) * samples

        def share(part: list[dict]) -> list[tuple]:
            index = PartialState().process_index if self.processes > 1 else 0
            shard = replace(params, seed=params.seed + 7_919 * index)
            rows = self._rollouts(part, samples, shard) if part else []
            scored = self.scorer.in_step(rows, most)
            return [(rows, *scored)] if part else []

        # every process enters (a collective under ZeRO-3), with a share of prompts or none
        with for_generation(self.engine, self.model.policy):
            parts = gathered_over_processes(share, problems)
        return (
            [r for part in parts for r in part[0]],
            [x for part in parts for x in part[1]],
            sum(part[2] for part in parts),
        )

    def _remote_rollouts(
        self, problems: list[dict], samples: int, params: SamplingParams
    ) -> list[dict]:
        """The server's rollouts of the problems with the policy's current weights (sent if
        they changed), on every process."""
        if not self._sent:
            self._send_weights()
        rows = None
        if self.server is not None:
            rows = self.server.rollouts(problems, self.settings.style, samples, params, "ppo")
        return self._broadcast(rows) if self.processes > 1 else rows

    def _scored(self, rows: list[dict]) -> tuple[list[float], int]:
        """(scores, reward-model passes) of `rows`, each process scoring its contiguous share
        (idle reward-model forwards up to the most any process runs, where it is sharded)."""
        most = math.ceil(len(rows) / self.processes)

        def share(part: list[dict]) -> list[tuple]:
            scored = self.scorer.in_step(part, most)
            return [scored] if part else []

        parts = gathered_over_processes(share, rows)
        return [x for part in parts for x in part[0]], sum(part[1] for part in parts)

    def policy_changed(self) -> None:
        """The policy was updated: the server is sent its weights before it samples again."""
        self._sent = False

    def _send_weights(self) -> None:
        """Send the server the policy's weights; every process takes part (the gathers)."""
        entries = self._policy_weights()
        if self.server is not None:
            self.server.load_weights(entries)
        else:
            deque(entries, maxlen=0)  # the gathers, in step with the main process's
        self._sent = True

    def _policy_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's weights as the server's engine (a plain model) names them, one CPU
        copy at a time on the main process, none on the others. Under ZeRO-3 each parameter
        is gathered in turn; a LoRA policy's are merged one weight at a time (base + delta,
        copied to the CPU and dropped), over its weights gathered whole: one whole copy on
        each GPU, what the plan counts (memory_plan's sent_whole)."""
        policy, main = self.model.policy, self._is_main()
        if hasattr(policy, "merge_and_unload"):
            with whole(policy):
                if main:
                    for name, value in merged_state_entries(policy):
                        yield name, value.detach().to("cpu", copy=True)
            return
        for name, value in state_entries(policy):
            if main:
                yield name, value.detach().to("cpu", copy=True)

    def _rollouts(self, problems, samples: int, params: SamplingParams) -> list[dict]:
        policy = self.model.policy
        engine = self._engine()
        try:
            return run_rollouts(
                engine, problems, self.settings.style, samples, params, self.limits,
                self.sandbox, "ppo",
            )  # fmt: skip
        finally:
            policy.train()

    def _engine(self):
        """What samples the live policy: the HF engine on the policy itself, or (generation.
        engine vllm) one vLLM engine, made once from the start model and sent the policy's
        merged weights before each use."""
        generation = self.generation
        if generation.engine == "hf":
            return HFEngine(self.model.policy, self.tokenizer, generation.batch_size)
        if self._generator is None:
            self._generator = make_engine(generation, self.start_path, self.dtype)
        self._generator.load_weights(merged_state_dict(self.model.policy))
        return self._generator

    def iteration_prompts(self, iteration: int) -> list[dict]:
        """The iteration's prompts: the next slice of a fresh seeded permutation per pass."""
        count = self.settings.prompts_per_iteration
        if self.variant.filter.name == "ppo-s":  # N x the queries, one response each (Table 4)
            count *= self.settings.responses_per_prompt
        size = len(self.train_problems)
        out = []
        for g in range(iteration * count, (iteration + 1) * count):
            order = list(range(size))
            random.Random(self.settings.seed * 7 + g // size).shuffle(order)
            out.append(self.train_problems[order[g % size]])
        return out

    # --- held-out score and the best checkpoint --------------------------------------------
    def evaluate(self, seed: int) -> dict[str, float]:
        if not self.heldout:
            return {"heldout_pass": 0.0, "heldout_reward": 0.0}
        rows, scores, _ = self.scored_rollouts(self.heldout, 1, SamplingParams(seed=seed))
        return {
            "heldout_pass": sum(r["correct"] for r in rows) / len(rows),
            "heldout_reward": sum(scores) / len(scores),
        }

    def start_iteration(self, iteration: int, fresh: bool) -> dict[str, float]:
        if fresh and self.best_path.exists() and self._is_main():
            self.best_path.unlink()
        info = self.evaluate(self.settings.seed + 991)
        self.keep_if_best(iteration, info)
        return info

    def keep_if_best(self, iteration: int, info: dict) -> None:
        """Save the policy's trained state as the best if `info` beats the best so far. The
        main process decides and writes (every process holds the same policy and score); the
        others take part in gathering it (ZeRO-3) and wait for it."""
        key = [info["heldout_pass"], info["heldout_reward"]]
        self._wait_for_everyone()
        # Every process decides alike (the same score, the same file), so under ZeRO-3 all
        # take part in gathering the state (a collective) only when it is the best.
        if not self.best_path.exists() or key > self._best()["key"]:
            state = self._trained_state()
            if self._is_main():
                self.best_path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.best_path.with_suffix(".tmp")
                torch.save({"key": key, "iteration": iteration, "state": state}, tmp)
                os.replace(tmp, self.best_path)
        self._wait_for_everyone()

    def _best(self) -> dict:
        # On the CPU (saved from the main process's GPU, it would load back there), mapped
        # rather than read: every process opens it, and reading the key touches no weight.
        return torch.load(self.best_path, weights_only=True, map_location="cpu", mmap=True)

    def _is_main(self) -> bool:
        return self.processes == 1 or PartialState().is_main_process

    def _wait_for_everyone(self) -> None:
        if self.processes > 1:
            PartialState().wait_for_everyone()

    def restore_best(self) -> dict:
        """Put the best iteration's weights back into the policy; its record (key, iteration).
        Every process reads it before any goes on (the main one's save then removes it).
        Under ZeRO-3 they are loaded into the gathered parameters and the main process's go
        to every shard."""
        best = self._best()
        self._wait_for_everyone()
        with whole(self.model.policy, modifier_rank=0):
            loaded = self.model.policy.load_state_dict(best["state"], strict=False)
        if loaded.unexpected_keys:
            raise ReasonRLError(
                f"{self.best_path}: weights the policy does not have ({loaded.unexpected_keys[0]})"
            )
        self._sent = False  # a generator of its own samples with them only once sent
        return {k: v for k, v in best.items() if k != "state"}  # the weights are in the policy

    def _trained_state(self) -> dict[str, torch.Tensor] | None:
        """What training changes in the policy: its trainable parameters and its buffers.
        Under LoRA that is the adapters: the frozen base (4-bit under QLoRA, whose packed
        weights would not load back through load_state_dict) stays as it was loaded."""
        policy = self.model.policy
        kept = {n for n, p in policy.named_parameters() if p.requires_grad}
        return self._main_copy(kept | {n for n, _ in policy.named_buffers()})

    def policy_state(self) -> dict[str, torch.Tensor] | None:
        """The policy's whole state dict where ZeRO-3 shards it (on the main process; every
        process must call it); else None: the policy holds it."""
        policy = self.model.policy
        return self._main_copy(set(policy.state_dict())) if is_sharded(policy) else None

    def _main_copy(self, names: set[str]) -> dict[str, torch.Tensor] | None:
        """A CPU copy of the policy's state entries `names` on the main process, None on the
        others. Under ZeRO-3 every process must call it: the parameters are gathered whole
        to be read."""
        policy = self.model.policy
        with whole(policy):
            if not self._is_main():
                return None
            state = policy.state_dict().items()
            return {k: v.detach().to("cpu", copy=True) for k, v in state if k in names}

    # --- the buffer -------------------------------------------------------------------------
    def fill_buffer(self, iteration: int, info: dict) -> dict[str, torch.Tensor]:
        """One iteration's experience, in order: generate with the live policy -> score with
        the reward -> filter (PF-PPO) -> old log-probs, values, per-token rewards and GAE
        advantages (`experience`). The loop then updates on it for ppo_epochs epochs."""
        s = self.settings
        problems = self.iteration_prompts(iteration)
        n = 1 if self.variant.filter.name == "ppo-s" else s.responses_per_prompt
        sampling = replace(s.sampling, seed=s.seed + 1 + iteration)
        rows, scores, rm_passes = self.scored_rollouts(problems, n, sampling)
        groups = [scores[p * n : (p + 1) * n] for p in range(len(problems))]
        rng = random.Random(s.seed * 31 + iteration)
        chosen = select(self.variant.filter, groups, rng)
        if not chosen:  # a threshold nothing reached: fall back to each prompt's best
            log.warning("iteration %d: the filter kept nothing; keeping each best", iteration)
            chosen = select(FilterSpec("bon", draws=1), groups, rng)
        flat = torch.tensor(scores)
        normalised = normalise(flat) if s.normalise_rewards else flat
        picked = [p * n + i for p, i in chosen]
        info.update(
            queries=float(len(problems)),
            responses=float(len(rows)),
            rm_passes=float(rm_passes),
            buffer_rows=float(len(picked)),
            reward_sampled=float(flat.mean()),
            reward_buffer=float(flat[picked].mean()),
            reward_std=float(flat.std()) if len(flat) > 1 else 0.0,
        )
        return self.experience([rows[j]["messages"] for j in picked], normalised[picked])

    def experience(self, messages: list[list[dict]], scores: torch.Tensor) -> dict:
        """The buffer of kept trajectories: the behaviour policy's log-probs and values, the
        SFT reference's log-probs, per-token rewards (score minus the KL penalty), GAE and
        advantages whitened over the whole buffer. Over several processes each computes
        the rows of its contiguous share and every process receives the whole buffer; under
        ZeRO-3 each then runs idle forward passes up to the most any process runs (each pass
        all-gathers the sharded layers: a collective)."""
        if self.processes == 1:
            buffer = self._experience(messages, scores)
        else:
            bs = self.settings.batch_size
            most = math.ceil(math.ceil(len(messages) / self.processes) / bs)

            def share(rows: list[int]) -> list[dict]:
                part = self._experience([messages[i] for i in rows], scores[rows]) if rows else {}
                if is_sharded(self.model):
                    self._idle_forwards(most - math.ceil(len(rows) / bs))
                return [{k: v.cpu() for k, v in part.items()}] if rows else []

            parts = gathered_over_processes(share, list(range(len(messages))))
            buffer = concat_padded(parts, {"input_ids": self.tokenizer.pad_token_id})
        if self.settings.normalise_advantages:
            buffer["advantages"] = normalise(buffer["advantages"], buffer["action_mask"])
        return buffer

    @torch.no_grad()
    def _experience(self, messages: list[list[dict]], scores: torch.Tensor) -> dict:
        """experience() of these rows alone, before the advantages are whitened."""
        s = self.settings
        chats = [tokenize_chat(self.tokenizer, m, s.max_length) for m in messages]
        width = max(len(c.input_ids) for c in chats)
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([c.input_ids + [pad] * (width - len(c.input_ids)) for c in chats])
        attention = torch.tensor(
            [[1] * len(c.input_ids) + [0] * (width - len(c.input_ids)) for c in chats]
        )
        mask = torch.tensor([c.loss_mask + [0] * (width - len(c.loss_mask)) for c in chats])
        device = self.model.policy.device
        ids, attention, scores = ids.to(device), attention.to(device), scores.to(device)
        action = mask[:, 1:].float().to(device)
        old_logps, old_values, ref_logps = [], [], []
        for start in range(0, len(chats), s.batch_size):
            part = slice(start, start + s.batch_size)
            logps, values, ref = self._forwards(ids[part], attention[part])
            old_logps.append(logps)
            old_values.append(values)
            ref_logps.append(ref)
        old_logps, old_values = torch.cat(old_logps), torch.cat(old_values)
        ref_logps = torch.cat(ref_logps)
        loss = s.loss
        rewards = token_rewards(scores, old_logps, ref_logps, action, loss.beta)
        advantages, returns = gae(rewards, old_values * action, action, loss.gamma, loss.lam)
        return {
            "input_ids": ids,
            "attention_mask": attention,
            "action_mask": action,
            # each row's KL(pi_old || pi_sft) estimate, summed over its actions (the penalty's)
            "ref_kl": ((old_logps - ref_logps) * action).sum(-1),
            "old_logps": old_logps * action,
            "old_values": old_values * action,
            "advantages": advantages,
            "returns": returns,
        }

    @torch.no_grad()
    def _forwards(self, ids: torch.Tensor, attention: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(log pi, V, log pi_SFT) of one micro-batch of rows, in eval mode (dropout off)."""
        self.model.eval()
        try:
            logps, values = self.model(ids, attention)
            with self.reference.evaluating() as reference:  # under LoRA: the policy, adapters off
                ref = reference(input_ids=ids, attention_mask=attention).logits
            return logps, values, action_logps(ref, ids)
        finally:
            self.model.train()

    def _idle_forwards(self, count: int) -> None:
        """`count` micro-batches' forward passes on a dummy row, their results dropped: what
        a ZeRO-3 process with fewer rows runs so its layers all-gather with the others'."""
        device = self.model.policy.device
        row = torch.full((1, 2), self.tokenizer.pad_token_id, device=device)
        for _ in range(count):
            self._forwards(row, torch.ones_like(row))


def concat_padded(parts: list[dict[str, torch.Tensor]], pad: dict[str, int]) -> dict:
    """The rows of buffer `parts` in order, each tensor right-padded along its second
    dimension to the widest part's (with `pad`'s value for its key, else 0)."""
    out = {}
    for key in parts[0]:
        tensors = [p[key] for p in parts]
        if tensors[0].dim() > 1:
            width = max(t.shape[1] for t in tensors)
            fill = pad.get(key, 0)
            tensors = [
                torch.nn.functional.pad(t, (0, width - t.shape[1]), value=fill) for t in tensors
            ]
        out[key] = torch.cat(tensors)
    return out


class PPOObjectiveWithInfo(PPOObjective):
    """PPOObjective that passes the batch's iteration info and the mean KL of its rows to the
    SFT reference through to the loop's history."""

    def __call__(self, model, batch):
        info = batch.pop("info")
        ref_kl = batch.pop("ref_kl")
        loss, stats = super().__call__(model, batch)
        stats.update(info, kl_ref=float(ref_kl.mean()))
        return loss, stats


def iteration_summary(history: list[dict]) -> list[dict]:
    """Per iteration: the counts summed over its steps, the rest from its first step."""
    out: dict[int, dict] = {}
    for h in history:
        # Equal values weighed over micro-batches and averaged over processes come back
        # within rounding of themselves (2.9999999999999996 for iteration 3).
        it = round(h["iteration"])
        first = {k: round(h[k], 9) for k in ITERATION_KEYS}
        row = out.setdefault(it, {"iteration": it, **first})
        for key in ("policy_passes", "critic_passes"):
            row[key] = row.get(key, 0.0) + h[key]
    return [out[k] for k in sorted(out)]


def compute_totals(iterations: list[dict]) -> dict[str, float]:
    """Per-iteration means of the paper's Table 4 counts."""
    keys = ("queries", "responses", "rm_passes", "policy_passes", "critic_passes")
    n = max(1, len(iterations))
    return {k: sum(it[k] for it in iterations) / n for k in keys}


def strategy_rows(
    variants: list[Variant], groups: list[list[float]], scores: list[list[float]], bins: int
) -> tuple[list[dict], list[dict]]:
    """(one R^2 row per strategy, the reward-bin points of each) from rewards and true scores
    grouped per prompt. Every strategy weighs each response by its selection probability;
    bins are equal-width over the range of all rewards, shared by the strategies."""
    flat_rewards = [r for g in groups for r in g]
    flat_scores = [s for g in scores for s in g]
    edges = np.linspace(min(flat_rewards), max(flat_rewards), bins + 1)
    table, points = [], []
    unfiltered = Variant("unfiltered", FilterSpec("ppo-m"), "unfiltered (SFT policy)")
    for variant in [unfiltered, *variants]:
        probs = selection_probabilities(variant.filter, groups)
        weights = [w for g in probs for w in g]
        rows = reward_bins(flat_rewards, flat_scores, weights, edges)
        r2 = r_squared([b["reward"] for b in rows], [b["score"] for b in rows])
        table.append(
            {
                "strategy": variant.name,
                "label": variant.label,
                "filter": variant.filter.name,
                "r2": None if r2 is None else round(r2, 4),
                "bins": len(rows),
                "mean_score": round(float(np.average(flat_scores, weights=weights)), 4),
            }
        )
        points += [{"strategy": variant.name, **b} for b in rows]
    return table, points


def plot_bins(points: list[dict], path: Path) -> None:
    """Mean true score against the mean reward of each bin, one line per strategy (Fig. 1)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in dict.fromkeys(p["strategy"] for p in points):
        mine = [p for p in points if p["strategy"] == name]
        ax.plot([p["reward"] for p in mine], [p["score"] for p in mine], marker="o", label=name)
    ax.set_xlabel("reward (bin mean)")
    ax.set_ylabel("true score (bin mean, unit tests passed)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
