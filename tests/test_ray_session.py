"""A sweep's hold on Ray (raybench.sweep.runner.RaySession): the sweep's own work that needs no Ray runs beside
Ray's start and stop, not before or after them. Ray is replaced by stand-ins that only pass when both sides run at
once: each waits, with a bounded timeout, for an event only the other side sets."""
from __future__ import annotations

import gc
import sys
import threading
import weakref

import pytest

from raybench.sweep import ray_backend, ray_cluster
from raybench.sweep.errors import ClusterError
from raybench.sweep.runner import RaySession, SweepOptions
from raybench.tracking import TrackingError

WAIT_S = 30.0


class StandInRay:
    """connect and shutdown as a sweep calls them, recording what happened."""

    def __init__(self, connect_waits_for: threading.Event | None = None, fails: Exception | None = None,
                 shutdown_waits_for: threading.Event | None = None) -> None:
        self.connect_started = threading.Event()
        self.connect_waits_for, self.fails, self.shutdown_waits_for = connect_waits_for, fails, shutdown_waits_for
        self.shutdowns = 0

    def connect(self, address: str | None, driver_slots: int, py_modules: list[str] | None = None) -> bool:
        self.connect_started.set()
        if self.connect_waits_for is not None:
            assert self.connect_waits_for.wait(WAIT_S), "Ray's start waited in vain for the work beside it"
        if self.fails is not None:
            raise self.fails
        return True

    def shutdown(self) -> None:
        if self.shutdown_waits_for is not None:
            assert self.shutdown_waits_for.wait(WAIT_S), "Ray's stop waited in vain for the record beside it"
        self.shutdowns += 1


@pytest.fixture
def stand_in(monkeypatch):
    def install(ray: StandInRay) -> RaySession:
        monkeypatch.setattr(ray_backend, "connect", ray.connect)
        monkeypatch.setattr(ray_backend, "shutdown", ray.shutdown)
        return RaySession(SweepOptions(space="erm"))
    return install


def test_a_new_stores_tracker_is_made_while_ray_starts(stand_in):
    work_done = threading.Event()
    ray = StandInRay(connect_waits_for=work_done)
    session = stand_in(ray)

    def make_store() -> str:  # only possible while Ray is starting: the start waits for this to end
        assert ray.connect_started.wait(WAIT_S), "the work ran before Ray's start, not beside it"
        assert threading.current_thread() is not threading.main_thread()
        work_done.set()
        return "tracker"

    assert session.start_beside(make_store) == "tracker"
    assert session.connected
    session.stop()
    assert ray.shutdowns == 1 and not session.connected


def test_work_that_fails_beside_rays_start_lets_ray_go_and_raises(stand_in):
    ray = StandInRay()
    session = stand_in(ray)

    def broken_store() -> None:
        raise TrackingError("the store cannot be made")

    with pytest.raises(TrackingError, match="cannot be made"):
        session.start_beside(broken_store)
    assert ray.shutdowns == 1 and not session.connected
    session.stop()  # the sweep's own clean-up after the error lets go of nothing twice
    assert ray.shutdowns == 1


def test_a_failed_ray_start_is_raised_once_the_work_beside_it_has_ended(stand_in):
    ray = StandInRay(fails=ClusterError("no trial-driver resource"))
    session = stand_in(ray)
    ended = threading.Event()

    def slow_store() -> str:
        assert ray.connect_started.wait(WAIT_S)
        ended.set()
        return "tracker"

    with pytest.raises(ClusterError, match="trial-driver"):
        session.start_beside(slow_store)
    assert ended.is_set(), "the error left while the store was still being made"
    assert ray.shutdowns == 0 and not session.connected


def test_ray_stops_beside_the_record_and_the_session_waits_for_it(stand_in):
    record_started = threading.Event()
    ray = StandInRay(shutdown_waits_for=record_started)
    session = stand_in(ray)
    session.start()
    session.stop_in_background()  # returns at once: the shutdown waits for the record below
    record_started.set()
    session.stop()
    assert ray.shutdowns == 1 and not session.connected
    session.stop()
    assert ray.shutdowns == 1


def test_a_session_that_found_ray_running_leaves_it_running(stand_in, monkeypatch):
    ray = StandInRay()
    session = stand_in(ray)
    monkeypatch.setattr(ray_backend, "connect", lambda address, driver_slots, py_modules=None: False)  # a library caller's own Ray
    session.start()
    session.stop_in_background()
    session.stop()
    assert ray.shutdowns == 0


