"""The training rules launched over a job's GPUs (sft, preference_train, train_reward_model, ppo,
online_dpo): each CLI verb run over two CPU processes (gloo), data parallel, under the profiles'
DeepSpeed ZeRO-2 config or under a ZeRO-3 config that shards every parameter (the profile's
would shard none of the tiny policy's: "zero3-sharded"), trains as one process with twice the
gradient accumulation does: the same micro-batches per step, so the same losses, learning rates
and gradient norms step by step, and the same weights; with LoRA adapters too. Before, on a CPU
each process trained alone, the learning-rate schedule ran once per process per step, DeepSpeed
stepped at every micro-batch, and accelerate's DeepSpeed set-up stopped for want of a data
loader."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch
import yaml
from test_online_dpo import online_setup
from test_ppo_stage import problems, reward_model
from test_quantized_training import write_pairs
from test_rewards import rm_inputs

from reasonrl.config import validate_config
from reasonrl.io import write_jsonl
from reasonrl.models import load_policy
from reasonrl.stages.preference import reference_logps
from reasonrl.tasks import build_problems

# other modules' fixtures, used here
__all__ = ["online_setup", "problems", "reward_model", "rm_inputs"]

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
# Sums over processes (ZeRO's reduce-scatter) add in another order than one process does;
# AdamW's normalised steps at lr 1e-2 turn those 1e-7 gradient differences into up to 3e-5.
WEIGHT_ATOL = 1e-4


# How each training rule's command starts (workflow/rules/common.smk launcher()): one
# process; data parallel over two (DDP: torchrun, as accelerate launch starts a multi-GPU
# job); accelerate launch with the profiles' DeepSpeed configs (fp32 here: bf16 would not
# compare with the one-process run).
LAUNCHERS = {
    "one": [str(BIN / "reasonrl")],
    "ddp": [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", "-m", "reasonrl.cli"],
    **{
        zero: [
            str(BIN / "accelerate"),
            "launch",
            "--config_file",
            str(REPO / f"profiles/accelerate/deepspeed_{zero}.yaml"),
            "--num_processes",
            "2",
            "--mixed_precision",
            "no",
            "-m",
            "reasonrl.cli",
        ]  # fmt: skip
        for zero in ("zero2", "zero3")
    },
    # The profile's ZeRO-3 leaves DeepSpeed's stage3_param_persistence_threshold at 1e5
    # elements, under which a parameter stays whole on every process and is never gathered:
    # every parameter of the tiny policy. This one shards them all.
    "zero3-sharded": [
        str(BIN / "accelerate"),
        "launch",
        "--use_deepspeed",
        "--deepspeed_config_file",
        str(REPO / "tests/deepspeed_zero3_sharded.json"),
        "--zero3_init_flag",
        "true",
        "--num_processes",
        "2",
        "-m",
        "reasonrl.cli",
    ],  # fmt: skip
}


def _run(folder: Path, launcher: str, *args: str) -> dict:
    """`reasonrl ARGS` started by `launcher`; its metrics.json."""
    _launch(launcher, *args)
    return json.loads((folder / "metrics.json").read_text())


def _launch(launcher: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`reasonrl ARGS` started by `launcher`, which must succeed within `timeout` seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if launcher == "two-nodes":
        return _launch_two_nodes(args, env, timeout)
    if launcher == "ddp":
        env["ACCELERATE_USE_CPU"] = "true"  # DeepSpeed's launches find no GPU by themselves
    done = subprocess.run(
        [*LAUNCHERS[launcher], *args], capture_output=True, text=True, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


# Two "nodes" on this host: what srun starts on each node of a rule with resources nodes=2
# (workflow/rules/common.smk launcher(): reasonrl.training.launch once per node), here the
# two tasks' SLURM environment by hand, rendezvous over the loopback, one process per node,
# under the profiles' ZeRO-2 config (fp32: bf16 would not compare with one process).
TWO_NODES = {"SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_NNODES": "2", "SLURM_JOB_ID": "7"}


@functools.cache
def zero2_fp32_config() -> Path:
    """The profiles' ZeRO-2 accelerate config in fp32 (bf16 would not compare with one
    process), written once per session."""
    profile = yaml.safe_load((REPO / "profiles/accelerate/deepspeed_zero2.yaml").read_text())
    config = Path(tempfile.mkdtemp(prefix="reasonrl-zero2-")) / "zero2-fp32.yaml"
    config.write_text(yaml.safe_dump({**profile, "mixed_precision": "no"}))
    return config


def _launch_two_nodes(args: tuple, env: dict, timeout: int) -> subprocess.CompletedProcess:
    """Both nodes' launchers of `reasonrl ARGS`, which must succeed; the first node's result.
    Its manifest names both nodes (test_sft_over_two_processes_is_one_with_twice_the_...)."""
    from slurm_cluster import _free_port

    command = [sys.executable, "-m", "reasonrl.training.launch", "--processes-per-node", "1"]
    command += ["--config-file", str(zero2_fp32_config()), "-m", "reasonrl.cli", *args]
    rendezvous = {**TWO_NODES, "MASTER_PORT": str(_free_port())}
    nodes = [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, **rendezvous, "SLURM_NODEID": str(rank)},
        )  # fmt: skip
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=timeout) for node in nodes]
    for node, (_, stderr) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, stderr[-3000:]
    assert "node 1 of 2 (('localhost', 'localhost'))" in outputs[1][1]
    return subprocess.CompletedProcess(command, 0, *outputs[0])


def _same_training(one: dict, two: dict) -> None:
    assert one["steps"] == two["steps"] > 1
    for key in ("loss", "lr", "grad_norm"):
        want = [h[key] for h in one["history"]]
        assert [h[key] for h in two["history"]] == pytest.approx(want, rel=1e-4, abs=1e-6), key
    assert one["history"][-1]["loss"] < one["history"][0]["loss"], "it learned something"


def _same_weights(one: Path, two: Path, start: Path | None = None) -> None:
    """The policies saved in `one` and `two` are the same, and moved from `start`'s if given."""
    want, got = load_policy(one)[0].state_dict(), load_policy(two)[0].state_dict()
    assert got.keys() == want.keys()
    for key in want:
        torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=WEIGHT_ATOL, msg=key)
    if start is not None:
        before = load_policy(start)[0].state_dict()
        assert any(not torch.equal(want[k], before[k]) for k in want)


