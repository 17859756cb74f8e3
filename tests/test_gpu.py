"""On a GPU machine, models run on the GPU: loading, generation, reference log-probs, scoring.

Skipped where torch sees no GPU (CI); run them on a GPU machine with `pytest tests/test_gpu.py`.
"""

import pytest
import torch

from reasonrl.generation import SamplingParams
from reasonrl.generation.hf import HFEngine
from reasonrl.models import load_policy
from reasonrl.rewards.scoring import bt_scores
from reasonrl.sequences import MaskedSequence, summed_logps, token_logps

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_load_policy_places_the_model_on_the_gpu(tiny_policy):
    model, _ = load_policy(tiny_policy)
    assert model.device.type == "cuda"


def test_hf_engine_generates_on_the_gpu_as_on_the_cpu(tiny_policy):
    engine = HFEngine.from_pretrained(str(tiny_policy), batch_size=2)
    params = SamplingParams(max_new_tokens=12)
    prompts = ["x = 12 + 30\n", "The answer"]
    on_gpu = [c.text for c in engine.generate(prompts, params)]
    engine.model.cpu()
    assert on_gpu == [c.text for c in engine.generate(prompts, params)]


def test_reference_and_token_logps_run_on_the_gpu(tiny_policy):
    model, tokenizer = load_policy(tiny_policy)
    ids = tokenizer("x = 12 + 30\nprint(x)")["input_ids"]
    seqs = [MaskedSequence(ids, [0] * 3 + [1] * (len(ids) - 3))]
    summed = summed_logps(model, seqs, tokenizer.pad_token_id)
    per_token = token_logps(model, seqs, tokenizer.pad_token_id)
    assert summed[0] == pytest.approx(sum(per_token[0]), rel=1e-5)


def test_bt_scores_run_on_the_gpu(tiny_policy):
    from transformers import AutoModelForSequenceClassification

    _, tokenizer = load_policy(tiny_policy)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_policy, num_labels=1).cuda()
    model.config.pad_token_id = tokenizer.pad_token_id
    assert len(bt_scores(model, tokenizer, ["x = 1", "The answer is 42."])) == 2
