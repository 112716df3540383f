"""Hostile values of the resource, path and timing flags, the writes of `train --output`, `results --plots` and
`compare --plot`, the data check's files, and the line a sweep stopped before it started prints.

Every bad input is one line naming the flag (or file) and what was expected, exit 2 (74 for a full disk), and
leaves nothing written or half-written. Each case runs the real command line in-process, from an empty working
directory; where a sweep would go on to start Ray, its start is replaced by a marker, so no Ray ever starts here.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import cli, fail_on_reaching
from hypothesis import given, settings
from hypothesis import strategies as st

from raybench import flag_types
from raybench.flag_types import MIN_DEVICE_SHARE, RAY_RESOURCE_STEP, cpu_amount, gpu_amount, nonblank

SMOKE = ["sweep", "erm", "--smoke"]
TRAIN = ["train", "--epochs", "1", "--set", "max_steps_per_epoch=1"]


@pytest.fixture(autouse=True)
def private_dirs(in_private_dirs, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_OVERRIDE_RESOURCES", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, for Ray's detection too, on any machine


class ReachedRay(Exception):
    """Raised where a sweep would connect to Ray: its checks all passed."""


@pytest.fixture
def no_ray(monkeypatch) -> None:
    """A sweep that passes every check stops where it would start Ray, raising ReachedRay."""
    from raybench.sweep import ray_backend

    def reached(*args: Any, **kwargs: Any) -> None:
        raise ReachedRay

    monkeypatch.setattr(ray_backend, "connect", reached)


def refused(result: Any, flag: str) -> str:
    """The one error line of a command that refused its input, naming `flag` first."""
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert lines[0].startswith(f"raybench: error: {flag}"), lines[0]
    return lines[0]


def nothing_in(folder: Path) -> list[str]:
    """What a refused command left in `folder` (nothing, it should be)."""
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


# ----- resource and timing amounts ---------------------------------------------------------------------------
@pytest.mark.parametrize("words, flag", [
    (["--cpus-per-worker", "0.00001"], "--cpus-per-worker: expected a finite number >= 0.01, got 1e-05"),
    (["--cpus-per-worker", "0"], "--cpus-per-worker: expected a finite number >= 0.01"),
    (["--gpus-per-worker", "0.0000001"], "--gpus-per-worker: expected 0 (no GPU), a share of one GPU in [0.01, 1]"),
    (["--gpus-per-worker", "1.5"], ("--gpus-per-worker: expected 0 (no GPU), a share of one GPU in [0.01, 1] or a "
                                    "whole number of GPUs up to 1,000,000, got 1.5")),
    (["--gpus-per-worker", "inf"], "--gpus-per-worker: expected 0 (no GPU)"),
    (["--worker-resource", "foo=1e-300"], "--worker-resource: expected a finite number >= 0.0001, got 1e-300"),
    (["--worker-resource", "foo=-1"], "--worker-resource: expected a finite number >= 0.0001"),
    (["--worker-resource", "foo=nan"], "--worker-resource: expected a finite number >= 0.0001"),
    (["--worker-resource", "foo=inf"], "--worker-resource: expected a finite number >= 0.0001"),
    (["--trial-resource", "slot=0.00001"], "--trial-resource: expected a finite number >= 0.0001"),
    (["--workers-per-trial", "0"], "--workers-per-trial: expected an integer >= 1"),
    (["--max-concurrent", "0"], "--max-concurrent: expected an integer >= 1"),
])
def test_a_resource_amount_ray_would_misplace_is_refused_by_its_flag(words, flag, capsys, tmp_path, monkeypatch):
    from raybench.sweep import ray_backend

    fail_on_reaching(monkeypatch, (ray_backend, "connect"))
    refused(cli([*SMOKE, *words], capsys), flag)
    assert nothing_in(tmp_path) == []


@pytest.mark.parametrize("every", ["0.001", "0", "0.5", "-1", "nan"])
def test_progress_lines_come_at_most_once_a_second(every, capsys, tmp_path):
    refused(cli(["benchmark", "embedded", "--plan", "--progress-every", every], capsys),
            "--progress-every: expected a finite number >= 1")
    assert nothing_in(tmp_path) == []


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0, max_value=MIN_DEVICE_SHARE, exclude_max=True) | st.floats(max_value=0, exclude_max=True))
def test_no_share_of_a_cpu_below_a_hundredth_is_taken(amount):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number >= 0.01"):
        cpu_amount(repr(amount))


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=MIN_DEVICE_SHARE, max_value=1) | st.integers(min_value=0, max_value=1_000_000))
def test_a_share_of_one_gpu_or_whole_gpus_are_taken(amount):
    assert gpu_amount(repr(amount)) == float(amount)


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=1, max_value=1e6, exclude_min=True).filter(lambda x: not x.is_integer())
       | st.floats(min_value=0, max_value=MIN_DEVICE_SHARE, exclude_min=True, exclude_max=True))
def test_a_fraction_of_a_gpu_above_one_or_below_a_hundredth_is_refused(amount):
    with pytest.raises(argparse.ArgumentTypeError, match=r"a share of one GPU in \[0.01, 1\]"):
        gpu_amount(repr(amount))


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0, max_value=RAY_RESOURCE_STEP, exclude_max=True))
def test_a_custom_resource_below_rays_precision_is_refused(amount):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number >= 0.0001"):
        flag_types.resource_request(f"slot={amount!r}")


# ----- what a private local Ray could never give, before anything is written ---------------------------------
@pytest.mark.parametrize("words, flag", [
    (["--gpus-per-worker", "1"], ("--gpus-per-worker: each trial asks for 1 worker(s) of 1 CPU and 1 GPU, but the "
                                  "private local Ray this sweep starts (no --address) has")),
    (["--gpus-per-worker", "0.5"], "--gpus-per-worker: each trial asks for 1 worker(s) of 1 CPU and 0.5 GPU"),
    (["--worker-resource", "foo=1"], "--worker-resource foo: each trial asks for 1 worker(s) of 1 CPU and 1 foo"),
    (["--trial-resource", "slot=1"], "--trial-resource slot: each trial holds 1 slot, but the private local Ray"),
    (["--workers-per-trial", "100000"], "--workers-per-trial: each trial asks for 100000 worker(s) of 1 CPU"),
    (["--cpus-per-worker", "100000"], "--cpus-per-worker: each trial asks for 1 worker(s) of 100000 CPU"),
    (["--executor", "function", "--cpus-per-worker", "100000"], "--cpus-per-worker: each trial asks for 1 worker"),
])
def test_a_request_a_private_ray_lacks_is_refused_before_the_store_or_storage_is_written(words, flag, capsys,
                                                                                         tmp_path, no_ray):
    line = refused(cli([*SMOKE, *words], capsys), flag)
    assert "0 GPU" in line
    assert nothing_in(tmp_path) == []


def test_a_resource_the_environment_declares_for_rays_node_is_let_through(capsys, tmp_path, no_ray, monkeypatch):
    """$RAY_OVERRIDE_RESOURCES gives a private Ray's node custom resources: a request for them is no mistake."""
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", json.dumps({"foo": 2}))
    with pytest.raises(ReachedRay):
        cli([*SMOKE, "--worker-resource", "foo=1"], capsys)
    line = refused(cli([*SMOKE, "--name", "more", "--worker-resource", "foo=3"], capsys),
                   "--worker-resource foo: each trial asks for 1 worker(s) of 1 CPU and 3 foo, but the private local "
                   "Ray this sweep starts (no --address) has ")
    assert line.endswith("0 GPU, and 2 foo; ask for less, or give the --address of a cluster that has it"), line


