"""WILDS 2.0 App. D's convergence rule, `raybench sweep --converge FACTOR`: while the selected config's replicates
mostly peaked in their last epochs, the same search runs again as `NAME-epochs-x<scale>` with every config's
epochs raised, up to `--converge-attempts` attempts in all (docs/reference/sweep.md, "The convergence rule").

The loop and the choice of the attempt that counts run here on fake summaries, without Ray; the raised spaces
on the shipped ones; the refusals in-process, with the step that would start Ray replaced by one that fails the
test. One sweep runs end to end on the session's Ray head, with a real MLflow store.
"""
from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers.cli import cli, fail_on_reaching, on_head, run_cli
from helpers.mlflow_stores import seeded_store
from mlflow import MlflowClient

from raybench.records import (
    ConvergenceAttempt,
    Replicates,
    Selection,
    SweepState,
    SweepSummary,
    TrialRecord,
    TrialStatus,
)
from raybench.sweep.converge import (
    Attempt,
    ConvergeRule,
    Counted,
    budget_words,
    counting_attempt,
    run_until_converged,
    scaled_epochs,
)
from raybench.sweep.outcome import summarize

LATE = "best epoch 2 of 2 is in its last 10% of epochs: the selection metric was still rising when the budget ended"


# ----- fake summaries ---------------------------------------------------------------------------------
def _run(seed: int, late: bool, steps: float = 40.0) -> TrialRecord:
    """A finished replicate whose planned budget is `steps` batches (the protocol's, ERM's alike)."""
    budget = {f"budget/planned_{name}": value for name, value in (
        ("steps", steps), ("optimizer_steps", steps), ("labeled_examples", 64 * steps), ("unlabeled_examples", 0.0),
        ("labeled_passes", steps / 100), ("protocol_steps", steps), ("erm_steps", steps))}
    return TrialRecord(order=seed, trial_id=f"t{seed}", seed=seed, sampled={"lr": 0.01}, status=TrialStatus.OK,
                       selection_value=0.5, best_epoch=1.0, epochs_run=2.0, not_converged=LATE if late else None,
                       metrics={"best/test/acc": 0.5, **budget})


def fake_summary(name: str, late: list[bool], steps: float = 40.0, state: SweepState = SweepState.FINISHED,
                 **fields) -> SweepSummary:
    """A sweep of ERM whose selected config's replicates peaked late where `late` says."""
    runs = [_run(seed, flag, steps) for seed, flag in enumerate(late)]
    return SweepSummary(name=name, state=state, dataset="digits-shift", algorithm="erm", space="erm",
                        selection=Selection(strategy="ood_val", metric="val/acc"), trials=runs[:1],
                        selected=runs[0] if runs else None,
                        replicates=Replicates(seeds=[r.seed for r in runs], ok=len(runs), runs=runs,
                                              summary=summarize(runs)), **fields)


class FakeAttempts:
    """The attempt function of run_until_converged: each call records the Attempt it was given and returns the
    next scripted summary (its replicates late or not), each attempt's budget twice the one before."""

    def __init__(self, *late: list[bool]) -> None:
        self.late, self.seen = list(late), []

    def __call__(self, attempt: Attempt) -> SweepSummary:
        self.seen.append(attempt)
        return fake_summary(attempt.name, self.late[attempt.number - 1], steps=40.0 * 2 ** (attempt.number - 1))


# ----- the loop -----------------------------------------------------------------------------------------
def test_the_loop_stops_at_the_first_attempt_that_converged():
    attempts, said = FakeAttempts([True, True], [False, True], [False, False]), []
    summary = run_until_converged("s", ConvergeRule(2.0, 3), attempts, said.append)
    assert [(a.number, a.of, a.name, a.epochs_scale) for a in attempts.seen] == [(1, 3, "s", 1.0),
                                                                                 (2, 3, "s-epochs-x2", 2.0)]
    assert summary.name == "s-epochs-x2"  # 1 of 2 late is not "mostly": converged
    assert said == [("attempt 1 of 3: s, epochs x1: 40 steps, 1.00x the protocol's; not converged (2/2 peaked late): "
                     "raising the epochs x2"),
                    "attempt 2 of 3: s-epochs-x2, epochs x2: 80 steps, 1.00x the protocol's; converged"]


