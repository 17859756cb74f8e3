"""Run `reasonrl` CLI calls as forked children of this one process, which imports the package
once: the fault-injection test (tests/test_resume.py) starts about 30 runs, and each fresh
interpreter would spend ~10 s of CPU importing torch and transformers. A child is a real
process, killed by a real SIGKILL; this process itself never runs torch (forking after torch
has started its thread pools is unsafe).

Protocol, one line each way per run: stdin gets a JSON object {"args": [...], "log": path};
stdout answers "started PID", then "ended PID STATUS" (os.waitpid's raw status) when the
child has gone. The child's stdout and stderr go to `log`.
"""

import json
import os
import sys

import reasonrl.stages.evaluate
import reasonrl.stages.preference
import reasonrl.stages.reward_models  # noqa: F401  (imported before any fork)
from reasonrl.cli import main


def run_child(args: list[str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.argv = ["reasonrl", *args]  # what the manifest records as the command
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
            run_child(request["args"], request["log"])
        print(f"started {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"ended {pid} {status}", flush=True)


if __name__ == "__main__":
    serve()
