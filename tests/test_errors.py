"""Bad input ends in one line naming the file, line or key, exit status 2, and loses nothing
already written; Ctrl-C and SIGTERM end in one line, exit 130 / 143, and leave no process.

docs/errors.md is the table of the cases tried here, regenerated from their runs and compared
with the committed file (REASONRL_UPDATE_DOCS=1 rewrites it): the doc stays what the code does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from isolation import default_signals, sandbox_processes

from reasonrl.config import validate_config
from reasonrl.io import write_jsonl
from reasonrl.sandbox import bwrap_available
from reasonrl.tasks import build_problems

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "errors.md"
# Reported before torch is imported (model folders and hub ids are checked first) / after it
# (weights that only loading finds wrong: torch and transformers take seconds on two cores) /
# by Snakemake (which starts in ~2 s).
QUICK_S, MODEL_S, SNAKEMAKE_S = 2.0, 15.0, 15.0
PREVIOUS = "written by an earlier run\n"
CONFIG = {"seed": 0, "tasks": {"pycode": {"kind": "pycode", "train_size": 4, "test_size": 2}}}
SLEEPING_SAMPLE = "    import time\n    time.sleep(60)\n"


@dataclass(frozen=True)
class Case:
    name: str
    given: str  # what is wrong, for the doc
    argv: list[str]  # after `reasonrl`, or after `snakemake` when snakemake is set; {tmp}
    status: int
    limit_s: float
    snakemake: bool = False
    env: dict = field(default_factory=dict)
    output: str | None = None  # a file the stage writes: an earlier copy must survive
    one_line: bool = True  # stderr is exactly the message


def _stage(argv: list[str], output: str | None, limit: float = QUICK_S, **kw) -> dict:
    return {"argv": argv, "output": output, "limit_s": limit, **kw}


def _evaluate(model: str) -> list[str]:
    return [
        "evaluate", "--config", "{tmp}/config.yaml", "--model", model, "--style", "tool",
        "--task", "pycode", "--problems", "{tmp}/problems.jsonl", "--out-dir", "{tmp}/out",
    ]  # fmt: skip


def _code_eval(problems: str, samples: str) -> list[str]:
    return [
        "code-eval", "--config", "{tmp}/config.yaml", "--task", "pycode", "--problems", problems,
        "--samples", samples, "--k", "1", "--timeout", "90", "--out-dir", "{tmp}/out",
    ]  # fmt: skip


def _make_data(config: str) -> list[str]:
    return ["make-data", "--config", config, "--task", "pycode", "--out-dir", "{tmp}/out"]


CASES = [
    Case("malformed YAML config", "an unclosed `[` in --config", status=2,
         **_stage(_make_data("{tmp}/malformed.yaml"), "train.jsonl")),
    Case("unknown config key", "`sft.learning_rate` in --config", status=2,
         **_stage(_make_data("{tmp}/unknown-key.yaml"), "train.jsonl")),
    Case("config names a missing model folder", "policy.base: a folder that does not exist",
         status=2, **_stage(_make_data("{tmp}/missing-base.yaml"), "train.jsonl")),
    Case("--model: missing local folder", "a path that does not exist", status=2,
         **_stage(_evaluate("{tmp}/no-such-model"), "metrics.json", QUICK_S)),
    Case("--model: hub id, hub unreachable", "org/name, HF_ENDPOINT refusing connections",
         status=2, env={"HF_ENDPOINT": "http://127.0.0.1:9"},
         **_stage(_evaluate("someorg/some-model"), "metrics.json", QUICK_S)),
    Case("--model: hub id, offline, not cached", "org/name with HF_HUB_OFFLINE=1", status=2,
         env={"HF_HUB_OFFLINE": "1"},
         **_stage(_evaluate("someorg/some-model"), "metrics.json", QUICK_S)),
    Case("truncated weights", "model.safetensors cut in half", status=2,
         **_stage(_evaluate("{tmp}/truncated-model"), "metrics.json", QUICK_S)),
    Case("wrong-shape weights", "config.json says hidden_size 64, weights are 32", status=2,
         **_stage(_evaluate("{tmp}/wrong-shape-model"), "metrics.json", MODEL_S)),
    Case("malformed JSONL row", "line 2 of --problems cut short", status=2,
         **_stage(_code_eval("{tmp}/malformed.jsonl", "{tmp}/samples.jsonl"), "verdicts.jsonl")),
    Case("row breaking the schema", "line 1 of --problems without `question`", status=2,
         **_stage(_code_eval("{tmp}/no-question.jsonl", "{tmp}/samples.jsonl"),
                  "verdicts.jsonl")),
    Case("unknown problem id", "a sample whose problem_id is in no problem", status=2,
         **_stage(_code_eval("{tmp}/problems.jsonl", "{tmp}/unknown-id.jsonl"),
                  "verdicts.jsonl")),
    Case("Ctrl-C", "SIGINT while sandboxes run (seconds: signal to exit)", status=130,
         one_line=False,
         **_stage(_code_eval("{tmp}/problems.jsonl", "{tmp}/sleeping.jsonl"), "verdicts.jsonl")),
    Case("SIGTERM", "SIGTERM while sandboxes run (seconds: signal to exit)", status=143,
         one_line=False,
         **_stage(_code_eval("{tmp}/problems.jsonl", "{tmp}/sleeping.jsonl"), "verdicts.jsonl")),
    Case("snakemake: unknown config key", "`sft.learning_rate` in --configfile", status=2,
         snakemake=True, one_line=False,
         **_stage(["-n", "--configfile", "unknown-key.yaml"], None, SNAKEMAKE_S)),
    Case("snakemake: missing model folder", "policy.base: a missing folder, dry run",
         status=2, snakemake=True, one_line=False,
         **_stage(["-n", "--configfile", "missing-base.yaml"], None, SNAKEMAKE_S)),
    Case("snakemake: untrained start policy", "online_dpo.policy: sft-mix, which no"
         " sft.variants entry trains, dry run", status=2, snakemake=True, one_line=False,
         **_stage(["-n", "--configfile", "untrained-start.yaml"], None, SNAKEMAKE_S)),
    Case("snakemake: malformed config/config.yaml", "an unclosed `[` in the default config",
         status=2, snakemake=True,
         **_stage(["-n", "--directory", "{tmp}/broken-default"], None, SNAKEMAKE_S)),
    Case("snakemake: malformed --configfile",
         "an unclosed `[`; Snakemake reads --configfile before the Snakefile runs, so the"
         " message is Snakemake's own (no file or line)", status=1, snakemake=True,
         one_line=False, **_stage(["-n", "--configfile", "malformed.yaml"], None, SNAKEMAKE_S)),
]  # fmt: skip
ROWS: dict[str, str] = {}


def _broken_copies(tiny_policy: Path, root: Path) -> None:
    truncated = root / "truncated-model"
    shutil.copytree(tiny_policy, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    wrong_shape = root / "wrong-shape-model"
    shutil.copytree(tiny_policy, wrong_shape)
    config = json.loads((wrong_shape / "config.json").read_text())
    config.update(hidden_size=64, intermediate_size=128)
    (wrong_shape / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_policy) -> Path:
    root = tmp_path_factory.mktemp("bad-inputs")
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (root / "malformed.yaml").write_text("seed: 1\npolicy:\n  base: [tiny\n")
    (root / "unknown-key.yaml").write_text("sft:\n  learning_rate: 0.1\n")
    (root / "missing-base.yaml").write_text(f"policy:\n  base: {root}/no-such-model\n")
    (root / "untrained-start.yaml").write_text("online_dpo:\n  policy: sft-mix\n")
    settings = validate_config(CONFIG)["tasks"]["pycode"]
    problems = build_problems("pycode", settings, 0)[1]
    write_jsonl(root / "problems.jsonl", problems)
    lines = (root / "problems.jsonl").read_text().splitlines()
    (root / "malformed.jsonl").write_text(f"{lines[0]}\n{lines[1][:-5]}\n")
    (root / "no-question.jsonl").write_text(
        json.dumps({k: v for k, v in problems[0].items() if k != "question"}) + "\n"
    )
    ids = [p["id"] for p in problems]
    write_jsonl(root / "samples.jsonl", [{"problem_id": i, "completion": ""} for i in ids])
    write_jsonl(root / "unknown-id.jsonl", [{"problem_id": "no-such-id", "completion": ""}])
    write_jsonl(
        root / "sleeping.jsonl", [{"problem_id": i, "completion": SLEEPING_SAMPLE} for i in ids]
    )
    _broken_copies(tiny_policy, root)
    shutil.copytree(REPO / "config", root / "broken-default" / "config")
    with open(root / "broken-default" / "config" / "config.yaml", "a") as fh:
        fh.write("extra: [unclosed\n")
    shutil.copytree(REPO / "config", root / "config")  # the workflow reads it from its cwd
    return root


def _command(case: Case, root: Path) -> list[str]:
    argv = [arg.replace("{tmp}", str(root)) for arg in case.argv]
    if case.snakemake:
        return [
            str(Path(sys.executable).parent / "snakemake"),
            "-s",
            str(REPO / "Snakefile"),
            *argv,
        ]
    return [sys.executable, "-m", "reasonrl.cli", *argv]


def _run(case: Case, root: Path) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(case.env)
    command = _command(case, root)
    if case.status in (130, 143):
        return _interrupt(command, env, signal.SIGINT if case.status == 130 else signal.SIGTERM)
    started = time.monotonic()
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    return result, time.monotonic() - started


def _interrupt(command, env, signum) -> tuple[subprocess.CompletedProcess, float]:
    """Signal the stage once its sandboxes run; the seconds are from the signal to its exit."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_signals,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while len(sandbox_processes([process.pid])) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)  # both samples' programs are sleeping in their sandboxes
    assert sandbox_processes([process.pid]), "no sandbox started"
    started = time.monotonic()
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=30)
    seconds = time.monotonic() - started
    assert sandbox_processes([process.pid]) == []  # the stage killed them before it exited
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr), seconds


