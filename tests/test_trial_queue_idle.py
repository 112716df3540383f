"""benchmarks/trial_queue.py's account of idle slot-seconds: runs laid onto slots from their own
records, and each gap named by what the next run on that slot was. The README's figures rest on it."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def trial_queue_module():
    spec = importlib.util.spec_from_file_location("trial_queue", REPO / "benchmarks" / "trial_queue.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


tq = trial_queue_module()


def test_idle_is_split_into_edges_and_gaps_by_what_the_next_run_on_the_slot_is():
    spans = [tq.RunSpan(0.0, 10.0, "x-search"), tq.RunSpan(0.5, 5.0, "y-search"),
             tq.RunSpan(10.1, 20.0, "x-search"),  # both slots free: the one just freed, whose process Tune hands on
             tq.RunSpan(15.0, 25.0, "z-search"),  # another sweep's trial on the second slot
             tq.RunSpan(21.0, 30.0, "x-replicate-abc")]  # the sweep's next stage, on the first slot
    idle = tq.idle_by_handover(spans, cap=2, started=-1.0, ended=31.0)
    assert idle.gaps == {"same stage": 1, "next stage": 1, "another sweep": 1}
    assert idle.gaps_s == pytest.approx({"same stage": 0.1, "next stage": 1.0, "another sweep": 10.0})
    assert idle.edges_s == pytest.approx(1.0 + 1.5 + 1.0 + 6.0)  # before each slot's first run, after its last
    busy = sum(span.end - span.start for span in spans)
    assert busy + idle.edges_s + sum(idle.gaps_s.values()) == pytest.approx(2 * 32.0)


def test_a_runs_span_is_read_from_its_completed_record(tmp_path):
    record = {"time/trainer_started_at": 105.0, "time/startup_s": 5.0, "time/wall_s": 12.0}
    for stage in ("bench-erm-digits-search", "bench-erm-digits-replicate-1f2e"):
        (tmp_path / stage / "completed").mkdir(parents=True)
        (tmp_path / stage / "completed" / "k.json").write_text(json.dumps(record))
    spans = tq.run_spans(tmp_path)
    assert [(s.start, s.end) for s in spans] == [(100.0, 112.0)] * 2
    assert {s.sweep for s in spans} == {"bench-erm-digits"}