def test_the_python_api_is_held_to_the_flags_bounds(tmp_path, no_ray):
    from raybench import api

    for fields, words in (({"cpus_per_worker": 1e-5}, "--cpus-per-worker: expected a finite number >= 0.01"),
                          ({"tracking_uri": " "}, "--tracking-uri: expected an MLflow tracking URI, got ' '"),
                          ({"address": ""}, "--address: expected host:port"),
                          ({"worker_resources": (("foo", 1e-9),)}, "--worker-resource: expected a finite number")):
        with pytest.raises(api.OptionError, match="^" + words.replace("(", r"\(").replace(")", r"\)")):
            api.sweep("erm", smoke=True, **fields)
    assert nothing_in(tmp_path) == []


def test_a_cluster_at_an_address_is_judged_once_joined_and_before_a_store_is_made(capsys, tmp_path, monkeypatch):
    """A cluster's resources are known only once joined; a refused request leaves no tracking store behind (it
    used to be made beside the join)."""
    from raybench.commands import sweep as command
    from raybench.sweep import ray_backend
    from raybench.sweep.errors import ClusterError

    joined: list[str] = []
    monkeypatch.setattr(command, "probe_cluster", lambda address: None)
    monkeypatch.setattr(ray_backend, "connect", lambda address, *args, **kwargs: joined.append(address) or True)
    monkeypatch.setattr(ray_backend, "shutdown", lambda: None)

    def lacking(*args: Any) -> None:
        raise ClusterError("each trial asks for 1 worker(s) of 1 CPU and 1 GPU, but the cluster's nodes have 2 CPU/0 GPU")

    monkeypatch.setattr(ray_backend, "check_resources", lacking)
    line = refused(cli([*SMOKE, "--gpus-per-worker", "1", "--address", "127.0.0.1:6379"], capsys), "cluster:")
    assert "2 CPU/0 GPU" in line and joined == ["127.0.0.1:6379"]
    assert not (tmp_path / "mlflow.db").exists()


