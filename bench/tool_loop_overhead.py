"""Tool-loop overhead: trajectory tokens/s of the multi-turn loop vs plain `generate`.

Both run the same prompts with the same engine and greedy decoding; plain `generate` makes
one model turn per prompt, the loop makes as many as the policy needs and runs its code. The
loop runs three times: with the turns' key/value states kept (generation.prefix_cache_mb, so
a turn encodes only its new tokens), without (each turn re-encodes the whole conversation),
and with kept states in two waves (rollout.waves: one wave's cells run while the other
generates), each wave generating half the batch. Then one wave vs two where generation
leaves the host's CPU to the cells, as a GPU engine does (HostIdleEngine, a timed stand-in
for the GPU this machine lacks): 64 trajectories of three CPU-bound cells each.
Needs a trained tool-integrated policy (`make run` makes results/models/sft-tool).

    python bench/tool_loop_overhead.py [--model results/models/sft-tool] [--problems N]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time

from record import append

from reasonrl.chat import render
from reasonrl.config import load_config
from reasonrl.generation import Completion, SamplingParams
from reasonrl.generation.hf import HFEngine
from reasonrl.io import read_jsonl
from reasonrl.rollout import RolloutSettings, run_rollouts
from reasonrl.sandbox import Sandbox
from reasonrl.tasks import prompt_messages


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--model", default="results/models/sft-tool")
    parser.add_argument("--data", default="results/data/arith/test.jsonl")
    parser.add_argument("--problems", type=int, default=128)
    args = parser.parse_args()
    config = load_config(args.config)
    problems = read_jsonl(args.data, schema="problem")[: args.problems]
    engine = HFEngine.from_pretrained(args.model, batch_size=config["generation"]["batch_size"])
    limits = RolloutSettings.from_config(config["rollout"])
    params = SamplingParams(max_new_tokens=limits.max_turn_tokens)
    prompts = [render(engine.tokenizer, prompt_messages(p, "tool"), True) for p in problems]

    engine.generate(prompts[:2], params)  # warm-up outside the clock
    started = time.perf_counter()
    plain = engine.generate(prompts, params)
    plain_seconds = time.perf_counter() - started
    plain_rate = sum(c.num_tokens for c in plain) / plain_seconds

    sandbox = Sandbox.from_config(config["sandbox"])
    engine.prefix_cache_bytes = 0
    started = time.perf_counter()
    rows = run_rollouts(engine, problems, "tool", 1, params, limits, sandbox)
    unkept_rate = sum(r["num_tokens"] for r in rows) / (time.perf_counter() - started)
    engine.prefix_cache_bytes = config["generation"]["prefix_cache_mb"] * 2**20
    generating = _time_calls(engine, "generate")
    started = time.perf_counter()
    kept_rows = run_rollouts(engine, problems, "tool", 1, params, limits, sandbox)
    loop_seconds = time.perf_counter() - started
    loop_rate = sum(r["num_tokens"] for r in kept_rows) / loop_seconds
    in_generate = generating[0]
    assert [r["messages"] for r in kept_rows] == [r["messages"] for r in rows]
    overhead = 1 - loop_rate / plain_rate
    waved = dataclasses.replace(limits, waves=2)
    started = time.perf_counter()
    waved_rows = run_rollouts(engine, problems, "tool", 1, params, waved, sandbox)
    waved_seconds = time.perf_counter() - started
    waved_rate = sum(r["num_tokens"] for r in waved_rows) / waved_seconds
    # Other batches pad differently: greedy text may differ where logits nearly tie.
    same = sum(a["messages"] == b["messages"] for a, b in zip(waved_rows, rows, strict=True))
    idle, idle_speedup = _waves_beside_an_idle_host(
        engine.tokenizer, problems[:64], limits, sandbox
    )
    append(
        "Tool-loop overhead: trajectory tokens/s vs plain generate",
        [
            ("prompts", str(len(problems))),
            ("plain generate tokens/s", f"{plain_rate:.0f}"),
            ("tool loop tokens/s", f"{loop_rate:.0f}"),
            ("tool loop tokens/s, each turn re-encoding the conversation", f"{unkept_rate:.0f}"),
            ("prompt tokens taken from kept states", str(engine.reused_tokens)),
            ("trajectories identical with and without kept states", "yes"),
            (
                "mean model turns per trajectory",
                f"{sum(r['num_turns'] for r in rows) / len(rows):.2f}",
            ),
            ("code cells run", str(sum(len(r["tool_status"]) for r in rows))),
            (
                "tool loop seconds: in generate / the rest (sandbox, grading)",
                f"{in_generate:.1f} / {loop_seconds - in_generate:.1f}",
            ),
            ("overhead (1 - loop/plain)", f"{overhead:.1%}"),
            (
                "tool loop tokens/s in 2 waves (cells beside the other wave's generation)",
                f"{waved_rate:.0f}",
            ),
            ("2 waves vs 1, tokens/s", f"{waved_rate / loop_rate:.2f}x"),
            ("trajectories identical in 2 waves and in 1", f"{same} of {len(rows)}"),
            ("overhead in 2 waves (1 - loop/plain)", f"{1 - waved_rate / plain_rate:.1%}"),
            *idle,
        ],
        f"tool-loop overhead {overhead:.1%} (target <= 25%); "
        f"2 waves {waved_rate / loop_rate:.2f}x one wave's tokens/s "
        f"({idle_speedup:.2f}x with generation off the host)",
    )


class HostIdleEngine:
    """Generation that leaves the host's CPU idle, as a GPU engine does: each call takes
    `seconds` (sleeping) and writes, for each prompt, a cell of CPU work until its last turn,
    then an answer. It stands in for the GPU this machine does not have, to time what waves
    save there: the sandbox's cells beside generation."""

    CELL = "total = sum(i * i for i in range(300_000))\nprint(total % 7)"

    def __init__(self, tokenizer, seconds: float, cells: int) -> None:
        self.tokenizer, self.seconds, self.cells = tokenizer, seconds, cells

    @contextlib.contextmanager
    def conversation(self, calls: int = 1):
        yield

    def generate(self, prompts: list[str], params: SamplingParams) -> list[Completion]:
        time.sleep(self.seconds)
        out = []
        for prompt in prompts:
            turn = prompt.count("```output")
            text = f"```python\n{self.CELL}\n```" if turn < self.cells else "\\boxed{0}"
            out.append(Completion(text=text, num_tokens=16, finish_reason="eos", token_ids=()))
        return out


