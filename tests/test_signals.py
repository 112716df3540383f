"""SIGTERM (`ray job stop`, Kubernetes and Slurm preemption) ends a benchmark as Ctrl-C does: exit 143, runs
KILLED, a --resume line (a sweep's SIGTERM and its resume: test_interrupt.py). And after a SIGKILL, what the dead driver's private Ray left running is stopped
by the next start, found by the driver's record (never by name, never another live driver's), and its resume trains
no finished trial again."""
from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import psutil
import yaml
from helpers.cli import cli
from helpers.paths import BIN
from helpers.processes import processes_under
from mlflow.tracking import MlflowClient

from raybench.sweep.leftovers import RECORD_NAME, DriverRecord, ProcessId, record_driver, stop_dead_drivers_leftovers

WAIT_S = 420
RAY_DUMP = "SIGTERM received"  # Ray's native failure-signal handler's dump
LONGER_TRIALS = ["--set", "epochs=3", "--set", "max_steps_per_epoch=20"]  # a trial still runs when the signal lands


def _start(args: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "raybench"), *args], env=env, cwd=cwd, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _runs(uri: str, filter_string: str = "") -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    return client.search_runs([experiment.experiment_id], filter_string) if experiment else []


def _trial_mid_run(proc: subprocess.Popen, experiment_dir: Path, uri: str) -> str:
    """Wait until a search trial has logged an epoch and is still running; its MLflow run id. The store is read
    only once the sweep's Tune experiment exists, so the sweep has created the store's schema by then."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        if experiment_dir.is_dir():
            running = [r for r in _runs(uri, "tags.stage = 'search' and attributes.status = 'RUNNING'") if r.data.metrics]
            if running:
                return running[0].info.run_id
        time.sleep(0.5)
    assert proc.poll() is None, f"the sweep ended before a signal could reach it:\n{proc.communicate()[1][-3000:]}"
    raise AssertionError(f"no search trial logged an epoch within {WAIT_S} s")


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ----- SIGTERM ------------------------------------------------------------------------------------------------
def test_sigterm_stops_a_benchmark_and_each_of_its_sweeps_as_interrupted(store_uri, tmp_path, sweep_env):
    """The benchmark on a private Ray of its own (its ray.init and its sweep's both see the SIGTERM through)."""
    body = {"name": "term", "selection": "ood_val", "trials": 1, "replicates": 1, "executor": "function", "smoke": True,
            "max_concurrent_trials": 1, "set": {"epochs": 3, "max_steps_per_epoch": 20},
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm"]}]}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    uri, runs_dir = store_uri, tmp_path / "runs"
    proc = _start(["benchmark", str(path), "--storage", str(runs_dir), "--tracking-uri", uri], sweep_env, tmp_path)
    try:
        running = _trial_mid_run(proc, runs_dir / "term-erm-digits-shift-search", uri)
        proc.send_signal(signal.SIGTERM)  # to the benchmark alone, as Kubernetes sends it; it forwards one to its sweep
    finally:
        out, err = _finish(proc)
    assert proc.returncode == 143, out[-2000:] + err[-3000:]
    sweep_log = (runs_dir / "term" / "logs" / "term-erm-digits-shift.log").read_text()
    assert RAY_DUMP not in err + sweep_log, err[-2000:] + sweep_log[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("raybench: benchmark 'term' interrupted: 0 of 1 pairs finished; resume with: ") \
        and last.endswith("--resume"), last
    pair = json.loads((runs_dir / "term" / "benchmark.json").read_text())["pairs"]["term-erm-digits-shift"]
    assert (pair["status"], pair["exit_code"]) == ("interrupted", 143), pair
    statuses = {(r.data.tags.get("stage"), r.info.status) for r in _runs(uri)}
    assert {("benchmark", "KILLED"), ("sweep", "KILLED")} <= statuses and ("search", "RUNNING") not in statuses
    assert {r.info.run_id: r.info.status for r in _runs(uri)}[running] == "KILLED"


# ----- what a SIGKILLed driver's private Ray leaves behind -----------------------------------------------------
def test_the_recorded_processes_of_a_dead_driver_are_stopped_and_a_live_drivers_are_not(tmp_path):
    root = tmp_path / "ray"
    children = {kind: subprocess.Popen(["sleep", "300"]) for kind in ("live", "dead", "reused")}
    try:
        ended = subprocess.Popen(["sleep", "300"])
        ended_id = ProcessId.of(psutil.Process(ended.pid))
        ended.kill()
        ended.wait()
        drivers = {"dead": ended_id,  # a driver that was killed
                   "reused": ProcessId(psutil.Process().pid, 1.0)}  # its pid now another process's (this one)
        for kind in ("live", "dead", "reused"):
            (root / f"session_{kind}").mkdir(parents=True)
        record_driver(root / "session_live", [children["live"].pid])  # this process: a live driver
        for kind, driver in drivers.items():
            record = DriverRecord(json.loads((root / "session_live" / RECORD_NAME).read_text())["host"], driver,
                                  (ProcessId.of(psutil.Process(children[kind].pid)),))
            (root / f"session_{kind}" / RECORD_NAME).write_text(record.to_json())

        # The tests' own cleanup finds recorded processes whose command line does not name the temp folder.
        assert {children[k].pid for k in children} <= {p.pid for p in processes_under(str(tmp_path))}

        assert stop_dead_drivers_leftovers(root, grace_s=10) == 2
        for kind in drivers:
            children[kind].wait(timeout=30)
            assert not (root / f"session_{kind}" / RECORD_NAME).exists()
        assert children["live"].poll() is None and (root / "session_live" / RECORD_NAME).is_file()
    finally:
        for child in children.values():
            child.kill()
            child.wait()


FIT_MARKS = Path(__file__).resolve().parent / "plugin_fixtures" / "fitmarks"  # marks each start of training
MARKS_VARIABLE = "RAYBENCH_TEST_FIT_MARKS"  # the file it appends to, one line `<tune trial id> <pid>` a start


def _two_trials_args(uri: str, tmp_path: Path, name: str) -> list[str]:
    """Two search trials, one after the other, of ERM from the fitmarks plug-in (it counts training starts)."""
    return ["sweep", "erm_fitmarks", "--plugin", str(FIT_MARKS), "--smoke", "--executor", "function",
            "--trials", "2", "--max-concurrent", "1", "--replicates", "0", "--name", name,
            "--storage", str(tmp_path / "runs"), "--tracking-uri", uri, *LONGER_TRIALS]


def _first_record(proc: subprocess.Popen, stage_dir: Path) -> list[Path]:
    """Wait for the first finished run's record (CompletedRuns) of the stage and return the records there are
    then. Polled often: the kill must land before Tune's next save of its experiment state (every 10 s or so)
    can call that trial finished, so the resume finds it unfinished and has only its record to go on."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None:
        records = sorted(stage_dir.glob("completed/*.json"))
        if records:
            return records
        time.sleep(0.05)
    assert proc.poll() is None, f"the sweep ended before it could be killed:\n{proc.communicate()[1][-3000:]}"
    raise AssertionError(f"no search trial finished within {WAIT_S} s")


def _training_starts(marks: Path, excluding_pids: frozenset[int] = frozenset()) -> Counter:
    """How many times each Tune trial started training, by the plug-in's marks (those of `excluding_pids` left out)."""
    lines = marks.read_text().splitlines() if marks.is_file() else []
    return Counter(trial for trial, pid in (line.split() for line in lines) if int(pid) not in excluding_pids)


def test_after_a_sigkill_results_says_so_and_the_resume_stops_the_dead_drivers_leftovers_and_completes(store_uri,
        tmp_path, sweep_env, capsys):
    """Ray's agents outlive a SIGKILLed driver by about a minute here (90 s seen elsewhere). `results` calls the
    sweep interrupted because its driver is gone and prints the resume line; that resume, a private start a
    minute sooner, stops the leftovers by the dead driver's record and finishes both trials, every epoch once.
    The driver is killed just after the first trial finished: Tune's saved state still has that trial running,
    so the resume starts it again, and the trial must replay its record, not train again (a finished trial
    trains exactly once in all)."""
    uri, marks = store_uri, tmp_path / "fit-marks.txt"
    env = {**sweep_env, MARKS_VARIABLE: str(marks)}
    args = _two_trials_args(uri, tmp_path, "kill9")
    proc = _start(args, env, tmp_path)
    try:
        finished_keys = {path.stem for path in _first_record(proc, tmp_path / "runs" / "kill9-search")}
        session = psutil.Process(proc.pid).children(recursive=True)  # its Ray, trials and agents included
        proc.kill()
    finally:
        _finish(proc)
    assert session and proc.returncode == -signal.SIGKILL
    shown = cli(["results", "kill9", "--tracking-uri", uri], capsys)
    assert "INTERRUPTED (its driver process is gone)" in shown.stderr + shown.stdout, shown.stderr + shown.stdout
    assert "resume with: raybench sweep erm_fitmarks" in shown.stderr + shown.stdout and "--resume" in shown.stderr + shown.stdout

    resumed = subprocess.run([str(BIN / "raybench"), *args, "--resume"], env=env, cwd=tmp_path, capture_output=True,
                             text=True, timeout=WAIT_S)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    _, alive = psutil.wait_procs(session, timeout=20)
    assert not alive, [(p.pid, p.name()) for p in alive]
    ray_root = Path(sweep_env["RAY_TMPDIR"]) / "ray"  # the dead driver's record is dropped, the clean one's too
    assert not list(ray_root.glob(f"session_*/{RECORD_NAME}"))
    trials = json.loads((tmp_path / "runs" / "kill9" / "results" / "summary.json").read_text())["trials"]
    assert [t["status"] for t in trials] == ["ok", "ok"], trials
    search = _runs(uri, "tags.stage = 'search'")
    assert len(search) == 2 and {r.info.status for r in search} == {"FINISHED"}, [(r.info.run_id, r.info.status) for r in search]
    client = MlflowClient(tracking_uri=uri)
    for run in search:
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "ood_val/acc")]
        # Every epoch once: a trial the kill cut short goes on from the last checkpoint Tune had saved, so epochs
        # the dead driver had logged may run again; the resumed driver does not log them twice.
        assert sorted(steps) == [0, 1, 2], steps
    starts, recorded = _training_starts(marks), {r.data.tags["tune_trial_id"] for r in search}
    finished = {r.data.tags["tune_trial_id"] for r in search if r.data.tags["raybench.key"] in finished_keys}
    # The dead driver may have started the next trial after Tune's last save of its state (on a loaded machine it
    # does): the resume knows nothing of that trial and starts its config afresh under a new trial id, which the
    # config's run then carries or not depending on when the kill landed. What holds either way: the resumed
    # driver trains each unfinished config once, and no finished one.
    resumed_starts = _training_starts(marks, excluding_pids=frozenset(p.pid for p in session))
    assert finished and not finished & set(resumed_starts), (finished, starts, resumed_starts)
    assert sum(resumed_starts.values()) == len(recorded - finished), (recorded, finished, resumed_starts)
    assert {trial: starts[trial] for trial in finished} == dict.fromkeys(finished, 1), \
        f"a trial that had finished before the kill trained again after the resume: {starts}"