@pytest.fixture(scope="module")
def pairs(tiny_policy, tmp_path_factory) -> Path:
    """16 M-DPO pairs with the tiny policy's cached reference log-probs."""
    folder = tmp_path_factory.mktemp("pairs")
    write_pairs(folder / "labels", 16)
    reference_logps(
        validate_config({}), "mdpo", str(tiny_policy), str(folder / "labels"),
        str(folder / "ref.jsonl"),
    )  # fmt: skip
    return folder


@pytest.mark.parametrize("lora", [0, 4])
def test_a_preference_round_over_two_processes_is_one_with_twice_the_accumulation(
    tiny_policy, pairs, tmp_path, lora
):
    def config(grad_accum: int) -> str:
        # With LoRA, one config for every launcher: a global batch of 4 pairs is 2
        # micro-batches of 2 on one process, 1 on each of two.
        batch = {"global_batch_size": 4} if lora else {"grad_accum": grad_accum}
        train = {"epochs": 2, "batch_size": 2, **batch, "lr": 1e-2, "log_every": 1,
                 "lora": {"r": lora, "alpha": 8}}  # fmt: skip
        return json.dumps({"preference": {"train": train}})

    runs = {}
    # two nodes once: full fine-tuning (LoRA adds nothing a node boundary could break)
    nodes = () if lora else (("two-nodes", 1),)
    for launcher, grad_accum in (("one", 2), ("ddp", 1), ("zero3-sharded", 1), *nodes):
        out = tmp_path / launcher
        args = ["preference-train", "--config-json", config(grad_accum), "--variant", "mdpo"]
        args += ["--model", str(tiny_policy), "--data", str(pairs / "labels")]
        args += ["--reference", str(pairs / "ref.jsonl"), "--out", str(out)]
        runs[launcher] = _run(out, launcher, *args)
    # 2 epochs of 16 pairs at 2 per micro-batch, 2 micro-batches per step (either way)
    assert runs["one"]["steps"] == 8
    for launcher in set(runs) - {"one"}:
        _same_training(runs["one"], runs[launcher])
        _same_weights(tmp_path / "one", tmp_path / launcher, tiny_policy)


