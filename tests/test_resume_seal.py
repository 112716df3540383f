"""`--resume` never unpickles what someone else left in `--storage`.

Tune's restore unpickles `tuner.pkl`, the searcher's state, the trials' JSON and `error.pkl`; raybench seals
each such file as its storage file system writes it (a keyed HMAC in the folder's ledger, the key outside
`--storage`), and a resume refuses any file without a seal made with this user's key: one line, exit 2, and
the planted pickle never runs. The sweep-level cases plant into the folders of one real finished sweep.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import stat
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from helpers.cli import cli, on_head, run_cli

from raybench.sweep import state_seal
from raybench.sweep.atomic_storage import atomic_local_filesystem

NAME = "sealed"


class Planted:
    """A pickle that, when loaded, creates the marker file: what a planted tuner.pkl would do, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.marker,))


@pytest.fixture(autouse=True)
def private_key(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv(state_seal.STATE_KEY_ENV, str(tmp_path / "key" / "resume.key"))
    return tmp_path / "key" / "resume.key"


def write_through_storage(path: Path, data: bytes) -> None:
    """As Tune writes its state: an output stream of raybench's storage file system."""
    with atomic_local_filesystem().open_output_stream(str(path)) as out:
        out.write(data)


# ----- the seal itself ----------------------------------------------------------------------------------------
def test_state_written_by_the_storage_file_system_is_sealed_and_other_files_are_not_checked(tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    write_through_storage(folder / "tuner.pkl", pickle.dumps({"a": 1}))
    write_through_storage(folder / "experiment_state-2026.json", b'{"trial_data": []}')
    write_through_storage(folder / "checkpoint.pt", b"weights")  # raybench's own, read with weights_only
    atomic_local_filesystem().copy_file(str(folder / "tuner.pkl"), str(folder / "searcher-state-1.pkl"))
    found = state_seal.check_sealed(folder)
    assert found.checked == 3 and found.unsealed == []
    assert len((folder / state_seal.LEDGER).read_text().splitlines()) == 3


@pytest.mark.parametrize("tamper", ["replaced", "appended", "foreign_key", "forged_line", "moved", "symlink", "fifo",
                                    "folder", "ledger_symlink", "no_ledger"])
def test_a_state_file_raybench_did_not_write_is_refused(tmp_path, tamper, monkeypatch):
    folder = tmp_path / "sweep-search"
    folder.mkdir()
    state = folder / "searcher-state-2026.pkl"
    write_through_storage(state, pickle.dumps({"ok": True}))
    assert state_seal.check_sealed(folder).unsealed == []
    evil = pickle.dumps(Planted(tmp_path / "marker"))
    if tamper == "replaced":
        state.write_bytes(evil)
    elif tamper == "appended":
        state.write_bytes(state.read_bytes() + b"x")
    elif tamper == "foreign_key":  # sealed by another user's raybench
        monkeypatch.setenv(state_seal.STATE_KEY_ENV, str(tmp_path / "other.key"))
        write_through_storage(state, evil)
        monkeypatch.setenv(state_seal.STATE_KEY_ENV, str(tmp_path / "key" / "resume.key"))
    elif tamper == "forged_line":
        state.write_bytes(evil)
        with open(folder / state_seal.LEDGER, "a") as ledger:
            ledger.write(f"{state.name}\t{'0' * 64}\n")
    elif tamper == "moved":  # a sealed file of another sweep's folder, its ledger copied along
        other = tmp_path / "other-search"
        other.mkdir()
        write_through_storage(other / state.name, evil)
        shutil.copy(other / state.name, state)
        shutil.copy(other / state_seal.LEDGER, folder / state_seal.LEDGER)
    elif tamper == "symlink":
        (tmp_path / "elsewhere.pkl").write_bytes(state.read_bytes())
        state.unlink()
        state.symlink_to(tmp_path / "elsewhere.pkl")
    elif tamper == "fifo":
        state.unlink()
        os.mkfifo(state)
    elif tamper == "folder":
        state.unlink()
        state.mkdir()
    elif tamper == "ledger_symlink":
        ledger = folder / state_seal.LEDGER
        shutil.move(ledger, tmp_path / "ledger")
        ledger.symlink_to(tmp_path / "ledger")
    elif tamper == "no_ledger":
        (folder / state_seal.LEDGER).unlink()
    with pytest.raises(state_seal.UnsealedState, match="searcher-state-2026.pkl"):
        state_seal.require_sealed(folder)
    assert not (tmp_path / "marker").exists()


def test_the_key_is_made_once_readable_by_its_owner_alone_and_a_bad_key_file_is_named(private_key):
    key = state_seal.state_key()
    assert len(key) == state_seal.KEY_BYTES and state_seal.state_key() == key
    assert stat.S_IMODE(private_key.stat().st_mode) == 0o600
    private_key.write_bytes(b"short")
    with pytest.raises(state_seal.StateKeyError, match="holds 5 bytes"):
        state_seal.state_key()
    private_key.unlink()
    private_key.symlink_to(private_key.parent / "target")
    (private_key.parent / "target").write_bytes(key)
    with pytest.raises(state_seal.StateKeyError, match="cannot be read"):
        state_seal.state_key()


def test_a_failed_seal_leaves_the_previous_file_in_place(tmp_path, monkeypatch):
    folder = tmp_path / "exp"
    folder.mkdir()
    write_through_storage(folder / "tuner.pkl", b"first")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state_seal, "seal", full)
    with pytest.raises(OSError), atomic_local_filesystem().open_output_stream(str(folder / "tuner.pkl")) as out:
        out.write(b"second")
    assert (folder / "tuner.pkl").read_bytes() == b"first"
    assert [p.name for p in folder.iterdir() if p.name.endswith(".partial")] == []
    assert isinstance(atomic_local_filesystem(), pafs.FileSystem)


# ----- a real sweep's folders ---------------------------------------------------------------------------------
@pytest.fixture
def finished_sweep(tmp_path, head_env, ray_head, store_uri) -> tuple[list[str], Path]:
    head_env = {**head_env, state_seal.STATE_KEY_ENV: os.environ[state_seal.STATE_KEY_ENV]}
    args = on_head(["sweep", "erm", "--trials", "1", "--replicates", "1", "--name", NAME, "--executor", "function",
                    "--storage", str(tmp_path / "runs"), "--tracking-uri", store_uri,
                    "--set", "epochs=1", "--set", "max_steps_per_epoch=3", "--set", "patience=none"], ray_head)
    done = run_cli(args, head_env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return [*args, "--resume"], tmp_path / "runs"


def _plant(storage: Path, marker: Path) -> dict[str, tuple[Path, bytes | None]]:
    """Every way of planting: each a file and what it held before (None: it was not there)."""
    search = storage / f"{NAME}-search"
    trial = next(p for p in search.iterdir() if p.is_dir())
    evil = pickle.dumps(Planted(marker))
    state_json = next(search.glob("experiment_state-*.json"))
    blob = json.loads(state_json.read_text())
    blob["planted"] = {"_type": "CLOUDPICKLE_FALLBACK", "value": evil.hex()}
    return {"tuner.pkl": (search / "tuner.pkl", evil), "searcher": (next(search.glob("searcher-state-*.pkl")), evil),
            "error.pkl": (trial / "error.pkl", evil), "experiment_state": (state_json, json.dumps(blob).encode()),
            "replicate tuner.pkl": (next(storage.glob(f"{NAME}-replicate*")) / "tuner.pkl", evil)}


def test_resume_refuses_every_planted_state_file_and_runs_none(finished_sweep, tmp_path, capsys):
    resume, storage = finished_sweep
    marker = tmp_path / "planted-code-ran"
    for how, (path, data) in _plant(storage, marker).items():
        before = path.read_bytes() if path.exists() else None
        path.write_bytes(data)
        refused = cli(resume, capsys)
        assert refused.returncode == 2, (how, refused.stderr)
        line = refused.stderr.strip()
        assert "\n" not in line and path.name in line and "did not write" in line, (how, line)
        assert not marker.exists(), how
        if before is None:
            path.unlink()
        else:
            path.write_bytes(before)
    again = cli(resume, capsys)  # the sweep's own files, put back, are its own again
    assert again.returncode == 0 and "already finished" in again.stdout + again.stderr, again.stderr[-2000:]
