"""A `--storage` that fills up: every record is written all or nothing, a sweep ends in one line naming the folder
(exit 74) with its MLflow parent FAILED for that reason, and `--resume` after space is freed completes exactly.

The full folder is a small tmpfs mounted for the test. As root (or with passwordless sudo, as on CI runners) it is
mounted for every process on the host, the shared Ray head's trial workers included, which upload checkpoints into
it. Any other user runs each test again in a child pytest that is root of a user and mount namespace of its own
(`unshare --map-root-user --mount`, open to unprivileged users wherever the kernel allows user namespaces): the
child mounts the tmpfs there and starts its own Ray head, so every process of its sweep sees the mount. Where
neither works the tests skip saying why, unless RAYBENCH_REQUIRE_TMPFS=1 makes that a failure (.ci/run sets it). A
filler file written by the test takes the free space at a chosen moment, and deleting it frees the space for the
resume.
"""
from __future__ import annotations

import errno
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import torch
from helpers.cli import cli, on_head, run_cli
from helpers.paths import BIN
from helpers.system_packages import skip_unless_required
from mlflow.tracking import MlflowClient

from raybench.paths import StorageFull, storage_writes, write_atomically, write_text_atomically
from raybench.sweep.atomic_storage import atomic_local_filesystem

NAME = "full"
WAIT_S = 420
TMPFS_MB = 64  # a whole smoke sweep takes about 25 MB once the filler is gone
HEADROOM = 512 * 1024  # what the filler leaves free: less than any checkpoint (its state.pt alone is about 2.4 MB)


REPO = Path(__file__).resolve().parents[1]
OWN_NAMESPACE = ["unshare", "--map-root-user", "--mount"]  # root of a user namespace, with its own mounts


def may_mount() -> bool:
    """Whether this process may mount a tmpfs: root (of the host, or of the namespace a test was run again in),
    or passwordless sudo."""
    if os.geteuid() == 0:
        return True
    return shutil.which("sudo") is not None and subprocess.run(["sudo", "-n", "true"], capture_output=True).returncode == 0


def ran_in_own_namespace(request: pytest.FixtureRequest) -> bool:
    """False where this process may mount the tmpfs itself. Otherwise this test is run again, in a child pytest
    that is root of a user and mount namespace of its own, where it may: True once the child has passed it (its
    output is the failure's message if it did not). No namespace to be had is a skip, or a failure under
    RAYBENCH_REQUIRE_TMPFS=1."""
    if may_mount():
        return False
    probe = subprocess.run([*OWN_NAMESPACE, "true"], capture_output=True, text=True) if shutil.which("unshare") else None
    if probe is None or probe.returncode != 0:
        skip_unless_required("cannot mount a tmpfs to fill: not root, no passwordless sudo, and no user namespace "
                             f"({probe.stderr.strip() if probe else 'no unshare command'})", "RAYBENCH_REQUIRE_TMPFS")
    child = subprocess.run([*OWN_NAMESPACE, sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p",
                            "no:cacheprovider", request.node.nodeid], cwd=REPO, capture_output=True, text=True)
    assert child.returncode == 0, f"in a namespace of its own:\n{child.stdout[-6000:]}\n{child.stderr[-2000:]}"
    return True


