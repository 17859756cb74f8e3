"""Run one rule's shell command inside its image through the Docker API (docker-py).

Snakemake starts a rule's command as `SHELL -c CMD`. Under `containers.engine: docker` the
SHELL of each rule is a small script (written by `write_rule_shell`) that calls
`python -m reasonrl.containers.runner --image REF ... -- bash -c CMD`, so the whole command,
log redirection included, runs in the container: the working directory mounted at the same
path, as the calling user's uid:gid, with no network unless the rule needs one, and with
GPUs when the rule's resources ask for them.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from reasonrl.containers.daemon import docker_client
from reasonrl.errors import ReasonRLError
from reasonrl.tracking import ENV_VAR as TRACKING_ENV

# Thread counts Snakemake sets for the rule, how idle OpenMP threads wait (a machine shared by
# several jobs wants them asleep, not spinning), and the GPU selection of a scheduler.
FORWARDED_ENV = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "PYTHONHASHSEED",
    TRACKING_ENV,  # the invocation's tracking run (reasonrl.tracking)
    # The scheduler's job, which the stage's manifest records (manifest.scheduler_provenance).
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "SLURM_CPUS_ON_NODE",
)
# What root needs to build the sandbox's namespaces (and its loopback) without a user namespace.
ROOT_SANDBOX_CAPABILITIES = ["SYS_ADMIN", "NET_ADMIN"]


@dataclass
class ContainerSpec:
    """How one rule's command runs: image, mounts, user, network and GPUs."""

    image: str  # repository@digest (published), or repository:tag of a local build
    digest: str | None  # recorded in the manifest of what the rule writes
    workdir: str
    network: bool = False
    gpus: int = 0
    user: str = field(default_factory=lambda: f"{os.getuid()}:{os.getgid()}")

    def environment(self, source: dict[str, str]) -> dict[str, str]:
        env = {name: source[name] for name in FORWARDED_ENV if name in source}
        env.update(HOME="/tmp", USER="reasonrl", REASONRL_IMAGE_REF=self.image)
        if self.digest:
            env["REASONRL_IMAGE_DIGEST"] = self.digest
        return env


def host_config(client, spec: ContainerSpec) -> dict:
    """Docker HostConfig: the working directory mounted in place, and what the sandbox needs.

    The sandbox (bubblewrap) inside the container creates namespaces and mounts /proc:
    Docker's default seccomp profile forbids the first and its masked /proc paths the second,
    so both are lifted. A non-root user gets its namespaces through a user namespace; root
    (uid 0, as when the workflow runs as root) needs CAP_SYS_ADMIN and CAP_NET_ADMIN for them,
    as it has natively, and gets them. The container keeps its own namespaces and (by
    default) no network.
    """
    import docker

    device_requests = (
        [docker.types.DeviceRequest(count=spec.gpus, capabilities=[["gpu"]])] if spec.gpus else None
    )
    config = client.api.create_host_config(
        binds={spec.workdir: {"bind": spec.workdir, "mode": "rw"}},
        network_mode="default" if spec.network else "none",
        security_opt=["seccomp=unconfined"],
        device_requests=device_requests,
        cap_add=ROOT_SANDBOX_CAPABILITIES if spec.user.split(":")[0] == "0" else None,
        init=True,
    )
    config["MaskedPaths"] = []
    config["ReadonlyPaths"] = []
    return config


def local_image(client, spec: ContainerSpec) -> str:
    """The image id to run: the local one if this daemon has it (by image id, by
    repository@digest or by tag), else pulled by repository@digest."""
    import docker

    for name in filter(None, (spec.digest, spec.image)):
        try:
            return client.images.get(name).id
        except docker.errors.ImageNotFound:
            continue
    try:
        return client.images.pull(spec.image).id
    except docker.errors.APIError as err:
        raise ReasonRLError(
            f"image {spec.image} is not here and cannot be pulled: {err.explanation}"
        ) from None


def run_in_container(spec: ContainerSpec, command: list[str], env: dict[str, str]) -> int:
    """Run `command` in the image and stream its output; return its exit status.

    SIGTERM/SIGINT (Snakemake cancelling the job) kill the container; it is removed either way.
    """

    client = docker_client("containers.engine docker")
    container_id = client.api.create_container(
        local_image(client, spec),
        command=command,
        working_dir=spec.workdir,
        user=spec.user,
        environment=spec.environment(env),
        host_config=host_config(client, spec),
    )["Id"]
    container = client.containers.get(container_id)

    def stop(signum, frame):
        container.kill()
        raise SystemExit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        container.start()
        for chunk in container.logs(stream=True, follow=True):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        return container.wait()["StatusCode"]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        container.remove(force=True)


def write_rule_shell(folder: Path, spec: ContainerSpec) -> Path:
    """The shell a rule's command is given to: runs `bash -c CMD` in the rule's container.

    Named `bash` so that Snakemake prefixes the command with `set -euo pipefail;` as for bash.
    """
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        sys.executable,
        "-m",
        "reasonrl.containers.runner",
        "--image",
        spec.image,
        "--workdir",
        spec.workdir,
        "--gpus",
        str(spec.gpus),
        "--user",
        spec.user,
        *(["--digest", spec.digest] if spec.digest else []),
        *(["--network"] if spec.network else []),
        "--",
        "/bin/bash",
    ]
    script = folder.resolve() / "bash"
    text = f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n'
    if not script.exists() or script.read_text() != text:
        tmp = script.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(script)
    return script


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reasonrl.containers.runner", description=__doc__
    )
    parser.add_argument("--image", required=True)
    parser.add_argument("--digest")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--network", action="store_true")
    parser.add_argument("--gpus", type=int, default=0)
    parser.add_argument("--user", default=f"{os.getuid()}:{os.getgid()}")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    spec = ContainerSpec(args.image, args.digest, args.workdir, args.network, args.gpus, args.user)
    try:
        sys.exit(run_in_container(spec, command, dict(os.environ)))
    except ReasonRLError as err:
        print(f"reasonrl: error: {err}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
