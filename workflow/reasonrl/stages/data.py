"""Stages of workflow/rules/data.smk: a task's train and test problems, and its prompt pools."""

from __future__ import annotations

import logging
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.io import write_jsonl
from reasonrl.manifest import Provenance
from reasonrl.tasks import build_problems, build_splits
from reasonrl.tasks.sampling import pool_split

log = logging.getLogger(__name__)


def make_data(config: dict, task: str, out_dir: str) -> None:
    """Build `task`'s train/test problems from its config entry; write them and the manifest."""
    if task not in config["tasks"]:
        raise ReasonRLError(f"task '{task}' is not under the config key 'tasks'")
    provenance = Provenance(
        "make-data", {"tasks": {task: config["tasks"][task]}}, [], config["seed"]
    )
    train, test = build_problems(task, config["tasks"][task], config["seed"])
    out = Path(out_dir)
    write_jsonl(out / "train.jsonl", train, schema="problem")
    write_jsonl(out / "test.jsonl", test, schema="problem")
    provenance.write(out, {"train_size": len(train), "test_size": len(test)})
    log.info("%s: %d train and %d test problems", task, len(train), len(test))


def make_pool(config: dict, task: str, pool: str, out_dir: str) -> None:
    """Write `task`'s prompt pool for consumer `pool` (disjoint from its train and test
    splits and from the other pools) and the manifest."""
    settings = config["tasks"].get(task)
    if settings is None:
        raise ReasonRLError(f"task '{task}' is not under the config key 'tasks'")
    if pool not in settings["pools"]:
        raise ReasonRLError(f"config key 'tasks.{task}.pools' has no pool '{pool}'")
    provenance = Provenance("make-pool", {"tasks": {task: settings}}, [], config["seed"])
    rows = build_splits(task, settings, config["seed"])[pool_split(pool)]
    out = Path(out_dir)
    write_jsonl(out / "problems.jsonl", rows, schema="problem")
    provenance.write(out, {"pool": pool, "size": len(rows)})
    log.info("%s: %d problems in the %s pool", task, len(rows), pool)
