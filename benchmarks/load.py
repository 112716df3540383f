"""Load benchmark: hundreds of tiny trials per executor and MLflow store on a two-node local cluster.

Each sweep is then checked in MLflow itself: no trial's record may be lost.

A sweep of hundreds of short trials is bound by bookkeeping, not training: every trial opens, tags, logs
to and closes an MLflow run, and Tune/Ray start and stop it. This script starts one local cluster with
cluster/local-up.sh (a 1-CPU head and one 1-CPU worker node, so two trial slots, and the cluster's MLflow
server), then, for every executor x store, runs `raybench sweep erm --smoke` with `--trials N` trials
(2 epochs of 4 steps each) as a process of its own that joins the cluster. Stores: `http` is the cluster's
MLflow server (SQLite behind HTTP, shared by every sweep of this run); `sqlite` is a fresh SQLite file
the sweep's process writes to directly.

Per executor x store it reports
- wall seconds of the sweep process and trials per minute (finished trials / wall minutes);
- from the sweep's results/summary.json ("tracking": what the sweep's process asked of MLflow): calls,
  calls per trial, seconds spent in them and their share of the sweep's own wall time, calls that failed
  for good, and attempts repeated (by raybench, plus urllib3's HTTP retries);
- the driver's peak memory: the sweep process's maximum RSS (it joins the cluster with --address, so
  this is the driver alone; trial workers live in the cluster's raylets);
- lost records, counted from MLflow: exactly N child runs under the sweep's parent, all FINISHED, N
  distinct trial ids, and every child's `val/acc` history at steps exactly [0, 1] (none missing, none
  logged twice). The script exits 1 when anything was lost or a sweep failed, after printing the table.

With `--baseline CHECKOUT` (a git worktree of the commit before a change) every combination runs twice in a
row, once driven by that checkout's raybench and once by this one's, the order alternating pair by pair: a
change's before and after, measured side by side on one cluster and one tracking server.

The cluster is always stopped with cluster/local-down.sh, on errors and on Ctrl-C too. Its ports are
RAYBENCH_PORT_BASE = --port-base .. +399 (head block and worker-1 block).

    .venv/bin/python benchmarks/load.py [--trials 200] [--executors function,train] [--stores http,sqlite]
        [--baseline CHECKOUT [--repeats N]]
        [--max-concurrent 2] [--port-base 26000] [--work DIR] [--out load.json]

A small check: `--trials 6` takes a few minutes on two cores.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's bin: raybench, ray, mlflow
CLUSTER = REPO / "cluster"
SLOTS = 2  # the head's CPU and the worker node's CPU
EPOCHS = 2  # --smoke trains each trial for 2 epochs: val/acc at steps 0 and 1
# Settings from the caller's shell that would point the cluster or the sweeps elsewhere than planned here.
FOREIGN_ENV = ("RAY_PORT", "DASHBOARD_PORT", "DASHBOARD_METRIC_PORT", "AUTOSCALER_METRIC_PORT", "MLFLOW_PORT",
               "RAY_TEMP_DIR", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "MLFLOW_TRACKING_URI", "RAYBENCH_WORKER_RESOURCES")
STOP_GRACE_S = 60.0  # a sweep told to stop marks its runs KILLED before it exits


class Interrupted(Exception):
    """SIGTERM, turned into an exception so that the `finally` blocks stop the sweep and the cluster."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted(f"signal {signum}")


# ----- child processes ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Exit:
    """How a child process ended: its exit code (negative: killed by that signal; None: timed out), its wall
    seconds and its own peak RSS, read from wait4's rusage (the child alone, not its children)."""

    code: int | None
    wall_s: float
    maxrss_mib: float


