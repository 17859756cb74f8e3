"""Training rules over several nodes (issue 49): a rule whose resources ask for `nodes: N` runs
srun with one task per node, each of which reads the rendezvous from SLURM's environment and
launches its node's processes (reasonrl.training.launch); the memory plan shards over every
node's GPUs; the multi-node PF-PPO recipe plans over two nodes and not over one; the SLURM
profile's dry run gives the sbatch and srun lines; an SFT job runs over two SLURM nodes (two
slurmd on this host) and trains as one process. That two launchers on this host train as one
process does, for every training rule, is test_data_parallel_stages.py's "two-nodes" launcher.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_data_parallel_stages import sft_inputs, zero2_fp32_config

import reasonrl.memory_plan as mp
from reasonrl.config import load_workflow_config
from reasonrl.errors import ReasonRLError
from reasonrl.training.launch import (
    Rendezvous,
    accelerate_command,
    command_prefix,
    expand_nodelist,
    rendezvous_from_slurm,
)

REPO = Path(__file__).resolve().parents[1]
BASE_RECIPE = "config/gpu-pfppo-deepseek-coder-6.7b.yaml"
RECIPE = "config/multi-node-pfppo-qwen2.5-14b.yaml"
ZERO3 = REPO / "profiles/accelerate/deepspeed_zero3.yaml"
SLURM_TASK = {"SLURM_JOB_NODELIST": "gpu1,gpu2", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
              "SLURM_JOB_ID": "12345"}  # fmt: skip


def test_a_node_finds_its_rank_and_the_main_node_in_slurms_environment():
    assert rendezvous_from_slurm(SLURM_TASK) == Rendezvous(("gpu1", "gpu2"), 1, "gpu1", 22345)
    # MASTER_ADDR and MASTER_PORT, where set, win (as torchrun's)
    fixed = {**SLURM_TASK, "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    assert rendezvous_from_slurm(fixed) == Rendezvous(("gpu1", "gpu2"), 1, "10.0.0.1", 29500)
    assert expand_nodelist("a,b,c") == ["a", "b", "c"]


@pytest.mark.parametrize(("change", "error"), [
    ({"SLURM_NODEID": None}, "SLURM_NODEID=None: a multi-node launch runs as one srun task per"
                             " node of a SLURM job (resource nodes), which sets it"),
    ({"SLURM_NNODES": "3"}, "SLURM_JOB_NODELIST='gpu1,gpu2' names 2 nodes, SLURM_NNODES=3"),
])  # fmt: skip
def test_a_launch_outside_a_slurm_task_stops_with_one_line(change, error):
    env = {k: v for k, v in {**SLURM_TASK, **change}.items() if v is not None}
    with pytest.raises(ReasonRLError) as caught:
        rendezvous_from_slurm(env)
    assert str(caught.value) == error


def test_each_node_launches_its_share_of_the_world():
    command = accelerate_command(
        Rendezvous(("gpu1", "gpu2"), 1, "gpu1", 22345), 7, "z.yaml", ["-m", "reasonrl.cli", "sft"]
    )
    line = " ".join(command)
    assert "-m accelerate.commands.launch --config_file z.yaml --num_machines 2" in line
    assert "--machine_rank 1 --main_process_ip gpu1 --main_process_port 22345" in line
    # 2 nodes x 7: accelerate starts num_processes / num_machines on each; no pdsh or ssh
    assert line.endswith("--num_processes 14 --deepspeed_multinode_launcher standard"
                         " -m reasonrl.cli sft")  # fmt: skip


@pytest.mark.parametrize(("nodes", "gpus", "own", "mpi", "want"), [
    (1, 0, 0, False, "reasonrl"),
    (1, 1, 0, False, "reasonrl"),
    (1, 8, 1, False, f"accelerate launch --config_file {ZERO3} --num_processes 7 -m reasonrl.cli"),
    (2, 16, 1, True, "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 python -m"
                     " reasonrl.training.launch --processes-per-node 7 --config-file"
                     f" {ZERO3} -m reasonrl.cli"),
    (2, 16, 0, False, "resources nodes=2: also set mpi=srun and tasks_per_node=8 (the SLURM"
                      " executor leaves an MPI job's command to start its tasks)"),
    (2, 3, 0, True, "resources nodes=2, gpu=3: gpu is the job's GPUs (sbatch --gpus), at least"
                    " 2 on each node and as many on every node"),
])  # fmt: skip
def test_a_rules_launcher_follows_its_nodes_and_gpus(nodes, gpus, own, mpi, want):
    if want.startswith("resources"):
        with pytest.raises(ReasonRLError) as caught:
            command_prefix(nodes, gpus, own, ZERO3, mpi)
        assert str(caught.value) == want
    else:
        assert command_prefix(nodes, gpus, own, ZERO3, mpi) == want


def _node_placements(nodes: int) -> dict[str, mp.Placement]:
    """The recipe's resources over `nodes` nodes of 8 GPUs; the generation rules on one."""
    job = {"gpu": 8 * nodes, "nodes": nodes, "deepspeed": "zero3"}
    placements = {rule: mp.placement(rule, job) for rule in ("sft", "train_reward_model")}
    placements["ppo"] = mp.placement("ppo", {**job, "generator_gpus": 1})
    for rule in ("evaluate", "evaluate_part", "sample_rm_data", "ppo_r2"):
        placements[rule] = mp.placement(rule, {"gpu": 1})
    return placements


