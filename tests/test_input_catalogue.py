"""Every bad input a user was seen to give: one line naming the thing, exit 2, no traceback, nothing written.

Each case runs the real command line in-process from an empty working directory whose `runs/` (the
default --storage) and `mlflow.db` (the default tracking store) must still not exist afterwards.
"""
from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from raybench.cli import main

TEACHER = ["train", "--algorithm", "noisy_student", "--epochs", "1", "--set", "max_steps_per_epoch=1"]


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, shared_data_dir, monkeypatch):
    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(shared_data_dir))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)


def space(text: str) -> Callable[[Path], list[str]]:
    def write(tmp: Path) -> list[str]:
        (tmp / "space.yaml").write_text(text)
        return ["sweep", str(tmp / "space.yaml")]
    return write


def written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def file_with(data: bytes) -> Callable[[Path], Path]:
    def write(tmp: Path) -> Path:
        (tmp / "teacher.pt").write_bytes(data)
        return tmp / "teacher.pt"
    return write


class RunsCode:
    """An object whose unpickling would run code: a checkpoint must never be loaded that way."""

    def __reduce__(self):
        return (exec, ("open('PWNED', 'w').write('x')",))


def _valid_then_truncated() -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save({"featurizer.weight": torch.zeros(3)}, buffer)
    return buffer.getvalue()[:40]


CASES: dict[str, tuple[Callable[[Path], list[str]], str]] = {
    "space file not UTF-8": (lambda t: ["sweep", str(written(t / "space.yaml", b"algorithm: erm\n# \xff\xfe\n"))],
                             "space.yaml"),
    "fixed lr .inf": (space("algorithm: erm\nfixed:\n  lr: .inf\n"), "fixed.lr"),
    "choice of a bool for lr": (space("algorithm: erm\nsearch:\n  lr: {distribution: choice, values: [true, 0.1]}\n"),
                                "search.lr.values[0]"),
    "override of an unknown dataset": (space("algorithm: erm\ndatasets:\n  nope:\n    fixed: {lr: 0.1}\n"),
                                       "datasets.nope"),
    "duplicate YAML key": (space("algorithm: erm\nfixed:\n  lr: 0.1\n  lr: 0.2\n"), "lr"),
    "sweep --set lr=inf": (lambda t: ["sweep", "erm", "--set", "lr=inf"], "--set lr"),
    "--gpus-per-worker nan": (lambda t: ["sweep", "erm", "--gpus-per-worker", "nan"], "--gpus-per-worker"),
    "--cpus-per-worker inf": (lambda t: ["sweep", "erm", "--cpus-per-worker", "inf"], "--cpus-per-worker"),
    "function executor with 2 workers": (lambda t: ["sweep", "erm", "--executor", "function", "--workers-per-trial", "2"],
                                         "--workers-per-trial"),
    "--storage is a file": (lambda t: ["sweep", "erm", "--storage", str(written(t / "afile", b"x"))], "--storage"),
    "--storage not writable": (lambda t: ["sweep", "erm", "--storage", "/proc/raybench-runs"], "--storage"),
    "--tracking-uri foo://bar": (lambda t: ["sweep", "erm", "--tracking-uri", "foo://bar"], "--tracking-uri"),
    "unwritable sqlite path": (lambda t: ["sweep", "erm", "--tracking-uri", "sqlite:////proc/raybench/mlflow.db"],
                               "--tracking-uri"),
    "--resume of a sweep that never existed": (lambda t: ["sweep", "erm", "--name", "never", "--resume"], "--resume"),
    "--name traversal": (lambda t: ["sweep", "erm", "--name", "../../x"], "--name"),
    "--name absolute": (lambda t: ["sweep", "erm", "--name", str(t / "elsewhere")], "--name"),
    "--name with a quote": (lambda t: ["sweep", "erm", "--name", "it's"], "--name"),
    "--set selection_metric": (lambda t: ["sweep", "erm", "--set", "selection_metric=test/acc"], "--set selection_metric"),
    "--set algorithm": (lambda t: ["sweep", "erm", "--set", "algorithm=dann"], "--set algorithm"),
    "--set dataset": (lambda t: ["sweep", "erm", "--set", "dataset=spuco-digits"], "--set dataset"),
    "sweep model_weights missing": (lambda t: ["sweep", "erm", "--set", f"model_weights={t}/missing.pt"],
                                    "model_weights"),
    "train --output unwritable": (lambda t: ["train", "--output", "/proc/raybench-out"], "--output"),
    "train --set device=cuda without CUDA": (lambda t: ["train", "--set", "device=cuda"], "--set device"),
    "train --set lr=inf": (lambda t: ["train", "--set", "lr=inf"], "--set lr"),
    "train model_weights missing": (lambda t: ["train", "--set", f"model_weights={t}/missing.pt"], "model_weights"),
    "teacher checkpoint missing": (lambda t: [*TEACHER, "--set", f"teacher_checkpoint={t}/none.pt"],
                                   "teacher_checkpoint"),
    "teacher checkpoint truncated": (lambda t: [*TEACHER, "--set", f"teacher_checkpoint={file_with(_valid_then_truncated())(t)}"],
                                     "teacher_checkpoint"),
    "teacher checkpoint of another format": (lambda t: [*TEACHER, "--set",
                                                        f"teacher_checkpoint={file_with(b'not a checkpoint')(t)}"],
                                             "teacher_checkpoint"),
    "teacher checkpoint of another model": (lambda t: [*TEACHER, "--set", ("teacher_checkpoint="
                                                       f"{file_with(_saved({'w': torch.zeros(2)}))(t)}")],
                                            "teacher_checkpoint"),
    "teacher checkpoint that runs code": (lambda t: [*TEACHER, "--set",
                                                     f"teacher_checkpoint={file_with(pickle.dumps(RunsCode()))(t)}"],
                                          "teacher_checkpoint"),
}


def _saved(obj: object) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_writes_nothing(case, tmp_path, capsys):
    build, names = CASES[case]
    argv = build(tmp_path)
    if case.startswith("train --set device=cuda") and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")  # CI and the dev machines have none, so this case always runs there
    assert main(argv) == 2, case
    err = capsys.readouterr().err.strip()
    assert err.startswith("raybench: error: ") and "\n" not in err, err
    assert names in err, err
    assert "Traceback" not in err
    print(f"{case}: {err}")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()
    assert not (tmp_path / "PWNED").exists()


def test_credentials_in_an_unreachable_tracking_uri_are_not_echoed(capsys):
    assert main(["sweep", "erm", "--tracking-uri", "http://alice:s3cret@127.0.0.1:9"]) == 2
    err = capsys.readouterr().err
    assert "s3cret" not in err and "alice" not in err and "***@127.0.0.1:9" in err
