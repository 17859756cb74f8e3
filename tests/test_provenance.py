"""Manifest provenance of where a stage ran: image, packages, scheduler."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import reasonrl
from reasonrl.manifest import (
    Provenance,
    container_provenance,
    installed_packages,
    scheduler_provenance,
)

RUNTIME_VARS = (
    "REASONRL_IMAGE",
    "REASONRL_IMAGE_REF",
    "REASONRL_IMAGE_DIGEST",
    "REASONRL_SOURCE_COMMIT",
    "APPTAINER_CONTAINER",
    "SINGULARITY_CONTAINER",
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_CPUS_ON_NODE",
    "CUDA_VISIBLE_DEVICES",
)
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def clean_env(monkeypatch):
    for name in RUNTIME_VARS:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_native_run_names_no_container(clean_env):
    assert container_provenance()["runtime"] is None
    assert scheduler_provenance() == {}


def test_docker_runner_variables_become_image_ref_and_digest(clean_env):
    clean_env.setenv("REASONRL_IMAGE_REF", f"ghcr.io/x/y:1@{DIGEST}")
    clean_env.setenv("REASONRL_IMAGE_DIGEST", DIGEST)
    clean_env.setenv("REASONRL_IMAGE", "cpu")
    found = container_provenance()
    assert found["runtime"] == "docker" and found["digest"] == DIGEST and found["image"] == "cpu"


def test_apptainer_is_recognised_by_its_image_file(clean_env):
    clean_env.setenv("APPTAINER_CONTAINER", "/work/.snakemake/singularity/abc.simg")
    found = container_provenance()
    assert found["runtime"] == "apptainer" and found["file"].endswith("abc.simg")


def test_slurm_job_and_gpus_are_recorded(clean_env):
    clean_env.setenv("SLURM_JOB_ID", "42")
    clean_env.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert scheduler_provenance() == {"SLURM_JOB_ID": "42", "CUDA_VISIBLE_DEVICES": "1"}


def test_every_installed_package_and_its_version():
    packages = installed_packages()
    assert packages["torch"] == metadata.version("torch")
    assert packages["snakemake-executor-plugin-slurm"] == "2.8.0"
    assert len(packages) > 50


def test_manifest_carries_container_packages_and_scheduler(clean_env, tmp_path):
    import torch  # noqa: F401 (a stage that trains or generates has loaded it)

    clean_env.setenv("REASONRL_IMAGE_DIGEST", DIGEST)
    clean_env.setenv("REASONRL_IMAGE_REF", "img")
    clean_env.setenv("SLURM_JOB_ID", "7")
    Provenance("test", {}, [], 0).write(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["container"]["digest"] == DIGEST and manifest["container_image"] == DIGEST
    assert manifest["scheduler"] == {"SLURM_JOB_ID": "7"}
    assert manifest["packages"]["torch"] == metadata.version("torch")
    code_path = manifest["float_code_path"]
    assert code_path["cpu"] and code_path["torch_cpu_capability"], code_path


CPU_FLAGS = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
AVX2_HOST = platform.machine() in ("x86_64", "AMD64") and "avx2" in CPU_FLAGS
KERNELS = (
    "import os, reasonrl, torch;"
    "print(torch.backends.cpu.get_cpu_capability(), os.environ.get('MKL_CBWR'))"
)


def kernels_of_a_fresh_process(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in reasonrl.PORTABLE_FLOAT_CODE_PATH}
    command = [sys.executable, "-c", KERNELS]
    return subprocess.run(
        command, env={**clean, **env}, capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.mark.skipif(not AVX2_HOST, reason="the pin is to x86-64's AVX2 code paths")
def test_importing_the_package_pins_torch_and_mkl_to_their_avx2_code_paths():
    # an AVX-512 machine would otherwise run torch's AVX-512 kernels and MKL's own branch
    assert kernels_of_a_fresh_process() == "AVX2 AVX2"


@pytest.mark.skipif(not AVX2_HOST, reason="the pin is to x86-64's AVX2 code paths")
def test_a_users_own_float_code_path_is_kept():
    assert kernels_of_a_fresh_process(ATEN_CPU_CAPABILITY="default") == "DEFAULT AVX2"


def test_the_manifest_reads_the_gpu_peak_from_torchs_allocator(monkeypatch):
    """What the GPU check (bench/gpu_check.py) compares with the memory plan: torch's peak on
    the GPU; None on a machine without one, or in a stage that never imported torch."""
    from types import SimpleNamespace

    from reasonrl.manifest import peak_gpu_memory_mb

    cuda = SimpleNamespace(is_available=lambda: True, max_memory_allocated=lambda: 3 * 2**20)
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=cuda))
    assert peak_gpu_memory_mb() == 3.0
    monkeypatch.delitem(sys.modules, "torch")
    assert peak_gpu_memory_mb() is None
