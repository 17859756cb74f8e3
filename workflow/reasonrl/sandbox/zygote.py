"""A warm sandbox: one interpreter started once in a bubblewrap sandbox, forking each program.

Starting bubblewrap and a fresh interpreter costs tens of milliseconds per program, most of a
short program's time. A zygote is started once per pool worker (per batch) in the same
bubblewrap sandbox as a single program gets (namespaces, read-only system, private capped
/tmp and /dev/shm, the seccomp filter, which its children inherit). For each program it forks
a child that, as the fresh sandbox's bootstrap does, joins the run's memory cgroup, sets the
rlimits, drops to the run's own uid and runs the program in __main__ at the top level of the
interpreter (so exit, tracebacks, threads and atexit behave as under `python main.py`).

Nothing survives from one program to the next: when the program's main process ends (or
the caller asks for a kill), every other process of the sandbox's pid namespace is killed
(kill(-1) from its init, the zygote, repeated until none is left: they are all the program's)
before the exit status is reported, and then /tmp, /dev/shm and the ipc namespace's System V
objects are emptied before the next request is read. As root the programs run as uids of
their own; without root they share the zygote's uid, and the zygote is non-dumpable and
ignores every signal it can: either way they cannot signal, trace, read or write it, and they
inherit none of its descriptors. POSIX message queues, which could
outlive a program and cannot be listed without mounting, are refused by the seccomp filter.

The zygote is the pid namespace's init (bwrap --as-pid-1): a program sees pid 1 and its own
processes only, as in a fresh sandbox, and the zygote reaps the orphans that come to it.

A session (reasonrl.sandbox.Session) is such a program whose main process does not end with
its code: it runs one cell after another in one namespace, each read from /tmp/main.py when
the caller sends the cell's token on a channel of its own (a socket it keeps, the one
descriptor of ours it has, not inherited across exec), answering "<token> <exit status>"
there. Each cell prints what the tool loop's re-run program (reasonrl.sandbox.sessions'
program_with_history) prints for it: /tmp/main.py holds that very program, and the session
runs it less the re-run of the earlier cells it has run already (see make_runner). The
zygote supervises it as any program (RLIMIT_CPU, as a re-run program's, for the process's
whole life); "end" from the caller after each cell kills every process the cell started (see
end_cell).

The caller side (`Zygote`) talks to it over a SOCK_SEQPACKET socket: a request carries the
numbers (limits, uid) and the program's descriptors (stdin, stdout, stderr, ready pipe,
cgroup); the program itself is written beforehand into a file of the caller's folder that is
bound read-only at /tmp/main.py (so it takes no room in the capped /tmp); "kill" stops the
program in progress; the zygote answers "exit <wait status>".
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

from reasonrl.errors import ReasonRLError
from reasonrl.sandbox.subreaper import as_subreaper

# stdlib modules the zygote imports before forking any program: those of code_eval's checker
# and those most programs import. Not secrets or subprocess: secrets brings hashlib's OpenSSL
# (41 more mappings, 4 MB), which every fork copies and every exit tears down.
PRELOADED_MODULES = [
    *("ast", "collections", "ctypes", "functools", "io", "itertools", "json", "math", "re"),
    *("select", "signal", "struct", "time", "typing"),
]
SCRIPT_NAME = "main.py"  # in the caller's folder of a zygote
_START_TIMEOUT_S = 60.0
_EXIT_GRACE_S = 5.0

# The program's side of a sandbox, for the fresh sandbox's bootstrap and the zygote's forked
# child alike (given os, resource, sys and the numbers cpu, mem, nproc, fsize, uid, ready, site,
# keep (a session's channel to the caller, the one descriptor the program keeps; else 2) and
# path): the rlimits (a negative value leaves one alone), the uid drop (root is exempt from
# RLIMIT_NPROC), the ready byte, no descriptor of ours left open, stdout and stderr unbuffered
# as under `python -u`, site-packages only when asked for, and the program's source read.
CONFINE_SOURCE = """\
R = resource
for kind, soft, hard in ((R.RLIMIT_CPU, cpu, cpu + 1), (R.RLIMIT_AS, mem, mem),
                         (R.RLIMIT_NPROC, nproc, nproc), (R.RLIMIT_FSIZE, fsize, fsize),
                         (R.RLIMIT_CORE, 0, 0)):
    if soft >= 0:
        R.setrlimit(kind, (soft, hard))
