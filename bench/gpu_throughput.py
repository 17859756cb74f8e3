"""GPU throughput of reasonrl's own engine, training loop and tool loop, with the device named.

Measures, on the GPU torch sees (or on the CPU with --device cpu):

- generation tokens/s of the Hugging Face engine (generation/hf.py, `HFEngine.generate`):
  arith test prompts in the chat template, greedy, one batch of `generation.batch_size`
  prompts at a time, every sample capped at --new-tokens. The vLLM engine is not measured
  here (see --vllm-note);
- SFT tokens/s and MFU of the training loop every trainer uses (training/loop.py's
  `TrainingLoop`, fed as stages/sft.py feeds it: `sft_samples` -> `MicroBatches` ->
  `masked_lm_loss`), bf16 weights loaded as the GPU recipes (config/gpu-*.yaml) load them and
  trained as the loop trains them (fp32 master weights, bf16 autocast), with and without
  gradient checkpointing, on packed blocks of --block-size tokens and on the config's own
  batching (16 length-grouped padded chats); beside each packed run's peak memory, what
  reasonrl.memory_plan counts for it;
- rollouts/s of the multi-turn tool loop (rollout.py `run_rollouts`, HF engine, bubblewrap
  sandbox) with config.yaml's tiny policy after config.yaml's SFT (--policy-steps steps of the
  same loop, fp32 weights), one greedy rollout per arith test problem.

Models: the tiny policies of config/test.yaml and config/config.yaml (`build_tiny_policy`), a
SmolLM2-135M-shaped Llama (the shipped GGUF's metadata: 30 layers, hidden 576, 9 heads, 3 kv
heads, intermediate 1536, vocab 49152, tied embeddings), a TinyLlama-1.1B-shaped Llama (the
shape of Rho-1B, config/gpu-async-dpo-rho-1b.yaml's policy) and a Llama-3.2-3B-shaped one (about
the largest whose full fine-tuning fits one 80 GB GPU: 16 bytes of model state per parameter
with fp32 master weights, so a 7B recipe needs ZeRO over several). The last three are randomly
initialised (throughput does not depend on the weights) and read the arith chats through
config.yaml's tiny tokenizer (ids < 2048; the model's own vocab sets the compute); untrained,
they generate until the token cap.

MFU = model FLOPs / seconds / peak bf16 dense (--peak-tflops; 989.4 for H100 and H200), where
the FLOPs of a step are 6 x (weights of every matmul, the LM head included, the input
embedding lookup not) x real tokens + 12 x layers x attention width x causal (query, key)
pairs inside each sample: the forward's 2 + 2 FLOPs per weight and per pair, the backward's
twice that. Padding and gradient checkpointing's recomputation count as no work.

    python bench/gpu_throughput.py                       # the GPU run (about 8 minutes on an H100)
    python bench/gpu_throughput.py --device cpu --quick  # smoke check with tiny sizes
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
import time
from dataclasses import dataclass

from record import append

# bf16 dense tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets, by a part of
# torch's device name; the first that matches wins (the PCIe and NVL H100s run lower clocks).
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4}
VLLM_NOTE = (
    "not measured: vLLM is not installed on the device machine, which has no network, and its "
    "wheel (with its CUDA kernels) is far over the 64 MiB that can be carried there"
)
PACKED, CONFIG_BATCHING = "packed", "config"


@dataclass(frozen=True)
class Shape:
    """A model to measure: a config file's tiny policy, or a Llama shape initialised at random."""

    name: str
    batch_size: int  # packed blocks per micro-batch
    tiny_config: str | None = None
    llama: dict | None = None


