"""One generation interface, several engines: Hugging Face `generate` and vLLM."""

from __future__ import annotations

from reasonrl.errors import ReasonRLError
from reasonrl.generation.engine import (
    Completion,
    EngineSettings,
    GenerationEngine,
    SamplingParams,
    VLLMOptions,
)

__all__ = [
    "Completion",
    "EngineSettings",
    "GenerationEngine",
    "SamplingParams",
    "VLLMOptions",
    "make_engine",
]


def make_engine(settings: EngineSettings, model_path: str, dtype: str = "float32"):
    """The engine `settings.engine` names (the config's generation.engine)."""
    if settings.engine == "hf":
        from reasonrl.generation.hf import HFEngine

        return HFEngine.from_pretrained(
            model_path, settings.batch_size, dtype, settings.prefix_cache_mb
        )
    if settings.engine == "vllm":
        from reasonrl.generation.vllm_engine import VLLMEngine

        return VLLMEngine.from_pretrained(model_path, settings.vllm, dtype=dtype)
    raise ReasonRLError(
        f"generation.engine '{settings.engine}' is not available in this environment"
    )