def test_reward_model_training_over_two_processes_is_one_with_twice_the_accumulation(
    tiny_policy, rm_inputs, tmp_path
):
    from reasonrl.rewards.models import load_reward_model

    runs = {}
    for launcher, grad_accum in (("one", 4), ("ddp", 2), ("zero3-sharded", 2), ("two-nodes", 2)):
        train = {"max_steps": 4, "batch_size": 2, "grad_accum": grad_accum, "lr": 1e-2,
                 "log_every": 1}  # fmt: skip
        out = tmp_path / launcher
        args = [
            "train-reward-model",
            "--config-json",
            json.dumps({"reward_models": {"train": train}}),
        ]
        args += ["--kind", "bt", "--model", str(tiny_policy)]
        args += ["--problems", str(rm_inputs / "problems.jsonl")]
        args += ["--data", str(rm_inputs / "samples.jsonl"), "--out", str(out)]
        runs[launcher] = _run(out, launcher, *args)
    want = load_reward_model(tmp_path / "one")[0].state_dict()
    for launcher in ("ddp", "zero3-sharded", "two-nodes"):
        _same_training(runs["one"], runs[launcher])
        assert runs[launcher]["heldout"] == pytest.approx(runs["one"]["heldout"])
        got = load_reward_model(tmp_path / launcher)[0].state_dict()
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=WEIGHT_ATOL, msg=key)


def sft_inputs(folder: Path) -> tuple[Path, Path]:
    """16 arith problems (folder/train.jsonl) and a tiny policy (folder/policy) whose
    tokenizer is their own text, so that a solution fits the context."""
    from reasonrl.models import build_tiny_policy
    from reasonrl.stages.models import corpus_texts

    problems, _ = build_problems("arith", {"kind": "arith", "train_size": 16, "test_size": 1}, 0)
    write_jsonl(folder / "train.jsonl", problems, schema="problem")
    settings = {"vocab_size": 400, "hidden_size": 32, "intermediate_size": 64, "num_layers": 2,
                "num_heads": 2, "num_kv_heads": 2, "max_position_embeddings": 1024}  # fmt: skip
    build_tiny_policy(corpus_texts([str(folder / "train.jsonl")]), settings, 0, folder / "policy")
    return folder / "policy", folder / "train.jsonl"


def test_sft_over_two_processes_is_one_with_twice_the_accumulation(tmp_path):
    tiny_policy, _ = sft_inputs(tmp_path)
    runs = {}
    # One config for one process and two: a global batch of 4 makes 2 micro-batches of 2 per
    # step on one process, 1 on each of two. "whole": each step's 4 solutions in one
    # micro-batch (not regrouped by length), whose loss is the token mean over all four:
    # accumulation weighs micro-batches by their target tokens.
    for name, launcher in (
        ("one", "one"), ("ddp", "ddp"), ("zero2", "zero2"), ("two-nodes", "two-nodes"),
        ("whole", "one"),
    ):  # fmt: skip
        batch = {"batch_size": 4, "grad_accum": 1} if name == "whole" else {
            "batch_size": 2, "global_batch_size": 4}  # fmt: skip
        sft = {"max_steps": 4, **batch, "lr": 1e-2, "max_length": 1024, "log_every": 1,
               "group_by_length": False}  # fmt: skip
        out = tmp_path / name
        args = ["sft", "--config-json", json.dumps({"sft": sft}), "--style", "tool"]
        args += ["--model", str(tiny_policy), "--train", str(tmp_path / "train.jsonl")]
        runs[name] = _run(out, launcher, *args, "--out", str(out))
    for name in ("ddp", "zero2", "two-nodes", "whole"):
        _same_training(runs["one"], runs[name])
        _same_weights(tmp_path / "one", tmp_path / name, tiny_policy)
    # the main process of the first node writes, and its manifest names every node
    scheduler = json.loads((tmp_path / "two-nodes" / "manifest.json").read_text())["scheduler"]
    assert scheduler["nodes"] == ["localhost", "localhost"]
    assert (scheduler["processes_per_node"], scheduler["world_size"]) == (1, 2)


