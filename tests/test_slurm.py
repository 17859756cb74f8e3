"""profiles/slurm: what the profile asks of SLURM, and config/test.yaml run on a real cluster.

The cluster is Debian's slurm-wlm 22.05 with munge, brought up under a temporary folder by
tests/slurm_cluster.py (`make test-deps` installs the packages, as root); one per session (the
`cluster` fixture of tests/conftest.py). Apptainer cannot be installed on this machine kind,
so the cluster run uses the profile without its software-deployment-method and runs every
rule in the CPU image through Docker instead (`containers.engine: docker`), pulled by the
digest that `containers publish` pinned in a local registry (tests/container_fixtures.py).
The run is submitted by an ordinary account (tests/ordinary_user.py) from its own copy, as
on a cluster every job runs as its user: it is the unprivileged lane's DAG
(tests/test_unprivileged.py) and the Docker path's DAG (tests/test_containers.py) too, and
its results must equal root's native local run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from run_results import differing_results
from tracked import assert_one_tracking_run

from reasonrl.containers.lock import load_lock

REPO = Path(__file__).resolve().parents[1]
# Building the image or running the workflow on SLURM (the session fixtures) can take longer
# than pytest's per-test timeout on a loaded 2-core machine.
HEAVY_TIMEOUT = 3600
VENV_BIN = Path(sys.executable).parent
PROFILE = REPO / "profiles/slurm/config.yaml"
# Keys that need Apptainer, which this machine kind cannot install.
APPTAINER_KEYS = ("software-deployment-method", "apptainer-args")
# The local reference run (--cores 2) gives the torch stages one thread each; so do we. Set in
# the profile's set-threads: a --set-threads on the command line replaces the profile's, and
# the other GPU rules would ask srun for more CPUs (threads) than their job holds.
SAME_THREADS = {"build_tiny_policy": 1, "sft": 1, "evaluate": 1, "evaluate_part": 1}
# Every generation stage spread over part jobs (config `split`): the outputs must still be the
# local one-job run's, byte for byte.
SPLIT = {
    "evaluate": 4,
    "sample_round": 2,
    "sample_rm_data": 2,
    "annotate_prm": 2,
    "best_of_n": 2,
    "hgs_search": 2,
}


def profile_without_apptainer(folder: Path) -> Path:
    profile = yaml.safe_load(PROFILE.read_text())
    for key in APPTAINER_KEYS:
        profile.pop(key)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


def dry_run_resources(snakemake, *args: str) -> dict[str, dict[str, str]]:
    """rule -> its `resources:` line of a dry-run, as name -> value strings."""
    result = snakemake("-n", "--configfile", "config/test.yaml", *args)
    resources, rule = {}, None
    for line in result.stdout.splitlines():
        if match := re.fullmatch(r"(?:local)?rule (\w+):", line):
            rule = match[1]
        elif rule and line.startswith("    resources: "):
            pairs = line.removeprefix("    resources: ").split(", ")
            resources[rule] = dict(pair.split("=", 1) for pair in pairs)
    return resources


class PluginJob(SimpleNamespace):
    """What the SLURM plugin reads of a job: resources (attributes and .get) and threads."""

    def __init__(self, resources: dict[str, object], threads: int):
        super().__init__(resources=_Resources(**resources), threads=threads)


class _Resources(SimpleNamespace):
    def get(self, name, default=None):
        return getattr(self, name, default)


def _typed(value: str) -> object:
    return int(value) if value.isdigit() else value


# --- the profile, without a cluster ------------------------------------------------------------


@pytest.fixture(scope="module")
def profile_resources(snakemake, tmp_path_factory) -> dict[int, dict[str, dict[str, str]]]:
    """Job resources the profile gives each rule, at attempts 1 and 2."""
    profile = str(profile_without_apptainer(tmp_path_factory.mktemp("profile")))
    return {
        attempt: dry_run_resources(snakemake, "--profile", profile, "--attempt", str(attempt))
        for attempt in (1, 2)
    }


def test_profile_gpu_resources_become_the_plugins_gpu_and_cpu_flags(profile_resources):
    from snakemake_executor_plugin_slurm.utils import set_gres_string
    from snakemake_executor_plugin_slurm_jobstep import get_cpu_setting, get_gpu_setting

    threads = yaml.safe_load(PROFILE.read_text())["set-threads"]
    for rule in ("sft", "evaluate"):
        resources = {k: _typed(v) for k, v in profile_resources[1][rule].items()}
        job = PluginJob(resources, threads[rule])
        assert set_gres_string(job).strip() == "--gpus=1"  # sbatch
        assert get_gpu_setting(job) == "--gpus=1"  # srun inside the job
        assert get_cpu_setting(job, gpu=True) == "--cpus-per-gpu=8"
        assert resources["mem_mb"] == 64000
    cpu_job = PluginJob({k: _typed(v) for k, v in profile_resources[1]["report"].items()}, 1)
    assert set_gres_string(cpu_job) == "" and get_cpu_setting(cpu_job, gpu=False) == (
        "--cpus-per-task=1"
    )


def test_profile_scales_runtime_with_the_attempt(profile_resources):
    for rule in ("sft", "evaluate", "build_tiny_policy", "report"):
        first = int(profile_resources[1][rule]["runtime"])
        assert int(profile_resources[2][rule]["runtime"]) == 2 * first, rule


def test_profile_sets_what_a_cluster_without_slurmdbd_needs():
    profile = yaml.safe_load(PROFILE.read_text())
    assert profile["executor"] == "slurm"
    assert profile["slurm-status-command"] == "squeue"
    assert profile["slurm-init-seconds-before-status-checks"] == 1
    assert profile["slurm-requeue"] is True and profile["retries"] >= 1
    assert profile["software-deployment-method"] == "apptainer"


def cluster_page_node_commands() -> list[tuple[str, list[str]]]:
    """docs/cluster.md's commands for the GPU recipes on one 8 x 80 GB node: (recipe, the
    --set-resources of its command, $NODE expanded)."""
    page = (REPO / "docs/cluster.md").read_text()
    block = page[page.index('NODE="') :].split("```", 1)[0]
    node = block.split('"')[1].split()
    commands = []
    for command in block.split(".venv/bin/snakemake ")[1:]:
        words = command.replace("\\\n", " ").split("\n")[0].split()
        resources = words[words.index("--set-resources") + 1 :]
        expanded = [w for r in resources for w in (node if r == "$NODE" else [r])]
        commands.append((words[words.index("--configfile") + 1], expanded))
    return commands


def test_the_cluster_pages_node_commands_dry_run_every_gpu_recipe(snakemake, tmp_path):
    """Each GPU recipe has a command in docs/cluster.md, and its dry run with the profile (less
    Apptainer: no image is published here) plans every rule within the node; without the
    command's resources the profile's one GPU per rule does not fit."""
    commands = cluster_page_node_commands()
    recipes = sorted(str(p.relative_to(REPO)) for p in (REPO / "config").glob("gpu-*.yaml"))
    assert sorted({recipe for recipe, _ in commands}) == recipes
    profile = ("--profile", str(profile_without_apptainer(tmp_path / "profile")))
    for recipe, resources in commands:
        args = ("-n", "-q", "--nolock", *profile, "--configfile", recipe)
        snakemake(*args, "--set-resources", *resources)
        if recipe == "config/gpu-mdpo-mistral-7b.yaml":
            alone = snakemake(*args, check=False)
            assert "rule sft needs" in alone.stderr and alone.returncode != 0


def test_make_installs_the_profile_where_snakemake_finds_it_by_name(snakemake, tmp_path):
    config_home = tmp_path / "xdg"
    env = {**os.environ, "XDG_CONFIG_HOME": str(config_home)}
    subprocess.run(["make", "-s", "slurm-profile"], cwd=REPO, env=env, check=True)
    assert (config_home / "snakemake/slurm").resolve() == PROFILE.parent
    # --profile slurm, literally; env-modules stands in for apptainer, which needs its binary
    # even for a dry-run.
    command = [str(VENV_BIN / "snakemake"), "-n", "--profile", "slurm", "--sdm", "env-modules"]
    result = subprocess.run(
        [*command, "--configfile", "config/test.yaml"],
        cwd=REPO,
        env={**env, "PATH": f"{VENV_BIN}{os.pathsep}{env['PATH']}"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "gpu=1, cpus_per_gpu=8" in result.stdout  # the profile's set-resources of sft
    unlinked = {**env, "XDG_CONFIG_HOME": str(tmp_path / "empty")}
    result = subprocess.run(
        [*command, "--configfile", "config/test.yaml"], cwd=REPO, env=unlinked, capture_output=True
    )
    assert result.returncode != 0


# --- a real cluster, every rule in the image pulled by digest ---------------------------------


def profile_for_the_image(folder: Path) -> Path:
    """profiles/slurm less Apptainer, SAME_THREADS in its set-threads, and each GPU rule's
    `gpu: N` asked of SLURM as `gres: gpu:N` and `gpu: 0`. SLURM still gives the job N of the
    node's fake GPUs (and its CUDA_VISIBLE_DEVICES, and --cpus-per-gpu's CPUs), while the
    Docker runner, which reads `gpu`, asks Docker for none: Docker can pass only real GPUs
    (`--gpus` needs NVIDIA's container runtime). Without `gpu` the job step's srun asks for
    the rule's threads as --cpus-per-task (the profile's 8 at most)."""
    profile = yaml.safe_load((profile_without_apptainer(folder) / "config.yaml").read_text())
    profile["set-threads"].update(SAME_THREADS)
    for resources in profile["set-resources"].values():
        if resources.get("gpu"):
            # quoted: Snakemake reads a set-resources value as a number or an expression
            resources["gres"] = f"'gpu:{resources['gpu']}'"
            resources["gpu"] = 0
    (folder / "config.yaml").write_text(yaml.safe_dump(profile))
    return folder


@pytest.fixture(scope="module")
def slurm_run(cluster, docker_account, pulled_cpu_image, published_cpu_image) -> Path:
    """config/test.yaml through the SLURM executor, submitted by an ordinary account from its
    own set-up copy (tests/ordinary_user.py), as every researcher's jobs run, with every rule
    in the CPU image pulled by the digest `containers publish` pinned (containers.engine
    docker, the published lock; tests/container_fixtures.py): profiles/slurm (minus
    Apptainer, GPUs as in profile_for_the_image) and every generation stage split into part
    jobs. Its results must equal root's native local run. It is the unprivileged lane's DAG
    (issue 45) and the Docker path's DAG: one run instead of a SLURM, a Docker and a split
    stage's run."""
    user = docker_account
    workdir = user.home / "slurm-run"
    shutil.rmtree(workdir, ignore_errors=True)
    shutil.copytree(REPO / "config", workdir / "config")
    lock = workdir / "images.lock.yaml"  # the user's own copy: root's tmp folders are 0700
    shutil.copy(published_cpu_image, lock)
    extra = {"split": SPLIT, "containers": {"engine": "docker", "lock": str(lock)}}
    (workdir / "cluster.yaml").write_text(yaml.safe_dump(extra))
    profile = profile_for_the_image(workdir / "profile")
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(workdir)], check=True)
    user_bin = user.repo / ".venv" / "bin"
    env = {**user.environment(), "SLURM_CONF": cluster.env["SLURM_CONF"]}
    env["PATH"] = os.pathsep.join([str(user_bin), cluster.env["PATH"]])
    command = [str(user_bin / "snakemake"), "--snakefile", str(user.repo / "Snakefile")]
    command += ["--profile", str(profile), "--configfile", "config/test.yaml", "cluster.yaml"]
    result = subprocess.run(
        user.command(command), cwd=workdir, env=env, capture_output=True, text=True
    )
    if result.returncode != 0:
        pytest.fail(
            f"snakemake on SLURM in the image as {user.name} failed:\n{result.stderr[-6000:]}\n"
            f"{cluster.log('slurmctld')[-2000:]}"
        )
    return workdir


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_every_job_ran_as_the_submitting_ordinary_user(slurm_run, cluster, ordinary_account):
    """The jobs ran under the submitter's uid, not root's: SLURM says so of each, and every
    result file is the user's (written from the containers, as that uid, through the mount)."""
    jobs = {
        json.loads(path.read_text())["scheduler"]["SLURM_JOB_ID"]
        for path in (slurm_run / "results").rglob("manifest.json")
    }
    for job in sorted(jobs):
        shown = cluster.run("scontrol", "show", "job", job).stdout
        assert f"UserId={ordinary_account.name}({ordinary_account.uid})" in shown, shown
    owners = {path.stat().st_uid for path in (slurm_run / "results").rglob("*")}
    assert owners == {ordinary_account.uid}


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_slurm_run_in_the_image_gives_the_local_runs_results(slurm_run, test_run):
    """Every result (trajectories, verdicts, metrics, weights) equals root's native local run:
    on SLURM, as an ordinary user, split into part jobs, in the image."""
    assert differing_results(test_run, slurm_run) == []


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_slurm_jobs_track_under_one_run_name(slurm_run):
    assert_one_tracking_run(slurm_run)


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_every_job_ran_as_a_slurm_job(slurm_run, test_run):
    manifests = sorted((slurm_run / "results").rglob("manifest.json"))
    local = sorted((test_run / "results").rglob("manifest.json"))  # every job that writes one
    assert [p.relative_to(slurm_run) for p in manifests] == [p.relative_to(test_run) for p in local]
    for path in manifests:
        assert "SLURM_JOB_ID" in json.loads(path.read_text())["scheduler"], path


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_every_rule_ran_in_the_pinned_image_and_says_so(
    slurm_run, pulled_cpu_image, cpu_image, test_run
):
    """Every job that writes a manifest ran in the CPU image by the reference and digest the
    published lock pins: the image the session built (pulled_cpu_image removed it and pulled
    it back by that digest), with the image's reasonrl and torch, not the user's venv's."""
    assert pulled_cpu_image.image_id == load_lock(cpu_image).images["cpu"]["image_id"]
    manifests = sorted((slurm_run / "results").rglob("manifest.json"))
    local = sorted((test_run / "results").rglob("manifest.json"))  # every job that writes one
    assert [p.relative_to(slurm_run) for p in manifests] == [p.relative_to(test_run) for p in local]
    for path in manifests:
        manifest = json.loads(path.read_text())
        container = manifest["container"]
        assert container["runtime"] == "docker" and container["image"] == "cpu", path
        assert container["ref"] == pulled_cpu_image.pinned, path
        assert container["digest"] == pulled_cpu_image.digest, path
        assert manifest["container_image"] == pulled_cpu_image.digest, path
        assert manifest["packages"]["torch"] == "2.13.0+cpu"
        assert manifest["command"][0] == "/opt/venv/bin/reasonrl"  # the image's, not the venv's


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_a_split_stage_ran_as_part_jobs_on_slurm(slurm_run):
    """Each gathered output names the SLURM jobs of its parts: four distinct ones for an
    evaluation split four ways. test.yaml's stages are one shard each (its learning tests'
    draws depend on shard_size), so part 0 makes it and the others publish none;
    tests/test_split.py splits eight shards over four parts."""
    for evaluation in ("eval/sft-tool/arith", "eval/base/arith"):
        manifest = json.loads((slurm_run / "results" / evaluation / "manifest.json").read_text())
        parts = manifest["parts"]
        assert [(p["part"], p["count"]) for p in parts] == [(i, 4) for i in range(4)]
        assert [p["made"] for p in parts] == [1, 0, 0, 0]
        jobs = {p["scheduler"]["SLURM_JOB_ID"] for p in parts}
        assert len(jobs) == 4 and manifest["scheduler"]["SLURM_JOB_ID"] not in jobs, evaluation
    for path in (slurm_run / "results").rglob("manifest.json"):
        stage = json.loads(path.read_text())["stage"]
        if stage in ("sample-round", "sample-rm-data", "annotate-prm", "best-of-n", "hgs-search"):
            assert len(json.loads(path.read_text())["parts"]) == 2, path
    assert not list((slurm_run / "results").rglob("*.parts/*"))  # temp: gone once gathered


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_gpu_rules_ran_on_the_fake_gpu_node_with_cuda_visible_devices(slurm_run, cluster):
    """SLURM gave each GPU job one of the node's fake GPUs and 8 CPUs for it, and the
    container saw its CUDA_VISIBLE_DEVICES. The run asks for them as `--gres=gpu:1` (see
    profile_for_the_image), so SLURM shows them per node; the profile's own `gpu: 1` becomes
    `--gpus=1` (test_profile_gpu_resources_become_the_plugins_gpu_and_cpu_flags)."""
    for folder in ["models/sft-tool", "models/sft-cot", "eval/sft-tool/arith"]:
        scheduler = json.loads((slurm_run / "results" / folder / "manifest.json").read_text())[
            "scheduler"
        ]
        assert scheduler["SLURM_JOB_NODELIST"] == cluster.node
        assert scheduler["CUDA_VISIBLE_DEVICES"] in {"0", "1"}, folder
        job = cluster.run("scontrol", "show", "job", scheduler["SLURM_JOB_ID"]).stdout
        assert "TresPerNode=gres:gpu:1" in job and "CpusPerTres=gres:gpu:8" in job, job
    data = json.loads((slurm_run / "results/data/arith/manifest.json").read_text())
    assert "CUDA_VISIBLE_DEVICES" not in data["scheduler"]  # CPU rules get no GPU


