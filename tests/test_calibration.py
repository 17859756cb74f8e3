"""Calibration: headroom measures of the start policy and the gates that stop the DAG."""

from __future__ import annotations

import pytest

from reasonrl.errors import ReasonRLError


def _rows(outcomes: list[list[bool]], greedy: list[bool]) -> list[dict]:
    rows = [
        {"problem_id": f"p{i}", "decoding": "sampled", "correct": c}
        for i, o in enumerate(outcomes)
        for c in o
    ]
    return rows + [
        {"problem_id": f"p{i}", "decoding": "greedy", "correct": g} for i, g in enumerate(greedy)
    ]


def test_calibration_measures_headroom_and_names_the_failed_gate():
    from reasonrl.calibration import failed_gates, measure

    easy = _rows([[True, True]] * 4, [True, True, True, False])
    frontier = _rows(
        [[True, False], [False, False], [True, True], [False, True]], [False, False, True, False]
    )
    measures = measure(easy, frontier, k=2)
    assert measures["easy_greedy"] == 0.75
    assert measures["frontier_greedy"] == 0.25
    assert measures["frontier_pass@2"] == 0.75
    assert measures["frontier_pass_gap"] == 0.5
    assert measures["frontier_mixed_share"] == 0.5
    gates = {"easy_min": 0.85, "frontier_min": 0.15, "frontier_max": 0.6, "gap_min": 0.2}
    assert failed_gates(measures, gates) == [
        "calibration gate 'easy_min' failed: easy_greedy is 0.750, needs at least 0.85: "
        "train SFT longer or on more easy problems"
    ]
    with pytest.raises(ReasonRLError, match="pass@4 needs at least 4 samples, got 2"):
        measure(easy, frontier, k=4)
