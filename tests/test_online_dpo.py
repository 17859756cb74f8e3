"""Online DPO / Proximal RLOO: losses by hand, the sync/async schedule, the generator process
(lag, weight updates, shutdown on success, error, Ctrl-C and kill) and resume."""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from isolation import default_signals
from tracked import COMMON, event_scalars, track

from reasonrl.config import validate_config
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_json, write_jsonl
from reasonrl.online_dpo.actors import GeneratorProcess, GeneratorSpec, Schedule
from reasonrl.online_dpo.settings import OnlineDPOSettings
from reasonrl.rollout import RolloutEnvironment
from reasonrl.stages.online_dpo import online_dpo as run_online
from reasonrl.stages.online_dpo import online_dpo_table as write_online_table
from reasonrl.stages.online_dpo import online_variant, timing_summary, variant_section
from reasonrl.tasks import build_problems
from reasonrl.training.online_dpo import (
    OnlineObjective,
    best_worst,
    proximal_rloo_loss,
    sample_reward,
)
from reasonrl.training.preference import dpo_loss

# ---- losses ------------------------------------------------------------------------------------


def test_proximal_rloo_matches_a_hand_computation():
    # One prompt, K = 3. Shaped rewards r' = r - beta (log pi_gen - log pi_ref):
    # r = [1, 0, 0], gen - ref = [0.5, -1.0, 2.0], beta = 0.1 -> r' = [0.95, 0.1, -0.2]
    # baselines (leave-one-out means) = [-0.05, 0.375, 0.525] -> A = [1.0, -0.275, -0.725]
    # ratios exp(logp - gen) = [e^0.5, e^-0.1, e^0]; clip 0.2 -> [1.2, e^-0.1, 1.0]
    # per-sample objective min(rho A, clip(rho) A):
    #   A>0: min(1.6487, 1.2) = 1.2; A<0: min(-0.2488, -0.2488), min(-0.725, -0.725)
    behaviour = torch.tensor([-3.0, -2.0, -4.0])
    ref = behaviour - torch.tensor([0.5, -1.0, 2.0])
    logps = behaviour + torch.tensor([0.5, -0.1, 0.0])
    logps.requires_grad_(True)
    loss, stats = proximal_rloo_loss(
        logps, behaviour, ref, torch.tensor([1.0, 0.0, 0.0]), k=3, beta=0.1, clip=0.2
    )
    expected = -(1.2 * 1.0 + math.exp(-0.1) * -0.275 + 1.0 * -0.725) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    loss.backward()
    # The clipped sample (ratio above 1 + clip with A > 0) gets no gradient.
    assert logps.grad[0].item() == 0.0
    assert logps.grad[2].item() == pytest.approx(0.725 / 3, abs=1e-6)
    assert stats["clipped_fraction"] == pytest.approx(1 / 3)


def test_proximal_rloo_needs_two_samples_per_prompt():
    with pytest.raises(ReasonRLError, match="K >= 2"):
        proximal_rloo_loss(*[torch.zeros(2)] * 4, k=1, beta=0.1, clip=0.2)


def test_best_worst_drops_ties_and_rewards_penalise_truncation():
    assert best_worst([0.0, 1.0, -1.0, 1.0]) == best_worst([0.0, 1.0, -1.0, 0.5])
    choice = best_worst([0.0, 1.0, -1.0, 1.0])
    assert (choice.best, choice.worst, choice.margin) == (1, 2, 2.0)
    assert best_worst([1.0, 1.0]) is None
    assert sample_reward(0.0, "turn_token_cap", 1.0) == -1.0
    assert sample_reward(0.25, "total_token_cap", 0.5) == -0.25
    assert sample_reward(0.0, "eos", 1.0) == 0.0
    assert sample_reward(1.0, "answer", 1.0) == 1.0


def test_online_dpo_is_the_preference_modules_dpo_loss(tiny_policy):
    from reasonrl.models import load_policy, on_model_device
    from reasonrl.sequences import MaskedSequence, sequence_logps
    from reasonrl.training.online_dpo import dpo_batch

    model, tokenizer = load_policy(tiny_policy)
    seqs = [MaskedSequence([5, 6, 7, 8], [0, 1, 1, 1]), MaskedSequence([5, 9, 10], [0, 1, 1])]
    # On the model's device, as the training loop hands batches to the objective.
    batch = on_model_device(dpo_batch(seqs, [-3.0, -4.0], [(0, 1)], tokenizer.pad_token_id), model)
    loss, stats = OnlineObjective("dpo", beta=0.05, clip=0.2, k=2)(model, batch)
    logps, _ = sequence_logps(model, batch)
    ref_chosen, ref_rejected = torch.tensor([[-3.0], [-4.0]], device=logps.device)
    expected = dpo_loss(logps[:1], logps[1:], ref_chosen, ref_rejected, 0.05)
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    assert "reward_margin" in stats


def test_token_logps_sum_to_the_sequence_logps(tiny_policy):
    from reasonrl.generation.hf import HFEngine
    from reasonrl.sequences import MaskedSequence

    engine = HFEngine.from_pretrained(str(tiny_policy), batch_size=4)
    seqs = [MaskedSequence([5, 6, 7, 8, 9], [0, 1, 0, 1, 1]), MaskedSequence([5, 9], [1, 1])]
    tokens = engine.token_logps(seqs)
    assert [len(t) for t in tokens] == [3, 1]  # masked positions after the first
    assert [sum(t) for t in tokens] == pytest.approx(engine.sequence_logps(seqs), abs=1e-5)


