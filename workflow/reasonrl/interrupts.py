"""Ctrl-C and SIGTERM end a command with one line and the shell's status (130, 143).

SIGTERM (`kill`, a scheduler's stop) raises the same exception as Ctrl-C, so both unwind the
stack: the worker pool kills its sandboxes, generator processes are stopped, atomic writes
drop their temp files (nothing half-written looks finished), and the process exits.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Iterator

HANDLED = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A stop asked for by signal `signum`; a KeyboardInterrupt, so what cleans up after
    Ctrl-C cleans up after it too."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_interrupted(signum: int, frame) -> None:
    """A signal handler: stop as Ctrl-C does, remembering which signal asked."""
    raise Interrupted(signum)


@contextlib.contextmanager
def one_line_on_interrupt(prog: str) -> Iterator[None]:
    """Turn SIGINT and SIGTERM into Interrupted inside the block; on the way out, print one
    line and exit 128 + the signal's number.

    A signal that is ignored when we start stays ignored: whoever started us (nohup, a
    background job) asked for that.
    """
    previous = {signum: signal.getsignal(signum) for signum in HANDLED}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, raise_interrupted)
    try:
        yield
    except KeyboardInterrupt as err:
        signum = getattr(err, "signum", signal.SIGINT)
        print(f"{prog}: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        sys.exit(128 + signum)
    finally:
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)
