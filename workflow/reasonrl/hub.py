"""The Hugging Face hub from here: is a model value a local folder or a hub id, and can the
hub be reached (checked in seconds: the hub client otherwise retries for about a minute)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

PROBE_TIMEOUT_S = 1.5


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").upper() in {"1", "ON", "YES", "TRUE"}


def hub_unreachable() -> str | None:
    """Why the hub cannot be reached (None if it can). Offline mode skips the check: the
    hub client then reads only its local cache, without retries."""
    if offline():
        return None
    endpoint = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as err:
        return f"{host} unreachable: {err}; set HF_HUB_OFFLINE=1 to use a cached copy"
    return None


def names_local_path(name: str) -> bool:
    """Whether a model value (policy.base, --model ...) names a local folder, not a hub id.

    A hub id is `name` or `org/name`; anything that starts like a path (/ . ~), has more
    than one slash, or whose first part is a local folder (`models/x` where ./models exists,
    `results/...`) is a path.
    """
    if name.startswith(("/", ".", "~")) or name.count("/") > 1:
        return True
    first = name.split("/", 1)[0]
    return "/" in name and (first == "results" or Path(first).is_dir())
