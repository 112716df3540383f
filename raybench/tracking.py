"""Everything raybench says to MLflow goes through this module.

One parent run per sweep; one nested child run per trial and per replicate, and under a trial one
nested run per earlier stage of a multi-stage method (reference model, group inference), each found again by a
`raybench.key` tag so a resumed sweep reuses its runs instead of orphaning them. Metrics are sent
with `log_batch` (one request per epoch, not one per key), which matters over HTTP.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import queue
import re
import shlex
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # `raybench results` prints one table, no bars
# MLflow's client prints "View run NAME at: URL" each time it ends a run on a server (in the driver, a benchmark,
# a Ray job's log), a link without ?workflowType=machine_learning that opens MLflow 3's GenAI view; raybench
# prints its own link (ui_link) once. Every process that ends a run imports this module (MLflow is imported
# nowhere else; trial and Train worker processes end none: the sweep's process writes their runs), so this
# reaches all of them. MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT=false brings MLflow's links back.
os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

# A new SQLite store logs its schema creation and migrations at INFO on every first use: not the user's news.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)
# A Databricks URI without credentials logs its SDK's failure, then fails again in the error raybench prints.
logging.getLogger("mlflow.utils.databricks_utils").setLevel(logging.ERROR)

import raybench
from raybench.paths import StorageFull, disk_full_error, writable_dir_problem
from raybench.records import RecordError, StoredRun, SweepSummary, loads_record, summary_numbers_problem
from raybench.records import SweepState as State
from raybench.report_keys import SCHEMA_VERSION, STAGE_WEIGHTS_FACT, SUMMARY_SCHEMA
from raybench.sweep.errors import SweepExists

if TYPE_CHECKING:
    from raybench.newt_suite import SuiteResult, TaskResult

T = TypeVar("T")

EXPERIMENT = "raybench"
PARENT_TAG = "mlflow.parentRunId"
KEY_TAG = "raybench.key"
SWEEP_TAG = "raybench.sweep"
BENCHMARK_TAG = "raybench.benchmark"
EPOCH_METRIC = "epoch"  # every epoch's report carries it, at its own step
STATE_TAG = "raybench.state"  # running, interrupted, finished, failed: what `raybench results` reports
# A sweep's state for its parent run's MLflow status (the state tag, where written, says more: "driver-gone").
SWEEP_STATE_OF_STATUS = {"RUNNING": State.RUNNING, "FINISHED": State.FINISHED, "KILLED": State.INTERRUPTED,
                         "FAILED": State.FAILED}
DRIVER_TAG = "raybench.driver"  # host:pid:start of the process running the sweep, to tell a dead one
RESUME_TAG = "raybench.resume_command"
STORAGE_TAG = "raybench.storage"  # the --storage folder (resolved) whose driver owns the sweep's name
LOCK_TAG = "raybench.lock"  # the sweep lock on --storage its driver holds, and who (host, pid) took it
# MLflow 3's UI opens an experiment of this kind on its runs table (nested trials under the sweep), where an
# untagged one lands on the GenAI traces overview ("No data available").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MODEL_TRAINING_KIND = "custom_model_development"
DESCRIPTION_TAG = "mlflow.note.content"  # the run page's Description panel (Markdown)
DESCRIPTION_LIMIT = 8000  # MLflow's longest run tag value (MAX_TAG_VAL_LENGTH)
MAX_PARAM_LENGTH = 6000
# Tracking-store schemes MLflow ships (a "+driver" suffix is allowed on a database: postgresql+psycopg2://...).
SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks", "file")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")  # opened by MLflow's SQL store through SQLAlchemy
SERVER_SCHEMES = ("http", "https")
_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_AFTER_SCHEME = re.compile(r"[A-Za-z0-9+.-]*:/*")  # also a scheme MLflow has not (a URI it refuses)
# A driver's Python module as pip names its package, for the line that says it is missing.
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary", "MySQLdb": "mysqlclient",
                   "pymysql": "pymysql", "pyodbc": "pyodbc", "pymssql": "pymssql"}
# The MLflow REST call a server must answer as MLflow does, with JSON, before raybench trusts it with a sweep.
API_PROBE = f"/api/2.0/mlflow/experiments/get-by-name?experiment_name={EXPERIMENT}"


class TrackingError(RuntimeError):
    """MLflow is unreachable or a sweep is not where it should be; the message says which and why."""


class SweepClaimed(SweepExists):
    """Another driver holds sweep NAME in the tracking store: it started it from another --storage, or it created
    the sweep's parent run at the same moment as this driver (the earlier run keeps the name)."""


def default_tracking_uri() -> str:
    """A local SQLite store in the working directory (`./mlflow.db`), unless MLFLOW_TRACKING_URI is set. A folder
    whose name holds `%`, `?` or `#` is percent-encoded, as SQLAlchemy decodes the path and ends it at a `?`."""
    path = str(Path("mlflow.db").resolve())
    encoded = urllib.parse.quote(path) if re.search("[%?#]", path) else path
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{encoded}"


def _split_authority(uri: str) -> tuple[str, str, str] | None:
    """(`scheme:` with its slashes, the user:password@, the rest) of `uri`, read as text rather than by urllib,
    which refuses a malformed host (`http://[::1/`) that must still be shown without its password. Cut
    conservatively, to the furthest `@` that can end one: a password may hold a raw `@`, and SQLAlchemy reads
    `/`, `?` and `#` in one (postgresql://u:p/w@host/db). Only an `@` after a `/` and no `:` is a path's
    (sqlite:///tmp/a@b.db, http://host/page@2), so a URI is at worst shown with less than it holds, never with
    its password. None when it holds no user:password@."""
    found = _AFTER_SCHEME.match(uri)
    if found is None or "@" not in uri[found.end():]:
        return None
    head, rest = uri[: found.end()], uri[found.end():]
    for at in reversed([i for i, c in enumerate(rest) if c == "@"]):  # the furthest `@` that ends a userinfo
        if ":" in rest[:at] or "/" not in rest[:at]:
            return head, rest[: at + 1], rest[at + 1:]
    return None


def redact_uri(uri: str | None) -> str | None:
    """`uri` with any user:password replaced by ***, for everything that is shown or logged; never raises, so a
    malformed URI is shown (redacted) in the line that refuses it."""
    if not uri or not isinstance(uri, str):
        return uri
    split = _split_authority(uri)
    return uri if split is None else f"{split[0]}***@{split[2]}"


def without_credentials(uri: str) -> str:
    """`uri` with its user:password removed; MLflow then reads them from MLFLOW_TRACKING_USERNAME/PASSWORD,
    so they never travel in a URI that Tune pickles into its experiment state or a log line prints."""
    try:
        parts = urllib.parse.urlsplit(uri)
        if parts.username is None and parts.password is None:
            return uri
    except ValueError:  # a malformed host: cut as redact_uri does
        split = _split_authority(uri)
        return uri if split is None else split[0] + split[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def credentials_to_environment(uri: str) -> str:
    """Move an http(s) URI's user:password into MLflow's own environment variables; returns the bare URI."""
    try:
        parts = urllib.parse.urlsplit(uri)
        username, password = parts.username, parts.password
    except ValueError:  # check_uri refuses it before any client is made; nothing to move
        return uri
    if parts.scheme in SERVER_SCHEMES and username is not None:
        os.environ["MLFLOW_TRACKING_USERNAME"] = urllib.parse.unquote(username)
        os.environ["MLFLOW_TRACKING_PASSWORD"] = urllib.parse.unquote(password or "")
        return without_credentials(uri)
    return uri


def without_secrets(text: str, uri: str) -> str:
    """`text` with the credentials of `uri` taken out, wherever they stand: the URI itself, or a path read from it
    (sqlite:///u:pw@host names the file `u:pw@host`) that a message shows."""
    split = _split_authority(uri)
    secrets = {uri: redact_uri(uri) or ""}
    if split is not None:
        userinfo = split[1][:-1]
        password = userinfo.partition(":")[2]
        as_urllib = re.split(r"[/?#@]", password, maxsplit=1)[0]  # the password, or port, urllib reads there
        for secret in (userinfo, urllib.parse.unquote(userinfo), password, urllib.parse.unquote(password), as_urllib):
            if len(secret) >= 4 or secret == userinfo:  # a shorter password is only taken out within its userinfo
                secrets.setdefault(secret, "***")
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, secrets[secret])
    return text


