"""The one exception type the CLI and the workflow turn into a one-line error message."""

import sys
from typing import NoReturn


class ReasonRLError(Exception):
    """A user-facing error: bad input file, unknown config key, missing model.

    The message is printed as one line by the CLI; it names the file, line or key.
    """


def exit_with(err: ReasonRLError) -> NoReturn:
    """Print `err` as the one line and exit with status 2 (bad input, as argparse's own)."""
    print(f"reasonrl: error: {err}", file=sys.stderr)
    sys.exit(2)
