"""The bubblewrap side of a run: finding bwrap, its options (namespaces, read-only system, private
/tmp), and the bootstrap that runs a program in a fresh sandbox as the namespace's init's child.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from reasonrl.sandbox.cgroups import owner_is_gone
from reasonrl.sandbox.results import SandboxLimits
from reasonrl.sandbox.zygote import (
    CONFINE_SOURCE,
)

BWRAP_MISSING = (
    "bubblewrap (bwrap) not found: install it (apt-get install bubblewrap) or set "
    "sandbox.allow_unsandboxed: true to run model code without isolation"
)

UNSANDBOXED_WARNING = (
    "sandbox.allow_unsandboxed: running model code WITHOUT bubblewrap isolation "
    "(network, files and process count are not contained); install bubblewrap"
)

HOST_DIR_PREFIX = "reasonrl-sandbox-"  # + the caller's pid: host folder of one run

SANDBOX_SCRIPT = "/tmp/main.py"

# In bwrap the bootstrap is the pid namespace's init (--as-pid-1) and runs the program in a
# child: bwrap's own init would keep the program's stdin (a code check's tests) and output
# pipes open, and without root it runs as the program's uid, so its /proc/1/fd, mem and
# environ would be the program's to read. This init is non-dumpable, ignores SIGINT (the only
# signal it handles), holds no descriptor, and exits with the program's status once its main
# process has ended (a signal as 128 + its number, as bwrap reports one); the kernel then
# kills what is left in the namespace.
_INIT_SOURCE = """\
if init:
    import ctypes, signal
    if ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0 (the child's too)
        os._exit(125)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    go, went = os.pipe()
    program = os.fork()
    if program:
        os.closerange(0, os.sysconf("SC_OPEN_MAX"))  # `went` too: the program may go on
        while True:
            pid, status = os.wait()
            if pid == program:
                code = os.waitstatus_to_exitcode(status)
                os._exit(128 - code if code < 0 else code)
    os.close(went)
    os.read(go, 1)  # EOF once the init holds no descriptor
    os.close(go)
    signal.signal(signal.SIGINT, signal.default_int_handler)
"""


# Runs inside the sandbox before the program: into the run's memory cgroup first (writing 0
# to cgroup.procs moves the writer; its children are born inside), then limits (so the
# program can never raise them; a negative value leaves that limit alone), then the uid drop
# (root is exempt from RLIMIT_NPROC), then a byte on the ready pipe so the caller can tell
# "the sandbox could not start" from "the program failed". The program then runs in this same
# interpreter (one interpreter start per run, not two), with unbuffered stdout and stderr as
# under `python -u`, and site-packages only when asked for.
BOOTSTRAP = (
    """\
import os, resource, sys
cpu, mem, nproc, fsize, uid, ready, cgroup, site, init = map(int, sys.argv[1:10])
if cgroup >= 0:
    os.write(cgroup, b"0")
path = sys.argv[10]
keep = 2
"""
    + _INIT_SOURCE
    + CONFINE_SOURCE
    + """\
code = compile(source, path, "exec")
sys.argv = [path]
__file__ = path
# The program runs in __main__'s namespace, as under `python path`, without our names.
for name in [n for n in globals() if not n.startswith("__") and n != "code"]:
    del globals()[name]
del name
exec(globals().pop("code"), globals())
"""
)


# Threaded numeric libraries would otherwise start one thread per core and hit RLIMIT_NPROC.
SANDBOX_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
)


def find_bwrap() -> str | None:
    """Path of the bubblewrap executable, or None (tests patch this)."""
    return shutil.which("bwrap")


def bwrap_available() -> bool:
    return find_bwrap() is not None


def sweep_stale_host_dirs() -> None:
    """Remove the host folders of runs whose caller was killed before it could."""
    with contextlib.suppress(OSError):
        for path in Path(tempfile.gettempdir()).glob(f"{HOST_DIR_PREFIX}*"):
            if owner_is_gone(path.name, HOST_DIR_PREFIX):
                shutil.rmtree(path, ignore_errors=True)


def bwrap_options(
    limits: SandboxLimits, interpreter: str, script_fd: int | None, status_fd: int
) -> list[str]:
    """bwrap flags: fresh namespaces, read-only system and interpreter, private /tmp (with the
    program at SANDBOX_SCRIPT, unless script_fd is None: a zygote writes each one there)."""
    # As root we keep the host user namespace so the bootstrap can drop to a real uid that
    # RLIMIT_NPROC applies to; as a normal user bwrap needs a user namespace.
    namespaces = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"]
    namespaces += ["--unshare-cgroup-try"] + ([] if os.geteuid() == 0 else ["--unshare-user"])
    options = [*namespaces, "--die-with-parent", "--new-session", "--clearenv"]
    for name, value in SANDBOX_ENV.items():
        options += ["--setenv", name, value]
    options += ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        options += _mirror_top_level(Path("/") / top)
    for etc_file in _ETC_FILES:
        options += ["--ro-bind-try", etc_file, etc_file]
    options += ["--proc", "/proc", "--dev", "/dev"]
    tmp_bytes = str(limits.file_size_mb * 1024 * 1024)
    options += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/tmp"]
    # multiprocessing's locks live in /dev/shm: a private, capped one, like /tmp
    options += ["--perms", "1777", "--size", tmp_bytes, "--tmpfs", "/dev/shm"]
    if script_fd is not None:
        options += ["--perms", "0444", "--ro-bind-data", str(script_fd), SANDBOX_SCRIPT]
    for prefix in _interpreter_prefixes(interpreter):
        options += _bind_with_parents(prefix)
    # The sandbox's own root and /etc are bwrap's tmpfs, which without root belongs to the
    # program's uid: read-only, as they are to a program of a uid of its own.
    options += ["--remount-ro", "/"]
    options += ["--chdir", "/tmp", "--json-status-fd", str(status_fd)]
    return options


def _mirror_top_level(path: Path) -> list[str]:
    """/bin, /lib, ...: the same symlink into /usr, or a read-only bind of the real folder."""
    if path.is_symlink():
        return ["--symlink", os.readlink(path), str(path)]
    return ["--ro-bind", str(path), str(path)] if path.is_dir() else []


def _interpreter_prefixes(interpreter: str) -> list[str]:
    """Real folders holding the interpreter and its standard library, outside /usr."""
    candidates = {os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix)}
    candidates.add(str(Path(interpreter).parent.parent))
    return [p for p in sorted(candidates) if p != "/" and not f"{p}/".startswith("/usr/")]


def _bind_with_parents(prefix: str) -> list[str]:
    """Read-only bind of prefix; its parents are created world-traversable (/root is 0700)."""
    options = []
    for parent in reversed(Path(prefix).parents[:-1]):
        options += ["--perms", "0755", "--dir", str(parent)]
    return options + ["--ro-bind", prefix, prefix]