def test_a_first_attempt_that_converged_is_the_only_one():
    attempts, said = FakeAttempts([False, False, True]), []
    assert run_until_converged("s", ConvergeRule(2.0, 3), attempts, said.append).name == "s"
    assert len(attempts.seen) == 1 and attempts.seen[0].earlier == ()
    assert said == ["attempt 1 of 3: s, epochs x1: 40 steps, 1.00x the protocol's; converged"]


def test_the_loop_runs_up_to_the_cap_and_returns_the_last_attempt():
    attempts, said = FakeAttempts([True], [True], [True]), []
    summary = run_until_converged("s", ConvergeRule(1.5, 3), attempts, said.append)
    assert [a.name for a in attempts.seen] == ["s", "s-epochs-x1.5", "s-epochs-x2.25"]
    assert summary.name == "s-epochs-x2.25"
    assert said[1].endswith("not converged (1/1 peaked late): raising the epochs x2.25")
    assert said[2] == ("attempt 3 of 3: s-epochs-x2.25, epochs x2.25: 160 steps, 1.00x the protocol's; still not "
                       "converged (1/1 peaked late) at the cap of 3 attempts; its row is marked not converged")


def test_each_later_attempt_names_the_earlier_ones_with_their_budgets_and_reasons():
    attempts = FakeAttempts([True], [True], [False])
    run_until_converged("s", ConvergeRule(2.0, 3), attempts, lambda line: None)
    first, second = (fake_summary(a.name, [True], 40.0 * 2 ** (a.number - 1)) for a in attempts.seen[:2])
    assert attempts.seen[1].earlier == (ConvergenceAttempt("s", 1.0, budget_words(first), LATE),)
    assert attempts.seen[2].earlier == (ConvergenceAttempt("s", 1.0, budget_words(first), LATE),
                                        ConvergenceAttempt("s-epochs-x2", 2.0, budget_words(second), LATE))
    assert budget_words(second).startswith("80 steps (80 optimizer steps)")  # the full words, not the console's


def test_an_attempt_with_no_finished_run_ends_the_loop_saying_there_is_nothing_to_judge():
    attempts, said = FakeAttempts([]), []
    run_until_converged("s", ConvergeRule(2.0, 3), attempts, said.append)
    assert len(attempts.seen) == 1
    assert said == [("attempt 1 of 3: s, epochs x1: budget not recorded; nothing to judge: no run of a selected "
                     "config finished")]


def test_attempt_scales_and_names_are_clean_numbers():
    rule = ConvergeRule(1.1, 4)
    assert [rule.scale(n) for n in (1, 2, 3, 4)] == [1.0, 1.1, 1.21, 1.331]  # not 1.2100000000000002
    assert rule.names("s") == ["s", "s-epochs-x1.1", "s-epochs-x1.21", "s-epochs-x1.331"]
    assert scaled_epochs(50, 1.1) == 55 and scaled_epochs(100, 2.2) == 220  # 55.00000000000001 in floats: 55 epochs
    assert scaled_epochs(10, 1.21) == 13 and scaled_epochs(1, 1.01) == 2


def test_a_large_scale_names_a_sweep_in_whole_digits_never_in_exponent_form():
    from raybench.paths import name_problem

    names = ConvergeRule(10.0, 10).names("s")
    assert names[-3:] == ["s-epochs-x10000000", "s-epochs-x100000000", "s-epochs-x1000000000"]  # not x1e+07
    assert ConvergeRule(5.0, 10).names("s")[-1] == "s-epochs-x1953125"  # not x1.95312e+06, rounded
    assert not [name for name in names if name_problem(name)]