if uid >= 0:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
os.write(ready, b"1")
os.closerange(3, keep)  # the program inherits no descriptor of ours but `keep` (see above)
os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))
import io
def unbuffered(fd, errors):
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding="utf-8", errors=errors, write_through=True)
sys.stdout = sys.__stdout__ = unbuffered(1, "strict")
sys.stderr = sys.__stderr__ = unbuffered(2, "backslashreplace")
if site:
    import site as site_module
    site_module.main()
with open(path, "rb") as script:
    source = script.read()
if b"\\0" in source:  # 3.11 patch releases report this as ValueError or SyntaxError
    sys.exit("SyntaxError: source code string cannot contain null bytes")
"""

# Runs inside the sandbox as `python -I -S -c ZYGOTE_SOURCE CTRL_FD MODULE,MODULE,...`.
# serve() returns only in a forked child, which then sets itself up and runs the program at the
# top level, as the fresh sandbox's bootstrap does (same order: cgroup, limits, uid drop, ready
# byte).
ZYGOTE_SOURCE = (
    """\
import array, contextlib, ctypes, os, resource, select, signal, socket, sys, time
# Nothing of the zygote is open to its programs, whatever the runner's uid: without root they
# run as its uid, and a dumpable process's /proc/<pid>/fd, mem, environ and root are open to
# a process of the same uid (ptrace and process_vm_* the seccomp filter refuses anyway).
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
    os._exit(5)
# The namespace's init gets only the signals it handles: none, so that a program of its uid
# cannot interrupt it (each program gets the interpreter's SIGINT handler back).
signal.signal(signal.SIGINT, signal.SIG_IGN)
CTRL = socket.socket(fileno=int(sys.argv[1]))
PRELOADED = sys.argv[2].split(",")
ORPHAN_REAP_S = 0.05
def receive():
    fds = array.array("i")
    message = b"kill"
    # a kill or end that crossed the last exit message: nothing to kill or end
    while message in (b"kill", b"end"):
        message, extra, _, _ = CTRL.recvmsg(4096, socket.CMSG_SPACE(8 * fds.itemsize))
    if not message:
        os._exit(0)  # the caller closed the zygote
    for level, kind, data in extra:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return [int(n) for n in message.split()], list(fds)
def others():
    # every process of the namespace but the zygote (zombies too: they count against
    # RLIMIT_NPROC until the sandbox's init reaps them, which it does at once)
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != 1]
def reap(child=None):
    # The zygote is the namespace's init: orphans come to it, and their zombies, which count
    # against RLIMIT_NPROC, are reaped here. The wait status of `child`, if it was one.
    found = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return found
        if pid == 0:
            return found
        if pid == child:
            found = status
def kill_rest():
    # Every process of the namespace but the zygote is the program's (one program at a time):
    # kill(-1) from the namespace's init signals all of them at once (a fork bomb cannot
    # outrun it), whatever their uid; again until none is left, reaping the zombies.
    for _ in range(5000):
        reap()
        if not others():
            return
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass  # only zombies left
        time.sleep(0.001)
    os._exit(3)  # cannot promise that nothing of the program survives: stop here
def stat_fields(pid):
    # /proc/PID/stat from the state on (field 3)
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()
def end_cell(child):
    # A session's cell has ended: no process of it but the session's own runs on until the
    # next cell (its CPU time would be no cell's). The others are killed, again until none is
    # left (zombies are left to their parent). Then None; the session's wait status if it
    # has ended meanwhile, or was killed as they could not be (outrun by forks).
    for _ in range(1000):
        status = reap(child)
        if status is not None:
            return status
        rest = [p for p in others() if p != child and not is_zombie(p)]
        if not rest:
            return None
        for pid in rest:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.001)
    os.kill(child, signal.SIGKILL)
    return os.waitpid(child, 0)[1]
def is_zombie(pid):
    try:
        return stat_fields(pid)[0] in ("Z", "X")
    except OSError:
        return True  # gone, reaped
