"""Run `reasonrl` CLI calls as forked children of this one process, which imports the package
once: the fault-injection test (tests/test_resume.py) starts about 30 runs, and each fresh
interpreter would spend ~10 s of CPU importing torch and transformers. A child is a real
process, killed by a real SIGKILL; this process itself never runs torch (forking after torch
has started its thread pools is unsafe).

Protocol, one line each way per run: stdin gets a JSON object {"args": [...], "log": path}
and, for a fault, "kill_at_shard": N (the child SIGKILLs itself as it starts making a shard
with N finished ones on disk: an exact kill point, where polling the folder from outside
raced fast stages to their end); stdout answers "started PID", then "ended PID STATUS"
(os.waitpid's raw status) when the child has gone. The child's stdout and stderr go to `log`.
"""

import json
import os
import signal
import sys

import reasonrl.stages.evaluate
import reasonrl.stages.preference
import reasonrl.stages.reward_models  # noqa: F401  (imported before any fork)
from reasonrl.cli import main
from reasonrl.shards import ShardStore


def kill_at_shard(count: int) -> None:
    """Make this process SIGKILL itself when it starts a shard with `count` finished ones."""
    shard = ShardStore.shard

    def shard_or_die(store: ShardStore, key: str, make):
        finished = len(list(store.folder.glob("*.json")))
        if not (store.folder / f"{key}.json").is_file() and finished >= count:
            os.kill(os.getpid(), signal.SIGKILL)
        return shard(store, key, make)

    ShardStore.shard = shard_or_die


def run_child(args: list[str], log: str, kill_at: int | None) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = ["reasonrl", *args]  # what the manifest records as the command
    if kill_at is not None:
        kill_at_shard(kill_at)
    status = 0
    try:
        main(args)
    except SystemExit as stop:
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_child(request["args"], request["log"], request.get("kill_at_shard"))
        print(f"started {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"ended {pid} {status}", flush=True)


if __name__ == "__main__":
    serve()
