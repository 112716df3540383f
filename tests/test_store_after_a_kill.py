"""A driver SIGKILLed while its tracking writer was inside a write to a SQLite store leaves a hot journal
(`mlflow.db-journal`) beside a sound store: SQLite rolls the unfinished transaction back the next time the file is
opened for writing. So every command must still open it, the `--resume` that a kill asks for above all, and
`results`, which says how to resume. A check that opens the file read-only cannot roll the journal back, and
SQLite then answers "attempt to write a readonly database"."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from helpers.cli import cli

from raybench import tracking
from raybench.tracking import SweepTracker

# A transaction larger than its page cache: SQLite writes changed pages into the database file before the commit,
# so the journal the kill leaves is hot (it holds the pages the file must get back), as it is for a writer killed
# inside its commit.
KILLED_WRITER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA cache_size = 1")
db.execute("BEGIN IMMEDIATE")
db.execute("UPDATE runs SET name = name || ' (never committed)'")
db.execute("CREATE TABLE scratch (value TEXT)")
db.executemany("INSERT INTO scratch VALUES (?)", [("x" * 1000,)] * 500)
print("inside", flush=True)
time.sleep(600)
"""


def killed_mid_write(db: Path) -> None:
    """Open a write transaction on `db` in a child process and SIGKILL the child inside it, as a driver killed
    while MLflow wrote an epoch's metrics."""
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "inside"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


def test_a_store_whose_writer_was_killed_mid_write_is_still_opened(store_uri, in_private_dirs, capsys):
    db = Path(store_uri.removeprefix("sqlite:///"))
    SweepTracker(store_uri).start_sweep("killed", params={}, tags={})
    killed_mid_write(db)
    journal = db.with_name(db.name + "-journal")
    assert journal.is_file() and journal.stat().st_size > 0, "the kill left no hot journal: nothing tested"

    tracking.check_uri(store_uri)  # what every sweep, and its resume, checks before anything else
    shown = cli(["results", "nope", "--tracking-uri", store_uri], capsys)
    assert shown.returncode == 2 and "no sweep named 'nope'" in shown.stderr, shown.stderr
    with sqlite3.connect(db) as read:  # the unfinished transaction is gone, the committed runs are whole
        assert [row[0] for row in read.execute("SELECT name FROM runs")] == ["killed"]
        assert not read.execute("SELECT name FROM sqlite_master WHERE name = 'scratch'").fetchall()
