"""Fault injection: every generation stage of config/test.yaml, killed with SIGKILL at seeded
random shard counts (several per stage, each rerun killed again further on), then rerun to
the end, writes the same bytes as an uninterrupted run."""

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from run_results import comparable

REPO = Path(__file__).resolve().parents[1]
KILLS_PER_STAGE = 3


def small_config() -> dict:
    """config/test.yaml's sections the generation stages read, at a size where each stage
    has eight one-problem shards (seven places to kill it) and runs in seconds."""
    config = yaml.safe_load((REPO / "config/test.yaml").read_text())
    config["tasks"] = {"arith": {**config["tasks"]["arith"], "train_size": 40, "test_size": 8}}
    config["generation"] = {**config["generation"], "shard_size": 1}
    config["rollout"] = {"max_turns": 2, "max_turn_tokens": 16, "max_total_tokens": 32}
    config["evaluation"] = {**config["evaluation"], "tasks": ["arith"]}
    rm = config["reward_models"]
    rm["prompts"], rm["samples_per_prompt"] = 8, 2
    rm["annotation"] = {"solutions_per_prompt": 1, "completions": 2}
    rm["train"] = {**rm["train"], "max_steps": 2, "checkpoint_every": 2}
    rm["best_of_n"] = {"n": [1, 2], "max_problems": 8}
    rm["hgs"] = {**rm["hgs"], "max_problems": 8, "max_iterations": 3, "filter_samples": 2}
    keep = ("seed", "policy", "tasks", "generation", "rollout", "sandbox", "evaluation")
    return {k: v for k, v in config.items() if k in keep + ("reward_models", "preference")}


class Runner:
    """tests/fork_runner.py: reasonrl calls as forked children of one process that imported
    the package once (a fresh interpreter per call would take ~10 s of CPU to import)."""

    def __init__(self, logs: Path):
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same sums in every run
        self.server = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("fork_runner.py"))],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.logs, self.runs = logs, 0

    def start(self, *args: str, kill_at_shard: int | None = None) -> tuple[int, Path]:
        self.runs += 1
        log = self.logs / f"run-{self.runs}.log"
        request = {"args": list(args), "log": str(log), "kill_at_shard": kill_at_shard}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        word, pid = self.server.stdout.readline().split()
        assert word == "started", word
        return int(pid), log

    def wait(self, pid: int) -> int:
        """The child's exit status, or minus the signal that ended it."""
        word, ended, status = self.server.stdout.readline().split()
        assert (word, int(ended)) == ("ended", pid)
        return os.waitstatus_to_exitcode(int(status))

    def finish(self, *args: str) -> str:
        pid, log = self.start(*args)
        status = self.wait(pid)
        assert status == 0, log.read_text()[-3000:]
        return log.read_text()

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait()


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    runner = Runner(tmp_path_factory.mktemp("logs"))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory, runner) -> Path:
    root = tmp_path_factory.mktemp("resume")
    (root / "config.json").write_text(json.dumps(small_config()))
    cfg = ["--config", str(root / "config.json")]
    runner.finish("make-data", *cfg, "--task", "arith", "--out-dir", str(root / "data"))
    train = str(root / "data/train.jsonl")
    runner.finish("build-tiny", *cfg, "--corpus", train, "--out", str(root / "policy"))
    return root


def stage_args(root: Path, stage: str, out: Path) -> list[str]:
    cfg = ["--config", str(root / "config.json")]
    policy, test = str(root / "policy"), str(root / "data/test.jsonl")
    train = str(root / "data/train.jsonl")
    return {
        "evaluate": [
            "evaluate", *cfg, "--model", policy, "--style", "tool", "--task", "arith",
            "--problems", test, "--policy", "tiny",
        ],
        "sample-round": [
            "sample-round", *cfg, "--prompts", test, "--round", "1",
            "--sampler", f"latest={policy}:2", "--sampler", f"previous={policy}:1",
        ],
        "sample-rm-data": ["sample-rm-data", *cfg, "--model", policy, "--problems", train],
        "annotate-prm": [
            "annotate-prm", *cfg, "--model", policy, "--problems", train,
            "--samples", str(root / "sample-rm-data/whole/samples.jsonl"),
        ],
        "best-of-n": [
            "best-of-n", *cfg, "--policy", policy, "--problems", test,
            "--prm", str(root / "prm"),
        ],
        "hgs-search": [
            "hgs-search", *cfg, "--policy", policy, "--prm", str(root / "prm"),
            "--problems", test, "--best-of-n", str(root / "best-of-n/whole"),
        ],
    }[stage] + ["--out-dir", str(out)]  # fmt: skip


def outputs(folder: Path) -> dict[str, object]:
    """Every output but the manifest, timings left out (JSON, CSV), else the bytes."""
    return {p.name: comparable(p) for p in sorted(folder.iterdir()) if p.name != "manifest.json"}


def kill_after_shards(runner: Runner, args: list[str], shards: Path, count: int) -> None:
    """Run the stage until it starts a shard with `count` finished ones on disk, and SIGKILL it
    there."""
    pid, _ = runner.start(*args, kill_at_shard=count)
    assert runner.wait(pid) == -signal.SIGKILL, f"{args[0]} ended before {count} shards"
    assert len(list(shards.glob("*.json"))) == count


# In DAG order: annotate-prm reads sample-rm-data's samples, the PRM is trained on its rows,
# hgs-search reads best-of-n's output.
STAGES = ["evaluate", "sample-round", "sample-rm-data", "annotate-prm", "best-of-n", "hgs-search"]
SHARDS = {"sample-round": 16}  # two samplers, eight shards each; eight for the other stages


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_killed_at_random_shards_resumes_to_identical_outputs(runner, root, stage):
    if stage == "best-of-n" and not (root / "prm").exists():
        runner.finish(
            "train-reward-model", "--config", str(root / "config.json"), "--kind", "prm",
            "--model", str(root / "policy"), "--problems", str(root / "data/train.jsonl"),
            "--data", str(root / "annotate-prm/whole/prm.jsonl"), "--out", str(root / "prm"),
        )  # fmt: skip
    whole, killed = root / stage / "whole", root / stage / "killed"
    runner.finish(*stage_args(root, stage, whole))
    shards = killed.parent / f".{killed.name}.shards"
    n = SHARDS.get(stage, 8)
    points = sorted(random.Random(f"{stage}-kills").sample(range(1, n), KILLS_PER_STAGE))
    for count in points:
        kill_after_shards(runner, stage_args(root, stage, killed), shards, count)
        assert not (killed / "manifest.json").exists()  # nothing looks finished
    done = len(list(shards.glob("*.json")))
    assert done == points[-1] < n
    log = runner.finish(*stage_args(root, stage, killed))
    assert f"shards: {done} reused, {n - done} made" in log
    assert outputs(killed) == outputs(whole)
    assert not shards.exists()  # dropped once the outputs are written
