"""A benchmark's trial queue at --address (raybench/sweep/trial_slots.py, ray_search.QueuedSearch): slot files on
the benchmark's host, each held by one trial of one of its sweeps; Tune gets a new trial only for a free slot.
The benchmark end to end, on the session's head: test_benchmark.py::test_a_benchmarks_sweeps_share_one_trial_queue."""
from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import cli, on_head
from helpers.paths import BIN
from ray import cloudpickle, tune
from ray.tune.execution.tune_controller import _get_max_pending_trials
from ray.tune.experiment import Experiment
from ray.tune.search import BasicVariantGenerator

from raybench.sweep.ray_search import (
    QueuedSearch,
    RunSpec,
    _search_algorithm,
    restored_trial_ids,
    sigint_watched_for_the_fit,
)
from raybench.sweep.ray_trial import Resources
from raybench.sweep.sampling import SAMPLERS
from raybench.sweep.trial_slots import TrialSlots, make_slots, slot_files


def grid_of_seeds(tmp_path: Path, seeds: int, slots: TrialSlots) -> QueuedSearch:
    """A sweep's replicate stage as Tune drives it: the grid of seeds behind the queue."""
    search = QueuedSearch(BasicVariantGenerator(max_concurrent=seeds), slots)
    search.add_configurations([Experiment("replicates", lambda config: None, storage_path=str(tmp_path),
                                          config={"seed": tune.grid_search(list(range(seeds)))})])
    return search


def test_the_benchmark_writes_exactly_its_cap_of_slots_and_a_changed_cap_rewrites_them(tmp_path):
    folder = make_slots(tmp_path / "slots", 3)
    assert [p.name for p in slot_files(folder)] == ["slot-0000", "slot-0001", "slot-0002"]
    make_slots(folder, 1)
    assert [p.name for p in slot_files(folder)] == ["slot-0000"]


def test_two_sweeps_never_hold_more_slots_than_there_are_and_a_freed_one_is_the_others(tmp_path):
    folder = make_slots(tmp_path / "slots", 2)
    first, second = TrialSlots(folder), TrialSlots(folder)  # two drivers' views (each lock is its own open file)
    assert first.take("a") and first.take("a") and first.held() == ["a"]  # an owner holds one slot, however asked
    assert second.take("b") and not second.take("c") and not first.take("d")
    first.give_back("a")
    assert second.take("c") and not first.take("d")
    second.give_back("nobody")  # a trial restored by a resume holds none: nothing to free
    assert second.held() == ["b", "c"]


def test_a_killed_holder_frees_its_slot(tmp_path):
    """A sweep killed outright (SIGKILL) strands nothing: its locks die with its process."""
    folder = make_slots(tmp_path / "slots", 1)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from raybench.sweep.trial_slots import TrialSlots; s = TrialSlots(sys.argv[1]); "
        "print(s.take('t'), flush=True); time.sleep(600)"), str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "True"  # the event: the other process holds the slot
        assert not TrialSlots(folder).take("mine")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
        assert TrialSlots(folder).take("mine")
    finally:
        holder.kill()
        holder.wait()


def test_a_pickled_queue_keeps_its_folder_and_no_other_drivers_lock(tmp_path):
    """Tune pickles its search algorithm into the experiment state: a copy must not claim slots another driver
    (here, a view other than this process's own) holds."""
    slots = TrialSlots(make_slots(tmp_path / "slots", 1))
    assert slots.take("t")
    copy = pickle.loads(pickle.dumps(slots))
    assert copy.folder == slots.folder and copy.held() == [] and not copy.take("u")  # the original still holds it


def test_a_restored_search_frees_the_slots_its_sweep_took_for_the_restored_trials(tmp_path):
    """On a resume the sweep takes slots for the trials Tune restores, before Tune unpickles the search from the
    experiment state: that copy must be the process's own slots, so ending a restored trial frees its slot."""
    folder = make_slots(tmp_path / "slots", 2)
    TrialSlots.of_this_process(folder).take_for_restored(["restored"])
    restored = cloudpickle.loads(cloudpickle.dumps(grid_of_seeds(tmp_path, 1, TrialSlots.of_this_process(folder))))
    assert restored.slots.held() == ["restored"]
    try:
        assert TrialSlots(folder).take("another sweep's trial") and not TrialSlots(folder).take("a third")
        restored.on_trial_complete("restored")
        assert TrialSlots(folder).take("a third")
    finally:
        restored.slots.give_back_all()