def _waves_beside_an_idle_host(
    tokenizer, problems, limits, sandbox
) -> tuple[list[tuple[str, str]], float]:
    """Seconds of one wave vs two, 3 cells per trajectory, with generation off the host:
    the table's rows and the speed-up."""
    engine = HostIdleEngine(tokenizer, seconds=0.5, cells=3)
    seconds = {}
    for waves in (1, 2):
        settings = dataclasses.replace(limits, waves=waves, max_turns=4)
        started = time.perf_counter()
        run_rollouts(engine, problems, "tool", 1, SamplingParams(), settings, sandbox)
        seconds[waves] = time.perf_counter() - started
    label = f"host-idle generation (0.5 s a call), {len(problems)} trajectories of 3 cells"
    speedup = seconds[1] / seconds[2]
    rows = [
        (f"{label}: seconds in 1 wave / 2 waves", f"{seconds[1]:.1f} / {seconds[2]:.1f}"),
        (f"{label}: 2 waves vs 1", f"{speedup:.2f}x"),
    ]
    return rows, speedup


def _time_calls(engine, name: str) -> list[float]:
    """Make engine.<name> add its seconds to the returned one-item list."""
    method, seconds = getattr(engine, name), [0.0]

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            seconds[0] += time.perf_counter() - started

    setattr(engine, name, timed)
    return seconds


if __name__ == "__main__":
    main()
