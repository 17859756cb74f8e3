"""The memory planner (reasonrl.memory_plan, `reasonrl plan`, the dry run's check): hand-computed
figures, the tiny policy's measured bytes, the shipped recipes on 8 x 80 GB, and the one-line
failure of a recipe that cannot fit its profile's GPUs."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml

from reasonrl import memory_plan as mp
from reasonrl.config import load_workflow_config, validate_config
from reasonrl.errors import ReasonRLError

REPO = Path(__file__).resolve().parents[1]
GPU_RULES = (
    "sft",
    "evaluate",
    "sample_round",
    "reference_logps",
    "preference_train",
    "evaluate_selection",
    "sample_rm_data",
    "train_reward_model",
    "annotate_prm",
    "best_of_n",
    "hgs_search",
    "ppo_r2",
    "ppo",
    "online_dpo",
)
SPLIT_RULES = (
    "evaluate",
    "sample_round",
    "sample_rm_data",
    "annotate_prm",
    "best_of_n",
    "hgs_search",
)
PART_RULES = tuple(f"{rule}_part" for rule in SPLIT_RULES)
RECIPES = sorted(p.name for p in (REPO / "config").glob("gpu-*.yaml"))


def test_published_architectures_give_the_published_parameter_counts():
    # The counts on the model cards / safetensors indexes.
    assert mp.PUBLISHED["google/gemma-1.1-7b-it"].params() == 8_537_680_896
    assert mp.PUBLISHED["mistralai/Mistral-7B-v0.3"].params() == 7_248_023_552
    assert mp.PUBLISHED["peiyi9979/mistral-7b-sft"].params() == 7_241_732_096
    assert mp.PUBLISHED["deepseek-ai/deepseek-coder-6.7b-base"].params() == 6_740_512_768
    assert mp.PUBLISHED["realtreetune/rho-1b-sft-GSM8K"].params() == 1_100_048_384
    assert mp.PUBLISHED["smollm2"].params() == 134_515_008


def test_7b_full_fine_tune_zero3_on_8_gpus_matches_the_zero_papers_16_bytes():
    arch = mp.PUBLISHED["mistralai/Mistral-7B-v0.3"]
    n = 7_248_023_552
    trained = mp.Trained("bf16", sequences=1, length=4096)
    params, grads, optim = mp.model_state_bytes(arch, trained, 2, zero=3, n=8)
    assert (params, grads, optim) == (n * 2 / 8, n * 2 / 8, n * 12 / 8)
    # ZeRO-2 keeps the bf16 weights whole; one GPU keeps everything: 16 bytes per parameter.
    assert mp.model_state_bytes(arch, trained, 2, zero=2, n=8)[0] == n * 2
    assert sum(mp.model_state_bytes(arch, trained, 2, zero=0, n=1)) == 16 * n
    # Activations: 4096 tokens x (32 layers x per-layer bytes + head + token ids), by hand:
    # norms 2(4*4096 + 2*2*4096) = 65536, attention 2(3*32*128 + 2*8*128) = 28672,
    # MLP 4*2*14336 = 114688 -> 208896 per layer; head 4*4096 + 2*2*4096 + 4*32768 = 163840;
    # the bf16 logits beside their log-softmax, 2*32768 = 65536, at the peak.
    assert mp.saved_activation_bytes(arch, trained, 2) == 4096 * (32 * 208896 + 163840 + 8)
    assert mp.activation_bytes(arch, trained, 2) == 4096 * (32 * 208896 + 163840 + 8 + 65536)
    # With checkpointing: each layer keeps its bf16 input, one layer is recomputed at a time.
    ckpt = mp.Trained("bf16", 1, 4096, checkpointing=True)
    kept = 32 * 2 * 4096 + 163840 + 8
    assert mp.saved_activation_bytes(arch, ckpt, 2) == 4096 * kept
    assert mp.activation_bytes(arch, ckpt, 2) == 4096 * (kept + 65536 + 208896)


def test_lora_trains_only_the_adapters_and_8bit_adam_keeps_two_bytes_of_moments():
    arch = mp.PUBLISHED["mistralai/Mistral-7B-v0.3"]
    lora = mp.Trained("bf16", 1, 1024, lora_rank=16)
    # r * (in + out) per linear: q, k, v, o, gate, up, down.
    per_layer = 16 * ((4096 + 4096) + 2 * (4096 + 1024) + (4096 + 4096) + 3 * (4096 + 14336))
    adapters = 32 * per_layer
    params, grads, optim = mp.model_state_bytes(arch, lora, 2, zero=0, n=1)
    assert params == arch.params() * 2 + adapters * 2
    assert (grads, optim) == (adapters * 2, adapters * 12)
    eight_bit = mp.Trained("bf16", 1, 1024, optimizer="adamw8bit")
    # fp32 master weights, 1 byte per moment and an fp32 scale per block of 256 per moment
    assert mp.model_state_bytes(arch, eight_bit, 2, zero=0, n=1)[2] == arch.params() * (6 + 1 / 32)


def _tiny_model(config: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    t = config["policy"]["tiny"]
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=t["vocab_size"],
            hidden_size=t["hidden_size"],
            intermediate_size=t["intermediate_size"],
            num_hidden_layers=t["num_layers"],
            num_attention_heads=t["num_heads"],
            num_key_value_heads=t["num_kv_heads"],
            max_position_embeddings=t["max_position_embeddings"],
            tie_word_embeddings=True,
        )
    )


def _saved_bytes(model, batch: dict) -> int:
    """Bytes autograd saves for the backward pass of the SFT loss (distinct storages)."""
    from reasonrl.training.lm_loss import masked_lm_loss

    storages: dict[int, int] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss, _ = masked_lm_loss(model, batch)
    loss.backward()
    return sum(n for ptr, n in storages.items() if ptr not in params)


def _batch(vocab: int, seqs: int, length: int) -> dict:
    ids = torch.randint(0, vocab, (seqs, length))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": ids,
        "num_tokens": torch.tensor([length] * seqs),
    }


def test_tiny_policy_planned_model_states_are_the_tensors_after_an_optimizer_step():
    config = validate_config({})
    arch = mp.architecture(config)
    model = _tiny_model(config)
    assert arch.params() == sum(p.numel() for p in model.parameters())
    masked_lm_loss_backward(model, _batch(arch.vocab, 2, 64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    optimizer.step()
    held = (
        sum(p.nbytes for p in model.parameters()),
        sum(p.grad.nbytes for p in model.parameters()),
        sum(s.nbytes for state in optimizer.state.values() for s in state.values() if s.dim()),
    )
    # Exact: fp32 weights, gradients and AdamW's two moments.
    assert mp.model_state_bytes(arch, mp.Trained("fp32", 2, 64), 4, zero=0, n=1) == held


def masked_lm_loss_backward(model, batch: dict) -> None:
    from reasonrl.training.lm_loss import masked_lm_loss

    masked_lm_loss(model, batch)[0].backward()


# Measured on CPU (transformers' Llama with SDPA), planned / saved at 4 x 256 and 2 x 1024
# tokens: fp32 1.039 and 1.038, bf16 1.031 and 1.030, checkpointed 1.0015 and 0.9997.
@pytest.mark.parametrize(
    ("dtype", "checkpointing"),
    [(torch.float32, False), (torch.bfloat16, False), (torch.float32, True)],
)
def test_tiny_policy_planned_activations_are_the_tensors_autograd_saves(dtype, checkpointing):
    config = validate_config({})
    arch = mp.architecture(config)
    model = _tiny_model(config).to(dtype)
    if checkpointing:
        model.activation_checkpointing_enable()
    model.train()
    saved = _saved_bytes(model, _batch(arch.vocab, 4, 256))
    weight_bytes = 2 if dtype == torch.bfloat16 else 4
    trained = mp.Trained("fp32", 4, 256, checkpointing=checkpointing)
    planned = mp.saved_activation_bytes(arch, trained, weight_bytes)
    assert 0.99 <= planned / saved < 1.06, (planned, saved)


def _capacity_placements() -> dict[str, mp.Placement]:
    """Every GPU rule on 8 x 80 GB under ZeRO-3, its generator on its own GPU (the papers'
    nodes): the rules with the launcher (mp.LAUNCHED_RULES) spread over the 8, the others
    use one of them, as they run today. The online learner, which sends its whole policy to
    its generator (mp.WHOLE_POLICY_RULES), under ZeRO-2, the most it runs under, and PPO
    (ZeRO-3), each with its generator on a GPU of its own (resource generator_gpus: 1, as the
    recipes' --set-resources give them): PPO's learner over the other 7, the online learner
    over 4 (a 128-prompt step's 8 micro-batches share out over 4, not 7 or 3)."""
    placements = {
        rule: mp.Placement(8, 3, rule.removesuffix("_part") in mp.LAUNCHED_RULES, True)
        for rule in GPU_RULES + PART_RULES
    }
    own = {"generator_gpus": 1}
    placements["online_dpo"] = mp.placement("online_dpo", {**own, "gpu": 5, "deepspeed": "zero2"})
    placements["ppo"] = mp.placement("ppo", {**own, "gpu": 8, "deepspeed": "zero3"})
    return placements


# With gradient checkpointing (every recipe's training sections), Gemma's micro-batch of 2 pairs and
# the async online DPO learner's of 16 prompts (its 128-prompt steps accumulated over 8, 2 on each
# of 4 learner GPUs: 26 GiB, its vLLM generator on a fifth), every recipe fits, and every launch's
# batches share out over its GPUs. PF-PPO's PPO runs under ZeRO-3 over 7 of the 8 with its vLLM
# engine on the eighth: each learner GPU holds a shard of the bf16 policy and critic and of their
# optimizer states (29 GiB) and of its reference and RM (4 GiB: ppo_run's frozen_shards), the
# activations (21 GiB) and overhead: 55 GiB; the generator's GPU holds the policy (12.5 GiB) in
# vLLM's 85% reservation. (Its vLLM engine beside the learner on each GPU would leave 12 GiB:
# test_a_ppo_launch_it_cannot_run_fails_the_plan_with_one_line.)
@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_fits_on_eight_80gb_gpus(name):
    config = load_workflow_config([str(REPO / "config" / name)])
    placements = _capacity_placements()
    plans = mp.plan_config(config, placements)
    rules = {p.rule for p in plans}
    assert "evaluate" in rules and rules & {"sft", "online_dpo"}  # trains, then evaluates
    assert [p.rule for p in plans if not p.fits] == []
    # and each launch there runs: its batches share out over its GPUs
    mp.check_launches(config, placements, name)
    mp.check_global_batches(config, placements, name)


def test_the_online_learner_is_planned_per_micro_batch():
    """The learner holds one micro-batch's activations (online_dpo.micro_batch_prompts) and
    the reference's forward of REFERENCE_ROWS rows (the chunks it scores in), whatever the
    step's size; PPO's critic pass before the update is of one micro-batch."""
    from reasonrl.sequences import summed_logps, token_logps

    config = load_workflow_config([str(REPO / "config/gpu-async-dpo-rho-1b.yaml")])

    def learner(micro: int | None) -> mp.RulePlan:
        config["online_dpo"]["micro_batch_prompts"] = micro
        plans = mp.plan_config(config, _capacity_placements())
        return next(p for p in plans if p.rule == "online_dpo")

    whole, micro = learner(None), learner(32)  # 128 prompts: 256 sequences, and 64
    assert whole.activations == pytest.approx(4 * micro.activations)
    assert whole.other == micro.other and not whole.fits and micro.fits
    config["online_dpo"]["variants"].append({**config["online_dpo"]["variants"][0]})
    config["online_dpo"]["variants"][-1].update(name="ppo", loss="ppo")
    ppo = learner(32)  # 128 sequences of K = 4, in training and in the critic's pass
    assert ppo.activations == pytest.approx(2 * micro.activations) and ppo.other > micro.other
    config["online_dpo"]["variants"][-1].update(samples_per_prompt=8)  # its own K
    assert learner(32).activations == pytest.approx(2 * ppo.activations)
    assert learner(32).other > ppo.other  # the critic's pass of 256 sequences
    for scorer in (summed_logps, token_logps):
        assert inspect.signature(scorer).parameters["batch_size"].default == mp.REFERENCE_ROWS


def test_the_online_learner_is_its_section_typed_as_the_run_types_it():
    """online_learner reads the online_dpo section once: its micro-batch's prompts are the
    run's (OnlineDPOSettings.micro_batch_prompts, null resolved), the rest the section's."""
    from reasonrl.online_dpo.settings import OnlineDPOSettings

    config = load_workflow_config([str(REPO / "config/gpu-async-dpo-rho-1b.yaml")])
    section = config["online_dpo"]
    assert mp.online_learner({"online_dpo": {**section, "variants": []}}) is None
    for micro in (None, 32, 48):
        section["micro_batch_prompts"] = micro
        learner = mp.online_learner(config)
        variant = {**section, **section["variants"][0]}
        prompts = OnlineDPOSettings.from_section(variant, config["seed"]).micro_batch_prompts
        assert learner.micro_batches == -(-section["prompts_per_step"] // prompts)
        trained = learner.trained  # best and worst of K (the recipe's losses are DPO's)
        assert (trained.sequences, trained.length) == (2 * prompts, section["max_length"])
        assert learner.forward_tokens == section["reference_rows"] * section["max_length"]
        assert learner.reference_copies == int(section["lora"]["r"] == 0)
        assert learner.reward_model == (section["reward"] != "oracle")
    # the reference's forward of fewer rows at a time (a long-sequence, large-vocabulary recipe)
    assert section["reference_rows"] == mp.REFERENCE_ROWS
    section["reference_rows"] = 4
    assert mp.online_learner(config).forward_tokens == 4 * section["max_length"]


def test_the_ppo_learner_is_its_section_typed_as_the_run_counts_it():
    """ppo_learner reads the ppo section once: each variant's buffer rows are the run's
    (ppo.run.rows_per_iteration of its PPORunSettings), the rest the section's."""
    from reasonrl.ppo.run import find_variant, rows_per_iteration
    from reasonrl.ppo.settings import PPORunSettings

    config = load_workflow_config([str(REPO / "config/gpu-pfppo-deepseek-coder-6.7b.yaml")])
    section = config["ppo"]
    assert mp.ppo_learner({**config, "ppo": {**section, "variants": []}}) is None
    learner = mp.ppo_learner(config)
    settings = PPORunSettings.from_section(section, config["seed"])
    names = [v["name"] for v in section["variants"]]
    runs = [rows_per_iteration(find_variant(section, name), settings) for name in names]
    assert learner.buffers == tuple(zip(names, runs, strict=True))
    batches = (learner.batch_size, learner.global_batch_size, learner.grad_accum)
    assert batches == (section["batch_size"], section["global_batch_size"], section["grad_accum"])
    assert learner.reward_model == (section["reward"] != "oracle")
    assert learner.lora == (section["lora"]["r"] > 0)
    assert learner.reference_copies == int(not learner.lora)
    assert len(learner.trained) == 1 + (section["critic"] == "separate")
    shapes = {(t.sequences, t.length) for t in learner.trained}
    assert shapes == {(section["batch_size"], section["max_length"])}


def test_the_planner_sees_every_gpu_rule_of_the_profile():
    profile = yaml.safe_load((REPO / "profiles/slurm/config.yaml").read_text())
    gpu_rules = {r for r, res in profile["set-resources"].items() if res.get("gpu")}
    assert gpu_rules == set(GPU_RULES + PART_RULES)


def test_a_split_stages_part_jobs_are_planned_like_the_stage():
    config = load_workflow_config([str(REPO / "config/gpu-mdpo-mistral-7b.yaml")])
    config["split"] = {**config["split"], "evaluate": 4, "sample_round": 8}
    placements = {rule: mp.Placement(8, 3, True, True) for rule in GPU_RULES + PART_RULES}
    plans = {p.rule: p for p in mp.plan_config(config, placements)}
    assert {"evaluate_part", "sample_round_part"} <= set(plans)
    assert "best_of_n_part" not in plans  # not split: no part jobs
    for rule in ("evaluate", "sample_round"):
        assert plans[f"{rule}_part"].total == plans[rule].total


def test_a_local_folders_config_json_gives_the_architecture(tmp_path):
    hf = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 500,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    config = validate_config({"policy": {"base": str(tmp_path)}})
    assert mp.architecture(config) == mp.Architecture(
        64, 2, 4, 4, 128, 500, False, source=str(tmp_path / "config.json")
    )
    with pytest.raises(ReasonRLError, match="no architecture for 'someone/unknown-7b'"):
        mp.architecture(validate_config({"policy": {"base": "someone/unknown-7b"}}))


def test_the_reward_models_architecture_is_their_bases(tmp_path):
    """reward_models.base `policy` is the policy's architecture; any other base resolves as
    policy.base does: the published table, a local folder's config.json, else one line."""
    config = validate_config({})
    assert config["reward_models"]["base"] == "policy"
    assert mp.rm_architecture(config) == mp.architecture(config)
    config["reward_models"]["base"] = "smollm2"
    smollm2 = mp.rm_architecture(config)
    assert smollm2 == replace(mp.PUBLISHED["smollm2"], source="published config of smollm2")
    hf = {
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 500,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(hf))
    config["reward_models"]["base"] = str(tmp_path)
    assert mp.rm_architecture(config) == mp.from_hf_config(hf, str(tmp_path / "config.json"))
    config["reward_models"]["base"] = "someone/unknown-7b"
    error = r"^config key 'reward_models.base': no architecture for 'someone/unknown-7b' \("
    with pytest.raises(ReasonRLError, match=error):
        mp.rm_architecture(config)


def _plans_by_rm_base(config: dict, base: str) -> dict[str, mp.RulePlan]:
    config["reward_models"]["base"] = base
    return {p.rule: p for p in mp.plan_config(config, _capacity_placements())}


def test_reward_models_on_a_base_of_their_own_are_trained_and_score_with_its_architecture():
    """The PRM recipe's reward models on SmolLM2: train_reward_model's model states and
    activations are SmolLM2's, best-of-N's three frozen scorers (BT, ORM, PRM) are, and the
    rules of the policy alone (its SFT, sampling, annotation) are unchanged."""
    config = load_workflow_config([str(REPO / "config/gpu-prm-math-shepherd-mistral-7b.yaml")])
    policy, small = _plans_by_rm_base(config, "policy"), _plans_by_rm_base(config, "smollm2")
    smollm2, mistral = mp.PUBLISHED["smollm2"], mp.architecture(config)
    train = config["reward_models"]["train"]
    trained = mp.Trained(
        train["precision"],
        2 * train["batch_size"],
        train["max_length"],
        checkpointing=train["gradient_checkpointing"],
    )
    rm = small["train_reward_model"]
    assert (rm.zero, rm.gpus) == (3, 8)
    assert (rm.params, rm.grads, rm.optimizer) == mp.model_state_bytes(smollm2, trained, 2, 3, 8)
    assert rm.activations == mp.activation_bytes(smollm2, trained, 2)
    assert rm.params == smollm2.params() * 2 / 8 != policy["train_reward_model"].params
    for rule in ("best_of_n", "best_of_n_part"):
        change = 3 * (smollm2.params() - mistral.params()) * 2  # bfloat16
        assert small[rule].other - policy[rule].other == pytest.approx(change), rule
    for rule in ("sft", "evaluate", "sample_rm_data", "annotate_prm"):
        assert small[rule] == policy[rule], rule


@pytest.mark.parametrize(
    ("recipe", "rules"),
    [
        ("gpu-pfppo-deepseek-coder-6.7b.yaml", ("ppo_r2", "ppo")),
        ("gpu-async-dpo-rho-1b.yaml", ("online_dpo",)),
    ],
)
def test_the_ppo_and_online_bt_rm_is_frozen_with_the_reward_models_architecture(recipe, rules):
    """The BT-RM that rewards PPO (and scores its R2 samples) is one frozen model of
    reward_models.base, sharded under ZeRO-3 as the learner's other frozen models are; the
    online learner's is held whole by its generator process, on the generator's own GPU
    here; the policy's reference and critic keep the policy's architecture."""
    config = load_workflow_config([str(REPO / "config" / recipe)])
    config["online_dpo"]["reward"] = "rm"  # the online recipe's oracle: no RM to size
    policy, small = _plans_by_rm_base(config, "policy"), _plans_by_rm_base(config, "smollm2")
    change = (mp.PUBLISHED["smollm2"].params() - mp.architecture(config).params()) * 2
    for rule in rules:
        a, b = small[rule], policy[rule]
        if rule == "online_dpo":
            assert a.generator - b.generator == pytest.approx(change) and a.other == b.other
        else:
            shards = a.gpus if a.zero == 3 else 1
            assert a.other - b.other == pytest.approx(change / shards), rule
        assert a.params == b.params, rule  # the policy (and critic)


def test_the_online_reward_model_sits_on_the_generators_own_gpu_beside_vllm():
    """Online DPO's BT-RM lives in its generator process: with a GPU of its own the RM is
    counted there, outside vLLM's reservation, and no longer on the learner's GPUs; an RM
    larger than the rest of that GPU does not fit, while the learner still does."""
    config = load_workflow_config([str(REPO / "config/gpu-async-dpo-rho-1b.yaml")])
    config["online_dpo"]["reward"] = "rm"
    config["reward_models"]["base"] = "smollm2"
    own = mp.placement("online_dpo", {"gpu": 3, "generator_gpus": 1})
    alone = mp.placement("online_dpo", {"gpu": 2})
    plan = {name: _online_plan(config, place) for name, place in (("own", own), ("alone", alone))}
    rm = mp.PUBLISHED["smollm2"].params() * 2  # bfloat16
    reserved = own.gpu_bytes * config["generation"]["vllm"]["gpu_memory_utilization"]
    # vLLM holds its whole reservation, the RM the rest of the GPU
    assert (plan["own"].generator, plan["own"].generator_memory) == (reserved + rm, own.gpu_bytes)
    assert plan["own"].other == pytest.approx(plan["alone"].other - rm)
    assert plan["own"].fits
    config["reward_models"]["base"] = "Qwen/Qwen2.5-14B"  # 28 GiB
    config["generation"]["vllm"]["gpu_memory_utilization"] = 0.9  # 8 GiB of the GPU left
    big = _online_plan(config, own)
    assert big.total <= big.gpu_memory and not big.fits


def _online_plan(config: dict, place: mp.Placement) -> mp.RulePlan:
    [plan] = [p for p in mp.plan_config(config, {"online_dpo": place}) if p.rule == "online_dpo"]
    return plan


def test_launched_rules_are_the_rules_with_the_launcher():
    launched = set()
    for path in (REPO / "workflow/rules").glob("*.smk"):
        for block in re.split(r"\n(?=rule )", path.read_text()):
            match = re.match(r"rule (\w+):", block)
            if match and "launch=launcher" in block:
                launched.add(match.group(1))
    assert launched == mp.LAUNCHED_RULES


@pytest.fixture
def one_gpu_profile(tmp_path) -> Path:
    """A profile that gives every GPU rule one 80 GB GPU (no executor: runs where it is)."""
    profile = tmp_path / "profile"
    profile.mkdir()
    resources = {rule: {"gpu": 1} for rule in GPU_RULES}
    (profile / "config.yaml").write_text(yaml.safe_dump({"set-resources": resources}))
    return profile


def test_cli_prints_the_table_and_fails_a_recipe_that_cannot_fit_with_one_line(one_gpu_profile):
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(one_gpu_profile)]
    toy = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    assert toy.returncode == 0, toy.stderr
    assert toy.stdout.startswith("| rule | GPUs | launched | ZeRO | params |")
    assert "\n| sft | 1 | yes | 0 |" in toy.stdout
    big = subprocess.run(
        [*cli, "--configfile", "config/gpu-mdpo-mistral-7b.yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert big.returncode == 2
    (line,) = big.stderr.splitlines()
    assert line.startswith("reasonrl: error: config/gpu-mdpo-mistral-7b.yaml: rule sft needs "), (
        line
    )
    missing = subprocess.run([*cli[:2], "--profile", "no/such"], capture_output=True, text=True)
    assert (missing.returncode, missing.stderr) == (
        2,
        "reasonrl: error: no/such/config.yaml: profile not found\n",
    )


@pytest.mark.parametrize(("rule", "gpus", "error"), [
    ("sft", 8, None),  # 64 = 8 x 8
    ("preference_train", 8, None),  # 32 = 4 x 8 (Mistral's micro-batches of 4 pairs)
    ("sft", 3, "'sft.global_batch_size' (64) is not a multiple of batch_size x GPUs of rule "
               "sft (8 x 3)"),
    ("preference_train", 16, "'preference.train.global_batch_size' (32) is not a multiple "
                             "of batch_size x GPUs of rule preference_train (4 x 16)"),
])  # fmt: skip
def test_a_global_batch_the_jobs_gpus_do_not_divide_fails_the_plan(tmp_path, rule, gpus, error):
    profile = tmp_path / "profile"
    profile.mkdir()
    resources = {"set-resources": {rule: {"gpu": gpus}}}
    (profile / "config.yaml").write_text(yaml.safe_dump(resources))
    recipe = "config/gpu-mdpo-mistral-7b.yaml"
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(profile)]
    done = subprocess.run([*cli, "--configfile", recipe], cwd=REPO, capture_output=True, text=True)
    if error is None:
        assert (done.returncode, done.stderr) == (0, "")
    else:
        assert (done.returncode, done.stderr) == (2, f"reasonrl: error: {recipe}: {error}\n")


@pytest.mark.parametrize(("prompts", "error"), [
    (56, None),  # the recipe's: BR/BW 112 rows, PPO-S/M 280, steps of 56 rows
    (64, "ppo variant 's' trains 320 buffer rows an iteration, not a multiple of an optimizer"
         " step's 56 (ppo.batch_size 8 x 7 GPUs): an epoch would train rows twice; set"
         " ppo.prompts_per_iteration or ppo.global_batch_size"),
])  # fmt: skip
def test_a_ppo_buffer_of_part_steps_fails_the_plan(tmp_path, prompts, error):
    """PF-PPO's ppo over 7 learner GPUs (the recipe's --set-resources): 8 rows a GPU, a step
    of 56 rows; the recipe's old 64 prompts would wrap each epoch's last step round."""
    profile = tmp_path / "profile"
    profile.mkdir()
    ppo = {"gpu": 8, "deepspeed": "zero3", "generator_gpus": 1}
    (profile / "config.yaml").write_text(yaml.safe_dump({"set-resources": {"ppo": ppo}}))
    section = {"prompts_per_iteration": prompts, "global_batch_size": None}
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump({"ppo": section}))
    recipe = "config/gpu-pfppo-deepseek-coder-6.7b.yaml"
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(profile)]
    cli += ["--configfile", recipe, "--configfile", str(tmp_path / "ppo.yaml")]
    done = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    if error is None:
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
    else:
        source = f"{recipe} + {tmp_path / 'ppo.yaml'}"
        assert (done.returncode, done.stderr) == (2, f"reasonrl: error: {source}: {error}\n")


@pytest.mark.parametrize(("zero", "engine", "error"), [
    ("zero2", "hf", None),
    ("zero3", "hf", None),
    ("zero2", "vllm", "rule ppo over 8 GPUs samples with the hf engine, not"
                      " generation.engine vllm (one engine per job): give it resource"
                      " generator_gpus: 1"),
    ("zero3-own", "vllm", None),  # the engine on a GPU of its own, the learner over 7
])  # fmt: skip
def test_a_ppo_launch_it_cannot_run_fails_the_plan_with_one_line(tmp_path, zero, engine, error):
    profile = tmp_path / "profile"
    profile.mkdir()
    zero, own = zero.removesuffix("-own"), int(zero.endswith("-own"))
    ppo = {"gpu": 8, "deepspeed": zero, "generator_gpus": own}
    resources = {"set-resources": {"ppo": ppo}}
    (profile / "config.yaml").write_text(yaml.safe_dump(resources))
    # buffers of whole steps over the learner's GPUs: 8 rows a GPU, 8 prompts a GPU
    steps = {"prompts_per_iteration": 8 * (8 - own), "global_batch_size": None}
    engine_yaml = {"generation": {"engine": engine}, "ppo": steps}
    (tmp_path / "engine.yaml").write_text(yaml.safe_dump(engine_yaml))
    recipe = "config/gpu-pfppo-deepseek-coder-6.7b.yaml"
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(profile)]
    cli += ["--configfile", recipe, "--configfile", str(tmp_path / "engine.yaml")]
    done = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    if error is None:  # planned, launched over the learner's GPUs
        assert f"\n| ppo | {8 - own} | yes | {zero[-1]} |" in done.stdout, done.stdout
    else:
        source = f"{recipe} + {tmp_path / 'engine.yaml'}"
        assert (done.returncode, done.stderr) == (2, f"reasonrl: error: {source}: {error}\n")


