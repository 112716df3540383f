"""One driver per sweep, and a sweep stays what it was started as (no name overwritten, no flag changed on
resume).

One real sweep runs (a subprocess on the session's Ray head); while it runs, a second driver of the same sweep
is tried in this process, on the fresh SQLite store the first is creating: it must be refused by the sweep lock,
naming the live driver, before it touches MLflow. Once the sweep has finished, every later attempt runs in this
process and is refused (or answered) before Ray starts: a new sweep of the same name from another --storage,
resumes with changed flags, a resume while the test holds the lock, a stale lock left by a dead driver, and a
resume of the finished sweep with its own flags.
"""
from __future__ import annotations

import contextlib
import io
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.cli import on_head
from helpers.mlflow_stores import seeded_store
from helpers.paths import BIN
from mlflow.tracking import MlflowClient

from raybench.cli import main
from raybench.paths import LockHolder, take_lock
from raybench.sweep.runner import changed_flag, sweep_lock_path
from raybench.tracking import DRIVER_TAG, LOCK_TAG, PROCESS_STATS, STATE_TAG

NAME = "base"
WAIT_S = 420


def sweep_args(workdir: Path, *extra: str, storage: str = "runs") -> list[str]:
    return ["sweep", "erm", "--smoke", "--executor", "function", "--trials", "2", "--replicates", "1",
            "--max-concurrent", "1", "--name", NAME, "--storage", str(workdir / storage),
            "--tracking-uri", f"sqlite:///{workdir}/mlflow.db", "--set", "max_steps_per_epoch=10", *extra]


def in_process(args: list[str]) -> tuple[subprocess.CompletedProcess, int]:
    """`raybench ARGS` through main() in this process (a second driver), its output captured, with the
    number of MLflow calls this process made meanwhile."""
    calls = PROCESS_STATS.calls
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue()), PROCESS_STATS.calls - calls


def wait_for_holder(lock: Path, proc: subprocess.Popen) -> LockHolder:
    """The driver that wrote itself into the sweep lock, once it has (bounded; fails if the driver exits)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        holder = LockHolder.parse(lock.read_text()) if lock.is_file() else None
        if holder is not None:
            return holder
        assert proc.poll() is None, f"the first driver exited before it took the lock:\n{proc.communicate()[1][-3000:]}"
        time.sleep(0.1)
    raise AssertionError(f"no driver wrote itself into {lock} within {WAIT_S} s")


@pytest.fixture(scope="module")
def data_dir(shared_data_dir):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
        yield shared_data_dir


@pytest.fixture(scope="module")
def base_sweep(tmp_path_factory, ray_head, data_dir, empty_store):
    """The sweep `base` on a fresh store: while its driver runs, a second `sweep --name base` and a `--resume` of
    it are tried in this process; then the first driver is left to finish."""
    workdir = tmp_path_factory.mktemp("ownership")
    seeded_store(empty_store, workdir / "mlflow.db")
    args = on_head(sweep_args(workdir), ray_head)
    proc = subprocess.Popen([str(BIN / "raybench"), *args], env=dict(ray_head.env), cwd=workdir,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        holder = wait_for_holder(sweep_lock_path((workdir / "runs").resolve(), NAME), proc)
        attempts = {"new": in_process(args), "resume": in_process([*args, "--resume"])}
        alive_after = proc.poll() is None
        _out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err[-4000:]
    return {"dir": workdir, "args": args, "uri": f"sqlite:///{workdir}/mlflow.db", "pid": proc.pid,
            "holder": holder, "attempts": attempts, "alive_after": alive_after}


def runs_of(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([client.get_experiment_by_name("raybench").experiment_id], "")


def parent_of(uri: str):
    parents = [r for r in runs_of(uri) if r.data.tags.get("stage") == "sweep"]
    assert len(parents) == 1, [p.data.tags for p in parents]
    return parents[0]


def record_of(sweep: dict) -> dict:
    """What must not change when a driver is refused: the parent run (params, status, state) and the summary."""
    parent = parent_of(sweep["uri"])
    summary = sweep["dir"] / "runs" / NAME / "results" / "summary.json"
    return {"params": parent.data.params, "status": parent.info.status, "state": parent.data.tags.get(STATE_TAG),
            "runs": len(runs_of(sweep["uri"])), "summary": summary.read_bytes()}


def one_line_refusal(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert line.startswith("raybench: error: ") and "\n" not in line, line
    return line


# ----- a second driver while the first runs ----------------------------------------------------------------
@pytest.mark.parametrize("attempt", ["new", "resume"])
def test_a_second_driver_is_refused_naming_the_live_one_before_touching_mlflow(base_sweep, attempt):
    assert base_sweep["holder"].pid == base_sweep["pid"] and base_sweep["holder"].host == socket.gethostname()
    proc, mlflow_calls = base_sweep["attempts"][attempt]
    line = one_line_refusal(proc)
    live = f"host {socket.gethostname()}, pid {base_sweep['pid']}"
    assert f"sweep '{NAME}' is being run by another live driver ({live}" in line
    assert mlflow_calls == 0  # refused by the lock before the store (fresh here: its schema is the first's to create)
    assert base_sweep["alive_after"], "the first driver ended before the second tried: the refusal proves nothing"


def test_the_first_driver_alone_trained_and_let_go_of_the_lock_on_its_parent(base_sweep):
    """The parent run names the sweep lock while its driver holds it (tests/test_tracking_parent.py); a finished
    sweep's parent names no lock holder."""
    runs = runs_of(base_sweep["uri"])
    parent = parent_of(base_sweep["uri"])
    assert parent.info.status == "FINISHED" and parent.data.tags[STATE_TAG] == "finished"
    lock = sweep_lock_path((base_sweep["dir"] / "runs").resolve(), NAME)
    assert LOCK_TAG not in parent.data.tags, f"the ended sweep still names its lock: {parent.data.tags[LOCK_TAG]}"
    assert parent.data.tags[DRIVER_TAG].startswith(f"{socket.gethostname()}:{base_sweep['pid']}:")
    trials = [r for r in runs if r.data.tags.get("stage") == "search"]
    assert len(trials) == 2 and len({r.data.tags["trial_id"] for r in trials}) == 2
    client = MlflowClient(tracking_uri=base_sweep["uri"])
    for trial in trials:  # every epoch logged once: a second driver logging to the same parent would double them
        assert [m.step for m in client.get_metric_history(trial.info.run_id, "ood_val/acc")] == [0, 1]
    assert LockHolder.parse(lock.read_text()) is None  # released cleanly: it names nobody


