"""LoRA in the reward-model, PPO and online DPO trainers: only the adapters (and a fresh head:
the BT score, PPO's value head) train, the saved folder is a plain Hugging Face model whose
frozen weights are the start's, an online learner sends its generator the merged weights, and
the PPO and online learners' reference is the policy with its adapters off (no second copy).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import test_online_dpo
import test_rewards
import torch
from transformers import AutoModelForSequenceClassification

from reasonrl.config import validate_config
from reasonrl.io import write_jsonl
from reasonrl.models import DTYPES, from_pretrained, load_policy
from reasonrl.online_dpo.actors import GeneratorProcess
from reasonrl.rewards.models import load_reward_model
from reasonrl.sequences import action_logps
from reasonrl.stages._train import TrainingRun
from reasonrl.stages.online_dpo import online_dpo as run_online
from reasonrl.stages.ppo import ppo as run_ppo
from reasonrl.stages.reward_models import train_reward_model
from reasonrl.tasks import build_problems
from reasonrl.training.lora import LoraSettings, add_adapters, merged, merged_state_dict

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# The trainers' own tests' fixtures: their data and a tiny policy that knows its text.
rm_inputs = test_rewards.rm_inputs
online_setup = test_online_dpo.online_setup

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA = {"r": 4, "alpha": 8}
ROLLOUT = {"max_turns": 1, "max_turn_tokens": 12, "max_total_tokens": 12}


def _adapted(key: str) -> bool:
    return any(f".{name}." in key for name in TARGETS)


def _check_folder(saved: dict, start: dict, head: str | None = None) -> None:
    """The saved weights are the start's but for the target linears (their merged delta)
    and the head, which trained in full."""
    assert saved.keys() == start.keys()
    for key, weight in saved.items():
        if not _adapted(key) and not (head and key.startswith(head)):
            assert torch.equal(weight, start[key]), f"{key}: frozen, yet it changed"
    assert any(not torch.equal(saved[k], start[k]) for k in start if _adapted(k))
    if head:
        assert not torch.equal(saved[f"{head}.weight"], start[f"{head}.weight"])


@pytest.fixture
def trained_models(monkeypatch) -> list[dict[str, object]]:
    """Each model a TrainingRun starts its loop on (PPO, online DPO), with the names of its
    trainable parameters as the loop got it."""
    seen = []
    start = TrainingRun.start

    def spy(self, model, *args, **kwargs):
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        seen.append({"model": model, "trainable": trainable})
        return start(self, model, *args, **kwargs)

    monkeypatch.setattr(TrainingRun, "start", spy)
    return seen


@pytest.fixture
def no_reference_copy(monkeypatch) -> None:
    """A LoRA run that loads a second copy of its start model as the reference fails."""

    def refuse(self, model_path, dtype):
        raise AssertionError(f"a LoRA run loaded a reference copy of {model_path}")

    monkeypatch.setattr(TrainingRun, "load_reference", refuse)


def _only_adapters_and(trainable: set[str], head: str) -> None:
    assert trainable
    for name in trainable:
        assert ".lora_A." in name or ".lora_B." in name or name.startswith(head), name


# ---- merged weights --------------------------------------------------------------------------


@pytest.mark.parametrize("task", ["CAUSAL_LM", "SEQ_CLS"])
def test_merged_state_dict_is_what_merging_gives_and_leaves_the_adapters(tiny_policy, task):
    if task == "SEQ_CLS":
        model = AutoModelForSequenceClassification.from_pretrained(tiny_policy, num_labels=1)
    else:
        model = load_policy(tiny_policy)[0]
    lora = LoraSettings(4, 8, 0.0, TARGETS)
    model = add_adapters(model, lora, 0, task, ("score",) if task == "SEQ_CLS" else ())
    with torch.no_grad():  # trained adapters and head: B and the head's copy moved
        for param in model.parameters():
            if param.requires_grad:
                param.add_(0.1 * torch.randn_like(param))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = merged_state_dict(model)
    want = merged(copy.deepcopy(model)).state_dict()
    assert state.keys() == want.keys()
    assert all(torch.equal(state[k], want[k]) for k in want)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


def test_the_generator_gets_the_merged_weights_of_a_lora_policy(tiny_policy):
    model = add_adapters(load_policy(tiny_policy)[0], LoraSettings(4, 8, 0.0, TARGETS), 0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.1)
    generator = GeneratorProcess(spec=None)  # its channel only: no process started
    try:
        generator.push(3, model)
        version, state = generator.requests.get(timeout=30)
    finally:
        for channel in (generator.requests, generator.replies):
            channel.cancel_join_thread()
            channel.close()
    want = merged(copy.deepcopy(model)).state_dict()
    assert version == 3 and state.keys() == want.keys()
    assert all(torch.equal(state[k], want[k]) for k in want)
    load_policy(tiny_policy)[0].load_state_dict(state)  # what the engine's load_weights does


# ---- the reference ---------------------------------------------------------------------------


@pytest.fixture
def loaded(monkeypatch) -> list[str]:
    """The model folders TrainingRun loads, policy and reference alike."""
    import reasonrl.stages._train as train_stage

    folders = []

    def spy(path, *args, **kwargs):
        folders.append(str(path))
        return load_policy(path, *args, **kwargs)

    monkeypatch.setattr(train_stage, "load_policy", spy)
    return folders


def _logps(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return action_logps(model(**batch).logits, batch["input_ids"])


def _train_steps(policy: torch.nn.Module, batch: dict, steps: int = 3) -> None:
    """A few steps raising the batch's likelihood: the policy moves off its start."""
    policy.train()
    trainable = [p for p in policy.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=1e-2)
    for _ in range(steps):
        optimizer.zero_grad()
        (-action_logps(policy(**batch).logits, batch["input_ids"]).mean()).backward()
        optimizer.step()