@pytest.mark.parametrize(("gpus", "zero", "error"), [
    (8, "zero2", None),  # the recipe's 128-prompt steps: 8 micro-batches of 16, 1 per GPU
    (8, "zero3", "rule online_dpo cannot run under DeepSpeed ZeRO-3 (its generator is sent"
                 " the main process's whole policy): give it resource deepspeed: zero2"),
    (3, "zero2", "rule online_dpo over 3 GPUs: a step's 8 micro-batches"
                 " (online_dpo.prompts_per_step / micro_batch_prompts) do not share out over"
                 " them"),
])  # fmt: skip
def test_an_online_learner_launch_it_cannot_run_fails_the_plan(tmp_path, gpus, zero, error):
    profile = tmp_path / "profile"
    profile.mkdir()
    resources = {"set-resources": {"online_dpo": {"gpu": gpus, "deepspeed": zero}}}
    (profile / "config.yaml").write_text(yaml.safe_dump(resources))
    recipe = "config/gpu-async-dpo-rho-1b.yaml"
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(profile)]
    done = subprocess.run([*cli, "--configfile", recipe], cwd=REPO, capture_output=True, text=True)
    if error is None:
        assert f"\n| online_dpo | {gpus} | yes | 2 |" in done.stdout, done.stdout
    else:
        assert (done.returncode, done.stderr) == (2, f"reasonrl: error: {recipe}: {error}\n")