# ----- an empty word for a path, a URI or a run --------------------------------------------------------------
@pytest.mark.parametrize("argv, flag", [
    ([*SMOKE, "--storage", ""], "--storage: expected a folder, got ''"),
    ([*SMOKE, "--storage", "  "], "--storage: expected a folder, got '  '"),
    ([*SMOKE, "--tracking-uri", ""], "--tracking-uri: expected an MLflow tracking URI, got ''"),
    ([*SMOKE, "--address", " "], "--address: expected host:port"),
    ([*SMOKE, "--parent-run", ""], "--parent-run: expected an MLflow run id, got ''"),
    ([*SMOKE, "--plugin", ""], "--plugin: expected a module, .py file or package folder, got ''"),
    ([*SMOKE, "--trial-slots", "\t"], "--trial-slots: expected a folder of trial slots, got '\\t'"),
    ([*SMOKE, "--spaces", ""], "--spaces: expected a folder of search spaces"),
    ([*TRAIN, "--output", ""], "--output: expected a folder, got ''"),
    (["probe", "random", "--output", " "], "--output: expected a folder, got ' '"),
    (["results", "demo", "--plots", ""], "--plots: expected a folder, got ''"),
    (["results", "demo", "--tracking-uri", ""], "--tracking-uri: expected an MLflow tracking URI"),
    (["compare", "--plot", ""], "--plot: expected a file name ending in .png, got ''"),
    (["benchmark", ""], "file: expected a benchmark YAML file or a shipped grid's name, got ''"),
    (["benchmark", "embedded", "--plan", "--storage", ""], "--storage: expected a folder, got ''"),
    (["data", "check", "camelyon17", "--root", ""], "--root: expected a folder, got ''"),
    (["space", "new", "erm", "--output", " "], "--output: expected a file name, got ' '"),
    (["newt-suite", "--features-from", "random", "--tracking-uri", ""], "--tracking-uri: expected an MLflow"),
])
def test_an_empty_path_is_refused_never_read_as_the_working_folder_or_the_default(argv, flag, capsys, tmp_path,
                                                                                  no_ray):
    refused(cli(argv, capsys), flag)
    assert nothing_in(tmp_path) == []


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=6))
def test_only_blanks_are_no_path(word):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a folder"):
        nonblank("a folder")(word)


