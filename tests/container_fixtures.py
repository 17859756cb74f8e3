"""The session's Docker daemon, CPU image, local registry and the image published to it and
pulled back by digest: fixtures of tests/test_containers.py and of tests/test_slurm.py's
cluster run (which runs every rule in the pulled image), registered by tests/conftest.py as a
pytest plugin so that both modules share one of each per session.

`make test-deps` installs docker.io, debootstrap, docker-registry and skopeo (as root); the
session starts dockerd when none answers and stops it again. Without them the fixtures skip
naming what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_registry import LocalRegistry

from reasonrl.containers.daemon import docker_client
from reasonrl.containers.lock import StageImage, load_lock
from reasonrl.errors import ReasonRLError

VENV_BIN = Path(sys.executable).parent


def _docker_answers() -> bool:
    try:
        docker_client("test")
        return True
    except ReasonRLError:
        return False


@pytest.fixture(scope="session")
def docker_daemon():
    """A Docker daemon that answers; started here (and stopped after) if none does. The
    session's dangling images are pruned after it."""
    if _docker_answers():
        yield
        _prune_dangling_images()
        return
    dockerd = shutil.which("dockerd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
    if dockerd is None or os.geteuid() != 0:
        pytest.skip("no Docker daemon: `make test-deps` installs docker.io (as root)")
    log = open(Path("/tmp") / f"reasonrl-dockerd-{os.getpid()}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen([dockerd], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while not _docker_answers():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"dockerd did not come up; see {log.name}")
        time.sleep(0.5)
    yield
    _prune_dangling_images()
    process.terminate()
    process.wait(timeout=30)
    log.close()


def _prune_dangling_images() -> None:
    """Untagged images are what a failed or superseded build leaves: gigabytes a session
    would otherwise hand to the next one on the same disk."""
    docker_client("pruning dangling images").images.prune(filters={"dangling": True})


@pytest.fixture(scope="session")
def cpu_image(docker_daemon, tmp_path_factory) -> Path:
    """The CPU image built from a local debootstrap base; returns a lock that pins it."""
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap missing: `make test-deps` installs it (as root)")
    lock = tmp_path_factory.mktemp("lock") / "images.lock.yaml"
    command = [str(VENV_BIN / "reasonrl"), "containers", "build", "--local-base"]
    result = subprocess.run(
        [*command, "--image", "cpu", "--write-lock", str(lock)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return lock


@pytest.fixture(scope="session")
def local_registry(tmp_path_factory):
    """Debian's docker-registry on 127.0.0.1 (a free port), stopped after the session."""
    if shutil.which("docker-registry") is None or shutil.which("skopeo") is None:
        pytest.skip("docker-registry or skopeo missing: `make test-deps` installs them (as root)")
    registry = LocalRegistry(tmp_path_factory.mktemp("registry")).start()
    yield registry
    registry.stop()


@pytest.fixture(scope="session")
def published_cpu_image(cpu_image, local_registry, tmp_path_factory) -> Path:
    """The CPU image of the session, taken (not rebuilt) and pushed by `containers publish`;
    returns the lock it pinned it in."""
    lock = tmp_path_factory.mktemp("published") / "images.lock.yaml"
    shutil.copy(cpu_image, lock)
    command = [str(VENV_BIN / "reasonrl"), "containers", "publish", "--local-base"]
    registry = f"{local_registry.host}/reasonrl"
    started = time.monotonic()
    result = subprocess.run(
        [*command, "--registry", registry, "--lock", str(lock)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "building" not in result.stderr  # the session's image, taken as it is
    print(f"containers publish: {time.monotonic() - started:.0f} s; {result.stdout.strip()}")
    return lock


@pytest.fixture(scope="session")
def pulled_cpu_image(published_cpu_image) -> StageImage:
    """The published image removed here (every tag) and pulled back by the lock's digest."""
    import docker

    image = load_lock(published_cpu_image).stage_image("cpu")
    client = docker_client("test")
    client.images.remove(image.image_id, force=True)
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(image.image_id)
    started = time.monotonic()
    pulled = client.images.pull(image.pinned)
    print(f"pull by digest: {time.monotonic() - started:.0f} s")
    assert pulled.id == image.image_id  # the same image config, so the same image id
    assert image.pinned in pulled.attrs["RepoDigests"]
    return image


@pytest.fixture(scope="session")
def docker_account(docker_daemon, ordinary_account):
    """The ordinary account (tests/ordinary_user.py) in the docker group, so that the Docker
    runner it starts (a rule's shell under containers.engine docker) reaches the daemon."""
    name = ordinary_account.name
    subprocess.run(["usermod", "--append", "--groups", "docker", name], check=True)
    return ordinary_account