@pytest.mark.parametrize(("resources", "error"), [
    # the learner (~37 GiB) on its GPU, the vLLM generator on the job's other one
    ({"gpu": 2, "generator_gpus": 1}, None),
    # beside the generator's 85% reservation: 12 GiB left
    ({"gpu": 1}, "rule online_dpo needs 36.7 GiB per GPU on 1 GPU(s) (ZeRO-0), over the"
                 " 12.0 GiB it may use;"),
    ({"gpu": 1, "generator_gpus": 1}, "rule online_dpo: resource generator_gpus=1 (only"
                                      " online_dpo's and ppo's generator has a GPU of its"
                                      " own: 1, of a job of at least 2)"),
])  # fmt: skip
def test_an_online_generator_on_a_gpu_of_its_own_leaves_the_learner_its_gpus(
    tmp_path, resources, error
):
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text(
        yaml.safe_dump({"set-resources": {"online_dpo": resources}})
    )
    recipe = "config/gpu-async-dpo-rho-1b.yaml"
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(profile)]
    done = subprocess.run([*cli, "--configfile", recipe], cwd=REPO, capture_output=True, text=True)
    if error is None:
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert "\n| online_dpo | 1 | yes | 0 |" in done.stdout
    else:
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert error in done.stderr


def test_a_launch_check_skips_rules_the_config_does_not_run():
    """The PRM recipe runs no PPO or online variants: a profile giving every GPU rule 2
    GPUs (under ZeRO-3, with its vLLM engine) stops nothing."""
    config = load_workflow_config([str(REPO / "config/gpu-prm-math-shepherd-mistral-7b.yaml")])
    placements = {rule: mp.Placement(2, 3, True) for rule in ("ppo", "online_dpo")}
    mp.check_launches(config, placements, "F")
    config["ppo"]["variants"] = [{"name": "m", "filter": "ppo-m"}]
    with pytest.raises(ReasonRLError, match=r"^F: rule ppo over 2 GPUs samples with the hf"):
        mp.check_launches(config, placements, "F")


