"""What a sweep prints while it runs, from its first second: the phases as they begin, each stage's trials as they
start, train and finish.

Two displays, one chosen per process (`display_for`):
- `LiveDisplay`, on a terminal: a `rich` progress display updated in place, the stage's bar (done, running,
  failed, the best selection value so far, elapsed, ETA) over one bar per running trial (its epochs). Phase lines
  and one line per finished trial print above it and stay in the scrollback.
- `PlainDisplay`, when the output is a file or a pipe, under `--quiet`, or on CI: the same lines, plus the stage's
  status line every `--progress-every` seconds while a stage runs, and never an escape code.

Plain Python and `rich`, no Ray: ray_backend's Tune callback feeds a `StageProgress` and tells the display; the
runner's phase lines go through `say`. The display of the running process is installed with `showing`, so a
callback Tune restores from its experiment state (a `--resume`) finds it again.

The ETA is the trials left at the rate trials have finished in this process (concurrent trials included, since
they finish concurrently too): rough after the first trial, better with each. Trials a resumed sweep replays
from their records finish instantly and are left out of the rate.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

CI_VARIABLE = "CI"  # set by every CI service: a log, not a terminal, whatever it emulates


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
class RunningTrial:
    """A trial that started and has not finished: its label and the epochs it has reported of those it plans."""

    label: str
    epochs_done: int = 0
    epochs: int | None = None

    def epochs_text(self) -> str:
        """`epoch 3/10` (the last one it finished), `epoch 3` when it runs past its plan, `starting` before one."""
        if self.epochs_done == 0:
            return "starting"
        if self.epochs is not None and self.epochs_done <= self.epochs:
            return f"epoch {self.epochs_done}/{self.epochs}"
        return f"epoch {self.epochs_done}"


@dataclass
class StageProgress:
    """Counts of one stage of a sweep (the search, or the replicates) as its trials start, train and finish."""

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
    running: dict[str, RunningTrial] = field(default_factory=dict)  # Tune's trial id -> the trial

    def __post_init__(self) -> None:
        if math.isnan(self.started):
            self.started = self.clock()

    def trial_started(self, key: str, label: str, epochs: int | None) -> None:
        self.running.setdefault(key, RunningTrial(label, epochs=epochs))

    def epoch_reported(self, key: str, epochs_done: int, value: float | None) -> None:
        """A running trial finished an epoch: its count, and its selection value so far, which may be the best."""
        trial = self.running.get(key)
        if trial is not None:
            trial.epochs_done = max(trial.epochs_done, epochs_done)
        self._offer(value)

    def finished(self, value: float | None, failed: bool, replayed: bool = False, stopped: bool = False,
                 key: str | None = None) -> str:
        """Count one finished trial (its selection value; whether it failed, was replayed from its record or
        was stopped early); the line to print."""
        self.running.pop(key, None)
        self.done += 1
        self.failed += int(failed)
        self.stopped += int(stopped)
        self.untimed += int(replayed)
        if not failed:
            self._offer(value)
        return self.line()

    def _offer(self, value: float | None) -> None:
        if value is not None and math.isfinite(value) and (self.best is None or value > self.best):
            self.best = value

    def restart(self) -> None:
        """Continue in a new process (a resumed sweep): keep the counts, time from now; no trial runs yet."""
        self.started = self.clock()
        self.untimed = self.done
        self.running = {}

    def line(self) -> str:
        """`search: 2/6 done, 2 running (epoch 3/10, epoch 1/10), 0 failed, best ..., elapsed 1m20s, ETA 2m40s`."""
        parts = [f"{self.stage}: {self.done}/{self.total} done"]
        if self.running:
            parts.append(f"{len(self.running)} running ({', '.join(t.epochs_text() for t in self.running.values())})")
        parts.append(f"{self.failed} failed")
        if self.stopped:
            parts.append(f"{self.stopped} stopped early")
        return ", ".join([*parts, *self.standing()])

    def standing(self) -> list[str]:
        """The best value so far, the elapsed time and the ETA, as the line and the live display show them."""
        elapsed = self.clock() - self.started
        best = f"{self.best:.4f}" if self.best is not None else "-"
        return [f"best {self.metric_label} {best}", f"elapsed {duration(elapsed)}", f"ETA {self.eta(elapsed)}"]

    def eta(self, elapsed: float) -> str:
        left = max(self.total - self.done, 0)
        if left == 0:
            return "0s"
        trained = self.done - self.untimed
        if trained <= 0:
            return "unknown"
        return duration(elapsed / trained * left)


class Display(Protocol):
    """Where a sweep's progress goes. Every method is called in the sweep's process, from its main thread or
    from Tune's loop (which runs there)."""

    def say(self, line: str) -> None:
        """A phase line, or any other line the sweep prints; it stays on the console."""

    def stage_began(self, progress: StageProgress) -> None:
        """A stage's first moment, before any of its trials ran: `0/N`."""

    def moved(self, progress: StageProgress) -> None:
        """A trial started or reported an epoch."""

    def trial_finished(self, progress: StageProgress, line: str) -> None:
        """A trial finished (or failed); `line` is the stage's line after it."""

    def tick(self, progress: StageProgress) -> None:
        """Tune's loop turned (several times a second); the plain display prints its interval line here."""

    def stage_ended(self, progress: StageProgress) -> None:
        """The stage's experiment ended (finished or cut short)."""

    def close(self) -> None:
        """The sweep is over: give the console back as it was."""