def test_ppo_batch_puts_each_log_prob_on_its_action_and_the_ratio_uses_them(tiny_policy):
    from reasonrl.models import load_policy, on_model_device
    from reasonrl.sequences import MaskedSequence, token_logps
    from reasonrl.training.online_dpo import (
        add_ppo_targets,
        critic_values,
        online_ppo_loss,
        ppo_batch,
    )
    from reasonrl.training.ppo import PolicyCritic, PPOSettings

    model, tokenizer = load_policy(tiny_policy)
    seqs = [MaskedSequence([5, 6, 7, 8, 9], [0, 0, 1, 1, 0]), MaskedSequence([5, 9, 4], [0, 1, 1])]
    pad = tokenizer.pad_token_id
    own = token_logps(model, seqs, pad)
    batch = on_model_device(
        ppo_batch(seqs, own, [[0.0] * len(t) for t in own], [1.0, 0.0], pad), model
    )
    assert batch["action_mask"].tolist() == [[0, 1, 1, 0], [1, 1, 0, 0]]
    assert batch["old_logps"][0, 1:3].tolist() == pytest.approx(own[0])
    assert batch["old_logps"][1, 0:2].tolist() == pytest.approx(own[1])
    assert batch["old_logps"][0, 0] == 0 and batch["old_logps"][0, 3] == 0
    critic = PolicyCritic(model, "shared", 1e-3, 1e-3)
    settings = PPOSettings(beta=0.05, clip_ratio=0.2)
    with torch.no_grad():
        add_ppo_targets([batch], [critic_values(critic, batch)], settings)
    _, stats = online_ppo_loss(critic, batch, settings)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["clip_fraction"] == 0
    stale = {**batch, "old_logps": batch["old_logps"] - batch["action_mask"]}  # ratios e
    _, stats = online_ppo_loss(critic, stale, settings)
    assert stats["ratio_mean"] == pytest.approx(math.e, rel=1e-4)


# ---- the samples as sampled ------------------------------------------------------------------


def test_sampled_trajectory_scores_the_sampled_ids_not_their_re_encoded_text(tiny_policy):
    from reasonrl.chat import render
    from reasonrl.models import load_policy
    from reasonrl.sequences import encode_trajectory, sampled_trajectory

    _, tokenizer = load_policy(tiny_policy)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pieces = tokenizer.convert_tokens_to_ids(["x", "Ġ", "=", "Ġ", "1", "2"])
    stray = tokenizer.convert_tokens_to_ids(["Ã"])  # half a UTF-8 character: decodes to U+FFFD
    prompt = [{"role": "user", "content": "Add."}]
    # A first turn that ended at its own end-of-turn token, a tool output, and a second turn a
    # token cap cut (no end-of-turn token sampled), with stray bytes and unmerged pieces.
    first, second = [*pieces, im_end], [*pieces, *stray, *pieces]
    messages = [
        *prompt,
        {"role": "assistant", "content": tokenizer.decode(first, skip_special_tokens=True)},
        {"role": "user", "content": "```output\n12\n```"},
        {"role": "assistant", "content": tokenizer.decode(second, skip_special_tokens=True)},
    ]
    seq = sampled_trajectory(tokenizer, messages, [first, second])
    assert [t for t, m in zip(seq.input_ids, seq.mask, strict=True) if m] == first + second
    context = tokenizer(render(tokenizer, prompt, True), add_special_tokens=False)["input_ids"]
    assert seq.input_ids[: len(context)] == context and not any(seq.mask[: len(context)])
    assert seq.input_ids[-1] != im_end  # the capped turn ends where the model stopped
    # The prompt's, the first turn's (sampled, not doubled by the template) and the output's.
    assert seq.input_ids.count(im_end) == 3
    # Re-rendering scores other tokens: merged pieces, U+FFFD, a forced end-of-turn token.
    rendered = encode_trajectory(tokenizer, messages, True)
    scored = [t for t, m in zip(rendered.input_ids, rendered.mask, strict=True) if m]
    assert scored != first + second and scored[-1] == im_end
    with pytest.raises(ReasonRLError, match="2 model turns but sampled ids for 1"):
        sampled_trajectory(tokenizer, messages, [first])


SAMPLED = {"loss": "dpo", "prompts_per_step": 16, "samples_per_prompt": 4}


# The GRPO family's options of these tests' learner runs (loss name -> a grpo variant's keys):
# GRPO as the default has it, and DAPO's token-mean loss with clip-higher, its advantages
# scaled by the step's std (which spans the step's micro-batches).
GRPO_VARIANTS = {
    "grpo": {"beta": 0.04},
    "dapo": {"aggregation": "dapo", "scale_rewards": "batch", "clip_high": 0.28},
}


def _grpo_keys(name: str) -> dict:
    """A grpo variant's keys with the schema's defaults filled in."""
    variant = {"name": "g", "loss": "grpo", "grpo": GRPO_VARIANTS[name]}
    return validate_config({"online_dpo": {"variants": [variant]}})["online_dpo"]["variants"][0]


def _online(section: dict, seed: int = 0) -> OnlineDPOSettings:
    """The settings of an online_dpo `section`, a default variant's keys where it has none
    (these tests give the generator and the learner a schedule of their own), with the
    online_setup's token budget."""
    variant = {"mode": "async", "loss": "dpo", "off_policy": 1}
    return OnlineDPOSettings.from_section({**variant, **section}, seed, max_tokens=12)


def _sample_round(
    setup: tuple[dict, Path], policy, tokenizer, seed: int, loss: str = "dpo"
) -> dict:
    """A round of 16 prompts x 4 samples that `policy` made in the generator's code path (with
    per-token log-probs for loss ppo)."""
    from reasonrl.generation.hf import HFEngine
    from reasonrl.io import read_jsonl
    from reasonrl.online_dpo.actors import sample_round
    from reasonrl.rewards.sequence import SequenceScorer
    from reasonrl.sandbox import Sandbox

    config, folder = setup
    config = {**config, "online_dpo": {**config["online_dpo"], **SAMPLED, "loss": loss}}
    problems = read_jsonl(folder / "train.jsonl")
    spec = _spec({**config, "seed": seed}, Path(""), problems, Schedule(1, 1, False))
    scorer = SequenceScorer("oracle", None, "float32", "online_dpo.reward")
    engine = HFEngine(policy, tokenizer, batch_size=64)
    rows, sampling = sample_round(engine, Sandbox.from_config(config["sandbox"]), scorer, spec, 0)
    payload = {"version": 0, "rows": rows, "sampling": sampling, "gen_seconds": 0.0}
    return {**payload, "weight_wait_seconds": 0.0, "weight_load_seconds": 0.0}


class _ParityScorer:
    """A scorer whose groups are mixed (rewards 1, 0, ...) for problems of even parity and
    tied (all 0) for the others: which groups dynamic sampling must keep is known."""

    @staticmethod
    def mixed(problem_id: str) -> bool:
        return int(hashlib.md5(problem_id.encode()).hexdigest(), 16) % 2 == 0

    def __call__(self, rows: list[dict]) -> tuple[list[float], None]:
        first = [
            i == 0 or rows[i - 1]["problem_id"] != row["problem_id"] for i, row in enumerate(rows)
        ]
        return [
            float(f and self.mixed(r["problem_id"])) for f, r in zip(first, rows, strict=True)
        ], None