def test_ppo_under_zero3_shards_its_reference_and_rm_and_gathers_its_policy():
    """PPO's sharded policy and critic states, beside its reference and RM sharded alike
    (ppo_run's frozen_shards) and the policy gathered whole to sample with."""
    config = load_workflow_config([str(REPO / "config/gpu-pfppo-deepseek-coder-6.7b.yaml")])
    config["generation"]["engine"] = "hf"
    plans = {
        zero: next(p for p in mp.plan_config(config, {"ppo": mp.Placement(8, zero, True)})
                   if p.rule == "ppo")
        for zero in (2, 3)
    }  # fmt: skip
    policy = mp.architecture(config).params() * 2  # bfloat16
    assert plans[3].params == pytest.approx(2 * policy / 8)  # policy and critic, sharded
    # reference and RM: whole on each GPU under ZeRO-2, an eighth under ZeRO-3; beside them
    # the policy gathered to sample
    frozen = 2 * policy
    assert plans[3].other - plans[2].other == pytest.approx(frozen / 8 - frozen + policy)


def test_ppos_generator_on_a_gpu_of_its_own_is_planned_there():
    """resource generator_gpus: 1: PPO's learner holds neither the policy gathered to sample
    with (it sends its generator one parameter at a time) nor the engine, whose reservation
    no longer takes its GPU; the generator's GPU holds the policy and its KV cache: one
    sequence's within vLLM's reservation, or (HF engine) generation.batch_size 256 x 2048
    tokens, which overfill it."""
    config = load_workflow_config([str(REPO / "config/gpu-pfppo-deepseek-coder-6.7b.yaml")])
    arch = mp.architecture(config)
    policy, kv = arch.params() * 2, arch.kv_bytes_per_token(2)  # bfloat16

    def ppo(engine: str, own: bool) -> mp.RulePlan:
        config["generation"]["engine"] = engine
        place = mp.Placement(7, 3, True, own)
        return next(p for p in mp.plan_config(config, {"ppo": place}) if p.rule == "ppo")

    beside, own = ppo("vllm", False), ppo("vllm", True)
    assert own.other == pytest.approx(beside.other - policy)
    assert (beside.gpu_memory, own.gpu_memory) == (pytest.approx(0.15 * mp.GPU_BYTES), mp.GPU_BYTES)
    assert own.generator == pytest.approx(policy + 2048 * kv)
    assert own.generator_memory == pytest.approx(0.85 * mp.GPU_BYTES) and own.fits
    hf = ppo("hf", True)
    assert hf.other == pytest.approx(ppo("hf", False).other - policy - 256 * 2048 * kv)
    assert hf.generator == pytest.approx(policy + 256 * 2048 * kv + mp.OVERHEAD_BYTES)
    assert not hf.fits and mp.misfit_message(hf, "F").startswith(
        "F: rule ppo's generator needs 270.6 GiB on its own GPU, over the 80.0 GiB it may use"
    )


