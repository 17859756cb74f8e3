"""The issue-17 pilots of docs/experiment-design.md's items 0 and 1, rerunnable from the
repository (they ran from scratch scripts under /work/pilot/ on 2026-11-24/25).

    python experiments/item0_pilots.py start SEED STEPS OUT [--problems N]
    python experiments/item0_pilots.py frontier MODEL OUT [--problems N]

`start` ("run.sh SEED STEPS"): the default DAG up to sft-tool's arith evaluation, with `seed`
and `sft.max_steps` merged over config/config.yaml, in the working folder OUT; it prints the
evaluation's greedy pass@1 and copy accuracy (`copy_summary`, part of every arith tool
evaluation's metrics.json: the pilot's copy_metric.py).

`frontier` ("frontier/run.py MODEL OUT"): for each band of BANDS, N problems (100 in the
pilot) drawn by `build_problems("arith", band, 12345)`, not the training seed, evaluated by the
evaluate stage greedily and with 8 samples at T 0.7 (config.yaml's evaluation); prints a row
per band: greedy pass@1, sampled pass@1, pass@8, maj@8, copy accuracy.

The numbers of the record were measured at the commits its sections name; today's default
differs (docs/experiment-design.md says how), so a rerun reproduces the procedure, not them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
# The pilot's bands, over config.yaml's arith task.
BANDS = {
    "easy (2-4 operations, operands <= 99)": {},
    "4-5 operations": {"min_ops": 4, "max_ops": 5},
    "5-6 operations": {"min_ops": 5, "max_ops": 6},
    "operands <= 999": {"max_operand": 999},
    "1 distractor sentence": {"min_distractors": 1, "max_distractors": 1},
}
BAND_SEED = 12345


def start(seed: int, steps: int, out: Path, problems: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    overlay = out / f"s{seed}-n{steps}.yaml"
    settings = {"seed": seed, "sft": {"max_steps": steps}}
    if problems:
        settings["evaluation"] = {"max_problems": problems}
    overlay.write_text(yaml.safe_dump(settings))
    target = "results/eval/sft-tool/arith/metrics.json"
    command = [str(Path(sys.executable).parent / "snakemake"), "-s", str(REPO / "Snakefile")]
    command += ["-d", str(out), "--configfile", str(REPO / "config/config.yaml"), str(overlay)]
    # the rules call `reasonrl`: this interpreter's, as the venv's bin on PATH would give it
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run([*command, "--cores", "1", "--rerun-incomplete", target], check=True, env=env)
    metrics = json.loads((out / target).read_text())
    print(json.dumps({k: v for k, v in metrics.items() if "pass@" in k or "copy" in k}))


def frontier(model: Path, out: Path, problems: int) -> None:
    from reasonrl.config import load_config, validate_config
    from reasonrl.io import write_jsonl
    from reasonrl.stages.evaluate import evaluate
    from reasonrl.tasks import build_problems

    config = validate_config(load_config(REPO / "config/config.yaml"))
    print("| band | greedy pass@1 | sampled pass@1 | pass@8 | maj@8 | copy accuracy |")
    for i, (band, settings) in enumerate(BANDS.items()):
        task = {**config["tasks"]["arith"], **settings, "test_size": problems}
        _, test = build_problems("arith", task, BAND_SEED)
        folder = out / f"band{i}"
        write_jsonl(folder / "problems.jsonl", test, schema="problem")
        metrics = evaluate(
            config, str(model), "tool", "arith", str(folder / "problems.jsonl"), "sft-tool",
            str(folder / "eval"),
        )  # fmt: skip
        values = [metrics.get(key) for key in ("greedy_pass@1", "pass@1", "pass@8", "maj@8")]
        values.append(metrics.get("copy_accuracy"))
        print(f"| {band} | " + " | ".join(f"{v:.3f}" if v is not None else "-" for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="pilot", required=True)
    p = sub.add_parser("start")
    p.add_argument("seed", type=int)
    p.add_argument("steps", type=int)
    p.add_argument("out", type=Path)
    p.add_argument("--problems", type=int, default=0, help="evaluate only the first N")
    p = sub.add_parser("frontier")
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--problems", type=int, default=100)
    args = parser.parse_args()
    if args.pilot == "start":
        start(args.seed, args.steps, args.out, args.problems)
    else:
        frontier(args.model, args.out, args.problems)


if __name__ == "__main__":
    main()