# ----- train --output, results --plots, compare --plot: targets and full disks -------------------------------
def test_train_refuses_an_output_whose_files_are_folders_or_whose_parent_is_a_file(capsys, tmp_path):
    (tmp_path / "out" / "state.pt").mkdir(parents=True)
    refused(cli([*TRAIN, "--output", "out"], capsys), f"--output: '{Path('out') / 'state.pt'}' is a folder; "
                                                      f"expected a file raybench may replace there, or none")
    (tmp_path / "file").write_text("x")
    refused(cli([*TRAIN, "--output", "file/sub"], capsys), "--output: cannot create 'file/sub'")
    refused(cli([*TRAIN, "--output", "/proc/raybench-out"], capsys), "--output: cannot write to '/proc'")
    assert nothing_in(tmp_path) == ["file", "out", "out/state.pt"]


def test_train_on_a_full_output_disk_ends_in_one_line_with_74_and_no_partial_file(capsys, tmp_path, monkeypatch):
    """The write fails as a full disk fails it: after part of the file is written."""
    from raybench import checkpoints

    def half_then_full(obj: Any, path: Any) -> None:
        Path(path).write_bytes(b"PK\x03\x04" + b"\0" * 1024)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoints.torch, "save", half_then_full)
    result = cli([*TRAIN, "--output", "out"], capsys)
    assert result.returncode == 74, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last == (f"raybench: --output {tmp_path / 'out'}: no space left on device (ENOSPC) while writing the "
                    f"run's checkpoints; free space and run it again")
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert nothing_in(tmp_path) == []  # no partial file, and not the folder it made either


def test_train_on_a_real_full_disk_where_torch_says_no_errno_is_74_too(capsys, tmp_path):
    """torch's writer says a full disk as a RuntimeError without an errno ("unexpected pos"): on a small tmpfs."""
    from test_storage_full import fill, small_tmpfs

    with small_tmpfs(tmp_path / "disk", 1) as disk:
        fill(disk, leave=64 * 1024)
        result = cli([*TRAIN, "--output", str(disk / "out")], capsys)
        assert result.returncode == 74, result.stderr[-2000:]
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(f"raybench: --output {disk / 'out'}: no space left on device (ENOSPC)"), last
        assert sorted(path.name for path in disk.iterdir()) == ["filler"]


def a_comparison(*datasets: str) -> Any:
    """What `compare` builds from finished sweeps, one per dataset."""
    from raybench.records import SweepSummary
    from raybench.report.compare import compare

    def summary(dataset: str) -> SweepSummary:
        return SweepSummary.from_json({
            "name": f"erm-{dataset}", "state": "finished", "dataset": dataset, "algorithm": "erm",
            "space": "search_spaces/erm.yaml", "selection": {"strategy": "ood_val", "metric": "val/acc"},
            "trials": [{"trial_id": "t0", "status": "ok"}], "selected": {"trial_id": "t0", "status": "ok"},
            "replicates": {"seeds": [1, 2], "ok": 2, "summary": {
                "best/id_test/acc": {"mean": 0.9, "std": 0.01, "n": 2},
                "best/test/acc": {"mean": 0.6, "std": 0.02, "n": 2}}}})

    return compare([summary(dataset) for dataset in datasets], [], None)


@pytest.fixture
def compared(monkeypatch) -> Callable[..., None]:
    """`compare` reads the comparison given instead of a tracking store."""
    from raybench import api

    def use(*datasets: str) -> None:
        monkeypatch.setattr(api, "compare", lambda *args, **kwargs: a_comparison(*datasets))

    return use


