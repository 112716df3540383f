"""The client every call to a tracking store goes through: an MlflowClient whose calls are counted and timed
(TrackingStats, PROCESS_STATS) and, where a retry cannot duplicate them, retried after a transient error; a
background client also outlasts a server that is down. What a store answers that is no result ends as one line
(a TrackingError, or StorageFull for a full disk), never MLflow's traceback. And the search every reader and
writer finds its runs with: runs whose tags hold exactly the given values, whatever those values hold.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import math
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from mlflow.tracking import MlflowClient

from raybench.paths import StorageFull, disk_full_error
from raybench.tracking.store import (
    SERVER_SCHEMES,
    TrackingError,
    credentials_to_environment,
    redact_uri,
    scrubbed,
    sqlite_path,
    without_secrets,
)

T = TypeVar("T")

# ----- every call to the store, counted, timed and (when safe) retried ------------------------------------
# Calls a retry cannot duplicate: reads, tag and status writes, and log_batch, whose metrics carry their own
# timestamp and step (the SQL store drops rows it already has). delete_tag, retried after a lost response, is
# refused for a tag already gone, which RunWriter.drop_tag takes as done. create_run is not among them: a retry
# after a lost response would make a second run.
IDEMPOTENT = frozenset({"log_batch", "set_tag", "delete_tag", "set_terminated", "update_run", "search_runs",
                        "get_run", "get_experiment_by_name", "search_experiments", "get_metric_history",
                        "set_experiment_tag"})
RETRIES = 4  # after MLflow's own HTTP retries (MLFLOW_HTTP_REQUEST_MAX_RETRIES) have given up
TRANSIENT = ("database is locked", "database table is locked", "Max retries exceeded", "Connection refused",
             "Connection reset", "Read timed out", "RemoteDisconnected", "error code 429", "error code 500",
             "error code 502", "error code 503", "error code 504")
# urllib3's NewConnectionError: no TCP connection was made, so no byte of the request left. Any call, create_run
# included, is safe to send again; a lost response (a read timeout, a reset after sending) is not.
NEVER_SENT = "Failed to establish a new connection"
# A tracking server that refuses connections (stopped, restarting) is waited for this long by a background
# client (the trial-run writer) before its call fails: a server down for a minute or a few costs a sweep nothing.
OUTAGE_S = 300.0
OUTAGE_BACKOFF_S = 0.5  # its first wait, doubled on each refusal up to OUTAGE_BACKOFF_MAX_S
OUTAGE_BACKOFF_MAX_S = 5.0  # so the writer is back within seconds of the server, not after MLflow's 2-minute backoff
PROBE_IDLE_S = 1.0  # a background call after this long without one first checks that the server takes connections
PROBE_TIMEOUT_S = 5.0


@dataclass
class TrackingStats:
    """What this process asked of the tracking store: calls, calls that failed for good, and attempts repeated,
    by raybench after a transient error or by MLflow's HTTP client (urllib3's retries). `seconds` is what the
    sweep waited on the store (its own calls, and its waits for the trial-run writer to drain);
    `background_seconds` is the writer's own calls, made while the sweep went on (TrialRunWriter)."""

    calls: int = 0
    seconds: float = 0.0
    failed: int = 0
    retried: int = 0
    http_retries: int = 0
    background_seconds: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)

    def since(self, start: TrackingStats) -> TrackingStats:
        return TrackingStats(*(getattr(self, f.name) - getattr(start, f.name) for f in dataclasses.fields(self)))


# Every counted client of this process adds to it. Other modules read it as `client.PROCESS_STATS`, on this
# module, so that a test that gives the process a fresh count (monkeypatching it here) reaches every one of them.
PROCESS_STATS = TrackingStats()


class _HttpRetryCounter(logging.Handler):
    """urllib3 logs each retry of MLflow's HTTP client as "Retrying (Retry(total=...))"."""

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Retrying"):
            PROCESS_STATS.http_retries += 1