def test_generator_gpus_belong_to_the_online_learner_and_ppo_only():
    with pytest.raises(ReasonRLError, match=r"^rule sft: resource generator_gpus=1 \(only"):
        mp.placement("sft", {"gpu": 4, "generator_gpus": 1})


def test_a_ppo_global_batch_the_jobs_gpus_do_not_divide_fails_the_plan():
    config = load_workflow_config([str(REPO / "config/gpu-pfppo-deepseek-coder-6.7b.yaml")])
    assert config["ppo"]["global_batch_size"] == 56  # ppo.batch_size 8
    mp.check_global_batches(config, {"ppo": mp.Placement(7, 2, True)}, "F")
    error = r"^F: 'ppo.global_batch_size' \(56\) is not a multiple of batch_size x GPUs of rule"
    with pytest.raises(ReasonRLError, match=error + r" ppo \(8 x 2\)$"):
        mp.check_global_batches(config, {"ppo": mp.Placement(2, 2, True)}, "F")


def test_dry_run_fails_with_one_line_when_a_rule_cannot_fit(snakemake, one_gpu_profile):
    profile = ("--profile", str(one_gpu_profile))
    snakemake("-n", "-q", *profile)  # the tiny policy fits one GPU
    recipe = ("--configfile", "config/gpu-mdpo-mistral-7b.yaml")
    snakemake("-n", "-q", *recipe)  # no GPU asked: nothing to check
    result = snakemake("-n", "-q", *profile, *recipe, check=False)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "reasonrl: error:" in line]
    assert len(errors) == 1 and "rule sft needs" in errors[0], result.stderr
    assert "Building DAG" not in result.stdout + result.stderr