@contextmanager
def small_tmpfs(folder: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of `size_mb` MiB mounted at `folder` (open to every user), always unmounted after."""
    folder.mkdir(parents=True, exist_ok=True)
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    mounted = subprocess.run([*sudo, "mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=0777", "raybench-full",
                              str(folder)], capture_output=True, text=True)
    if mounted.returncode != 0:
        skip_unless_required(f"cannot mount a tmpfs to fill (needs root or passwordless sudo): "
                             f"{mounted.stderr.strip()}", "RAYBENCH_REQUIRE_TMPFS")
    try:
        yield folder
    finally:
        unmounted = subprocess.run([*sudo, "umount", str(folder)], capture_output=True, text=True)
        if unmounted.returncode != 0:  # a process still holds a file there: detach it now, freed when let go
            subprocess.run([*sudo, "umount", "--lazy", str(folder)], check=True)


def fill(folder: Path, leave: int) -> Path:
    """A file taking all of `folder`'s free space but `leave` bytes."""
    filler = folder / "filler"
    with open(filler, "wb") as handle:
        os.posix_fallocate(handle.fileno(), 0, shutil.disk_usage(folder).free - leave)
    return filler


def partial_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.partial"))


# ----- the writing helpers on a full disk --------------------------------------------------------------------
def test_a_record_written_to_a_full_disk_keeps_its_previous_version(tmp_path, request):
    if ran_in_own_namespace(request):
        return
    with small_tmpfs(tmp_path / "disk", 1) as disk:
        record = disk / "sweep" / "summary.json"
        record.parent.mkdir()
        write_text_atomically(record, json.dumps({"state": "finished", "trials": 2}))
        fill(disk, leave=16 * 1024)
        with pytest.raises(StorageFull) as raised, storage_writes(disk, "the results of sweep 'x'"):
            write_text_atomically(record, json.dumps({"state": "finished", "trials": ["x" * 64] * 1024}))
        assert str(raised.value) == (f"--storage {disk}: no space left on device (ENOSPC) while writing the results "
                                     f"of sweep 'x' (sweep/summary.json)")
        assert json.loads(record.read_text()) == {"state": "finished", "trials": 2}
        assert [path.name for path in record.parent.iterdir()] == ["summary.json"]  # no temporary file left
        # torch.save says "file write failed" without an errno (the stage cache's entries): still a full disk.
        weights = disk / "sweep" / "model.pt"
        with pytest.raises(OSError) as raised:
            write_atomically(weights, lambda tmp: torch.save(torch.zeros(64 * 1024), tmp))
        assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(weights))
        assert [path.name for path in record.parent.iterdir()] == ["summary.json"]


def test_ray_uploads_to_a_full_disk_leave_the_previous_file_and_free_their_space(tmp_path, request):
    """What Tune's experiment state and checkpoints go through (Arrow's copy_files into the storage file system)."""
    if ran_in_own_namespace(request):
        return
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / "experiment_state.json").write_text(json.dumps({"trials": ["x" * 64] * 4096}))
    (staged / "state.pt").write_bytes(os.urandom(3 * 1024 * 1024))
    with small_tmpfs(tmp_path / "disk", 1) as disk:
        storage = atomic_local_filesystem()
        (disk / "exp").mkdir()
        (disk / "exp" / "experiment_state.json").write_text('{"trials": []}')
        free = shutil.disk_usage(disk).free
        with pytest.raises(OSError) as raised:
            pafs.copy_files(str(staged), str(disk / "exp"), destination_filesystem=storage)
        assert raised.value.errno == 28
        assert json.loads((disk / "exp" / "experiment_state.json").read_text()) in ({"trials": []},
                                                                                   {"trials": ["x" * 64] * 4096})
        assert sorted(path.name for path in (disk / "exp").iterdir()) == ["experiment_state.json"]
        assert shutil.disk_usage(disk).free >= free - 512 * 1024  # at most the new state file took space


# ----- a sweep that fills its --storage --------------------------------------------------------------------
def _args(uri: str, tmp_path: Path, storage: Path) -> list[str]:
    return ["sweep", "erm", "--smoke", "--max-concurrent", "1", "--name", NAME, "--executor", "function",
            "--storage", str(storage), "--tracking-uri", uri]


def _first_checkpoint(storage: Path) -> list[Path]:
    return list(storage.glob(f"{NAME}-search/*/checkpoint_000000/state.pt"))


