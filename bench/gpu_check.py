"""The default DAG's main path on one GPU, its figures beside the memory plan's (issue 49).

Runs, in a fresh folder, config/config.yaml with bench/gpu-check.yaml over it (bf16 policy;
vLLM evaluation where vllm is installed) through snakemake for TARGETS: SFT, one M-DPO round
(its sampling, labelling, cached reference and training) and the frontier evaluation of both
policies, 15 jobs. Then it reads each job's manifest and prints, per job, the wall-clock, the
peak host memory and torch's peak GPU memory beside what `reasonrl plan` predicts for its rule
on one GPU; the SFT run's tokens/s and MFU (6 x parameters FLOPs per token, against the device's
bf16 dense peak); and the generation tokens/s of the Hugging Face and vLLM engines on the SFT
policy (the same greedy prompts). The figures are appended to BENCHMARKS.md with the device
named.

    make gpu-check                       # on a GPU (meant to end within 8 minutes); dry without
    python bench/gpu_check.py --dry-run  # anywhere: the jobs it would run, the plan it compares

The dry form, which `make gpu-check` runs where torch sees no GPU, runs no job: it prints
snakemake's dry run of the targets and the plan's prediction for their rules, and fails
unless SFT's, the M-DPO round's and the evaluation's rules have one. It has not yet run on a
GPU (no device was lent to the session that wrote it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OVERLAY = REPO / "bench/gpu-check.yaml"
TARGETS = (
    "results/models/mdpo-round1",
    "results/eval/sft-tool/arith3/metrics.json",
    "results/eval/mdpo-round1/arith3/metrics.json",
)
# bf16 dense tensor-core peaks (TFLOP/s, no sparsity) from NVIDIA's data sheets, by a part of
# torch's device name; the first that matches wins (bench/gpu_throughput.py's table).
PEAK_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100 NVL": 835.0, "H100": 989.4, "H200": 989.4}
MIB = 2**20


def engine() -> str:
    """The evaluation's engine: vLLM where it is installed, else the Hugging Face one."""
    return "vllm" if importlib.util.find_spec("vllm") else "hf"


def configfiles(workdir: Path) -> list[str]:
    """config.yaml, the overlay, and the engine's overlay (written into `workdir`)."""
    chosen = workdir / "engine.yaml"
    chosen.write_text(f"generation:\n  engine: {engine()}\n")
    return [str(REPO / "config/config.yaml"), str(OVERLAY), str(chosen)]


def snakemake(workdir: Path, *extra: str) -> subprocess.CompletedProcess:
    """snakemake over the repository's Snakefile in `workdir`, for TARGETS."""
    command = [
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile",
        str(REPO / "Snakefile"),
    ]
    command += ["--directory", str(workdir), "--cores", "all"]
    command += ["--configfile", *configfiles(workdir), *extra, *TARGETS]
    return subprocess.run(command, capture_output=True, text=True, check=False)


def predictions(rules: set[str]) -> dict[str, float]:
    """GiB per GPU the memory plan predicts for each of `rules` on one 80 GB GPU."""
    import reasonrl.memory_plan as mp
    from reasonrl.config import load_workflow_config

    config = load_workflow_config([str(REPO / "config/config.yaml"), str(OVERLAY)])
    placements = {rule: mp.placement(rule, {"gpu": 1}) for rule in rules}
    plans = mp.plan_config(config, placements)
    return {p.rule: p.total / 2**30 for p in plans if p.rule in rules}


def stage_rows(workdir: Path) -> list[dict]:
    """One row per job of the run: its stage's manifest under results/, its rule's name."""
    rows = []
    for path in sorted((workdir / "results").rglob("manifest.json")):
        manifest = json.loads(path.read_text())
        rows.append({
            "folder": str(path.parent.relative_to(workdir)),
            "rule": manifest["stage"].replace("-", "_"),
            "seconds": manifest["wall_seconds"],
            "host_mb": manifest["peak_memory_mb"],
            "gpu_mb": manifest.get("peak_gpu_memory_mb"),
        })  # fmt: skip
    return rows


def job_table(rows: list[dict], planned: dict[str, float]) -> list[tuple[str, str]]:
    """The per-job rows of the report: wall-clock, peaks, and the plan's prediction."""
    table = []
    for row in rows:
        gpu = row["gpu_mb"]
        plan = planned.get(row["rule"])
        measured = "no GPU" if gpu is None else f"{gpu / 1024:.2f} GiB"
        if gpu is not None and plan:
            measured += f" (plan {plan:.2f} GiB: measured {gpu / 1024 / plan:.2f}x)"
        elif plan is not None:
            measured += f" (plan {plan:.2f} GiB)"
        value = f"{row['seconds']:.1f} s, host {row['host_mb'] / 1024:.2f} GiB, GPU {measured}"
        table.append((f"{row['rule']} ({row['folder']})", value))
    return table


