"""How a raybench command process ends: a bad input as one line and exit status 2, a stop signal as the
interrupted status (128 + the signal), a reader gone as SIGPIPE's, never a traceback.

On the ground floor (standard library only, no torch, Ray or MLflow) because two entry points share it: the
`raybench` command line (raybench.cli) and the library's entry point for one sweep (raybench.commands.sweep), which
a benchmark starts for each pair; the library must not import the CLI to get them.
"""
from __future__ import annotations

import _thread
import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

# The longest error line a command prints: whatever a hostile file or flag held, the error stays one readable line.
MAX_ERROR_CHARS = 1_000
# How long after a dropped KeyboardInterrupt its signal is sent again (Signals._on_unraisable).
REDELIVERY_DELAY_S = 0.01


class UsageError(Exception):
    """A user input error; printed as one line without a traceback."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's own errors (an unknown flag, a bad value) as a UsageError: one line and exit 2, as every other
    bad input, instead of argparse's usage text."""

    def error(self, message: str) -> Any:
        raise UsageError(message.replace("argument ", ""))


def one_short_line(message: str) -> str:
    """The message on one line, cut to MAX_ERROR_CHARS with its full length said. Every line break (also \\r,
    \\x1e, \\u2028 ...) becomes a space, and any other unprintable character its escape: a key a file spelled
    with control characters can neither break the line nor drive the terminal."""
    line = " ".join(message.splitlines())
    line = "".join(c if c.isprintable() else repr(c)[1:-1] for c in line)
    if len(line) <= MAX_ERROR_CHARS:
        return line
    return f"{line[:MAX_ERROR_CHARS]}... ({len(line):,} characters)"


class Signals:
    """SIGTERM is handled like Ctrl-C, so a stopped sweep marks its runs KILLED and says how to resume; the
    exit status then names the signal that stopped it (130 for SIGINT, 143 for SIGTERM). ray.init replaces
    this handler; ray_backend.connect puts it back (tests/test_signals.py sends the SIGTERM).

    A stop must survive wherever its signal lands. Python runs a signal's handler between any two bytecodes of
    the main thread, also inside a weakref callback or a `__del__`, where an exception cannot propagate: the
    KeyboardInterrupt the handler raises there is printed as "Exception ignored" and dropped. While these
    handlers are in place, such a dropped KeyboardInterrupt is caught by `sys.unraisablehook` and its signal
    delivered again (`_thread.interrupt_main`), until the handler runs at a point where raising works, and the
    stop happens there."""

    def __init__(self) -> None:
        self.received = signal.SIGINT
        self._stopping = False  # a SIGTERM's stop is under way: a second one (`ray job stop` and a benchmark) is let be

    def __enter__(self) -> Signals:
        self.previous = signal.signal(signal.SIGTERM, self._on_term)
        self._previous_hook = sys.unraisablehook
        sys.unraisablehook = self._on_unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        signal.signal(signal.SIGTERM, self.previous)
        sys.unraisablehook = self._previous_hook

    def _on_term(self, signum: int, frame: Any) -> None:
        if self._stopping:
            return
        self.received = signal.SIGTERM
        self._stopping = True
        stop_as_on_ctrl_c(frame)

    def _on_unraisable(self, unraisable: Any) -> None:
        """A KeyboardInterrupt dropped where it was raised: raise it again at the next safe point."""
        if not isinstance(unraisable.exc_value, KeyboardInterrupt):
            self._previous_hook(unraisable)
            return
        if self.received == signal.SIGTERM:
            self._stopping = False
        # Delivered from another thread a moment later, once this cleanup has returned: delivered here, the handler
        # would raise inside this hook and be dropped again. One dropped again comes back here, and is re-sent.
        threading.Timer(REDELIVERY_DELAY_S, _thread.interrupt_main, args=(self.received,)).start()

    @property
    def exit_status(self) -> int:
        return 128 + int(self.received)


def stop_as_on_ctrl_c(frame: Any) -> None:
    """Do what a Ctrl-C does at this moment: call the SIGINT handler in place (Tune's graceful stop during a
    fit, else Python's KeyboardInterrupt). Called, not raised with `signal.raise_signal`: a process a shell
    starts in the background (`&`, nohup, many batch scripts) inherits SIGINT ignored, and a raised SIGINT
    would then be dropped, and the SIGTERM with it."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
        return
    raise KeyboardInterrupt


def run_command(body: Callable[[], int]) -> int:
    """Run a command's body and return its exit status, ending the way every raybench command ends: a
    UsageError as `raybench: error: <one line>` and 2, a Ctrl-C outside a sweep's own handling as 130, a
    closed stdout quietly."""
    try:
        status = body()
        sys.stdout.flush()  # a reader gone (a closed pipe) surfaces here, where it is handled, not at exit
        return status
    except UsageError as err:
        print(f"raybench: error: {one_short_line(str(err))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("raybench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return reader_gone()


def reader_gone() -> int:
    """The reader of stdout went away (`raybench list algorithms | head`): stop quietly, as `ls | head` does, with
    128 + SIGPIPE. Python would otherwise print a traceback, and another error when it flushes stdout at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 128 + signal.SIGPIPE
