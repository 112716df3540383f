"""A sweep's hold on Ray (raybench.sweep.runner.RaySession): the sweep's own work that needs no Ray runs beside
Ray's start and stop, not before or after them. Ray is replaced by stand-ins that only pass when both sides run at
once: each waits, with a bounded timeout, for an event only the other side sets."""
from __future__ import annotations

import sys
import threading

import pytest

from raybench.sweep import ray_backend
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

    def connect(self, address: str | None, driver_slots: int) -> bool:
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
    monkeypatch.setattr(ray_backend, "connect", lambda address, driver_slots: False)  # a library caller's own Ray
    session.start()
    session.stop_in_background()
    session.stop()
    assert ray.shutdowns == 0


def test_what_runs_beside_rays_start_makes_a_new_store_and_imports_the_record(tmp_path):
    import subprocess

    db = tmp_path / "new.db"
    code = ("import sys; from raybench.sweep.runner import _ready_for_the_end, record_modules; "
            "modules = record_modules(3, True); "
            f"tracker = _ready_for_the_end('sqlite:///{db}', True, modules); "
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
    from raybench.sweep.runner import IMPORTANCE_MODULES, PLOT_MODULES, record_modules

    modules = record_modules(trials, searched)
    assert set(PLOT_MODULES) <= set(modules)
    assert set(IMPORTANCE_MODULES) <= set(modules) if rated else not set(IMPORTANCE_MODULES) & set(modules)
