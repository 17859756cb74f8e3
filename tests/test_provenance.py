"""Manifest provenance of where a stage ran: image, packages, scheduler."""

from __future__ import annotations

import json
from importlib import metadata

import pytest

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
    clean_env.setenv("REASONRL_IMAGE_DIGEST", DIGEST)
    clean_env.setenv("REASONRL_IMAGE_REF", "img")
    clean_env.setenv("SLURM_JOB_ID", "7")
    Provenance("test", {}, [], 0).write(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["container"]["digest"] == DIGEST and manifest["container_image"] == DIGEST
    assert manifest["scheduler"] == {"SLURM_JOB_ID": "7"}
    assert manifest["packages"]["torch"] == metadata.version("torch")
