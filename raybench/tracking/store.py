"""Tracking stores and their URIs: what a URI names (a database file, a server, a file store), whether MLflow can
open it, checked before anything is written, so a typo or a damaged file is one line instead of a traceback
after Ray has started; how it is shown (never with its credentials); and the MLflow UI command and links over it.

MLflow itself is imported here only inside the checks that need its settings; MLflow's SQL store is reached
through SQLAlchemy's URL reader and SQLite's own module, read-only, so a check never creates a store.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from raybench.paths import writable_dir_problem
from raybench.tracking.names import EXPERIMENT

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


def scrubbed(text: str, uri: str) -> str:
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
        return f"not a database URL SQLAlchemy can read ({scrubbed(str(err), uri)})"
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
        reason = scrubbed(str(getattr(err, "reason", err)), uri)
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


# ----- local stores: a SQLite file or a file store's folder, judged before MLflow opens (or creates) them -----
def is_new_sqlite_store(uri: str) -> bool:
    """Whether `uri` names a SQLite file that does not exist yet, which MLflow's client creates with its whole
    schema (Alembic's migrations, seconds of one core) when a tracker first opens it (or a file store's folder
    that does not exist yet, which it makes)."""
    return missing_local_store(uri) is not None


def missing_local_store(uri: str) -> Path | None:
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


def remove_sqlite_file(path: Path) -> None:
    """A database file this process began and could not finish, with SQLite's journal files beside it."""
    for leftover in (path, *(path.with_name(path.name + suffix) for suffix in ("-journal", "-wal", "-shm"))):
        with contextlib.suppress(OSError):
            leftover.unlink()


# Tables every MLflow SQL store has; MlflowClient creates them (about 65 in all) in any SQLite file it opens.
MLFLOW_TABLES = frozenset({"experiments", "runs", "alembic_version"})


def not_an_mlflow_sqlite_file(uri: str) -> str | None:
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


# ----- whose a sweep's name is ------------------------------------------------------------------------------
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


# ----- the MLflow UI over a store --------------------------------------------------------------------------
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