def _scrubbed(text: str, uri: str) -> str:
    """An error's text on one line, short, without the URI's credentials (a driver's or MLflow's message may
    repeat the URI it was given, or its user:password)."""
    line = " ".join(without_secrets(text, uri).split())
    return line if len(line) <= 300 else line[:300] + "..."


def uri_problem(uri: str) -> str | None:
    """Why MLflow cannot open the tracking URI `uri`, judged from its text and what is installed here, before
    any connection: a scheme MLflow has no store for, one in capitals (SQLAlchemy and MLflow's REST store read
    only lower case), a malformed host or port, a SQLite URI naming a host, a database driver that is not
    installed, a file store this MLflow refuses. None when it is worth opening."""
    if not isinstance(uri, str) or not uri.strip():
        return "expected a tracking URI, got nothing"
    if not uri.isprintable():
        return "expected a URI without control characters (line breaks, tabs)"
    found = _SCHEME.match(uri)
    scheme = found.group(1) if found else ""
    base, plus, driver = scheme.lower().partition("+")
    if base not in SCHEMES:
        return _no_scheme_problem(uri, scheme)
    if not uri[len(scheme) + 1:].startswith("//"):
        return f"expected {scheme.lower()}:// (two slashes after the scheme)"
    if scheme != scheme.lower():
        return f"expected the scheme in lower case ({scheme.lower()}://...), as MLflow reads it"
    if plus and base not in DATABASE_SCHEMES:
        return f"a driver (+{driver}) goes only with a database scheme ({', '.join(DATABASE_SCHEMES)})"
    if base in DATABASE_SCHEMES:
        return _database_problem(uri, base)
    try:
        parts = urllib.parse.urlsplit(uri)
        port = parts.port
    except ValueError as err:  # a malformed IPv6 host ("[::1", "[zz]"), a port that is no number or out of range
        return f"not a valid URI ({err})"
    if base in SERVER_SCHEMES:
        return _server_problem(parts, port)
    if base == "file":
        return _file_store_problem(parts)
    return None


def _no_scheme_problem(uri: str, scheme: str) -> str:
    expected = f"expected a URI with one of the schemes {', '.join(SCHEMES)}"
    if scheme or not (uri.startswith(("/", ".", "~")) or "/" in uri or Path(uri).exists()):
        return expected
    try:  # a plain path: a folder (where a file store would be) or a database file
        path = Path(uri).expanduser().resolve()
        store = path / "mlflow.db" if path.is_dir() or not path.suffix else path
    except (OSError, RuntimeError, ValueError):  # ~nosuchuser, a loop of links
        return f"{expected} (a path is no tracking URI)"
    return f"{expected} (a path is no tracking URI; for a SQLite store there: sqlite:///{store})"


def _server_problem(parts: urllib.parse.SplitResult, port: int | None) -> str | None:
    if not parts.hostname:
        return "expected a server host (http://HOST:PORT)"
    if any(c.isspace() for c in parts.netloc):
        return "expected a server host without spaces"
    if port is not None and not 1 <= port <= 65535:
        return f"expected a port from 1 to 65535 (not {port})"
    return None


def _file_store_problem(parts: urllib.parse.SplitResult) -> str | None:
    from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

    try:
        allowed = MLFLOW_ALLOW_FILE_STORE.get()
    except ValueError:
        return f"$MLFLOW_ALLOW_FILE_STORE: expected true or false, got {os.environ.get('MLFLOW_ALLOW_FILE_STORE')!r}"
    if not allowed:
        import mlflow

        return (f"MLflow {mlflow.__version__} opens a file store only with MLFLOW_ALLOW_FILE_STORE=true; use a "
                f"database, for example sqlite:///mlflow.db (`mlflow migrate-filestore` copies a file store into one)")
    if parts.netloc not in ("", "localhost"):
        return f"expected a local folder (file:///PATH), not one on the host {parts.netloc!r}"
    return None


def _database_problem(uri: str, base: str) -> str | None:
    """What SQLAlchemy, which MLflow's SQL store opens the URI with, makes of it: a URL it can parse, a dialect
    it has, and the dialect's driver module importable here (MLflow would fail on its import, in a traceback)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        url = make_url(uri)
    except (ArgumentError, ValueError) as err:  # also a port that is no number
        return f"not a database URL SQLAlchemy can read ({_scrubbed(str(err), uri)})"
    if base == "sqlite" and (url.host or url.port or url.username or url.password):
        return ("a SQLite URI names a file, not a host: sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db "
                "(three slashes before a relative path, four before an absolute one)")
    try:
        dialect = url.get_dialect()
    except NoSuchModuleError:
        return f"SQLAlchemy has no database driver {url.drivername!r}"
    try:
        dialect.import_dbapi()
    except ImportError as err:
        module = getattr(err, "name", None) or str(err)
        package = DRIVER_PACKAGES.get(module, module)
        return (f"its database driver ({url.drivername} needs the Python module {module!r}) is not installed; "
                f"install it (pip install {package}) or pass another --tracking-uri")
    return None


def uri_scheme(uri: str) -> str:
    """The store kind a URI names, its scheme without a +driver (`postgresql` of postgresql+psycopg2://...), in
    lower case; "" for none."""
    found = _SCHEME.match(uri or "")
    return found.group(1).partition("+")[0].lower() if found else ""


def sqlite_path(uri: str) -> Path | None:
    """The database file a SQLite tracking URI opens, as SQLAlchemy reads it (percent-decoded, up to a `?`);
    None for another scheme, an in-memory database, or a URI SQLAlchemy cannot read."""
    if uri_scheme(uri) != "sqlite":
        return None
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        database = make_url(uri).database
    except (ArgumentError, ValueError):
        return None
    return None if database in (None, "", ":memory:") else Path(database)


def refuse_bad_uri(uri: str) -> None:
    """A TrackingError for a URI no store can be opened with (uri_problem), the URI shown without credentials."""
    problem = uri_problem(uri)
    if problem:
        raise TrackingError(without_secrets(f"{problem}, got {redact_uri(uri)!r}", uri))


def check_uri(uri: str) -> None:
    """A tracking URI MLflow can open and, for SQLite, a database file raybench can create: checked before
    anything is written, so a typo is one line instead of a traceback after Ray has started."""
    refuse_bad_uri(uri)
    path = sqlite_path(uri)
    if path is not None:
        problem = None if path.is_file() else writable_dir_problem(path.parent)
        if path.exists() and not path.is_file():
            problem = f"{str(path)!r} is not a file"
        if problem is None and path.is_file():  # a damaged store: one line now, not SQLAlchemy's traceback later
            problem = sqlite_damage(path)
        if problem:
            raise TrackingError(without_secrets(f"cannot use the SQLite database {str(path)!r}: {problem}", uri))


def _server_request(uri: str, path: str) -> urllib.request.Request:
    """GET <server><path>, with user:password from the URI sent as HTTP basic auth (urllib ignores it)."""
    parts = urllib.parse.urlsplit(uri)
    request = urllib.request.Request(without_credentials(uri).rstrip("/") + path)
    if parts.username is not None:
        pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
        request.add_header("Authorization", "Basic " + base64.b64encode(pair.encode()).decode())
    return request


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, before any training, when an HTTP tracking server does not answer its health check, or answers
    it but is no MLflow server (its API answers something other than MLflow's JSON)."""
    check_uri(uri)
    if uri_scheme(uri) not in SERVER_SCHEMES:
        return
    shown = redact_uri(uri)
    status, _, _ = _get(uri, "/health", timeout_s)
    if status != 200:
        raise TrackingError(f"MLflow server at {shown} answered /health with HTTP {status}")
    problem = _api_problem(*_get(uri, API_PROBE, timeout_s))
    if problem:
        raise TrackingError(f"the server at {shown} answers /health but {problem}; is --tracking-uri an MLflow "
                            f"tracking server?")


def _get(uri: str, path: str, timeout_s: float) -> tuple[int, str, bytes]:
    """(HTTP status, content type, the first 64 KiB of the body) of GET <server><path>; a TrackingError when no
    answer comes (refused, timed out, a name that does not resolve, a URL urllib cannot send)."""
    try:
        with urllib.request.urlopen(_server_request(uri, path), timeout=timeout_s) as response:
            return response.status, response.headers.get_content_type(), response.read(65536)
    except urllib.error.HTTPError as err:
        with contextlib.closing(err):
            return err.code, err.headers.get_content_type() if err.headers else "", err.read(65536)
    except (urllib.error.URLError, OSError, ValueError) as err:  # ValueError: http.client.InvalidURL, IDNA errors
        reason = _scrubbed(str(getattr(err, "reason", err)), uri)
        raise TrackingError(f"MLflow server at {redact_uri(uri)} is unreachable ({reason}); start it or pass "
                            f"another --tracking-uri") from None


def _api_problem(status: int, content_type: str, body: bytes) -> str | None:
    """Why an answer to API_PROBE is not an MLflow server's: MLflow answers with JSON, the experiment (200) or
    RESOURCE_DOES_NOT_EXIST (404). None for such an answer."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return f"its MLflow API answered HTTP {status} with {content_type or 'no content type'}, not MLflow's JSON"
    if status == 200 and isinstance(data.get("experiment"), dict):
        return None
    code = data.get("error_code")
    if status == 404 and code == "RESOURCE_DOES_NOT_EXIST":
        return None
    if code is None:
        return f"its MLflow API answered HTTP {status} with JSON that is not MLflow's"
    words = " ".join(str(data.get("message", "")).split())[:200]
    return f"its MLflow API refused raybench with HTTP {status} ({code}{': ' + words if words else ''})"


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


def runs_tagged(client: Any, experiment_id: str, tags: Mapping[str, str], order_by: list[str] | None = None,
                max_results: int = SEARCH_PAGE) -> list[Any]:
    """The runs of the experiment whose tags hold exactly `tags`, in `order_by`'s order, at most `max_results`.
    The filter is tag_filter's; a LIKE clause (or a store whose `=` ignores case, as MySQL's may) can match more
    runs than asked, so the runs are compared in Python and, then, a whole page is asked for."""
    filter_string = tag_filter(tags)
    exact = " LIKE '" not in filter_string
    runs = client.search_runs([experiment_id], filter_string, order_by=order_by,
                              max_results=max_results if exact else SEARCH_PAGE)
    return [run for run in runs if all(run.data.tags.get(tag) == value for tag, value in tags.items())][:max_results]


def driver_identity() -> str:
    """host:pid:start-time of this process, so a later reader can tell whether the sweep's driver still lives."""
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def _process_start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "?"


