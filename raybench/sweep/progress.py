"""What a sweep prints while it runs: one line per finished trial, so a user sees it move.

Plain Python, no Ray: ray_backend's Tune callback feeds it finished trials and prints the lines it returns.
The ETA is the trials left at the rate trials have finished in this process (concurrent trials included,
since they finish concurrently too): rough after the first trial, better with each. Trials a resumed sweep
replays from their records finish instantly and are left out of the rate.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


def duration(seconds: float) -> str:
    """Seconds as `42s`, `3m07s` or `1h02m`."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass
class StageProgress:
    """Counts of one stage of a sweep (the search, or the replicates) as its trials finish."""

    stage: str  # "search" or "replicates"
    total: int
    metric_label: str  # what the selection value is, e.g. "OOD val acc"
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=math.nan)
    done: int = 0
    failed: int = 0
    stopped: int = 0  # finished early at an early-stopping scheduler's request (ASHA)
    untimed: int = 0  # finished trials left out of the rate: replayed ones, and those before a resume
    best: float | None = None

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def finished(self, value: float | None, failed: bool, replayed: bool = False, stopped: bool = False) -> str:
        """Count one finished trial (its selection value; whether it failed, was replayed from its record or
        was stopped early); the line to print."""
        self.done += 1
        self.failed += int(failed)
        self.stopped += int(stopped)
        self.untimed += int(replayed)
        if not failed and value is not None and math.isfinite(value) and (self.best is None or value > self.best):
            self.best = value
        return self.line()

    def restart(self) -> None:
        """Continue in a new process (a resumed sweep): keep the counts, time from now."""
        self.started = self.clock()
        self.untimed = self.done

    def line(self) -> str:
        elapsed = self.clock() - self.started
        parts = [f"{self.stage}: {self.done}/{self.total} done", f"{self.failed} failed"]
        if self.stopped:
            parts.append(f"{self.stopped} stopped early")
        parts.append(f"best {self.metric_label} {self.best:.4f}" if self.best is not None else
                     f"best {self.metric_label} -")
        parts.append(f"elapsed {duration(elapsed)}")
        parts.append(f"ETA {self.eta(elapsed)}")
        return ", ".join(parts)

    def eta(self, elapsed: float) -> str:
        left = max(self.total - self.done, 0)
        if left == 0:
            return "0s"
        trained = self.done - self.untimed
        if trained <= 0:
            return "unknown"
        return duration(elapsed / trained * left)