logging.getLogger("urllib3.connectionpool").addHandler(_HttpRetryCounter(level=logging.WARNING))


def is_transient(err: Exception) -> bool:
    return any(marker in str(err) for marker in TRANSIENT)


def never_sent(err: Exception) -> bool:
    """Whether the request provably never reached the server (the connection itself failed)."""
    return isinstance(err, ConnectionRefusedError) or NEVER_SENT in str(err)


def server_address(uri: str | None) -> tuple[str, int] | None:
    """(host, port) of an http(s) tracking URI that MLflow reaches directly; None for a local store (no server to
    be down) and for one reached through a proxy (HTTP(S)_PROXY), where the host may refuse what the proxy gets."""
    parts = urllib.parse.urlsplit(uri or "")
    if parts.scheme not in SERVER_SCHEMES or not parts.hostname:
        return None
    if parts.scheme in urllib.request.getproxies() and not urllib.request.proxy_bypass(parts.hostname):
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def refuses_connections(address: tuple[str, int]) -> bool:
    """Whether the server refuses a TCP connection: it is down. A timeout or an unreachable network proves
    nothing (a slow or distant server), and is left to the call and its retries."""
    try:
        with socket.create_connection(address, timeout=PROBE_TIMEOUT_S):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


class OutageWait:
    """One call's wait for a server that refuses connections: a capped backoff, OUTAGE_S in all from the first
    refusal. MLflow's own HTTP client also retries a refused connection, but its backoff doubles to two minutes,
    so after a one-minute outage it could sit idle for another minute; this one looks again every few seconds."""

    def __init__(self) -> None:
        self.started: float | None = None
        self.waits = 0

    def another(self) -> bool:
        """Sleep the next backoff and say True, or say False once OUTAGE_S have passed since the first refusal."""
        now = time.monotonic()
        self.started = now if self.started is None else self.started
        if now - self.started >= OUTAGE_S:
            return False
        time.sleep(min(OUTAGE_BACKOFF_S * 2 ** self.waits, OUTAGE_BACKOFF_MAX_S))
        self.waits += 1
        return True


class CountedClient:
    """An MlflowClient whose every call is counted and timed in PROCESS_STATS; idempotent calls that meet a
    transient error (a locked SQLite file, a refused or dropped connection, a 5xx) are tried again with a
    backoff, so a busy store slows a sweep down instead of losing a trial's record.

    A `background` client (the trial-run writer's, which the sweep does not wait on) also outlasts a server that
    is down: any call whose connection is refused, create_run included (its request never arrived), is tried
    again for up to OUTAGE_S, and a call after an idle spell first waits, the same way, until the server at
    `uri` takes connections, so it never enters MLflow's own slower retries when the server is known to be down."""

    BACKOFF_S = 0.5

    def __init__(self, client: MlflowClient, background: bool = False, uri: str | None = None) -> None:
        self._client, self._background, self._uri = client, background, uri
        self._address = server_address(uri) if background else None
        self._last_call = -math.inf  # when this client's last call ended (time.monotonic)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return self._call(name, attribute, args, kwargs)
            except Exception as err:
                PROCESS_STATS.failed += 1
                full = store_full(self._uri, err)
                if full is not None:
                    raise full from err
                raise
            finally:
                PROCESS_STATS.calls += 1
                if self._background:
                    PROCESS_STATS.background_seconds += time.perf_counter() - start
                else:
                    PROCESS_STATS.seconds += time.perf_counter() - start

        return counted

    def _call(self, name: str, method: Any, args: tuple, kwargs: dict) -> Any:
        outage, attempt = OutageWait(), 0
        while True:
            if self._server_down() and outage.another():
                continue
            try:
                return method(*args, **kwargs)
            except Exception as err:
                if self._background and never_sent(err) and outage.another():
                    PROCESS_STATS.retried += 1
                    continue
                if name not in IDEMPOTENT or attempt == RETRIES or not is_transient(err):
                    raise
                PROCESS_STATS.retried += 1
                time.sleep(self.BACKOFF_S * 2 ** attempt)
                attempt += 1
            finally:
                self._last_call = time.monotonic()

    def _server_down(self) -> bool:
        """Whether a background client's server refuses connections, looked at only after an idle spell: a call
        right after another finds the server as that one did, and a busy writer pays no extra round trip."""
        if self._address is None or time.monotonic() - self._last_call < PROBE_IDLE_S:
            return False
        down = refuses_connections(self._address)
        if not down:
            self._last_call = time.monotonic()
        return down