def driver_alive(identity: str | None) -> bool | None:
    """Whether the process named by `driver_identity()` still runs; None when it ran on another host."""
    if not identity or identity.count(":") < 2:
        return None
    host, pid, start = identity.rsplit(":", 2)
    if host != socket.gethostname():
        return None
    return pid.isdigit() and _process_start(int(pid)) == start


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def base_tags(dataset: str, algorithm: str) -> dict[str, str]:
    tags = {"dataset": dataset, "algorithm": algorithm, "raybench_version": raybench.__version__}
    commit = git_commit()
    if commit:
        tags["git_commit"] = commit
    return tags


UI_PORT = 5000  # where the printed `mlflow ui` command serves, MLflow's own default port
# MLflow's job runner (a process and about eight Huey consumers, each importing MLflow) serves its GenAI
# scorers, which raybench never submits; `mlflow ui` (an alias of `mlflow server`) starts it unless this is false.
NO_JOB_RUNNER = "MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false"


def ui_command(uri: str, port: int = UI_PORT, program: str = "mlflow") -> str:
    """The shell command (POSIX words, the URI quoted where it must be) that serves an MLflow UI over the store
    `uri` at http://127.0.0.1:PORT, quick to answer on a small machine: one uvicorn worker (MLflow's default is
    four) and no job runner. What every printed hint and the docs say; `program` is how the docs call MLflow."""
    return (f"{NO_JOB_RUNNER} {program} ui --backend-store-uri {shlex.quote(uri)} --host 127.0.0.1 --port {port} "
            f"--workers 1")


def ui_link(server: str, experiment_id: str | None = None, run_id: str | None = None) -> str:
    """The MLflow UI page of a run (or of the experiment's runs, or the list of experiments) in the model-training
    view: MLflow 3's UI otherwise opens in its GenAI view, on traces this experiment does not have."""
    page = "#/experiments" + (f"/{experiment_id}" if experiment_id else "") + (f"/runs/{run_id}" if run_id else "")
    return f"{server.rstrip('/')}/{page}?workflowType=machine_learning"


def run_description(markdown: str, limit: int = DESCRIPTION_LIMIT) -> str:
    """`markdown` as a run description: whole when it fits MLflow's tag limit, else cut at a line end with a
    pointer to the full text (the summary artifact), so the selected config and the table always show."""
    if len(markdown) <= limit:
        return markdown
    tail = "\n\n(cut here to fit MLflow's description limit; the whole summary is the artifact summary.md)\n"
    cut = markdown.rfind("\n", 0, limit - len(tail))
    return markdown[:max(cut, 0)] + tail


def flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """MLflow params from nested values: `a.b.c` keys, each value as text cut to MAX_PARAM_LENGTH
    characters (a longer one, such as a long --set value, is stored truncated: the store refuses it whole)."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = str(value)[:MAX_PARAM_LENGTH]
    return flat


# ----- every call to the store, counted, timed and (when safe) retried ------------------------------------
# Calls a retry cannot duplicate: reads, tag and status writes, and log_batch, whose metrics carry their own
# timestamp and step (the SQL store drops rows it already has). create_run is not among them: a retry
# after a lost response would make a second run.
IDEMPOTENT = frozenset({"log_batch", "set_tag", "set_terminated", "update_run", "search_runs", "get_run",
                        "get_experiment_by_name", "get_metric_history", "set_experiment_tag"})
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


PROCESS_STATS = TrackingStats()  # every counted client of this process adds to it


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
    if parts.scheme not in ("http", "https") or not parts.hostname:
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
    return f"{type(err).__name__}: {_scrubbed(text, uri)}" if text else type(err).__name__


def numeric_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The finite numbers among a result's values (Tune adds strings, bools and bookkeeping)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[key] = float(value)
    return out


class SweepTracker:
    """A sweep's view of MLflow: its parent run, its child runs and its artifacts."""

    def __init__(self, uri: str, experiment: str = EXPERIMENT, background: bool = False) -> None:
        """A foreground tracker checks the store at once, so a sweep fails fast before any training. A
        `background` one (the trial-run writer's, made when a stage's first trial starts) asks nothing of the
        store until its first write, in the writer's thread, which waits out a server that is down."""
        if not background:
            check_reachable(uri)
        self.uri = credentials_to_environment(uri)
        self._experiment_name = experiment
        self.parent_id: str | None = None
        if background:
            self.client = CountedClient(MlflowClient(tracking_uri=self.uri), background, self.uri)
            self._experiment_id: str | None = None
            return
        new_file = sqlite_path(self.uri) if is_new_sqlite_store(self.uri) else None
        try:
            self.client = first_contact(uri, lambda: CountedClient(MlflowClient(tracking_uri=self.uri), False, self.uri))
            self._experiment_id = first_contact(uri, lambda: self._experiment(experiment))
        except StorageFull:
            if new_file is not None:  # a schema cut off half way would refuse every later command: not kept
                _remove_sqlite_file(new_file)
            raise

    @property
    def experiment_id(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self._experiment(self._experiment_name)
        return self._experiment_id

    @experiment_id.setter
    def experiment_id(self, value: str) -> None:
        self._experiment_id = value

    def _experiment(self, name: str) -> str:
        """The experiment's id, created as a model-training experiment (or marked one, if an older raybench
        made it), so that the MLflow UI opens on its runs."""
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            if EXPERIMENT_KIND_TAG not in found.tags:
                self.client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, MODEL_TRAINING_KIND)
            return found.experiment_id
        location = None
        database = sqlite_path(self.uri)
        if database is not None:  # keep artifacts next to the database, not in the cwd of whoever reads
            location = (database.parent / "mlartifacts").resolve().as_uri()
        return self.client.create_experiment(name, artifact_location=location,
                                             tags={EXPERIMENT_KIND_TAG: MODEL_TRAINING_KIND})

    def _find(self, tags: Mapping[str, str]) -> Any | None:
        """The latest run whose tags hold `tags` exactly."""
        runs = runs_tagged(self.client, self.experiment_id, tags, order_by=["attributes.start_time DESC"], max_results=1)
        return runs[0] if runs else None

    # ----- the sweep's parent run ------------------------------------------------------------------
    def start_sweep(self, name: str, params: Mapping[str, Any], tags: Mapping[str, str],
                    parent_run: str | None = None, storage: Path | None = None, resuming: bool = True) -> str:
        """The sweep's parent run, reused when resuming; nested under `parent_run` (a benchmark's) if given.

        With `storage`, the name belongs to that --storage: the run records it (STORAGE_TAG), and a parent of
        another storage is never taken over (SweepClaimed). A new sweep (not `resuming`) never takes over an
        existing parent at all: one found now was made by another driver since this one looked. Two drivers
        that create a parent for one name at once each look again after creating theirs; the earlier parent
        (by start time, then run id) keeps the name, and the other driver deletes its own before any child run."""
        existing = self._find({SWEEP_TAG: name, "stage": "sweep"})
        nesting = {PARENT_TAG: parent_run} if parent_run else {}
        owner = {STORAGE_TAG: str(storage)} if storage is not None else {}
        if existing is not None:
            if storage is not None:
                self._check_owner(name, existing, storage, resuming)
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
            self._tag(self.parent_id, {**nesting, **owner})
        else:
            run = self.client.create_run(self.experiment_id, run_name=name,
                                         tags={**tags, **nesting, **owner, SWEEP_TAG: name, "stage": "sweep"})
            self.parent_id = run.info.run_id
            if storage is not None:
                self._hold_name(name, run)
            self._log(self.parent_id, params=flatten(params))
        self._tag(self.parent_id, {STATE_TAG: State.RUNNING.value, DRIVER_TAG: driver_identity(),
                                   **{k: v for k, v in tags.items() if k == RESUME_TAG}})
        return self.parent_id

    def _check_owner(self, name: str, existing: Any, storage: Path, resuming: bool) -> None:
        """Refuse an existing parent this driver may not take over: any, for a new sweep (another driver made it
        since this one looked), or one whose storage is not this driver's."""
        if not resuming:
            raise SweepClaimed(f"--name: sweep {name!r} was just started by another driver (its parent run "
                               f"{existing.info.run_id}, storage {existing.data.tags.get(STORAGE_TAG, '(not recorded)')})"
                               f"; pass --resume with that --storage to continue it, or another --name")
        problem = storage_problem(name, existing.data.tags.get(STORAGE_TAG), storage)
        if problem is not None:
            raise SweepClaimed(problem)

    def _hold_name(self, name: str, mine: Any) -> None:
        """The election after creating a parent: the earliest parent of `name` keeps it. Each of two drivers that
        created one at once sees at least the earlier one when it looks (it was made first), so exactly one goes on,
        where the drivers' clocks agree to better than the time between their creates (start times are theirs)."""
        parents = runs_tagged(self.client, self.experiment_id, {SWEEP_TAG: name, "stage": "sweep"},
                              order_by=["attributes.start_time ASC"])
        first = min(parents + [mine], key=lambda run: (run.info.start_time, run.info.run_id))
        if first.info.run_id == mine.info.run_id:
            return
        self.client.delete_run(mine.info.run_id)
        self.parent_id = None
        raise SweepClaimed(f"--name: sweep {name!r} was started by another driver at the same moment (its parent "
                           f"run {first.info.run_id}, storage {first.data.tags.get(STORAGE_TAG, '(not recorded)')}); "
                           f"this driver stopped before running anything: pass another --name, or --resume with that "
                           f"--storage once it has ended")

    def check_parent_run(self, run_id: str) -> str | None:
        """A parent run must exist in this store's experiment: a mistyped id would nest the sweep under nothing.
        Returns the parent's resume command when the parent is a benchmark's run (a sweep nested in a benchmark
        is resumed by resuming the benchmark), else None."""
        try:
            run = self.client.get_run(run_id)
        except Exception:  # noqa: BLE001  MLflow raises several types for an unknown or malformed id
            raise TrackingError(f"expected a run id in the MLflow store at {redact_uri(self.uri)}, got {run_id!r}") from None
        if run.info.experiment_id != self.experiment_id:
            raise TrackingError(f"expected a run of the raybench experiment, got {run_id!r} (in experiment "
                                f"{run.info.experiment_id})")
        return run.data.tags.get(RESUME_TAG) if run.data.tags.get("stage") == "benchmark" else None

    def end_sweep(self, status: str, note: str | None = None) -> None:
        """Close the parent run; an interrupted sweep (KILLED) also closes every child still RUNNING, so no
        run claims to be alive after its driver has gone. The stage's trial-run writers are drained first (their
        error, if any, already ended the sweep and is its note) and stopped."""
        assert self.parent_id is not None
        TrialRunWriter.close_all()
        if note:
            self.client.set_tag(self.parent_id, "failure_reason", note[:5000])
        state = SWEEP_STATE_OF_STATUS.get(status, State.FAILED)
        self.client.set_tag(self.parent_id, STATE_TAG, state.value)
        if status != "FINISHED":
            for run in self.children(nested=True):
                if run.info.status == "RUNNING":
                    self.client.set_terminated(run.info.run_id, status="KILLED")
        self.client.set_terminated(self.parent_id, status=status)

    def _tag(self, run_id: str, tags: Mapping[str, str]) -> None:
        if tags:  # one request for all of them
            self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        self._tag(run_id, tags)

    def log_artifacts(self, directory: Path, artifact_path: str | None = None) -> None:
        assert self.parent_id is not None
        self.client.log_artifacts(self.parent_id, str(directory), artifact_path)

    def log_artifact(self, file: Path, artifact_path: str | None = None, run_id: str | None = None) -> None:
        self.client.log_artifact(run_id or self.parent_id, str(file), artifact_path)

    def log_summary(self, markdown: str, metrics: Mapping[str, float]) -> None:
        """The sweep's short markdown summary (an artifact, and the parent run's description in the UI) and its
        headline numbers, on the parent run."""
        assert self.parent_id is not None
        self.client.log_text(self.parent_id, markdown, "summary.md")
        self.client.set_tag(self.parent_id, DESCRIPTION_TAG, run_description(markdown))
        self._log(self.parent_id, metrics=numeric_metrics(metrics))

    # ----- child runs (trials and replicates) --------------------------------------------------
    def start_child(self, key: str, run_name: str, params: Mapping[str, Any], tags: Mapping[str, str]) -> str:
        """The child run for `key`, reused if a resumed sweep already made it."""
        return self.open_child(key, run_name, params, tags)[0]

    def open_child(self, key: str, run_name: str, params: Mapping[str, Any],
                   tags: Mapping[str, str], look_up: bool = True) -> tuple[str, int]:
        """The child run for `key` and the last epoch it has logged (-1 for a new run). A driver killed outright
        (SIGKILL) leaves a trial whose epochs after Tune's last saved checkpoint run again on resume; the caller
        skips those already logged, so every epoch is in MLflow once. Without `look_up` (a sweep that is not
        resuming has no earlier run of the key) the run is created without asking the store first."""
        assert self.parent_id is not None
        run, created = self._nested(self.parent_id, key, run_name, params, tags, look_up)
        if created:
            return run, -1
        return run, max((int(m.step) for m in self.client.get_metric_history(run, EPOCH_METRIC)), default=-1)

    def log_stage(self, trial_run: str, trial_key: str, stage: Mapping[str, Any], look_up: bool = True) -> None:
        """One stage of a multi-stage method as a run nested in its trial's run: per-epoch history if it
        trained, its final numbers, where it came from (trained or cache key). Logged once, also on resume."""
        name = str(stage["name"])
        tags = {"stage": "method_stage", "raybench.method_stage": name, "cached": str(stage.get("cached", False))}
        params = {"stage_key": stage.get("key") or "-", **dict(stage.get("facts", {}))}
        run, created = self._nested(trial_run, f"{trial_key}/{name}", f"{name}-{trial_key}", params, tags, look_up)
        if not created:
            return
        for step, metrics in enumerate(stage.get("history") or []):
            self._log(run, metrics=numeric_metrics(metrics), step=int(metrics.get("epoch", step)))
        self._log(run, metrics=numeric_metrics({f"final/{k}": v for k, v in stage.get("metrics", {}).items()}
                                               | {"seconds": stage.get("seconds", 0.0)}))
        weights = Path(str(stage.get("facts", {}).get(STAGE_WEIGHTS_FACT, "")))
        if weights.is_file():  # a pre-trained featurizer, so a later run can start from it (absent on another host)
            self.client.log_artifact(run, str(weights), name)
        self.client.set_terminated(run, status="FINISHED")

    def _nested(self, parent: str, key: str, run_name: str, params: Mapping[str, Any],
                tags: Mapping[str, str], look_up: bool = True) -> tuple[str, bool]:
        existing = self._find({KEY_TAG: key, PARENT_TAG: parent}) if look_up else None
        if existing is not None:
            self.client.update_run(existing.info.run_id, status="RUNNING")
            return existing.info.run_id, False
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags={**tags, KEY_TAG: key, PARENT_TAG: parent})
        self._log(run.info.run_id, params=flatten(params))
        return run.info.run_id, True

    def log_metrics(self, run_id: str, metrics: Mapping[str, Any], step: int,
                    tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        self._log(run_id, metrics=numeric_metrics(metrics), step=step, tags=tags, timestamp_ms=timestamp_ms)

    def end_child(self, run_id: str, status: str, reason: str | None = None,
                  tags: Mapping[str, str] | None = None) -> None:
        self._tag(run_id, {**({"failure_reason": reason[:5000]} if reason else {}), **(tags or {})})
        self.client.set_terminated(run_id, status=status)

    def _log(self, run_id: str, params: dict[str, str] | None = None, metrics: dict[str, float] | None = None,
             step: int = 0, tags: Mapping[str, str] | None = None, timestamp_ms: int | None = None) -> None:
        now = timestamp_ms or now_ms()
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, v, now, step) for k, v in (metrics or {}).items()],
            params=[Param(k, v) for k, v in (params or {}).items()],
            tags=[RunTag(k, str(v)) for k, v in (tags or {}).items()],
        )

    def children(self, nested: bool = False) -> list[Any]:
        """The trial and replicate runs of this sweep; with `nested`, their stage runs too."""
        assert self.parent_id is not None
        found, frontier = [], [self.parent_id]
        while frontier:
            runs = [run for parent in frontier
                    for run in runs_tagged(self.client, self.experiment_id, {PARENT_TAG: parent}, max_results=10000)]
            found += runs
            frontier = [run.info.run_id for run in runs] if nested else []
        return found


    def selection_curves(self, metric: str, trial_id: str) -> list[tuple[str, list[int], list[float]]]:
        """(label, epochs, values) of `metric` per epoch for the search run of `trial_id`, then every replicate."""
        curves = []
        for run in sorted(self.children(), key=lambda r: (r.data.tags.get("stage") != "search", r.info.start_time)):
            tags = run.data.tags
            if tags.get("stage") == "search" and tags.get("trial_id") == trial_id:
                label = f"selected trial {trial_id}"
            elif tags.get("stage") == "replicate":
                label = f"replicate, seed {tags.get('seed', '?')}"
            else:
                continue
            history = sorted(self.client.get_metric_history(run.info.run_id, metric), key=lambda m: m.step)
            curves.append((label, [m.step for m in history], [m.value for m in history]))
        return curves