def _dynamic_round(setup: tuple[dict, Path], grpo: dict) -> tuple[list[dict], dict, list[str]]:
    """Round 0 of 4 prompts x 2 samples by the tiny policy under `grpo`'s keys, scored by
    _ParityScorer: (rows, the round's sampling counts, the round's own prompt ids)."""
    from reasonrl.generation.hf import HFEngine
    from reasonrl.models import load_policy
    from reasonrl.online_dpo.actors import round_problems, sample_round
    from reasonrl.sandbox import Sandbox

    config, folder = setup
    variant = {"name": "g", "loss": "grpo", "grpo": grpo}
    keys = validate_config({"online_dpo": {"variants": [variant]}})["online_dpo"]["variants"][0]
    online = {**config["online_dpo"], **keys, "prompts_per_step": 4, "samples_per_prompt": 2}
    config = {**config, "online_dpo": online, "seed": 0}
    spec = _spec(config, Path(""), _problems(folder), Schedule(1, 1, False))
    policy, tokenizer = load_policy(folder / "policy")
    engine = HFEngine(policy, tokenizer, batch_size=64)
    sandbox = Sandbox.from_config(config["sandbox"])
    rows, counts = sample_round(engine, sandbox, _ParityScorer(), spec, 0)
    return rows, counts, [p["id"] for p in round_problems(spec, 0)]


def test_dynamic_sampling_drops_tied_groups_and_refills_the_round(online_setup):
    """DAPO's dynamic sampling: the round keeps its own mixed groups first, in order, then
    mixed groups of refill batches until it has its size; every tied group it met is counted
    as dropped. Without it the round is its own prompts, tied or not."""
    rows, counts, own = _dynamic_round(
        online_setup, {"dynamic_sampling": True, "max_sampling_batches": 20}
    )
    groups = [rows[i : i + 2] for i in range(0, len(rows), 2)]
    ids = [g[0]["problem_id"] for g in groups]
    assert len(groups) == 4 and all(g[0]["reward"] != g[1]["reward"] for g in groups)
    mixed_own = [p for p in own if _ParityScorer.mixed(p)]
    assert ids[: len(mixed_own)] == mixed_own and len(mixed_own) < 4  # the round was refilled
    assert counts["sampling_batches"] >= 2 and counts["tied_groups_kept"] == 0
    assert counts["tied_groups_dropped"] >= len(own) - len(mixed_own)

    plain, plain_counts, own = _dynamic_round(online_setup, {})
    assert [r["problem_id"] for r in plain[::2]] == own and plain_counts == {
        "sampling_batches": 1.0
    }


def test_dynamic_sampling_keeps_tied_groups_when_its_batches_run_out(online_setup):
    rows, counts, own = _dynamic_round(
        online_setup, {"dynamic_sampling": True, "max_sampling_batches": 1}
    )
    mixed_own = [p for p in own if _ParityScorer.mixed(p)]
    assert [r["problem_id"] for r in rows[::2]][: len(mixed_own)] == mixed_own
    assert counts == {
        "sampling_batches": 1.0,
        "tied_groups_dropped": 0.0,
        "tied_groups_kept": float(4 - len(mixed_own)),
    }


def _logged_kl(setup: tuple[dict, Path], payload: dict, reference, tokenizer) -> float:
    from reasonrl.online_dpo.learner import Learner
    from reasonrl.training.reference import Reference

    settings = _online({**setup[0]["online_dpo"], **SAMPLED})
    frozen = Reference.frozen(reference)
    learner = Learner(None, None, Schedule(1, 1, False), settings, tokenizer, frozen)
    learner.micro_batches(payload, 0, 0.0, evaluate=None)  # DPO: no critic to evaluate
    return learner.step_metrics["kl"]


def test_ppo_critic_values_are_shared_out_over_the_processes(online_setup, monkeypatch):
    """Each process computes the critic's values of its share of a step's micro-batches and
    receives the others' (not every process all of them)."""
    from reasonrl.models import load_policy
    from reasonrl.online_dpo import learner as learner_module
    from reasonrl.training.reference import Reference

    reference, tokenizer = load_policy(online_setup[1] / "policy")
    payload = _sample_round(online_setup, reference, tokenizer, seed=0, loss="ppo")
    shared = []

    def two_processes(fn, items):  # process 0 of 2: its half, then the other's as received
        half = (len(items) + 1) // 2
        shared.append(len(items))
        return fn(items[:half]) + fn(items[half:])

    monkeypatch.setattr(learner_module, "gathered_over_processes", two_processes)
    evaluated = []

    def evaluate(fn, batch):
        evaluated.append(batch["input_ids"].shape[0])
        return torch.zeros(batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1)

    section = {**online_setup[0]["online_dpo"], **SAMPLED, "loss": "ppo", "micro_batch_prompts": 4}
    settings = _online(section)
    frozen = Reference.frozen(reference)
    learner = learner_module.Learner(None, None, Schedule(1, 1, False), settings, tokenizer, frozen)
    batches = learner.micro_batches(payload, 0, 0.0, evaluate=evaluate)
    rows = section["prompts_per_step"] * section["samples_per_prompt"]
    assert shared == [rows, len(batches)]  # the reference's rows, then the critic's batches
    assert len(batches) > 1 and sum(evaluated) == rows
    assert all("advantages" in batch and "old_values" in batch for batch in batches)