def test_reference_logps_over_two_processes_are_the_one_process_rows(tiny_policy, pairs, tmp_path):
    """Each process scores its part of the rows; the main one writes all, in order."""
    config = json.dumps({"preference": {"train": {"max_length": 256}}})
    rows = {}
    for launcher in ("one", "ddp", "zero3-sharded"):
        out = tmp_path / launcher / "reference.jsonl"
        args = ["reference-logps", "--config-json", config, "--variant", "mdpo"]
        args += ["--model", str(tiny_policy), "--data", str(pairs / "labels"), "--out", str(out)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
        if launcher != "ddp":
            env.pop("ACCELERATE_USE_CPU")
        done = subprocess.run(
            [*LAUNCHERS[launcher], *args], capture_output=True, text=True, env=env, timeout=600
        )
        assert done.returncode == 0, done.stderr[-3000:]
        # 16 pairs: 32 sequences, 16 scored by each of two processes
        share = 32 if launcher == "one" else 16
        assert done.stderr.count(f"reference log-probs of {share} of the 32 sequences") == (
            1 if launcher == "one" else 2
        )
        rows[launcher] = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows["one"]) == 16
    for launcher in ("ddp", "zero3-sharded"):
        assert [r["index"] for r in rows[launcher]] == [r["index"] for r in rows["one"]]
        for got, want in zip(rows[launcher], rows["one"], strict=True):
            assert got["logps"] == pytest.approx(want["logps"], rel=1e-5)


def test_prm_accumulation_weighs_solutions_by_their_step_labels(tiny_policy, rm_inputs, tmp_path):
    """PRM solutions of 1 to 4 steps hold 1 to 4 label tokens: a step accumulated over
    micro-batches of one solution trains as the two in one micro-batch do."""
    from reasonrl.io import read_jsonl

    rows = read_jsonl(rm_inputs / "prm.jsonl")[:8]
    for i, row in enumerate(rows):
        row["steps"] = [f"Step {n} of {i}." for n in range(1 + i % 4)]
        row["labels"] = ["+" if (n + i) % 3 else "-" for n in range(1 + i % 4)]
        row["soft_labels"] = [float(label == "+") for label in row["labels"]]
    write_jsonl(tmp_path / "prm.jsonl", rows, schema="prm_steps")
    runs = {}
    for name, batch_size, grad_accum in (("whole", 2, 1), ("accumulated", 1, 2)):
        train = {"max_steps": 4, "batch_size": batch_size, "grad_accum": grad_accum,
                 "lr": 1e-2, "log_every": 1}  # fmt: skip
        config = {"reward_models": {"train": train, "heldout_fraction": 0}}
        args = ["train-reward-model", "--config-json", json.dumps(config), "--kind", "prm"]
        args += ["--model", str(tiny_policy), "--problems", str(rm_inputs / "problems.jsonl")]
        args += ["--data", str(tmp_path / "prm.jsonl"), "--out", str(tmp_path / name)]
        runs[name] = _run(tmp_path / name, "one", *args)
    _same_training(runs["whole"], runs["accumulated"])