def test_compare_refuses_a_plot_name_that_is_a_folder_before_drawing_or_printing(capsys, tmp_path, compared):
    compared("digits-shift")
    (tmp_path / "X.png").mkdir()
    refused(cli(["compare", "--plot", "X.png"], capsys), "--plot: expected a file name ending in .png, got "
                                                         "'X.png', which is a folder")
    compared("digits-shift", "camelyon17")  # two datasets: X-camelyon17.png and X-digits-shift.png
    (tmp_path / "Y-digits-shift.png").mkdir()
    result = cli(["compare", "--plot", "Y.png"], capsys)
    refused(result, "--plot: 'Y-digits-shift.png' is a folder; expected a figure raybench may replace there")
    assert result.stdout == ""
    refused(cli(["compare", "--plot", "/proc/raybench.png"], capsys), "--plot: cannot write to '/proc'")
    (tmp_path / "file").write_text("x")
    refused(cli(["compare", "--plot", "file/Z.png"], capsys), "--plot: expected a directory, got the file 'file'")
    assert nothing_in(tmp_path) == ["X.png", "Y-digits-shift.png", "file"]


def test_compare_on_a_full_disk_is_74_naming_the_plot_folder_with_no_partial_file(capsys, tmp_path, compared,
                                                                                monkeypatch):
    from matplotlib.figure import Figure

    def half_then_full(self: Figure, path: Any, **kwargs: Any) -> None:
        Path(path).write_bytes(b"\x89PNG" + b"\0" * 512)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    compared("digits-shift")
    monkeypatch.setattr(Figure, "savefig", half_then_full)
    result = cli(["compare", "--plot", "figures/X.png"], capsys)
    assert result.returncode == 74, result.stderr[-2000:]
    assert result.stderr.strip() == (f"raybench: --plot {tmp_path / 'figures'}: no space left on device (ENOSPC) "
                                     f"while writing the comparison figure; free space and run it again")
    assert not (tmp_path / "figures").exists()  # nor the folder it made


@pytest.fixture
def a_sweep_with_plots(store_uri, monkeypatch) -> str:
    """A parent run whose artifacts hold two figures, as a finished sweep's do; `results` reads it by name."""
    from mlflow.tracking import MlflowClient

    from raybench import api
    from raybench.records import StoredRun, SweepSummary

    client = MlflowClient(tracking_uri=store_uri)
    run = client.create_run(client.get_experiment_by_name("Default").experiment_id)
    figures = Path("made") / "plots"
    figures.mkdir(parents=True)
    for name in ("curves.png", "search.png"):
        (figures / name).write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(4096))
    client.log_artifacts(run.info.run_id, str(figures), "plots")
    summary = SweepSummary.from_json({"name": "demo", "dataset": "digits-shift", "algorithm": "erm",
                                      "selection": {"metric": "val/acc"}, "trials": [], "replicates": {}})
    summary.stored = StoredRun(run_id=run.info.run_id)
    monkeypatch.setattr(api, "results", lambda name, uri: summary)
    return store_uri


def test_results_plots_onto_a_full_disk_is_74_and_leaves_the_folder_as_it_was(capsys, tmp_path, a_sweep_with_plots,
                                                                             monkeypatch):
    real = Path.write_bytes

    def full_after_half(self: Path, data: bytes) -> int:
        if self.name.endswith(".partial"):
            real(self, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", full_after_half)
    result = cli(["results", "demo", "--tracking-uri", a_sweep_with_plots, "--plots", "new/figures"], capsys)
    assert result.returncode == 74, result.stderr[-2000:]
    assert result.stderr.strip() == (f"raybench: --plots {tmp_path / 'new' / 'figures'}: no space left on device "
                                     f"(ENOSPC) while writing the sweep's figures; free space and run it again")
    assert not (tmp_path / "new").exists()  # neither a partial figure nor the folders it made
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "old.png").write_bytes(b"old")
    assert cli(["results", "demo", "--tracking-uri", a_sweep_with_plots, "--plots", "kept"], capsys).returncode == 74
    assert nothing_in(tmp_path / "kept") == ["old.png"]