@pytest.mark.workflow
@pytest.mark.timeout(HEAVY_TIMEOUT)
def test_the_users_tool_loop_ran_its_sandbox_in_the_image(slurm_run):
    """The tool loop's evaluation of sft-tool ran in the image as the ordinary user's uid, its
    sandbox through a user namespace inside the container: no call was refused (its
    trajectories and verdicts equal the native run's, its files are the user's: above)."""
    target = slurm_run / "results/eval/sft-tool/arith/trajectories.jsonl"
    statuses = [json.loads(line)["tool_status"] for line in target.open()]
    assert "refused" not in {status for row in statuses for status in row}


def test_multi_gpu_training_job_runs_under_accelerate_with_deepspeed(snakemake):
    def sft_commands(*resources: str) -> list[str]:
        result = snakemake("-n", "-p", "--configfile", "config/test.yaml", *resources)
        return [
            line.removeprefix("Shell command: ")
            for line in result.stdout.splitlines()
            if line.startswith("Shell command: ") and " sft --config-json" in line
        ]

    zero3 = REPO / "profiles/accelerate/deepspeed_zero3.yaml"
    launch = f"accelerate launch --config_file {zero3} --num_processes 4 -m reasonrl.cli sft "
    commands = sft_commands("--set-resources", "sft:gpu=4", "sft:deepspeed=zero3")
    assert len(commands) == 2 and all(c.startswith(launch) for c in commands)
    assert all(c.startswith("reasonrl sft ") for c in sft_commands("--set-resources", "sft:gpu=1"))