def supervise(child):
    # Until the program's main process ends, or the caller asks for a kill (or is gone);
    # then that process first (reaped, so that its zombie does not count), then the rest.
    # Orphans are reaped meanwhile, at least every ORPHAN_REAP_S; "end" (after each cell of
    # a session) kills its other processes (see end_cell), answered "ended".
    pidfd = os.pidfd_open(child)
    status = None
    caller_gone = False
    while status is None:
        if CTRL in select.select([pidfd, CTRL], [], [], ORPHAN_REAP_S)[0]:
            message = CTRL.recv(64)
            if message == b"end":
                status = end_cell(child)
                if status is None:
                    CTRL.send(b"ended")
                continue
            caller_gone = message != b"kill"
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            status = os.waitpid(child, 0)[1]
        else:
            status = reap(child)
    os.close(pidfd)
    kill_rest()
    if caller_gone:
        os._exit(0)
    return status
def remove_sysv_ipc():
    libc = None
    for kind, remove in (("shm", "shmctl"), ("msg", "msgctl"), ("sem", "semctl")):
        with open(f"/proc/sysvipc/{kind}") as table:
            ids = [int(line.split()[1]) for line in table.readlines()[1:] if line.strip()]
        for ident in ids:
            if libc is None:
                import ctypes
                libc = ctypes.CDLL(None, use_errno=True)
            if getattr(libc, remove)(ident, 0, 0) != 0:  # IPC_RMID
                os._exit(4)
def empty(folder):
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.path == "/tmp/main.py":
                continue  # the program's file, bound read-only from the caller's folder
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
def remove_tree(path):
    # Without root the zygote needs the permission bits: a program may have taken them off
    # its folders (root's shutil.rmtree would not care).
    os.chmod(path, 0o700)
    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
    os.rmdir(path)
def serve():
    CTRL.send(b"hello")
    while True:
        numbers, fds = receive()
        child = os.fork()
        if child == 0:
            CTRL.close()
            return numbers, fds
        for fd in fds:
            os.close(fd)
        CTRL.send(b"exit %d" % supervise(child))
        empty("/tmp")
        empty("/dev/shm")
        remove_sysv_ipc()
