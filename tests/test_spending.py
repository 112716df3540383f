"""--budget without Ray (raybench.sweep.spending): what a budget word means, how spending is counted from the runs'
records, the rule that decides whether another trial fits, and a benchmark's budget shared out among its pairs."""
from __future__ import annotations

import json

import pytest

from raybench.commands.benchmark import budget_share
from raybench.sweep.spending import (
    CUT_FILE,
    GPU,
    WALL,
    RunCost,
    SpendGate,
    SpendLimit,
    budget_record,
    budget_words,
    parse_spend_limit,
    read_cut,
    sweep_runs,
    union_seconds,
)


@pytest.mark.parametrize(("text", "seconds", "unit"), [
    ("2h", 7200.0, WALL), ("90m", 5400.0, WALL), ("30s", 30.0, WALL), ("1.5h", 5400.0, WALL),
    ("12gpu-h", 43200.0, GPU), ("0.25GPU-H", 900.0, GPU),
])
def test_a_budget_is_wall_clock_or_gpu_hours(text, seconds, unit):
    limit = parse_spend_limit(text)
    assert (limit.seconds, limit.unit) == (seconds, unit)


@pytest.mark.parametrize("text", ["", "2", "2 hours", "0h", "-1h", "3x", "gpu-h"])
def test_anything_else_is_refused_naming_what_was_expected(text):
    with pytest.raises(ValueError, match="expected a wall-clock budget such as 90m or 2h"):
        parse_spend_limit(text)


def test_wall_clock_counts_the_time_any_run_was_running_once():
    assert union_seconds([(0, 10), (5, 12), (20, 25)]) == 17
    assert union_seconds([(0, 10), (2, 3)]) == 10
    assert union_seconds([]) == 0


def _record(start: float, wall: float, gpu: float = 0.0) -> dict:
    return {"time/trainer_started_at": start + 1.0, "time/startup_s": 1.0, "time/wall_s": wall, "time/gpu_s": gpu}


def test_the_sweeps_runs_are_read_from_every_stage_of_that_sweep_only(tmp_path):
    for folder, start in [("s-search", 0), ("s-search-to6", 100), ("s-replicate-abc", 200), ("s2-search", 300),
                          ("other-search", 400)]:
        (tmp_path / folder / "completed").mkdir(parents=True)
        (tmp_path / folder / "completed" / "k.json").write_text(json.dumps(_record(start, 5.0)))
    (tmp_path / "s-search" / "completed" / "failure.json").write_text(json.dumps({"failure": "diverged"}))
    runs = sweep_runs(tmp_path, "s")
    assert sorted((r.start, r.search) for r in runs) == [(0, True), (100, True), (200, False)]


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _gate(tmp_path, limit: str, runs: list[RunCost], replicates: int = 2, concurrency: int = 1,
          gpus: float = 0.0, clock: Clock | None = None) -> SpendGate:
    return SpendGate(parse_spend_limit(limit), lambda: list(runs), replicates, concurrency, gpus,
                     tmp_path / "search" / CUT_FILE, clock or Clock(100.0))


def test_until_a_trial_finished_there_is_no_cost_to_judge_by_and_trials_are_drawn(tmp_path):
    assert _gate(tmp_path, "1s", []).may_draw(0)


def test_the_next_trial_is_drawn_only_while_it_and_the_replicates_fit(tmp_path):
    # 3 finished trials of 10 s each, back to back: 30 s spent. A fourth (10 s) and 2 replicates (20 s): 60 s.
    runs = [RunCost(10.0 * i, 10.0, 0.0, True) for i in range(3)]
    assert _gate(tmp_path, "60s", runs, clock=Clock(30.0)).may_draw(3)
    gate = _gate(tmp_path, "59s", runs, clock=Clock(30.0))
    assert not gate.may_draw(3)
    cut = read_cut(tmp_path / "search")
    assert (cut.drawn, cut.spent_s, cut.per_trial_s, cut.replicates) == (3, 30.0, 10.0, 2)
    # Two at a time: the replicates are one wave, so one more trial fits in 50 s
    assert _gate(tmp_path, "50s", runs, concurrency=2, clock=Clock(30.0)).may_draw(3)


def test_a_running_trial_counts_its_time_so_far_and_replicates_do_not_count_as_the_cost_per_trial(tmp_path):
    runs = [RunCost(0.0, 10.0, 0.0, True), RunCost(10.0, 100.0, 0.0, False)]
    clock = Clock(120.0)
    gate = _gate(tmp_path, "145s", runs, replicates=0, concurrency=2, clock=clock)
    assert gate.may_draw(1)  # 110 spent + 10 a trial
    gate.started("running")
    clock.now = 150.0  # the running trial keeps the wall-clock going: 140 s spent, and 10 more do not fit
    assert not gate.may_draw(2)
    gate.ended("running")


def test_gpu_hours_add_up_every_trials_gpus_also_of_those_still_running(tmp_path):
    runs = [RunCost(0.0, 100.0, 200.0, True)]  # 2 GPUs for 100 s
    clock = Clock(100.0)
    gate = _gate(tmp_path, f"{550 / 3600}gpu-h", runs, replicates=0, concurrency=4, gpus=2.0,
                 clock=clock)
    assert gate.may_draw(1)
    gate.started("a")  # 200 spent, 200 more that "a" will hold, and 200 for a third: over 550
    assert not gate.may_draw(2)


def test_the_cut_is_written_once_and_the_summary_says_what_was_cut(tmp_path):
    runs = [RunCost(0.0, 10.0, 0.0, True)]
    gate = _gate(tmp_path, "15s", runs, replicates=1)
    assert not gate.may_draw(1)
    first = (tmp_path / "search" / CUT_FILE).read_text()
    runs.append(RunCost(10.0, 30.0, 0.0, True))
    assert not gate.may_draw(2)
    assert (tmp_path / "search" / CUT_FILE).read_text() == first
    record = budget_record(parse_spend_limit("15s"), 10, read_cut(tmp_path / "search"), runs)["budget"]
    assert (record["trials_drawn"], record["trials_cut"], record["spent_s"]) == (1, 9, 40.0)
    line = budget_words({"budget": record})[0]
    assert line.startswith("Budget: 15s; spent 40.0 s of wall-clock") and "drew 1 of 10 configs, 9 cut" in line
    assert budget_record(None, 10, None, runs) == {}


class Grid:
    def __init__(self, pairs: int, at_once: int) -> None:
        self.pairs, self.sweeps_at_once = list(range(pairs)), at_once


def test_a_benchmarks_budget_is_shared_gpu_hours_by_pairs_wall_clock_by_waves_of_pairs():
    assert budget_share(SpendLimit(4 * 3600.0, GPU, "4gpu-h"), Grid(4, 2)) == "1gpu-h"
    assert budget_share(SpendLimit(3600.0, WALL, "1h"), Grid(4, 2)) == "1800s"
    assert budget_share(SpendLimit(3600.0, WALL, "1h"), Grid(5, 2)) == "1200s"
    assert budget_share(None, Grid(4, 2)) is None
    assert parse_spend_limit(budget_share(SpendLimit(3600.0, WALL, "1h"), Grid(7, 2))).seconds == 900.0
