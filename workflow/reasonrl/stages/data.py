"""Stage of workflow/rules/data.smk: a task's train and test problems."""

from __future__ import annotations

import logging
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.io import write_jsonl
from reasonrl.manifest import Provenance
from reasonrl.tasks import build_problems

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