def make_runner(sys, os, signal, channel, path):
    # its own closure: the program's __main__ holds none of our names. channel: a session's
    # socket to the caller (None for a single program). The builtins it needs are bound here,
    # once: looked up at run time they would come from __main__, the program's namespace,
    # where a cell's `from re import compile` or `from os import *` would replace them.
    import ast, builtins, gc, types
    b = types.SimpleNamespace(**vars(builtins))  # a copy: later changes to builtins miss it
    # What the re-run of earlier cells (program_with_history) looks up as it runs them
    replay_names = ("exec", "compile", "BaseException", "_c", "_io")
    contextlib_module, io_module = sys.modules["contextlib"], sys.modules["io"]
    replay_tools = [
        (contextlib_module, "redirect_stdout"),
        (contextlib_module, "redirect_stderr"),
        (io_module, "StringIO"),
        *((builtins, name) for name in replay_names[:3]),
    ]
    replay_originals = [b.getattr(owner, name) for owner, name in replay_tools]
    def exit_status(code):
        if code is None:
            return 0
        if b.isinstance(code, b.int) and -2**31 <= code < 2**31:
            return code
        try:
            sys.stderr.write(f"{code}\\n")
        except b.BaseException:
            pass
        return 1
    def run_program(code, namespace):
        # The end of `python main.py` (Py_RunMain): the exception or exit status, non-daemon
        # threads joined, atexit handlers, stdout and stderr flushed; then out, without the
        # interpreter's final teardown (a walk over every object, copying the zygote's pages).
        status = 0
        interrupted = False
        try:
            b.exec(code, namespace)
        except b.SystemExit as exc:
            status = exit_status(exc.code)
        except b.BaseException as exc:
            status, interrupted = 1, b.isinstance(exc, b.KeyboardInterrupt)
            exc.__traceback__ = exc.__traceback__.tb_next  # from the program's frame on
            sys.excepthook(b.type(exc), exc, exc.__traceback__)
        end_program(status, interrupted)
    def end_program(status, interrupted):
        if "threading" in sys.modules:
            try:
                sys.modules["threading"]._shutdown()
            except b.BaseException as exc:
                sys.unraisablehook(exc)
        import atexit
        atexit._run_exitfuncs()
        for stream, failed_status in ((sys.stdout, 120), (sys.stderr, status)):
            try:
                stream.flush()
            except b.BaseException:
                status = failed_status
        if interrupted:  # as the interpreter ends on an uncaught KeyboardInterrupt
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(status & 0xFF)
    def compile_cell(source, history, replayed):
        # A session's cell: /tmp/main.py is the re-run program of it (program_with_history:
        # the re-run of `history` earlier cells, then the cell), compiled as run_program's is
        # (the same SyntaxError, warnings and line numbers), less the re-run where this
        # process has run those cells already. The program's first statement (the re-run's
        # import) and the one after the re-run (its del) stay: the cell finds what they leave.
        if b"\\0" in source:  # as CONFINE_SOURCE says it of a program
            raise b.SystemExit("SyntaxError: source code string cannot contain null bytes")
        if not replayed:
            return b.compile(source, path, "exec")
        tree = b.compile(source, path, "exec", ast.PyCF_ONLY_AST)
        del tree.body[1 : 1 + history]
        return b.compile(tree, path, "exec")
    # Names of what writes past sys.stdout and sys.stderr (to the descriptors, from another
    # program) or needs them to be files: the re-run, which only swaps sys.stdout and
    # sys.stderr for StringIOs, would print again what a cell using them wrote, or fail
    # where it did not (os.write needs both names).
    past_sys_stdout = {
        *("subprocess", "pty", "multiprocessing", "ctypes", "system", "popen", "fdopen"),
        *("__stdout__", "__stderr__", "buffer", "fileno", "isatty", "reconfigure", "dup2"),
        *("writev", "pwrite", "sendfile", "posix_spawn", "posix_spawnp", "execv", "execve"),
        *("execl", "execle", "execlp", "execlpe", "execvp", "execvpe", "spawnl", "spawnv"),
    }
    def names_of(code, found):
        found.update(code.co_names)
        for const in code.co_consts:
            if b.isinstance(const, types.CodeType):
                names_of(const, found)
        return found
    def rerun_repeats_more(code):
        # whether a re-run of this cell would write or fail where its own run did not
        names = names_of(code, b.set())
        return b.bool(names & past_sys_stdout) or {"os", "write"} <= names
    def compiled_as_rerun(cell):
        # a cell as the re-run compiles it; its warnings go where the re-run's do (the
        # warnings' state is left alone); None if it does not compile
        try:
            with contextlib_module.redirect_stderr(io_module.StringIO()):
                return b.compile(cell, "<cell>", "exec")
        except b.BaseException:
            return None
    def rerun_cells(lines):
        # the cells a program re-runs, from its exec(compile(...)) lines (one in five)
        head, tail = b"        exec(compile(", b", '<cell>', 'exec'))"
        return [ast.literal_eval(line[b.len(head) : -b.len(tail)].decode()) for line in lines]
    suspended_kinds = {types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType}
    def suspended_code(thing):
        frame = b.getattr(thing, "gi_frame", None) or b.getattr(thing, "cr_frame", None)
        frame = frame or b.getattr(thing, "ag_frame", None)
        return frame.f_code if frame is not None else None  # None: finished
    def pair_codes(ours, theirs, pairs):
        # The code objects the compiler made for functions (classes, lambdas, comprehensions)
        # of the same source, in the same order; False where they do not match.
        mine = [c for c in ours.co_consts if b.isinstance(c, types.CodeType)]
        other = [c for c in theirs.co_consts if b.isinstance(c, types.CodeType)]
        if b.len(mine) != b.len(other):
            return False
        for one, two in b.zip(mine, other):
            if one.co_name != two.co_name or not pair_codes(one, two, pairs):
                return False
            pairs[b.id(one)] = two
        return True
    def as_rerun_leaves_it(source, history, replayed, code, namespace):
        # After a cell, what it left becomes what a later cell's re-run of it leaves: its
        # functions' code compiled from the cell alone as "<cell>" (a later traceback shows
        # their frames so, with the cell's own line numbers), its docstring as __doc__.
        # False where that re-run would still differ (a cell that compiles alone but not in
        # the program, that rebinds what the re-run uses, writes past sys.stdout or leaves a
        # generator suspended; a first cell whose program did not compile, so did not re-run
        # the history): then the session must end.
        *lines, cell = source.split(b"\\n", 2 + 5 * history)
        # The cells this program re-ran: what a later re-run repeats of them, or what one
        # binding _c or _io breaks in it (both deleted after the re-run), leaves no trace.
        for earlier in b.map(compiled_as_rerun, [] if replayed else rerun_cells(lines[3::5])):
            if earlier is not None and rerun_repeats_more(earlier):
                return False
            if earlier is not None and {"_c", "_io"} & names_of(earlier, b.set()):
                return False
        rerun = compiled_as_rerun(cell.decode("utf-8", "replace"))
        if code is None or rerun is None:
            return code is None and rerun is None and (replayed or not history)
        if rerun_repeats_more(rerun):
            return False
        pairs = {}
        if not pair_codes(code, rerun, pairs):
            return False
        for thing in gc.get_objects() if pairs else ():
            kind = b.type(thing)
            if kind is types.FunctionType and b.id(thing.__code__) in pairs:
                thing.__code__ = pairs[b.id(thing.__code__)]
            elif kind in suspended_kinds and b.id(suspended_code(thing)) in pairs:
                return False  # a generator (coroutine) of the cell runs on in its own frames
        if "__doc__" in rerun.co_names and "__doc__" not in code.co_names:
            namespace["__doc__"] = rerun.co_consts[0]  # a docstring: the re-run sets __doc__
        current = [b.getattr(owner, name) for owner, name in replay_tools]
        unchanged = b.all(now is then for now, then in b.zip(current, replay_originals))
        return unchanged and not b.any(name in namespace for name in replay_names)
    def run_session(source, namespace):
        # Before each cell the caller sends "<token> <history> <replayed>": the cell's token,
        # the number of earlier cells the program in /tmp/main.py re-runs, and whether this
        # process has run them (1) or runs them now (0: the session's first cell). The cell's
        # exit status goes back after it, so that what a thread or a child of an earlier cell
        # writes on the channel is no cell's end. The next cell's program is read from the
        # script file (rewritten by the caller) once its token has come; EOF: the end. A cell
        # after which the session cannot go on as the re-run would (KeyboardInterrupt, atexit
        # handlers, see as_rerun_leaves_it) ends as a program does, and so does the process.
        streams = sys.stdout, sys.stderr
        message = channel.recv(64)
        while message:
            token, history, replayed = message.split()
            history, replayed = b.int(history), replayed == b"1"
            status, interrupted, code = 0, False, None
            try:
                code = compile_cell(source, history, replayed)
            except b.SystemExit as exc:
                status = exit_status(exc.code)
            except b.BaseException as exc:  # as the program's own compile, uncaught
                status = 1
                sys.excepthook(b.type(exc), exc, exc.__traceback__)
            if code is not None:
                try:
                    b.exec(code, namespace)  # from run_program's depth: the same room to recurse
                except b.SystemExit as exc:
                    status = exit_status(exc.code)
                except b.BaseException as exc:
                    status, interrupted = 1, b.isinstance(exc, b.KeyboardInterrupt)
                    exc.__traceback__ = exc.__traceback__.tb_next  # from the cell's frame on
                    sys.excepthook(b.type(exc), exc, exc.__traceback__)
            threading = sys.modules.get("threading")
            if threading is not None:
                try:
                    for thread in threading.enumerate():
                        if not thread.daemon and thread is not threading.current_thread():
                            thread.join()
                except b.BaseException as exc:
                    sys.unraisablehook(exc)
            atexit = sys.modules.get("atexit")
            goes_on = not interrupted and not (atexit and atexit._ncallbacks())
            try:
                goes_on = goes_on and as_rerun_leaves_it(source, history, replayed, code, namespace)
            except b.BaseException:  # (what the cell left broke the check): as a program
                goes_on = False
            if not goes_on:
                end_program(status, interrupted)
            for stream, failed_status in ((sys.stdout, 120), (sys.stderr, status)):
                try:
                    stream.flush()
                except b.BaseException:
                    status = failed_status
            # The re-run's redirect_stdout (stderr) puts back, after each cell, the stream
            # it found: a cell's `sys.stdout = ...` holds for that cell only.
            sys.stdout, sys.stderr = streams
            channel.send(token + b" %d" % (status & 0xFF))
            message = channel.recv(64)
            if message:
                with b.open(path, "rb") as script:
                    source = script.read()
        os._exit(0)
    return run_program if channel is None else run_session