SHAPES = {
    "tiny-test": Shape("tiny-test", 16, tiny_config="config/test.yaml"),
    "tiny": Shape("tiny", 16, tiny_config="config/config.yaml"),
    "smollm2-135m": Shape(
        "smollm2-135m",
        32,
        llama={
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
        },
    ),
    "llama-1.1b": Shape(
        "llama-1.1b",
        16,
        llama={
            "vocab_size": 32000,
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "max_position_embeddings": 2048,
            "rope_theta": 10000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": False,
        },
    ),
    "llama-3b": Shape(
        "llama-3b",
        8,
        llama={
            "vocab_size": 128256,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "num_hidden_layers": 28,
            "num_attention_heads": 24,
            "num_key_value_heads": 8,
            "max_position_embeddings": 8192,
            "rope_theta": 500000.0,
            "rms_norm_eps": 1e-5,
            "tie_word_embeddings": True,
        },
    ),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke check")
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--models", help=f"comma-separated, of {', '.join(SHAPES)}")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per run")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps before them")
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, help="packed blocks per step (all models)")
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--policy-steps", type=int, help="SFT steps of the rollout policy")
    parser.add_argument("--rollout-problems", type=int, default=200)
    parser.add_argument("--sandbox-workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--peak-tflops", type=float, help="bf16 dense peak for MFU")
    parser.add_argument(
        "--cudnn-attention",
        action="store_true",
        help="let scaled_dot_product_attention use its cuDNN backend (torch's default, which "
        "reasonrl switches off on GPUs): the comparison BENCHMARKS.md records",
    )
    args = parser.parse_args()
    if args.quick:
        args.models = args.models or "tiny-test"
        args.steps, args.warmup, args.block_size = 2, 1, 128
        args.batch_size, args.prompts, args.new_tokens = 2, 4, 8
        args.policy_steps, args.rollout_problems = args.policy_steps or 3, 2
    args.models = (args.models or ",".join(SHAPES)).split(",")
    return args


def main() -> None:
    args = parse_args()
    if args.device == "cpu":  # before torch first looks for a GPU
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["ACCELERATE_USE_CPU"] = "1"
    import torch

    from reasonrl.config import load_config

    config = load_config(args.config)
    on_gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if on_gpu else "CPU"
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device), None)
    rows: list[tuple[str, str]] = [("device", device)]
    if args.cudnn_attention:
        # models.execution_device switches the backend off each time it is asked; keep it on
        torch.backends.cuda.enable_cudnn_sdp(True)
        torch.backends.cuda.enable_cudnn_sdp = lambda enabled: None
    cudnn = "allowed (torch's default)" if args.cudnn_attention else "disabled (reasonrl's default)"
    rows.append(("attention", f"scaled_dot_product_attention, cuDNN backend {cudnn}"))
    if peak:
        rows.append(("peak bf16 dense for MFU", f"{peak:g} TFLOP/s (spec sheet, no sparsity)"))
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(args, config, tmp, on_gpu, peak)
        for name in args.models:
            rows += show(bench.measure_shape(SHAPES[name]))
        rows.append(("vLLM engine generate", VLLM_NOTE))
        rows += show(bench.measure_rollouts())
    title = "GPU throughput: HF engine generation, SFT tokens/s and MFU, tool-loop rollouts"
    append(f"{title} ({device})", rows, bench.verdict(device))


