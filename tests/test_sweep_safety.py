"""What a sweep must never do: hang on a request no node can run, retry a deterministic divergence, echo a
credential, choke on a quote in a tracked name, or count a missing number."""
from __future__ import annotations

import json
import math
import socket
import threading
from pathlib import Path

import pytest
import ray
from helpers.cli import cli, on_head, run_cli
from mlflow.tracking import MlflowClient

from raybench.records import TrialRecord
from raybench.report_keys import SCHEMA_VERSION, SELECTION_BLIND, SUMMARY_SCHEMA
from raybench.sweep import outcome
from raybench.tracking import SweepTracker, load_sweep_results, redact_uri

SMOKE = ["--smoke", "--trials", "1", "--replicates", "1"]


def _runs(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("raybench")
    return client.search_runs([experiment.experiment_id], "") if experiment else []


@pytest.mark.parametrize("executor", ["train", "function"])
def test_a_gpu_request_on_a_cpu_cluster_is_refused_before_any_trial(store_uri, executor, tmp_path, ray_head):
    uri = store_uri
    proc = run_cli(on_head(["sweep", "erm", *SMOKE, "--executor", executor, "--gpus-per-worker", "2", "--storage",
                            str(tmp_path / "runs"), "--tracking-uri", uri], ray_head), ray_head.env, tmp_path, timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("raybench: error: cluster: ") and "0 GPU" in line and "2 GPU" in line, line
    assert "--autoscaling" in line
    assert not _runs(uri), "a parent run was created for a sweep that could never run"
    assert not (tmp_path / "runs" / "erm-digits-shift-seed0-smoke-search").exists()


@pytest.fixture
def ray_init_tripwire(monkeypatch) -> threading.Event:
    """ray.init replaced by a tripwire that sets the returned event and fails: Ray's own connection to a dead
    GCS retries for minutes, deaf to SIGTERM, so a command that got as far as ray.init did not fail fast, however
    soon this machine would have let it return."""
    reached = threading.Event()

    def tripped(*args, **kwargs):
        reached.set()
        raise AssertionError("the command reached ray.init")

    monkeypatch.setattr(ray, "init", tripped)
    return reached


def test_a_dead_address_is_refused_in_one_line_before_ray_is_asked(tmp_path, in_private_dirs, monkeypatch,
                                                                    ray_init_tripwire, capsys):
    """An --address nobody listens at (and a node temp dir that is not there) is one line, exit 2, and nothing
    written, decided by raybench's own probe: the sweep never hands the address to ray.init."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "ray-tmp"))  # a private Ray temp dir, should anything look
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = ["sweep", "erm", *SMOKE, "--address", f"127.0.0.1:{port}", "--storage", str(tmp_path / "runs"),
            "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db"]
    proc = cli(args, capsys)
    assert not ray_init_tripwire.is_set(), "the sweep handed a dead address to ray.init"
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"raybench: error: --address: no Ray cluster answers at 127.0.0.1:{port}"), lines
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists(), "refused after writing"

    missing = tmp_path / "no-such-node"  # the node a driver should join, named by a temp dir that is not there
    monkeypatch.setenv("RAYBENCH_NODE_TEMP_DIR", str(missing))
    proc = cli(args, capsys)
    assert not ray_init_tripwire.is_set(), "the sweep handed a dead address to ray.init"
    assert proc.returncode == 2 and proc.stderr.strip() == \
        f"raybench: error: RAYBENCH_NODE_TEMP_DIR={missing} is not a folder; give the temp dir of a running Ray node"
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists(), "refused after writing"


def test_a_divergence_is_recorded_once_not_retried(store_uri, tmp_path, ray_head):
    uri = store_uri
    proc = run_cli(on_head(["sweep", "erm", *SMOKE, "--replicates", "0", "--executor", "function", "--name", "nan",
                            "--storage", str(tmp_path / "runs"), "--tracking-uri", uri, "--set", "lr=10", "--set", "optimizer=sgd",
                            "--set", "weight_decay=1000"], ray_head),  # SGD, lr 10 x decay 1000: overflows
                   ray_head.env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "nan" / "results" / "summary.json").read_text())
    [trial] = summary["trials"]
    assert trial["status"] == "failed" and trial["failure_reason"].startswith("diverged: loss is")
    trial_dirs = [d for d in (tmp_path / "runs" / "nan-search").iterdir() if d.is_dir() and d.name.startswith("function_trial")]
    assert len(trial_dirs) == 1
    assert not list(trial_dirs[0].glob("error*")), "Tune saw an error, so FailureConfig retried the divergence"
    attempts = (trial_dirs[0] / "result.json").read_text().count("diverged")
    assert attempts == 1, f"the diverging trial ran {attempts} times"
    [child] = [r for r in _runs(uri) if r.data.tags.get("stage") == "search"]
    assert child.info.status == "FAILED" and child.data.tags["failure_reason"].startswith("diverged")


def test_credentials_never_appear_in_params_tags_logs_or_console(tmp_path, sweep_env, mlflow_server):
    secret_uri = mlflow_server.replace("http://", "http://alice:s3cr3t-pw@")
    proc = run_cli(["sweep", "erm", *SMOKE, "--executor", "function", "--name", "creds", "--storage",
                    str(tmp_path / "runs"), "--tracking-uri", secret_uri], sweep_env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    console = proc.stdout + proc.stderr
    assert "s3cr3t-pw" not in console and "alice" not in console
    assert "***@127.0.0.1" in proc.stdout
    runs = _runs(mlflow_server)
    assert len(runs) >= 3
    for run in runs:
        for value in [*run.data.params.values(), *run.data.tags.values()]:
            assert "s3cr3t-pw" not in value, (run.info.run_name, value)
    for folder in (tmp_path / "runs", Path(sweep_env["RAY_TMPDIR"])):
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_socket() and path.stat().st_size < 50_000_000:
                assert b"s3cr3t-pw" not in path.read_bytes(), path
    shown = run_cli(["results", "creds", "--tracking-uri", secret_uri], sweep_env, tmp_path)  # a fresh process: MLflow reads credentials from its environment
    assert shown.returncode == 0 and "s3cr3t-pw" not in shown.stdout + shown.stderr


def test_a_name_with_a_quote_round_trips_through_the_tracking_store(store_uri, tmp_path):
    """The CLI refuses such names, but the library tracks any name: filters are quoted, not pasted."""
    uri = store_uri
    tracker = SweepTracker(uri)
    name = "o'brien"
    tracker.start_sweep(name, params={}, tags={})
    summary = {"name": name, "dataset": "digits-shift", "algorithm": "erm", "selection": {"strategy": "best_epoch"},
               "trials": [], "selected": None, "replicates": {"seeds": [], "ok": 0, "runs": [], "summary": {}}}
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps(summary))
    tracker.log_artifacts(folder, "results")
    child = tracker.start_child("k'1", "search-k'1", {}, {"stage": "search"})
    assert tracker.start_child("k'1", "search-k'1", {}, {"stage": "search"}) == child  # found again, not duplicated
    assert tracker.open_child("k'2", "search-k'2", {}, {"stage": "search"})[1] == -1  # a new run has logged nothing
    for epoch in (0, 1):
        tracker.log_metrics(child, {"epoch": float(epoch), "val/acc": 0.5}, step=epoch)
    assert tracker.open_child("k'1", "search-k'1", {}, {"stage": "search"}) == (child, 1)  # a resume skips 0 and 1
    tracker.end_sweep("FINISHED")
    loaded = load_sweep_results(uri, name)
    assert loaded.name == name and loaded.stored.state == "finished"


def record_sweep(uri: str, name: str, summary_text: str, tmp_path) -> None:
    tracker = SweepTracker(uri)
    tracker.start_sweep(name, params={}, tags={"dataset": "digits-shift", "algorithm": "erm"})
    folder = tmp_path / name / "results"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(logged_on(summary_text, tracker.parent_id))
    tracker.log_artifacts(folder, "results")
    tracker.end_sweep("FINISHED")


def logged_on(summary_text: str, run_id: str) -> str:
    """A summary that names its parent run (`mlflow`), re-pointed at the run it is logged on: a sweep's record
    names its own run, and one naming another is read as a copy (damaged)."""
    try:
        data = json.loads(summary_text)
    except ValueError:
        return summary_text
    if not isinstance(data, dict) or not isinstance(data.get("mlflow"), dict):
        return summary_text
    return json.dumps({**data, "mlflow": {**data["mlflow"], "run_id": run_id}})


@pytest.mark.parametrize("damaged", ['{"name": "cut", "dataset": "digits-', "[]", "{}"])
def test_one_damaged_summary_is_named_and_skipped_and_the_other_sweeps_are_read(store_uri, damaged, tmp_path):
    """A summary.json cut in half, or replaced by [] or {}, once broke `results` and `compare` for the whole
    store; now that sweep is one line naming it and the file, and the others read as before."""
    from raybench.report import compare
    from raybench.tracking import DamagedRecord, find_sweeps

    uri = store_uri
    good = {"name": "good", "dataset": "digits-shift", "algorithm": "erm", "selection": {"strategy": "best_epoch"},
            "trials": [], "selected": None, "replicates": {"seeds": [], "ok": 0, "runs": [], "summary": {}}}
    record_sweep(uri, "good", json.dumps(good), tmp_path)
    record_sweep(uri, "broken", damaged, tmp_path)
    records = {r.name: r for r in find_sweeps(uri)}
    assert records["good"].summary is not None and records["good"].damage is None
    broken = records["broken"]
    assert broken.summary is None and broken.damage.startswith("sweep broken: its results/summary.json (run ")
    assert "is damaged: " in broken.damage and broken.damage.endswith("; skipped") and "\n" not in broken.damage
    (unfinished,) = [u for u in compare.from_records(list(records.values())).unfinished if u.name == "broken"]
    assert unfinished.line == broken.damage
    with pytest.raises(DamagedRecord, match="sweep broken: its results/summary.json .* is damaged"):
        load_sweep_results(uri, "broken")
    assert load_sweep_results(uri, "good").name == "good"


# A real summary.json from before `schema_version` existed: the masked-LM sweep of test_ssl_sweeps.py (civilcomments
# fixture, one trial, one replicate), as raybench wrote it on 2026-12-04.
STORED_SUMMARY = Path(__file__).parent / "stored" / "summary_before_schema_version.json"


def test_a_summary_from_before_schema_versions_still_reads_and_a_newer_one_is_named(store_uri, tmp_path, capsys):
    stored_text = STORED_SUMMARY.read_text()
    stored = json.loads(stored_text)
    assert SCHEMA_VERSION not in stored
    record_sweep(store_uri, stored["name"], stored_text, tmp_path)
    record_sweep(store_uri, "future", json.dumps({**stored, "name": "future", SCHEMA_VERSION: SUMMARY_SCHEMA + 1}),
                 tmp_path)

    shown = cli(["results", stored["name"], "--format", "json", "--tracking-uri", store_uri], capsys)
    assert shown.returncode == 0, shown.stderr
    read = json.loads(shown.stdout)
    assert [t["trial_id"] for t in read["trials"]] == [t["trial_id"] for t in stored["trials"]]
    cells = stored["replicates"]["summary"]  # std NaN in the file (one seed), null in results' JSON
    assert {k: (c["mean"], c["n"]) for k, c in read["replicates"]["summary"].items()} == \
        {k: (c["mean"], c["n"]) for k, c in cells.items()} and cells
    compared = json.loads(cli(["compare", "--format", "json", "--tracking-uri", store_uri], capsys).stdout)
    assert [row["sweep"] for row in compared["rows"]] == [stored["name"]]
    (future,) = [u for u in compared["unfinished"] if u["name"] == "future"]
    newer = f"schema version {SUMMARY_SCHEMA + 1}, newer than this raybench"
    assert newer in future["line"], future

    refused = cli(["results", "future", "--tracking-uri", store_uri], capsys)
    assert refused.returncode != 0 and newer in refused.stderr and len(refused.stderr.strip().splitlines()) == 1


def test_redaction_keeps_host_and_drops_userinfo():
    assert redact_uri("http://u:p@host:5000/x") == "http://***@host:5000/x"
    assert redact_uri("sqlite:///tmp/a@b.db") == "sqlite:///tmp/a@b.db"
    assert redact_uri("https://host") == "https://host"


def trial(**stored) -> TrialRecord:
    """A trial as summary.json stores it, with the keys a test names."""
    return TrialRecord.from_json({"trial_id": "t", **stored})


def test_summary_counts_only_the_numbers_it_averages():
    runs = [trial(status="ok", metrics={"a": 0.5}), trial(status="ok", metrics={"a": float("nan")}),
            trial(status="ok", metrics={"a": 0.7}), trial(status="failed", metrics={"a": 0.0})]
    cell = outcome.summarize(runs)["a"]
    assert cell["n"] == 2 and cell["mean"] == pytest.approx(0.6) and cell["std"] == pytest.approx(math.sqrt(0.02))


def test_blind_trials_are_named_in_the_summary():
    ok = trial(status="ok", selection_blind=False, selection_value=0.5)
    blind = trial(status="ok", selection_blind=True)
    assert outcome.blindness([ok, trial(status="ok", selection_value=0.7)]) is None
    assert outcome.blindness([ok, blind]) == f"1 of 2 trials: {SELECTION_BLIND}"
    assert outcome.blindness([blind, blind]) == f"every trial's {SELECTION_BLIND}"


def test_trials_that_all_score_the_same_make_the_search_blind():
    """Each trial's epochs may be well chosen, yet if every trial ties, the search kept the first by order."""
    tied = [trial(status="ok", selection_value=0.0)] * 3 + [trial(status="failed", selection_value=None)]
    assert outcome.blindness(tied) == ("all 3 trials scored the same selection value (0.0000): choosing among them "
                                       "is blind")
    assert outcome.blindness(tied[:1]) is None  # one trial: nothing to choose between
    assert outcome.blindness([*tied, trial(status="ok", selection_value=0.25)]) is None


def test_a_trial_whose_selection_metric_never_moves_is_tagged_blind(store_uri, tmp_path, ray_head):
    """lr 1e-12 on spuco-digits' LeNet-5 (no batch norm, whose running statistics would move even then): the
    weights do not move, so validation worst-group accuracy is the same at every epoch."""
    uri = store_uri
    proc = run_cli(on_head(["sweep", "erm", "--dataset", "spuco-digits", *SMOKE, "--replicates", "0", "--executor",
                            "function", "--name", "still", "--storage", str(tmp_path / "runs"), "--tracking-uri", uri,
                            "--set", "lr=1e-12"], ray_head), ray_head.env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "still" / "results" / "summary.json").read_text())
    [trial] = summary["trials"]
    assert trial["status"] == "ok" and trial["selection_blind"] is True
    assert summary["selection_blind"] == f"every trial's {SELECTION_BLIND}"
    assert f"Selection is blind: every trial's {SELECTION_BLIND}" in proc.stdout
    [child] = [r for r in _runs(uri) if r.data.tags.get("stage") == "search"]
    assert child.data.tags["raybench.selection_blind"] == "selection metric constant: selection is blind"


def test_the_resume_hint_never_repeats_a_password():
    from raybench.cli import resume_command

    hint = resume_command(["sweep", "erm", "--tracking-uri=http://u:pw@h:1", "--tracking-uri", "http://u:pw@h:2"])
    assert "pw" not in hint and hint.endswith("--resume") and "http://***@h:1" in hint and "http://***@h:2" in hint


@pytest.mark.parametrize("reply", [b"", b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"])
def test_an_address_that_accepts_connections_but_is_not_ray_is_one_line_within_the_timeout(reply):
    """Any listening port passed the TCP probe, then ray.init retried for minutes; now the port must answer
    gRPC (as Ray's GCS and client server do) within the probe's timeout."""
    import socket
    import threading
    import time as clock

    from raybench.sweep.errors import ClusterError
    from raybench.sweep.ray_cluster import probe_address

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    stop = threading.Event()

    def answer() -> None:  # accept every connection, say `reply` (or nothing), keep it open
        server.settimeout(0.1)
        held = []
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            if reply:
                conn.sendall(reply)
            held.append(conn)
        for conn in held:
            conn.close()

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        started = clock.monotonic()
        with pytest.raises(ClusterError, match=rf"127.0.0.1:{port} accepts connections but is not a Ray cluster"):
            probe_address(f"127.0.0.1:{port}", timeout_s=1.0)
        assert clock.monotonic() - started < 30  # bounded by the probe, not by Ray's retries
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