def test_raft_accumulation_weighs_winners_by_their_tokens(tiny_policy, tmp_path):
    """RAFT's winners of 1 to 8 sentences: a step accumulated over micro-batches of 2 trains
    as its 4 winners in one micro-batch do (the loss is a mean over their tokens)."""
    from reasonrl.stages.preference import preference_train

    def winner(i: int) -> dict:
        text = " ".join(["x = 12 + 30."] * (1 + i % 8)) + " The answer is 42."
        messages = [{"role": "user", "content": "What is 12 + 30?"},
                    {"role": "assistant", "content": text}]  # fmt: skip
        return {"problem_id": f"p{i}", "task": "arith", "messages": messages, "desirable": True}

    write_jsonl(tmp_path / "labels" / "winners.jsonl", [winner(i) for i in range(16)],
                schema="preference_unpaired")  # fmt: skip
    runs = {}
    for name, batch in (
        ("whole", {"batch_size": 4}),
        ("accumulated", {"batch_size": 2, "grad_accum": 2}),
    ):
        train = {"epochs": 1, **batch, "lr": 1e-2, "log_every": 1, "max_length": 256}
        variants = [{"name": "raft", "loss": "raft"}]
        config = validate_config({"preference": {"train": train, "variants": variants}})
        runs[name] = preference_train(
            config, "raft", str(tiny_policy), str(tmp_path / "labels"), None,
            str(tmp_path / name),
        )  # fmt: skip
    _same_training(runs["whole"], runs["accumulated"])


# The PPO run both two-process PPO tests compare with: 2 iterations of 4 prompts x 2
# responses, near-greedy sampling (temperature 1e-3; the schema wants it above 0). Seed 3:
# with one held-out prompt, a run whose last loss is below its first (seed 0's is not:
# _same_training checks that the run learned something).
PPO_CONFIG = json.dumps({
    "seed": 3,
    "ppo": {"iterations": 2, "prompts_per_iteration": 4, "responses_per_prompt": 2,
            "heldout_prompts": 1, "ppo_epochs": 1, "batch_size": 2, "global_batch_size": 4,
            "temperature": 1e-3, "policy_lr": 1e-3, "critic_lr": 1e-3, "max_length": 256,
            "variants": [{"name": "br", "filter": "br"}]},
    "rollout": {"max_turns": 1, "max_turn_tokens": 12, "max_total_tokens": 12},
    "generation": {"batch_size": 64},
})  # fmt: skip


def _ppo_args(config: str, policy: Path, reward_model: Path, problems: Path, out: Path) -> list:
    """`reasonrl ppo` of variant br of `config` from `policy`, rewarded by `reward_model`."""
    args = ["ppo", "--config-json", config, "--variant", "br", "--model", str(policy)]
    args += ["--reward-model", str(reward_model), "--problems", str(problems)]
    return [*args, "--out", str(out)]


@pytest.fixture(scope="module")
def ppo_one_process(tiny_policy, reward_model, problems, tmp_path_factory) -> tuple[Path, str]:
    """PPO_CONFIG's run in one process, sampling in-process: its folder and its log."""
    out = tmp_path_factory.mktemp("ppo-one-process")
    log = _launch("one", *_ppo_args(PPO_CONFIG, tiny_policy, reward_model, problems, out)).stderr
    return out, log


def _metrics(folder: Path) -> dict:
    return json.loads((folder / "metrics.json").read_text())