def test_a_resuming_sweep_gets_freed_slots_before_any_new_trial(tmp_path):
    """Tune starts the trials a resume restores without asking the search, so the sweep first waits for their
    slots, holding the gate: a slot freed meanwhile is not a new trial's, or a busy queue could keep it waiting
    for as long as other sweeps have trials, while two sweeps resuming together could each hold half."""
    folder = make_slots(tmp_path / "slots", 2)
    other, resumer = TrialSlots(folder), TrialSlots(folder)
    assert other.take("a") and other.take("b")
    waiting, said = threading.Event(), []
    resuming = threading.Thread(target=resumer.take_for_restored, args=(["r1", "r2"],),
                                kwargs={"say": lambda text: (said.append(text), waiting.set())}, daemon=True)
    resuming.start()
    assert waiting.wait(timeout=30), "the resuming sweep did not wait for the slots others hold"
    other.give_back("a")
    assert not TrialSlots(folder).take("a new trial")  # the freed slot is the resuming sweep's
    other.give_back("b")
    resuming.join(timeout=30)
    assert not resuming.is_alive() and resumer.held() == ["r1", "r2"], said
    assert said == [("resuming: waiting for 2 free slots of the benchmark's trial queue for the trials this sweep "
                     "restores (other sweeps' trials hold them now)")]
    resumer.give_back_all()
    assert TrialSlots(folder).take("a new trial")


def test_a_second_resuming_sweep_waits_its_turn_holding_nothing_and_says_so(tmp_path):
    folder = make_slots(tmp_path / "slots", 2)
    other, first, second = TrialSlots(folder), TrialSlots(folder), TrialSlots(folder)
    assert other.take("a") and other.take("b")
    first_waits, second_waits, said = threading.Event(), threading.Event(), []
    threads = [threading.Thread(target=resumer.take_for_restored, args=(owners,), daemon=True,
                                kwargs={"say": lambda text, event=event: (said.append(text), event.set())})
               for resumer, owners, event in ((first, ["f1", "f2"], first_waits), (second, ["s1"], second_waits))]
    threads[0].start()
    assert first_waits.wait(timeout=30)  # the first holds the gate, waiting for slots
    threads[1].start()
    assert second_waits.wait(timeout=30)
    assert said[1] == ("resuming: waiting for another sweep of the benchmark to take the slots of the trials it "
                       "restores first")
    other.give_back("a")
    other.give_back("b")
    threads[0].join(timeout=30)
    assert first.held() == ["f1", "f2"] and second.held() == []  # both freed slots went to the first in line
    first.give_back("f1")
    threads[1].join(timeout=30)
    assert not threads[1].is_alive() and second.held() == ["s1"]
    first.give_back_all()
    second.give_back_all()


def test_a_wait_for_restored_trials_slots_stopped_by_a_signal_gives_back_what_it_took(tmp_path):
    folder = make_slots(tmp_path / "slots", 2)
    assert TrialSlots(folder).take("another sweep's trial")
    resumer = TrialSlots(folder)

    def ctrl_c(_text: str) -> None:
        raise KeyboardInterrupt  # as Python's handler raises it in the waiting sweep's main thread

    with pytest.raises(KeyboardInterrupt):
        resumer.take_for_restored(["r1", "r2"], say=ctrl_c)
    assert resumer.held() == [] and TrialSlots(folder).take("a new trial")


def test_restored_trials_beyond_a_smaller_cap_are_named_and_the_rest_get_slots(tmp_path):
    folder = make_slots(tmp_path / "slots", 1)
    said: list[str] = []
    resumer = TrialSlots(folder)
    resumer.take_for_restored(["r1", "r2", "r3"], say=said.append)
    assert resumer.held() == ["r1"]
    assert said == [(f"2 of the 3 trials this resume restores start without a trial slot: the queue in {folder} has 1 "
                     "for them (the benchmark's cap is smaller than it was)")]


