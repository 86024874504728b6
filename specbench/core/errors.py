"""What users see when something stops: bad input (one line, exit code 2) or an interruption."""

from __future__ import annotations

from pathlib import Path


class SpecbenchError(Exception):
    """Bad input or an unusable environment, explained in one line for the user."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C (or SIGTERM, which the CLI turns into one) stopped a run or a training after some work.

    `path` is where the finished work was kept and `kept` says what it is; a KeyboardInterrupt
    still, so code that catches those keeps working.
    """

    def __init__(self, path: Path, kept: str):
        super().__init__(kept)
        self.path = Path(path)
        self.kept = kept


class Stopped(SpecbenchError):
    """A run stopped part-way for a cause the user must fix (a server refused the credentials): one line, and
    what was measured kept at `path` for `--resume`."""

    def __init__(self, path: Path, why: str):
        super().__init__(why)
        self.path = Path(path)
