"""QLoRA (lora.quantize: nf4) and 8-bit AdamW (optimizer: adamw8bit) through bitsandbytes on
the CPU: the base is really 4-bit, only the adapters train, the saved folder is the
unquantized start plus the merged delta, a round's reference is the quantized start, the
8-bit states are 8-bit and resume exactly, and the planner's bytes are the measured ones."""

from __future__ import annotations

import json
import math
import sys

import pytest
import torch
from test_lora import _samples
from test_lora_trainers import (
    _check_folder,
    _ppo_inputs,
    no_reference_copy,
    ppo_config,
    trained_models,
)

from reasonrl import memory_plan as mp
from reasonrl.config import validate_config
from reasonrl.errors import ReasonRLError
from reasonrl.io import read_jsonl, write_jsonl
from reasonrl.models import load_policy
from reasonrl.stages._train import TrainingRun
from reasonrl.training.data import MicroBatches
from reasonrl.training.lm_loss import masked_lm_loss
from reasonrl.training.loop import CheckpointStore, LoopSettings, train
from reasonrl.training.lora import LoraSettings, add_adapters, merged, merged_state_dict

pytestmark = pytest.mark.usefixtures("one_torch_thread")
__all__ = ["no_reference_copy", "trained_models"]  # test_lora_trainers' fixtures, used here

TARGETS = ("q_proj", "v_proj", "up_proj")  # k_proj, o_proj, gate and down: quantized, frozen
QLORA = LoraSettings(4, 8, 0.0, TARGETS, key="sft.lora", quantize="nf4")
SETTINGS = LoopSettings(max_steps=6, lr=1e-2, grad_accum=2, checkpoint_every=3, seed=5)


class Crash(Exception):
    pass


def _quantized_linears(model) -> list[str]:
    import bitsandbytes

    return [n for n, m in model.named_modules() if isinstance(m, bitsandbytes.nn.Linear4bit)]


def _start(tiny_policy) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_policy(tiny_policy)[0].state_dict().items()}