def _commands(snakemake, verb: str, *args: str) -> list[str]:
    """The shell commands of `verb`'s jobs in a dry run with `args`."""
    result = snakemake("-n", "-p", *args)
    return [
        line.removeprefix("Shell command: ")
        for line in result.stdout.splitlines()
        if line.startswith("Shell command: ") and f" {verb} --config-json" in line
    ]


def test_an_online_generator_with_a_gpu_of_its_own_leaves_the_learner_the_rest(snakemake):
    """resource generator_gpus=1: the job's last GPU is the generator's, the learner is
    launched over the others (one left: a plain process)."""

    def online_commands(*args: str) -> list[str]:
        return _commands(snakemake, "online-dpo", *args)

    # the async recipe's steps: 8 micro-batches, which share out over 2 learner GPUs
    recipe = ("--configfile", "config/gpu-async-dpo-rho-1b.yaml", "--set-resources")
    zero2 = REPO / "profiles/accelerate/deepspeed_zero2.yaml"
    launch = f"accelerate launch --config_file {zero2} --num_processes 2 -m reasonrl.cli "
    own = online_commands(*recipe, "online_dpo:gpu=3", "online_dpo:generator_gpus=1")
    assert own and all(c.startswith(launch) and " --generator-gpus 1 " in c for c in own)
    one = online_commands(*recipe, "online_dpo:gpu=2", "online_dpo:generator_gpus=1")
    assert one and all(c.startswith("reasonrl online-dpo ") for c in one)
    shared = online_commands("--set-resources", "online_dpo:gpu=1")  # the default's
    assert shared and all(" --generator-gpus 0 " in c for c in shared)


