"""Shared fixtures: a runner for the repository's Snakefile with the venv on PATH, root's
local run of config/test.yaml, the ordinary account, the session's SLURM cluster; the Docker
daemon, image and registry fixtures are tests/container_fixtures.py's (a plugin, below)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

import reasonrl  # noqa: F401 (pins torch's and MKL's float code path before a test imports torch)

# The image and registry fixtures, shared by tests/test_containers.py and tests/test_slurm.py.
pytest_plugins = ["container_fixtures"]

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="session")
def snakemake() -> Callable[..., subprocess.CompletedProcess]:
    """Run the repository's Snakefile from `cwd` (default: the repo); rules find `reasonrl`."""

    def run(*args: str, cwd: Path = REPO, check: bool = True) -> subprocess.CompletedProcess:
        env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        command = [str(VENV_BIN / "snakemake"), "--snakefile", str(REPO / "Snakefile"), *args]
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    return run


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide Llama with a ChatML tokenizer trained on a few lines of arith text."""
    from reasonrl.models import build_tiny_policy

    settings = {
        "vocab_size": 300,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 2,
        "max_position_embeddings": 256,
    }
    folder = tmp_path_factory.mktemp("tiny-policy")
    corpus = ["x = 12 + 30\nprint(x)\n```output", "The answer is 42."] * 10
    build_tiny_policy(corpus, settings, 0, folder)
    return folder


@pytest.fixture(scope="session")
def smollm2_shaped_backbone(tmp_path_factory) -> Path:
    """A 2-layer, 32-wide Llama with the bundled SmolLM2-135M-Instruct's tokenizer and chat
    template: a reward-model backbone that reads the tiny policy's trajectories with a
    tokenizer and template other than the policy's (SmolLM2's own weights train at ~20 s a
    step on this machine's CPU; the tokenizer and template are what the plumbing reads)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from reasonrl.models import smollm2_gguf_path

    gguf = smollm2_gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("smollm2-shaped")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def test_run(snakemake, tmp_path_factory) -> Path:
    """config/test.yaml run to the end locally in a fresh directory (the repo's results/
    untouched). One run per session: the SLURM and container tests compare with it."""
    workdir = tmp_path_factory.mktemp("workflow")
    shutil.copytree(REPO / "config", workdir / "config")
    snakemake("--cores", "2", "--configfile", "config/test.yaml", cwd=workdir)
    return workdir


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch on one thread for a module's tests, restored after them."""
    from reasonrl.stages.online_dpo import torch_threads

    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def ordinary_account():
    """An ordinary account with the project set up in its home (tests/ordinary_user.py); the
    tests that use it need root to make it."""
    from ordinary_user import ordinary_user

    if os.geteuid() != 0:
        pytest.skip("needs root: it makes the ordinary account and runs as it")
    return ordinary_user()


@pytest.fixture(scope="session")
def cluster():
    """The session's SLURM cluster (tests/slurm_cluster.py), one for every test that needs one."""
    root = Path(tempfile.mkdtemp(prefix="reasonrl-slurm-"))  # munged refuses pytest's 0700 tree
    running = start_cluster(root)
    yield running
    running.stop()
    shutil.rmtree(root, ignore_errors=True)


def start_cluster(root: Path, nodes: int = 1):
    """The test cluster under `root` (`nodes` slurmd on this host), or a skip naming what it
    lacks."""
    from slurm_cluster import SlurmCluster, missing_programs

    missing = missing_programs()
    if missing:
        pytest.skip(
            f"SLURM is not installed ({', '.join(missing)} missing): `make test-deps` "
            "installs slurm-wlm and munge (as root)"
        )
    if os.geteuid() != 0:
        pytest.skip("the test cluster starts slurmd and munged as root")
    # A 16-CPU node with 2 fake GPUs (slurmd trusts the config): the profile's real requests
    # (8 CPUs per GPU, 64 GB) fit, while the jobs run on this machine's cores.
    return SlurmCluster(root, cpus=16, memory_mb=131072, gpus=2, nodes=nodes).start()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The learning files' Holm families, as measured in this session (learning_start.FAMILIES),
    so a run's log holds every number the record cites, passes and strict xfails included."""
    learning = sys.modules.get("learning_start")
    for family, lines in getattr(learning, "FAMILIES", {}).items():
        terminalreporter.write_sep("-", f"{family}: Holm over {len(lines)}")
        for line in lines:
            terminalreporter.write_line(line)
