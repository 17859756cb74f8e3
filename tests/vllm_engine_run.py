"""Run by .venv-vllm's python for tests/test_vllm_engine.py (vllm does not install in .venv):
the vLLM engine beside the Hugging Face engine on one policy; prints one JSON line.

    python tests/vllm_engine_run.py POLICY_DIR
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import torch

from reasonrl.generation import SamplingParams, VLLMOptions
from reasonrl.generation.hf import HFEngine
from reasonrl.generation.vllm_engine import VLLMEngine
from reasonrl.sequences import MaskedSequence

PROMPTS = ["x = 1\n" * 6, "print(3)", "y = 7", "The answer"]
OPTIONS = VLLMOptions(
    max_model_len=256, gpu_memory_utilization=0.5, cpu_kv_cache_gb=1, enforce_eager=True
)


def completions(engine, prompts: list[str], params: SamplingParams) -> list[dict]:
    return [vars(c) for c in engine.generate(prompts, params)]


def main(policy: str) -> dict:
    hf = HFEngine.from_pretrained(policy, batch_size=len(PROMPTS))
    vllm = VLLMEngine.from_pretrained(policy, OPTIONS)
    greedy = SamplingParams(max_new_tokens=24)
    sampled = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    stop = SamplingParams(max_new_tokens=24, stop=("2",))
    result = {
        "hf_greedy": completions(hf, PROMPTS, greedy),
        "vllm_greedy": completions(vllm, PROMPTS, greedy),
        "hf_stop": completions(hf, PROMPTS, stop),
        "vllm_stop": completions(vllm, PROMPTS, stop),
        "sampled": completions(vllm, PROMPTS, sampled),
        "sampled_again": completions(vllm, PROMPTS, sampled),
        "sampled_other_seed": completions(vllm, PROMPTS, replace(sampled, seed=9)),
        # Prompt i is sampled with seed + i: the second prompt alone with seed 4.
        "second_alone": completions(vllm, PROMPTS[1:2], replace(sampled, seed=4)),
    }
    seqs = [
        MaskedSequence(ids, [0] * 3 + [1] * (len(ids) - 3))
        for ids in (hf.tokenizer(p + "print(x)\n")["input_ids"] for p in PROMPTS)
    ]
    result["hf_logps"] = hf.sequence_logps(seqs)
    result["vllm_logps"] = vllm.sequence_logps(seqs)
    result["hf_token_logps"] = hf.token_logps(seqs)
    result["vllm_token_logps"] = vllm.token_logps(seqs)
    torch.manual_seed(1)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in hf.model.state_dict().items()}
    hf.load_weights(state)
    vllm.load_weights(state)
    result["hf_reloaded"] = completions(hf, PROMPTS, greedy)
    result["vllm_reloaded"] = completions(vllm, PROMPTS, greedy)
    return result


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(sys.argv[1])))
