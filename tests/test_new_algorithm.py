"""Adding an algorithm is one module and one YAML (docs/how-to/new-algorithm.md): in a copy of the package, a new
module under raybench/algorithms/ and the space `raybench space new` writes for it are all it takes to appear in
`raybench list algorithms` and to run as a smoke sweep on a real (private) Ray, tracked in a real MLflow store.

The copy is imported through PYTHONPATH, ahead of the editable install; the sweep's private Ray inherits the
driver's environment, so its trial workers import the copy too."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO
from mlflow.tracking import MlflowClient

# Flooding (Ishida et al., ICML 2020, "Do We Need Zero Training Loss After Achieving Zero Training Loss?", eq. 2):
# the training loss is reflected about a flood level b, so gradient descent turns to ascent below b.
FLOODING = '''"""Flooding (Ishida et al., 2020): loss~ = |loss - b| + b."""
from __future__ import annotations

from dataclasses import dataclass

from raybench.algorithms.base import Algorithm, Hparams, StepOutput
from raybench.algorithms.registry import register
from raybench.data.base import Batch, TaskKind
from raybench.settings import NON_NEGATIVE, Suggest, setting


@dataclass
class FloodingHparams(Hparams):
    flood: float = setting(0.05, allowed=NON_NEGATIVE, suggest=Suggest.uniform(0.0, 0.3),
                           help="b, the flood level the training loss is held near")


@register("flooding")
class Flooding(Algorithm):
    """ERM whose loss is reflected about the flood level b: below b its gradient is the negative of ERM's."""

    Hparams = FloodingHparams
    supported_tasks = frozenset({TaskKind.CLASSIFICATION})

    def objective(self, labeled: Batch, unlabeled: Batch | None, step: int) -> StepOutput:
        loss = self.model.fit_loss(self.view(labeled.x, False), labeled.y, self.supervised_loss)
        flooded = (loss - self.hparams.flood).abs() + self.hparams.flood
        return StepOutput(flooded, {"loss/supervised": loss.detach()})
'''


def package_copy(root: Path) -> Path:
    """A copy of the raybench package, its shipped search spaces inside it (package data)."""
    shutil.copytree(REPO / "raybench", root / "raybench", ignore=shutil.ignore_patterns("__pycache__"))
    return root


def raybench(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raybench.cli", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def test_one_module_and_one_yaml_add_an_algorithm_that_lists_and_runs_a_smoke_sweep(tmp_path, sweep_env, store_uri):
    src = package_copy(tmp_path / "src")
    (src / "raybench" / "algorithms" / "flooding.py").write_text(FLOODING)
    env = {**sweep_env, "PYTHONPATH": os.pathsep.join(filter(None, [str(src), sweep_env.get("PYTHONPATH")]))}

    listed = raybench(["list", "algorithms"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert any(line.split()[:1] == ["flooding"] for line in listed.stdout.splitlines()), listed.stdout

    space = src / "raybench" / "search_spaces" / "flooding.yaml"
    written = raybench(["space", "new", "flooding", "--output", str(space)], env, tmp_path)
    assert written.returncode == 0, written.stderr[-2000:]
    assert "flood:" in space.read_text()

    swept = raybench(["sweep", "flooding", "--smoke", "--executor", "function", "--trials", "1", "--replicates", "0",
                      "--name", "flood", "--storage", str(tmp_path / "runs"), "--tracking-uri", store_uri], env, tmp_path)
    assert swept.returncode == 0, swept.stderr[-4000:]
    summary = json.loads((tmp_path / "runs" / "flood" / "results" / "summary.json").read_text())
    assert summary["algorithm"] == "flooding" and [t["status"] for t in summary["trials"]] == ["ok"]
    assert set(summary["trials"][0]["sampled"]) == {"lr", "flood"}
    client = MlflowClient(tracking_uri=store_uri)
    [trial] = client.search_runs([client.get_experiment_by_name("raybench").experiment_id], "tags.stage = 'search'")
    assert float(trial.data.params["flood"]) == summary["trials"][0]["sampled"]["flood"]
    assert "train/loss/supervised" in trial.data.metrics  # logged by the new module's objective