def test_logged_kl_is_zero_for_the_reference_and_not_negative_after_training(online_setup):
    """KL(policy || reference) on the policy's own samples is >= 0 in expectation. The logged
    one was negative (-9 nats per sample in the bench): it scored the samples' re-encoded
    text, which a policy trained on that text to push its capped samples down (as online DPO
    pushes its rejected ones) scores far below the reference, not the tokens it sampled."""
    import copy

    from reasonrl.models import load_policy
    from reasonrl.sequences import encode_trajectory, pad_sequences, sequence_logps

    _, folder = online_setup
    reference, tokenizer = load_policy(folder / "policy")
    payload = _sample_round(online_setup, reference, tokenizer, seed=0)
    assert _logged_kl(online_setup, payload, reference, tokenizer) == pytest.approx(0, abs=1e-5)
    capped = [row for row in payload["rows"] if row["finish_reason"] == "turn_token_cap"]
    rendered = [encode_trajectory(tokenizer, row["messages"], True) for row in capped]
    batch = pad_sequences(rendered, tokenizer.pad_token_id)
    policy = copy.deepcopy(reference).train()
    optimizer = torch.optim.Adam(policy.parameters(), lr=3e-3)
    for _ in range(5):
        optimizer.zero_grad()
        sequence_logps(policy, batch)[0].mean().backward()
        optimizer.step()
    # Fresh samples (another seed: the same draws would resample the pushed-down ones). Their
    # exact KL, summed over the vocabulary along them, is 0.10; the re-encoded text gave -9.4.
    # The estimate's standard error is about 0.06.
    fresh = _sample_round(online_setup, policy.eval(), tokenizer, seed=3)
    assert _logged_kl(online_setup, fresh, reference, tokenizer) > -0.1


# ---- micro-batches -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sampled_round(online_setup) -> dict:
    """One round of the tiny policy's samples, with the rows every loss reads, and rewards set
    so that every third prompt ties (no DPO pair) and the others rank their samples."""
    from reasonrl.models import load_policy

    policy, tokenizer = load_policy(online_setup[1] / "policy")
    payload = _sample_round(online_setup, policy, tokenizer, seed=0, loss="ppo")
    for i, row in enumerate(payload["rows"]):
        prompt, sample = divmod(i, 4)
        row["reward"] = 0.0 if prompt % 3 == 0 else (prompt + sample) % 4 / 3
    return payload


class _StoredRounds:
    """The generator's stand-in: hands out one sampled round as every round, takes weights."""

    def __init__(self, payload: dict):
        self.payload, self.sent = payload, 0

    def next_round(self) -> dict:
        self.sent += 1
        return {**self.payload, "round": self.sent - 1}

    def push(self, step: int, model) -> None:
        pass


def _learn(setup, payload: dict, folder: Path, loss: str, micro: int | None):
    """4 steps (2 rounds of 2 mini-batches of 8 prompts x 4 samples) of the learner, with
    `micro` prompts per micro-batch: (trained model, history, micro-batches per step)."""
    from reasonrl.models import load_policy
    from reasonrl.online_dpo.learner import Learner, RoundStore, learn, loop_settings
    from reasonrl.training.loop import CheckpointStore, TrainingLoop
    from reasonrl.training.ppo import PolicyCritic
    from reasonrl.training.reference import Reference

    config, models = setup
    section = {**config["online_dpo"], **SAMPLED, "loss": loss, "micro_batch_prompts": micro}
    if loss in GRPO_VARIANTS:
        section.update(loss="grpo", grpo=_grpo_keys(loss)["grpo"])
    section.update(prompts_per_step=8, steps=4, lr=1e-4, critic_lr=1e-4, checkpoint_every=99)
    model, tokenizer = load_policy(models / "policy")
    reference = load_policy(models / "policy")[0]
    with torch.no_grad():  # not the start policy: DPO's first margins are not float ties
        for param in reference.parameters():
            param.mul_(0.9)
    reference = Reference.frozen(reference)
    if loss == "ppo":
        torch.manual_seed(0)  # the critic's value head: the same in both runs
        model = PolicyCritic(model, "shared", section["lr"], section["critic_lr"])
    schedule = Schedule(4, 2, True)
    store = RoundStore(folder / "rounds", "micro")
    store.reset_unless_resuming(False)
    online = _online(section)
    learner = Learner(_StoredRounds(payload), store, schedule, online, tokenizer, reference)
    objective = OnlineObjective(online.loss, online.beta, online.clip, k=4, grpo=online.grpo)
    settings = loop_settings(online)
    checkpoints = CheckpointStore(folder / "ckpt", "micro")
    loop = TrainingLoop(
        model, objective, settings, checkpoints, learner.on_step, None, objective.units
    )
    learn(loop, learner, schedule)
    result = loop.finish()
    return result["model"], result["history"], settings.grad_accum


@pytest.mark.parametrize("loss", ["dpo", "rloo", "ppo", "grpo", "dapo"])
def test_micro_batches_train_and_log_as_the_whole_step_does(
    online_setup, sampled_round, tmp_path, loss
):
    """Gradient accumulation over micro-batches of 1 or 3 prompts (3: a smaller last one)
    gives the parameters and logged metrics of the whole 8-prompt step in one micro-batch:
    each micro-batch's loss counts by its share of the step's pairs (tied prompts have none),
    rows or action tokens, PPO whitens its advantages over the whole step, and DAPO's are
    scaled by the whole step's std and its loss is a mean over the step's tokens."""
    from reasonrl.models import load_policy
    from reasonrl.stages.online_dpo import torch_threads

    with torch_threads(1):
        whole, whole_log, one = _learn(online_setup, sampled_round, tmp_path / "a", loss, None)
        runs = [_learn(online_setup, sampled_round, tmp_path / f"m{m}", loss, m) for m in (1, 3)]
    assert one == 1 and [n for _, _, n in runs] == [8, 3]
    initial = next(load_policy(online_setup[1] / "policy")[0].parameters())
    assert (next(whole.parameters()) - initial).abs().max() > 2e-4  # it trained
    # fp32 rounding (other paddings, sums in another order) through AdamW moves a parameter
    # by at most ~6e-7 at lr 1e-4; even shares instead of the loss's moved them 1e-5 to 5e-4.
    for model, log, _ in runs:
        for (name, a), b in zip(whole.named_parameters(), model.parameters(), strict=True):
            torch.testing.assert_close(b, a, rtol=0, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
        assert len(log) == len(whole_log) == 4
        for mine, theirs in zip(log, whole_log, strict=True):
            timing = {k for k in theirs if "second" in k or k == "elapsed"}
            assert mine.keys() == theirs.keys()
            for key in theirs.keys() - timing:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5, abs=1e-6), key