class Bench:
    """The shared inputs (arith problems, the tiny tokenizer) and one method per measurement."""

    def __init__(self, args, config: dict, tmp: str, on_gpu: bool, peak: float | None):
        from reasonrl.io import write_jsonl
        from reasonrl.tasks import build_problems

        self.args, self.config, self.tmp, self.on_gpu, self.peak = args, config, tmp, on_gpu, peak
        self.train, self.test = build_problems("arith", config["tasks"]["arith"], config["seed"])
        self.train_file = f"{tmp}/train.jsonl"
        write_jsonl(self.train_file, self.train, schema="problem")
        # bf16 weights and autocast on the GPU, as config/gpu-*.yaml train; fp32 on the CPU.
        self.precision = "bf16" if on_gpu else "fp32"
        self.dtype = "bfloat16" if on_gpu else "float32"
        self.results: dict[str, float] = {}

    def tiny_folder(self, config_file: str) -> str:
        """The folder of the tiny policy of `config_file` (its own tokenizer), built once."""
        from reasonrl.config import load_config
        from reasonrl.models import build_tiny_policy
        from reasonrl.stages.models import corpus_texts

        folder = f"{self.tmp}/{config_file.replace('/', '_')}"
        if not os.path.isdir(folder):
            settings = load_config(config_file)["policy"]["tiny"]
            build_tiny_policy(corpus_texts([self.train_file]), settings, 0, folder)
        return folder

    def model(self, shape: Shape):
        """(model on the execution device, tokenizer) of `shape`, weights in self.dtype."""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        from reasonrl.models import DTYPES, execution_device, load_policy, load_tokenizer

        if shape.tiny_config:
            return load_policy(self.tiny_folder(shape.tiny_config), self.dtype)
        tokenizer = load_tokenizer(self.tiny_folder("config/config.yaml"))
        llama = LlamaConfig(
            **shape.llama,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        with torch.device(execution_device()):  # random init on the GPU: seconds, not minutes
            model = LlamaForCausalLM(llama).to(DTYPES[self.dtype])
        return model, tokenizer

    def measure_shape(self, shape: Shape) -> list[tuple[str, str]]:
        model, tokenizer = self.model(shape)
        rows = [(f"model {shape.name}", describe(model, shape))]
        rows.append(self.generation(shape.name, model, tokenizer))
        del model
        release_memory()
        batch = self.args.batch_size or shape.batch_size
        runs = [(PACKED, batch, False), (PACKED, batch, True), (CONFIG_BATCHING, 16, False)]
        for batching, batch_size, checkpointing in runs:
            model, tokenizer = self.model(shape)
            rows.append(self.sft(shape.name, model, tokenizer, batching, batch_size, checkpointing))
            del model
            release_memory()
        return rows

    def generation(self, name: str, model, tokenizer) -> tuple[str, str]:
        from reasonrl.chat import render
        from reasonrl.generation import SamplingParams
        from reasonrl.generation.hf import HFEngine
        from reasonrl.tasks import prompt_messages

        engine = HFEngine(model, tokenizer, batch_size=self.config["generation"]["batch_size"])
        prompts = [
            render(tokenizer, prompt_messages(p, "tool"), add_generation_prompt=True)
            for p in self.test[: self.args.prompts]
        ]
        params = SamplingParams(max_new_tokens=self.args.new_tokens)
        engine.generate(prompts[:2], params)  # warm-up: first-call set-up is not throughput
        started = time.perf_counter()
        completions = engine.generate(prompts, params)
        seconds = time.perf_counter() - started
        tokens = sum(c.num_tokens for c in completions)
        self.results[f"generate {name}"] = tokens / seconds
        return (
            f"HF engine generate, {name}, {self.dtype}",
            f"{tokens / seconds:,.0f} tokens/s ({len(prompts)} prompts x <= "
            f"{self.args.new_tokens} new tokens, greedy: {tokens} tokens in {seconds:.1f} s)",
        )

    def sft(
        self, name: str, model, tokenizer, batching: str, batch_size: int, checkpointing: bool
    ) -> tuple[str, str]:
        import torch

        label = (
            f"SFT {name}, "
            + (f"{batch_size} packed blocks of {self.args.block_size}" if batching == PACKED
               else f"{batch_size} length-grouped padded chats")
            + (", gradient checkpointing" if checkpointing else "")
        )  # fmt: skip
        from reasonrl.training.packed_attention import use_packed_attention

        batches = self.micro_batches(tokenizer, batching, batch_size)
        if batching == PACKED:  # as stages/sft.py trains packed rows: attention per sample
            use_packed_attention(model)
        settings = self.loop_settings(self.args.warmup + self.args.steps, checkpointing)
        try:
            seconds, history = timed_training(model, batches, settings, self.args.warmup)
        except torch.OutOfMemoryError:
            if batching != PACKED:
                return label, "out of GPU memory"
            planned = self.planned_bytes(model, batch_size, checkpointing) / 2**30
            return label, f"out of GPU memory (memory plan {planned:.1f} GiB)"
        tokens = sum(h["tokens"] for h in history)
        indices = range(self.args.warmup, self.args.warmup + self.args.steps)
        flops = training_flops(model, [batches(i) for i in indices])
        value = f"{tokens / seconds:,.0f} tokens/s"
        if self.peak:
            mfu = flops / seconds / (self.peak * 1e12)
            self.results[label] = mfu
            value += f", MFU {mfu:.1%}"
        if self.on_gpu:
            peak = torch.cuda.max_memory_allocated()
            value += f", peak memory {peak / 2**30:.1f} GiB"
            if batching == PACKED:
                planned = self.planned_bytes(model, batch_size, checkpointing)
                value += f" (memory plan {planned / 2**30:.1f} GiB: measured {peak / planned:.2f}x)"
        return label, value

    def planned_bytes(self, model, blocks: int, checkpointing: bool) -> float:
        """What reasonrl.memory_plan counts for this step on one GPU: model states (fp32
        master weights, gradients, AdamW moments) and peak activations, without the
        per-GPU overhead allowance (the CUDA context is not in max_memory_allocated)."""
        from reasonrl import memory_plan

        arch = memory_plan.from_hf_config(model.config.to_dict(), "bench")
        trained = memory_plan.Trained(
            "bf16", blocks, self.args.block_size, checkpointing=checkpointing
        )
        states = memory_plan.model_state_bytes(arch, trained, 2, 0, 1)
        return sum(states) + memory_plan.activation_bytes(arch, trained, 2)

    def micro_batches(self, tokenizer, batching: str, batch_size: int):
        from reasonrl.stages.sft import sft_samples
        from reasonrl.training.data import MicroBatches

        section = self.config["sft"]
        samples = sft_samples(tokenizer, self.train, "tool", section["max_length"])
        packing = batching == PACKED
        return MicroBatches(
            samples,
            batch_size,
            tokenizer.pad_token_id,
            self.config["seed"],
            packing,
            self.args.block_size,
            group_by_length=not packing,
        )

    def loop_settings(self, steps: int, checkpointing: bool):
        from reasonrl.training.loop import LoopSettings

        section = {**self.config["sft"], "max_steps": steps, "precision": self.precision}
        section.update(gradient_checkpointing=checkpointing, checkpoint_every=10**9)
        return LoopSettings.from_config(section, self.config["seed"])

    def measure_rollouts(self) -> list[tuple[str, str]]:
        """Train config.yaml's tiny policy with config.yaml's SFT, then time the tool loop."""
        from reasonrl.generation.hf import HFEngine
        from reasonrl.models import load_policy
        from reasonrl.training.lm_loss import masked_lm_loss
        from reasonrl.training.loop import CheckpointStore, TrainingLoop

        model, tokenizer = load_policy(self.tiny_folder("config/config.yaml"), "float32")
        section = self.config["sft"]
        steps = self.args.policy_steps or section["max_steps"]
        batches = self.micro_batches(tokenizer, CONFIG_BATCHING, section["batch_size"])
        settings = self.loop_settings(steps, False)
        loop = TrainingLoop(
            model, masked_lm_loss, settings, CheckpointStore(f"{self.tmp}/ckpt", "policy")
        )
        started = time.perf_counter()
        loop.run(batches, steps)
        seconds = time.perf_counter() - started
        model = loop.finish()["model"]
        loop.accelerator.free_memory()
        tokens = sum(h["tokens"] for h in loop.history)
        rows = [
            (
                "SFT tiny, config.yaml's sft (16 length-grouped padded chats), fp32 weights",
                f"{tokens / seconds:,.0f} tokens/s over {steps} steps (the rollout policy), "
                f"final loss {loop.history[-1]['loss']:.3f}",
            )
        ]
        engine = HFEngine(model, tokenizer, batch_size=self.config["generation"]["batch_size"])
        return rows + self.rollouts(engine)

    def rollouts(self, engine) -> list[tuple[str, str]]:
        from reasonrl.generation import SamplingParams
        from reasonrl.rollout import RolloutSettings, run_rollouts
        from reasonrl.sandbox import Sandbox, find_bwrap

        section = {**self.config["sandbox"], "workers": self.args.sandbox_workers}
        try:
            sandbox = Sandbox.from_config(section)
        except Exception as err:  # no bwrap: say so rather than run model code unsandboxed
            return [("tool-loop rollouts", f"not measured: {err}")]
        probe = sandbox.run("print(6 * 7)")
        if probe.status != "ok":
            why = f"{probe.status}: {probe.stderr.strip()[-300:]}"
            return [("tool-loop rollouts", f"not measured: bubblewrap cannot run here ({why})")]
        limits = RolloutSettings.from_config(self.config["rollout"])
        if self.args.quick:
            limits = RolloutSettings(max_turns=2, max_turn_tokens=16, max_total_tokens=32)
        params = SamplingParams(max_new_tokens=limits.max_turn_tokens)
        problems = self.test[: self.args.rollout_problems]
        run_rollouts(engine, problems[:2], "tool", 1, params, limits, sandbox)  # warm-up
        started = time.perf_counter()
        rows = run_rollouts(engine, problems, "tool", 1, params, limits, sandbox)
        seconds = time.perf_counter() - started
        self.results["rollouts/s"] = len(rows) / seconds
        turns = sum(r["num_turns"] for r in rows) / len(rows)
        cells = sum(len(r["tool_status"]) for r in rows)
        return [
            ("sandbox", f"bubblewrap ({find_bwrap()}), {sandbox.workers} workers"),
            (
                f"tool-loop rollouts, tiny policy, greedy, caps {limits.max_turns} turns x "
                f"{limits.max_turn_tokens} tokens",
                f"{len(rows) / seconds:.2f} rollouts/s ({len(rows)} in {seconds:.1f} s; "
                f"{turns:.2f} model turns and {cells / len(rows):.2f} code cells per rollout; "
                f"{sum(r['correct'] for r in rows)}/{len(rows)} correct)",
            ),
        ]

    def verdict(self, device: str) -> str:
        mfus = {k: v for k, v in self.results.items() if k.startswith("SFT")}
        parts = [f"on {device}"]
        if mfus:
            best = max(mfus, key=mfus.get)
            parts.append(f"best SFT MFU {mfus[best]:.1%} ({best.removeprefix('SFT ')})")
        parts += [
            f"HF engine {v:,.0f} tokens/s ({k.removeprefix('generate ')})"
            for k, v in self.results.items()
            if k.startswith("generate")
        ]
        if "rollouts/s" in self.results:
            parts.append(f"tool loop {self.results['rollouts/s']:.2f} rollouts/s")
        return "; ".join(parts)


def timed_training(model, batches, settings, warmup: int) -> tuple[float, list[dict]]:
    """Seconds and history of the steps after `warmup` of the loop (GPU work included)."""
    import torch

    from reasonrl.training.lm_loss import masked_lm_loss
    from reasonrl.training.loop import CheckpointStore, TrainingLoop

    with tempfile.TemporaryDirectory() as ckpt:
        loop = TrainingLoop(model, masked_lm_loss, settings, CheckpointStore(ckpt, "bench"))
        try:
            loop.run(batches, warmup)
            synchronize()
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            started = time.perf_counter()
            loop.run(batches, settings.max_steps - warmup)
            synchronize()
            return time.perf_counter() - started, loop.history[warmup:]
        finally:
            loop.finish()
            loop.accelerator.free_memory()


def training_flops(model, batches: list[dict]) -> float:
    """Model FLOPs of training on `batches`: 6 per matmul weight and real token, plus 12 per
    layer, attention channel and causal (query, key) pair inside a sample."""
    import torch

    config = model.config
    matmul_weights = sum(
        m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)
    )
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    width = config.num_attention_heads * head_dim
    tokens = pairs = 0
    for batch in batches:
        for row, real in enumerate(batch["num_tokens"].tolist()):
            # the i-th token of a sample sees i + 1 keys; packed blocks restart positions
            positions = (
                batch["position_ids"][row, :real] if "position_ids" in batch else torch.arange(real)
            )
            tokens += real
            pairs += int((positions + 1).sum())
    return 6 * matmul_weights * tokens + 12 * config.num_hidden_layers * width * pairs


def describe(model, shape: Shape) -> str:
    import torch

    config = model.config
    params = sum(p.numel() for p in model.parameters())
    matmul = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    tiny = shape.tiny_config
    origin = f"built by build_tiny_policy from {tiny}" if tiny else "random init"
    return (
        f"{params / 1e6:.1f}M parameters ({matmul / 1e6:.1f}M in matmuls), "
        f"{config.num_hidden_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_attention_heads} heads ({config.num_key_value_heads} kv), "
        f"intermediate {config.intermediate_size}, vocab {config.vocab_size}, {origin}"
    )


def show(rows: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Print rows as they are measured (a run cut short still tells what it had)."""
    for name, value in rows:
        print(f"{name}: {value}", flush=True)
    return rows


def synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release_memory() -> None:
    """Free what the last model left behind (the caller has dropped its references)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
