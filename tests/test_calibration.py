"""Calibration: headroom measures of the start policy and the gates that stop the DAG."""

from __future__ import annotations

import json

import pytest

from reasonrl.config import validate_config
from reasonrl.errors import ReasonRLError
from reasonrl.io import load_schema


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
    from reasonrl.stats.calibration import failed_gates, measure

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


def _config(**calibration) -> str:
    """A calibrate stage's --config-json: samples at T = 0.7, the frontier task arith5."""
    section = {"frontier_task": "arith5", "k": 2, **calibration}
    return json.dumps({"calibration": section, "evaluation": {"temperature": 0.7}})


def _trajectories(tmp_path, easy: list[dict], frontier: list[dict]) -> tuple[str, str]:
    paths = []
    for name, rows in (("easy", easy), ("frontier", frontier)):
        path = tmp_path / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        paths.append(str(path))
    return paths[0], paths[1]


# Easy greedy 1.0; frontier greedy 0.25, pass@2 0.75, mixed share 0.5: every default gate passes.
EASY = _rows([[True, True]] * 4, [True] * 4)
FRONTIER = _rows(
    [[True, False], [False, False], [True, True], [False, True]], [False, False, True, False]
)


def test_calibrate_writes_measures_gate_verdicts_and_both_temperatures(tmp_path):
    from reasonrl.cli import main

    easy, frontier = _trajectories(tmp_path, EASY, FRONTIER)
    out = tmp_path / "report"
    main(["calibrate", "--config-json", _config(gates={"frontier_max": 0.2}),
          "--easy", easy, "--frontier", frontier, "--out-dir", str(out),
          "--method-temperature", "preference.sampling.temperature=1.0",
          "--method-temperature", "reward_models.temperature=0.7"])  # fmt: skip
    calibration = json.loads((out / "calibration.json").read_text())
    assert calibration["measures"]["frontier_greedy"] == 0.25
    assert calibration["measures"]["frontier_pass@2"] == 0.75
    assert calibration["sampled_at"] == {"key": "evaluation.temperature", "temperature": 0.7}
    assert calibration["method_temperatures"] == {
        "preference.sampling.temperature": 1.0,
        "reward_models.temperature": 0.7,
    }
    assert calibration["temperature_differs"] == ["preference.sampling.temperature"]
    verdicts = {row["gate"]: row["passed"] for row in calibration["gates"]}
    assert verdicts == {
        "easy_min": True,
        "frontier_min": True,
        "frontier_max": False,
        "gap_min": True,
        "mixed_min": True,
    }
    assert calibration["failures"] == [
        "calibration gate 'frontier_max' failed: frontier_greedy is 0.250, needs at most 0.2: "
        "make the frontier band harder"
    ]
    csv = (out / "calibration.csv").read_text().splitlines()
    assert csv[0] == "gate,measure,value,kind,bound,passed"
    assert "frontier_max,frontier_greedy,0.25,max,0.2,False" in csv
    assert ",frontier_pass@2,0.75,,," in csv  # measures no gate reads, gate columns empty


def test_a_gate_set_to_null_is_not_checked(tmp_path):
    from reasonrl.stages.calibration import calibrate

    easy, frontier = _trajectories(tmp_path, EASY, FRONTIER)
    config = validate_config(json.loads(_config(gates={"easy_min": None})), stage=True)
    calibration = calibrate(config, easy, frontier, {}, str(tmp_path))
    assert "easy_min" not in {row["gate"] for row in calibration["gates"]}
    assert calibration["temperature_differs"] == []


def test_a_failed_gate_stops_with_its_line_and_calibration_json_stays(tmp_path, capsys):
    from reasonrl.cli import main

    easy, frontier = _trajectories(tmp_path, _rows([[True, True]] * 4, [True, False] * 2), FRONTIER)
    out = tmp_path / "report"
    config = _config()
    main(["calibrate", "--config-json", config, "--easy", easy, "--frontier", frontier,
          "--out-dir", str(out)])  # fmt: skip
    capsys.readouterr()  # calibrate's warnings
    gate = out / "calibration_gate.json"
    argv = ["calibration-gate", "--calibration", str(out / "calibration.json"), "--out", str(gate)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--config-json", config])
    assert exit_info.value.code != 0
    assert capsys.readouterr().err.splitlines() == [
        "reasonrl: error: calibration gate 'easy_min' failed: easy_greedy is 0.500, needs at "
        "least 0.85: train SFT longer or on more easy problems"
    ]
    assert not gate.exists()
    assert json.loads((out / "calibration.json").read_text())["measures"]["easy_greedy"] == 0.5
    # Not enforced: the gate lets the methods run and records what failed.
    main([*argv, "--config-json", _config(enforce=False)])
    assert json.loads(gate.read_text())["failures"][0].startswith("calibration gate 'easy_min'")
    assert "WARNING not enforced: calibration gate 'easy_min' failed" in capsys.readouterr().err


def test_the_schema_offers_exactly_the_gates_the_library_checks():
    from reasonrl.stats.calibration import GATES

    gates = load_schema("config")["properties"]["calibration"]["properties"]["gates"]
    assert set(gates["properties"]) == set(GATES)