# Modules the code checker (reasonrl.tasks.code_eval) and most programs import, loaded once here
# rather than in every program (forked children share them; none of their state is shared
# back: each program changes only its own copy).
for module in PRELOADED:
    __import__(module)
compile("pass", "<warm-up>", "exec")  # the compiler's first use sets up its state: once
import gc
gc.freeze()  # the collector never walks (so never copies) the pages the children share
numbers, fds = serve()
signal.signal(signal.SIGINT, signal.default_int_handler)
cpu, mem, nproc, fsize, uid, site, cgroup, session = numbers
stdin, stdout, stderr, ready = fds[:4]
if cgroup:
    os.write(fds[4], b"0")
keep = fds[-1] if session else 2  # a session's channel to the caller, its last descriptor
os.chdir("/tmp")
for target, fd in ((0, stdin), (1, stdout), (2, stderr)):
    os.dup2(fd, target)
path = "/tmp/main.py"
"""
    + CONFINE_SOURCE
    + """\
# A session compiles each cell itself (a SyntaxError ends that cell, not the session).
code = source if session else compile(source, path, "exec")
if session:
    os.set_inheritable(keep, False)  # a program the session runs does not get the channel
run = make_runner(sys, os, signal, socket.socket(fileno=keep) if session else None, path)
sys.argv = [path]
__file__ = path
# The program runs in __main__'s namespace, as under `python path`, without our names.
for name in [n for n in globals() if not n.startswith("__") and n not in ("code", "run")]:
    del globals()[name]