class PlainDisplay:
    """Lines only: phases, the stage's `0/N`, one line per finished trial, and the stage's line every `every_s`
    seconds while a stage runs and no trial finishes (trials still waiting for a slot included: the line says
    the sweep is alive). For files, pipes, CI and `--quiet`; no escape codes."""

    def __init__(self, write: Callable[[str], None] | None = None, every_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.write = write or _print_now
        self.every_s, self.clock = every_s, clock
        self.last = clock()

    def say(self, line: str) -> None:
        self.write(line)

    def stage_began(self, progress: StageProgress) -> None:
        self._line(progress.line())

    def moved(self, progress: StageProgress) -> None:
        self.tick(progress)

    def trial_finished(self, progress: StageProgress, line: str) -> None:
        self._line(line)

    def tick(self, progress: StageProgress) -> None:
        if self.clock() - self.last >= self.every_s:
            self._line(progress.line())

    def stage_ended(self, progress: StageProgress) -> None:
        pass

    def close(self) -> None:
        pass

    def _line(self, line: str) -> None:
        self.write(line)
        self.last = self.clock()


def _print_now(line: str) -> None:
    print(line, flush=True)


@dataclass(frozen=True)
class Row:
    """One line under a live board's bar: a running trial (its epochs, as a bar) or a running pair (its text)."""

    label: str
    text: str
    completed: float | None = None
    total: float | None = None


class LiveBoard:
    """rich's progress display, redrawn in place: a headline bar (done of total, and a status) over one row per
    running item. Lines printed through `say` (or by print while it is shown) go above it and stay."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console

        self.console = Console(file=stream, highlight=False, soft_wrap=True)
        self.bars: Any = None  # rich.progress.Progress while shown
        self.headline: Any = None
        self.total = 0
        self.rows: dict[str, Any] = {}

    def say(self, line: str) -> None:
        self.console.print(line, markup=False, emoji=False)

    def start(self, title: str, total: int) -> None:
        from rich.progress import BarColumn, Progress, TextColumn

        self.stop()
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24),
                             TextColumn("{task.fields[count]}", markup=False),
                             TextColumn("{task.fields[status]}", markup=False), console=self.console,
                             refresh_per_second=4)
        self.total = total
        self.headline = self.bars.add_task(title, total=total, status="", count=f"0/{total}")
        self.bars.start()

    def show(self, done: int, status: str, rows: dict[str, Row]) -> None:
        """The headline's count and status, and exactly `rows` (by key) under it."""
        if self.bars is None:
            return
        self.bars.update(self.headline, completed=done, status=status, count=f"{done}/{self.total}")
        for key in [k for k in self.rows if k not in rows]:
            self.bars.remove_task(self.rows.pop(key))
        for key, row in rows.items():
            if key not in self.rows:
                self.rows[key] = self.bars.add_task(f"  {row.label}", total=row.total, status="", count="")
            count = f"{row.completed or 0:g}/{row.total:g}" if row.total is not None else ""  # a pair's row: its text
            self.bars.update(self.rows[key], completed=row.completed or 0, total=row.total, status=row.text,
                             count=count)
        self.bars.refresh()  # now, not at the next tick: a state that lasts less than a tick is still drawn

    def stop(self) -> None:
        """Leave the last state on the screen and stop redrawing."""
        if self.bars is not None:
            self.bars.stop()
        self.bars, self.headline, self.rows = None, None, {}


class LiveDisplay:
    """On a terminal: a live board per stage while it runs (the stage's bar, one bar per running trial's epochs),
    every line printed above it. Between stages none is shown; each stage's last state stays on the screen."""

    def __init__(self, stream: TextIO) -> None:
        self.board = LiveBoard(stream)

    def say(self, line: str) -> None:
        self.board.say(line)

    def stage_began(self, progress: StageProgress) -> None:
        self.board.start(progress.stage, progress.total)
        self.moved(progress)

    def moved(self, progress: StageProgress) -> None:
        counts = [f"{len(progress.running)} running", f"{progress.failed} failed"]
        if progress.stopped:
            counts.append(f"{progress.stopped} stopped early")
        rows = {key: Row(t.label, t.epochs_text(), t.epochs_done, t.epochs) for key, t in progress.running.items()}
        self.board.show(progress.done, ", ".join([*counts, *progress.standing()]), rows)

    def trial_finished(self, progress: StageProgress, line: str) -> None:
        self.say(line)
        self.moved(progress)

    def tick(self, progress: StageProgress) -> None:
        self.moved(progress)  # the elapsed time and ETA move on their own

    def stage_ended(self, progress: StageProgress) -> None:
        self.moved(progress)
        self.board.stop()

    def close(self) -> None:
        self.board.stop()


def on_a_terminal(stream: TextIO) -> bool:
    """Whether `stream` is a terminal a live display may redraw: a TTY, not a dumb one, and not under CI."""
    if os.environ.get(CI_VARIABLE, "").strip().lower() in ("1", "true", "yes"):
        return False
    if os.environ.get("TERM", "") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def display_for(quiet: bool, every_s: float, stream: TextIO | None = None) -> Display:
    """The live display on a terminal; plain lines every `every_s` seconds elsewhere and under `quiet`."""
    stream = stream or sys.stdout
    if not quiet and on_a_terminal(stream):
        return LiveDisplay(stream)
    return PlainDisplay(lambda line: print(line, file=stream, flush=True), every_s)


_SHOWN: list[Display] = []  # the displays `showing` installed, innermost last
_DEFAULT = PlainDisplay()  # a library caller that installed none (the Python API, a test) gets plain lines


def current() -> Display:
    """The display of this process: the one `showing` installed, else plain lines on stdout."""
    return _SHOWN[-1] if _SHOWN else _DEFAULT


def live_board() -> LiveBoard | None:
    """The live board of this process's display, when it shows one (a terminal); else None."""
    shown = current()
    return shown.board if isinstance(shown, LiveDisplay) else None


def say(line: str) -> None:
    """A line on the console through the current display (above a live one), at once."""
    current().say(line)


@contextlib.contextmanager
def showing(display: Display) -> Iterator[Display]:
    """Make `display` this process's display for the block; closed after it, however the block ends."""
    _SHOWN.append(display)
    try:
        yield display
    finally:
        _SHOWN.remove(display)
        display.close()