# ----- a sweep stage's trial runs, written beside the sweep instead of in its way -------------------------
TRIAL_JOURNAL = "tracking-journal.jsonl"  # in a stage's Tune experiment folder under --storage


def now_ms() -> int:
    return int(time.time() * 1000)


class WriteKind(str, Enum):
    OPEN = "open"  # the trial's run: created, or found again when resuming
    EPOCH = "epoch"  # one epoch's metrics (and node tags), at the epoch's step
    TAGS = "tags"
    STAGE = "stage"  # an earlier stage of a multi-stage method, as a run nested in the trial's
    END = "end"  # the run's closing metrics (what it used), its status and failure reason


@dataclass(frozen=True)
class RunWrite:
    """One write to a trial's run, which it names by the run's key: what the sweep's Tune callback hands the
    writer, and one line of the stage's journal. Metrics carry the time they were reported, so writing them
    again changes nothing: MLflow's SQL store keeps a metric row (key, time, step, value) once."""

    kind: WriteKind
    key: str
    run_name: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    timestamp_ms: int = 0
    status: str = ""
    reason: str | None = None
    stage: dict[str, Any] | None = None

    def line(self) -> str:
        return json.dumps({**dataclasses.asdict(self), "kind": self.kind.value}, default=str)

    @classmethod
    def from_line(cls, line: str) -> RunWrite:
        values = json.loads(line)
        return cls(**{**values, "kind": WriteKind(values["kind"])})


def read_journal(path: Path) -> list[RunWrite]:
    """The writes a stage's earlier drivers handed over; a last line cut short by a kill is dropped (its write
    was never handed over: the journal is appended before the queue)."""
    if not path.is_file():
        return []
    writes = []
    for line in path.read_text().splitlines():
        try:
            writes.append(RunWrite.from_line(line))
        except (ValueError, TypeError, KeyError):
            continue
    return writes