def test_micro_batch_prompts_split_a_step_or_stop_with_the_key():
    from reasonrl.online_dpo.learner import micro_batches_per_step

    def section(**keys) -> OnlineDPOSettings:
        return _online(validate_config({"online_dpo": keys})["online_dpo"])

    assert micro_batches_per_step(section()) == 1  # null: the whole step in one
    assert micro_batches_per_step(section(prompts_per_step=8, micro_batch_prompts=3)) == 3
    with pytest.raises(ReasonRLError, match="'online_dpo.micro_batch_prompts' \\(9\\) is more"):
        section(prompts_per_step=8, micro_batch_prompts=9)
    with pytest.raises(ReasonRLError, match="'online_dpo.micro_batch_prompts': 0 is less"):
        section(micro_batch_prompts=0)


# ---- schedule ----------------------------------------------------------------------------------


def test_a_steps_micro_batches_share_out_over_the_processes(monkeypatch):
    """Under accelerate launch each process accumulates its share of a step's micro-batches;
    a share that is not whole stops the job with one line."""
    from reasonrl.online_dpo.learner import loop_settings

    section = {**validate_config({})["online_dpo"], "prompts_per_step": 8}
    settings = _online({**section, "micro_batch_prompts": 2})
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert loop_settings(settings).grad_accum == 2
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ReasonRLError, match=r"a step's 4 micro-batches .* over 3 processes"):
        loop_settings(settings)


def test_settings_are_the_section_with_its_variants_keys_typed_once():
    """The stage types online_dpo (with the variant's keys) once: the loop trains the section's
    steps without weight decay, the rounds follow the variant, the sampling is the section's."""
    from reasonrl.online_dpo.learner import loop_settings
    from reasonrl.training.loop import LoopSettings

    keys = {"steps": 6, "prompts_per_step": 4, "temperature": 0.7, "lr": 3e-6, "beta": 0.1}
    variant = {"name": "a", "mode": "sync", "loss": "rloo", "off_policy": 3}
    config = validate_config({"seed": 7, "online_dpo": {**keys, "variants": [variant]}})
    section = variant_section(config, "a")
    settings = OnlineDPOSettings.from_section(section, config["seed"])
    expected = {**section, "max_steps": 6, "grad_accum": 1, "weight_decay": 0.0}
    assert loop_settings(settings) == LoopSettings.from_config(expected, 7)
    assert settings.schedule == Schedule(6, 3, asynchronous=False)
    assert (settings.loss, settings.reward, settings.beta, settings.seed) == (
        "rloo",
        "oracle",
        0.1,
        7,
    )
    assert settings.micro_batch_prompts == 4  # null: the whole step
    assert (settings.sampling.temperature, settings.sampling.top_p) == (0.7, 1.0)


def test_the_reference_scores_a_steps_rows_in_forwards_of_reference_rows():
    """online_dpo.reference_rows is the chunk the reference's log-probs are computed in (the
    memory plan counts that many rows' fp32 log-softmax)."""
    from contextlib import nullcontext
    from types import SimpleNamespace

    from reasonrl.online_dpo.learner import Learner

    calls = []

    def logps(model, part, pad, rows):
        calls.append((model, len(part), pad, rows))
        return [float(i) for i in range(len(part))]

    learner = SimpleNamespace(
        tokenizer=SimpleNamespace(pad_token_id=3),
        reference=SimpleNamespace(evaluating=lambda: nullcontext("reference")),
        settings=SimpleNamespace(reference_rows=4),
    )
    assert Learner._reference(learner, ["s"] * 10, logps) == [float(i) for i in range(10)]
    assert calls == [("reference", 10, 3, 4)]


def test_a_variant_trains_with_its_own_lr_k_and_temperature_where_it_sets_them():
    """GRPO's pilot tuned lr, K and T apart from online DPO's: a variant's own keys win over
    the section's, and a variant without them keeps the section's."""
    keys = {"lr": 1e-5, "samples_per_prompt": 4, "temperature": 0.7}
    own = {"name": "grpo", "loss": "grpo", "lr": 1e-4, "samples_per_prompt": 8, "temperature": 1.0}
    config = validate_config({"online_dpo": {**keys, "variants": [{"name": "dpo"}, own]}})
    grpo = OnlineDPOSettings.from_section(variant_section(config, "grpo"), 0, 256)
    dpo = OnlineDPOSettings.from_section(variant_section(config, "dpo"), 0)
    assert (grpo.loop.lr, grpo.samples_per_prompt, grpo.sampling.temperature) == (1e-4, 8, 1.0)
    assert (dpo.loop.lr, dpo.samples_per_prompt, dpo.sampling.temperature) == (1e-5, 4, 0.7)
    with pytest.raises(ReasonRLError, match="samples_per_prompt"):
        validate_config({"online_dpo": {"variants": [{"name": "a", "samples_per_prompt": 1}]}})


def test_a_generator_with_a_gpu_of_its_own_takes_the_first_after_the_learners(monkeypatch):
    from reasonrl.rollout.generator_process import enter_generator_environment, generator_devices

    assert generator_devices("4,5,6", 2) == "6" and generator_devices(None, 1) == "1"
    with pytest.raises(ReasonRLError, match="CUDA_VISIBLE_DEVICES=4,5 has no device after"):
        generator_devices("4,5", 2)
    spec = _spec(validate_config({}), Path(""), [], Schedule(1, 1, False), visible_devices="6")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    for name, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_PORT", "29500")):
        monkeypatch.setenv(name, value)
    enter_generator_environment(spec.visible_devices)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "6"
    assert not {"RANK", "WORLD_SIZE", "MASTER_PORT"} & os.environ.keys()


def test_schedule_versions_and_lag():
    sync = Schedule(steps=6, minibatches_per_round=2, asynchronous=False)
    run = Schedule(steps=6, minibatches_per_round=2, asynchronous=True)
    assert [sync.generator_version(g) for g in range(3)] == [0, 2, 4]
    assert [run.generator_version(g) for g in range(3)] == [0, 0, 2]
    assert [run.round_of(i) for i in range(4)] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    with pytest.raises(ReasonRLError, match="multiple of off_policy"):
        Schedule(steps=5, minibatches_per_round=2, asynchronous=True)
    with pytest.raises(ReasonRLError, match="'online_dpo.steps' \\(5\\) is not a multiple"):
        validate_config({"online_dpo": {"steps": 5, "variants": [{"name": "a", "off_policy": 2}]}})
    with pytest.raises(ReasonRLError, match="repeats 'a'"):
        validate_config({"online_dpo": {"variants": [{"name": "a"}, {"name": "a"}]}})
    config = validate_config({"online_dpo": {"variants": [{"name": "a"}]}})
    assert online_variant(config, "a")["mode"] == "async"
    with pytest.raises(ReasonRLError, match="'b' is not in online_dpo.variants"):
        online_variant(config, "b")


