"""Append a benchmark result to BENCHMARKS.md with the command that produced it."""

from __future__ import annotations

import platform
import shlex
import sys
import time
from pathlib import Path

import torch

BENCHMARKS = Path(__file__).resolve().parents[1] / "BENCHMARKS.md"


def append(title: str, rows: list[tuple[str, str]], verdict: str) -> str:
    """Write a section with a two-column table; return the text written."""
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    lines = [
        f"## {title}",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"- machine: {platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}",
        f"- command: `{command}`",
        "",
        "| measure | value |",
        "| --- | --- |",
        *[f"| {name} | {value} |" for name, value in rows],
        "",
        f"**{verdict}**",
        "",
    ]
    text = "\n".join(lines) + "\n"
    if not BENCHMARKS.exists():
        BENCHMARKS.write_text("# Benchmarks\n\nRatios measured side by side in one run.\n\n")
    with open(BENCHMARKS, "a", encoding="utf-8") as fh:
        fh.write(text)
    print(text)
    return text
