"""Stage CLIs on tiny inputs: data, tiny policy, SFT (kill and resume), bad inputs."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from reasonrl.io import read_json, read_jsonl

CONFIG = {
    "seed": 1,
    "policy": {
        "tiny": {
            "vocab_size": 400,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_layers": 2,
            "num_heads": 2,
            "num_kv_heads": 2,
            "max_position_embeddings": 512,
        }
    },
    "tasks": {"arith": {"kind": "arith", "train_size": 120, "test_size": 10}},
    "sft": {"max_steps": 150, "batch_size": 4, "block_size": 256, "checkpoint_every": 10},
}


def reasonrl(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "reasonrl.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=check, **kwargs)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("stages")
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    cfg = str(root / "config.yaml")
    reasonrl("make-data", "--config", cfg, "--task", "arith", "--out-dir", str(root / "data"))
    reasonrl(
        "build-tiny", "--config", cfg, "--corpus", str(root / "data/train.jsonl"),
        "--out", str(root / "base"),
    )  # fmt: skip
    return root


def sft_args(root: Path, out: str) -> list[str]:
    return [
        "sft", "--config", str(root / "config.yaml"), "--style", "tool",
        "--model", str(root / "base"), "--train", str(root / "data/train.jsonl"),
        "--out", str(root / out),
    ]  # fmt: skip


def test_make_data_is_byte_identical_on_rerun(workdir, tmp_path):
    reasonrl(
        "make-data", "--config", str(workdir / "config.yaml"), "--task", "arith",
        "--out-dir", str(tmp_path),
    )  # fmt: skip
    for name in ("train.jsonl", "test.jsonl"):
        assert (tmp_path / name).read_bytes() == (workdir / "data" / name).read_bytes()
    manifest = read_json(workdir / "data/manifest.json")
    assert manifest["stage"] == "make-data" and manifest["seed"] == 1
    assert len(read_jsonl(workdir / "data/train.jsonl", schema="problem")) == 120


def test_make_pool_writes_the_consumers_problems_and_names_an_undeclared_pool(tmp_path):
    config = {
        **CONFIG,
        "tasks": {"arith": {**CONFIG["tasks"]["arith"], "pools": {"preference": 30}}},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    common = ("--config", str(tmp_path / "config.yaml"), "--task", "arith")
    reasonrl("make-pool", *common, "--pool", "preference", "--out-dir", str(tmp_path / "pool"))
    rows = read_jsonl(tmp_path / "pool/problems.jsonl", schema="problem")
    assert len(rows) == 30 and rows[0]["id"] == "arith-pool-preference-00000"
    assert read_json(tmp_path / "pool/manifest.json")["stage"] == "make-pool"
    missing = reasonrl(
        "make-pool", *common, "--pool", "online", "--out-dir", str(tmp_path / "x"), check=False
    )
    assert missing.returncode != 0
    assert (
        "config key 'tasks.arith.pools' has no pool 'online'"
        in missing.stderr.strip().splitlines()[-1]
    )


def test_tiny_policy_is_small_and_has_a_manifest(workdir):
    manifest = read_json(workdir / "base/manifest.json")
    assert 0 < manifest["parameters"] < 5_000_000
    assert set(manifest["inputs"]) == {str(workdir / "data/train.jsonl")}
    assert (workdir / "base/tokenizer.json").exists()


def test_sft_killed_midway_resumes_from_its_checkpoint(workdir):
    whole = reasonrl(*sft_args(workdir, "sft-whole"))
    assert whole.returncode == 0
    reference = read_json(workdir / "sft-whole/metrics.json")

    proc = subprocess.Popen(
        [sys.executable, "-m", "reasonrl.cli", *sft_args(workdir, "sft-killed")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    ckpt = workdir / ".sft-killed.ckpt"
    deadline = time.time() + 120
    while not list(ckpt.glob("step-*")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "SFT finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (workdir / "sft-killed").exists()  # nothing that looks finished
    last = max(int(p.name.split("-")[1]) for p in ckpt.glob("step-*"))

    reasonrl(*sft_args(workdir, "sft-killed"))
    resumed = read_json(workdir / "sft-killed/metrics.json")
    assert resumed["resumed_from"] == last > 0
    assert resumed["steps"] == reference["steps"] == 150
    # Same data position, RNG and optimizer state: the loss curve continues exactly.
    assert resumed["final_loss"] == pytest.approx(reference["final_loss"], abs=1e-5)
    assert not ckpt.exists()  # checkpoints are removed once the output is complete


def test_sft_metrics_identical_on_rerun(workdir):
    reasonrl(*sft_args(workdir, "sft-again"))
    first = read_json(workdir / "sft-whole/metrics.json")
    again = read_json(workdir / "sft-again/metrics.json")
    assert [h["loss"] for h in again["history"]] == [h["loss"] for h in first["history"]]
    manifest = read_json(workdir / "sft-again/manifest.json")
    for key in ("config", "inputs", "versions", "seed", "wall_seconds", "peak_memory_mb"):
        assert key in manifest


def test_malformed_jsonl_names_file_and_line(workdir, tmp_path):
    bad = tmp_path / "train.jsonl"
    lines = (workdir / "data/train.jsonl").read_text().splitlines()
    bad.write_text("\n".join([lines[0], lines[1][:-5], lines[2]]) + "\n")
    args = sft_args(workdir, "unused")
    args[args.index("--train") + 1] = str(bad)
    result = reasonrl(*args, check=False)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"reasonrl: error: {bad}:2: malformed JSON")


def test_missing_model_folder_is_one_line(workdir):
    args = sft_args(workdir, "unused")
    args[args.index("--model") + 1] = str(workdir / "no-such-model")
    result = reasonrl(*args, check=False)
    assert result.returncode == 2
    missing = workdir / "no-such-model"
    assert result.stderr.strip() == f"reasonrl: error: {missing}: model folder not found"


def test_hub_id_offline_is_one_line(workdir):
    args = sft_args(workdir, "unused")
    args[args.index("--model") + 1] = "someorg/some-model"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = reasonrl(*args, check=False, env=env)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "someorg/some-model" in lines[0] and "local folder" in lines[0]


def test_unknown_config_key_is_named(tmp_path):
    (tmp_path / "c.yaml").write_text("sft:\n  learning_rate: 0.1\n")
    result = reasonrl(
        "make-data", "--config", str(tmp_path / "c.yaml"), "--task", "arith",
        "--out-dir", str(tmp_path / "d"), check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown config key 'sft.learning_rate'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_sft_epochs_set_the_steps_from_the_data(workdir, tmp_path):
    config = {**CONFIG, "sft": {**CONFIG["sft"], "epochs": 0.5, "checkpoint_every": 1000}}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    for name in ("base", "data"):
        (tmp_path / name).symlink_to(workdir / name)
    reasonrl(*sft_args(tmp_path, "sft-epochs"))
    metrics = read_json(tmp_path / "sft-epochs/metrics.json")
    # half a pass over the samples (length-grouped, unpacked), 4 per step, one process
    assert metrics["steps"] == round(0.5 * metrics["num_micro_batch_items"] / 4) != 150