def test_qlora_trains_adapters_on_a_4bit_base_and_saves_the_unquantized_start_plus_delta(
    tiny_policy, tmp_path
):
    start = _start(tiny_policy)
    run = TrainingRun("sft", tmp_path / "sft-tool", {}, [], 0, lora=QLORA)
    model, tokenizer = run.load_policy(str(tiny_policy), "float32")
    # every decoder linear of both layers is 4-bit, targets and the others alike
    assert len(_quantized_linears(model)) == 2 * 7
    batches = MicroBatches(_samples(24), 4, 0, 1, packing=False, block_size=64)
    result = run.fit(model, batches, masked_lm_loss, SETTINGS)
    trainable = {n for n, p in result["model"].named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    deltas = {
        name.removeprefix("base_model.model.") + ".weight": (
            module.scaling["default"]
            * module.lora_B["default"].weight
            @ module.lora_A["default"].weight
        ).detach()
        for name, module in result["model"].named_modules()
        if hasattr(module, "lora_A")
    }
    assert len(deltas) == 2 * len(TARGETS)
    run.save(result["model"], tokenizer, run.metrics(result, {}, {}))

    out = tmp_path / "sft-tool"
    assert not list(out.glob("adapter_*")), "a plain HF folder, no peft files"
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    saved = load_policy(out)[0].state_dict()
    assert saved.keys() == start.keys()
    for key, weight in saved.items():
        # merged into the 4-bit weights, every linear would carry the quantization error
        want = start[key] + deltas[key] if key in deltas else start[key]
        torch.testing.assert_close(weight, want, rtol=0, atol=1e-6, msg=key)
    assert any(deltas[k].abs().max() > 1e-4 for k in deltas), "the adapters learned"


def test_the_weights_sent_to_a_generator_are_the_dequantized_base_plus_the_delta(tiny_policy):
    import bitsandbytes

    start = _start(tiny_policy)
    model = add_adapters(load_policy(tiny_policy, **QLORA.load_options("float32"))[0], QLORA, 0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.1 * torch.randn_like(param))
    state = merged_state_dict(model)
    full = merged(model).state_dict()  # the unquantized start plus the same deltas
    assert state.keys() == full.keys() == start.keys()
    quantized = {
        name.removeprefix("base_model.model.").removesuffix(".base_layer") + ".weight":
        bitsandbytes.functional.dequantize_4bit(module.weight.data, module.weight.quant_state)
        for name, module in model.named_modules()
        if isinstance(module, bitsandbytes.nn.Linear4bit)
    }  # fmt: skip
    assert len(quantized) == 2 * 7
    for key in start:
        if key in quantized:  # the 4-bit base, dequantized, plus the same delta
            delta = full[key] - start[key]
            torch.testing.assert_close(state[key], quantized[key] + delta, rtol=0, atol=1e-6)
            # NF4's error, not zero: 16 levels give about a fifth of the mean |weight| here
            error = (state[key] - full[key]).abs().mean()
            assert 0 < error < 0.3 * start[key].abs().mean(), key
        else:
            assert torch.equal(state[key], full[key]), key


def write_pairs(folder, count: int) -> str:
    """`count` M-DPO pairs (42 chosen, a wrong sum rejected) in folder/pairs.jsonl."""

    def chat(answer: str) -> list[dict]:
        return [
            {"role": "user", "content": "What is 12 + 30?"},
            {"role": "assistant", "content": f"x = 12 + 30\nThe answer is {answer}."},
        ]

    rows = [
        {"problem_id": f"p{i}", "task": "arith", "prompt": chat("")[:1],
         "chosen": chat("42"), "rejected": chat(str(50 + i))}
        for i in range(count)
    ]  # fmt: skip
    write_jsonl(folder / "pairs.jsonl", rows, schema="preference_pair")
    return str(folder)


def test_a_qlora_rounds_reference_is_its_quantized_start_so_the_first_loss_is_ln_2(
    tiny_policy, tmp_path
):
    from reasonrl.stages.preference import preference_train, reference_logps

    lora = {"r": 4, "alpha": 8, "target_modules": list(TARGETS), "quantize": "nf4"}
    train_section = {"epochs": 1, "batch_size": 2, "lr": 1e-3, "lora": lora}
    config = validate_config({"preference": {"train": train_section}})
    data = write_pairs(tmp_path / "labels", 4)
    model = str(tiny_policy)
    reference_logps(config, "mdpo", model, data, str(tmp_path / "ref.jsonl"))
    plain = validate_config({"preference": {"train": {**train_section, "lora": {"r": 4}}}})
    reference_logps(plain, "mdpo", model, data, str(tmp_path / "plain.jsonl"))
    quantized, unquantized = (
        [x for row in read_jsonl(tmp_path / name) for x in row["logps"]]
        for name in ("ref.jsonl", "plain.jsonl")
    )
    assert quantized != pytest.approx(unquantized, abs=1e-4), "the base really is quantized"
    metrics = preference_train(
        config, "mdpo", model, data, str(tmp_path / "ref.jsonl"), str(tmp_path / "round1")
    )
    # the policy's start is the quantized base (adapters at zero): it equals its reference
    assert metrics["history"][0]["loss"] == pytest.approx(math.log(2), abs=1e-5)


def _train_8bit(tiny_policy, folder, crash_at=None) -> dict:
    model, _ = load_policy(tiny_policy)
    batches = MicroBatches(_samples(30), 4, 0, seed=1, packing=True, block_size=64)

    def micro_batch(i):
        if i == crash_at:
            raise Crash
        return batches(i)

    settings = LoopSettings(
        max_steps=8, lr=1e-2, grad_accum=2, checkpoint_every=3, seed=5, optimizer="adamw8bit"
    )
    return train(model, micro_batch, masked_lm_loss, settings, CheckpointStore(folder, "a"))


def test_adamw8bit_keeps_8bit_moments_learns_and_resumes_exactly(
    tiny_policy, tmp_path, monkeypatch
):
    import bitsandbytes

    seen = []
    monkeypatch.setattr(
        bitsandbytes.optim.AdamW8bit, "step", _recording(bitsandbytes.optim.AdamW8bit.step, seen)
    )
    whole = _train_8bit(tiny_policy, tmp_path / "whole")
    # bitsandbytes keeps 32-bit states for tensors under 4096 entries: the embedding has more
    embedding = max(seen[-1].values(), key=lambda state: state["state1"].numel())
    assert embedding["state1"].numel() > 4096
    assert embedding["state1"].dtype == embedding["state2"].dtype == torch.uint8
    losses = [h["loss"] for h in whole["history"]]
    assert losses[-1] < losses[0]
    with pytest.raises(Crash):
        _train_8bit(tiny_policy, tmp_path / "cut", crash_at=2 * 7)  # checkpoint at step 6
    resumed = _train_8bit(tiny_policy, tmp_path / "cut")
    assert resumed["resumed_from"] == 6
    assert [h["loss"] for h in resumed["history"]] == pytest.approx(losses, abs=1e-6)


def _recording(step, seen: list):
    def recorded(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        seen.append(dict(self.state))
        return out

    return recorded


def test_a_quantized_base_without_adapters_is_one_line_naming_the_key():
    with pytest.raises(ReasonRLError) as error:
        LoraSettings.from_config(
            {"r": 0, "alpha": 16, "dropout": 0.0, "target_modules": ["q_proj"], "quantize": "nf4"},
            "ppo.lora",
        )
    assert str(error.value).startswith("config key 'ppo.lora.quantize' is nf4")
    assert "\n" not in str(error.value)


def test_without_bitsandbytes_qlora_and_adamw8bit_are_one_line_errors(tiny_policy, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # what an environment without it gives
    with pytest.raises(ReasonRLError, match=r"^config key 'sft.lora.quantize' is nf4: it needs bi"):
        QLORA.load_options("float32")
    model, _ = load_policy(tiny_policy)
    settings = LoopSettings(max_steps=1, lr=1e-3, optimizer="adamw8bit")
    with pytest.raises(ReasonRLError, match="optimizer adamw8bit needs bitsandbytes"):
        train(model, None, masked_lm_loss, settings, CheckpointStore(tiny_policy / "ck", "a"))


# ---- the planner's bytes against the measured ones -------------------------------------------


def test_the_planned_qlora_weights_are_the_bytes_the_quantized_tiny_policy_holds(tmp_path):
    from reasonrl.models import build_tiny_policy

    config = validate_config({})
    build_tiny_policy(["x = 12 + 30", "The answer is 42."] * 20, config["policy"]["tiny"], 0,
                      tmp_path / "tiny")  # fmt: skip
    model = load_policy(tmp_path / "tiny", **QLORA.load_options("float32"))[0]
    model = add_adapters(model, QLORA, 0)
    held = sum(p.nbytes for p in model.parameters())
    for name in _quantized_linears(model):
        state = model.get_submodule(name).weight.quant_state
        nested = state.state2
        held += sum(t.nbytes for t in (state.absmax, state.code, state.offset))
        held += nested.absmax.nbytes + nested.code.nbytes
    trained = mp.Trained("fp32", 1, 64, lora_rank=4, lora_targets=TARGETS, quantized=True)
    arch = mp.architecture({**config, "policy": {"base": str(tmp_path / "tiny")}})
    params, grads, optim = mp.model_state_bytes(arch, trained, 4, 0, 1)
    assert params == held
    adapters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert (grads, optim) == (adapters * 4, adapters * 8)


def test_the_planned_8bit_moments_are_the_states_bitsandbytes_keeps():
    import bitsandbytes
    from test_memory_plan import _batch, _tiny_model, masked_lm_loss_backward

    config = validate_config({})
    arch = mp.architecture(config)
    model = _tiny_model(config)
    masked_lm_loss_backward(model, _batch(arch.vocab, 2, 64))
    optimizer = bitsandbytes.optim.AdamW8bit(model.parameters(), lr=1e-3)
    optimizer.step()
    held = {  # by storage: the code books (qmap) are shared by every parameter's state
        s.data_ptr(): s.nbytes for state in optimizer.state.values() for s in state.values()
        if torch.is_tensor(s) and s.dim()
    }  # fmt: skip
    planned = mp.model_state_bytes(arch, mp.Trained("fp32", 2, 64, optimizer="adamw8bit"), 4, 0, 1)
    # the norms (under 4096 entries each) keep 32-bit states: 0.2 % of the whole here
    assert planned[2] == pytest.approx(sum(held.values()), rel=0.005)


def test_a_sections_optimizer_and_quantized_base_reach_the_plan():
    from test_memory_plan import GPU_RULES, REPO

    from reasonrl.config import load_workflow_config

    config = load_workflow_config([str(REPO / "config/gpu-mdpo-mistral-7b.yaml")])
    placements = {rule: mp.Placement(8, 0, True, True) for rule in GPU_RULES}
    before = {p.rule: p for p in mp.plan_config(config, placements)}
    config["sft"]["optimizer"] = "adamw8bit"
    config["preference"]["train"]["lora"] = {**config["preference"]["train"]["lora"], "r": 16}
    lora = {p.rule: p for p in mp.plan_config(config, placements)}
    config["preference"]["train"]["lora"]["quantize"] = "nf4"
    qlora = {p.rule: p for p in mp.plan_config(config, placements)}
    assert lora["sft"].optimizer == pytest.approx(before["sft"].optimizer * (4 + 2 + 1 / 32) / 12)
    # a 4-bit base: about a quarter of the bf16 weights (embeddings and head stay unquantized)
    assert 0.2 * lora["preference_train"].params < qlora["preference_train"].params
    assert qlora["preference_train"].params < 0.45 * lora["preference_train"].params


@pytest.fixture(scope="module")
def wide_policy(tmp_path_factory):
    """conftest's tiny policy, 64 wide: bitsandbytes' CPU kernel for one-token 4-bit matmuls
    (generation) needs linears at least one quantization block (64) wide."""
    from reasonrl.models import build_tiny_policy

    settings = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2,
                "num_heads": 2, "num_kv_heads": 2, "max_position_embeddings": 256}  # fmt: skip
    folder = tmp_path_factory.mktemp("wide-policy")
    build_tiny_policy(["x = 12 + 30\nprint(x)\n```output", "The answer is 42."] * 10, settings, 0,
                      folder)  # fmt: skip
    return folder


@pytest.mark.parametrize("improves", [True, False])
def test_qlora_ppo_trains_adapters_on_a_4bit_policy_and_an_unquantized_critic_trunk(
    wide_policy, tmp_path, trained_models, monkeypatch, no_reference_copy, improves
):
    """The KL reference is the 4-bit policy with its adapters off, so it equals the policy
    before any update; the separate critic's trunk is built from the dequantized weights;
    the folder is the unquantized start plus the merged deltas of the best iteration (the
    start itself when no iteration beats it: its adapters are put back)."""
    import reasonrl.ppo.run as ppo_run
    from reasonrl.stages.ppo import ppo as run_ppo

    tiny_policy = wide_policy
    problems, rm = _ppo_inputs(tiny_policy, tmp_path)
    scores = iter(range(100) if improves else [0] * 100)  # improving: the final one is kept
    monkeypatch.setattr(
        ppo_run.PPORun,
        "evaluate",
        lambda self, seed: {"heldout_pass": float(next(scores)), "heldout_reward": 0.0},
    )
    kls, experience = [], ppo_run.PPORun.experience

    def recorded(self, messages, scores):
        buffer = experience(self, messages, scores)
        kls.append(float(buffer["ref_kl"].abs().max()))
        return buffer

    monkeypatch.setattr(ppo_run.PPORun, "experience", recorded)
    config = ppo_config({"r": 4, "alpha": 8, "quantize": "nf4"}, optimizer="adamw8bit")
    out = tmp_path / "ppo-m"
    run_ppo(config, "m", str(tiny_policy), str(rm), str(problems), out)
    (started,) = trained_models
    model = started["model"]
    assert _quantized_linears(model.policy) and not _quantized_linears(model.critic_trunk)
    assert any(n.startswith("critic_trunk.") and "lora_" in n for n in started["trainable"])
    saved, start = load_policy(out)[0].state_dict(), load_policy(tiny_policy)[0].state_dict()
    if improves:
        _check_folder(saved, start)
    else:
        assert all(torch.equal(saved[k], start[k]) for k in start)
    assert len(kls) == 2 and kls[0] < 1e-4 < kls[1], kls