# ---- runs with the generator process -----------------------------------------------------------

SMALL = {
    "steps": 4,
    "prompts_per_step": 2,
    "samples_per_prompt": 2,
    "max_length": 512,
    "checkpoint_every": 1,
    "variants": [
        {"name": "sync", "mode": "sync", "off_policy": 1},
        {"name": "async", "mode": "async", "off_policy": 2},
        {"name": "rloo", "mode": "async", "loss": "rloo", "off_policy": 1},
        {"name": "ppo", "mode": "async", "loss": "ppo", "off_policy": 2},
        {"name": "grpo", "mode": "async", "loss": "grpo", "off_policy": 2, "grpo": {"beta": 0.04}},
    ],
}


@pytest.fixture(scope="module")
def online_setup(tmp_path_factory) -> tuple[dict, Path]:
    """Config, a folder with 20 arith train problems, and a tiny policy whose tokenizer knows
    their text (so a tool prompt fits its context)."""
    from reasonrl.models import build_tiny_policy
    from reasonrl.stages.models import corpus_texts

    folder = tmp_path_factory.mktemp("online")
    config = validate_config(
        {
            "rollout": {"max_turns": 1, "max_turn_tokens": 12, "max_total_tokens": 12},
            "generation": {"batch_size": 8},
            "online_dpo": SMALL,
        }
    )
    train, _ = build_problems("arith", {**config["tasks"]["arith"], "train_size": 20}, 0)
    write_jsonl(folder / "train.jsonl", train, schema="problem")
    settings = {
        "vocab_size": 400,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 2,
        "max_position_embeddings": 1024,
    }
    build_tiny_policy(corpus_texts([str(folder / "train.jsonl")]), settings, 0, folder / "policy")
    return config, folder


def _children() -> set[int]:
    """Live child processes of this test process (pids), less multiprocessing's resource
    tracker, which serves the test process for its whole life."""
    me = os.getpid()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                tracker = b"resource_tracker" in (entry / "cmdline").read_bytes()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[1]) == me and fields[0] != "Z" and not tracker:
                found.add(int(entry.name))
    return found


