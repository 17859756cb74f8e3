"""The one exception type the CLI turns into a one-line error message."""


class ReasonRLError(Exception):
    """A user-facing error: bad input file, unknown config key, missing model.

    The message is printed as one line by the CLI; it names the file, line or key.
    """