def sft_mfu(workdir: Path, device: str) -> tuple[str, str]:
    """The SFT run's tokens/s and MFU: 6 x parameters FLOPs per token over the bf16 peak."""
    from reasonrl.models import load_policy

    metrics = json.loads((workdir / "results/models/sft-tool/metrics.json").read_text())
    params = sum(
        p.numel() for p in load_policy(workdir / "results/models/sft-tool")[0].parameters()
    )
    rate = metrics["tokens_per_second"]
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in device), None)
    mfu = f", MFU {6 * params * rate / (peak * 1e12):.2%}" if peak else " (no peak known)"
    return "SFT tokens/s", f"{rate:,.0f}{mfu} ({params / 1e6:.1f}M parameters)"


def generation_rates(workdir: Path, prompts: int = 128) -> list[tuple[str, str]]:
    """Greedy tokens/s of the HF and (where installed) vLLM engines on the SFT policy."""
    sys.path.insert(0, str(REPO / "bench"))
    from generation_engines import timed

    from reasonrl.chat import render
    from reasonrl.config import load_workflow_config
    from reasonrl.generation import EngineSettings, SamplingParams
    from reasonrl.generation.hf import HFEngine
    from reasonrl.io import read_jsonl
    from reasonrl.tasks import prompt_messages

    config = load_workflow_config([str(REPO / "config/config.yaml"), str(OVERLAY)])
    model = str(workdir / "results/models/sft-tool")
    settings = EngineSettings.from_section(config["generation"])
    hf = HFEngine.from_pretrained(model, batch_size=settings.batch_size)
    problems = read_jsonl(next((workdir / "results/data").rglob("test.jsonl")), schema="problem")
    texts = [
        render(hf.tokenizer, prompt_messages(p, "tool"), add_generation_prompt=True)
        for p in problems[:prompts]
    ]
    params = SamplingParams(max_new_tokens=128)
    seconds, tokens, _ = timed(hf, texts, params)
    rows = [("HF engine generate tokens/s", f"{tokens / seconds:,.0f} ({len(texts)} prompts)")]
    del hf
    try:
        from reasonrl.generation.vllm_engine import VLLMEngine

        vllm = VLLMEngine.from_pretrained(model, settings.vllm)
    except ImportError as err:
        return [*rows, ("vLLM engine generate tokens/s", f"not measured: {err}")]
    seconds, tokens, _ = timed(vllm, texts, params)
    return [*rows, ("vLLM engine generate tokens/s", f"{tokens / seconds:,.0f}")]


def dry_run() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        done = snakemake(Path(tmp), "-n")
    print(done.stdout + done.stderr)
    if done.returncode:
        return done.returncode
    stats = done.stdout[done.stdout.index("Job stats:") :]
    rules = {line.split()[0] for line in stats.splitlines()[3:] if line.split()[1:2] != []}
    rules -= {"total"}
    planned = predictions(rules)
    for rule in sorted(planned):
        print(f"plan: {rule} {planned[rule]:.2f} GiB per GPU on one 80 GB GPU")
    return 0 if planned.keys() >= {"sft", "preference_train", "evaluate"} else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the jobs and the plan")
    parser.add_argument("--workdir", type=Path, help="where the run's results go (a temp folder)")
    args = parser.parse_args()
    import torch

    if args.dry_run or not torch.cuda.is_available():
        print("bench/gpu_check.py: the dry form (no GPU, or --dry-run)", flush=True)
        sys.exit(dry_run())
    device = torch.cuda.get_device_name()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    start = time.perf_counter()
    done = snakemake(workdir)
    if done.returncode:
        sys.exit(f"the run failed:\n{done.stderr[-4000:]}")
    minutes = (time.perf_counter() - start) / 60
    rows = stage_rows(workdir)
    table = [("device", device), ("evaluation engine", engine())]
    table += [("DAG wall-clock (15 jobs)", f"{minutes:.1f} min")]
    table += job_table(rows, predictions({row["rule"] for row in rows}))
    table += [sft_mfu(workdir, device), *generation_rates(workdir)]

    from record import append

    append(
        f"GPU check: the default DAG's main path ({device})",
        table,
        f"on {device}: SFT, an M-DPO round and two evaluations in {minutes:.1f} minutes",
    )


if __name__ == "__main__":
    main()