# ----- an existing sweep is never overwritten ---------------------------------------------------------------
@pytest.mark.parametrize("extra", [[], ["--seed", "5"]])
def test_a_new_sweep_of_an_existing_name_in_the_store_is_refused_from_another_storage(base_sweep, ray_head, extra):
    before = record_of(base_sweep)
    args = on_head(sweep_args(base_sweep["dir"], *extra, storage="elsewhere"), ray_head)
    proc, _ = in_process(args)
    line = one_line_refusal(proc)
    assert f"a sweep named '{NAME}' already exists in the tracking store {base_sweep['uri']}" in line
    assert "--resume" in line and "another --name" in line
    assert record_of(base_sweep) == before
    elsewhere = base_sweep["dir"] / "elsewhere"
    assert not list(elsewhere.glob(f"{NAME}*"))  # no sweep folder (only the sweep lock, released)


# ----- a resume keeps the recorded flags ----------------------------------------------------------------------
@pytest.mark.parametrize("extra, flag, was, got", [
    (["--seed", "5"], "--seed", "0", "5"),
    (["--sampler", "tpe"], "--sampler", "random", "tpe"),
    (["--selection", "id_val"], "--selection", "ood_val", "id_val"),
    (["--scheduler", "asha"], "--scheduler", "fifo", "asha"),
    (["--set", "max_steps_per_epoch=11"], "the fixed setting max_steps_per_epoch (SPACE or --set)", "10", "11"),
    (["--set", "batch_size=16"], "the fixed setting batch_size (SPACE or --set)", "64", "16"),
])
def test_a_resume_with_a_changed_flag_is_refused_naming_it(base_sweep, extra, flag, was, got):
    before = record_of(base_sweep)
    proc, _ = in_process([*base_sweep["args"], *extra, "--resume"])
    line = one_line_refusal(proc)
    assert f"--resume: {flag} was {was} when this sweep started, got {got}" in line
    assert record_of(base_sweep) == before  # still FINISHED, its summary untouched, no run added