# ----- one sweep's attempts, each prepared as a sweep of its own (runner) --------------------------------------
def test_each_attempt_is_prepared_as_its_own_sweep_under_its_name_and_scale(monkeypatch, tmp_path):
    """sweep_until_converged with prepare and run_sweep replaced: what each attempt's sweep is given."""
    from types import SimpleNamespace

    from raybench.sweep import runner

    prepared, ran = [], []

    def prepare(options, space=None):
        prepared.append(options)
        return SimpleNamespace(options=options, tracking_uri=f"sqlite:///{options.sweep_name('')}.db", attempts=[])

    def run_sweep(chosen, recorder):
        assert recorder is SWEEP_RECORD
        ran.append((chosen.options.sweep_name(""), list(chosen.attempts)))
        return fake_summary(chosen.options.sweep_name(""), [len(ran) < 3])  # attempts 1 and 2 peak late

    monkeypatch.setattr(runner, "prepare", prepare)
    monkeypatch.setattr(runner, "run_sweep", run_sweep)
    options = runner.SweepOptions(space="erm", name="s", storage=str(tmp_path), converge=3.0, converge_attempts=4,
                                  tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    said = []
    from raybench.report.record import SWEEP_RECORD

    summary, uri = runner.sweep_until_converged(options, say=said.append, recorder=SWEEP_RECORD)
    assert [(o.name, o.epochs_scale, o.resume) for o in prepared] == [("s", 1.0, False), ("s-epochs-x3", 3.0, False),
                                                                      ("s-epochs-x9", 9.0, False)]
    assert [name for name, _ in ran] == ["s", "s-epochs-x3", "s-epochs-x9"]
    assert [[a.name for a in earlier] for _, earlier in ran] == [[], ["s"], ["s", "s-epochs-x3"]]
    assert summary.name == "s-epochs-x9" and uri == "sqlite:///s-epochs-x9.db" and len(said) == 3
    assert said[-1].startswith("attempt 3 of 4: s-epochs-x9, epochs x9: ") and said[-1].endswith("; converged")


def test_a_resume_resumes_a_later_attempt_only_where_it_started(tmp_path):
    from raybench.sweep.runner import SweepOptions, attempt_options

    options = SweepOptions(space="erm", name="s", storage=str(tmp_path), converge=2.0, resume=True,
                           tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    second, third = (Attempt(n, 3, ConvergeRule(2.0).name("s", n), 2.0 ** (n - 1)) for n in (2, 3))
    assert attempt_options(options, Attempt(1, 3, "s", 1.0)) is options  # the first attempt is the sweep as asked
    (tmp_path / "s-epochs-x2-search").mkdir()  # the second attempt started; the third never did
    assert (attempt_options(options, second).name, attempt_options(options, second).resume) == ("s-epochs-x2", True)
    assert (attempt_options(options, third).name, attempt_options(options, third).resume) == ("s-epochs-x4", False)
    assert attempt_options(options, third).epochs_scale == 4.0
    fresh = SweepOptions(space="erm", name="s", storage=str(tmp_path), converge=2.0)
    assert attempt_options(fresh, second).resume is False  # without --resume an existing attempt is refused as such


# ----- which attempt counts (a benchmark's pair) ---------------------------------------------------------
RULE = ConvergeRule(2.0, 3)


def _counted(found: dict[str, SweepSummary], rule: ConvergeRule | None = RULE) -> Counted:
    return counting_attempt("s", rule, found.get)


def test_the_attempt_that_counts_is_the_first_not_finished():
    late, interrupted = fake_summary("s", [True]), fake_summary("s-epochs-x2", [True], state=SweepState.INTERRUPTED)
    assert _counted({}) == Counted("s", 1.0, None)  # nothing ran: the first attempt is the one to run
    assert _counted({"s": late}) == Counted("s-epochs-x2", 2.0, None)
    assert _counted({"s": late, "s-epochs-x2": interrupted}) == Counted("s-epochs-x2", 2.0, None)
    first_unfinished = fake_summary("s", [True], state=SweepState.INTERRUPTED_REPLICATES)
    assert _counted({"s": first_unfinished, "s-epochs-x2": fake_summary("s-epochs-x2", [False])}) == \
        Counted("s", 1.0, None)


def test_the_attempt_that_counts_is_the_first_converged_else_the_last():
    late, converged = fake_summary("s", [True]), fake_summary("s-epochs-x2", [False])
    assert _counted({"s": fake_summary("s", [False])}).name == "s"
    assert _counted({"s": late, "s-epochs-x2": converged}) == Counted("s-epochs-x2", 2.0, converged)
    last = fake_summary("s-epochs-x4", [True])
    every = {"s": late, "s-epochs-x2": fake_summary("s-epochs-x2", [True]), "s-epochs-x4": last}
    assert _counted(every) == Counted("s-epochs-x4", 4.0, last)
    assert _counted(every, None) == Counted("s", 1.0, late)  # without a rule the sweep itself, late or not


# ----- the raised spaces ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def digits():
    from raybench.data import load_dataset

    return load_dataset("digits-shift")


def resolved(name: str, dataset, overrides: dict | None = None):
    from raybench.sweep.space import load_space, sweep_space

    space = sweep_space(load_space(name), dataset, overrides or {})
    space.fixed.update(overrides or {})  # as a sweep does (runner.prepare)
    return space


def planned(space, dataset, sampled: dict) -> tuple[int, int]:
    """(epochs, planned steps) of the config `sampled` draws in `space`."""
    from raybench.trainer import TrainConfig

    config = TrainConfig.from_flat(space.materialize(sampled)).resolve(dataset)
    return config.epochs, config.budget(dataset).steps


def test_erm_which_leaves_epochs_to_the_dataset_gets_fixed_raised_epochs(digits):
    erm = resolved("erm", digits)
    assert "epochs" not in erm.fixed and "epochs" not in erm.derived and digits.defaults.epochs == 10
    for scale, epochs in ((2.0, 20), (1.5, 15), (1.1, 11), (1.05, 11)):
        raised = erm.with_epochs_scale(scale)
        assert raised.fixed["epochs"] == epochs  # ceil(10 x scale)
        assert raised.default_epochs == epochs and raised.epochs_scale == scale
        assert planned(raised, digits, {"lr": 1e-3})[0] == epochs
    assert "epochs" not in erm.fixed and erm.epochs_scale == 1.0  # a copy: the space itself is unchanged
    assert erm.with_epochs_scale(1) is erm


@pytest.mark.parametrize("method", ["dann", "fixmatch"])
def test_a_wilds_rule_method_derives_its_epochs_from_the_raised_epochs_and_keeps_its_ratio_to_erm(digits, method):
    space, erm = resolved(method, digits), resolved("erm", digits)
    for scale in (2.0, 3.0):
        raised, raised_erm = space.with_epochs_scale(scale), erm.with_epochs_scale(scale)
        e = scaled_epochs(digits.defaults.epochs, scale)
        for k in (3, 7, 15):
            sample = {"unlabeled_ratio": k}
            assert raised.materialize(sample)["epochs"] == math.ceil(2 * e / (k + 1))  # ceil(factor E / (k + 1))
        # k = 3: the WILDS rule gives half of ERM's epochs at every scale, each step holding 4x the rows
        epochs, steps = planned(raised, digits, {"unlabeled_ratio": 3})
        erm_epochs, erm_steps = planned(raised_erm, digits, {"lr": 1e-3})
        base_epochs, base_steps = planned(space, digits, {"unlabeled_ratio": 3})
        base_erm_epochs, base_erm_steps = planned(erm, digits, {"lr": 1e-3})
        assert (epochs, erm_epochs) == (int(base_epochs * scale), int(base_erm_epochs * scale))
        assert steps / erm_steps == pytest.approx(base_steps / base_erm_steps, rel=0.02)
    assert "epochs" not in space.with_epochs_scale(2).fixed  # still derived, not fixed


@pytest.mark.parametrize("method", ["erm", "dann", "fixmatch"])
def test_a_raised_space_draws_the_same_configs_but_for_their_epochs(digits, method):
    from raybench.sweep.authoring import draw

    space = resolved(method, digits)
    raised = space.with_epochs_scale(2.0)
    assert raised.search == space.search
    before, after = draw(space, 6, 7), draw(raised, 6, 7)
    assert [t.sampled for t in after] == [t.sampled for t in before]
    for old, new in zip(before, after, strict=True):
        config, config_raised = space.materialize(old.sampled), raised.materialize(new.sampled)
        assert {k: v for k, v in config_raised.items() if k != "epochs"} == \
            {k: v for k, v in config.items() if k != "epochs"}  # patience, batch size, lr ... stay
        k = new.sampled.get("unlabeled_ratio")
        assert planned(raised, digits, new.sampled)[0] == (20 if k is None else math.ceil(2 * 20 / (k + 1)))


def test_smoke_and_set_epochs_are_raised_alike(digits):
    from raybench.sweep.space import SMOKE_FIXED

    smoke = resolved("dann", digits, dict(SMOKE_FIXED))
    assert smoke.with_epochs_scale(2).fixed["epochs"] == 4 and smoke.with_epochs_scale(1.5).fixed["epochs"] == 3
    typed = resolved("erm", digits, {"epochs": "3"})  # --set epochs=3, as typed
    assert typed.with_epochs_scale(2).fixed["epochs"] == 6


# ----- refusals before any cluster work --------------------------------------------------------------------
@pytest.fixture
def no_cluster_work(monkeypatch, in_private_dirs):
    """A sweep or benchmark that got past its checks goes no further: reaching the cluster fails the test."""
    from raybench.commands import benchmark
    from raybench.sweep import ray_backend, runner

    fail_on_reaching(monkeypatch, (runner, "run_sweep"), (benchmark, "_run_pairs_on_cluster"),
                     (ray_backend, "connect"))


def refused(result: subprocess.CompletedProcess) -> str:
    """The one error line of a command that refused its input with exit 2, nothing written."""
    assert result.returncode == 2, (result.returncode, result.stdout[-1000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("raybench: error: ") or "error: argument" in lines[-1], result.stderr[-2000:]
    assert not Path("runs").exists() and not Path("mlflow.db").exists()
    return lines[-1]


FACTOR_EXPECTED = "expected a number > 1 (from 1.01 to 10), the factor each attempt raises the epochs by"
ATTEMPTS_EXPECTED = "expected a whole number of attempts in all, the first included, from 2 to 10"


def bench_file(**extra) -> str:
    body = {"name": "b", "trials": 1, "replicates": 1, "executor": "function", "smoke": True,
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm"]}], **extra}
    Path("bench.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    return "bench.yaml"


@pytest.mark.usefixtures("no_cluster_work")
@pytest.mark.parametrize(("flags", "message"), [
    (["--converge", "1"], f"--converge: {FACTOR_EXPECTED}, got 1"),
    (["--converge", "abc"], f"--converge: {FACTOR_EXPECTED}, got 'abc'"),
    (["--converge", "0.5"], f"--converge: {FACTOR_EXPECTED}, got 0.5"),
    (["--converge", "2", "--converge-attempts", "1"], f"--converge-attempts: {ATTEMPTS_EXPECTED}, got 1"),
    (["--converge", "2", "--converge-attempts", "11"], "from 2 to 10, got 11"),
    (["--converge-attempts", "3"], "--converge-attempts: expected only with --converge FACTOR"),
])
@pytest.mark.parametrize("command", ["sweep", "benchmark"])
def test_a_bad_convergence_flag_is_one_line_with_exit_2(capsys, command, flags, message):
    args = (["sweep", "erm", "--smoke", "--storage", "runs"] if command == "sweep" else
            ["benchmark", bench_file(), "--storage", "runs"])
    assert message in refused(cli([*args, *flags], capsys))


@pytest.mark.usefixtures("no_cluster_work")
def test_a_later_attempt_that_could_not_run_is_refused_before_the_first_one_trains(capsys):
    long_name = "n" * 120  # a sweep name may have 128 characters: `-epochs-x2` makes 130
    line = refused(cli(["sweep", "erm", "--smoke", "--storage", "runs", "--name", long_name, "--converge", "2"], capsys))
    assert f"--converge: its attempt '{long_name}-epochs-x2' cannot name a sweep" in line and "shorter --name" in line
    # smoke's 2 epochs x 10^7 at the 8th attempt: past the million epochs a config may have
    line = refused(cli(["sweep", "erm", "--smoke", "--storage", "runs", "--converge", "10", "--converge-attempts", "8"],
                       capsys))
    assert line.startswith("raybench: error: --converge: its last attempt, 'erm-digits-shift-seed0-smoke-epochs-"
                           "x10000000', trains every config's epochs x10000000, more than a config takes (")
    assert "give fewer --converge-attempts or a smaller factor" in line
    with pytest.raises(AssertionError, match="went on to start Ray"):  # 2 x 10^5 epochs at its last attempt: taken
        cli(["sweep", "erm", "--smoke", "--storage", "runs", "--converge", "10", "--converge-attempts", "6"], capsys)


@pytest.mark.usefixtures("no_cluster_work")
@pytest.mark.parametrize(("converge", "message"), [
    ({"factor": 1}, "converge.factor"),
    ({"factor": "two"}, "converge.factor"),
    ({"attempts": 3}, "converge.factor"),  # a cap without a factor
    ({"factor": 2, "attempts": 1}, "converge.attempts"),
    ({"factor": 2, "attempts": 2.5}, "converge.attempts"),
    ({"factor": 2, "tries": 3}, "converge.tries"),
    (2, "converge: expected a mapping with keys factor and attempts"),
])
def test_a_bad_converge_key_of_a_benchmark_file_is_one_line_with_exit_2(capsys, converge, message):
    path = bench_file(converge=converge)
    for command in (["benchmark", path, "--plan"], ["benchmark", path, "--storage", "runs"]):
        line = refused(cli(command, capsys))
        assert line.startswith(f"raybench: error: {path}: ") and message in line, line


@pytest.mark.usefixtures("no_cluster_work")
def test_the_benchmark_flags_override_the_files_converge(capsys):
    from raybench.commands.benchmark import BenchmarkOptions, converge_settings
    from raybench.sweep.benchmark_file import load_benchmark

    path = bench_file(converge={"factor": 3})
    plan = cli(["benchmark", path, "--plan"], capsys)
    assert plan.returncode == 0 and "epochs x3, up to 3 attempts in all (e.g. b-erm-digits-shift, " \
                                   "b-erm-digits-shift-epochs-x3, b-erm-digits-shift-epochs-x9)" in plan.stdout
    plan = cli(["benchmark", path, "--plan", "--converge", "2", "--converge-attempts", "2"], capsys)
    assert "epochs x2, up to 2 attempts in all (e.g. b-erm-digits-shift, b-erm-digits-shift-epochs-x2)" in plan.stdout
    plan = cli(["benchmark", bench_file(converge={"factor": 3, "attempts": 4}), "--plan", "--converge", "2"], capsys)
    assert "epochs x2, up to 4 attempts in all" in plan.stdout  # each value overridden only by its own flag
    # and each pair's sweep is given the rule as flags
    options = BenchmarkOptions(Path("runs").resolve(), "sqlite:///x.db", None, converge=ConvergeRule(2.0, 2))
    assert converge_settings(load_benchmark(path), options) == {"converge": 2.0, "converge_attempts": 2}


@pytest.mark.usefixtures("in_private_dirs")
@pytest.mark.parametrize("scale", ["0", "0.5", "abc", "1e10"])
def test_space_show_refuses_an_epochs_scale_no_attempt_reaches(capsys, scale):
    result = cli(["space", "show", "erm", "--dataset", "digits-shift", "--epochs-scale", scale], capsys)
    assert result.returncode == 2 and "--epochs-scale: expected a number >= 1, at most 1e+09" in result.stderr


@pytest.mark.usefixtures("in_private_dirs")
def test_space_show_and_draw_with_an_epochs_scale_show_the_raised_budget(capsys):
    shown = cli(["space", "show", "erm", "--dataset", "digits-shift", "--epochs-scale", "2"], capsys)
    assert shown.returncode == 0, shown.stderr
    budget = shown.stdout.split("budget per trial")[1].splitlines()
    assert budget[2].split()[:2] == ["-", "20"]  # k, epochs: 10 raised x2
    assert "every config's epochs x2 (an attempt of `sweep --converge`): x ERM and x protocol are against the " \
           "dataset's own 10 epochs" in shown.stdout
    assert "NOT the protocol's budget" not in shown.stdout
    plain = cli(["space", "show", "erm", "--dataset", "digits-shift"], capsys)
    assert plain.stdout.split("budget per trial")[1].splitlines()[2].split()[:2] == ["-", "10"]
    dann = cli(["space", "show", "dann", "--dataset", "digits-shift", "--epochs-scale", "2"], capsys)
    assert "ceil(2 x E / (k + 1)) with E = 20 epochs (raised x2) and k the unlabeled ratio: 10 (k=3), 5 (k=7), " \
           "3 (k=15)" in dann.stdout
    drawn = cli(["space", "draw", "dann", "--dataset", "digits-shift", "--epochs-scale", "2", "--format", "json",
                 "--trials", "3"], capsys)
    unraised = cli(["space", "draw", "dann", "--dataset", "digits-shift", "--format", "json", "--trials", "3"], capsys)
    raised, base = json.loads(drawn.stdout), json.loads(unraised.stdout)
    assert [t["sampled"] for t in raised] == [t["sampled"] for t in base]
    assert [t["derived"]["epochs"] for t in raised] == [math.ceil(40 / (t["sampled"]["unlabeled_ratio"] + 1))
                                                         for t in raised]


# ----- end to end -------------------------------------------------------------------------------------------
def training_runs(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    return client.search_runs([experiment.experiment_id], max_results=1000) if experiment else []


def test_a_sweep_that_peaked_late_runs_again_with_doubled_epochs_and_resumes_without_training(
        tmp_path, ray_head, empty_store):
    """ERM at a fixed lr that still learns fast at 12 steps an epoch: its smoke run's OOD validation accuracy is
    higher after its 2nd (last) epoch than after its 1st, by several points, so the first attempt peaked late,
    and the sweep runs `late-epochs-x2` at 4 epochs. A `--resume` of the same command reads both attempts back."""
    uri = seeded_store(empty_store, tmp_path / "mlflow.db")
    runs = tmp_path / "runs"
    command = on_head(["sweep", "erm", "--smoke", "--trials", "1", "--replicates", "1", "--name", "late",
                       "--executor", "function", "--set", "lr=0.003", "--set", "max_steps_per_epoch=12",
                       "--converge", "2", "--converge-attempts", "2", "--storage", str(runs), "--tracking-uri", uri],
                      ray_head)
    proc = run_cli(command, dict(ray_head.env), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "attempt 1 of 2: late, epochs x1: " in proc.stdout and \
        "not converged (1/1 peaked late): raising the epochs x2" in proc.stdout, proc.stdout[-3000:]
    assert "attempt 2 of 2: late-epochs-x2, epochs x2: " in proc.stdout

    first = json.loads((runs / "late" / "results" / "summary.json").read_text())
    second = json.loads((runs / "late-epochs-x2" / "results" / "summary.json").read_text())
    assert "epochs_scale" not in first and "attempts" not in first
    assert [r["epochs_run"] for r in [*first["trials"], *first["replicates"]["runs"]]] == [2.0, 2.0]
    assert second["epochs_scale"] == 2.0
    assert [r["epochs_run"] for r in [*second["trials"], *second["replicates"]["runs"]]] == [4.0, 4.0]
    [attempt] = second["attempts"]
    assert attempt["name"] == "late" and attempt["epochs_scale"] == 1.0
    assert attempt["reason"].startswith("best epoch 2 of 2 is in its last 10% of epochs")
    assert attempt["budget"].startswith("24 steps (24 optimizer steps)")  # 2 epochs of 12 steps

    shown = run_cli(["compare", "--dataset", "digits-shift", "--tracking-uri", uri], dict(ray_head.env), tmp_path)
    assert shown.returncode == 0, shown.stderr[-2000:]
    table, _, below = shown.stdout.partition("Not in the table (superseded")
    assert "late-epochs-x2" in table and ", epochs x2" in table
    assert "- late (epochs x1, 24 steps" in below and "), by late-epochs-x2 (epochs x2)" in below

    before = {run.info.run_id for run in training_runs(uri)}
    again = run_cli([*command, "--resume"], dict(ray_head.env), tmp_path)
    assert again.returncode == 0, again.stderr[-4000:]
    for name in ("late", "late-epochs-x2"):  # each attempt read back as it was recorded
        assert f"sweep {name}: already finished; nothing to resume" in again.stdout, again.stdout[-3000:]
    assert "attempt 1 of 2: late, epochs x1: " in again.stdout and "attempt 2 of 2: late-epochs-x2" in again.stdout
    assert {run.info.run_id for run in training_runs(uri)} == before  # no new run: nothing trained again
    assert json.loads((runs / "late-epochs-x2" / "results" / "summary.json").read_text())["attempts"] == [attempt]