def test_the_multi_node_recipe_needs_two_nodes_and_fits_them():
    config = load_workflow_config([str(REPO / BASE_RECIPE), str(REPO / RECIPE)])
    assert mp.architecture(config).params() == pytest.approx(14.77e9, rel=1e-3)
    one = {p.rule: p for p in mp.plan_config(config, _node_placements(1))}
    assert not one["ppo"].fits and one["ppo"].gpus_needed == 8  # of the node's 7
    assert not one["train_reward_model"].fits and one["train_reward_model"].gpus_needed == 9
    placements = _node_placements(2)
    assert (placements["ppo"].gpus, placements["ppo"].nodes) == (14, 2)  # 7 a node
    two = mp.plan_config(config, placements)
    mp.check_global_batches(config, placements, RECIPE)
    mp.check_launches(config, placements, RECIPE)
    mp.check_fits(two, RECIPE)
    plans = {p.rule: p for p in two}
    # ZeRO-3 shards the trained and frozen models over all 14 learner GPUs of both nodes
    assert plans["ppo"].params == pytest.approx(one["ppo"].params * 7 / 14)
    row = next(r for r in mp.plan_rows(two) if r["rule"] == "ppo")
    assert row["GPUs"] == "14 on 2 nodes"


def _recipe_resources(nodes: int, **extra: object) -> list[str]:
    settings = {"nodes": nodes, "gpu": 8 * nodes, "deepspeed": "zero3", **extra}
    rules = ("sft", "train_reward_model", "ppo")
    resources = [f"{rule}:{key}={value}" for rule in rules for key, value in settings.items()]
    return [*resources, "ppo:generator_gpus=1"]


# The SLURM profile's dry run; env-modules stands in for Apptainer, which needs its binary and
# published images even for a dry run (test_slurm.py's profile test does the same).
PROFILE = ("--profile", "profiles/slurm", "--sdm", "env-modules")


def test_the_slurm_profiles_dry_run_starts_each_node_with_srun(snakemake):
    result = snakemake(
        "-n", "-p", *PROFILE, "--configfile", BASE_RECIPE, RECIPE,
        "--set-resources", *_recipe_resources(2, mpi="srun", tasks_per_node=8),
    )  # fmt: skip
    srun = (
        "srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 python -m"
        " reasonrl.training.launch --processes-per-node {} --config-file"
    )
    assert result.stdout.count(srun.format(8)) >= 2  # sft and each reward model
    assert srun.format(7) + f" {REPO}/profiles/accelerate/deepspeed_zero3.yaml -m reasonrl.cli" \
        " ppo " in result.stdout  # fmt: skip


def test_without_mpi_the_dry_run_stops_with_the_resources_to_set(snakemake):
    result = snakemake(
        "-n", *PROFILE, "--configfile", BASE_RECIPE, RECIPE,
        "--set-resources", *_recipe_resources(2), check=False,
    )  # fmt: skip
    assert result.returncode != 0
    error = "ReasonRLError: resources nodes=2: also set mpi=srun and tasks_per_node=8"
    assert error in result.stdout + result.stderr


class _Resources(dict):
    __getattr__ = dict.get


