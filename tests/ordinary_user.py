"""An ordinary account to run the project as, the way researchers and SLURM jobs run it.

As root, `ordinary_user()` makes the account (`useradd`, once per machine), copies the
working tree into its home (tracked and untracked files, not what git ignores) and sets the
project up there as that user (`make setup`: a venv of its own, from the interpreter on its
PATH, since root's is in a folder only root can read). `as_user` then runs a command as that
user in its copy, with an environment of its own (HOME, USER, PATH; the registry settings of
pip kept). Tests that need root to do this skip without it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
USER_NAME = "reasonrl-user"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"
# What of root's environment an ordinary account would not have
ROOTS_OWN = ("HOME", "USER", "LOGNAME", "PATH", "VIRTUAL_ENV", "PYTHONPATH", "MAIL", "PWD")


@dataclass(frozen=True)
class OrdinaryUser:
    name: str
    uid: int
    gid: int
    home: Path

    @property
    def repo(self) -> Path:
        """The user's copy of the working tree, set up (its venv in .venv)."""
        return self.home / "reasonrl"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ROOTS_OWN}
        env = {k: v for k, v in env.items() if not k.startswith(("PYENV", "PYTEST", "COV_"))}
        path = f"{self.repo / '.venv' / 'bin'}:{SYSTEM_PATH}"
        return {**env, "HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                "PATH": path}  # fmt: skip

    def command(self, argv: list[str]) -> list[str]:
        """argv run as this user (setpriv: its uid, gid and groups, our environment)."""
        ids = [f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups"]
        return [shutil.which("setpriv") or "setpriv", *ids, "--", *argv]


def as_user(
    user: OrdinaryUser, argv: list[str], cwd: Path | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    """Run argv as `user` in `cwd` (default: its copy), output captured as text."""
    return subprocess.run(
        user.command(argv),
        cwd=cwd or user.repo,
        env=user.environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _account() -> OrdinaryUser:
    try:
        entry = pwd.getpwnam(USER_NAME)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", USER_NAME], check=True)
        entry = pwd.getpwnam(USER_NAME)
    return OrdinaryUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def _copy_working_tree(user: OrdinaryUser) -> None:
    """The working tree's files (tracked, and untracked but not ignored) over the user's copy,
    owned by the user; what the copy made itself (its venv) stays."""
    listing = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, check=True,
    )  # fmt: skip
    user.repo.mkdir(parents=True, exist_ok=True)
    for old in user.repo.iterdir():  # a file gone from the tree goes from the copy
        if old.name != ".venv":
            shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()
    for name in filter(None, listing.stdout.decode().split("\0")):
        source, target = REPO / name, user.repo / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(user.home)], check=True)


def ordinary_user() -> OrdinaryUser:
    """The ordinary account with the project set up in its home (needs root)."""
    if os.geteuid() != 0:
        raise PermissionError("making an ordinary account needs root")
    user = _account()
    _copy_working_tree(user)
    setup = as_user(user, ["make", "setup"], timeout=1800)
    if setup.returncode != 0:
        raise RuntimeError(f"make setup as {user.name} failed:\n{setup.stdout}\n{setup.stderr}")
    return user