def test_the_dry_run_reads_a_command_lines_deepspeed_resource(snakemake):
    """--set-resources ppo:deepspeed=zero3 (the PF-PPO recipe's command) is a string
    Snakemake evaluates per job; the dry run's plan reads it so: PPO over 7 learner GPUs
    fits under ZeRO-3, not under ZeRO-2."""
    recipe = ("--configfile", "config/gpu-pfppo-deepseek-coder-6.7b.yaml", "--set-resources")
    own = ("ppo:gpu=8", "ppo:generator_gpus=1", "ppo:mem_mb=440000")
    snakemake("-n", "-q", "--nolock", *recipe, *own, "ppo:deepspeed=zero3")
    snakemake("-n", "-q", "--nolock", *recipe, *own, "ppo:deepspeed='zero3'")
    result = snakemake("-n", "-q", "--nolock", *recipe, *own, "ppo:deepspeed=zero2", check=False)
    assert result.returncode != 0 and "rule ppo needs 98.2 GiB" in result.stderr
    assert "on 7 GPU(s) (ZeRO-2)" in result.stderr


def test_a_sections_gradient_checkpointing_reaches_the_plan():
    config = load_workflow_config([str(REPO / "config/gpu-mdpo-mistral-7b.yaml")])
    placements = {rule: mp.Placement(8, 3, True, True) for rule in GPU_RULES}
    sections = (config["sft"], config["preference"]["train"])
    for section in sections:
        section["gradient_checkpointing"] = False
    before = {p.rule: p for p in mp.plan_config(config, placements)}
    for section in sections:
        section["gradient_checkpointing"] = True
    after = {p.rule: p for p in mp.plan_config(config, placements)}
    for rule in ("sft", "preference_train"):
        assert after[rule].activations < 0.25 * before[rule].activations, rule
        assert (after[rule].params, after[rule].optimizer) == (
            before[rule].params,
            before[rule].optimizer,
        )


