"""The Hugging Face hub from here: is a model value a local folder or a hub id, and can the
hub be reached (checked in seconds: the hub client otherwise retries for about a minute)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from reasonrl.errors import ReasonRLError

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


def hub_error(name: str, reason: str) -> ReasonRLError:
    return ReasonRLError(
        f"model '{name}' is neither a local folder nor loadable from the Hugging Face hub "
        f"({reason}): download it and set policy.base to its local folder"
    )


def unreadable_weights(folder: Path) -> tuple[Path, str] | None:
    """The first safetensors file of `folder` whose header is broken (truncated, not one)."""
    from safetensors import SafetensorError, safe_open

    for file in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(file, framework="numpy"):
                pass
        except (SafetensorError, OSError) as err:
            return file, str(err).splitlines()[0]
    return None


def _cached(name: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    return isinstance(try_to_load_from_cache(name, "config.json"), str)


def check_model_value(name: str) -> None:
    """Refuse a model value that cannot load, in a second and before torch is imported: a
    local folder that does not exist or whose weights' headers are broken, a hub id that is
    not in the local cache while the hub is offline or unreachable. Shapes that do not match
    config.json are found only by loading (models.from_pretrained)."""
    folder = Path(name).expanduser()
    if folder.is_dir():
        broken = unreadable_weights(folder)
        if broken is not None:
            raise ReasonRLError(f"{broken[0]}: unreadable weights: {broken[1]}")
        return
    if names_local_path(name):
        raise ReasonRLError(f"{name}: model folder not found")
    reason = "offline" if offline() else hub_unreachable()
    if reason and not _cached(name):
        raise hub_error(name, "not on the hub, or offline?" if reason == "offline" else reason)