def test_tune_gets_a_new_trial_only_for_a_free_slot_and_every_ending_frees_it(tmp_path):
    folder = make_slots(tmp_path / "slots", 1)
    search = grid_of_seeds(tmp_path, 3, TrialSlots(folder))
    first = search.next_trial()
    assert first.config == {"seed": 0} and search.next_trial() is None  # the one slot is taken
    assert not TrialSlots(folder).take("another sweep's trial")
    search.on_trial_complete(first.trial_id)  # finished
    second = search.next_trial()
    assert second.config == {"seed": 1} and search.next_trial() is None
    search.on_trial_complete(second.trial_id, error=True)  # errored
    third = search.next_trial()
    assert third.config == {"seed": 2}
    search.on_trial_complete(third.trial_id)
    assert search.next_trial() is None and search.is_finished() and search.slots.held() == []


def test_a_slot_another_sweep_holds_keeps_this_one_waiting_until_freed(tmp_path):
    folder = make_slots(tmp_path / "slots", 1)
    other = TrialSlots(folder)
    assert other.take("their trial")
    search = grid_of_seeds(tmp_path, 1, TrialSlots(folder))
    assert search.next_trial() is None and not search.is_finished()  # waiting, not done
    other.give_back("their trial")
    assert search.next_trial().config == {"seed": 0}


@pytest.mark.parametrize("searched", [True, False])
def test_a_queued_stage_keeps_its_own_limit_and_tunes_pending_trials(searched, tmp_path):
    """Tune ignores max_concurrent_trials beside a search algorithm that is not a bare Searcher, so the queued stage
    applies the sweep's own limit inside (a ConcurrencyLimiter, or the grid's max_concurrent), where Tune also
    finds it for how many trials may wait for resources at once."""
    from ray.tune.search import ConcurrencyLimiter, SearchGenerator
    from ray.tune.search.optuna import OptunaSearch

    searcher = OptunaSearch(space={"lr": __import__("optuna").distributions.FloatDistribution(1e-4, 1e-1, log=True)},
                            metric="m", mode="max", sampler=SAMPLERS["random"](0)) if searched else None
    spec = RunSpec("s", tmp_path, "search", "function", Resources(), 3, trial_slots=make_slots(tmp_path / "q", 2))
    search, limit = _search_algorithm(searcher, spec)
    assert isinstance(search, QueuedSearch) and limit is None and search.slots.folder == tmp_path / "q"
    if searched:
        assert isinstance(search.inner, SearchGenerator) and isinstance(search.inner.searcher, ConcurrencyLimiter)
        assert search.inner.searcher.max_concurrent == 3 and _get_max_pending_trials(search) == 3
    else:
        assert isinstance(search.inner, BasicVariantGenerator) and search.inner.max_concurrent == 3
    unqueued = RunSpec("s", tmp_path, "search", "function", Resources(), 3)
    assert _search_algorithm(searcher, unqueued) == (searcher, 3)


@pytest.mark.parametrize("folder, expected", [
    ("missing", "--trial-slots: expected a folder of trial slots (a benchmark writes one), got '{}', which is not a folder"),
    ("empty", "--trial-slots: expected a folder of trial slots, got '{}', which holds no slot-* file"),
])
def test_a_slot_folder_that_is_not_one_is_refused_in_one_line(folder, expected, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    path = tmp_path / folder
    result = cli(["sweep", "erm", "--trial-slots", str(path), "--storage", str(tmp_path / "runs")], capsys)
    assert result.returncode == 2 and expected.format(path) in result.stderr, result.stderr


def _as_tune_handles_sigint() -> Callable[[], None]:
    """Install a stand-in for the handler Tune's fit installs; returns its signal, which puts back the handler
    it found, as Tune's does."""
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda sig, frame: signal.signal(signal.SIGINT, before))
    return lambda: signal.getsignal(signal.SIGINT)(signal.SIGINT, None)


