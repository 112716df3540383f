"""Commands that only read declarations or records start without the heavy packages: each runs in a fresh
interpreter, as a shell starts it, and the test reads which of torch, Ray and MLflow that process imported.
It times nothing; an import is what costs the seconds (torch alone takes several), and an import is what a
change brings back.

What each command may not import is what it does not import today. Still imported, and why:
- `list datasets`, `list settings`, `space new`: torch, on their first run for a version of the code, since
  every algorithm's `Hparams` lives in its module beside the torch code and SpuCo's variants and the WILDS
  datasets register in loops; what they print depends on the code alone, so later runs read it from the code's
  memo (raybench.code_memo) and import none of the three. Each is run twice here, and the second run must print
  what the first computed;
- `space show`, `space draw`: torch, since they load the dataset;
- `results`, `compare`: MLflow, which reads the tracking store (stubbed here, so no store is needed);
  scipy.stats (about 0.4 s) only where they compute with it: `compare --stats`, and `results` for a sweep with
  enough trials to rate importances that did not keep them in its summary (fANOVA imports it, and scikit-learn);
  a sweep keeps what it rated, and `results` of such a sweep imports neither.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from raybench.records import Replicates, Selection, SweepState, SweepSummary, TrialRecord, TrialStatus

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "ray", "mlflow")

# Runs `raybench ARGV` through main() and prints its exit status, stderr and which HEAVY packages it imported.
# Given a summary file, `results` and `compare` read that sweep instead of asking a tracking store.
PROBE = """
import contextlib, io, json, sys
argv, summary_file = json.loads(sys.argv[1]), sys.argv[2]
if summary_file:
    import raybench.tracking as tracking
    from raybench.records import SweepSummary
    summary = SweepSummary.from_json(json.loads(open(summary_file).read()))
    tracking.load_sweep_results = lambda uri, name: summary
    tracking.find_sweeps = lambda *args: [tracking.SweepRecord(summary.name, summary.dataset, summary.algorithm,
                                                               "finished", summary)]
from raybench.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    code = main(argv)
heavy = sorted(name for name in ("torch", "ray", "mlflow", "scipy.stats", "sklearn") if name in sys.modules)
print(json.dumps({"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "imported": heavy}))
"""

CASES = [
    (["list", "algorithms"], HEAVY),
    (["list", "models"], HEAVY),
    (["list", "datasets"], HEAVY),
    (["list", "settings", "dann"], HEAVY),
    (["list", "settings"], HEAVY),
    (["space", "new", "dann"], HEAVY),
    (["space", "show", "erm"], ("ray", "mlflow")),
    (["space", "draw", "dann", "--trials", "3"], ("ray", "mlflow")),
    (["results", "demo", "--tracking-uri", "sqlite:///unused.db"], ("torch", "ray")),  # rates importances: fANOVA
    (["compare", "--tracking-uri", "sqlite:///unused.db"], ("torch", "ray", "scipy.stats")),
    (["compare", "--stats", "--tracking-uri", "sqlite:///unused.db"], ("torch", "ray")),
]


def recorded_sweep(path: Path, kept_importances: bool = False) -> Path:
    """A finished sweep's summary, as `results` and `compare` read it back from the store: as a sweep wrote it
    before it kept its importances, or (`kept_importances`) with them."""
    trials = [TrialRecord(order=i, trial_id=f"t{i}", seed=0, status=TrialStatus.OK, sampled={"lr": 10.0 ** -i},
                          selection_value=0.5 + i / 10) for i in range(1, 4)]
    summary = SweepSummary(name="demo", dataset="digits-shift", algorithm="erm", state=SweepState.FINISHED,
                           space_scales={"lr": "log"}, selection=Selection("ood_val", "val/acc", "OOD val"),
                           trials=trials, replicates=Replicates())
    if kept_importances:
        from raybench.report.importance import importances

        summary.importances = importances(summary)
    path.write_text(json.dumps(summary.to_json()))
    return path


def command_words(argv: list[str]) -> str:
    return " ".join(itertools.takewhile(lambda word: not word.startswith("-"), argv)) + (" --stats" if "--stats" in argv else "")


# Commands whose text is the code's alone, kept in the code memo after their first run.
MEMOIZED = {"list datasets", "list settings", "space new"}


def run_probe(argv: list[str], summary: Path | str, cwd: Path, env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), str(summary)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout.splitlines()[-1])
    assert ran["code"] == 0, ran["stderr"]
    return ran


@pytest.mark.parametrize("argv, forbidden", CASES, ids=[command_words(argv) for argv, _ in CASES])
def test_a_command_that_reads_declarations_imports_no_heavy_package(argv, forbidden, tmp_path, shared_data_dir):
    summary = recorded_sweep(tmp_path / "summary.json") if argv[0] in ("results", "compare") else ""
    env = {**os.environ, "RAYBENCH_DATA_DIR": str(shared_data_dir), "PYTHONPATH": str(REPO),  # this checkout's
           "RAYBENCH_CACHE_DIR": str(tmp_path / "memo")}
    env.pop("MLFLOW_TRACKING_URI", None)
    ran = run_probe(argv, summary, tmp_path, env)
    if " ".join(argv[:2]) in MEMOIZED:  # the first run computed the text; the second reads it
        first, ran = ran, run_probe(argv, summary, tmp_path, env)
        assert ran["stdout"] == first["stdout"] != ""
    assert [name for name in ran["imported"] if name in forbidden] == []


def test_results_of_a_sweep_that_kept_its_importances_fits_no_forest(tmp_path):
    """The same three-trial sweep as `results demo` above, with the importances it rated kept in its summary:
    `results` prints them without importing fANOVA's scikit-learn or scipy.stats."""
    summary = recorded_sweep(tmp_path / "summary.json", kept_importances=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAYBENCH_CACHE_DIR": str(tmp_path / "memo")}
    env.pop("MLFLOW_TRACKING_URI", None)
    ran = run_probe(["results", "demo", "--tracking-uri", "sqlite:///unused.db"], summary, tmp_path, env)
    assert "hyperparameter importance for val/acc" in ran["stdout"]
    assert [name for name in ran["imported"] if name in ("torch", "ray", "scipy.stats", "sklearn")] == []