def _reap(pid: int, block: bool) -> tuple[int, float] | None:
    """(exit code, peak RSS MiB) once the child has ended; None while it runs (`block=False`)."""
    done, status, usage = os.wait4(pid, 0 if block else os.WNOHANG)
    if done == 0:
        return None
    return os.waitstatus_to_exitcode(status), usage.ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def _wait(pid: int, timeout_s: float | None) -> tuple[int, float] | None:
    """The child's exit once it has ended, or None when `timeout_s` passed first."""
    if timeout_s is None:
        return _reap(pid, block=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (ended := _reap(pid, block=False)) is not None:
            return ended
        time.sleep(0.5)
    return None


def _stop_group(pid: int, grace_s: float) -> tuple[int, float]:
    """SIGINT to the child's process group (what Ctrl-C would send it), then SIGTERM, then SIGKILL, each
    after `grace_s`; returns its exit once reaped. Only called while the child is not yet reaped, so the
    group id is still ours."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if (ended := _reap(pid, block=False)) is not None:
                return ended
            time.sleep(0.2)
    return _reap(pid, block=True)


def run_child(argv: list[str], env: dict[str, str], log: Path, timeout_s: float | None = None,
              grace_s: float = STOP_GRACE_S) -> Exit:
    """Run `argv` in a session of its own (so Ctrl-C reaches only this script, which then stops the child
    in order rather than mid-write), output to `log`; reaped with wait4 to read its peak RSS. On a
    timeout or an interrupt the child's group is stopped before this returns or raises."""
    start = time.perf_counter()
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, env=env, cwd=log.parent, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    code: int | None
    try:
        ended = _wait(proc.pid, timeout_s)
        if ended is None:
            print(f"  {Path(argv[0]).name}: no exit after {timeout_s:.0f} s; stopping it", flush=True)
            code, maxrss = None, _stop_group(proc.pid, grace_s)[1]
        else:
            code, maxrss = ended
    except BaseException:
        print(f"\n  interrupted: stopping {Path(argv[0]).name} (pid {proc.pid})", flush=True)
        proc.returncode = _stop_group(proc.pid, grace_s)[0]
        raise
    proc.returncode = -1 if code is None else code  # reaped here: Popen must not wait for it again
    return Exit(code, time.perf_counter() - start, maxrss)


def tail(path: Path, lines: int = 15) -> str:
    if not path.is_file():
        return ""
    return "\n".join("    " + line for line in path.read_text(errors="replace").splitlines()[-lines:])


# ----- the cluster --------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Cluster:
    """One local-up cluster: its state dir, the environment local-up, local-down and the sweeps share
    (token auth with a private token file), and the two ports the sweeps dial."""

    state: Path
    env: dict[str, str]
    ray_port: int
    mlflow_port: int

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.ray_port}"

    @property
    def mlflow_uri(self) -> str:
        return f"http://127.0.0.1:{self.mlflow_port}"


