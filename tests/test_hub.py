"""Model values checked before torch is imported: local folders, broken weights, hub ids
that can only come from the local cache."""

from __future__ import annotations

import subprocess
import sys

import huggingface_hub.constants
import pytest

from reasonrl import hub
from reasonrl.errors import ReasonRLError
from reasonrl.hub import check_model_value

REPO_ID = "someorg/some-model"


def _cache_config_json(hf_home, repo_id: str) -> None:
    """The hub client's cache layout for one file of one revision."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The hub client reads HF_HUB_CACHE once, when it is imported.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path


def test_a_hub_id_in_the_cache_passes_offline(offline_cache, monkeypatch):
    _cache_config_json(offline_cache, REPO_ID)
    looked_up = []
    cached = hub._cached
    monkeypatch.setattr(hub, "_cached", lambda name: looked_up.append(name) or cached(name))
    check_model_value(REPO_ID)  # raises unless the offline check found the cached config.json
    assert looked_up == [REPO_ID]
    assert cached(REPO_ID)


def test_a_hub_id_not_in_the_cache_is_refused_offline(offline_cache):
    with pytest.raises(ReasonRLError, match="neither a local folder nor loadable"):
        check_model_value(REPO_ID)


def test_a_missing_local_folder_is_refused(tmp_path):
    with pytest.raises(ReasonRLError, match="model folder not found"):
        check_model_value(str(tmp_path / "no-such-model"))


def test_a_truncated_weights_file_is_named(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(ReasonRLError, match=r"model\.safetensors: unreadable weights"):
        check_model_value(str(tmp_path))


def test_the_check_imports_neither_torch_nor_transformers(tmp_path):
    code = (
        "import sys\n"
        "from reasonrl.errors import ReasonRLError\n"
        "from reasonrl.hub import check_model_value\n"
        f"try: check_model_value({str(tmp_path / 'missing')!r})\n"
        "except ReasonRLError: pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