def _row(case: Case, message: str) -> str:
    # The default config's last line moves whenever config.yaml is edited: the doc names it.
    message = re.sub(r"(config/config\.yaml):\d+:\d+", r"\1:LAST_LINE:1", message)
    cells = [case.name, case.given, f"`{message}`", str(case.status), f"< {case.limit_s:g}"]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


@pytest.mark.skipif(not bwrap_available(), reason="the interrupt cases run sandboxes")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line(case: Case, inputs: Path):
    out = inputs / "out"
    shutil.rmtree(out, ignore_errors=True)
    if case.output:
        out.mkdir()
        (out / case.output).write_text(PREVIOUS)
    result, seconds = _run(case, inputs)
    print(f"{case.name}: {seconds:.2f} s, exit {result.returncode}")
    # Snakemake prints its own errors on stdout
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    assert result.returncode == case.status, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if case.one_line:
        assert len(lines) == 1, result.stderr
    assert seconds < case.limit_s
    message = lines[-1].replace(str(inputs), "<tmp>")
    if case.status != 1:  # ours: names what is wrong; 1 is Snakemake's own message
        assert message.startswith("reasonrl: ")
    if case.output:
        assert sorted(p.name for p in out.iterdir()) == [case.output]  # no temp file left
        assert (out / case.output).read_text() == PREVIOUS
    ROWS[case.name] = _row(case, message)