def cluster_env(work: Path, port_base: int) -> dict[str, str]:
    """The caller's environment less anything that would redirect Ray or MLflow, plus the cluster plan:
    a 1-CPU head, one 1-CPU worker node, and a token file of our own (never ~/.ray)."""
    token = work / "ray_auth_token"
    if not token.exists():
        token.touch(mode=0o600)
        token.write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items()
           if k == "RAYBENCH_DATA_DIR" or (k not in FOREIGN_ENV and not k.startswith("RAYBENCH_"))}
    return {**env, "RAYBENCH_CLUSTER_DIR": str(work / "cluster"), "RAYBENCH_PORT_BASE": str(port_base),
            "RAY_NUM_CPUS": "1", "RAYBENCH_WORKER_NODES": "1", "RAYBENCH_WORKER_CPUS": "1",
            "RAYBENCH_BIN": str(BIN), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1",
            "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}


def port_plan(env: dict[str, str]) -> dict[str, int]:
    plan = subprocess.run([str(CLUSTER / "local-up.sh"), "--print-ports"], env=env, capture_output=True,
                          text=True, timeout=60)
    if plan.returncode != 0:
        raise SystemExit(f"local-up.sh --print-ports refused: {plan.stderr.strip()}")
    return {name: int(port) for name, port in (line.split("=", 1) for line in plan.stdout.split())}


def cluster_up(work: Path, port_base: int) -> Cluster:
    """Start the cluster; raises SystemExit with local-up's last lines if it did not come up (local-up has
    then stopped what it started itself; the caller's local-down is harmless)."""
    env = cluster_env(work, port_base)
    plan = port_plan(env)
    cluster = Cluster(work / "cluster", env, plan["RAY_PORT"], plan["MLFLOW_PORT"])
    log = work / "local-up.log"
    print(f"starting the cluster (ports {port_base}-{port_base + 399}, state {cluster.state}) ...", flush=True)
    # A generous grace: local-up answers SIGINT by running local-down itself, which may take a minute or two.
    ended = run_child([str(CLUSTER / "local-up.sh")], env, log, timeout_s=900, grace_s=240)
    if ended.code != 0:
        raise SystemExit(f"local-up.sh failed (exit {ended.code}); the end of {log}:\n{tail(log)}")
    print(f"cluster up in {ended.wall_s:.0f} s: Ray {cluster.address}, MLflow {cluster.mlflow_uri}", flush=True)
    return cluster


def cluster_down(env: dict[str, str], log: Path) -> bool:
    """local-down.sh for our state dir, waited for even through further Ctrl-Cs: leaving before it ends
    would leave Ray and MLflow running."""
    print("stopping the cluster ...", flush=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen([str(CLUSTER / "local-down.sh")], env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    while True:
        try:
            code = proc.wait()
            break
        except (KeyboardInterrupt, Interrupted):
            print("  still stopping the cluster; waiting for local-down.sh to finish", flush=True)
    print(tail(log, 3) if code == 0 else f"local-down.sh exit {code}; see {log}:\n{tail(log)}", flush=True)
    return code == 0


# ----- one sweep ----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Combo:
    """One row of the table: how trials run (function or train), where they are tracked (http or sqlite), and
    whose code drives the sweep: this checkout's, or --baseline's (before/after a change, in one run)."""

    executor: str
    store: str
    driver: str = "current"

    @property
    def label(self) -> str:
        return f"{self.executor}/{self.store}" + ("" if self.driver == "current" else f"/{self.driver}")


@dataclasses.dataclass(frozen=True)
class Tracking:
    """The sweep's own count of what it asked of MLflow (raybench.tracking.TrackingStats)."""

    calls: int
    seconds: float  # what the sweep waited on the store
    failed: int
    retried: int  # by raybench, after a transient error
    http_retries: int  # by MLflow's HTTP client (urllib3), before raybench sees an error
    background_seconds: float = 0.0  # the trial-run writer's calls, while the sweep went on (absent before it)

    @classmethod
    def from_summary(cls, stats: dict) -> Tracking:
        return cls(int(stats["calls"]), float(stats["seconds"]), int(stats["failed"]), int(stats["retried"]),
                   int(stats["http_retries"]), float(stats.get("background_seconds", 0.0)))

    @property
    def retried_total(self) -> int:
        return self.retried + self.http_retries


@dataclasses.dataclass
class Verification:
    """What MLflow holds for one sweep, against what N finished trials must leave there."""

    expected: int
    parents: int = 0
    children: int = 0
    finished: int = 0
    distinct_trial_ids: int = 0
    bad_histories: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)

    @property
    def lost(self) -> int:
        """Missing, extra, unfinished or duplicated trial runs, plus runs whose val/acc history is wrong."""
        return (abs(self.expected - self.children) + (self.children - self.finished)
                + (self.children - self.distinct_trial_ids) + self.bad_histories)


@dataclasses.dataclass
class Result:
    """One executor x store sweep: what it cost and whether MLflow kept every trial."""

    combo: Combo
    name: str
    tracking_uri: str
    trials: int
    exit_code: int | None
    wall_s: float
    driver_peak_mib: float
    ok: int = 0
    sweep_wall_s: float | None = None
    tracking: Tracking | None = None
    nodes: dict[str, int] = dataclasses.field(default_factory=dict)
    verification: Verification | None = None

    @property
    def trials_per_min(self) -> float:
        return self.ok / (self.wall_s / 60) if self.wall_s > 0 else 0.0

    @property
    def calls_per_trial(self) -> float | None:
        return self.tracking.calls / self.trials if self.tracking else None

    @property
    def tracking_share(self) -> float | None:
        if not self.tracking or not self.sweep_wall_s:
            return None
        return self.tracking.seconds / self.sweep_wall_s

    @property
    def lost(self) -> int:
        return self.verification.lost if self.verification else self.trials

    @property
    def failed(self) -> bool:
        """A failed sweep, a lost record, no summary.json, or anything else the MLflow check found (say, two
        parent runs)."""
        return (self.exit_code != 0 or self.lost > 0 or self.tracking is None
                or self.verification is None or bool(self.verification.problems))


def driver_argv(combo: Combo, baseline: Path | None) -> list[str]:
    """`raybench`, or this venv's Python running the CLI of the --baseline checkout (its package first on the
    path): only the sweep's driver differs, the cluster's workers run this checkout's trainer."""
    if combo.driver == "current":
        return [str(BIN / "raybench")]
    code = f"import sys; sys.path.insert(0, {str(baseline)!r}); from raybench.cli import main; sys.exit(main())"
    return [sys.executable, "-c", code]


def sweep_argv(combo: Combo, trials: int, concurrent: int, cluster: Cluster, uri: str, storage: Path,
               name: str, baseline: Path | None = None) -> list[str]:
    return [*driver_argv(combo, baseline), "sweep", "erm", "--smoke", "--trials", str(trials), "--replicates", "0",
            "--executor", combo.executor, "--max-concurrent", str(concurrent), "--address", cluster.address,
            "--tracking-uri", uri, "--storage", str(storage), "--name", name]


def read_summary(result: Result, path: Path) -> None:
    """Fill in what the sweep's summary.json says: trials finished, on which node, and its tracking counts."""
    if not path.is_file():
        return
    summary = json.loads(path.read_text())
    records = summary.get("trials", [])
    result.ok = sum(t.get("status") == "ok" for t in records)
    result.sweep_wall_s = summary.get("wall_seconds")
    result.tracking = Tracking.from_summary(summary["tracking"]) if summary.get("tracking") else None
    for record in records:
        node = str(record.get("node") or "?")
        result.nodes[node] = result.nodes.get(node, 0) + 1


def run_one(combo: Combo, args: argparse.Namespace, cluster: Cluster, work: Path, stamp: str) -> Result:
    name = f"load-{combo.label.replace('/', '-')}-{stamp}"  # the http store outlives one benchmark run
    uri = cluster.mlflow_uri if combo.store == "http" else f"sqlite:///{work / name}.db"
    argv = sweep_argv(combo, args.trials, args.max_concurrent, cluster, uri, work / "runs", name, args.baseline)
    log = work / f"{name}.log"
    print(f"[{combo.label}] {args.trials} trials -> {uri} (log {log})", flush=True)
    ended = run_child(argv, cluster.env, log, timeout_s=args.timeout or None)
    result = Result(combo, name, uri, args.trials, ended.code, ended.wall_s, ended.maxrss_mib)
    read_summary(result, work / "runs" / name / "results" / "summary.json")
    result.verification = verify(uri, name, args.trials)
    print(f"[{combo.label}] exit {ended.code}, {ended.wall_s:.1f} s, {result.ok} ok, "
          f"{result.lost} lost", flush=True)
    if ended.code != 0:
        print(f"  the end of {log}:\n{tail(log)}", flush=True)
    for problem in result.verification.problems[:10]:
        print(f"  lost: {problem}", flush=True)
    return result


# ----- the check in MLflow ------------------------------------------------------------------------------
def search_all(client: object, experiment_id: str, filter_string: str) -> list:
    """Every run matching the filter, page by page: a single page is capped by the server."""
    runs, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=1000, page_token=token)
        runs += list(page)
        token = page.token
        if not token:
            return runs


def verify(uri: str, name: str, trials: int) -> Verification:
    """Read the sweep back from MLflow, not from the sweep's own report: the point is to catch a record
    the sweep believes it wrote but the store does not hold."""
    from mlflow import MlflowClient

    check = Verification(expected=trials)
    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name("raybench")
        if experiment is None:
            check.problems.append("no 'raybench' experiment in the store")
            return check
        parents = search_all(client, experiment.experiment_id,
                             f"tags.stage = 'sweep' and tags.`raybench.sweep` = '{name}'")
        check.parents = len(parents)
        if len(parents) != 1:
            check.problems.append(f"{len(parents)} parent runs tagged raybench.sweep={name}, expected 1")
        for parent in parents:
            check_children(client, search_all(client, experiment.experiment_id,
                                              f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"), check)
    except Exception as err:  # noqa: BLE001  an unreachable or broken store: report it as the finding, keep the table
        check.problems.append(f"reading MLflow failed: {type(err).__name__}: {err}")
    return check


def check_children(client: object, children: list, check: Verification) -> None:
    """Each trial run: FINISHED, a trial id of its own, and one val/acc value per epoch."""
    check.children += len(children)
    check.finished += sum(run.info.status == "FINISHED" for run in children)
    ids = [run.data.tags.get("trial_id") for run in children]
    check.distinct_trial_ids += len({i for i in ids if i})
    if check.children != check.expected:
        check.problems.append(f"{check.children} child runs, expected {check.expected}")
    for run in children:
        if run.info.status != "FINISHED":
            check.problems.append(f"run {run.info.run_id} (trial {run.data.tags.get('trial_id')}) is {run.info.status}")
        if run.data.tags.get("stage") != "search":
            check.problems.append(f"run {run.info.run_id} has stage {run.data.tags.get('stage')!r}, expected 'search'")
        steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "ood_val/acc"))
        if steps != list(range(EPOCHS)):
            check.bad_histories += 1
            check.problems.append(f"run {run.info.run_id} (trial {run.data.tags.get('trial_id')}): ood_val/acc steps "
                                  f"{steps}, expected {list(range(EPOCHS))}")
    if len(ids) != check.distinct_trial_ids:
        check.problems.append(f"{len(ids)} child runs carry {check.distinct_trial_ids} distinct trial ids")


# ----- report -------------------------------------------------------------------------------------------
HEADER = ("executor", "store", "driver", "trials", "ok", "wall s", "trials/min", "calls/trial", "tracking s",
          "tracking % of wall", "background s", "failed", "retried", "driver peak MiB", "lost")


def table_row(r: Result) -> tuple[str, ...]:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    t = r.tracking
    return (r.combo.executor, r.combo.store, r.combo.driver, str(r.trials), str(r.ok), f"{r.wall_s:.1f}",
            f"{r.trials_per_min:.1f}", num(r.calls_per_trial, ".1f"), num(t and t.seconds, ".1f"),
            num(None if r.tracking_share is None else 100 * r.tracking_share, ".1f"), num(t and t.background_seconds, ".1f"),
            num(t and t.failed, "d"), num(t and t.retried_total, "d"), f"{r.driver_peak_mib:.0f}", str(r.lost))


def print_table(results: list[Result]) -> None:
    rows = [HEADER, *(table_row(r) for r in results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    line = lambda row: "| " + " | ".join(cell.rjust(w) for cell, w in zip(row, widths)) + " |"
    print("\n" + line(HEADER))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows[1:]:
        print(line(row))
    print("\nwall s: the sweep process, start to exit; trials/min: finished trials per wall minute; calls, "
          "tracking s (what the sweep waited on the store), background s (its trial-run writer's calls, made while "
          "the sweep went on), failed, retried: the sweep's own count (summary.json); tracking %: tracking s of "
          "the sweep's own wall_seconds; driver: this checkout or --baseline's; driver peak: the sweep process's max RSS; lost: checked in MLflow.")


def as_json(outcome: Outcome, args: argparse.Namespace) -> dict:
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        "host": {"cpu_count": os.cpu_count(), "python": sys.version.split()[0]},
        "settings": {"trials": args.trials, "executors": args.executors, "stores": args.stores,
                     "max_concurrent": args.max_concurrent, "port_base": args.port_base,
                     "cluster": "head 1 CPU + worker-1 1 CPU"},
        "cluster_start_s": round(outcome.cluster_start_s, 1),
        "interrupted": outcome.interrupted,
        "cluster_stopped": outcome.stopped,
        "results": [{**dataclasses.asdict(r), "trials_per_min": r.trials_per_min, "calls_per_trial": r.calls_per_trial,
                     "tracking_share": r.tracking_share, "lost": r.lost} for r in outcome.results],
    }


# ----- main ---------------------------------------------------------------------------------------------
def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200, help="trials per sweep (default 200)")
    parser.add_argument("--executors", default="function,train", help="comma-separated: function, train")
    parser.add_argument("--stores", default="http,sqlite", help="comma-separated: http (the cluster's MLflow "
                                                                "server), sqlite (a fresh file per sweep)")
    parser.add_argument("--max-concurrent", type=int, default=SLOTS, help=f"trials at once (default {SLOTS}: "
                                                                          "the cluster's slots)")
    parser.add_argument("--port-base", type=int, default=26000, help="the cluster's ports: BASE..BASE+399")
    parser.add_argument("--work", help="folder for the cluster's state, the sweeps and their logs (default: a "
                                       "temporary one, deleted unless something failed)")
    parser.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per sweep before it is stopped "
                                                                        "(0: none)")
    parser.add_argument("--out", help="write every number as JSON here")
    parser.add_argument("--repeats", type=int, default=1, help="with --baseline: pairs of each combination")
    parser.add_argument("--baseline", help="a raybench checkout (say, a git worktree of the commit before a change) "
                                           "whose driver runs every combination too, beside this checkout's")
    args = parser.parse_args()
    combos = [Combo(e, s) for e in args.executors.split(",") for s in args.stores.split(",")]
    if args.baseline:  # each combination twice in a row, the order alternating, so drift hits both alike
        args.baseline = Path(args.baseline).resolve()
        if not (args.baseline / "raybench" / "cli.py").is_file():
            parser.error(f"--baseline: expected a raybench checkout (with raybench/cli.py), got {args.baseline}")
        pairs = [(Combo(c.executor, c.store, "baseline"), c) for c in combos] * args.repeats
        combos = [combo for i, pair in enumerate(pairs) for combo in (pair if i % 2 == 0 else pair[::-1])]
    bad = [c for c in combos if c.executor not in ("function", "train") or c.store not in ("http", "sqlite")]
    if bad or args.trials < 1 or args.max_concurrent < 1:
        parser.error(f"expected executors in function,train, stores in http,sqlite, --trials and --max-concurrent "
                     f">= 1; got {args.executors!r}, {args.stores!r}, {args.trials}, {args.max_concurrent}")
    args.combos = combos
    return args