def test_results_plots_refuses_a_figure_name_that_is_a_folder_and_a_file_as_the_folder(capsys, tmp_path,
                                                                                      a_sweep_with_plots):
    (tmp_path / "figures" / "search.png").mkdir(parents=True)
    refused(cli(["results", "demo", "--tracking-uri", a_sweep_with_plots, "--plots", "figures"], capsys),
            f"--plots: '{Path('figures') / 'search.png'}' is a folder; expected a figure raybench may replace there")
    assert nothing_in(tmp_path / "figures") == ["search.png"]  # curves.png was not moved in either
    (tmp_path / "file").write_text("x")
    refused(cli(["results", "demo", "--tracking-uri", a_sweep_with_plots, "--plots", "file"], capsys),
            "--plots: expected a directory, got the file 'file'")
    ok = cli(["results", "demo", "--tracking-uri", a_sweep_with_plots, "--plots", "fine"], capsys)
    assert ok.returncode == 0, ok.stderr
    assert nothing_in(tmp_path / "fine") == ["curves.png", "search.png"]


# ----- the data check never opens a data file that is no regular file ----------------------------------------
def within(seconds: float, body: Callable[[], Any], fifos: list[Path]) -> Any:
    """`body()`'s result, or a failure when it takes longer than `seconds` (a reader blocked on a FIFO is then
    released by opening the FIFOs for writing, so the test ends either way)."""
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: outcome.update(value=body()), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        for fifo in fifos:
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        worker.join(5)
        pytest.fail(f"still running after {seconds} s: a FIFO was opened")
    return outcome["value"]


def fixed_files(name: str, root: Path) -> list[str]:
    """The files a WILDS layout needs before it reads any table: everything missing from an empty root."""
    from raybench.data.wilds.files import check

    report = check(name, root)
    return sorted(set(report.missing_labeled + report.missing_unlabeled))


def every_dataset_file() -> list[tuple[str, str]]:
    from raybench.data.wilds.adapter import SPECS

    empty = Path("/nonexistent-raybench-root")
    return [(name, path) for name in SPECS for path in fixed_files(name, empty)]


@pytest.mark.parametrize("name, path", every_dataset_file())
def test_a_fifo_where_a_dataset_file_belongs_is_refused_without_opening_it(name, path, tmp_path, capsys):
    root = tmp_path / "wilds"
    fifo = root / path
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    result = within(30, lambda: cli(["data", "check", name, "--root", str(root)], capsys), [fifo])
    line = refused(result, f"data check {name}: '{fifo}' is a FIFO (named pipe), not a regular file")
    assert "replace it with the file itself" in line


@pytest.mark.parametrize("make, kind", [
    (lambda path: path.mkdir(), "a folder"),
    (lambda path: os.mkfifo(path), "a FIFO (named pipe)"),
])
def test_a_metadata_table_that_is_no_file_is_named_and_a_fifo_patch_counts_as_missing(make, kind, tmp_path, capsys):
    folder = tmp_path / "wilds" / "camelyon17_v1.0"
    (folder / "patches" / "patient_004_node_4").mkdir(parents=True)
    (folder / "RELEASE_v1.0.txt").write_text("")
    metadata = folder / "metadata.csv"
    make(metadata)
    refused(cli(["data", "check", "camelyon17", "--root", str(tmp_path / "wilds")], capsys),
            f"data check camelyon17: '{metadata}' is {kind}, not a regular file")
    if kind == "a folder":
        metadata.rmdir()
    else:
        metadata.unlink()
    metadata.write_text("patient,node,x_coord,y_coord\n004,4,1,2\n004,4,3,4\n")
    patches = folder / "patches" / "patient_004_node_4"
    os.mkfifo(patches / "patch_patient_004_node_4_x_1_y_2.png")
    (patches / "patch_patient_004_node_4_x_3_y_4.png").write_bytes(b"png")
    fifos = [patches / "patch_patient_004_node_4_x_1_y_2.png"]
    result = within(30, lambda: cli(["data", "check", "camelyon17", "--root", str(tmp_path / "wilds")], capsys), fifos)
    assert result.returncode == 1, result.stderr
    assert "camelyon17_v1.0/patches/patient_004_node_4/patch_patient_004_node_4_x_1_y_2.png" in result.stdout
    assert "x_3_y_4" not in result.stdout