@pytest.mark.parametrize("name", ["sync", "rloo", "ppo", "grpo"])
def test_learner_data_carries_the_configured_lag(online_setup, name):
    config, folder = online_setup
    before = _children()
    out = folder / f"online-{name}"
    policy, train = str(folder / "policy"), str(folder / "train.jsonl")
    metrics = run_online(config, name, policy, train, "tool", 1, str(out))
    assert _children() == before, "the generator outlived the run"
    variant = online_variant(config, name)
    schedule = Schedule(4, variant["off_policy"], variant["mode"] == "async")
    versions = [h["policy_version"] for h in metrics["history"]]
    assert versions == [schedule.generator_version(schedule.round_of(i)[0]) for i in range(4)]
    lags = [h["lag"] for h in metrics["history"]]
    expected = {"sync": [0, 0, 0, 0], "rloo": [0, 1, 1, 1], "ppo": [0, 1, 2, 3]}
    assert lags == {**expected, "grpo": expected["ppo"]}[name]
    if name == "grpo":
        # the ratio is against the generator's policy: 1 on the first, on-policy step; each
        # step logs the family's signals
        assert metrics["history"][0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        signals = ("kl_k3", "entropy", "clip_low_fraction", "clip_high_fraction")
        signals += ("advantage_std", "tied_groups", "overlong_filtered", "policy_loss")
        assert all(key in h for h in metrics["history"] for key in signals)
        assert metrics["history"][0]["kl_k3"] == pytest.approx(0.0, abs=1e-5)  # the start
        assert read_json(out / "metrics.json")["grpo"]["beta"] == 0.04  # what the run was
    if name == "ppo":
        # The old policy is the generator's: the first step is on-policy (ratio 1), the
        # lagged ones are not; the saved model is the policy without the critic.
        assert metrics["history"][0]["ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert all("value_loss" in h for h in metrics["history"])
        from reasonrl.models import load_policy

        load_policy(out)
    saved = read_json(out / "metrics.json")
    assert saved["steps"] == 4 and saved["mode"] == variant["mode"]
    assert (out / "metrics.csv").exists() and (out / "manifest.json").exists()
    assert not (folder / f".online-{name}.rounds").exists()
    for key in ("reward", "kl", "ref_perplexity", "gen_seconds", "elapsed", "weight_push_seconds"):
        assert key in saved["history"][-1]


def test_online_dpo_signals_reach_tensorboard_each_step(online_setup, tmp_path, monkeypatch):
    config, folder = online_setup
    root = track(monkeypatch, tmp_path, "tensorboard")
    policy, train = str(folder / "policy"), str(folder / "train.jsonl")
    history = run_online(config, "sync", policy, train, "tool", 1, "results/models/online-sync")[
        "history"
    ]
    scalars = event_scalars(root / "run1/models/online-sync")
    signals = {"reward", "reward_std", "kl", "win_margin", "pairs", "lag", "policy_version"}
    assert COMMON | signals <= scalars.keys()
    for key in COMMON | signals:
        assert scalars[key] == [(h["step"], pytest.approx(h[key], rel=1e-6)) for h in history]
    dpo_steps = [h for h in history if "reward_margin" in h]  # steps with a decisive pair
    assert [s for s, _ in scalars.get("reward_margin", [])] == [h["step"] for h in dpo_steps]


def test_generator_updates_weights_without_restart(online_setup):
    """The weights the learner pushes are the ones that sample: a policy pushed with zeroed
    weights samples differently from the SFT one in the same running process."""
    from reasonrl.models import load_policy

    config, folder = online_setup
    problems = json.loads(json.dumps(_problems(folder)))
    config = {**config, "online_dpo": {**config["online_dpo"], "loss": "dpo"}}
    spec = _spec(config, folder / "policy", problems, Schedule(2, 1, asynchronous=False))
    model, _ = load_policy(folder / "policy")
    with GeneratorProcess(spec) as generator:
        generator.push(0, model)
        first = generator.next_round()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.0)
        generator.push(1, model)
        second = generator.next_round()
    assert (first["version"], second["version"]) == (0, 1)
    assert second["weight_load_seconds"] > 0
    # A zeroed model is uniform over the vocabulary: every sample's log-prob changes.
    assert all(
        a["behaviour_logp"] != b["behaviour_logp"]
        for a, b in zip(first["rows"], second["rows"], strict=True)
    )
    assert not generator.process.is_alive()


def bt_reward_model(policy: Path, out: Path) -> Path:
    """An (untrained) Bradley-Terry RM on the policy's trunk: scores vary with the text."""
    from transformers import AutoModelForSequenceClassification

    from reasonrl.models import load_tokenizer
    from reasonrl.rewards.models import INFO_FILE

    tokenizer = load_tokenizer(policy)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(policy, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / INFO_FILE).write_text(json.dumps({"kind": "bt"}))
    return out


def test_generator_scores_samples_with_the_bt_reward_model(online_setup, tmp_path):
    from reasonrl.chat import render
    from reasonrl.models import load_policy
    from reasonrl.rewards.models import load_reward_model
    from reasonrl.rewards.scoring import bt_scores

    config, folder = online_setup
    rm = bt_reward_model(folder / "policy", tmp_path / "rm")
    section = {**config["online_dpo"], "loss": "dpo", "reward": "rm", "eos_penalty": 0.5}
    spec = _spec(
        {**config, "online_dpo": section}, folder / "policy", _problems(folder),
        Schedule(1, 1, asynchronous=False), reward_model=str(rm),
    )  # fmt: skip
    model, _ = load_policy(folder / "policy")
    with GeneratorProcess(spec) as generator:
        generator.push(0, model)
        rows = generator.next_round()["rows"]
    scorer, tokenizer, _ = load_reward_model(rm)
    scores = bt_scores(scorer, tokenizer, [render(tokenizer, r["messages"]) for r in rows])
    truncated = [r["finish_reason"] in ("turn_token_cap", "total_token_cap") for r in rows]
    expected = [s - 0.5 * cut for s, cut in zip(scores, truncated, strict=True)]
    assert [r["reward"] for r in rows] == pytest.approx(expected, abs=1e-4)
    assert len({round(r["reward"], 4) for r in rows}) > 2  # RM scores, not 0/1 verdicts


def test_rm_reward_without_a_reward_model_is_a_one_line_error(online_setup, tmp_path):
    config, folder = online_setup
    config = {**config, "online_dpo": {**config["online_dpo"], "reward": "rm"}}
    before = _children()
    with pytest.raises(ReasonRLError, match="online_dpo.reward 'rm' needs a reward model"):
        run_online(
            config, "sync", str(folder / "policy"), str(folder / "train.jsonl"), "tool", 1,
            str(tmp_path / "out"),
        )  # fmt: skip
    assert not (tmp_path / "out").exists() and _children() == before  # no generator started


def _spec(
    config: dict, model: Path, problems: list[dict], schedule: Schedule, **extra
) -> GeneratorSpec:
    """A one-thread tool-style generator from round 0."""
    return GeneratorSpec(
        settings=_online(config["online_dpo"], config["seed"]),
        environment=RolloutEnvironment.from_config(config),
        model_path=str(model),
        problems=problems,
        style="tool",
        schedule=schedule,
        first_round=0,
        threads=1,
        **extra,
    )


def _problems(folder: Path) -> list[dict]:
    from reasonrl.io import read_jsonl

    return read_jsonl(folder / "train.jsonl", schema="problem")


def test_generator_failure_is_reported_and_leaves_no_process(online_setup, tmp_path):
    config, folder = online_setup
    before = _children()
    schedule = Schedule(2, 1, asynchronous=True)
    spec = _spec(config, tmp_path / "missing-model", _problems(folder), schedule)
    with (
        pytest.raises(ReasonRLError, match="generator process failed"),
        GeneratorProcess(spec) as generator,
    ):
        generator.next_round()
    assert _children() == before


def _cli(config: dict, folder: Path, policy: Path, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "reasonrl.cli",
        "online-dpo",
        "--config-json",
        json.dumps(config),
        "--variant",
        name,
        "--model",
        str(policy),
        "--train",
        str(folder / "train.jsonl"),
        "--threads",
        "1",
        "--out",
        str(folder / f"online-{name}"),
    ]


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _wait_for(predicate, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_interrupt_or_kill_leaves_no_process_and_the_run_resumes(online_setup, tmp_path, how):
    config, _ = online_setup
    folder = tmp_path
    (folder / "train.jsonl").write_text((online_setup[1] / "train.jsonl").read_text())
    config = {**config, "online_dpo": {**config["online_dpo"], "steps": 6}}
    command = _cli(config, folder, online_setup[1] / "policy", "async")
    learner = subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=default_signals,  # Ctrl-C as a terminal delivers it, however pytest started
    )
    ckpt = folder / ".online-async.ckpt"
    _wait_for(lambda: any(ckpt.glob("step-*")))
    workers = _descendants(learner.pid)
    assert workers, "no generator process"
    # Ctrl-C reaches the whole foreground group; SIGKILL only the learner.
    if how == signal.SIGINT:
        os.killpg(learner.pid, signal.SIGINT)
    else:
        learner.send_signal(signal.SIGKILL)
    learner.wait(timeout=60)
    assert learner.returncode != 0
    _wait_for(lambda: not any(_alive(p) for p in workers), seconds=30)
    resumed = subprocess.run(command, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    metrics = read_json(folder / "online-async" / "metrics.json")
    assert metrics["resumed_from"] >= 1 and metrics["steps"] == 6
    assert [h["step"] for h in metrics["history"]] == list(range(1, 7))
    # Async with N = 2: rounds 0 and 1 sampled by version 0, round 2 by version 2. The steps
    # before the kill kept their exact lags (after a resume, a round whose version is gone is
    # sampled by the resumed one, and says so).
    before_kill = metrics["history"][: metrics["resumed_from"]]
    assert [h["lag"] for h in before_kill] == [0, 1, 2, 3, 2, 3][: len(before_kill)]


def test_learner_compute_is_each_steps_batch_and_update_not_its_wait_for_data():
    """A step's seconds are its update; its batch (reference log-probs, pairs) is made before
    it, and the wait for a round is neither."""
    step = {"gen_seconds": 0.0, "weight_push_seconds": 0.0, "weight_load_seconds": 0.0}
    step.update(generator_weight_wait_seconds=0.0, elapsed=9.0, samples=4.0, gen_tokens=30.0)
    history = [
        {**step, "seconds": 1.0, "reference_seconds": 0.5, "data_wait_seconds": 3.0},
        {**step, "seconds": 2.0, "reference_seconds": 0.25, "data_wait_seconds": 0.0},
    ]
    summary = timing_summary(history)
    assert summary["train_seconds"] == 3.75 and summary["data_wait_seconds"] == 3.0
    assert summary["samples"] == 8 and summary["gen_tokens"] == 60


def test_timing_summary_of_a_run_resumed_from_before_the_work_counts():
    """Steps a checkpoint logged before `samples` / `gen_tokens` existed leave them unknown."""
    step = {"gen_seconds": 1.0, "weight_push_seconds": 0.0, "weight_load_seconds": 0.0}
    step.update(generator_weight_wait_seconds=0.0, data_wait_seconds=0.0, elapsed=9.0)
    step.update(seconds=1.0, reference_seconds=0.5)
    history = [step, {**step, "samples": 4.0, "gen_tokens": 30.0}]
    summary = timing_summary(history)
    assert summary["samples"] is None and summary["gen_tokens"] is None
    assert summary["gen_seconds"] == 2.0 and summary["train_seconds"] == 3.0


def test_sync_and_async_runs_do_the_same_work(online_setup):
    """The wall-clock comparison (bench/online_async.py) is only fair if both modes train on
    the same prompts with the same updates and samples, whatever their off-policyness."""
    config, folder = online_setup
    policy, train = str(folder / "policy"), str(folder / "train.jsonl")
    runs = {
        name: run_online(config, name, policy, train, "tool", 1, str(folder / f"same-{name}"))
        for name in ("sync", "async")  # off_policy 1 and 2: rounds of 1 and 2 steps
    }
    sync, run = runs["sync"], runs["async"]
    section = config["online_dpo"]
    assert sync["steps"] == run["steps"] == section["steps"]
    per_step = section["prompts_per_step"] * section["samples_per_prompt"]
    assert sync["samples"] == run["samples"] == section["steps"] * per_step
    assert [h["samples"] for h in sync["history"]] == [h["samples"] for h in run["history"]]
    assert sync["prompts"] == run["prompts"]
    assert [len(ids) for ids in sync["prompts"]] == [section["prompts_per_step"]] * 4
    assert len({i for ids in sync["prompts"] for i in ids}) == 4 * section["prompts_per_step"]
    for metrics in (sync, run):
        assert metrics["gen_tokens"] == sum(h["gen_tokens"] for h in metrics["history"]) > 0
        assert metrics["threads_per_process"] == 1


def test_a_run_leaves_its_callers_torch_threads(online_setup):
    """A run sets torch to one thread per process (generator and learner halve the cores) and
    gives the caller's count back: before, a run called in-process left every later torch op
    on one thread (the test session's learning tests ran at half speed after this file)."""
    config, folder = online_setup
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        policy, train = str(folder / "policy"), str(folder / "train.jsonl")
        metrics = run_online(config, "sync", policy, train, "tool", 2, str(folder / "threads"))
        assert metrics["threads_per_process"] == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_table_compares_sync_and_async(tmp_path):
    def fake_run(mode: str, wall: float, gen: float, train: float) -> Path:
        folder = tmp_path / mode
        history = [
            {"reward": r, "kl": 0.1 * i, "elapsed": wall * (i + 1) / 4}
            for i, r in enumerate([0.0, 0.2, 0.4, 0.6])
        ]
        metrics = {
            "mode": mode,
            "loss": "dpo",
            "off_policy": 1,
            "steps": 4,
            "wall_seconds": wall,
            "gen_seconds": gen,
            "train_seconds": train,
            "ideal_speedup": round((gen + train) / max(gen, train), 3),
            "history": history,
        }
        folder.mkdir()
        (folder / "metrics.json").write_text(json.dumps(metrics))
        (folder / "eval.json").write_text(
            json.dumps({"greedy_pass@1": 0.5, "greedy_pass@1_ci": [0.3, 0.7]})
        )
        return folder

    rows = [(m, str(fake_run(m, w, 6.0, 4.0)), str(tmp_path / m / "eval.json"))
            for m, w in (("sync", 10.0), ("async", 6.25))]  # fmt: skip
    table = write_online_table(rows, str(tmp_path / "out"))
    assert table[0]["ideal_speedup"] == pytest.approx(10 / 6, abs=1e-3)
    assert table[1]["ideal_speedup"] is None
    assert table[1]["achieved_speedup"] == pytest.approx(1.6)
    assert table[0]["final_reward"] == 0.6 and table[1]["final_kl"] == pytest.approx(0.3)
    assert (tmp_path / "out" / "plot.png").stat().st_size > 0
    assert "| sync | sync | 1 | 4 |" in (tmp_path / "out" / "table.md").read_text()


def test_a_micro_batch_without_rows_gives_every_trained_weight_a_zero_gradient(tiny_policy):
    """A micro-batch whose prompts all tied has no DPO pair. Over several processes its
    backward must still reach every trained weight, else DeepSpeed's ZeRO-2 has nothing to
    reduce on that process (test_data_parallel_stages.py's two-nodes online learner stopped
    with IndexError); in one process it reaches none, so a step without any pair leaves the
    gradients None and AdamW moves nothing."""
    from reasonrl.models import load_policy
    from reasonrl.training.online_dpo import no_rows_loss

    model = load_policy(tiny_policy)[0]
    model.model.embed_tokens.requires_grad_(False)
    loss = no_rows_loss(model, 2)
    loss.backward()
    assert float(loss.detach()) == 0.0
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.grad is not None and not p.grad.any() for p in trained)
    assert model.model.embed_tokens.weight.grad is None
    model.zero_grad(set_to_none=True)
    no_rows_loss(model, 1).backward()
    assert all(p.grad is None for p in model.parameters())
