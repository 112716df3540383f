"""A stop signal is never lost, wherever it lands.

Python runs a signal handler between any two bytecodes of the main thread, also inside a weakref callback or a
`__del__`; the KeyboardInterrupt raised there is dropped ("Exception ignored in ..."). Each case runs a small
program in its own process: it enters raybench.exits.Signals, sends itself the signal from inside a cleanup,
and must then stop at the next point where raising works, with the signal's exit status."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

PROGRAM = textwrap.dedent("""
    import gc, os, signal, sys, time, weakref
    from raybench.exits import Signals

    SIG = signal.{sig}
    # Python's own disposition of the signal, whatever this process inherited: a pytest worker that some earlier test
    # (Ray's, in-process) left with SIGINT ignored would pass SIG_IGN on, and Signals rightly keeps an ignored
    # SIGINT (nohup's, tested in tests/test_sweep_entry.py), so the signal would never arrive.
    signal.signal(SIG, signal.default_int_handler if SIG == signal.SIGINT else signal.SIG_DFL)

    class Held:
        pass

    def cleanup():
        os.kill(os.getpid(), SIG)
        for _ in range(100_000):  # the handler runs in here, inside the callback
            pass

    def in_del(self):
        cleanup()

    with Signals() as signals:
        try:
            held = Held()
            if "{where}" == "weakref":
                weakref.finalize(held, cleanup)
            else:
                Held.__del__ = in_del
            del held
            gc.collect()
            for _ in range(200):  # work after the cleanup: where the stop must happen
                time.sleep(0.01)
            print("not stopped")
            sys.exit(0)
        except KeyboardInterrupt:
            print("stopped after the cleanup")
            sys.exit(signals.exit_status)
""")


@pytest.mark.parametrize("where", ["weakref", "__del__"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_landing_in_a_cleanup_still_stops_the_process_with_its_status(where, sig):
    done = subprocess.run([sys.executable, "-c", PROGRAM.format(sig=sig.name, where=where)], capture_output=True,
                          text=True, timeout=120)
    assert done.stdout.strip() == "stopped after the cleanup", (done.stdout, done.stderr)
    assert done.returncode == 128 + sig
    assert "Exception ignored" not in done.stderr, done.stderr


def test_a_second_sigterm_during_the_stop_is_let_be():
    program = textwrap.dedent("""
        import os, signal, sys
        from raybench.exits import Signals
        caught = 0
        with Signals() as signals:
            for _ in range(2):
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    for _ in range(100_000):
                        pass
                except KeyboardInterrupt:
                    caught += 1
        print(caught, signals.exit_status)
    """)
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["1", "143"], (done.stdout, done.stderr)