def _reference_setup(tiny_policy: Path, tmp_path: Path, r: int):
    """A run's policy and reference at the tiny policy (LoRA rank r), the start model loaded
    apart, and a batch of token ids."""
    lora = LoraSettings(r, 8, 0.1, TARGETS)  # adapter dropout: the reference's forward is eval
    run = TrainingRun("reference", tmp_path / "out", {}, [], 0, lora=lora)
    policy, _ = run.load_policy(str(tiny_policy), "float32")
    reference = run.reference(policy, str(tiny_policy), "float32")
    start = load_policy(tiny_policy)[0].eval()
    ids = torch.randint(
        3, start.config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(0)
    )
    return policy, reference, start, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_a_lora_runs_reference_is_its_policy_with_the_adapters_off_not_a_second_copy(
    tiny_policy, tmp_path, loaded
):
    """The reference's log-probs are the start model's before and after the adapters train;
    only the policy is loaded; after the reference's block the policy has its adapters and
    its train mode back."""
    policy, reference, start, batch = _reference_setup(tiny_policy, tmp_path, r=4)
    assert loaded == [str(tiny_policy)], "one model resident: the policy's base is the reference"
    want = _logps(start, batch)
    with reference.evaluating() as model:
        torch.testing.assert_close(_logps(model, batch), want)
    _train_steps(policy, batch)
    with reference.evaluating() as model:
        assert model is policy and not model.training
        torch.testing.assert_close(_logps(model, batch), want)
    assert policy.training, "the policy trains on in train mode"
    trained = _logps(policy.eval(), batch)
    assert (trained - want).abs().max() > 1e-3, "the adapters are on again outside the block"


def test_a_full_fine_tuning_runs_reference_is_a_frozen_copy_loaded_beside_the_policy(
    tiny_policy, tmp_path, loaded
):
    policy, reference, start, batch = _reference_setup(tiny_policy, tmp_path, r=0)
    assert loaded == [str(tiny_policy)] * 2, "policy and reference: two copies"
    _train_steps(policy, batch)
    with reference.evaluating() as model:
        assert model is not policy
        torch.testing.assert_close(_logps(model, batch), _logps(start, batch))
    assert (_logps(policy.eval(), batch) - _logps(start, batch)).abs().max() > 1e-3


