"""Commands that only read declarations or records start without the heavy packages (issue #24): each runs in a
fresh interpreter, as a shell starts it, and the test reads which of torch, Ray and MLflow that process imported.
It times nothing; an import is what costs the seconds (torch alone takes several), and an import is what a
change brings back.

What each command may not import is what it does not import today. Still imported, and why:
- `list datasets`: torch, from the dataset modules, since SpuCo's variants and the WILDS datasets register
  in loops whose names and docstrings only running those modules gives;
- `list settings`, `space new`, `space show`, `space draw`: torch, since every algorithm's `Hparams` lives in
  its module beside the torch code and `space show`/`draw` load the dataset;
- `results`, `compare`: MLflow, which reads the tracking store (stubbed here, so no store is needed).
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
err = io.StringIO()
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
    code = main(argv)
heavy = sorted({name.partition(".")[0] for name in sys.modules} & {"torch", "ray", "mlflow"})
print(json.dumps({"code": code, "stderr": err.getvalue(), "imported": heavy}))
"""

CASES = [
    (["list", "algorithms"], HEAVY),
    (["list", "models"], HEAVY),
    (["list", "datasets"], ("ray", "mlflow")),
    (["list", "settings", "dann"], ("ray", "mlflow")),
    (["space", "new", "dann"], ("ray", "mlflow")),
    (["space", "show", "erm"], ("ray", "mlflow")),
    (["space", "draw", "dann", "--trials", "3"], ("ray", "mlflow")),
    (["results", "demo", "--tracking-uri", "sqlite:///unused.db"], ("torch", "ray")),
    (["compare", "--tracking-uri", "sqlite:///unused.db"], ("torch", "ray")),
]


def recorded_sweep(path: Path) -> Path:
    """A finished sweep's summary, as `results` and `compare` read it back from the store."""
    trials = [TrialRecord(order=i, trial_id=f"t{i}", seed=0, status=TrialStatus.OK, sampled={"lr": 10.0 ** -i},
                          selection_value=0.5 + i / 10) for i in range(1, 4)]
    summary = SweepSummary(name="demo", dataset="digits-shift", algorithm="erm", state=SweepState.FINISHED,
                           space_scales={"lr": "log"}, selection=Selection("ood_val", "val/acc", "OOD val"),
                           trials=trials, replicates=Replicates())
    path.write_text(json.dumps(summary.to_json()))
    return path


def command_words(argv: list[str]) -> str:
    return " ".join(itertools.takewhile(lambda word: not word.startswith("-"), argv))


@pytest.mark.parametrize("argv, forbidden", CASES, ids=[command_words(argv) for argv, _ in CASES])
def test_a_command_that_reads_declarations_imports_no_heavy_package(argv, forbidden, tmp_path, shared_data_dir):
    summary = recorded_sweep(tmp_path / "summary.json") if argv[0] in ("results", "compare") else ""
    env = {**os.environ, "RAYBENCH_DATA_DIR": str(shared_data_dir), "PYTHONPATH": str(REPO)}  # this checkout's
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), str(summary)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    ran = json.loads(done.stdout.splitlines()[-1])
    assert ran["code"] == 0, ran["stderr"]
    assert [name for name in ran["imported"] if name in forbidden] == []