del name
globals().pop("run")(globals().pop("code"), globals())
"""
)


class ZygoteBroken(ReasonRLError):
    """The zygote did not answer as it must: it is closed, and its run cannot be trusted."""


class Zygote:
    """The caller's handle on one zygote: started at once, one program at a time, closed.

    command: the bwrap argv ending in ZYGOTE_SOURCE and the fd number of the zygote's end of
    `ctrl`; child_fds: descriptors bwrap must inherit (closed here once it has them);
    status_read: the read end of bwrap's --json-status-fd, whose first line names the
    sandbox's pid 1; host_dir: the caller's folder of this zygote, with SCRIPT_NAME bound at
    /tmp/main.py in the sandbox (removed at close).
    """

    def __init__(
        self,
        command: list[str],
        child_fds: list[int],
        ctrl: socket.socket,
        status_read: int,
        host_dir: tempfile.TemporaryDirectory,
    ) -> None:
        self.ctrl = ctrl
        self.broken = False
        self._resources = ExitStack()
        self._sandbox_pidfd: int | None = None
        self._status_read = status_read
        try:
            self._start(command, child_fds, host_dir)
        except BaseException:
            self.broken = True
            self.close()
            raise
        finally:
            for fd in child_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _start(
        self, command: list[str], child_fds: list[int], host_folder: tempfile.TemporaryDirectory
    ) -> None:
        resources = self._resources
        host_dir = resources.enter_context(host_folder)
        self._script = Path(host_dir) / SCRIPT_NAME
        # bwrap's init outlives bwrap itself: it comes to us (a subreaper) and we reap it.
        resources.enter_context(as_subreaper())
        self._log = resources.enter_context(open(Path(host_dir) / "zygote.log", "w+b"))  # noqa: SIM115
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            pass_fds=tuple(child_fds),
            cwd=host_dir,
            env={},
            start_new_session=True,
        )
        for fd in child_fds:
            os.close(fd)
        child_fds.clear()
        started = _wait_readable(self.ctrl.fileno(), _START_TIMEOUT_S)
        if not started or self.ctrl.recv(16) != b"hello":
            self._log.seek(0)
            log = self._log.read().decode(errors="replace").strip()
            raise ZygoteBroken(f"the sandbox zygote did not start: {log or 'no message'}")
        first_status = os.read(self._status_read, 4096).split(b"\n", 1)[0]
        child_pid = json.loads(first_status).get("child-pid")
        if child_pid is not None:
            self._sandbox_pidfd = os.pidfd_open(child_pid)

    def alive(self) -> bool:
        """False once the zygote has gone (its end of the socket reads EOF) or broke."""
        return not self.broken and not _wait_readable(self.ctrl.fileno(), 0)

    def write_script(self, code: bytes) -> None:
        """The code the program (or a session's next cell) reads from /tmp/main.py."""
        # Rewritten in place: the sandbox's /tmp/main.py is a bind of this very file.
        script = os.open(self._script, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC)
        with open(script, "wb") as script_file:
            script_file.write(code)

    def start_program(self, code: bytes, numbers: list[int], fds: list[int]) -> None:
        """Ask for a program run: its code, numbers (limits, uid, flags) and descriptors."""
        self.write_script(code)
        header = " ".join(str(n) for n in numbers).encode()
        message = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        try:
            self.ctrl.sendmsg([header], message)
        except OSError as exc:
            self.broken = True
            raise ZygoteBroken(f"the sandbox zygote is gone: {exc}") from None

    def end_cell(self) -> int | None:
        """After a session's cell: every process of it but its own is killed, so nothing of
        the cell runs on. None once done; the wait status if the session has ended."""
        return self._ask(b"end", b"ended", "the end of a cell")

    def _ask(self, request: bytes, answer: bytes, what: str) -> int | None:
        """Send a request about the running program: None once answered, the program's wait
        status if it has ended (the zygote says so instead)."""
        try:
            self.ctrl.send(request)
        except OSError as exc:
            self.broken = True
            raise ZygoteBroken(f"the sandbox zygote is gone: {exc}") from None
        if _wait_readable(self.ctrl.fileno(), _EXIT_GRACE_S):
            with contextlib.suppress(OSError):
                message = self.ctrl.recv(64)
                if message == answer:
                    return None
                if message.startswith(b"exit "):
                    return int(message.split()[1])
        self.broken = True
        self._kill_sandbox()
        raise ZygoteBroken(f"the sandbox zygote did not answer {what}")

    def kill_program(self) -> None:
        """Ask the zygote to kill the program in progress and everything of its uid."""
        with contextlib.suppress(OSError):
            self.ctrl.send(b"kill")

    def exit_status(self, timeout: float) -> int:
        """The program's wait status, once every process of it is gone; a zygote that does
        not say so in time is killed with its whole sandbox, and ZygoteBroken raised."""
        if _wait_readable(self.ctrl.fileno(), timeout):
            with contextlib.suppress(OSError):
                message = self.ctrl.recv(64)
                if message.startswith(b"exit "):
                    return int(message.split()[1])
        self.broken = True
        self._kill_sandbox()
        raise ZygoteBroken("the sandbox zygote did not report the end of the program")

    def _kill_sandbox(self) -> None:
        """Kill the sandbox's pid 1: the kernel then kills everything in its namespace."""
        if self._sandbox_pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self._sandbox_pidfd, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def close(self) -> None:
        """Stop the zygote (it exits when its socket closes) and reap bwrap and its init."""
        self.ctrl.close()
        process = getattr(self, "process", None)
        try:
            if process is not None:
                try:
                    process.wait(_EXIT_GRACE_S)
                except subprocess.TimeoutExpired:
                    self._kill_sandbox()
                    process.wait()
            if self._sandbox_pidfd is not None:
                _wait_readable(self._sandbox_pidfd, _EXIT_GRACE_S)
                with contextlib.suppress(ChildProcessError):  # bwrap reaped it itself
                    os.waitid(os.P_PIDFD, self._sandbox_pidfd, os.WEXITED | os.WNOHANG)
                os.close(self._sandbox_pidfd)
        finally:
            os.close(self._status_read)
            self._resources.close()


class WarmZygotes:
    """Idle zygotes, kept between the programs of a batch (`warm()`) and closed after it.

    Inside warm(), each pool worker takes an idle zygote of the right kind (key: what its
    bwrap options depend on) or starts one; a lease outside it (or ending after it) closes
    its zygote after its one program, so that no process of ours outlives a run.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[object, list[Zygote]] = {}
        self._holds = 0

    @property
    def active(self) -> bool:
        """Whether a warm() block is open (runs should then go through zygotes)."""
        return self._holds > 0

    @contextlib.contextmanager
    def warm(self) -> Iterator[None]:
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                idle = [z for zs in self._idle.values() for z in zs] if self._holds == 0 else []
                if self._holds == 0:
                    self._idle.clear()
            _close_all(idle)

    @contextlib.contextmanager
    def lease(self, key: object, start: Callable[[], Zygote]) -> Iterator[Zygote]:
        zygote = self._take_idle(key) or start()
        try:
            yield zygote
        finally:
            with self._lock:
                keep = self._holds > 0 and zygote.alive()
                if keep:
                    self._idle.setdefault(key, []).append(zygote)
            if not keep:
                zygote.close()

    def _take_idle(self, key: object) -> Zygote | None:
        while True:
            with self._lock:
                idle = self._idle.get(key)
                if not idle:
                    return None
                zygote = idle.pop()
            if zygote.alive():
                return zygote
            zygote.close()


def _close_all(zygotes: list[Zygote]) -> None:
    for zygote in zygotes:
        zygote.close()


def _wait_readable(fd: int, seconds: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        return bool(selector.select(seconds))
