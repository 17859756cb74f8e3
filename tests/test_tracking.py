"""Experiment tracking: each training step's history entry reaches TensorBoard, W&B (offline)
or MLflow (file store), read back with each library's own reader; one run name per workflow
invocation."""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

import pytest
import torch
from tracked import COMMON, assert_one_tracking_run, event_scalars, track

from reasonrl.config import validate_config
from reasonrl.errors import ReasonRLError
from reasonrl.io import write_jsonl
from reasonrl.models import load_policy
from reasonrl.sequences import encode_trajectory, summed_logps
from reasonrl.stages._train import TrainingRun
from reasonrl.stages.sft import sft
from reasonrl.tasks import build_problems
from reasonrl.tracking import (
    ENV_VAR,
    TrackingSettings,
    open_tracker,
    settings_from_environment,
    workflow_environment,
)
from reasonrl.training.loop import LoopSettings
from reasonrl.training.preference import LossSettings, PreferenceBatches, PreferenceObjective

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def sft_inputs(tmp_path_factory) -> tuple[dict, str, str]:
    """A config with 4 SFT steps, 16 arith problems and a tiny policy that knows their text."""
    from reasonrl.models import build_tiny_policy
    from reasonrl.stages.models import corpus_texts

    folder = tmp_path_factory.mktemp("sft-inputs")
    config = validate_config(
        {"sft": {"max_steps": 4, "batch_size": 2, "log_every": 2, "group_by_length": False}}
    )
    train, _ = build_problems("arith", {**config["tasks"]["arith"], "train_size": 16}, 0)
    write_jsonl(folder / "train.jsonl", train, schema="problem")
    settings = {**config["policy"]["tiny"], "vocab_size": 400, "hidden_size": 32}
    settings.update(intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=2)
    build_tiny_policy(corpus_texts([str(folder / "train.jsonl")]), settings, 0, folder / "base")
    return config, str(folder / "base"), str(folder / "train.jsonl")


def run_sft(sft_inputs) -> list[dict]:
    config, base, train = sft_inputs
    return sft(config, "tool", base, [train], "results/models/sft-tool")["history"]


# ---- run names -----------------------------------------------------------------------------


def test_one_run_name_per_invocation_inherited_by_its_jobs():
    config = validate_config({})
    first = json.loads(workflow_environment(config, {}))
    assert first["backend"] == "tensorboard" and first["dir"] == "logs/tracking"
    assert first["run_name"], "an empty tracking.run_name gets a name"
    # A SLURM job's Snakemake inherits the variable: it keeps the invocation's name.
    job = json.loads(workflow_environment(config, {ENV_VAR: json.dumps(first)}))
    assert job["run_name"] == first["run_name"]
    other = validate_config({"seed": 5})
    assert json.loads(workflow_environment(other, {}))["run_name"] != first["run_name"]
    named = validate_config({"tracking": {"run_name": "mine"}})
    assert json.loads(workflow_environment(named, {ENV_VAR: json.dumps(first)}))["run_name"] == (
        "mine"
    )


def test_a_malformed_tracking_variable_is_one_line_naming_it():
    with pytest.raises(ReasonRLError, match=f"environment variable {ENV_VAR}"):
        workflow_environment(validate_config({}), {ENV_VAR: '{"backend": "tensorboard"'})


@pytest.mark.workflow
def test_every_training_job_of_a_workflow_run_logs_under_one_run_name(test_run):
    assert_one_tracking_run(test_run)


def test_outside_a_workflow_nothing_is_tracked(sft_inputs, tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    monkeypatch.chdir(tmp_path)
    assert settings_from_environment(os.environ) is None
    run_sft(sft_inputs)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]


def test_a_missing_backend_package_is_one_line_naming_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    settings = TrackingSettings("wandb", str(tmp_path), "proj", "run1")
    with pytest.raises(ReasonRLError, match=r"tracking.backend wandb: .*pip install wandb"):
        open_tracker(settings, "models/sft-tool")


# ---- TensorBoard, for every method --------------------------------------------------------


def test_sft_steps_reach_tensorboard_under_run_and_job(sft_inputs, tmp_path, monkeypatch):
    root = track(monkeypatch, tmp_path, "tensorboard")
    history = run_sft(sft_inputs)
    scalars = event_scalars(root / "run1/models/sft-tool")
    assert COMMON | {"token_accuracy", "target_tokens"} <= scalars.keys()
    for key in COMMON | {"token_accuracy"}:
        assert scalars[key] == [(h["step"], pytest.approx(h[key], rel=1e-6)) for h in history], key
    assert [s for s, _ in scalars["loss"]] == [1, 2, 3, 4]
    assert all(v > 0 for _, v in scalars["tokens_per_second"])


