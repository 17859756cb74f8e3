"""How OpenMP's idle threads wait, on a machine shared by several torch processes: the same
training work (AdamW steps of a small Llama on fixed tokens, then short forward passes, the
shape of the suite's model stages) run by PROCESSES processes at once, each with THREADS torch
threads, once with OpenMP's default wait (spin a while, then sleep) and once with
OMP_WAIT_POLICY=PASSIVE (sleep at once). Prints each process's wall-clock, CPU time and last
loss (equal under both: the policy changes no arithmetic), alternating the policies REPEATS
times so a cold cache favours neither (docs/experiment-design.md, "OpenMP threads wait asleep
in CI").

Usage: python experiments/openmp_wait_probe.py [PROCESSES=2] [THREADS=2] [REPEATS=2]
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

STEPS = 20


def work() -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(int(os.environ["PROBE_THREADS"]))
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=300,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
    )
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 300, (16, 128), generator=torch.Generator().manual_seed(1))
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(STEPS):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.no_grad():
        for _ in range(200):  # many small operations, as in token-by-token generation
            model(input_ids=ids[:4, :8])
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return {"wall": time.monotonic() - started, "cpu": cpu, "loss": loss.item()}


def side_by_side(policy: str | None, processes: int, threads: int) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PROBE_THREADS"] = str(threads)
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    argv = [sys.executable, __file__, "--work"]
    running = [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE) for _ in range(processes)]
    return [json.loads(p.communicate()[0]) for p in running]


def main(processes: int = 2, threads: int = 2, repeats: int = 2) -> None:
    print(f"{processes} processes x {threads} torch threads on {os.cpu_count()} cores")
    print("| policy | wall s (each process) | CPU s | last loss |\n| --- | --- | --- | --- |")
    for _ in range(repeats):
        for policy in (None, "PASSIVE"):
            runs = side_by_side(policy, processes, threads)
            walls = ", ".join(f"{r['wall']:.1f}" for r in runs)
            cpus = ", ".join(f"{r['cpu']:.1f}" for r in runs)
            losses = {f"{r['loss']:.6f}" for r in runs}
            print(f"| {policy or 'default'} | {walls} | {cpus} | {', '.join(sorted(losses))} |")


if __name__ == "__main__":
    if sys.argv[1:] == ["--work"]:
        print(json.dumps(work()))
    else:
        main(*(int(a) for a in sys.argv[1:]))
