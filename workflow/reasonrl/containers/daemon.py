"""The Docker daemon's client, opened the same way by every container command and test."""

from __future__ import annotations

from reasonrl.errors import ReasonRLError

# docker-py's default is 60 s a request. Beside training runs on a 2-core machine, removing an
# image's ~3 GB of layers took longer (CI, 2026-11-29: a read timeout on DELETE /images); a
# pull, a push or a build's context upload can too. A dead daemon still fails at once: its
# socket refuses the connection.
REQUEST_TIMEOUT_S = 900


def docker_client(purpose: str):
    """A docker-py client of the local daemon that has answered a ping; one line naming
    `purpose` (the command or setting that needs Docker) if no daemon answers."""
    import docker

    try:
        client = docker.from_env(timeout=REQUEST_TIMEOUT_S)
        client.ping()
    except docker.errors.DockerException as err:
        raise ReasonRLError(f"{purpose}: cannot reach the Docker daemon: {err}") from None
    return client
