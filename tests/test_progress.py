"""What a sweep prints while it runs, and what it says it used: progress lines and compute totals."""
from __future__ import annotations

import io
import os
import pickle
import pty
import subprocess
import sys

import pytest

from raybench.records import TrialRecord, TrialStatus
from raybench.report.results import compute_line
from raybench.sweep.outcome import compute_totals
from raybench.sweep.progress import (
    LiveDisplay,
    PlainDisplay,
    StageProgress,
    current,
    display_for,
    duration,
    say,
    showing,
)


def run(metrics: dict[str, float], status: TrialStatus = TrialStatus.OK) -> TrialRecord:
    return TrialRecord(0, "t", 0, {}, status, metrics=metrics)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (0, 42.4, 60, 187, 3599, 3720)] == ["0s", "42s", "1m00s", "3m07s", "59m59s", "1h02m"]


def test_one_line_per_finished_trial_with_counts_best_elapsed_and_eta():
    clock = FakeClock()
    progress = StageProgress("search", 4, "val/acc", clock=clock)
    clock.now += 60
    assert progress.finished(0.5, failed=False) == \
        "search: 1/4 done, 0 failed, best val/acc 0.5000, elapsed 1m00s, ETA 3m00s"
    clock.now += 60
    assert progress.finished(None, failed=True) == \
        "search: 2/4 done, 1 failed, best val/acc 0.5000, elapsed 2m00s, ETA 2m00s"
    clock.now += 30
    line = progress.finished(0.75, failed=False)
    assert line.startswith("search: 3/4 done, 1 failed, best val/acc 0.7500") and line.endswith("ETA 50s")
    assert progress.finished(0.9, failed=True).endswith("best val/acc 0.7500, elapsed 2m30s, ETA 0s")  # a failed
    # trial's value is never the best


def test_replayed_trials_and_a_resume_leave_the_rate_alone():
    clock = FakeClock()
    progress = StageProgress("replicates", 3, "val/acc", clock=clock)
    assert progress.finished(0.4, failed=False, replayed=True).endswith("ETA unknown")
    clock.now += 100
    assert progress.finished(0.3, failed=False).endswith("elapsed 1m40s, ETA 1m40s")
    restored = pickle.loads(pickle.dumps(progress))  # Tune hands a pickled copy back on resume
    restored.clock = clock
    restored.restart()
    assert (restored.done, restored.best) == (2, 0.4) and restored.line().endswith("elapsed 0s, ETA unknown")


def test_compute_totals_sum_every_run_failed_ones_included():
    runs = [run({"time/wall_s": 10.0, "time/cpu_s": 7.5, "time/gpu_s": 2.5}),
            run({"time/cpu_s": 1.5}, TrialStatus.FAILED),  # died before its driver could time it
            run({"time/wall_s": 4.0, "time/cpu_s": 3.0, "time/gpu_s": float("nan")})]
    totals = compute_totals(runs)
    assert totals == {"runs": 3.0, "wall_s": 14.0, "cpu_s": 12.0, "gpu_s": 2.5}
    line = compute_line({"search": totals, "replicates": compute_totals([])})
    assert line == "Compute: search 3 runs, 14 trial-s wall, 12 CPU-s, 2 GPU-s"
    both = compute_line({"replicates": totals, "search": totals})  # summary.json sorts its keys
    assert both.startswith("Compute: search 3 runs") and both.endswith("; replicates 3 runs, 14 trial-s wall, "
                                                                        "12 CPU-s, 2 GPU-s")
    hours = compute_line({"search": {"runs": 1.0, "wall_s": 7200.0, "cpu_s": 5400.0, "gpu_s": 0.0}})
    assert hours == "Compute: search 1 runs, 2.00 trial-h wall, 1.50 CPU-h, 0 GPU-s"
    assert compute_line({"search": compute_totals([])}) == "Compute: nothing ran"


@pytest.mark.parametrize("missing", ["time/wall_s", "time/cpu_s"])
def test_a_run_without_a_field_adds_nothing(missing):
    runs = [run({"time/wall_s": 1.0, "time/cpu_s": 1.0}), run({"time/wall_s": 2.0, "time/cpu_s": 2.0})]
    del runs[1].metrics[missing]
    assert compute_totals(runs)[missing.split("/")[1]] == 1.0


def test_a_data_parallel_trials_cpu_seconds_count_every_worker():
    from raybench.report_keys import CPU_S as CPU_KEY
    from raybench.sweep.ray_worker import with_workers_cpu

    ranks = [{CPU_KEY: 3.0, "val/acc": 0.5}, {CPU_KEY: 2.5, "val/acc": 0.4}, {CPU_KEY: 1.5}]
    merged = with_workers_cpu(ranks)
    assert merged[0] == {CPU_KEY: 7.0, "val/acc": 0.5} and merged[1:] == ranks[1:]  # rank 0's metrics otherwise
    assert ranks[0][CPU_KEY] == 3.0  # the workers' own reports are left as they were
    assert with_workers_cpu(ranks[:1]) == ranks[:1]


