"""`raybench benchmark`: a grid of sweeps as one command on one real local Ray, tracked in a real SQLite MLflow.

The end-to-end tests run smoke sweeps (4 steps an epoch) as function trials: what they check is the
orchestration (nesting, the attached comparison, failure isolation, resume), not the training.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from clusters import LocalHead, port_plan
from helpers.cli import cli, on_head, run_cli
from helpers.paths import BIN, REPO
from helpers.processes import processes_under
from mlflow import MlflowClient

from raybench.commands.benchmark import SLOTS_FOLDER, TRIAL_SLOT, BenchmarkOptions, Pair, SweepTarget, sweep_command
from raybench.sweep.benchmark_file import BenchmarkError, load_benchmark
from raybench.tracking import PARENT_TAG, RESUME_TAG

GRIDS = REPO / "raybench" / "grids"
SMOKE = {"selection": "ood_val", "trials": 1, "replicates": 1, "executor": "function", "smoke": True}


def write_yaml(path: Path, body: dict) -> Path:
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def broken_erm_space(folder: Path, dataset: str = "spuco-digits") -> Path:
    """ERM, except that on `dataset` its model reads weights from a file that does not exist: valid YAML,
    refused only by that pair's own sweep (its model check), so exactly one pair of the grid fails."""
    space = yaml.safe_load((REPO / "raybench" / "search_spaces" / "erm.yaml").read_text())
    space["datasets"] = {dataset: {"fixed": {"model_weights": str(folder / "no-such-weights.pt")}}}
    space.pop("derived", None)
    return write_yaml(folder / "erm_broken.yaml", space)


def runs_of(client: MlflowClient, filter_string: str = "") -> list:
    experiment = client.get_experiment_by_name("raybench")
    return client.search_runs([experiment.experiment_id], filter_string, max_results=1000) if experiment else []


def sweep_runs(client: MlflowClient, sweep_run_id: str) -> list:
    return runs_of(client, f"tags.`{PARENT_TAG}` = '{sweep_run_id}'")


# ----- the file ---------------------------------------------------------------------------------------
def test_the_wilds_grid_is_the_papers_pairs_and_refuses_the_rest_with_reasons():
    benchmark = load_benchmark(str(GRIDS / "wilds2.yaml"))
    ran = {(p.dataset, p.method) for p in benchmark.pairs}
    images = {"erm", "erm_aug", "coral", "dann", "pseudolabel", "fixmatch", "noisy_student", "swav"}
    paper = {  # WILDS 2.0, which algorithms the paper ran per dataset (shared/WILDS_REFERENCE.md)
        "iwildcam": images, "camelyon17": images, "fmow": images, "poverty": images - {"pseudolabel"},
        "globalwheat": {"erm", "pseudolabel", "noisy_student"},
        "ogb-molpcba": {"erm", "coral", "dann", "pseudolabel", "noisy_student"},
        "civilcomments": {"erm", "pseudolabel", "mlm"},
        "amazon": {"erm", "coral", "dann", "pseudolabel", "mlm"},
    }
    assert ran == {(d, m) for d, methods in paper.items() for m in methods}
    refused = {(r.dataset, r.method): r.reason for r in benchmark.refused}
    assert len(refused) == 8 * 9 - len(ran) and all(len(reason) > 20 for reason in refused.values())
    assert "regression" in refused[("poverty", "pseudolabel")]
    assert all(p.trials == 10 and p.replicates is None for p in benchmark.pairs)  # App. D; the dataset's seeds


def test_the_embedded_grid_pairs_each_resolve_on_their_dataset():
    from raybench.data import load_dataset
    from raybench.sweep.space import load_space, sweep_space

    benchmark = load_benchmark(str(GRIDS / "embedded.yaml"))
    assert {p.dataset for p in benchmark.pairs} == {"digits-shift", "spuco-digits"}
    assert {p.method for p in benchmark.pairs if p.dataset == "digits-shift"} >= {"erm", "coral", "dann", "fixmatch"}
    for pair in benchmark.pairs:
        dataset = load_dataset(pair.dataset)
        resolved = sweep_space(load_space(str(pair.space_path)), dataset, pair.fixed)
        from raybench.trainer import TrainConfig

        midpoint = {n: p.values[0] if p.values else (p.low + p.high) / 2 for n, p in resolved.search.items()}
        TrainConfig.from_flat({**resolved.materialize(midpoint), **pair.fixed}).resolve(dataset)