def test_docs_errors_md_is_the_table_of_these_cases():
    if len(ROWS) != len(CASES):
        pytest.skip("runs after every case above (run the whole file)")
    table = "\n".join(ROWS[case.name] for case in CASES)
    text = DOC_HEADER + table + "\n"
    if os.environ.get("REASONRL_UPDATE_DOCS") == "1":
        DOC.write_text(text)
    assert DOC.read_text() == text, "docs/errors.md is stale: REASONRL_UPDATE_DOCS=1 rewrites it"


DOC_HEADER = """\
# Errors on bad input

Generated by `tests/test_errors.py`, which runs every case below and fails when this table
differs from what the commands print (`REASONRL_UPDATE_DOCS=1 pytest tests/test_errors.py`
rewrites it). Each case: the message (the last line on stderr; `<tmp>` is the test's folder),
the exit status, and the seconds it must finish within on two shared CPU cores.

Every bad input to `reasonrl` prints exactly one line, exits with status 2 and leaves an
earlier copy of the stage's output untouched (no temp file left beside it). Model arguments
are checked before torch is imported: a missing folder, broken weight headers, a hub id that
is not cached while the hub is offline or unreachable (which once cost 46 s of retries). Only
weights whose shapes disagree with config.json are found by loading the model, after torch
and transformers are imported (seconds). Ctrl-C and SIGTERM end with one line and 130 / 143,
sandboxes gone, nothing half-written.

| case | given | message | exit status | seconds |
| --- | --- | --- | --- | --- |
"""
