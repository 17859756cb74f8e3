"""Run model-written Python under bubblewrap with resource limits, and report what happened.

Each program runs in a fresh sandbox: no network, a read-only view of /usr and of the
Python interpreter's own prefix, a private size-capped /tmp and /dev/shm, new pid, ipc and
uts namespaces, a new session and a seccomp filter that refuses the system calls a Python
program has no use for (namespaces, mounts, ptrace, keyrings, bpf, io_uring, raw sockets).
Inside, a tiny bootstrap joins the run's memory cgroup (when the host lets us make one, so
the memory cap holds for all of the program's processes together), sets the rlimits (CPU
seconds, address space, processes, file size, no core files), drops root to a uid of its
own (RLIMIT_NPROC does not bind root, and counts per uid: a fork bomb in one sandbox must
not starve the one beside it) and runs the program in that same interpreter (standard
library only, unless site-packages are asked for), in a child of its own: the bootstrap
itself stays the namespace's init, holding none of the program's descriptors.

Without root the same runs go through an unprivileged user namespace per sandbox: the
program keeps the runner's uid (RLIMIT_NPROC then counts that namespace's processes, so the
cap is still per sandbox), the sandbox's init and the code checker are non-dumpable (nothing
of theirs is open to it through /proc) and ignore the signals they can, and the memory cap is
per process unless a memory cgroup can be made. GUARANTEES says what is weaker; it is said
once, and `sandbox.require` refuses to run without it. The caller reads output incrementally,
enforces the wall clock, the output cap and cancellation, and classifies the end as one of
STATUSES. Nothing the program does raises in the caller.

In a pool's batch (sandbox.zygote, the default) a program does not start its own bwrap and
interpreter: a warm interpreter in one such sandbox per pool worker forks it and does the same
set-up in the child (reasonrl.sandbox.zygote); the caller's side, its supervision and its
results are the same.

A Session (the tool loop's notebook) keeps one such forked process alive across cells, so a
cell never re-runs the ones before it, and prints what re-running them would have printed.

bwrap's outer process exits as soon as the program's exit status is known, before the
sandbox's pid 1 (the bootstrap's init, or a zygote) has exited; that pid 1 would be
reparented to the host's init, which in a container may never reap it. So while runs are in
progress the caller is a child subreaper (orphans of its descendants come to it rather than
to init), and each run reaps its pid 1 through a pidfd opened while it was alive: no zombie
outlives a run.

The package, one concern a module (each imports only those above it):

- results: STATUSES, SandboxResult, SandboxLimits, CancelToken
- cgroups, subreaper, seccomp: a run's memory cgroup, the caller as a child subreaper, the
  seccomp filter
- zygote: the warm interpreter that forks a batch's programs, and its caller's handle
- bwrap: finding bwrap, its options, the fresh sandbox's bootstrap and init
- guarantees: what holds only as root (a uid per sandbox) or with a memory cgroup
- supervisor: the caller's side of a running program (output, wall clock, kill, classify)
- sessions: the tool loop's notebook, one process across cells
- runner: Sandbox, one program in a fresh sandbox or a zygote
- pool: WorkerPool, batches of programs at most `workers` at a time
"""

from reasonrl.sandbox.bwrap import BWRAP_MISSING, HOST_DIR_PREFIX, bwrap_available, find_bwrap
from reasonrl.sandbox.guarantees import GUARANTEES, SANDBOX_UIDS, weaker_guarantees
from reasonrl.sandbox.pool import Program, SandboxRefused, WorkerPool
from reasonrl.sandbox.results import STATUSES, CancelToken, SandboxLimits, SandboxResult
from reasonrl.sandbox.runner import Sandbox, SandboxSettings
from reasonrl.sandbox.sessions import Session, program_with_history

__all__ = [
    "BWRAP_MISSING",
    "GUARANTEES",
    "HOST_DIR_PREFIX",
    "SANDBOX_UIDS",
    "STATUSES",
    "CancelToken",
    "Program",
    "Sandbox",
    "SandboxSettings",
    "SandboxLimits",
    "SandboxRefused",
    "SandboxResult",
    "Session",
    "WorkerPool",
    "bwrap_available",
    "find_bwrap",
    "program_with_history",
    "weaker_guarantees",
]
