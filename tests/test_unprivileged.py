"""The unprivileged lane: the sandbox's tests and config/test.yaml's DAG run by an ordinary
account (tests/ordinary_user.py), as researchers and every SLURM job run them.

Run as root, the lane makes the account and sets the project up in its home; the tests below
then run as that user: every sandbox, pool, session, zygote, code-eval, rollout, forgery and
escape test (their "no process left" checks count that user's processes). The lane's DAG is
tests/test_slurm.py's: config/test.yaml submitted to SLURM by this account, as every job on a
cluster runs, each rule in the CPU image (the Docker runner, as this account's uid), whose
results (trajectories, verdicts, metrics, weights) must equal root's local run; a second,
local run by the same account would repeat its stages for 3 minutes of CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
from ordinary_user import OrdinaryUser, as_user

from reasonrl.sandbox import bwrap_available

pytestmark = [
    pytest.mark.skipif(
        os.geteuid() != 0, reason="needs root: it makes the ordinary account and runs as it"
    ),
    pytest.mark.skipif(not bwrap_available(), reason="bubblewrap is not installed"),
]

UNPRIVILEGED_TESTS = [
    "tests/test_sandbox.py",
    "tests/test_sandbox_battery.py",
    "tests/test_sandbox_hygiene.py",
    "tests/test_pool.py",
    "tests/test_zygote.py",
    "tests/test_sessions.py",
    "tests/test_code_eval.py",
    "tests/test_code_eval_forgery.py",
    "tests/test_rollout.py",
]
# The only skips an ordinary account may see: what needs root, said so
ROOTS_SKIPS = re.compile(r"needs root|as root|root's")
LANE_TIMEOUT = 3600


@pytest.fixture
def user(ordinary_account) -> OrdinaryUser:
    return ordinary_account


@pytest.mark.timeout(LANE_TIMEOUT)
def test_the_sandbox_tests_pass_as_an_ordinary_user(user):
    argv = ["python", "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *UNPRIVILEGED_TESTS]
    result = as_user(user, argv, timeout=LANE_TIMEOUT - 60)
    report = result.stdout + result.stderr
    assert result.returncode == 0, report[-8000:]
    skips = [line for line in report.splitlines() if line.startswith("SKIPPED")]
    assert [line for line in skips if not ROOTS_SKIPS.search(line)] == [], skips
    assert re.search(r"^\d+ passed", report.splitlines()[-1]), report[-2000:]


def test_set_up_without_bubblewrap_and_without_root_stops_naming_what_to_install(user):
    """An ordinary account cannot install bubblewrap: `make` stops at once and says what to."""
    bin_dir = user.home / "path-without-bwrap"  # what the Makefile's recipe runs, less bwrap
    shutil.rmtree(bin_dir, ignore_errors=True)
    bin_dir.mkdir()
    for tool in ("make", "bash", "sh", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**user.environment(), "PATH": str(bin_dir)}
    result = subprocess.run(
        user.command(["make", "sandbox"]), cwd=user.repo, env=env, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[0] == (
        "bwrap not found: install bubblewrap (e.g. sudo apt-get install bubblewrap)"
    )