def test_ppo_over_two_processes_is_one_with_twice_the_accumulation(
    ppo_one_process, tiny_policy, reward_model, problems, tmp_path
):
    """Each process samples, scores and computes the buffer of its share of the prompts; the
    gathered buffer is the one process's, so the steps (greedy sampling: no seed to differ)
    and the compute counts are too. Sampling is near greedy (temperature 1e-3; the schema
    wants it above 0): a process samples with its own seed, so at T = 1 its rows would not be
    the one process's. Under ZeRO-3 (every parameter sharded: zero3-sharded) the processes
    sample with the policy gathered whole, one held-out prompt on one process while the
    other samples none (in lockstep, or with the per-layer gathers on, they would wait on
    each other), the frozen reference and reward model are sharded too (so the one process
    that scores the held-out prompt has the other run an idle reward-model forward beside
    its forward), and the best iteration (one before the last) is saved from gathered shards
    and restored into them: the final weights are its."""
    one_folder = ppo_one_process[0]
    one = _metrics(one_folder)
    for launcher in ("ddp", "zero2", "zero3-sharded", "two-nodes"):
        out = tmp_path / launcher
        log = _launch(launcher, *_ppo_args(PPO_CONFIG, tiny_policy, reward_model, problems, out))
        assert log.stderr.count(SHARDED_FROZEN) == (2 if launcher == "zero3-sharded" else 0)
        run = _metrics(out)
        _same_training(one, run)
        for key in ("compute", "best_iteration", "best_heldout", "final_heldout"):
            assert run[key] == pytest.approx(one[key]), key
        _same_weights(one_folder, out)
    # 4 prompts x 2 responses, best and a random one kept per prompt: 8 rows per iteration
    # nominally, 4 per step (2 micro-batches of 2 on one process, 1 on each of two)
    assert one["steps_per_iteration"] == 2
    assert one["compute"]["policy_passes"] == 8  # every kept row, once per epoch
    assert one["best_iteration"] < json.loads(PPO_CONFIG)["ppo"]["iterations"]  # restored


SHARDED_FROZEN = "the frozen reference and reward model are sharded under ZeRO-3"


def test_ppo_under_zero3_scores_uneven_shares_with_its_sharded_reward_model(
    tiny_policy, reward_model, problems, tmp_path
):
    """ZeRO-3 shards PPO's reward model, so each of its forwards is a collective. 3 prompts x
    12 samples share out as 24 and 12 rows, 2 and 1 reward-model forwards of 16 rows (the
    held-out prompt: 1 and 0): the process with fewer runs idle forwards up to the other's,
    else the two wait on each other (the run would not end within the timeout). The run's
    scores, counts and weights are the one process's."""
    ppo = {"iterations": 1, "prompts_per_iteration": 3, "responses_per_prompt": 12,
           "heldout_prompts": 1, "ppo_epochs": 2, "batch_size": 3, "global_batch_size": 6,
           "temperature": 1e-3, "max_length": 256,
           "variants": [{"name": "br", "filter": "br"}]}  # fmt: skip
    rollout = {"max_turns": 1, "max_turn_tokens": 8, "max_total_tokens": 8}
    config = json.dumps({"ppo": ppo, "rollout": rollout, "generation": {"batch_size": 64}})
    runs = {}
    for launcher in ("one", "zero3-sharded"):
        out = tmp_path / launcher
        args = _ppo_args(config, tiny_policy, reward_model, problems, out)
        log = _launch(launcher, *args, timeout=300).stderr
        assert log.count(SHARDED_FROZEN) == (2 if launcher != "one" else 0)
        runs[launcher] = _metrics(out)
    one, two = runs["one"], runs["zero3-sharded"]
    assert one["compute"]["rm_passes"] == 36
    for key in ("compute", "best_heldout", "final_heldout"):
        assert two[key] == pytest.approx(one[key]), key
    assert [h["loss"] for h in two["history"]] == pytest.approx(
        [h["loss"] for h in one["history"]], rel=1e-4, abs=1e-6
    )
    _same_weights(tmp_path / "one", tmp_path / "zero3-sharded")


