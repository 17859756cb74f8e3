"""The wheel carries the schemas: installed from it (not editable), the package validates an
artifact with schemas it loads as package data."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

VALIDATE = """
import sys
from pathlib import Path

import reasonrl
from reasonrl.io import read_jsonl, write_jsonl

assert Path(reasonrl.__file__).is_relative_to(sys.prefix), reasonrl.__file__
row = {"id": "arith-0", "task": "arith", "split": "test", "question": "1 + 1?", "answer": "2",
       "solutions": {}, "code": None}
write_jsonl("problems.jsonl", [row], schema="problem")
assert read_jsonl("problems.jsonl", schema="problem") == [row]
try:
    write_jsonl("bad.jsonl", [{"id": "arith-1"}], schema="problem")
except reasonrl.errors.ReasonRLError as err:
    print("rejected:", err)
"""


def test_wheel_install_validates_an_artifact_with_its_packaged_schemas(tmp_path):
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", REPO],
        check=True,
        capture_output=True,
    )
    wheel = next((tmp_path / "dist").glob("reasonrl-*.whl"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # The dependencies (jsonschema, yaml) come from this venv, appended after the fresh
    # venv's own site-packages; its editable-install hook is not loaded from there.
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [*pip, "--python", python, "install", "--no-deps", "--no-index", wheel],
        check=True,
        capture_output=True,
    )
    result = subprocess.run([python, "-c", VALIDATE], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "rejected: bad.jsonl" in result.stdout
    assert "'task' is a required property" in result.stdout