# ----- the displays ------------------------------------------------------------------------------------------
def test_the_line_names_each_running_trials_epochs_and_forgets_it_once_finished():
    clock = FakeClock()
    progress = StageProgress("search", 3, "OOD val acc", clock=clock)
    progress.trial_started("a", "trial 1f2e", epochs=10)
    progress.trial_started("b", "trial 9c0d", epochs=10)
    progress.epoch_reported("a", 3, 0.41)
    assert progress.line().startswith("search: 0/3 done, 2 running (epoch 3/10, starting), 0 failed, "
                                      "best OOD val acc 0.4100")  # a running trial's value counts as the best so far
    progress.epoch_reported("a", 12, 0.2)  # past its plan (a multi-round method): no denominator
    assert "running (epoch 12, starting)" in progress.line()
    progress.finished(0.5, failed=False, key="a")
    assert progress.line().startswith("search: 1/3 done, 1 running (starting), 0 failed, best OOD val acc 0.5000")
    restored = pickle.loads(pickle.dumps(progress))
    restored.restart()
    assert restored.running == {}, "a resumed sweep's process runs none of the old process's trials"


def test_plain_lines_come_at_the_chosen_interval_and_at_each_finished_trial():
    clock, lines = FakeClock(), []
    display = PlainDisplay(lines.append, every_s=30, clock=clock)
    progress = StageProgress("search", 2, "OOD val acc", clock=clock)
    display.stage_began(progress)
    assert lines == ["search: 0/2 done, 0 failed, best OOD val acc -, elapsed 0s, ETA unknown"]
    progress.trial_started("a", "trial 1f2e", epochs=4)
    clock.now += 29
    display.moved(progress)
    display.tick(progress)
    assert len(lines) == 1, "a line before the interval passed"
    clock.now += 1
    display.tick(progress)
    assert lines[-1] == "search: 0/2 done, 1 running (starting), 0 failed, best OOD val acc -, elapsed 30s, ETA unknown"
    clock.now += 10
    display.trial_finished(progress, progress.finished(0.5, failed=False, key="a"))
    assert lines[-1].startswith("search: 1/2 done, 0 failed")
    clock.now += 29
    display.tick(progress)
    assert len(lines) == 3, "the interval counts from the last line, a finished trial's included"


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("quiet, terminal, ci, live", [(False, True, "", True), (True, True, "", False),
                                                        (False, False, "", False), (False, True, "true", False)])
def test_the_live_display_only_on_a_terminal_without_quiet_or_ci(monkeypatch, quiet, terminal, ci, live):
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("TERM", "xterm-256color")
    stream = FakeTerminal() if terminal else io.StringIO()
    assert isinstance(display_for(quiet, 30, stream), LiveDisplay) is live


def test_lines_said_while_shown_reach_the_shown_display_and_it_is_closed_after():
    lines: list[str] = []
    closed = []

    class Recording(PlainDisplay):
        def close(self) -> None:
            closed.append(True)

    with pytest.raises(KeyboardInterrupt), showing(Recording(lines.append)):
        say("Ray: starting a private Ray on this machine")
        raise KeyboardInterrupt
    assert lines == ["Ray: starting a private Ray on this machine"] and closed == [True]
    assert not isinstance(current(), Recording), "the display outlived its block"


DRIVE_A_STAGE = """
import sys, time
from raybench.sweep.progress import StageProgress, display_for, showing
with showing(display_for(quiet=False, every_s=1000)) as display:
    display.say("sweep demo: checking")
    progress = StageProgress("search", 2, "OOD val acc")
    display.stage_began(progress)
    for key in ("a", "b"):
        progress.trial_started(key, f"trial {key}", epochs=3)
        for epoch in (1, 2, 3):
            progress.epoch_reported(key, epoch, 0.1 * epoch)
            display.moved(progress)
            time.sleep(0.3)  # rich redraws 4 times a second: let it draw each state
        display.trial_finished(progress, progress.finished(0.3, failed=False, key=key))
    display.stage_ended(progress)
"""


TERMINAL_ENV = {**os.environ, "CI": "", "TERM": "xterm-256color", "COLUMNS": "160"}


def on_a_pseudo_terminal(code: str) -> str:
    """What `python -c CODE` writes to a pseudo-terminal, read until it closes it; its exit status must be 0."""
    primary, secondary = pty.openpty()
    process = subprocess.Popen([sys.executable, "-c", code], stdout=secondary, stderr=secondary, env=TERMINAL_ENV)
    os.close(secondary)
    shown = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(primary)
    assert process.wait(timeout=120) == 0, shown.decode(errors="replace")
    return shown.decode(errors="replace")