@dataclasses.dataclass
class Outcome:
    """The whole run: the combinations that ran, the cluster's start-up seconds, whether the run was cut
    short by Ctrl-C or SIGTERM, and whether local-down stopped everything."""

    results: list[Result] = dataclasses.field(default_factory=list)
    cluster_start_s: float = 0.0
    interrupted: bool = False
    stopped: bool = False


def run_all(args: argparse.Namespace, work: Path) -> Outcome:
    """Cluster up, every combination, cluster down (always, also after an interrupt)."""
    stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"
    env = cluster_env(work, args.port_base)
    outcome = Outcome()
    start = time.perf_counter()
    try:
        cluster = cluster_up(work, args.port_base)
        outcome.cluster_start_s = time.perf_counter() - start
        for index, combo in enumerate(args.combos):
            outcome.results.append(run_one(combo, args, cluster, work, f"{stamp}-{index}"))
    except (KeyboardInterrupt, Interrupted):
        outcome.interrupted = True
        print("\ninterrupted; the table below holds the combinations that finished", flush=True)
    finally:
        outcome.stopped = cluster_down(env, work / "local-down.log")
    return outcome


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _on_sigterm)
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # this process reads MLflow too (the check)
    work = Path(args.work).resolve() if args.work else Path(tempfile.mkdtemp(prefix="raybench-load-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work dir: {work}; {os.cpu_count()} CPUs on this host", flush=True)
    outcome = run_all(args, work)
    print_table(outcome.results)
    if args.out:
        Path(args.out).write_text(json.dumps(as_json(outcome, args), indent=2, sort_keys=True))
        print(f"wrote {args.out}")
    failed = [r for r in outcome.results if r.failed]
    for r in failed:
        print(f"FAILED {r.combo.label}: exit {r.exit_code}, {r.lost} lost, "
              f"summary.json {'read' if r.tracking else 'missing'}")
    if not outcome.stopped:
        print(f"local-down.sh did not stop everything; see {work / 'local-down.log'}")
    bad = bool(failed) or not outcome.stopped or outcome.interrupted
    if bad or args.work:
        print(f"kept {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 130 if outcome.interrupted else 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
