"""A generation stage spread over jobs (reasonrl.shards.Split): four part jobs, each making
every fourth shard, and a gathering job that adopts their shards write the same bytes as the
stage run as one job; a part made with other settings is refused."""

import json
from pathlib import Path

import pytest
from test_resume import SHARDS, STAGES, Runner, outputs, small_config, stage_args

from reasonrl.errors import ReasonRLError
from reasonrl.shards import ShardStore, Split

PARTS = 4


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    runner = Runner(tmp_path_factory.mktemp("logs"))
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def root(tmp_path_factory, runner) -> Path:
    root = tmp_path_factory.mktemp("split")
    (root / "config.json").write_text(json.dumps(small_config()))
    cfg = ["--config", str(root / "config.json")]
    runner.finish("make-data", *cfg, "--task", "arith", "--out-dir", str(root / "data"))
    train = str(root / "data/train.jsonl")
    runner.finish("build-tiny", *cfg, "--corpus", train, "--out", str(root / "policy"))
    return root


@pytest.mark.parametrize("stage", STAGES)
def test_four_part_jobs_and_a_gather_write_the_bytes_of_one_job(runner, root, stage):
    if stage == "best-of-n":
        runner.finish(
            "train-reward-model", "--config", str(root / "config.json"), "--kind", "prm",
            "--model", str(root / "policy"), "--problems", str(root / "data/train.jsonl"),
            "--data", str(root / "annotate-prm/whole/prm.jsonl"), "--out", str(root / "prm"),
        )  # fmt: skip
    whole = root / stage / "whole"
    runner.finish(*stage_args(root, stage, whole))
    parts = [root / stage / "parts" / str(i) for i in range(PARTS)]
    made = 0
    for i, part in enumerate(parts):
        log = runner.finish(*stage_args(root, stage, part), "--part", f"{i}/{PARTS}")
        assert not (part / "manifest.json").exists()  # a part holds shards, not outputs
        record = json.loads((part / "part.json").read_text())
        assert (record["part"], record["count"]) == (i, PARTS)
        assert len(list(part.glob("*.json"))) == record["made"] + 1  # its shards, its record
        made += record["made"]
        assert f"part {i}/{PARTS}" in log
    n = SHARDS.get(stage, 8)
    assert made == n  # every shard made once, by one part
    gathered = root / stage / "gathered"
    log = runner.finish(*stage_args(root, stage, gathered), "--parts", *map(str, parts))
    assert f"shards: {n} reused, 0 made" in log
    assert outputs(gathered) == outputs(whole)
    manifest = json.loads((gathered / "manifest.json").read_text())
    assert [record["part"] for record in manifest["parts"]] == list(range(PARTS))


def test_a_part_made_with_other_settings_is_refused(tmp_path):
    part = tmp_path / "parts" / "0"
    store = ShardStore(part, "settings A", Split(0, 2))
    store.map("p", [1, 2, 3], 1, lambda shard, index: {"x": shard})
    store.publish_part({"SLURM_JOB_ID": "17"})
    names = sorted(p.name for p in part.iterdir())
    assert names == ["fingerprint", "p-00000.json", "p-00002.json", "part.json"]
    assert json.loads((part / "part.json").read_text())["scheduler"] == {"SLURM_JOB_ID": "17"}
    with pytest.raises(ReasonRLError, match=r"parts/0: part made with other settings"):
        ShardStore(tmp_path / "out", "settings B", Split(parts=(str(part),)))
    with pytest.raises(ReasonRLError, match="not a part folder"):
        ShardStore(tmp_path / "out", "settings A", Split(parts=(str(tmp_path),)))


@pytest.mark.parametrize("text", ["4/4", "1/0", "x/2", "2"])
def test_a_malformed_part_is_one_line_naming_the_flag(text):
    with pytest.raises(ReasonRLError, match="--part expects"):
        Split.parse(text, None)
