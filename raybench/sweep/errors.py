"""What can stop a sweep, as exception types every layer may raise and the sweep's entry point
(raybench.commands.sweep, behind `raybench sweep`) and the CLI turn into one line each.

Kept apart from the runner and the Ray backend so that the command line can name them without importing Ray.
"""
from __future__ import annotations


class OptionError(ValueError):
    """A sweep option that can never work; the message starts with the flag and says what was expected."""


class SweepExists(ValueError):
    """A sweep of that name already has results; nothing is overwritten without --resume."""


class SweepBusy(ValueError):
    """Another live driver holds the sweep's lock on --storage; the message names it (host, pid)."""


class ClusterError(RuntimeError):
    """The cluster cannot be reached, or can never run what was asked of it; the message says which."""


class SweepInterrupted(Exception):
    """The sweep stopped before it finished (Ctrl-C, SIGTERM): what was done is kept, `--resume` continues it."""

    def __init__(self, name: str, stage: str, done: int, expected: int) -> None:
        super().__init__(f"sweep {name!r} interrupted during the {stage}: {done} of {expected} runs finished")
        self.name, self.stage, self.done, self.expected = name, stage, done, expected