def test_a_resume_with_fewer_trials_or_replicates_than_it_ran_is_refused_naming_them(base_sweep):
    """More trials or replicates extend a finished sweep (tests/test_search_growth.py); fewer cannot take runs back."""
    before = record_of(base_sweep)
    proc, _ = in_process([*base_sweep["args"], "--trials", "1", "--resume"])
    line = one_line_refusal(proc)
    assert "--resume: --trials: this sweep's search ran 2 trials, got 1; give at least 2" in line
    assert record_of(base_sweep) == before
    proc, _ = in_process([*base_sweep["args"], "--replicates", "0", "--resume"])
    line = one_line_refusal(proc)
    assert "--resume: --replicates: this sweep's selected config ran 1 replicates, got 0; give at least 1" in line
    assert record_of(base_sweep) == before


def test_a_resume_of_the_finished_sweep_with_its_own_flags_says_so_and_changes_nothing(base_sweep):
    before = record_of(base_sweep)
    proc, _ = in_process([*base_sweep["args"], "--resume", "--max-concurrent", "2"])  # how fast may change
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"sweep {NAME}: already finished; nothing to resume" in proc.stdout
    assert record_of(base_sweep) == before
    assert not any(r.info.status == "KILLED" for r in runs_of(base_sweep["uri"]))
    shown, _ = in_process(["results", NAME, "--tracking-uri", base_sweep["uri"]])
    assert shown.returncode == 0 and f"sweep {NAME}: finished" in shown.stdout


# ----- a lock held here, and a stale one left by a dead driver ---------------------------------------------------
def test_a_resume_while_another_process_holds_the_lock_is_refused_naming_it(base_sweep):
    before = record_of(base_sweep)
    with take_lock(sweep_lock_path((base_sweep["dir"] / "runs").resolve(), NAME)) as held:
        proc, calls = in_process([*base_sweep["args"], "--resume"])
    line = one_line_refusal(proc)
    assert f"(host {held.holder.host}, pid {held.holder.pid}, since {held.holder.since}" in line and calls == 0
    assert record_of(base_sweep) == before


def test_a_stale_lock_of_a_dead_driver_is_taken_over(base_sweep):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ghost = LockHolder(socket.gethostname(), int(dead.stdout), "2020-01-01 00:00:00")
    lock = sweep_lock_path((base_sweep["dir"] / "runs").resolve(), NAME)
    lock.write_text(json.dumps(ghost.__dict__))  # what a killed driver leaves: its name, and no flock
    proc, _ = in_process([*base_sweep["args"], "--resume"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"taking over the lock of a driver that is gone ({ghost.words()})" in proc.stdout
    assert LockHolder.parse(lock.read_text()) is None


# ----- the comparison itself ---------------------------------------------------------------------------------
def test_only_the_flags_that_decide_the_results_are_compared():
    recorded = {"seed": "0", "trials": "2", "max_concurrent": "1", "address": "a:1", "storage": "runs",
                "space.searched": "lr", "space.search.lr": "loguniform[0.0001, 0.01]",
                "space.fixed.stage_cache": "/a/stage_cache", "space.fixed.epochs": "2"}
    moved = {**recorded, "max_concurrent": "4", "address": "b:2", "storage": "/abs/runs",
             "space.fixed.stage_cache": "/b/stage_cache", "space.fixed.epochs": "2.0"}
    assert changed_flag(recorded, moved) is None
    assert changed_flag({**recorded, "dataset": "digits-shift"}, {**moved, "dataset": "spuco-digits"}).startswith(
        "--resume: --dataset was digits-shift when this sweep started, got spuco-digits; ")
    searched = changed_flag(recorded, {**recorded, "space.search.lr": "loguniform[0.001, 0.1]"})
    assert searched.startswith("--resume: SPACE (its search of lr) was loguniform[0.0001, 0.01]")
    legacy = {k: v for k, v in recorded.items() if not k.startswith("space.search")} | {"space": "erm"}
    assert changed_flag(legacy, {**recorded, "space": "dann"}).startswith("--resume: SPACE was erm")


def test_the_refusal_names_the_store_without_its_password(data_dir, tmp_path):
    from raybench.sweep.errors import SweepExists
    from raybench.sweep.runner import SweepOptions, check_recorded, prepare
    from raybench.tracking import RecordedSweep, SweepStanding

    prepared = prepare(SweepOptions(space="erm", name=NAME, storage=str(tmp_path / "runs"),
                                    tracking_uri="http://ann:s3cret@127.0.0.1:5000"))
    recorded = RecordedSweep("abc123", {}, "FINISHED", SweepStanding("finished", None))
    with pytest.raises(SweepExists) as refused:
        check_recorded(prepared, recorded)
    assert f"a sweep named '{NAME}' already exists in the tracking store http://***@127.0.0.1:5000 (run abc123)" \
        in str(refused.value) and "s3cret" not in str(refused.value)