SQLITE_FULL_WORDS = "database or disk is full"  # SQLite's SQLITE_FULL, which carries no errno


def store_full(uri: str | None, err: BaseException) -> StorageFull | None:
    """The StorageFull (exit 74) for an error of the store at `uri` that is a full disk or quota: SQLite's
    SQLITE_FULL (through SQLAlchemy and MLflow, with no errno), or an OSError ENOSPC/EDQUOT (a local artifact
    written beside the database). None for any other error."""
    path = sqlite_path(uri) if uri else None
    where = Path(without_secrets(str(path.resolve().parent), uri)) if path is not None else None
    what = without_secrets(f"the MLflow store {path.name}", uri) if path is not None else "the MLflow store"
    if _sqlite_full(err):
        return StorageFull(where or Path.cwd(), what, flag="--tracking-uri")
    full = disk_full_error(err)
    if full is None:
        return None
    folder = where or (Path(str(full.filename)).parent if full.filename else Path.cwd())
    return StorageFull(folder, f"{what} ({full.filename})" if full.filename else what, full.errno,
                       flag="--tracking-uri")


def _sqlite_full(err: BaseException) -> bool:
    import sqlite3

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if getattr(current, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or SQLITE_FULL_WORDS in str(current):
            return True
        current = current.__cause__ or current.__context__ or getattr(current, "orig", None)
    return False


def first_contact(uri: str, call: Callable[[], T]) -> T:
    """`call`, the first request to the store at `uri` (MlflowClient opens a SQL store, creating its schema, and
    a server's API answers), with whatever the store answers that is no result as one line: a full disk as
    StorageFull, anything else (a database server that refuses, a schema MLflow cannot migrate, a REST answer
    that is not MLflow's) as a TrackingError naming the store, never MLflow's traceback."""
    try:
        return call()
    except (TrackingError, StorageFull):
        raise
    except Exception as err:
        full = store_full(uri, err)
        if full is not None:
            raise full from err
        raise TrackingError(f"cannot open the MLflow store at {redact_uri(uri)}: {_error_words(err, uri)}") from None


def reads_in_one_line(read: Callable[..., T]) -> Callable[..., T]:
    """A function reading the store at its first argument, whose MLflow, HTTP and database errors (a server that
    stops answering as MLflow, a database that drops the connection) end as one TrackingError naming the store:
    `results`, `compare` and a driver's look at its sweep's record print one line, not MLflow's traceback."""
    @functools.wraps(read)
    def reading(uri: str, *args: Any, **kwargs: Any) -> T:
        from mlflow.exceptions import MlflowException
        from requests.exceptions import RequestException
        from sqlalchemy.exc import SQLAlchemyError

        try:
            return read(uri, *args, **kwargs)
        except (MlflowException, RequestException, SQLAlchemyError) as err:
            full = store_full(uri, err)
            if full is not None:
                raise full from err
            raise TrackingError(f"the MLflow store at {redact_uri(uri)} failed: {_error_words(err, uri)}") from None

    return reading


def _error_words(err: BaseException, uri: str) -> str:
    """An error of MLflow's as a short line: its type, its message up to a response body (a server's HTML page)."""
    text = str(err).split("Response body", 1)[0].rstrip(" .:'\"")
    return f"{type(err).__name__}: {scrubbed(text, uri)}" if text else type(err).__name__


def store_client(uri: str) -> MlflowClient:
    """MLflow's own client of the store at `uri`, the URI's user:password moved into MLflow's environment first
    (credentials_to_environment), so they never travel in a URI the client keeps."""
    return MlflowClient(tracking_uri=credentials_to_environment(uri))


def counted_client(uri: str, background: bool = False) -> CountedClient:
    """A CountedClient of the store at `uri` (see store_client)."""
    return CountedClient(store_client(uri), background, uri)


# ----- runs found by their tags ------------------------------------------------------------------------------
def tag_filter(tags: Mapping[str, str]) -> str:
    """An MLflow filter for runs whose tags hold `tags`. MLflow's grammar has no escapes: a string literal is
    whatever lies between its quotes, and its tokenizer (sqlparse) reads a backslash before a quote as escaping
    it, so `'back\\'` runs on into the next clause. A value is therefore written as a literal (in single, else
    double quotes) only where MLflow's own parser reads the whole filter back to exactly these values; else as a
    LIKE pattern with each character no literal can hold (a quote, a backslash, a control character) as `_`,
    which matches more runs, never fewer: runs_tagged keeps only those whose tags equal `tags`. `%` and `_` in a
    LIKE pattern widen it the same way."""
    literal = " and ".join(_literal_clause(tag, value) or _like_clause(tag, value) for tag, value in tags.items())
    if _reads_back(literal, tags):
        return literal
    return " and ".join(_like_clause(tag, value) if _needs_like(value) else _literal_clause(tag, value) or
                        _like_clause(tag, value) for tag, value in tags.items())


def _literal_clause(tag: str, value: str) -> str | None:
    for quote in ("'", '"'):
        clause = f"tags.`{tag}` = {quote}{value}{quote}"
        if _reads_back(clause, {tag: value}):
            return clause
    return None


def _needs_like(value: str) -> bool:
    return any(c in "'\"\\" or not c.isprintable() for c in value)


def _like_clause(tag: str, value: str) -> str:
    pattern = "".join("_" if c in "'\"\\" or not c.isprintable() else c for c in value)
    return f"tags.`{tag}` LIKE '{pattern}'"


def _reads_back(filter_string: str, tags: Mapping[str, str]) -> bool:
    """Whether MLflow parses `filter_string` into one clause per tag of `tags`: `=` its value, or a LIKE."""
    from mlflow.utils.search_utils import SearchUtils

    try:
        parsed = SearchUtils.parse_search_filter(filter_string)
    except Exception:  # noqa: BLE001  MlflowException and sqlparse's own errors alike: not this filter
        return False
    found = {(c.get("key"), c.get("comparator")): c.get("value") for c in parsed}
    return len(parsed) == len(tags) and all(found.get((tag, "=")) == value or (tag, "LIKE") in found
                                            for tag, value in tags.items())


SEARCH_PAGE = 50000  # MLflow's largest page of search_runs (SEARCH_MAX_RESULTS_THRESHOLD)


def runs_tagged(client: Any, experiment_id: str | list[str], tags: Mapping[str, str], order_by: list[str] | None = None,
                max_results: int = SEARCH_PAGE) -> list[Any]:
    """The runs of the experiment (or experiments) whose tags hold exactly `tags`, in `order_by`'s order, at most
    `max_results`.
    The filter is tag_filter's; a LIKE clause (or a store whose `=` ignores case, as MySQL's may) can match more
    runs than asked, so the runs are compared in Python and, then, a whole page is asked for."""
    filter_string = tag_filter(tags)
    exact = " LIKE '" not in filter_string
    ids = [experiment_id] if isinstance(experiment_id, str) else list(experiment_id)
    if not ids:
        return []
    runs = client.search_runs(ids, filter_string, order_by=order_by,
                              max_results=max_results if exact else SEARCH_PAGE)
    return [run for run in runs if all(run.data.tags.get(tag) == value for tag, value in tags.items())][:max_results]