def test_a_stop_signal_ends_the_wait_for_a_slot(tmp_path):
    """Tune waits for a new trial inside one step of its loop, up to 10 minutes, when the sweep has none of its own
    left; its stop signal is only read between steps. Once Tune's handler has caught one (and put back the one it
    found), the queued search says it is finished, so the wait ends and the stage ends as interrupted."""
    folder = make_slots(tmp_path / "slots", 1)
    other = TrialSlots(folder)
    assert other.take("their trial")
    search = grid_of_seeds(tmp_path, 2, TrialSlots(folder))
    with sigint_watched_for_the_fit():
        signal_comes = _as_tune_handles_sigint()
        assert search.next_trial() is None and not search.is_finished()  # waiting for the slot
        signal_comes()
        assert search.is_finished()
    assert not cloudpickle.loads(cloudpickle.dumps(search)).is_finished()  # as Tune keeps it: a resume waits afresh


def test_a_stop_signal_before_the_first_request_for_a_trial_is_seen_too(tmp_path):
    """Tune installs its handler, then its loop asks for the first trial: a Ctrl-C in between was missed when the
    search read Tune's handler at that first request, and the sweep waited out Tune's 10 minutes."""
    folder = make_slots(tmp_path / "slots", 1)
    assert TrialSlots(folder).take("their trial")
    search = grid_of_seeds(tmp_path, 2, TrialSlots(folder))
    with sigint_watched_for_the_fit():
        _as_tune_handles_sigint()()  # the signal comes before any request
        assert search.next_trial() is None
        assert search.is_finished()


