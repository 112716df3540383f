"""A search grown after it finished (raybench.sweep.extension), without Ray: the extents a --trials means, the
supersession rule, the replayed searchers (random draw for draw, TPE told the results), the resume check that lets
--trials grow, and a benchmark file whose pairs' trials only went up."""
from __future__ import annotations

import optuna
import pytest

from raybench.commands.benchmark import finished_status, grown_pairs, trials_asked
from raybench.data import load_dataset
from raybench.records import PairState, Replicates, Selection, SweepState, SweepSummary, TrialRecord, TrialStatus
from raybench.sweep.extension import (
    ExtentError,
    extension_record,
    extension_words,
    planned_extents,
    read_extents,
    supersessions,
    write_extents,
)
from raybench.sweep.ray_search import replayed_searcher
from raybench.sweep.runner import changed_flag
from raybench.sweep.sampling import draw_configs
from raybench.sweep.space import load_space


def trial(order: int, value: float | None, trial_id: str | None = None, **sampled: float) -> TrialRecord:
    status = TrialStatus.OK if value is not None else TrialStatus.FAILED
    return TrialRecord(order, trial_id or f"t{order}", 0, dict(sampled), status, selection_value=value)


# ----- extents ---------------------------------------------------------------------------------------------------
def test_more_trials_add_an_extent_the_same_keep_them_and_fewer_are_refused_in_one_line():
    assert planned_extents((4,), 6) == (4, 6)
    assert planned_extents((4, 6), 6) == (4, 6)
    assert planned_extents((4, 6), 9) == (4, 6, 9)
    with pytest.raises(ExtentError) as refused:
        planned_extents((4, 6), 5)
    assert str(refused.value).count("\n") == 0
    assert "ran 6 trials (extended from 4), got 5; give at least 6 (more extends it)" in str(refused.value)


def test_extents_are_read_back_as_written_and_a_damaged_file_falls_back_to_the_recorded_trials(tmp_path):
    assert read_extents(tmp_path, "s", 4) == (4,)
    write_extents(tmp_path, "s", (4, 6))
    assert read_extents(tmp_path, "s", 4) == (4, 6)
    (tmp_path / "s" / "search.json").write_text('{"extents": [4, "six"]}')
    assert read_extents(tmp_path, "s", 4) == (4,)


def test_a_resume_may_grow_trials_but_no_other_recorded_flag():
    recorded = {"trials": "4", "seed": "0", "sampler": "random"}
    assert changed_flag(recorded, {**recorded, "trials": "6"}) is None
    assert "--seed was 0" in changed_flag(recorded, {**recorded, "trials": "6", "seed": "1"})


# ----- supersession -----------------------------------------------------------------------------------------------
def test_an_extension_whose_best_trial_is_new_supersedes_the_earlier_selection():
    trials = [trial(1, 0.5), trial(2, 0.7), trial(3, 0.6), trial(4, 0.9), trial(5, 0.95)]
    found = supersessions(trials, (3, 4, 5))
    assert [(s.earlier, s.trials, s.was, s.by) for s in found] == [(3, 4, "t2", "t4"), (4, 5, "t4", "t5")]
    assert supersessions(trials[:3] + [trial(4, 0.1)], (3, 4)) == []
    record = extension_record((3, 4, 5), trials)["search_extents"]
    assert record["extents"] == [3, 4, 5] and [s["by"] for s in record["superseded"]] == ["t4", "t5"]
    words = extension_words({"search_extents": record})
    assert words[0] == "Search: extended (3 -> 4 -> 5 trials)" and "superseded by trial t5" in words[2]
    assert extension_record((5,), trials) == {}


def test_a_tie_in_the_extension_keeps_the_earlier_trial_selected():
    assert supersessions([trial(1, 0.5), trial(2, 0.7), trial(3, 0.7)], (2, 3)) == []


# ----- the replayed searchers -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dann_space(shared_data_dir):
    return load_space("dann").for_dataset(load_dataset("digits-shift", shared_data_dir))


