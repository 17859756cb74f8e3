"""The learning files' record: every Holm family they adjust is kept as verdict lines and
printed in pytest's summary (tests/conftest.py), passes and strict xfails included."""

from __future__ import annotations

import learning_start
from conftest import pytest_terminal_summary
from learning_start import holm_family

from reasonrl.stats.comparisons import compare, holm


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write_sep(self, sep: str, title: str) -> None:
        self.lines.append(f"{sep} {title}")

    def write_line(self, line: str) -> None:
        self.lines.append(line)


def test_a_family_is_adjusted_kept_and_printed(monkeypatch):
    monkeypatch.setattr(learning_start, "FAMILIES", {})
    a = {f"p{i}": float(i < 30) for i in range(40)}
    b = {f"p{i}": float(10 <= i < 30) for i in range(40)}
    rows = [
        compare("gain", "greedy_pass@1", "x", "y", a, b),
        compare("cost", "greedy_pass@1", "x", "y", a, a, margin=0.03),
    ]
    family = holm_family("test_file", rows)
    assert set(family) == {"gain", "cost"}
    assert [family[row["name"]] for row in rows] == holm(rows)
    reporter = Reporter()
    pytest_terminal_summary(reporter)
    assert reporter.lines[0] == "- test_file: Holm over 2"
    gain, cost = reporter.lines[1:]
    assert gain.startswith("gain: 0.750 vs 0.500, diff +0.250 [") and ", n 40, power" in gain
    assert "margin 0.03" in cost and "power" not in cost