def _run_until_full(args: list[str], env: dict, cwd: Path, storage: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Start the sweep; once its first trial saved its first epoch, take the folder's space: its next checkpoint
    cannot be written."""
    proc = subprocess.Popen([str(BIN / "raybench"), *args], env=env, cwd=cwd, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline and proc.poll() is None and not _first_checkpoint(storage):
        time.sleep(0.2)
    try:
        assert proc.poll() is None, f"the sweep ended before its folder filled:\n{proc.communicate()[1][-3000:]}"
        assert _first_checkpoint(storage), f"no trial saved an epoch within {WAIT_S} s"
        filler = fill(storage, HEADROOM)
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), filler


def _runs(uri: str) -> list:
    client = MlflowClient(tracking_uri=uri)
    return client.search_runs([client.get_experiment_by_name("raybench").experiment_id], "")


def test_a_sweep_whose_storage_fills_stops_in_one_line_and_resumes_exactly(request, tmp_path, capsys):
    if ran_in_own_namespace(request):  # before the session's head starts: its workers would not see the mount
        return
    store_uri, ray_head = request.getfixturevalue("store_uri"), request.getfixturevalue("ray_head")
    uri = store_uri  # the tracking store stays outside the full folder
    with small_tmpfs(tmp_path / "storage", TMPFS_MB) as storage:
        args = on_head(_args(uri, tmp_path, storage), ray_head)
        stopped, filler = _run_until_full(args, ray_head.env, tmp_path, storage)

        assert stopped.returncode == 74, stopped.stderr[-4000:]
        last = stopped.stderr.strip().splitlines()[-1]
        assert last.startswith(f"raybench: --storage {storage}: no space left on device (ENOSPC) while writing "), last
        assert last.endswith("; free space and resume with: " + shlex.join(["raybench", *args, "--resume"])), last
        assert "Traceback" not in last and "Ctrl+C" not in stopped.stderr  # Tune's own stop line blamed a Ctrl-C
        # Nothing half written: Tune's experiment state, the finished runs' records and results (if any) are whole
        # JSON, and no temporary file is left.
        assert partial_files(storage) == []
        records = [*storage.glob("*/experiment_state-*.json"), *storage.glob("*/completed/*.json"),
                   *storage.glob(f"{NAME}/results/*.json")]
        for record in records:
            json.loads(record.read_text())
        parent = [r for r in _runs(uri) if r.data.tags.get("stage") == "sweep"]
        assert len(parent) == 1 and parent[0].info.status == "FAILED"
        assert parent[0].data.tags["raybench.state"] == "failed"
        assert "no space left on device (ENOSPC)" in parent[0].data.tags["failure_reason"]
        assert not [r for r in _runs(uri) if r.info.status == "RUNNING"]
        shown = cli(["results", NAME, "--tracking-uri", uri], capsys)
        assert "FAILED" in shown.stdout + shown.stderr and "--resume" in shown.stdout + shown.stderr

        filler.unlink()  # space freed
        finished = run_cli([*args, "--resume"], ray_head.env, tmp_path, timeout=WAIT_S)
        assert finished.returncode == 0, finished.stderr[-4000:]

        summary = json.loads((storage / NAME / "results" / "summary.json").read_text())
        assert summary["state"] == "finished" and len(summary["trials"]) == 2
        assert all(t["status"] == "ok" for t in summary["trials"])
        assert summary["replicates"]["ok"] == 2
        runs = _runs(uri)
        children = [r for r in runs if r.data.tags.get("stage") in ("search", "replicate")]
        assert sorted(r.data.tags["stage"] for r in children) == ["replicate", "replicate", "search", "search"]
        client = MlflowClient(tracking_uri=uri)
        for run in children:  # every epoch once: none lost to the full disk, none logged again by the resume
            assert run.info.status == "FINISHED"
            steps = sorted(m.step for m in client.get_metric_history(run.info.run_id, "ood_val/acc"))
            assert steps == [0, 1], (run.data.tags["stage"], run.data.tags["trial_id"], steps)
        parent = [r for r in runs if r.data.tags.get("stage") == "sweep"]
        assert len(parent) == 1 and parent[0].info.status == "FINISHED"
        assert parent[0].data.tags["raybench.state"] == "finished"