# ---- reward models ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["bt", "prm"])
def test_a_lora_reward_model_trains_adapters_and_its_head_and_saves_a_plain_folder(
    tiny_policy, rm_inputs, tmp_path, kind
):
    config = test_rewards.rm_config()
    train = config["reward_models"]["train"]
    train.update(lr=1e-2, lora={**train["lora"], **LORA})
    if kind == "bt":  # the start: the policy under the seeded fresh head train_bt makes
        torch.manual_seed(config["seed"])
        start_model = from_pretrained(
            AutoModelForSequenceClassification, tiny_policy, num_labels=1, dtype=DTYPES["float32"]
        )
    else:
        start_model = load_policy(tiny_policy)[0]
    start = start_model.state_dict()
    data = rm_inputs / ("prm.jsonl" if kind == "prm" else "samples.jsonl")
    out = tmp_path / kind
    train_reward_model(
        config, kind, str(tiny_policy), str(rm_inputs / "problems.jsonl"), str(data), str(out)
    )
    assert not list(out.glob("adapter_*")), "a plain HF folder, no peft files"
    saved = load_reward_model(out)[0].state_dict()
    _check_folder(saved, start, head="score" if kind == "bt" else None)


# ---- PPO -------------------------------------------------------------------------------------


def ppo_config(lora: dict, **ppo) -> dict:
    """Two PPO-M iterations of 2 prompts x 2 responses with a separate critic under `lora`."""
    section = {
        "iterations": 2,
        "prompts_per_iteration": 2,
        "responses_per_prompt": 2,
        "draws_per_prompt": 1,
        "heldout_prompts": 1,
        "ppo_epochs": 1,
        "batch_size": 4,
        "policy_lr": 1e-2,
        "critic_lr": 1e-2,
        "max_length": 256,
        "critic": "separate",
        "lora": lora,
        "variants": [{"name": "m", "filter": "ppo-m"}],
        **ppo,
    }
    return validate_config(
        {"tasks": {"pycode": {"kind": "pycode"}}, "rollout": ROLLOUT, "ppo": section}
    )


def _ppo_inputs(tiny_policy: Path, folder: Path) -> tuple[Path, Path]:
    """Short pycode prompts (the tiny policy's context is 256 tokens) and an untrained BT RM
    on the policy: its scores vary with the text, which is all PPO needs here."""
    problems, _ = build_problems("pycode", {"kind": "pycode", "train_size": 6, "test_size": 1}, 0)
    for row in problems:
        row["question"] = row["question"][:60]
    write_jsonl(folder / "train.jsonl", problems, schema="problem")
    return folder / "train.jsonl", test_online_dpo.bt_reward_model(tiny_policy, folder / "rm")


def test_lora_ppo_trains_the_adapters_of_policy_and_critic_and_the_value_head(
    tiny_policy, tmp_path, trained_models, monkeypatch, no_reference_copy
):
    """...and its KL penalty's reference is the policy with the adapters off: each buffer's
    reference log-probs are the start model's, the policy's equal them before any update and
    not after one."""
    import reasonrl.ppo.run as ppo_run

    problems, rm = _ppo_inputs(tiny_policy, tmp_path)
    scores = iter(range(100))  # each held-out score beats the last: the final policy is kept
    monkeypatch.setattr(
        ppo_run.PPORun,
        "evaluate",
        lambda self, seed: {"heldout_pass": float(next(scores)), "heldout_reward": 0.0},
    )
    start, kls = load_policy(tiny_policy)[0].eval(), []
    experience = ppo_run.PPORun.experience

    def checked(self, messages, scores):
        buffer = experience(self, messages, scores)
        batch = {k: buffer[k] for k in ("input_ids", "attention_mask")}
        want = (_logps(start, batch) * buffer["action_mask"]).sum(-1)
        # the buffer keeps the policy's log-probs and the summed log-ratio to the reference
        got = buffer["old_logps"].sum(-1) - buffer["ref_kl"]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-5)
        kls.append(float(buffer["ref_kl"].abs().max()))
        return buffer

    monkeypatch.setattr(ppo_run.PPORun, "experience", checked)
    config = ppo_config(LORA)
    out = tmp_path / "ppo-m"
    run_ppo(config, "m", str(tiny_policy), str(rm), str(problems), out)
    (started,) = trained_models
    trainable = started["trainable"]
    _only_adapters_and(trainable, "value_head.")
    assert any(n.startswith("critic_trunk.") for n in trainable), "the critic has adapters"
    assert any(n.startswith("policy.") for n in trainable)
    assert not list(out.glob("adapter_*"))
    _check_folder(load_policy(out)[0].state_dict(), load_policy(tiny_policy)[0].state_dict())
    assert len(kls) == 2 and kls[0] < 1e-4 < kls[1], kls