@pytest.mark.parametrize("change, message", [
    ({"name": "../up"}, "name: expected 1-128 characters"),
    ({"selection": "best"}, "selection: expected one of"),
    ({"grid": [{"datasets": ["nope"], "spaces": ["erm"]}]}, "grid[0].datasets: expected a dataset name"),
    ({"grid": [{"datasets": ["digits-shift"], "spaces": ["no_such_space"]}]}, "spaces: expected a search-space name"),
    ({"grid": [{"datasets": ["digits-shift"], "spaces": ["erm", "erm"]}]}, "each pair once in the grid"),
    ({"set": {"seed": 3}}, "set.seed: expected no value"),
    ({"set": {"lr": -1}}, "set.lr"),
    ({"exclude": [{"datasets": ["digits-shift"], "spaces": ["erm"]}]}, "exclude[0].reason"),
    ({"pairs": [{"dataset": "digits-shift", "space": "dann"}]}, "pairs[0]: expected a pair of the grid"),
    ({"trials": 0}, "trials: expected an integer >= 1"),
    ({"colour": "red"}, "colour: expected one of the keys"),
])
def test_a_bad_benchmark_file_is_one_line_naming_file_key_and_value(tmp_path, change, message):
    body = {"name": "b", **SMOKE, "grid": [{"datasets": ["digits-shift"], "spaces": ["erm"]}], **change}
    path = write_yaml(tmp_path / "bench.yaml", body)
    with pytest.raises(BenchmarkError) as err:
        load_benchmark(str(path))
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_key_given_twice_is_refused_naming_its_line(tmp_path):
    from raybench.sweep.space import SpaceError

    path = tmp_path / "bench.yaml"
    path.write_text("name: b\ntrials: 2\ntrials: 3\ngrid: [{datasets: [digits-shift], spaces: [erm]}]\n")
    with pytest.raises(SpaceError, match=r"bench.yaml: line 3: expected each key once per mapping \(first on line 2\)"):
        load_benchmark(str(path))


def test_the_cli_refuses_a_bad_file_with_exit_2_before_any_cluster_work(tmp_path, sweep_env):
    path = write_yaml(tmp_path / "bench.yaml", {"name": "b", "grid": [{"datasets": ["digits-shift"], "spaces": ["nope"]}]})
    result = run_cli(["benchmark", str(path), "--storage", str(tmp_path / "runs")], sweep_env, tmp_path)
    assert result.returncode == 2 and result.stderr.startswith(f"raybench: error: {path}: spaces")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()


