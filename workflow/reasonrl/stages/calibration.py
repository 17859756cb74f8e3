"""Stages of workflow/rules/calibration.smk: the start policy's headroom, measured from its
evaluation trajectories on the easy and frontier bands (`calibrate`), and the gate that
stops the post-SFT methods when it is too small (`calibration-gate`).

Two stages, not one: Snakemake deletes a failed job's outputs, so the measures are written
by a job that succeeds and the gate that fails only reads them."""

from __future__ import annotations

import logging
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.io import read_json, read_jsonl, write_csv, write_json
from reasonrl.stats.calibration import GATES, failed_gates, measure

log = logging.getLogger(__name__)
# The config key of the temperature the evaluation samples (the calibration's samples) use.
SAMPLED_AT = "evaluation.temperature"


def calibrate(
    config: dict,
    easy_path: str,
    frontier_path: str,
    method_temperatures: dict[str, float],
    out_dir: str,
) -> dict:
    """Write calibration.json (measures, gates, each gate's verdict, the temperature the
    samples were drawn at beside the methods' own) and calibration.csv into out_dir.

    `method_temperatures`: config key -> temperature of each method that samples from the
    start policy; those that differ from evaluation.temperature are listed, not mixed in.
    """
    section = config["calibration"]
    measures = measure(read_jsonl(easy_path), read_jsonl(frontier_path), section["k"])
    temperature = config["evaluation"]["temperature"]
    calibration = {
        "policy": section["policy"],
        "easy_task": section["easy_task"],
        "frontier_task": section["frontier_task"],
        "k": section["k"],
        "sampled_at": {"key": SAMPLED_AT, "temperature": temperature},
        "method_temperatures": method_temperatures,
        "temperature_differs": sorted(
            key for key, value in method_temperatures.items() if value != temperature
        ),
        "measures": measures,
        "gates": gate_verdicts(measures, section["gates"]),
    }
    calibration["failures"] = failed_gates(measures, active_gates(section["gates"]))
    out = Path(out_dir)
    write_json(out / "calibration.json", calibration)
    write_csv(out / "calibration.csv", calibration_rows(calibration))
    for key in calibration["temperature_differs"]:
        log.warning(
            "samples drawn at %s %s, but %s is %s", SAMPLED_AT, temperature, key,
            method_temperatures[key],
        )  # fmt: skip
    for line in calibration["failures"]:
        log.warning("%s", line)
    return calibration


def active_gates(gates: dict[str, float | None]) -> dict[str, float]:
    """The gates with a bound (null turns one off)."""
    return {gate: bound for gate, bound in gates.items() if bound is not None}


def gate_verdicts(measures: dict[str, float], gates: dict[str, float | None]) -> list[dict]:
    """One row per active gate: its measure, value, bound kind and bound, and whether it passed."""
    rows = []
    for gate, bound in active_gates(gates).items():
        name, kind, _ = GATES[gate]
        rows.append(
            {
                "gate": gate,
                "measure": name,
                "value": measures[name],
                "kind": kind,
                "bound": bound,
                "passed": not failed_gates(measures, {gate: bound}),
            }
        )
    return rows


def calibration_rows(calibration: dict) -> list[dict]:
    """The CSV: every gate's row, then each measure no gate reads (gate columns empty)."""
    gated = {row["measure"] for row in calibration["gates"]}
    rows = [dict(row) for row in calibration["gates"]]
    rows += [
        {"gate": None, "measure": name, "value": value, "kind": None, "bound": None, "passed": None}
        for name, value in calibration["measures"].items()
        if name not in gated
    ]
    return rows


def calibration_gate(config: dict, calibration_path: str, out: str) -> list[str]:
    """Stop (ReasonRLError, one line per failed gate) when calibration.enforce and a gate of
    calibration.json failed; else write `out`, the input the methods wait for, and return the
    failed gates' lines (logged as warnings when not enforced)."""
    failures = read_json(calibration_path)["failures"]
    enforce = config["calibration"]["enforce"]
    if failures and enforce:
        raise ReasonRLError("\n".join(failures))
    for line in failures:
        log.warning("not enforced: %s", line)
    write_json(Path(out), {"enforce": enforce, "failures": failures})
    return failures