def test_lora_ppo_sends_its_generator_of_its_own_the_merged_weights(
    tiny_policy, tmp_path, monkeypatch, no_reference_copy
):
    """--generator-gpus 1 under LoRA: the rollout server (the HF engine, a plain model, in
    a process of its own) is sent the policy's weights merged into the plain model's names
    before each sampling that follows an update, the trained adapters in them."""
    from reasonrl.rollout.generator_process import RolloutServer

    problems, rm = _ppo_inputs(tiny_policy, tmp_path)
    sent, load = [], RolloutServer.load_weights

    def kept(self, entries):
        state = dict(entries)
        sent.append(state)
        load(self, state.items())

    monkeypatch.setattr(RolloutServer, "load_weights", kept)
    out = tmp_path / "ppo-m"
    run_ppo(ppo_config(LORA), "m", str(tiny_policy), str(rm), str(problems), out, 1)
    plain = load_policy(tiny_policy)[0].state_dict()
    # the start's, then after each of the 2 iterations' updates
    assert len(sent) == 3 and all(state.keys() == plain.keys() for state in sent)
    assert all(torch.equal(sent[0][k], plain[k]) for k in plain)
    assert any(not torch.equal(sent[-1][k], plain[k]) for k in plain if _adapted(k))
    final = load_policy(out)[0].state_dict()  # the best iteration's: the last, or before
    assert any(all(torch.equal(s[k], final[k]) for k in plain) for s in sent)


# ---- online DPO ------------------------------------------------------------------------------


def test_lora_online_ppo_trains_the_adapters_and_value_head_and_saves_a_plain_folder(
    online_setup, tmp_path, trained_models, monkeypatch, no_reference_copy
):
    """The PPO loss (value head on the policy's trunk): the generator samples with the merged
    weights it is sent (a pushed peft state would not load), the folder is plain, and the
    learner's reference log-probs (the policy, adapters off) are the start model's at every
    step, the trained ones too (async: the generator samples meanwhile)."""
    import reasonrl.online_dpo.learner as learner

    config, folder = online_setup
    config = copy.deepcopy(config)
    config["online_dpo"]["lora"].update(LORA)
    config["online_dpo"]["lr"] = 1e-2
    policy, train = folder / "policy", str(folder / "train.jsonl")
    start, token_logps, checked = load_policy(policy)[0].eval(), learner.token_logps, []

    def compared(model, seqs, pad_id, batch_size):
        got = token_logps(model, seqs, pad_id, batch_size)
        for row, want in zip(got, token_logps(start, seqs, pad_id, batch_size), strict=True):
            torch.testing.assert_close(torch.tensor(row), torch.tensor(want), atol=1e-5, rtol=0)
        checked.append(len(got))
        return got

    monkeypatch.setattr(learner, "token_logps", compared)
    out = tmp_path / "online-ppo"
    metrics = run_online(config, "ppo", str(policy), train, "tool", 1, str(out))
    assert metrics["steps"] == 4 and len(checked) == 4
    (started,) = trained_models
    _only_adapters_and(started["trainable"], "value_head.")
    assert not list(out.glob("adapter_*"))
    _check_folder(load_policy(out)[0].state_dict(), load_policy(policy)[0].state_dict())