def test_a_sections_lora_reaches_the_plan():
    """The plan reads the `lora` setting the sft and preference_train stages read: adapters'
    gradients and optimizer states only, fewer still with fewer target linears."""
    config = load_workflow_config([str(REPO / "config/gpu-mdpo-mistral-7b.yaml")])
    placements = {rule: mp.Placement(8, 3, True, True) for rule in GPU_RULES}
    sections = {"sft": config["sft"], "preference_train": config["preference"]["train"]}
    full = {p.rule: p for p in mp.plan_config(config, placements)}
    for section in sections.values():
        section["lora"] = {**section["lora"], "r": 16}
    lora = {p.rule: p for p in mp.plan_config(config, placements)}
    for section in sections.values():
        section["lora"] = {**section["lora"], "target_modules": ["q_proj", "v_proj"]}
    attention_only = {p.rule: p for p in mp.plan_config(config, placements)}
    arch = mp.architecture(config)
    for rule in sections:
        assert lora[rule].optimizer < 0.01 * full[rule].optimizer, rule
        assert lora[rule].grads < 0.01 * full[rule].grads, rule
        assert attention_only[rule].optimizer < lora[rule].optimizer, rule
        # 12 bytes per adapter parameter (bf16 mixed precision), r (in + out) per q and v.
        q_v = 16 * (2 * arch.hidden + arch.hidden + arch.kv_heads * arch.d) * arch.layers
        zero3 = 8 if attention_only[rule].zero == 3 else 1
        assert attention_only[rule].optimizer == pytest.approx(12 * q_v / zero3), rule