def test_the_sweeps_shares_of_the_cap_add_up_to_at_most_the_cap_and_reach_each_sweep_command(tmp_path):
    """The static split's arithmetic and its hand-over to each sweep's command line; it does not observe
    running trials (on a 2-CPU machine Ray's CPU accounting alone keeps them at 2 or fewer)."""
    body = {"name": "b", **SMOKE, "max_concurrent_trials": 5, "sweeps_at_once": 2,
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm", "coral", "dann"]}]}
    benchmark = load_benchmark(str(write_yaml(tmp_path / "bench.yaml", body)))
    assert benchmark.sweeps_at_once * benchmark.trials_per_sweep <= benchmark.max_concurrent_trials
    pair: Pair = benchmark.pairs[0]
    target = SweepTarget("127.0.0.1:1", "sqlite:///x.db", "run")
    words = sweep_command(pair, benchmark, BenchmarkOptions(tmp_path, "sqlite:///x.db"), target, resume=False)
    assert words[words.index("--max-concurrent") + 1] == "2" and words[words.index("--parent-run") + 1] == "run"
    assert "--trial-resource" not in words


def test_in_the_trial_queue_every_sweep_may_run_the_whole_cap_each_trial_holding_one_slot(tmp_path):
    body = {"name": "b", **SMOKE, "max_concurrent_trials": 5, "sweeps_at_once": 2,
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm", "coral"]}]}
    benchmark = load_benchmark(str(write_yaml(tmp_path / "bench.yaml", body)))
    target = SweepTarget("127.0.0.1:1", "sqlite:///x.db", "run", queued=True)
    words = sweep_command(benchmark.pairs[0], benchmark, BenchmarkOptions(tmp_path, "sqlite:///x.db"), target, False)
    assert words[words.index("--max-concurrent") + 1] == "5"
    assert words[words.index("--trial-resource") + 1] == f"{TRIAL_SLOT}=1"


class _HeldSweep:
    """A stand-in sweep process that runs until the test lets every one end."""

    def __init__(self, release: threading.Event) -> None:
        self.release, self.returncode, self.pid = release, None, 0

    def wait(self, timeout: float | None = None) -> int:
        assert self.release.wait(timeout=120), "the test never let the sweeps end"
        self.returncode = 1
        return 1


@pytest.mark.parametrize("queued, at_once", [(True, 3), (False, 2)])
def test_more_sweeps_than_slots_run_at_once_only_in_a_trial_queue(queued, at_once, tmp_path, monkeypatch):
    """In the queue a running sweep holds a slot only while a trial of its own runs, so `sweeps_at_once` may
    exceed the cap (3 sweeps, 2 slots): one starting up leaves its slot to another's trial. Without a queue each
    running sweep needs a slot of its own, so no more sweeps start than the cap."""
    from raybench.commands import benchmark as bench

    body = {"name": "b", **SMOKE, "max_concurrent_trials": 2, "sweeps_at_once": 3,
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm", "coral", "dann"]}]}
    benchmark = load_benchmark(str(write_yaml(tmp_path / "bench.yaml", body)))
    release, started = threading.Event(), []

    def launch(pair: Pair, command: list[str], log_path: Path) -> bench.Running:
        started.append(pair.sweep)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("raybench: error: a stand-in\n")
        return bench.Running(pair, _HeldSweep(release), time.time(), open(log_path))  # the runner closes it

    monkeypatch.setattr(bench, "launch", launch)
    options = BenchmarkOptions(tmp_path / "runs", "sqlite:///x.db", progress_every_s=0.05)
    target = SweepTarget("127.0.0.1:1", "sqlite:///x.db", "run", queued=queued)
    state = bench.bench_dir(options.storage, benchmark) / bench.STATE_FILE
    state.parent.mkdir(parents=True)
    waiting = threading.Event()  # the runner's progress line: it has started what it may and waits for an end
    runner = bench.PairRunner(benchmark, options, bench.load_records(state, benchmark), target, state,
                              lambda line: waiting.set() if line.startswith("benchmark b:") else None)
    running = threading.Thread(target=runner.run, daemon=True)
    running.start()
    assert waiting.wait(timeout=60)
    assert len(started) == at_once, started
    release.set()
    running.join(timeout=60)
    assert not running.is_alive() and len(started) == 3
    assert benchmark.unqueued_sweeps_at_once * benchmark.trials_per_sweep <= benchmark.max_concurrent_trials


# ----- end to end -------------------------------------------------------------------------------------
def test_a_2x2_benchmark_nests_its_sweeps_records_the_broken_pair_and_attaches_their_comparison(store_uri, tmp_path, ray_head, capsys):
    """On the session's head (`--address`); a benchmark on its own private local Ray: test_signals.py's SIGTERM."""
    body = {"name": "grid", "description": "2 x 2 smoke", **SMOKE, "max_concurrent_trials": 2,
            "grid": [{"datasets": ["digits-shift", "spuco-digits"], "spaces": ["erm", str(broken_erm_space(tmp_path))]}]}
    path = write_yaml(tmp_path / "bench.yaml", body)
    uri = store_uri
    result = run_cli(on_head(["benchmark", str(path), "--storage", str(tmp_path / "runs"), "--tracking-uri", uri,
                              "--progress-every", "5"], ray_head), ray_head.env, tmp_path, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # one pair failed
    assert "3 of 4 pairs finished, 1 failed" in result.stdout
    assert "FAILED erm_broken on spuco-digits (sweep grid-erm_broken-spuco-digits): --set model_weights:" in result.stdout
    assert "pairs 3/4 finished, 1 failed" in result.stdout  # a progress line

    state = json.loads((tmp_path / "runs" / "grid" / "benchmark.json").read_text())["pairs"]
    assert {k: v["status"] for k, v in state.items()} == {
        "grid-erm-digits-shift": "finished", "grid-erm_broken-digits-shift": "finished",
        "grid-erm-spuco-digits": "finished", "grid-erm_broken-spuco-digits": "failed"}
    assert "no-such-weights.pt" in state["grid-erm_broken-spuco-digits"]["reason"]

    client = MlflowClient(tracking_uri=uri)
    [parent] = runs_of(client, "tags.stage = 'benchmark'")
    assert parent.info.status == "FAILED" and parent.data.tags["raybench.state"] == "failed"
    sweeps = runs_of(client, f"tags.`{PARENT_TAG}` = '{parent.info.run_id}'")
    assert sorted(r.data.tags["raybench.sweep"] for r in sweeps) == sorted(k for k, v in state.items() if v["status"] == "finished")
    assert all(r.data.tags["stage"] == "sweep" and len(sweep_runs(client, r.info.run_id)) == 2 for r in sweeps)

    files = {a.path for a in client.list_artifacts(parent.info.run_id, "compare")}
    assert {f"compare/compare.{s}" for s in ("txt", "csv", "json", "md", "tex")} <= files
    assert {"compare/compare-digits-shift.png", "compare/compare-spuco-digits.png"} <= files
    # `compare --stats` beside it: with one replicate a row has no interval and no test, and says so.
    assert {f"compare/compare-stats.{s}" for s in ("txt", "csv", "json", "md", "tex")} <= files
    stats_rows = json.loads((tmp_path / "runs" / "grid" / "compare" / "compare-stats.json").read_text())["rows"]
    assert all("test/acc.ci_low" in r or "test/worst_group_acc.ci_low" in r for r in stats_rows), stats_rows[0].keys()
    assert {r["vs_baseline.verdict"] for r in stats_rows if r["method"] != "erm"} == {"too few replicates to tell"}
    rows = json.loads((tmp_path / "runs" / "grid" / "compare" / "compare.json").read_text())["rows"]
    assert len(rows) == 3
    for row in rows:  # each row is that sweep's own `raybench results`
        own = json.loads(cli(["results", row["sweep"], "--format", "json", "--tracking-uri", uri], capsys).stdout)["replicates"]["summary"]
        cells = [key.removesuffix(".mean") for key in row if key.endswith(".mean")]
        assert cells and all(row[f"{c}.mean"] == own[f"best/{c}"]["mean"] for c in cells)


def _run_intervals(storage: Path, sweep: str) -> list[tuple[float, float]]:
    """Each finished run of a sweep (any stage): from its trainer's start to its last report, by the wall clock."""
    records = [json.loads(p.read_text()) for p in sorted(storage.glob(f"{sweep}-*/completed/*.json"))]
    return [(r["time/trainer_started_at"], r["time/reported_at"]) for r in records]


def _trial_steps_on(head: LocalHead, since: float) -> list[tuple[str, float, float]]:
    """Every step (`train` call) of a Tune trial's actor that the head ran since `since`, from Ray's own task
    records through the state API on the head's dashboard: (actor, start, end), seconds by the wall clock. A
    function trial trains only inside these calls (its training thread waits between reports)."""
    query = ("import json, sys; from ray.util.state import list_tasks; "
             "tasks = list_tasks(address=sys.argv[1], filters=[('type', '=', 'ACTOR_TASK')], detail=True, "
             "limit=10000, raise_on_missing_output=False); "
             "print(json.dumps([[t.name, t.actor_id, t.start_time_ms, t.end_time_ms] for t in tasks]))")
    dashboard = f"http://127.0.0.1:{port_plan(head.env)['DASHBOARD_PORT']}"
    done = subprocess.run([sys.executable, "-c", query, dashboard], env=head.env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    tasks = json.loads(done.stdout.strip().splitlines()[-1])
    steps = [(actor, start / 1000, (end or time.time() * 1000) / 1000) for name, actor, start, end in tasks
             if name.endswith(".train") and start and start / 1000 >= since]
    assert steps, sorted({name for name, *_ in tasks})
    return steps


def _most_at_once(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("cluster", ["private", "address"])
def test_a_benchmarks_sweeps_share_one_trial_queue(cluster, store_uri, tmp_path, request):
    """Cap 2, two sweeps at once, one of which its own check refuses at once: the slot it leaves is the coral
    sweep's to take, which then runs two trials at a time. The static split (one trial a sweep) never would.
    On its private Ray the queue is a custom resource of the node; on a cluster at --address (the session's
    head) a folder of slot files beside benchmark.json."""
    body = {"name": "q", **SMOKE, "max_concurrent_trials": 2, "sweeps_at_once": 2,
            "grid": [{"datasets": ["digits-shift"], "spaces": [str(broken_erm_space(tmp_path, "digits-shift")), "coral"]}],
            "pairs": [{"dataset": "digits-shift", "space": "coral", "trials": 3}]}
    path = write_yaml(tmp_path / "bench.yaml", body)
    runs = tmp_path / "runs"
    args = ["benchmark", str(path), "--storage", str(runs), "--tracking-uri", store_uri, "--progress-every", "5"]
    if cluster == "private":
        env, queue_words = request.getfixturevalue("sweep_env"), f"--trial-resource {TRIAL_SLOT}=1"
    else:
        head = request.getfixturevalue("ray_head")
        args, env, queue_words = on_head(args, head), head.env, f"--trial-slots {runs / 'q' / SLOTS_FOLDER}"
    started = time.time()
    result = run_cli(args, env, tmp_path, timeout=900)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]  # the broken pair
    assert "1 of 2 pairs finished, 1 failed" in result.stdout
    coral_log = (runs / "q" / "logs" / "q-coral-digits-shift.log").read_text()
    assert f"--max-concurrent 2 {queue_words}" in coral_log, coral_log[:2000]
    coral = _run_intervals(runs, "q-coral-digits-shift")
    assert len(coral) == 4 and _most_at_once(coral) == 2, coral
    if cluster == "address":  # and as Ray itself saw it: the trials' steps its head ran, from its task records
        steps = _trial_steps_on(request.getfixturevalue("ray_head"), since=started)
        assert len({actor for actor, _, _ in steps}) >= 2 and _most_at_once([(a, b) for _, a, b in steps]) == 2, steps


def test_a_killed_benchmark_resumes_only_the_pairs_not_finished(store_uri, tmp_path, ray_head):
    """On the session's head (`--address`): the sweeps it starts outlive nothing but their benchmark."""
    body = {"name": "kill", **SMOKE, "max_concurrent_trials": 1,
            "grid": [{"datasets": ["digits-shift"], "spaces": ["erm", "coral"]}]}
    path = write_yaml(tmp_path / "bench.yaml", body)
    uri, runs = store_uri, tmp_path / "runs"
    args = on_head(["benchmark", str(path), "--storage", str(runs), "--tracking-uri", uri, "--progress-every", "5"],
                   ray_head)
    state_file = runs / "kill" / "benchmark.json"
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen([str(BIN / "raybench"), *args], env=ray_head.env, cwd=tmp_path, stdout=log,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while time.time() < deadline and first.poll() is None:  # the event: the first pair's record says finished
            pairs = json.loads(state_file.read_text())["pairs"] if state_file.is_file() else {}
            if pairs.get("kill-erm-digits-shift", {}).get("status") == "finished":
                break
            time.sleep(0.5)
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        sweeps = psutil.Process(first.pid).children()
        first.send_signal(signal.SIGKILL)  # a job killed outright: no chance to record anything
        first.wait(timeout=60)
        _gone, alive = psutil.wait_procs(sweeps, timeout=300)  # the running sweep stops when its benchmark dies
        assert not alive
    finally:
        if first.poll() is None:
            first.kill()
    client = MlflowClient(tracking_uri=uri)
    [erm_sweep] = runs_of(client, "tags.`raybench.sweep` = 'kill-erm-digits-shift'")
    erm_runs = {r.info.run_id for r in sweep_runs(client, erm_sweep.info.run_id)}
    # A pair's sweep is resumed by resuming its benchmark: what `results` and `compare` say of it names that.
    [bench_run] = runs_of(client, "tags.stage = 'benchmark'")
    assert bench_run.data.tags[RESUME_TAG].startswith("raybench benchmark ")
    assert erm_sweep.data.tags[RESUME_TAG] == bench_run.data.tags[RESUME_TAG]
    # Stale: the kill came after the first pair's record, before or after the second's launch was recorded.
    assert json.loads(state_file.read_text())["pairs"]["kill-coral-digits-shift"]["status"] in ("waiting", "running")

    resumed = run_cli([*args, "--resume"], ray_head.env, tmp_path, timeout=900)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "erm on digits-shift: finished earlier (sweep kill-erm-digits-shift); not run again" in resumed.stdout
    assert "coral on digits-shift: started sweep kill-coral-digits-shift" in resumed.stdout
    assert {r.info.run_id for r in sweep_runs(client, erm_sweep.info.run_id)} == erm_runs  # nothing re-ran
    assert len(runs_of(client, "tags.stage = 'benchmark'")) == 1 and len(runs_of(client, "tags.stage = 'sweep'")) == 2
    [coral_sweep] = runs_of(client, "tags.`raybench.sweep` = 'kill-coral-digits-shift'")
    assert coral_sweep.info.status == "FINISHED" and len(sweep_runs(client, coral_sweep.info.run_id)) == 2  # trial, replicate
    erm_log = (runs / "kill" / "logs" / "kill-erm-digits-shift.log").read_text()
    assert erm_log.count("=====") == 1  # launched once, in the first invocation only


def test_a_sweep_refuses_a_parent_run_that_is_not_in_the_store_before_ray_starts(store_uri, tmp_path, sweep_env):
    uri = store_uri
    result = run_cli(["sweep", "erm", "--smoke", "--executor", "function", "--storage", str(tmp_path / "runs"),
                      "--tracking-uri", uri, "--parent-run", "0123456789abcdef0123456789abcdef"], sweep_env, tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.startswith("raybench: error: --parent-run: expected a run id in the MLflow store at ")
    assert not processes_under(sweep_env["RAY_TMPDIR"])  # refused before any Ray process started
    assert runs_of(MlflowClient(tracking_uri=uri), "tags.stage = 'sweep'") == []