def test_on_a_pseudo_terminal_the_display_redraws_in_place_and_piped_it_prints_plain_lines():
    """The same stage driven through the display of a real process: on a pseudo-terminal rich redraws its bars
    in place (cursor up, erase line) and shows the trials' epochs; piped, the lines carry no escape code."""
    env = TERMINAL_ENV
    text = on_a_pseudo_terminal(DRIVE_A_STAGE)
    assert "\x1b[1A" in text and "\x1b[2K" in text, "no redraw in place on a terminal"
    assert "epoch 2/3" in text and "trial a" in text, "the running trial's epochs are not shown"
    assert text.count("sweep demo: checking") == 1 and "search: 1/2 done" in text

    piped = subprocess.run([sys.executable, "-c", DRIVE_A_STAGE], capture_output=True, text=True, env=env,
                           timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert "\x1b" not in piped.stdout + piped.stderr, "an escape code in piped output"
    assert piped.stdout.splitlines()[:2] == ["sweep demo: checking",
                                             "search: 0/2 done, 0 failed, best OOD val acc -, elapsed 0s, ETA unknown"]
    assert piped.stdout.splitlines()[-1].startswith("search: 2/2 done, 0 failed, best OOD val acc 0.3000")


def test_a_benchmarks_board_shows_each_running_pairs_latest_sweep_line(tmp_path):
    """A live benchmark shows, under its bar, the last progress line each running pair's sweep logged (Ray's and
    other noise in the log aside); a pair whose sweep logged none yet is `starting`."""
    from raybench.commands.benchmark import latest_progress
    from raybench.sweep.progress import LiveBoard, Row

    log = tmp_path / "pair.log"
    log.write_text("===== 2026-12-07 12:00:00 python -m raybench.commands.sweep erm ...\n"
                   "sweep erm-digits: checking the search space, the dataset and the flags\n"
                   "search: 1/4 done, 2 running (epoch 2/10, starting), 0 failed, best OOD val acc 0.5000, "
                   "elapsed 1m00s, ETA 3m00s\n"
                   "2026-12-07 12:01:00,000 WARNING some library's warning\n")
    assert latest_progress(log).startswith("search: 1/4 done, 2 running (epoch 2/10, starting)")
    assert latest_progress(tmp_path / "not-yet.log") == "starting"

    terminal = FakeTerminal()
    board = LiveBoard(terminal)
    board.start("benchmark demo", 3)
    board.show(1, "pairs 1/3 finished", {"erm": Row("erm on digits-shift", latest_progress(log))})
    board.show(1, "pairs 1/3 finished", {})  # the pair ended: its row goes
    board.stop()
    shown = terminal.getvalue()
    assert "erm on digits-shift" in shown and "epoch 2/10" in shown and "benchmark demo" in shown


def test_a_sweep_process_leaves_no_colour_reset_after_its_last_line_on_a_terminal():
    """Importing Ray registers colorama's exit hook, which wrote ESC[0m after a sweep's last line on a terminal;
    the Ray adapter removes it."""
    text = on_a_pseudo_terminal("import raybench.sweep.ray_backend\nprint('the last line')")
    assert text.endswith("the last line\r\n"), repr(text[-40:])


def test_a_benchmark_shows_its_running_pairs_on_the_board_and_a_plain_line_without_one(tmp_path):
    """The benchmark's loop hands its standing to the live board when the process shows one (a row per running
    pair, its sweep's latest line), else says one plain line."""
    from types import SimpleNamespace

    from raybench.commands.benchmark import PairRunner
    from raybench.records import PairState
    from raybench.sweep.progress import LiveBoard

    log = tmp_path / "pair.log"
    log.write_text("search: 1/4 done, 1 running (epoch 3/10), 0 failed, best OOD val acc 0.5000, elapsed 1m00s, "
                   "ETA 3m00s\n")
    runner = PairRunner.__new__(PairRunner)
    lines: list[str] = []
    runner.records = {"b-erm": SimpleNamespace(status=PairState.RUNNING)}
    runner.running = [SimpleNamespace(pair=SimpleNamespace(sweep="b-erm", label="erm on digits-shift"),
                                      log=SimpleNamespace(name=str(log)))]
    runner.say = lines.append
    standing = SimpleNamespace(status=lambda records: "pairs 0/1 finished, 0 failed, 1 running",
                               line=lambda records: "benchmark b: pairs 0/1 finished, 0 failed, 1 running")
    terminal = FakeTerminal()
    board = LiveBoard(terminal)
    board.start("benchmark b", 1)
    runner._show(standing, board)
    board.stop()
    assert "erm on digits-shift" in terminal.getvalue() and "epoch 3/10" in terminal.getvalue()
    assert lines == [], "a plain line beside the live board"
    runner._show(standing, None)
    assert lines == ["benchmark b: pairs 0/1 finished, 0 failed, 1 running"]


def test_an_unknown_dataset_is_refused_before_a_phase_says_it_loads(capsys, tmp_path):
    """A bad --dataset is one line on stderr with exit 2; stdout has only the first phase, not `loading`."""
    from helpers.cli import cli

    refused = cli(["sweep", "erm", "--dataset", "nosuch", "--storage", str(tmp_path / "runs")], capsys)
    assert refused.returncode == 2 and refused.stderr.startswith("raybench: error: --dataset/--selection: unknown")
    assert refused.stdout == "sweep erm-nosuch-seed0: checking the search space, the dataset and the flags\n"
    assert not (tmp_path / "runs").exists()