@pytest.mark.parametrize(
    ("recipe", "rules"),
    [
        ("gpu-pfppo-deepseek-coder-6.7b.yaml", {"train_reward_model", "ppo"}),
        ("gpu-async-dpo-rho-1b.yaml", {"online_dpo"}),
    ],
)
def test_the_rm_ppo_and_online_lora_reaches_the_plan(recipe, rules):
    """reward_models.train.lora, ppo.lora (the policy and a separate critic's trunk) and
    online_dpo.lora: adapters' gradients and optimizer states only, as the stages train; the
    PPO and online learners hold no frozen reference copy (the policy, adapters off)."""
    config = load_workflow_config([str(REPO / "config" / recipe)])
    placements = {rule: mp.Placement(8, 3, True, True) for rule in GPU_RULES}
    full = {p.rule: p for p in mp.plan_config(config, placements)}
    for section in (config["reward_models"]["train"], config["ppo"], config["online_dpo"]):
        section["lora"] = {**section["lora"], "r": 16}
    lora = {p.rule: p for p in mp.plan_config(config, placements)}
    assert rules <= full.keys()
    for rule in rules:  # r 16 adapters: 1.1% of the 1B policy's parameters, less of 6.7B's
        assert lora[rule].optimizer < 0.02 * full[rule].optimizer, rule
        assert lora[rule].grads < 0.02 * full[rule].grads, rule
    learner = full["ppo" if "ppo" in rules else "online_dpo"]
    # ZeRO-3 shards the learners' frozen models too (PPO's: ppo_run's frozen_shards)
    shards = learner.gpus if learner.zero == 3 else 1
    policy = mp.architecture(config).params() * 2  # one bfloat16 policy copy
    # PPO sends its own generator LoRA's merged weights one at a time, over the policy
    # gathered whole: that one copy (ppo_run's _policy_weights)
    sent = policy if learner.rule == "ppo" and learner.zero == 3 else 0
    assert learner.other - lora[learner.rule].other == pytest.approx(policy / shards - sent)


def test_the_plans_default_lora_targets_are_the_schemas():
    config = validate_config({})
    sections = (
        config["sft"],
        config["preference"]["train"],
        config["reward_models"]["train"],
        config["ppo"],
        config["online_dpo"],
    )
    for section in sections:
        assert tuple(section["lora"]["target_modules"]) == mp.LORA_TARGETS


def test_dry_run_fails_with_one_line_when_a_jobs_gpus_do_not_divide_its_global_batch(
    snakemake, tmp_path
):
    profile = tmp_path / "profile"
    profile.mkdir()
    (profile / "config.yaml").write_text(yaml.safe_dump({"set-resources": {"sft": {"gpu": 3}}}))
    recipe = ("--configfile", "config/gpu-mdpo-mistral-7b.yaml")
    result = snakemake("-n", "-q", "--profile", str(profile), *recipe, check=False)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "reasonrl: error:" in line]
    assert len(errors) == 1 and "'sft.global_batch_size' (64)" in errors[0], result.stderr
