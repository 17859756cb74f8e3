"""Provenance: every output folder carries manifest.json describing how it was made, the
float code path included.

Torch picks its vectorised kernels (ATen) and MKL its GEMM branch by the CPU it finds: the
same 40 training steps of config.yaml's tiny policy end in different weights under ATen's
AVX2 and generic kernels, and under MKL's default and SSE2 branches (measured 2026-12-05 on
an AMD EPYC without AVX-512; docs/experiment-design.md, "The start moves with the CPU").
The package asks for the AVX2 paths when it is imported (reasonrl/__init__.py); each
manifest records the CPU and the kernels a stage actually ran on.
"""

from __future__ import annotations

import hashlib
import os
import platform
import resource
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from reasonrl import __version__
from reasonrl.io import write_json

PACKAGES = ("torch", "transformers", "accelerate", "tokenizers", "datasets", "snakemake")
REPO_ROOT = Path(__file__).resolve().parents[2]


def float_code_path() -> dict[str, str | None]:
    """This process's float kernels: the CPU, MKL's branch, and torch's kernel set and threads
    where the stage loaded torch (a stage that never did ran none of its kernels, and is not
    made to load it here)."""
    torch = sys.modules.get("torch")
    return {
        "cpu": _cpu_model(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability() if torch else None,
        "mkl_cbwr": os.environ.get("MKL_CBWR"),
        "torch_threads": str(torch.get_num_threads()) if torch else None,
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fingerprint_path(path: str | os.PathLike) -> str:
    """sha256 of a file, or of every file under a folder (names and contents, sorted)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def input_hashes(paths: list[str]) -> dict[str, str]:
    """Hash local inputs; a hub id (not a local path) is recorded as such."""
    return {p: fingerprint_path(p) if Path(p).exists() else "not-local" for p in paths}


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "reasonrl": __version__}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


def installed_packages() -> dict[str, str]:
    """Every Python distribution this process can import from, name -> version."""
    found = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name.lower()] = dist.version
    return dict(sorted(found.items()))


def container_provenance() -> dict[str, str | None]:
    """The image this stage ran in: ref and digest (Docker path), file (Apptainer), or none.

    The Docker runner passes REASONRL_IMAGE_REF / REASONRL_IMAGE_DIGEST; Apptainer sets
    APPTAINER_CONTAINER (the pulled image file); our images carry REASONRL_IMAGE (cpu, gpu)
    and REASONRL_SOURCE_COMMIT from their build.
    """
    apptainer = os.environ.get("APPTAINER_CONTAINER") or os.environ.get("SINGULARITY_CONTAINER")
    if apptainer:
        runtime = "apptainer"
    elif os.environ.get("REASONRL_IMAGE_REF"):
        runtime = "docker"
    else:
        runtime = None
    return {
        "runtime": runtime,
        "image": os.environ.get("REASONRL_IMAGE"),
        "ref": os.environ.get("REASONRL_IMAGE_REF"),
        "digest": os.environ.get("REASONRL_IMAGE_DIGEST"),
        "file": apptainer,
        "source_commit": os.environ.get("REASONRL_SOURCE_COMMIT"),
    }


def scheduler_provenance() -> dict:
    """Where a scheduler put the stage: SLURM job and node, the GPUs it was given, and for a
    job over several nodes (reasonrl.training.launch) every node and the processes each ran."""
    names = ("SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_CPUS_ON_NODE", "CUDA_VISIBLE_DEVICES")
    where: dict = {name: os.environ[name] for name in names if name in os.environ}
    if os.environ.get("REASONRL_NODES"):
        where["nodes"] = os.environ["REASONRL_NODES"].split(",")
        where["processes_per_node"] = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        where["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))
    return where


def peak_memory_mb() -> float:
    """Peak resident memory of this process and its waited-for children (Linux reports KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def peak_gpu_memory_mb() -> float | None:
    """Peak GPU memory torch's allocator held in this process (None without a GPU, or where
    torch was never imported: a stage that loads no model)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.max_memory_allocated() / 2**20


class Provenance:
    """Start the clock when a stage starts; write the manifest when it ends."""

    def __init__(self, stage: str, config: dict, inputs: list[str], seed: int):
        self.stage = stage
        self.config = config
        self.inputs = inputs
        self.seed = seed
        self.started = time.time()
        self.hashes = input_hashes(inputs)

    def write(self, out_dir: str | os.PathLike, extra: dict | None = None) -> dict:
        manifest = {
            "stage": self.stage,
            "command": sys.argv,
            "config": self.config,
            "inputs": self.hashes,
            "seed": self.seed,
            "versions": _versions(),
            "git_commit": _git_commit(),
            "container_image": os.environ.get("REASONRL_IMAGE_DIGEST"),
            "container": container_provenance(),
            "packages": installed_packages(),
            "scheduler": scheduler_provenance(),
            "float_code_path": float_code_path(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started)),
            "wall_seconds": round(time.time() - self.started, 3),
            "peak_memory_mb": round(peak_memory_mb(), 1),
            "peak_gpu_memory_mb": peak_gpu_memory_mb(),
            **(extra or {}),
        }
        write_json(Path(out_dir) / "manifest.json", manifest)
        return manifest