def test_sbatch_asks_for_the_nodes_their_gpus_and_one_task_per_gpu():
    """The SLURM executor's submission of such a job (its own function, on the resources the
    dry run's rule has): nodes, the job's GPUs, and an MPI job's tasks, whose command starts
    its own tasks (srun, one a node)."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    resources = _Resources(nodes=2, gpu=16, mpi="srun", tasks_per_node=8, cpus_per_gpu=8,
                           mem_mb=440000, runtime=600)  # fmt: skip
    job = SimpleNamespace(resources=resources, threads=1)
    params = {"run_uuid": "u", "slurm_logfile": "log", "comment_str": "ppo", "account": "",
              "partition": "", "workdir": "/work"}  # fmt: skip
    line = get_submit_command(job, params) + set_gres_string(job)  # as the executor submits
    for part in ("--nodes=2", "--gpus=16", "--ntasks-per-node=8", "--cpus-per-gpu=8"):
        assert f" {part}" in line, line
    assert "--ntasks-per-gpu" not in line and "--ntasks=" not in line


def test_the_plan_cli_reads_nodes_from_the_profile(tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    resources = {}
    for entry in _recipe_resources(2, mpi="srun", tasks_per_node=8):
        rule, setting = entry.split(":")
        key, value = setting.split("=")
        resources.setdefault(rule, {})[key] = int(value) if value.isdigit() else value
    (profile / "config.yaml").write_text(yaml.safe_dump({"set-resources": resources}))
    cli = [str(REPO / ".venv/bin/reasonrl"), "plan", "--profile", str(profile)]
    cli += ["--configfile", BASE_RECIPE, "--configfile", RECIPE]
    done = subprocess.run(cli, cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "\n| ppo | 14 on 2 nodes | yes | 3 |" in done.stdout


# --- a job over two SLURM nodes, for real --------------------------------------------------


@pytest.fixture(scope="module")
def two_node_cluster():
    """A SLURM cluster of two nodes on this host (two slurmd, n1 and n2)."""
    from conftest import start_cluster

    root = Path(tempfile.mkdtemp(prefix="reasonrl-two-nodes-"))  # munged refuses 0700 trees
    running = start_cluster(root, nodes=2)
    yield running
    running.stop()
    shutil.rmtree(root, ignore_errors=True)


def test_an_sft_job_over_two_slurm_nodes_trains_as_one_process(two_node_cluster, tmp_path):
    """sbatch --nodes=2 runs the rule's command as launcher() makes it for resources nodes=2,
    gpu=4 (two processes stand in for each node's two GPUs): srun starts the launch on n1 and
    n2, whose four processes train as one process accumulating four micro-batches (the same
    losses, grad norms and weights), and rank 0's manifest names both nodes. The nodes' names
    do not resolve on this host, so the job's MASTER_ADDR says where n1 is."""
    from reasonrl.models import load_policy

    shared = Path(tempfile.mkdtemp(prefix="reasonrl-sft-", dir=two_node_cluster.root))
    policy, train = sft_inputs(shared)
    sft = {"max_steps": 3, "batch_size": 1, "global_batch_size": 4, "lr": 1e-2,
           "max_length": 1024, "log_every": 1, "group_by_length": False}  # fmt: skip
    args = ["sft", "--config-json", json.dumps({"sft": sft}), "--style", "tool"]
    args += ["--model", str(policy), "--train", str(train)]
    one = subprocess.run(
        [str(Path(sys.executable).parent / "reasonrl"), *args, "--out", str(shared / "one")],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert one.returncode == 0, one.stderr[-3000:]
    prefix = command_prefix(2, 4, 0, zero2_fp32_config(), mpi=True)
    command = f"{prefix} {shlex.join(args)} --out {shared / 'two'}"
    env = {**two_node_cluster.env, "MASTER_ADDR": "127.0.0.1", "OMP_NUM_THREADS": "1",
           "PATH": f"{Path(sys.executable).parent}:{two_node_cluster.env['PATH']}"}  # fmt: skip
    log = shared / "job.log"
    job = subprocess.run(
        ["sbatch", "--wait", "--nodes=2", "--ntasks-per-node=1", "--output", str(log),
         "--wrap", command],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert job.returncode == 0, job.stderr + log.read_text()[-4000:]
    assert "node 0 of 2 (('n1', 'n2'))" in log.read_text()
    assert "node 1 of 2 (('n1', 'n2'))" in log.read_text()
    runs = {
        name: json.loads((shared / name / "metrics.json").read_text()) for name in ("one", "two")
    }
    assert runs["one"]["steps"] == runs["two"]["steps"] == 3
    for key in ("loss", "grad_norm"):
        want = [h[key] for h in runs["one"]["history"]]
        assert [h[key] for h in runs["two"]["history"]] == pytest.approx(want, rel=1e-4), key
    want, got = (load_policy(shared / name)[0].state_dict() for name in ("one", "two"))
    for key in want:
        assert got[key].allclose(want[key], rtol=1e-4, atol=1e-4), key
    scheduler = json.loads((shared / "two" / "manifest.json").read_text())["scheduler"]
    assert scheduler["nodes"] == ["n1", "n2"]
    assert (scheduler["processes_per_node"], scheduler["world_size"]) == (2, 4)