def test_a_sweep_waiting_for_a_slot_stops_at_once_on_ctrl_c_as_interrupted(store_uri, tmp_path, ray_head):
    """A real sweep on the session's head whose only slot another holds: it waits inside Tune's step for a trial,
    and a Ctrl-C must end it within seconds (not after Tune's 10-minute wait), as an interrupted sweep with its
    resume line and no trial run."""
    folder = make_slots(tmp_path / "slots", 1)
    other = TrialSlots(folder)
    assert other.take("another sweep's trial")
    runs = tmp_path / "runs"
    args = on_head(["sweep", "erm", "--smoke", "--executor", "function", "--trials", "1", "--replicates", "0",
                    "--trial-slots", str(folder), "--name", "queued", "--storage", str(runs),
                    "--tracking-uri", store_uri], ray_head)
    proc = subprocess.Popen([str(BIN / "raybench"), *args], env=ray_head.env, cwd=tmp_path, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None and not (runs / "queued-search").is_dir():
            time.sleep(0.5)  # the event: Tune's search experiment has started, its first step asks for a trial
        assert proc.poll() is None and (runs / "queued-search").is_dir(), proc.communicate()[1][-3000:]
        os.killpg(proc.pid, signal.SIGINT)
        _out, err = proc.communicate(timeout=180)  # Tune's own wait would hold it for 600 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
    last = err.strip().splitlines()[-1]
    # The folder appears as Tune's fit begins, so the signal may come just before Tune's handler is installed
    # (a KeyboardInterrupt: "sweep interrupted") or once Tune waits for a slot ("interrupted during the search").
    assert re.match(r"raybench: sweep ('queued' )?interrupted", last) and last.endswith("--resume"), last
    assert not list((runs / "queued-search" / "completed").glob("*.json"))  # no trial ran


def test_a_resumed_sweep_starts_its_restored_trial_only_once_it_holds_a_slot(store_uri, tmp_path, ray_head):
    """At --address Tune starts the trials a resume restores without asking the queued search for them, so the
    sweep takes their slots first. A sweep on the session's head is stopped mid-trial (Ctrl-C), another sweep's
    trial takes the queue's one slot, and the resumed sweep must wait: its trial's trainer starts only after
    that slot is freed (by the run's own wall-clock record)."""
    folder, runs = make_slots(tmp_path / "slots", 1), tmp_path / "runs"
    args = on_head(["sweep", "erm", "--executor", "function", "--trials", "1", "--replicates", "0",
                    "--trial-slots", str(folder), "--name", "held", "--storage", str(runs), "--tracking-uri", store_uri,
                    "--set", "epochs=8", "--set", "max_steps_per_epoch=20", "--set", "patience=none"], ray_head)
    first = _started(args, ray_head, tmp_path, "first.log")
    try:
        assert _wait_for(lambda: list((runs / "held-search").glob("*/checkpoint_*")), first), _tail(tmp_path / "first.log")
        os.killpg(first.pid, signal.SIGINT)  # the event: the trial's first epoch is checkpointed
        assert first.wait(timeout=180) == 128 + signal.SIGINT, _tail(tmp_path / "first.log")
    finally:
        _kill(first)
    assert len(restored_trial_ids(str(runs / "held-search"))) == 1  # the trial a resume restores mid-run

    other = TrialSlots(folder)
    assert other.take("another sweep's trial")
    waiting = "resuming: waiting for 1 free slot of the benchmark's trial queue"
    resumed = _started([*args, "--resume"], ray_head, tmp_path, "resumed.log")
    try:
        assert _wait_for(lambda: waiting in (tmp_path / "resumed.log").read_text(), resumed), \
            _tail(tmp_path / "resumed.log")  # the restored trial must wait for the slot, not start beside it
        freed_at = time.time()
        other.give_back("another sweep's trial")
        assert resumed.wait(timeout=420) == 0, _tail(tmp_path / "resumed.log")
    finally:
        _kill(resumed)
    assert waiting in (tmp_path / "resumed.log").read_text()
    [record] = [json.loads(p.read_text()) for p in (runs / "held-search" / "completed").glob("*.json")]
    assert record["time/trainer_started_at"] >= freed_at, (record["time/trainer_started_at"], freed_at)


def _started(args: list[str], head: Any, cwd: Path, log_name: str) -> subprocess.Popen:
    with open(cwd / log_name, "w") as log:
        return subprocess.Popen([str(BIN / "raybench"), *args], env=head.env, cwd=cwd, start_new_session=True,
                                stdout=log, stderr=subprocess.STDOUT)


def _wait_for(seen: Callable[[], Any], proc: subprocess.Popen, timeout_s: float = 420) -> bool:
    """Until `seen()` holds or the process ends (bounded): the event a test acts on."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None and not seen():
        time.sleep(0.2)
    return bool(seen())


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_benchmark_at_an_address_refuses_a_storage_without_file_locks_before_it_starts(tmp_path, monkeypatch):
    """Some network and FUSE mounts have no flock: the trial queue's slot files would fail every sweep at its
    first trial, after the benchmark had started them all. Its storage check (run before the tracking store and
    the cluster; the CLI turns it into one line and exit 2) says so first. A private Ray keeps no slot files."""
    import errno

    import yaml

    from raybench.commands.benchmark import BenchmarkOptions, check_storage
    from raybench.sweep import trial_slots
    from raybench.sweep.benchmark_file import load_benchmark
    from raybench.sweep.errors import OptionError

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(trial_slots.fcntl, "flock", no_locks)
    grid = tmp_path / "bench.yaml"
    grid.write_text(yaml.safe_dump({"name": "nolocks", "trials": 1, "replicates": 1, "smoke": True,
                                    "grid": [{"datasets": ["digits-shift"], "spaces": ["erm"]}]}))
    benchmark, storage = load_benchmark(str(grid)), tmp_path / "runs"
    storage.mkdir()
    with pytest.raises(OptionError) as refused:
        check_storage(benchmark, BenchmarkOptions(storage, "sqlite:///unused.db", address="127.0.0.1:1"))
    assert str(refused.value) == (f"--storage: expected a folder whose files can be locked (a benchmark at --address "
                                  f"keeps its trial queue there as locked slot files), but locking a file in "
                                  f"{str(storage)!r} failed: {os.strerror(errno.ENOLCK)}")
    assert list(storage.iterdir()) == []  # the probe file removed
    assert check_storage(benchmark, BenchmarkOptions(storage, "sqlite:///unused.db")) == []  # a private Ray: no check


def test_a_slot_that_cannot_be_locked_at_all_is_an_error_and_leaks_no_open_file(tmp_path, monkeypatch):
    """Held by another trial is a wait; no lock support at all is an error (the benchmark's storage check says
    so first): either way the slot file opened for the try is closed again."""
    import errno

    from raybench.sweep import trial_slots

    slots = TrialSlots(make_slots(tmp_path / "slots", 2))

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(trial_slots.fcntl, "flock", no_locks)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError, match=os.strerror(errno.ENOLCK)):
        slots.take("t")
    assert len(os.listdir("/proc/self/fd")) == before and slots.held() == []