def test_ppo_with_a_generator_of_its_own_is_launched_over_the_other_gpus(snakemake, tmp_path):
    """The PF-PPO recipe's --set-resources for ppo: 8 GPUs, ZeRO-3, the last one its
    generator's: the learner is launched over 7 and told the generator has its own. (The
    default PPO's buffer, 28 prompts x 4 responses here, is one step of 16 rows x 7 GPUs: the
    plan refuses part steps.)"""
    zero3 = REPO / "profiles/accelerate/deepspeed_zero3.yaml"
    launch = f"accelerate launch --config_file {zero3} --num_processes 7 -m reasonrl.cli ppo "
    resources = ("ppo:gpu=8", "ppo:deepspeed=zero3", "ppo:generator_gpus=1")
    (tmp_path / "ppo.yaml").write_text("ppo: {prompts_per_iteration: 28}\n")
    args = ("--configfile", str(tmp_path / "ppo.yaml"), "--set-resources", *resources)
    commands = _commands(snakemake, "ppo", *args)
    assert commands and all(c.startswith(launch) and " --generator-gpus 1 " in c for c in commands)


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_configs_load_as_accelerate_configs(stage):
    from accelerate.commands.config.config_args import load_config_from_file

    path = REPO / f"profiles/accelerate/deepspeed_zero{stage}.yaml"
    config = load_config_from_file(str(path))
    assert config.distributed_type == "DEEPSPEED"
    assert config.deepspeed_config["zero_stage"] == stage
