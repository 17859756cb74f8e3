"""The generation interface every engine implements: sampling settings, completions, and the
engine protocol (generate, behaviour log-probs, live weight updates)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Literal, Protocol


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 512
    stop: tuple[str, ...] = field(default_factory=tuple)  # cut the text before the first stop
    seed: int = 0

    @classmethod
    def from_section(cls, section: dict, seed: int) -> SamplingParams:
        """A config section's sampling: its `temperature` and `top_p`, and its
        `max_new_tokens` where it has one (else the default)."""
        sampling = {"temperature": section["temperature"], "top_p": section["top_p"]}
        if "max_new_tokens" in section:
            sampling["max_new_tokens"] = section["max_new_tokens"]
        return cls(**sampling, seed=seed)


@dataclass(frozen=True)
class VLLMOptions:
    """The vllm engine's LLM options (generation.vllm)."""

    max_model_len: int | None = None  # the model's own limit
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_gb: int = 2
    enforce_eager: bool = False


@dataclass(frozen=True)
class EngineSettings:
    """The config's generation section, typed once at a stage: which engine, its batch and
    prefix cache (hf), its LLM options (vllm), and the shard size of a generation stage."""

    engine: str = "hf"  # hf or vllm
    batch_size: int = 128
    prefix_cache_mb: int = 1024
    shard_size: int = 256
    vllm: VLLMOptions = field(default_factory=VLLMOptions)

    @classmethod
    def from_section(cls, section: dict) -> EngineSettings:
        return cls(
            engine=section["engine"],
            batch_size=section["batch_size"],
            prefix_cache_mb=section["prefix_cache_mb"],
            shard_size=section["shard_size"],
            vllm=VLLMOptions(**section["vllm"]),
        )


@dataclass(frozen=True)
class Completion:
    text: str
    num_tokens: int
    finish_reason: Literal["eos", "stop", "length"]
    # The sampled token ids, the end-of-turn token included when the model wrote it: the text
    # is their lossy decoding (special tokens dropped, invalid bytes replaced, cut at a stop
    # string), so scoring what was sampled needs the ids themselves.
    token_ids: tuple[int, ...] = ()


class GenerationEngine(Protocol):
    tokenizer: object

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        """Complete each rendered prompt; results in prompt order."""
        ...

    def conversation(self, calls: int = 1) -> AbstractContextManager:
        """A scope whose generate calls continue each other (a multi-turn rollout: each
        prompt extends a prompt of one of the last `calls` calls and its completion, the
        weights stay fixed), so an engine may reuse the shared prefixes' key/value states
        instead of encoding them again. The tool loop's waves take turns: `calls` is their
        number."""
        ...

    def sequence_logps(self, seqs: list) -> list[float]:
        """Summed log-probs of each MaskedSequence's masked tokens under the current weights
        (the online trainers' behaviour log-probs)."""
        ...

    def load_weights(self, state_dict: dict) -> None:
        """Update the running engine's policy weights (no restart): the online trainers'
        learner -> generator path."""
        ...