class TrialRunWriter:
    """The trial runs of one sweep stage, written to MLflow in order by one background thread, so that Tune's
    callback only hands writes over and the driver never waits on the store between trials (over HTTP each
    call costs tens of milliseconds, and Tune's loop, which schedules the next trial, runs the callback).

    Nothing is lost: each write is appended to the stage's journal (TRIAL_JOURNAL, on --storage) before it is
    queued. The writer is drained at every stage's end (Tune returns from a Ctrl-C too) and before the sweep's
    parent run is closed (a SIGTERM or an error), and a resumed sweep writes its journal again first: a driver
    killed outright (SIGKILL) leaves writes the store never got, and writing again those it did get changes
    nothing (runs are found by key, metrics keep their time, tags and statuses are set to the same values). A
    write that fails for good stops the writer: the sweep ends with that error, and `--resume` writes the rest.
    A tracking server that is down is no such failure: the writer's client waits for it (OUTAGE_S, CountedClient)
    and the sweep goes on meanwhile, so a server stopped for a minute in a stage costs nothing; the writer only
    asks the store for anything in its own thread, never when Tune's callback makes it at a stage's start.
    One writer per stage journal in a process: a copy of Tune's callback restored from its experiment state
    finds the same one."""

    _open: ClassVar[dict[Path, TrialRunWriter]] = {}
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, uri: str, parent_id: str, journal: Path, resuming: bool) -> None:
        self.tracker = SweepTracker(uri, background=True)
        self.tracker.parent_id = parent_id
        self.journal, self.resuming = journal, resuming
        self.runs: dict[str, str] = {}  # run key -> run id; below, the writer thread's own bookkeeping
        self.logged_through: dict[str, int] = {}  # per key, the last epoch in the store
        self.ended: set[str] = set()
        self.live: set[str] = set()  # opened by this driver's trials, not only named by the journal
        self.stages: set[str] = set()
        self.error: Exception | None = None
        self.error_raised = False
        self.queue: queue.Queue[tuple[RunWrite, bool] | None] = queue.Queue()
        for write in read_journal(journal) if resuming else []:
            self.queue.put((write, True))
        journal.parent.mkdir(parents=True, exist_ok=True)
        self._journal = journal.open("a")
        self.thread = threading.Thread(target=self._work, name="raybench-tracking-writer", daemon=True)
        self.thread.start()

    @classmethod
    def for_stage(cls, uri: str, parent_id: str, journal: Path, resuming: bool) -> TrialRunWriter:
        with cls._lock:
            writer = cls._open.get(journal)
            if writer is None:
                writer = cls._open[journal] = cls(uri, parent_id, journal, resuming)
            return writer

    @classmethod
    def drain_all(cls) -> None:
        """Wait until every write handed over in this process is in the store; raise the first write that failed."""
        for writer in list(cls._open.values()):
            writer.drain()

    @classmethod
    def close_all(cls) -> None:
        """Drain every writer, without raising (the sweep is ending: a failed write is already its error), and
        stop their threads."""
        with cls._lock:
            writers, cls._open = list(cls._open.values()), {}
        for writer in writers:
            writer.close()

    def submit(self, write: RunWrite) -> None:
        self._raise_failure()
        self._journal.write(write.line() + "\n")
        self._journal.flush()  # in the kernel's hands: a killed driver's journal still has it
        self.queue.put((write, False))

    def drain(self) -> None:
        start = time.perf_counter()
        self.queue.join()
        PROCESS_STATS.seconds += time.perf_counter() - start
        self._raise_failure()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.drain()
        self.queue.put(None)
        self.thread.join()
        self._journal.close()

    def _raise_failure(self) -> None:
        if self.error is not None and not self.error_raised:
            self.error_raised = True
            if isinstance(self.error, StorageFull):  # exit 74, as any full disk: the sweep resumes once freed
                raise self.error
            raise TrackingError(f"tracking store {redact_uri(self.tracker.uri)}: {self.error}") from self.error

    def _work(self) -> None:
        while (item := self.queue.get()) is not None:
            try:
                if self.error is None:
                    self._apply(*item)
            except Exception as err:  # noqa: BLE001  kept for the sweep's thread to raise; the journal keeps the write
                self.error = err
            finally:
                self.queue.task_done()
        self.queue.task_done()

    def _apply(self, write: RunWrite, replayed: bool) -> None:
        if write.kind is WriteKind.OPEN:
            self._open_run(write, replayed)
            return
        run = self.runs[write.key]
        if write.kind is WriteKind.EPOCH:
            self._log_epoch(run, write, replayed)
        elif write.kind is WriteKind.TAGS:
            self.tracker.set_tags(run, write.tags)
        elif write.kind is WriteKind.STAGE and write.stage is not None:
            self._log_stage(run, write)
        elif write.kind is WriteKind.END:
            self._end(run, write)

    def _open_run(self, write: RunWrite, replayed: bool) -> None:
        """A key seen before in this process (a repeated config, a replayed record, a run the journal named)
        reuses its run, set running again as a resumed run is."""
        key = write.key
        if key not in self.runs:
            self.runs[key], self.logged_through[key] = self.tracker.open_child(
                key, write.run_name, write.params, write.tags, look_up=self.resuming)
        elif not replayed and (key in self.ended or key not in self.live):
            self.tracker.client.update_run(self.runs[key], status="RUNNING")
        if not replayed:
            self.live.add(key)
            self.ended.discard(key)

    def _log_epoch(self, run: str, write: RunWrite, replayed: bool) -> None:
        """An epoch the store already has (a resumed trial ran it again after its last checkpoint) sends only
        its tags; one written again from the journal is sent whole, as its metrics keep their time."""
        if not replayed and write.step <= self.logged_through[write.key]:
            if write.tags:
                self.tracker.set_tags(run, write.tags)
            return
        self.tracker.log_metrics(run, write.metrics, step=write.step, tags=write.tags, timestamp_ms=write.timestamp_ms)
        self.logged_through[write.key] = max(self.logged_through[write.key], write.step)

    def _log_stage(self, run: str, write: RunWrite) -> None:
        stage_key = f"{write.key}/{write.stage['name']}"
        if stage_key not in self.stages:
            self.tracker.log_stage(run, write.key, write.stage, look_up=self.resuming)
            self.stages.add(stage_key)

    def _end(self, run: str, write: RunWrite) -> None:
        tags = write.tags
        if write.metrics:  # what the run used, with the tags in one request
            self.tracker.log_metrics(run, write.metrics, step=write.step, tags=tags, timestamp_ms=write.timestamp_ms)
            tags = {}
        self.tracker.end_child(run, write.status, reason=write.reason, tags=tags)
        self.ended.add(write.key)


# ----- a NeWT-style task suite ---------------------------------------------------------------------------
SUITE_STAGE = "newt_suite"
SUITE_TASK_STAGE = "newt_task"


def suite_params(result: SuiteResult) -> dict[str, Any]:
    """What a suite run was asked for, as the parent run's params (model and per_class as run)."""
    s = result.settings
    return {"dataset": s.dataset, "model": s.model, "features_from": s.features_from, "seed": s.seed,
            "per_class": s.per_class, "c_grid": s.c_grid, "folds": s.folds, "n_tasks": len(result.tasks)}


def suite_metrics(result: SuiteResult) -> dict[str, float]:
    """The suite's headline numbers: mean test accuracy per cluster (`accuracy/<cluster>`) and overall."""
    return {**{f"accuracy/{cluster}": mean for cluster, mean in result.cluster_means.items()},
            "accuracy/overall": result.overall_mean}


def task_params(task: TaskResult) -> dict[str, Any]:
    return {"pair": task.task, "first": task.first, "second": task.second, "cluster": task.cluster,
            "n_train": task.n_train, "n_test": task.n_test}


def task_metrics(task: TaskResult) -> dict[str, float]:
    return {"accuracy": task.accuracy, "best_c": task.best_c, "cv_accuracy": task.cv_accuracy,
            "unconverged_fits": task.unconverged_fits}


def log_task_suite(uri: str, result: SuiteResult, experiment: str = EXPERIMENT) -> str:
    """A finished suite as one parent run (settings, cluster and overall means) with one nested run per task
    (its pair, cluster, accuracy, chosen C, cross-validated accuracy); returns the parent's run id.

    Every run is new: a suite takes a minute, so a re-run is a fresh measurement, not a resumption. A failure
    half way marks the parent FAILED, so the store never shows a suite with a silently missing task.
    """
    tracker = SweepTracker(uri, experiment)
    client, s = tracker.client, result.settings
    tags = {**base_tags(s.dataset, "newt_probe"), "stage": SUITE_STAGE, "model": str(s.model),
            "features_source": result.features_source[:5000]}
    parent = client.create_run(tracker.experiment_id, run_name=result.name, tags=tags).info.run_id
    try:
        tracker._log(parent, params=flatten(suite_params(result)), metrics=numeric_metrics(suite_metrics(result)))
        for task in result.tasks:
            child = client.create_run(tracker.experiment_id, run_name=f"{task.task} ({task.cluster})", tags={
                "stage": SUITE_TASK_STAGE, "cluster": task.cluster, PARENT_TAG: parent,
                KEY_TAG: f"{result.name}/{task.task}"}).info.run_id
            tracker._log(child, params=flatten(task_params(task)), metrics=numeric_metrics(task_metrics(task)))
            client.set_terminated(child, status="FINISHED")
    except BaseException:
        client.set_terminated(parent, status="FAILED")
        raise
    client.set_terminated(parent, status="FINISHED")
    return parent


class BenchmarkTracker(SweepTracker):
    """A benchmark's parent run: its sweeps' parent runs nest under it; the comparison is attached to it."""

    def start_benchmark(self, name: str, params: Mapping[str, Any], resume_command: str | None) -> str:
        existing = self._find({BENCHMARK_TAG: name, "stage": "benchmark"})
        if existing is not None:
            self.parent_id = existing.info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=f"benchmark {name}",
                                         tags={BENCHMARK_TAG: name, "stage": "benchmark"})
            self.parent_id = run.info.run_id
            self._log(self.parent_id, params=flatten(params))
        self._tag(self.parent_id, {STATE_TAG: State.RUNNING.value, DRIVER_TAG: driver_identity(),
                                   **({RESUME_TAG: resume_command} if resume_command else {})})
        return self.parent_id

    def end_benchmark(self, markdown: str, status: str, note: str | None = None) -> None:
        """The pairs' table as the run's description and `summary.md`, then the run closed with `status`."""
        assert self.parent_id is not None
        self.client.log_text(self.parent_id, markdown, "summary.md")
        self.client.set_tag(self.parent_id, DESCRIPTION_TAG, run_description(markdown))
        self.end_sweep(status, note)