def test_ppo_with_a_generator_of_its_own_samples_as_one_process_in_process(
    ppo_one_process, tiny_policy, reward_model, problems, tmp_path
):
    """--generator-gpus 1: the main process's rollout server (the HF engine in a process of
    its own) samples every prompt with the weights it is sent after each update (under
    ZeRO-3 gathered one parameter at a time) and every process scores its share of the
    rollouts: one process or two, the run is one process's sampling in-process."""
    own_generator = "ppo samples with a generator process of its own"
    in_process_folder, in_process_log = ppo_one_process
    assert own_generator not in in_process_log
    in_process = _metrics(in_process_folder)
    for launcher in ("one", "zero3-sharded"):
        out = tmp_path / launcher
        args = _ppo_args(PPO_CONFIG, tiny_policy, reward_model, problems, out)
        log = _launch(launcher, *args, "--generator-gpus", "1", timeout=300).stderr
        assert log.count(own_generator) == 1
        run = _metrics(out)
        _same_training(in_process, run)
        for key in ("compute", "best_iteration", "best_heldout", "final_heldout"):
            assert run[key] == pytest.approx(in_process[key]), key
        _same_weights(in_process_folder, out)


def test_a_whole_policy_rule_under_zero3_stops_with_one_line(tiny_policy, problems, tmp_path):
    """ZeRO-3 shards the weights the online learner sends its generator: the stage refuses
    it before anything is loaded (the plan refuses it before submission: test_memory_plan).
    PPO runs under it (test_ppo_over_two_processes_is_one_with_twice_the_accumulation)."""
    rule = "online_dpo"
    config = json.dumps({"online_dpo": {"variants": [{"name": "m"}]}})
    args = ["online-dpo", "--config-json", config, "--variant", "m"]
    args += ["--model", str(tiny_policy), "--train", str(problems)]
    why = "its generator is sent the main process's whole policy"
    args += ["--out", str(tmp_path / "m")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [*LAUNCHERS["zero3"], *args], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode != 0
    # each process's line (a progress bar may precede it: tqdm ends no line)
    errors = set(re.findall(r"reasonrl: error: .*", done.stderr))
    assert errors == {
        f"reasonrl: error: {rule} cannot run under DeepSpeed ZeRO-3 ({why}): give rule {rule}"
        " resource deepspeed: zero2"
    }, done.stderr[-3000:]
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("loss", ["dpo", "ppo"])
def test_the_online_learner_over_two_processes_is_one_with_twice_the_accumulation(
    online_setup, tmp_path, loss
):
    """The main process runs the generator and broadcasts its rounds; each process trains on
    its share of a step's micro-batches (2 of 1 prompt each: 1 per process, 2 accumulated on
    one), so the steps, their metrics and the weights are one process's."""
    config, folder = online_setup
    variant = {"name": "run", "mode": "async", "off_policy": 2, "loss": loss}
    online = {**config["online_dpo"], "micro_batch_prompts": 1, "variants": [variant]}
    settings = json.dumps({**config, "online_dpo": online})
    runs = {}
    # two nodes once: the DPO loss (its micro-batches without a pair are what broke)
    launchers = ("one", "ddp", "two-nodes") if loss == "dpo" else ("one", "ddp")
    for launcher in launchers:
        out = tmp_path / launcher
        args = ["online-dpo", "--config-json", settings, "--variant", "run"]
        args += ["--model", str(folder / "policy"), "--train", str(folder / "train.jsonl")]
        runs[launcher] = _run(out, launcher, *args, "--out", str(out))
    one = runs["one"]
    timing = {k for k in one["history"][0] if "second" in k or k == "elapsed"}
    want = load_policy(tmp_path / "one")[0].state_dict()
    for launcher in launchers[1:]:
        two = runs[launcher]
        assert one["steps"] == two["steps"] == 4 and one["prompts"] == two["prompts"]
        # Each process scores its share of a step's samples with the reference, padded with
        # other rows than one process pads them with: summed log-probs of tens of nats then
        # differ by fp32 rounding (~1e-6), and so do the KL estimates made from them.
        for mine, theirs in zip(two["history"], one["history"], strict=True):
            for key in theirs.keys() - timing:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-5), key
        got = load_policy(tmp_path / launcher)[0].state_dict()
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-4, atol=WEIGHT_ATOL, msg=key)
    assert not list(tmp_path.glob(".*.rounds")), "the rounds folder is left behind"