def test_a_root_that_is_a_fifo_or_a_file_is_refused(tmp_path, capsys):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "file").write_text("x")
    for root, kind in (("pipe", "a FIFO (named pipe)"), ("file", "a file")):
        result = within(30, lambda root=root: cli(["data", "check", "camelyon17", "--root", root], capsys),
                        [tmp_path / "pipe"])
        refused(result, f"--root: expected the WILDS root folder, got '{root}', which is {kind}")


# ----- a sweep stopped before it started -------------------------------------------------------------------
def test_a_sweep_stopped_while_ray_starts_offers_no_resume_that_would_be_refused(capsys, tmp_path, monkeypatch):
    from raybench.sweep import ray_backend

    def stopped(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(ray_backend, "connect", stopped)
    result = cli(SMOKE, capsys)
    assert result.returncode == 130, result.stderr[-2000:]
    assert result.stderr.strip() == ("raybench: sweep 'erm-digits-shift-seed0-smoke' interrupted before it started: "
                                     "nothing was recorded under --storage, so there is nothing to resume; start it "
                                     "again with: raybench sweep erm --smoke")
    # That command is accepted: it goes on to start Ray again (a --resume would have been refused).
    def reached(*args: Any, **kwargs: Any) -> None:
        raise ReachedRay

    monkeypatch.setattr(ray_backend, "connect", reached)
    with pytest.raises(ReachedRay):
        cli(SMOKE, capsys)
    refused(cli([*SMOKE, "--resume"], capsys), "--resume: no sweep named 'erm-digits-shift-seed0-smoke'")


def test_a_sweep_stopped_once_its_folder_exists_offers_the_resume(capsys, tmp_path, monkeypatch):
    from raybench.sweep import runner

    def started_then_stopped(prepared: Any, recorder: Any) -> None:
        (prepared.storage / f"{prepared.name}-search").mkdir(parents=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_sweep", started_then_stopped)
    result = cli(SMOKE, capsys)
    assert result.returncode == 130
    assert result.stderr.strip() == "raybench: sweep interrupted; resume with: raybench sweep erm --smoke --resume"


@pytest.fixture
def a_benchmark_file(tmp_path) -> Path:
    import yaml

    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump({"name": "b", "selection": "ood_val", "trials": 1, "replicates": 1, "smoke": True,
                                    "grid": [{"datasets": ["digits-shift"], "spaces": ["erm"]}]}, sort_keys=False))
    return path


@pytest.mark.parametrize("recorded", [False, True], ids=["before-its-record", "once-recorded"])
def test_a_benchmark_stopped_offers_its_resume_only_once_it_has_a_record(recorded, a_benchmark_file, capsys,
                                                                        tmp_path, monkeypatch):
    from raybench.commands import benchmark

    def stopped(bench: Any, options: Any) -> None:
        if recorded:
            state = benchmark.bench_dir(options.storage, bench) / benchmark.STATE_FILE
            state.parent.mkdir(parents=True)
            state.write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(benchmark, "run_benchmark", stopped)
    result = cli(["benchmark", "bench.yaml"], capsys)
    assert result.returncode == 130, result.stderr[-2000:]
    if recorded:
        assert result.stderr.strip() == "raybench: benchmark interrupted; resume with: raybench benchmark bench.yaml --resume"
    else:
        assert result.stderr.strip() == ("raybench: benchmark interrupted before it started: nothing was recorded under "
                                         "--storage, so there is nothing to resume; start it again with: raybench "
                                         "benchmark bench.yaml")