@pytest.fixture(scope="module")
def dpo_pairs(tiny_policy):
    """Four (chosen, rejected) trajectories with cached reference log-probs."""
    _, tokenizer = load_policy(tiny_policy)
    question = {"role": "user", "content": "What is 12 + 30?"}
    answers = [("42", "41"), ("It is 42.", "7"), ("x = 42", "x = 0"), ("42!", "Maybe 3")]
    items = [
        tuple(
            encode_trajectory(tokenizer, [question, {"role": "assistant", "content": a}], True)
            for a in pair
        )
        for pair in answers
    ]
    model, _ = load_policy(tiny_policy)
    flat = [s for pair in items for s in pair]
    ref = summed_logps(model, flat, tokenizer.pad_token_id)
    return items, [(ref[2 * i], ref[2 * i + 1]) for i in range(len(items))], tokenizer


def test_dpo_margins_and_accuracies_reach_tensorboard(
    tiny_policy, dpo_pairs, tmp_path, monkeypatch
):
    root = track(monkeypatch, tmp_path, "tensorboard")
    items, reference, tokenizer = dpo_pairs
    run = TrainingRun("preference-train", "results/models/mdpo-round1", {}, [], 0)
    model, _ = run.load_policy(str(tiny_policy), "float32")
    batches = PreferenceBatches(items, 2, tokenizer.pad_token_id, 0, reference=reference)
    objective = PreferenceObjective(LossSettings("mdpo", beta=0.1))
    settings = LoopSettings(max_steps=3, lr=1e-3, checkpoint_every=100)
    history = run.fit(model, batches, objective, settings)["history"]
    scalars = event_scalars(root / "run1/models/mdpo-round1")
    assert COMMON | {"reward_margin", "reward_accuracy"} <= scalars.keys()
    assert [v for _, v in scalars["reward_margin"]] == [
        pytest.approx(h["reward_margin"], rel=1e-6) for h in history
    ]
    assert {v for _, v in scalars["reward_accuracy"]} <= {0.0, 0.5, 1.0}


def test_prm_token_accuracy_is_the_share_of_label_tokens_predicted(tiny_policy):
    from reasonrl.training.data import IGNORE
    from reasonrl.training.lm_loss import masked_lm_loss

    model, _ = load_policy(tiny_policy)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    with torch.no_grad():
        predicted = model(input_ids=ids).logits[0, :-1].argmax(-1)
    labels = torch.full_like(ids, IGNORE)
    labels[0, 2] = predicted[1]  # a label the model predicts
    labels[0, 4] = (predicted[3] + 1) % 300  # and one it does not
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    batch["num_tokens"] = torch.tensor([6])
    _, stats = masked_lm_loss(model, batch)
    assert stats["token_accuracy"] == 0.5 and stats["target_tokens"] == 2


# ---- the other backends --------------------------------------------------------------------


def wandb_records(path: Path):
    """The protobuf records of a W&B transaction log (.wandb): wandb's own Record messages
    in its LevelDB-style log (7-byte file header, 32 KiB blocks, 7-byte chunk headers)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_wandb_offline_run_holds_every_step(sft_inputs, tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    root = track(monkeypatch, tmp_path, "wandb")
    history = run_sft(sft_inputs)
    (log,) = (root / "wandb").glob("offline-run-*/run-*.wandb")
    runs, steps = [], []
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            runs.append((record.run.display_name, record.run.run_group, record.run.project))
        elif kind == "history":
            items = record.history.item  # wandb-core names a key by its nested_key path
            steps.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    assert runs[0] == ("run1/models/sft-tool", "run1", "proj")
    assert [s["_step"] for s in steps] == [h["step"] for h in history]
    for key in COMMON | {"token_accuracy"}:
        assert [s[key] for s in steps] == [pytest.approx(h[key], rel=1e-6) for h in history]


def test_mlflow_file_store_holds_every_step(sft_inputs, tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    root = track(monkeypatch, tmp_path, "mlflow")
    history = run_sft(sft_inputs)
    client = mlflow.MlflowClient(tracking_uri=(root / "mlruns").resolve().as_uri())
    experiment = client.get_experiment_by_name("proj")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run1/models/sft-tool" and run.info.status == "FINISHED"
    assert run.data.tags["reasonrl.run_name"] == "run1"
    for key in COMMON | {"token_accuracy"}:
        logged = client.get_metric_history(run.info.run_id, key)
        assert sorted((m.step, m.value) for m in logged) == [
            (h["step"], pytest.approx(h[key], rel=1e-6)) for h in history
        ], key


def test_trackio_is_no_backend():
    """trackio (0.35 to 0.43) asks for pillow<13, vLLM 0.33.0 (the GPU image) for pillow>=13:
    a config that asks for it is a schema error naming the key."""
    with pytest.raises(ReasonRLError) as raised:
        validate_config({"tracking": {"backend": "trackio"}}, "my.yaml")
    assert str(raised.value) == (
        "my.yaml: config key 'tracking.backend': 'trackio' is not one of "
        "['tensorboard', 'wandb', 'mlflow', 'none']"
    )
    settings = TrackingSettings("trackio", "logs/tracking", "proj", "run1")
    with pytest.raises(ReasonRLError, match="tracking.backend: unknown backend 'trackio'"):
        open_tracker(settings, "models/sft-tool")
