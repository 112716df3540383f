"""Tracking URIs no store can be opened with, and stores that answer but are no MLflow store or are full: each is
one line (exit 2; a full disk exit 74) before anything is written, with no credential in it, never a traceback.

The URI is judged from its text first (raybench.tracking.store.uri_problem: scheme, host, port, SQLite's slashes, the
database driver installed), then by what the store answers on first contact (check_reachable, first_contact).
"""
from __future__ import annotations

import contextlib
import http.server
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers.cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raybench import tracking
from raybench.paths import StorageFull
from raybench.tracking import SweepTracker, TrackingError, check_reachable, reading, redact_uri, store

SECRET = "s3cr3t-pw"


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    """Each test reads from an empty working directory, which must stay empty; no MLflow settings from outside."""
    for variable in ("MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD",
                     "MLFLOW_ALLOW_FILE_STORE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.chdir(tmp_path)


def refused_in_one_line(shown, code: int = 2) -> str:
    """The one line a refused command printed, checked: its exit status, no traceback, no credential."""
    assert shown.returncode == code, (shown.returncode, shown.stderr)
    lines = shown.stderr.strip().splitlines()
    assert len(lines) == 1, shown.stderr
    assert "Traceback" not in shown.stderr and SECRET not in shown.stderr + shown.stdout
    return lines[0]


# ----- the explicit examples ---------------------------------------------------------------------------------
REFUSED = {
    "file:///store": "opens a file store only with MLFLOW_ALLOW_FILE_STORE=true",
    "/some/folder": "a path is no tracking URI; for a SQLite store there: sqlite:////some/folder/mlflow.db",
    "~nosuchuser/mlruns": "a path is no tracking URI",
    "sqlite://relative.db": "a SQLite URI names a file, not a host",
    "sqlite://host/x.db": "a SQLite URI names a file, not a host",
    f"sqlite://u:{SECRET}@host/x.db": "a SQLite URI names a file, not a host",
    "sqlite:x.db": "expected sqlite:// (two slashes after the scheme)",
    "SQLITE:///x.db": "expected the scheme in lower case (sqlite://...)",
    "HTTP://127.0.0.1:5000": "expected the scheme in lower case (http://...)",
    "Https://127.0.0.1:5000": "expected the scheme in lower case (https://...)",
    f"postgresql://u:{SECRET}@localhost/db": "postgresql needs the Python module 'psycopg') is not installed",
    "postgresql+psycopg2://localhost/db": "needs the Python module 'psycopg2') is not installed",
    f"mysql://u:{SECRET}@localhost/db": "mysql needs the Python module 'MySQLdb') is not installed",
    "mysql+pymysql://localhost/db": "needs the Python module 'pymysql') is not installed",
    "mssql://localhost/db": "mssql needs the Python module 'pyodbc') is not installed",
    "postgresql+nosuch://localhost/db": "SQLAlchemy has no database driver 'postgresql+nosuch'",
    f"postgresql://u:p/{SECRET}@h:5432/db": "not installed",  # SQLAlchemy reads p/s3cr3t-pw as the password
    "http+x://127.0.0.1:5000": "a driver (+x) goes only with a database scheme",
    "http://[::1/": "not a valid URI (Invalid IPv6 URL)",
    f"http://u:{SECRET}@[::1/": "not a valid URI (Invalid IPv6 URL)",
    "http://[zz]:5000": "does not appear to be an IPv4 or IPv6 address",
    "http://127.0.0.1:abc": "not a valid URI (Port could not be cast to integer value as 'abc')",
    "http://127.0.0.1:99999": "not a valid URI (Port out of range 0-65535)",
    "http://127.0.0.1:0": "expected a port from 1 to 65535 (not 0)",
    "http://:5000": "expected a server host",
    "http://exa mple.com:5000": "expected a server host without spaces",
    "http://127.0.0.1:5000/\nx": "expected a URI without control characters",
    "foo://bar": "expected a URI with one of the schemes sqlite, postgresql",
}


@pytest.mark.parametrize("uri", REFUSED, ids=list(range(len(REFUSED))))
def test_a_uri_no_store_can_be_opened_with_is_one_line_naming_why(uri, capsys):
    line = refused_in_one_line(cli(["results", "x", "--tracking-uri", uri], capsys))
    assert line.startswith("raybench: error: results: ") and REFUSED[uri] in line, line
    assert redact_uri(uri) in line or "\n" in uri  # the URI as given, its password taken out
    assert list(Path().iterdir()) == []


def test_a_sweep_refuses_such_a_uri_before_it_writes_anything(shared_data_dir, monkeypatch, capsys):
    """The sweep's own check (prepare -> check_uri) is the same one: refused before --storage or a store exists."""
    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    for uri in ("sqlite://relative.db", f"mysql://u:{SECRET}@localhost/db"):
        line = refused_in_one_line(cli(["sweep", "erm", "--smoke", "--tracking-uri", uri], capsys))
        assert line.startswith("raybench: error: --tracking-uri: "), line
        assert list(Path().iterdir()) == []


def test_a_file_store_allowed_by_mlflow_is_opened_and_a_missing_one_is_not_made(monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    line = refused_in_one_line(cli(["results", "x", "--tracking-uri", f"file://{Path.cwd()}/store"], capsys))
    assert "no MLflow store at file://" in line and "does not exist" in line
    assert list(Path().iterdir()) == []  # MLflow's file store would have made the folder
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "maybe")
    assert "$MLFLOW_ALLOW_FILE_STORE: expected true or false" in str(_refusal(f"file://{Path.cwd()}/store"))


def _refusal(uri: str) -> TrackingError:
    with pytest.raises(TrackingError) as raised:
        tracking.check_uri(uri)
    return raised.value


# ----- generated URIs: no traceback, ever -------------------------------------------------------------------
def mostly(sane: list[str], hostile: st.SearchStrategy) -> st.SearchStrategy:
    """A URI part that is sane three times in four: a URI hostile in every part is refused by its scheme alone,
    and never reaches the checks of its host, its port, or what answers there."""
    return st.integers(0, 3).flatmap(lambda roll: hostile if roll == 0 else st.sampled_from(sane))


SCHEMES = mostly(["sqlite", "http", "https", "file", "postgresql"],
                 st.sampled_from(["SQLite", "sqlite+pysqlite", "sqlite+nosuch", "postgresql+psycopg2", "mysql",
                                  "mysql+pymysql", "mssql", "mssql+pyodbc", "HTTP", "FILE", "databricks", "foo", "",
                                  "http+x", "1http"]))
SEPARATORS = mostly(["://", ":///"], st.sampled_from([":/", ":", "", ":////"]))
USERINFO = mostly(["", f"u:{SECRET}@"],  # a password: after `user:`, up to an `@`
                  st.sampled_from([f":{SECRET}@", f"u:{SECRET}/x@", f"u:{SECRET}#@", f"u:a@{SECRET}@",
                                   f"u:{SECRET}?@", f"u:{SECRET}:9@"]))
HOSTS = mostly(["127.0.0.1", "localhost", "[::1]", ""],
               st.one_of(st.sampled_from(["[::1", "::1]", "[zz]", "[]", "a b", "[fe80::1%eth0]", "host\x00",
                                          "h\u00e9.invalid", "[v1.x]", "..", "-"]),
                         st.text(alphabet="[]:@%/.0123456789abcdefxyz", max_size=8).map(lambda text: f"[{text}]")))
PORTS = mostly(["", ":9", ":1"],
               st.one_of(st.sampled_from([":", ":0", ":65535", ":65536", ":99999", ":-1", ":abc", ":1e3", ": 9",
                                          ":9:9", ":\u0669"]),
                         st.integers(-10, 10**6).map(lambda port: f":{port}")))
PATHS = mostly(["", "/", "/x.db", "/sub/x.db"],
               st.sampled_from(["/mlflow.db?mode=ro", "/%zz", "/a@b.db", "/?x#y", "/..", "/:memory:", "/x\ty"]))


@st.composite
def tracking_uris(draw: Callable) -> str:
    """URIs made of parts each hostile in its own way; every host is local, malformed or unresolvable at once, so
    an accepted URI is answered within the test's time (a refused connection, no store there). A password with a
    `/` is written after a separator: run into its scheme (`httpu:pw/x@h`) no reader could tell it from a path."""
    scheme, separator, userinfo = draw(SCHEMES), draw(SEPARATORS), draw(USERINFO)
    if "/" in userinfo and not separator:
        separator = "://"
    return scheme + separator + userinfo + draw(HOSTS) + draw(PORTS) + draw(PATHS)


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(uri=tracking_uris())
def test_a_generated_tracking_uri_is_refused_in_one_line_or_opened(uri, capsys, monkeypatch):
    """`results` on a store that holds no sweep is refused whatever the URI: by its text, by what answers at it,
    or because no sweep (no store) is there. Always one line, exit 2, nothing written, no credential."""
    monkeypatch.setattr(reading, "check_reachable", _quick(check_reachable))  # where `results` looks it up
    line = refused_in_one_line(cli(["results", "x", "--tracking-uri", uri], capsys))
    assert line.startswith("raybench: error: results: "), line
    assert [path.name for path in Path().iterdir()] == [], uri


def _quick(check: Callable[..., None]) -> Callable[..., None]:
    """check_reachable with a short timeout: an accepted local host refuses at once or answers nothing."""
    return lambda uri, timeout_s=5.0: check(uri, timeout_s=0.5)


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(uri=tracking_uris())
def test_redaction_never_shows_the_password_and_never_raises(uri):
    assert SECRET not in redact_uri(uri), uri
    assert SECRET not in store.scrubbed(f"an error about {uri}", uri)


# ----- servers that answer, but are no MLflow -----------------------------------------------------------------
Answer = tuple[int, str, bytes]  # HTTP status, content type, body
HTML_PAGE: Answer = (200, "text/html", b"<html>a web page</html>")
NOT_FOUND: Answer = (404, "text/html", b"<html><h1>404 Not Found</h1></html>")
HEALTHY: Answer = (200, "text/plain", b"OK")
PROBE_OK: Answer = (200, "application/json", json.dumps({"experiment": {
    "experiment_id": "1", "name": "raybench", "lifecycle_stage": "active"}}).encode())


def web_page(path: str) -> Answer:
    return HTML_PAGE


def healthy_but_not_mlflow(path: str) -> Answer:
    return HEALTHY if path == "/health" else NOT_FOUND


def mimics_the_probe_only(path: str) -> Answer:
    """/health and the probe as MLflow answers them, then HTML 404 to every other call (a proxy in front of
    another service, or a server that broke since the check)."""
    return {"/health": HEALTHY, "/api/2.0/mlflow/experiments/get-by-name": PROBE_OK}.get(path, NOT_FOUND)


@contextlib.contextmanager
def serving(answer: Callable[[str], Answer]) -> Iterator[str]:
    """A server on 127.0.0.1 at a free port answering each GET or POST by its path as `answer` says; its base URL,
    with credentials that must never be printed."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, kind, body = answer(self.path.split("?")[0])
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_GET

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://alice:{SECRET}@127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(("answer", "words"), [
    (healthy_but_not_mlflow, "answers /health but its MLflow API answered HTTP 404 with text/html, not MLflow's JSON"),
    (web_page, "answers /health but its MLflow API answered HTTP 200 with text/html, not MLflow's JSON"),
])
def test_a_server_that_is_no_mlflow_is_one_line_naming_it(answer, words, capsys):
    with serving(answer) as uri:
        line = refused_in_one_line(cli(["results", "x", "--tracking-uri", uri], capsys))
        assert words in line and "is --tracking-uri an MLflow tracking server?" in line, line
        assert "***@127.0.0.1" in line
        with pytest.raises(TrackingError, match="answers /health but"):
            check_reachable(uri)
    assert list(Path().iterdir()) == []


def test_a_server_that_fails_after_the_check_is_still_one_line(capsys):
    """MLflow's own error (an HTML body in an MlflowException) on a later call of a reading command."""
    with serving(mimics_the_probe_only) as uri:
        check_reachable(uri)  # it passes the check
        line = refused_in_one_line(cli(["results", "x", "--tracking-uri", uri], capsys))
    assert line.startswith(f"raybench: error: results: the MLflow store at {redact_uri(uri)} failed: "
                           "MlflowException: "), line
    assert "<html>" not in line


def test_a_store_mlflow_cannot_open_is_one_line_on_first_contact(store_uri, capsys):
    """A SQLite store of another MLflow's schema: MLflow refuses it when the client first opens it."""
    with contextlib.closing(sqlite3.connect(store.sqlite_path(store_uri))) as db:
        db.execute("UPDATE alembic_version SET version_num = '0123456789ab'")
        db.commit()
    line = refused_in_one_line(cli(["results", "x", "--tracking-uri", store_uri], capsys))
    assert line.startswith(f"raybench: error: results: cannot open the MLflow store at {store_uri}: MlflowException: "
                           "Detected out-of-date database schema (found version 0123456789ab"), line
    with pytest.raises(TrackingError, match="cannot open the MLflow store at .*out-of-date database schema"):
        SweepTracker(store_uri)


# ----- a new SQLite store on a full disk ----------------------------------------------------------------------
def _remove_if_full(events: list[str]) -> Callable[..., None]:
    def before_cursor_execute(conn, cursor, statement, *args) -> None:
        if statement.lstrip().upper().startswith(("CREATE", "INSERT", "UPDATE", "ALTER")):
            events.append(statement.split()[0])
            raise sqlite3.OperationalError("database or disk is full")
    return before_cursor_execute


@contextlib.contextmanager
def sqlite_is_full() -> Iterator[list[str]]:
    """Every write of every SQLAlchemy engine fails as SQLite does on a full disk (SQLITE_FULL, no errno)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    events: list[str] = []
    listener = _remove_if_full(events)
    event.listen(Engine, "before_cursor_execute", listener)
    try:
        yield events
    finally:
        event.remove(Engine, "before_cursor_execute", listener)


def test_a_new_store_on_a_full_disk_is_storage_full_and_leaves_no_half_made_database(tmp_path):
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    with sqlite_is_full() as events, pytest.raises(StorageFull) as raised:
        SweepTracker(f"sqlite:///{db}")
    assert events, "no write reached SQLAlchemy"
    assert str(raised.value) == (f"--tracking-uri {db.parent}: no space left on device (ENOSPC) while writing the "
                                 f"MLflow store mlflow.db")
    assert list(db.parent.iterdir()) == []  # the schema cut short is not left to refuse the next command


def test_a_write_to_a_full_store_during_a_sweep_is_storage_full(store_uri):
    tracker = SweepTracker(store_uri)
    with sqlite_is_full(), pytest.raises(StorageFull, match="--tracking-uri .*: no space left on device"):
        tracker.start_sweep("full", params={}, tags={})


def test_a_sweep_whose_new_store_fills_the_disk_exits_74_in_one_line(tmp_path, shared_data_dir, monkeypatch,
                                                                     capsys):
    """On a real full file system (a small tmpfs; skipped where none can be mounted): the new store's schema
    does not fit, the sweep ends with exit 74 naming the store's folder, and no database is left behind. Ray's
    start, beside which the store is made, is replaced by nothing: the store is made before any cluster work."""
    from test_storage_full import fill, small_tmpfs

    from raybench.sweep import runner

    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    monkeypatch.setattr(runner.RaySession, "start_beside", lambda self, work: work())
    with small_tmpfs(tmp_path / "disk", 1) as disk:
        fill(disk, leave=48 * 1024)
        shown = cli(["sweep", "erm", "--smoke", "--name", "full", "--storage", str(tmp_path / "runs"),
                     "--tracking-uri", f"sqlite:///{disk}/mlflow.db"], capsys)
        line = refused_in_one_line(shown, code=74)
        assert line.startswith(f"raybench: --tracking-uri {disk}: no space left on device (ENOSPC) while writing "
                               f"the MLflow store mlflow.db"), line
        assert sorted(path.name for path in disk.iterdir()) == ["filler"]


def test_a_trial_run_the_writer_cannot_write_to_a_full_store_ends_the_sweep_as_storage_full(store_uri, tmp_path):
    """The background writer's failure reaches the sweep as the full disk it was (exit 74), not as a
    TrackingError (exit 2): freeing space and resuming is the way on."""
    from raybench.tracking import RunWrite, TrialRunWriter, WriteKind

    tracker = SweepTracker(store_uri)
    parent = tracker.start_sweep("full", params={}, tags={})
    writer = TrialRunWriter.for_stage(store_uri, parent, tmp_path / "journal.jsonl", resuming=False)
    try:
        with sqlite_is_full():
            writer.submit(RunWrite(WriteKind.OPEN, "t1", run_name="search t1", tags={"stage": "search"}))
            with pytest.raises(StorageFull, match="--tracking-uri .*: no space left on device"):
                writer.drain()
    finally:
        TrialRunWriter.close_all()