# ----- reading a finished sweep back ------------------------------------------------------------------
@dataclass(frozen=True)
class SweepStanding:
    """Where a sweep stands, as its parent run says: the line `raybench results` prints above the table."""

    state: str  # a records.SweepState value (finished, interrupted, failed, running, driver-gone) or a hand-set tag
    resume_command: str | None

    @property
    def resumable(self) -> bool:
        return self.state not in (State.FINISHED, State.RUNNING)

    def line(self, name: str) -> str:
        words = {
            State.FINISHED: f"sweep {name}: finished",
            State.RUNNING: f"sweep {name}: running (its driver is alive, or on another host)",
            State.INTERRUPTED: f"sweep {name}: INTERRUPTED before it finished; its results are partial",
            State.DRIVER_GONE: f"sweep {name}: INTERRUPTED (its driver process is gone); its results are partial",
            State.FAILED: f"sweep {name}: FAILED; its results are partial",
        }
        line = words.get(self.state, f"sweep {name}: {self.state}")
        if self.resumable and self.resume_command:
            line += f"; resume with: {self.resume_command}"
        return line


def sweep_state(parent: Any) -> SweepStanding:
    tags = parent.data.tags
    state = tags.get(STATE_TAG) or SWEEP_STATE_OF_STATUS.get(parent.info.status, State.RUNNING).value
    if parent.info.status == "RUNNING" and driver_alive(tags.get(DRIVER_TAG)) is False:
        state = State.DRIVER_GONE.value
    elif parent.info.status == "RUNNING":
        state = State.RUNNING.value
    return SweepStanding(state, tags.get(RESUME_TAG))


@dataclass(frozen=True)
class RecordedSweep:
    """A sweep's parent run as the store has it: the flags it was started with (its params, as logged) and
    where it stands, so a new driver can tell an existing sweep and a resume with changed flags apart."""

    run_id: str
    params: dict[str, str]
    status: str  # MLflow's: RUNNING, FINISHED, KILLED, FAILED
    state: SweepStanding
    storage: str | None = None  # the --storage its driver ran it from (STORAGE_TAG); None: recorded before it was kept


def storage_problem(name: str, recorded: str | None, storage: Path) -> str | None:
    """Why a driver on `storage` may not run sweep `name`, whose parent run says it belongs to the storage
    `recorded`: a sweep's name is one sweep in the tracking store, whatever --storage a driver names, and its
    runs are those of the folders under one storage. None when the storages are one folder (also by another
    path to it), or the parent recorded none."""
    if not recorded or _same_folder(Path(recorded), Path(storage)):
        return None
    return (f"--storage: sweep {name!r} belongs to the storage {recorded} (so its parent run in the tracking store "
            f"says), got {storage}; pass --storage {recorded} to resume it, or another --name")


def _same_folder(one: Path, other: Path) -> bool:
    try:
        return one.resolve() == other.resolve() or os.path.samefile(one, other)
    except OSError:  # one of them is not there (on this host)
        return False


@reads_in_one_line
def find_recorded_sweep(uri: str, name: str) -> RecordedSweep | None:
    """The parent run of sweep `name` in the store at `uri`, read without writing anything: None when the
    store has no such run, or is no MLflow store yet (a SQLite file that is missing or has no MLflow tables).
    Such a file is not opened: MlflowClient would create the schema, which the sweep's own tracker does once
    its driver holds the sweep lock, so two drivers never race to create it."""
    refuse_bad_uri(uri)
    if _missing_local_store(uri) is not None or _not_an_mlflow_sqlite_file(uri) is not None:
        return None
    check_reachable(uri)
    client = first_contact(uri, lambda: CountedClient(MlflowClient(tracking_uri=credentials_to_environment(uri)),
                                                      uri=uri))
    experiment = first_contact(uri, lambda: client.get_experiment_by_name(EXPERIMENT))
    if experiment is None:
        return None
    runs = runs_tagged(client, experiment.experiment_id, {SWEEP_TAG: name, "stage": "sweep"}, max_results=1,
                       order_by=["attributes.start_time DESC"])
    if not runs:
        return None
    run = runs[0]
    return RecordedSweep(run.info.run_id, dict(run.data.params), run.info.status, sweep_state(run),
                         run.data.tags.get(STORAGE_TAG))


@reads_in_one_line
def download_plots(uri: str, parent_id: str, directory: Path) -> list[Path]:
    """The sweep's figures (the parent run's artifact folder `plots`) copied into `directory`."""
    client = MlflowClient(tracking_uri=credentials_to_environment(uri))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            found = Path(client.download_artifacts(parent_id, "plots", tmp))
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            raise TrackingError("this sweep has no plots (it ended before its results were recorded)") from None
        directory.mkdir(parents=True, exist_ok=True)
        copies = []
        for png in sorted(found.glob("*.png")):
            partial = directory / f".{png.name}.partial"  # a reader of DIR never sees half a figure
            partial.write_bytes(png.read_bytes())
            partial.replace(directory / png.name)
            copies.append(directory / png.name)
    return copies


@reads_in_one_line
def load_sweep_results(uri: str, name: str) -> SweepSummary:
    """The parent run of sweep `name` and its `results/summary.json` artifact, with where the sweep stands."""
    client, parent = _sweep_parent(uri, name)
    summary = _parent_summary(client, parent)
    if summary is None:
        raise TrackingError(f"{sweep_state(parent).line(name)}; no results were recorded yet")
    return summary


def _sweep_parent(uri: str, name: str) -> tuple[MlflowClient, Any]:
    """The store at `uri` and sweep `name`'s parent run in it; a TrackingError naming the sweep when it has none."""
    client, experiment_id = _sweep_store(uri)
    runs = runs_tagged(client, experiment_id, {SWEEP_TAG: name, "stage": "sweep"}, max_results=1,
                       order_by=["attributes.start_time DESC"])
    if not runs:
        raise TrackingError(f"no sweep named {name!r} in the MLflow store at {redact_uri(uri)}")
    return client, runs[0]


SELECTED_CHECKPOINT = "selected_checkpoint/best_model.pt"  # the parent run's copy of the selected trial's model


@reads_in_one_line
def download_selected_checkpoint(tracking_uri: str, sweep_name: str, destination: Path) -> Path:
    """The selected trial's `best_model.pt`, which the sweep logged on its parent run, copied into the folder
    `destination` (made if missing); returns the file, whole or not there. A sweep that logged none (it ended
    before selecting, or no trial finished) is a TrackingError naming the sweep."""
    client, parent = _sweep_parent(tracking_uri, sweep_name)
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    target = destination / Path(SELECTED_CHECKPOINT).name
    with tempfile.TemporaryDirectory(dir=destination) as tmp:
        try:
            found = Path(client.download_artifacts(parent.info.run_id, SELECTED_CHECKPOINT, tmp))
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            raise TrackingError(f"{sweep_state(parent).line(sweep_name)}; it logged no selected checkpoint "
                                f"({SELECTED_CHECKPOINT} on its parent run {parent.info.run_id})") from None
        found.replace(target)  # a rename within `destination`: a reader never sees half a file
    return target


@dataclass(frozen=True)
class SweepRecord:
    """One sweep found in the store: its summary if it recorded one, else only where it stands."""

    name: str
    dataset: str
    algorithm: str
    state_line: str
    summary: SweepSummary | None
    damage: str | None = None  # why its recorded results cannot be read (then summary is None)


@reads_in_one_line
def find_sweeps(uri: str, names: tuple[str, ...] = (), dataset: str | None = None,
                algorithms: tuple[str, ...] = ()) -> list[SweepRecord]:
    """Every sweep matching the filter, oldest first (the order they were run in), summaries read back."""
    client, experiment_id = _sweep_store(uri)
    wanted = {"stage": "sweep", **({"dataset": dataset} if dataset else {})}
    parents = runs_tagged(client, experiment_id, wanted, order_by=["attributes.start_time ASC"])
    records = []
    for parent in parents:
        tags = parent.data.tags
        name = tags.get(SWEEP_TAG, parent.info.run_name)
        if (names and name not in names) or (algorithms and tags.get("algorithm") not in algorithms):
            continue
        try:
            summary, damage = _parent_summary(client, parent), None
        except DamagedRecord as err:  # one damaged sweep is named and skipped; the others are still read
            summary, damage = None, str(err)
        records.append(SweepRecord(name, tags.get("dataset", "?"), tags.get("algorithm", "?"),
                                   sweep_state(parent).line(name), summary, damage))
    return records