def test_what_runs_beside_rays_start_makes_a_new_store_and_imports_the_record(tmp_path):
    import subprocess

    db = tmp_path / "new.db"
    code = ("import sys; from raybench.sweep.runner import _ready_for_the_end; "
            "from raybench.report.record import SWEEP_RECORD; modules = SWEEP_RECORD.modules(3, True); "
            f"tracker = _ready_for_the_end('sqlite:///{db}', 'raybench', True, modules); "
            "assert tracker.experiment_id; assert all(m in sys.modules for m in modules), modules; "
            "assert 'matplotlib' in sys.modules and 'sklearn' in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert db.is_file()


@pytest.mark.parametrize("trials, searched, rated", [(3, True, True), (10, True, True), (2, True, False),
                                                     (1, True, False), (10, False, False)])
def test_fanova_is_imported_beside_rays_start_only_for_a_search_it_can_rate(trials, searched, rated):
    """Below MIN_TRIALS search trials, or with nothing searched, importances() rates nothing and never imports
    Optuna's fANOVA (test_importance.py), so the driver does not import it either; the plots it always makes."""
    from raybench.report.record import IMPORTANCE_MODULES, PLOT_MODULES, SWEEP_RECORD

    modules = SWEEP_RECORD.modules(trials, searched)
    assert set(PLOT_MODULES) <= set(modules)
    assert set(IMPORTANCE_MODULES) <= set(modules) if rated else not set(IMPORTANCE_MODULES) & set(modules)


class ShuttingDownRay:
    """Ray's calls as the node watch and `ray_cluster.shutdown` make them. `nodes` records every question asked
    while `shutdown` runs (the real core worker ends the process then); `shutdown` takes a while, as Ray's does."""

    def __init__(self) -> None:
        self.initialized, self.shutting_down = True, False
        self.questions, self.questions_during_shutdown = 0, 0
        self.asked_three_times = threading.Event()

    def is_initialized(self) -> bool:
        return self.initialized

    def nodes(self) -> list[dict]:
        self.questions += 1
        self.questions_during_shutdown += self.shutting_down
        if self.questions >= 3:
            self.asked_three_times.set()
        return [{"NodeID": "own-node", "Alive": True}]

    def shutdown(self) -> None:
        self.shutting_down = True
        threading.Event().wait(0.2)  # the watch, asking every millisecond, would ask about 200 times meanwhile
        self.initialized, self.shutting_down = False, False


def test_the_node_watch_asks_ray_nothing_once_ray_is_let_go(monkeypatch):
    """A question to Ray while `ray.shutdown` runs ends the driver in Ray's core worker (exit 1), so `shutdown`
    stops the watch of the driver's node first; the watch asks every millisecond here, to meet the window."""
    fake = ShuttingDownRay()
    for name in ("is_initialized", "nodes", "shutdown"):
        monkeypatch.setattr(ray_cluster.ray, name, getattr(fake, name))
    monkeypatch.setattr(ray_cluster.ray, "get_runtime_context",
                        lambda: type("Context", (), {"get_node_id": lambda self: "own-node"})())
    monkeypatch.setattr(ray_cluster.ray._private.worker, "_global_node", None)
    watch = ray_cluster.watch_own_node(interval_s=0.001)
    assert fake.asked_three_times.wait(WAIT_S), "the watch never asked about its node"
    ray_cluster.shutdown()
    watch.thread.join(WAIT_S)
    assert not watch.thread.is_alive(), "the node watch outlived Ray"
    assert fake.questions_during_shutdown == 0, f"{fake.questions_during_shutdown} questions reached Ray while it shut down"


class StageObject:
    """Stands for Tune's objects of a stage (trials, results), some of which hold Ray objects."""

    def __init__(self) -> None:
        self.grid: list = []
        self.own_cycle = self  # Tune's objects refer to each other: only Python's cycle collector frees them


def test_cyclic_garbage_is_freed_before_ray_is_let_go_in_the_background(stand_in, monkeypatch):
    """A Ray object freed on the sweep's thread while `ray.shutdown` runs in the stopping thread ends the driver
    in Ray's core worker (exit 1): cycles are collected before the stopping thread starts."""
    ray = StandInRay()
    session = stand_in(ray)
    session.start()
    garbage = StageObject()
    freed = weakref.ref(garbage)
    alive_at_shutdown = []

    def shutdown() -> None:
        alive_at_shutdown.append(freed() is not None)
        ray.shutdown()

    monkeypatch.setattr(ray_backend, "shutdown", shutdown)
    gc.disable()  # only the session may collect it
    try:
        del garbage
        session.stop_in_background()
        session.stop()
    finally:
        gc.enable()
    assert alive_at_shutdown == [False], "a stage's cyclic garbage was still alive when Ray's shutdown began"


def test_a_sweep_holds_no_stage_object_once_it_lets_ray_go(monkeypatch, tmp_path):
    """`_search_and_replicate` keeps only plain records of a stage: Tune's objects are freed on its thread before
    the stopping thread runs `ray.shutdown`, not when the function returns, during it."""
    from types import SimpleNamespace

    from raybench.records import TrialRecord, TrialStatus
    from raybench.sweep import runner

    stages: list[weakref.ref] = []

    class Backend:  # what _search_and_replicate asks of ray_backend: a search of one trial, then one replicate
        class RunSpec:
            def __init__(self, *args, **kwargs) -> None:
                self.name, self.completed = args[0], None

            def with_callbacks(self, *callbacks):
                return self

        RunRecords = TrackingCallback = ProgressCallback = EarlyStopping = staticmethod(lambda *a, **k: None)

        @staticmethod
        def run_search(*args):
            stage = StageObject()
            stages.append(weakref.ref(stage))
            return stage

        run_replicates = run_search

        @staticmethod
        def collect(grid, space, spec):
            return [TrialRecord(0, "t0", 0, {}, TrialStatus.OK, selection_value=0.5)]

        @staticmethod
        def cut_short(stage) -> bool:
            return False

    class LettingGo(Exception):
        pass

    class Session:
        backend = Backend

        def stop_in_background(self) -> None:
            gc.collect()  # as RaySession does: only what a frame still holds survives this
            raise LettingGo([ref() is not None for ref in stages])

    options = SweepOptions(space="erm", trials=1, replicates=1)
    prepared = SimpleNamespace(options=options, name="s", storage=tmp_path, space=SimpleNamespace(search={}),
                               selection_metric="val/acc", epochs=1, report={"split_labels": {}}, replicate_rule=None,
                               extents=(1,), replicate_extents=(1,), spend_limit=None, budget_cut=None,
                               baseline_options=None)
    with pytest.raises(LettingGo) as letting_go:
        runner._search_and_replicate(prepared, None, Session(), None, {}, recorder=None)
    assert letting_go.value.args[0] == [False, False], "a stage's objects were alive as Ray was let go"
