"""Shared fixtures: a runner for the repository's Snakefile with the venv on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import reasonrl  # noqa: F401 (pins torch's and MKL's float code path before a test imports torch)

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