def _sweep_store(uri: str) -> tuple[MlflowClient, str]:
    """The store a reading command (`results`, `compare`) reads; a SQLite file that is not there is an error,
    never a new empty database left behind."""
    refuse_bad_uri(uri)
    missing = _missing_local_store(uri)
    if missing is not None:
        raise TrackingError(without_secrets(f"no MLflow store at {uri}: {str(missing)!r} does not exist", uri))
    problem = _not_an_mlflow_sqlite_file(uri)
    if problem is not None:
        raise TrackingError(without_secrets(f"no MLflow store at {uri}: {problem}", uri))
    check_reachable(uri)
    client = first_contact(uri, lambda: MlflowClient(tracking_uri=credentials_to_environment(uri)))
    experiment = first_contact(uri, lambda: client.get_experiment_by_name(EXPERIMENT))
    if experiment is None:
        raise TrackingError(f"no raybench sweeps in the MLflow store at {redact_uri(uri)}")
    return client, experiment.experiment_id


def is_new_sqlite_store(uri: str) -> bool:
    """Whether `uri` names a SQLite file that does not exist yet, which MLflow's client creates with its whole
    schema (Alembic's migrations, seconds of one core) when a tracker first opens it (or a file store's folder
    that does not exist yet, which it makes)."""
    return _missing_local_store(uri) is not None


def _missing_local_store(uri: str) -> Path | None:
    """The SQLite file or file-store folder `uri` names, when it is not there (MLflow would create it)."""
    path = sqlite_path(uri) or file_store_path(uri)
    return None if path is None or path.exists() else path


def file_store_path(uri: str) -> Path | None:
    """The folder of a file store (file:///PATH); None for another scheme."""
    if uri_scheme(uri) != "file":
        return None
    try:
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(uri).path))
    except ValueError:
        return None


def _remove_sqlite_file(path: Path) -> None:
    """A database file this process began and could not finish, with SQLite's journal files beside it."""
    for leftover in (path, *(path.with_name(path.name + suffix) for suffix in ("-journal", "-wal", "-shm"))):
        with contextlib.suppress(OSError):
            leftover.unlink()


# Tables every MLflow SQL store has; MlflowClient creates them (about 65 in all) in any SQLite file it opens.
MLFLOW_TABLES = frozenset({"experiments", "runs", "alembic_version"})


def _not_an_mlflow_sqlite_file(uri: str) -> str | None:
    """Why an existing SQLite file of `uri` is not an MLflow store, read without writing to it; None if it is
    one (or `uri` is not a SQLite file). Reading commands check this first: MlflowClient would otherwise
    write MLflow's schema into any SQLite file it is pointed at, and a damaged file would end in a traceback."""
    path = sqlite_path(uri)
    if path is None:
        return None
    import sqlite3

    damage = sqlite_damage(path)
    if damage is not None:
        return f"{str(path)!r} is {damage}"
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as err:
        return f"{str(path)!r} is not a readable SQLite database ({err})"
    if not MLFLOW_TABLES <= tables:
        found = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "") if tables else "none"
        return f"{str(path)!r} has no MLflow tables (its tables: {found}); reading commands never create them"
    return None


def roll_back_a_killed_writers_journal(path: Path) -> None:
    """A writer killed inside a transaction (a SIGKILLed driver) leaves a hot journal (`NAME-journal`) beside a
    sound store. SQLite rolls it back when the file is next opened for writing, which no read-only check can do:
    it answers "attempt to write a readonly database". So the journal is rolled back first, by one read-write
    open that reads the schema (SQLite takes the shared lock, finds the journal hot and restores the file), when
    the folder is writable; otherwise the read-only check says what it finds."""
    import sqlite3

    journal = path.with_name(path.name + "-journal")
    try:
        hot = journal.is_file() and journal.stat().st_size > 0 and os.access(path.parent, os.W_OK)
    except OSError:
        return
    if not hot:
        return
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=rw", uri=True)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError:
        return  # damaged or busy: the read-only check names it


def sqlite_damage(path: Path) -> str | None:
    """Why an existing SQLite file cannot be read whole, read without writing to it: not a database at all (random
    bytes), or pages cut off or overwritten (a truncated copy), which SQLite finds only when a query reaches them.
    `PRAGMA quick_check` reads every page of every table and index once (about a second per few hundred MB), so
    every command meets a damaged store in one line before MLflow opens it. None for a sound file."""
    import sqlite3

    roll_back_a_killed_writers_journal(path)
    try:
        with contextlib.closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as db:
            found = [str(row[0]) for row in db.execute("PRAGMA quick_check(3)")]
    except sqlite3.DatabaseError as err:
        return f"not a readable SQLite database ({err})"
    if found != ["ok"]:
        return f"a damaged SQLite database (SQLite's quick_check: {' '.join(' '.join(found).split())[:300]})"
    return None


class DamagedRecord(TrackingError):
    """A sweep's recorded results that cannot be read: that sweep is skipped and named, the rest go on."""


def read_summary(data: Any, name: str | None = None, run_id: str | None = None) -> SweepSummary:
    """A parsed summary.json as the typed record; a RecordError saying why it cannot be a sweep's results: not a
    mapping, a schema version this raybench does not read, a key missing or of the wrong type (the keys are
    SweepSummary.from_json's to judge), numbers that are no results (records.summary_numbers_problem), or the
    record of another sweep: read for sweep `name` (and its parent run `run_id`), a summary names both, so one
    copied from another sweep, or from a sweep of that name in another store, is not taken for this one's."""
    version = data.get(SCHEMA_VERSION, 0) if isinstance(data, dict) else 0
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise RecordError(f"{SCHEMA_VERSION!r} is not a whole number >= 0")
    if version > SUMMARY_SCHEMA:
        raise RecordError(f"schema version {version}, newer than this raybench {raybench.__version__} reads "
                          f"(up to {SUMMARY_SCHEMA}): read it with the raybench that wrote it")
    summary = SweepSummary.from_json(data)
    problem = summary_numbers_problem(data)
    if problem:
        raise RecordError(problem)
    if name is not None and summary.name != name:
        raise RecordError(f"it is the record of sweep {summary.name!r}, not of {name!r} (copied from another sweep?)")
    recorded_run = (summary.mlflow or {}).get("run_id")
    if run_id is not None and recorded_run is not None and recorded_run != run_id:
        raise RecordError(f"it is the record of the parent run {recorded_run!r}, not of {run_id!r} (copied from "
                          f"another sweep of that name?)")
    return summary


def read_summary_text(text: str, name: str | None = None, run_id: str | None = None) -> SweepSummary:
    """A summary.json's text as read_summary reads it, parsed without trusting its nesting (records.loads_record):
    a RecordError for every way it can be damaged."""
    return read_summary(loads_record(text), name, run_id)


def _parent_summary(client: MlflowClient, parent: Any) -> SweepSummary | None:
    """The sweep's `results/summary.json` with where it stands; None before it recorded results. A file that
    is cut, not JSON, nested past any record, not shaped like a summary, or another sweep's is a DamagedRecord
    naming the sweep and the file."""
    name = parent.data.tags.get(SWEEP_TAG, parent.info.run_name)
    state = sweep_state(parent)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent.info.run_id, "results/summary.json", tmp)
        except Exception:  # noqa: BLE001  MLflow raises several types for a missing artifact
            return None
        text = Path(path).read_text(errors="replace")
    try:
        summary = read_summary_text(text, name, parent.info.run_id)
    except RecordError as err:
        raise _damaged(name, parent, str(err)) from None
    return dataclasses.replace(summary, stored=StoredRun(parent.info.run_id, parent.info.status, state.line(name),
                                                         state.state))


def _damaged(name: str, parent: Any, damage: str) -> DamagedRecord:
    return DamagedRecord(f"sweep {name}: its results/summary.json (run {parent.info.run_id}) is damaged: {damage}; "
                         f"skipped")
