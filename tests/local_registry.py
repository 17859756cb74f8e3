"""A real image registry (Debian's docker-registry, the CNCF distribution registry) on
127.0.0.1 with a free port, its storage in one folder.

It runs in the foreground as a child of the test process (no system service, no system
config touched) and speaks plain HTTP: Docker trusts 127.0.0.0/8 as an insecure registry by
default, and skopeo is told `--tls-verify=false`.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from slurm_cluster import _free_port

from reasonrl.containers.daemon import docker_client
from reasonrl.errors import ReasonRLError


class LocalRegistry:
    """docker-registry serving `root`/storage at 127.0.0.1:port."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.port = _free_port()
        self.process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30) -> LocalRegistry:
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {self.root / 'storage'}}}, "
            "delete: {enabled: true}}\n"
            f"http: {{addr: '{self.host}'}}\n"
        )
        log = open(self.root / "registry.log", "wb")  # noqa: SIM115 (owned by the child)
        self.process = subprocess.Popen(
            [shutil.which("docker-registry") or "docker-registry", "serve", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout
        while not self._answers():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                text = (self.root / "registry.log").read_text()[-2000:]
                raise RuntimeError(f"docker-registry did not come up on {self.host}:\n{text}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        """Stops the registry and removes every local reference named after it: each
        session's pushed and pulled image is ~3 GB, and kept references filled the CI
        machine's disk."""
        self.remove_local_tags()
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def remove_local_tags(self) -> list[str]:
        """Removes the local Docker references named `<host>/...`, tags and the digest
        references an image pulled by digest carries instead of a tag; returns them."""
        try:
            client = docker_client("removing the registry's references")
        except ReasonRLError:
            return []  # no daemon, nothing tagged
        images = client.images.list()
        references = [
            reference
            for image in images
            for reference in [*image.tags, *image.attrs.get("RepoDigests", [])]
            if reference.startswith(f"{self.host}/")
        ]
        for reference in references:
            client.images.remove(reference)
        return references

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False
