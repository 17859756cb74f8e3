"""One generation interface, several engines: Hugging Face `generate` and vLLM."""

from __future__ import annotations

from reasonrl.errors import ReasonRLError
from reasonrl.generation.engine import Completion, GenerationEngine, SamplingParams

__all__ = ["Completion", "GenerationEngine", "SamplingParams", "make_engine"]


def make_engine(kind: str, model_path: str, settings: dict, dtype: str = "float32"):
    """The engine named by the config's `generation.engine`."""
    if kind == "hf":
        from reasonrl.generation.hf import HFEngine

        return HFEngine.from_pretrained(
            model_path, settings["batch_size"], dtype, settings["prefix_cache_mb"]
        )
    if kind == "vllm":
        from reasonrl.generation.vllm_engine import VLLMEngine

        return VLLMEngine.from_pretrained(model_path, settings, dtype=dtype)
    raise ReasonRLError(f"generation.engine '{kind}' is not available in this environment")
