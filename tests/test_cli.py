"""The command line: happy paths and one clear message (no traceback) for every bad input."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raybench.cli import main


@pytest.fixture(autouse=True)
def private_data_dir(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RAYBENCH_DATA_DIR", str(tmp_path_factory.getbasetemp() / "data"))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--epochs", "0"], "--epochs: expected an integer >= 1, got 0"),
        (["train", "--epochs", "two"], "--epochs: expected an integer >= 1, got 'two'"),
        (["train", "--seed", "-1"], "--seed: expected an integer >= 0, got -1"),
        (["train", "--algorithm", "nope"], "--algorithm: expected one of cb, coral, dann, dfr, dispel, eiil, emix, erm, fixmatch, gb, groupdro, jtt, linear_eval, mlm, newt_probe, noisy_student, pseudolabel, shed, spare, ssa, swav, got 'nope'"),
        (["train", "--dataset", "nope"], "--dataset: unknown dataset 'nope'; known: amazon, camelyon17"),
        (["train", "--set", "lr"], "--set: expected key=value, got 'lr'"),
        (["train", "--set", "lr=fast"], "--set lr: expected float, got 'fast'"),
        (["train", "--set", "lr=-1"], "--set lr: expected a finite positive number, got -1.0"),
        (["train", "--set", "batch_size=1"], "--set batch_size: expected an integer >= 2, got 1"),
        (["train", "--set", "batch_size=3.5"], "--set batch_size: expected int, got '3.5'"),
        (["train", "--algorithm", "erm", "--set", "penalty=1"], "--set penalty: not a setting of the trainer nor a hyperparameter of 'erm'"),
        (["train", "--algorithm", "fixmatch", "--set", "threshold=high"], "--set threshold: expected float, got 'high'"),
        (["train", "--set", "optimizer=adagrad"],
         "--set optimizer: expected one of sgd, adam, adamw, lars, got 'adagrad'"),
        (["train", "--set", "model=vgg"], "--set model: expected one of dabs_transformer, "),
        (["train", "--set", "selection_metric=val/auc"], "--set selection_metric: expected one of"),
        (["train", "--epochs", "2", "--set", "epochs=3"], "--set epochs: use the --epochs flag instead"),
        (["train", "--set", "scheduler=cyclic"],
         "--set scheduler: expected one of step, linear, cosine, fixmatch, constant, got 'cyclic'"),
        (["list", "things"], "invalid choice: 'things'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
    ],
)
def test_bad_input_gets_one_clear_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybench: error: ")
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_huge_bad_value_is_still_one_short_line(capsys):
    """Whatever a flag or file held, the error is one line of at most 1,000 characters plus its length."""
    assert main(["train", "--algorithm", "x" * 100_000]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybench: error: --algorithm: expected one of") and len(err.strip().splitlines()) == 1
    assert len(err) < 1_100 and err.rstrip().endswith(" characters)")


def test_output_that_is_a_file_is_refused(tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["train", "--output", str(target)]) == 2
    assert "--output: expected a directory" in capsys.readouterr().err


def test_list_shows_registered_names(capsys):
    assert main(["list", "algorithms"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert names == ["cb", "coral", "dann", "dfr", "dispel", "eiil", "emix", "erm", "fixmatch", "gb", "groupdro", "jtt",
                     "linear_eval", "mlm", "newt_probe", "noisy_student", "pseudolabel", "shed", "spare", "ssa", "swav"]
    assert main(["list", "datasets"]) == 0
    datasets = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert {"digits-shift", "spuco-digits", "spuco-fashion", "spuco-digits-magnitude-small"} <= set(datasets)


def test_train_prints_epochs_and_ends_with_one_json_line(tmp_path, capsys):
    argv = ["train", "--dataset", "digits-shift", "--algorithm", "dann", "--epochs", "2", "--seed", "1",
            "--set", "max_steps_per_epoch=3", "--set", "penalty=0.5", "--output", str(tmp_path / "run")]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert sum(line.startswith("epoch ") for line in captured.err.splitlines()) == 2
    summary = json.loads(captured.out.strip().splitlines()[-1])
    assert summary["algorithm"] == "dann" and summary["seed"] == 1
    assert set(summary) >= {"best", "final", "best_epoch"}
    assert "test/acc" in summary["best"] and "val/acc" in summary["final"]
    assert (tmp_path / "run" / "state.pt").is_file() and (tmp_path / "run" / "result.json").is_file()


def test_console_script_reports_errors_without_traceback():
    proc = subprocess.run([sys.executable, "-m", "raybench.cli", "train", "--set", "lr=x"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "raybench: error: --set lr: expected float, got 'x'"


def test_a_reader_that_goes_away_ends_the_command_quietly_with_sigpipes_status():
    """`raybench list algorithms | head -1`: the reader closed the pipe before the listing was written. The
    command stops with 128 + SIGPIPE and writes nothing to stderr (no BrokenPipeError traceback)."""
    proc = subprocess.Popen([sys.executable, "-m", "raybench.cli", "list", "algorithms"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and err == "", err