def _run_as_earlier(configs: list[dict]) -> list[TrialRecord]:
    return [trial(i + 1, 0.1 * (i + 1), **config) for i, config in enumerate(configs)]


def test_the_random_replay_draws_configs_n_plus_1_on_of_the_same_seeded_stream(dann_space):
    # More earlier trials than a searcher redraws repeats (MAX_REDRAWS): only a replay draw for draw gets past them
    stream = draw_configs(dann_space.search, 28, seed=11)
    searcher = replayed_searcher(dann_space, "random", 11, _run_as_earlier(stream[:25]))
    assert [searcher.suggest(f"new-{i}") for i in range(3)] == stream[25:]


def test_the_tpe_replay_is_told_every_earlier_result_and_never_hands_an_earlier_config_out_again(dann_space):
    earlier = _run_as_earlier(draw_configs(dann_space.search, 4, seed=5))
    earlier[2] = trial(3, None, **earlier[2].sampled)  # a failed trial is told as failed
    searcher = replayed_searcher(dann_space, "tpe", 5, earlier)
    told = searcher._ot_study.get_trials(deepcopy=False)
    assert [t.state for t in told] == [optuna.trial.TrialState.COMPLETE] * 2 + [optuna.trial.TrialState.FAIL] + \
           [optuna.trial.TrialState.COMPLETE]
    assert [t.value for t in told if t.value is not None] == pytest.approx([0.1, 0.2, 0.4])
    new = [searcher.suggest(f"new-{i}") for i in range(3)]
    assert not any(config in [t.sampled for t in earlier] for config in new)


# ----- a benchmark grid grown -------------------------------------------------------------------------------------
GRID = {"selection": "ood_val", "seed": 0, "executor": "train", "smoke": True,
        "pairs": {"a": {"dataset": "d", "space": "x", "trials": 4, "replicates": 2, "set": {}},
                  "b": {"dataset": "d", "space": "y", "trials": 4, "replicates": 2, "set": {}}}}


def _with(**pairs: dict) -> dict:
    return {**GRID, "pairs": {name: {**GRID["pairs"][name], **pairs.get(name, {})} for name in GRID["pairs"]}}


def test_a_grid_whose_pairs_trials_only_went_up_is_grown_any_other_change_is_not():
    assert grown_pairs(GRID, _with(a={"trials": 6})) == {"a": (4, 6)}
    assert grown_pairs(GRID, _with(a={"trials": 6}, b={"replicates": 3})) == {}
    assert grown_pairs(GRID, _with(a={"trials": 3})) == {}
    assert grown_pairs(GRID, {**_with(a={"trials": 6}), "seed": 1}) == {}
    assert grown_pairs(GRID, GRID) == {}


def _finished(trials: int, report: dict | None = None) -> SweepSummary:
    runs = [trial(i + 1, 0.5) for i in range(trials)]
    return SweepSummary(name="s", state=SweepState.FINISHED, selection_blind=None, dataset="d", algorithm="erm",
                        space="erm", space_scales={}, raybench_version="0", selection=Selection("ood_val", "val/acc", "OOD val acc", False), metric_names=[],
                        report=report or {}, trials=runs, selected=runs[0], replicates=Replicates([], 0, [], {}),
                        wall_seconds=1.0)


def test_a_pair_whose_file_asks_more_trials_than_its_sweep_was_asked_for_runs_again():
    assert finished_status(_finished(4), 4) == (PairState.FINISHED, "")
    assert finished_status(_finished(4), 6) is None
    grown = _finished(6, {"search_extents": {"extents": [4, 6], "superseded": []}})
    assert trials_asked(grown) == 6 and finished_status(grown, 6) == (PairState.FINISHED, "")
    cut = _finished(3, {"budget": {"trials_asked": 10}})  # the budget drew 3 of 10: finished as asked
    assert trials_asked(cut) == 10 and finished_status(cut, 10) == (PairState.FINISHED, "")
