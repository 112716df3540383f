"""A trial's process imports only what a trial runs: Tune pickles each trainable in the sweep's process
and unpickles it in every trial process, importing the module of everything it references. The trainables live in
raybench/sweep/ray_trial.py, so that unpickling one imports neither the driver's backend (ray_backend.py and the
modules it exposes: ray_cluster.py, ray_search.py, ray_callbacks.py, ray_collect.py) nor
Optuna and Tune's searchers (benchmarks/trial_imports.py measures what that saves each trial process)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ray import cloudpickle
from ray.tune import Experiment
from ray.tune.trainable.function_trainable import wrap_function

import raybench
from raybench.sweep.ray_search import RunSpec, make_trainable
from raybench.sweep.ray_trial import Resources
from raybench.sweep.space import ResolvedSpace

SPACE = ResolvedSpace(algorithm="erm", dataset="tiny", search={}, fixed={"lr": 0.01}, derived={},
                      default_epochs=2, lr_center=0.01)
DRIVERS_ONLY = ("raybench.sweep.ray_backend", "raybench.sweep.ray_cluster", "raybench.sweep.ray_search",
                "raybench.sweep.ray_callbacks", "raybench.sweep.ray_collect", "optuna", "ray.tune.search.optuna")
NAMES = {"train": "train_driver", "function": "function_trial"}
UNPICKLE = """
import pickle, sys, json
trainable = pickle.loads(open(sys.argv[1], "rb").read())
print(json.dumps(sorted(sys.modules)))
"""


def _trainable(executor: str, tmp_path: Path) -> object:
    return make_trainable(SPACE, RunSpec("imports", tmp_path, "search", executor, Resources(), 1))


@pytest.mark.parametrize("executor", sorted(NAMES))
def test_unpickling_a_trainable_imports_nothing_of_the_drivers(executor, tmp_path):
    """What Ray's registry ships (the trainable wrapped into a Trainable class, pickled with Ray's cloudpickle),
    unpickled in a fresh interpreter as a trial process does."""
    blob = tmp_path / "trainable.pkl"
    blob.write_bytes(cloudpickle.dumps(wrap_function(_trainable(executor, tmp_path))))
    env = {**os.environ, "PYTHONPATH": str(Path(raybench.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", UNPICKLE, str(blob)], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    modules = set(json.loads(done.stdout.strip().splitlines()[-1]))
    assert [name for name in DRIVERS_ONLY if name in modules] == []
    assert "raybench.sweep.ray_trial" in modules  # what it imports instead


@pytest.mark.parametrize("executor", sorted(NAMES))
def test_a_trainable_keeps_its_name_so_that_an_older_sweep_resumes(executor, tmp_path):
    """Tune names trial folders by the trainable, and `Tuner.restore` refuses one whose name changed."""
    assert Experiment.get_trainable_name(_trainable(executor, tmp_path)) == NAMES[executor]


# What Tune pickles into an experiment's state, by module and name, from the driver's modules: the searchers, the
# scheduler and the callbacks (with the records they hold).
PICKLED_BY_TUNE = {"ray_search": ("CooperativeASHA", "DistinctOptunaSearch", "QueuedSearch"),
                   "ray_callbacks": ("ProgressCallback", "StorageWatch", "TrackingCallback"),
                   "ray_collect": ("RunRecords",)}


@pytest.mark.parametrize("module", sorted(PICKLED_BY_TUNE))
def test_what_tune_saved_under_the_backends_old_module_still_resumes(module):
    """An experiment saved before ray_backend.py was split names each of these raybench.sweep.ray_backend.<name>:
    unpickled on a `--resume`, each is the class the backend now runs."""
    import importlib
    import pickle

    home = importlib.import_module(f"raybench.sweep.{module}")
    for name in PICKLED_BY_TUNE[module]:
        saved = f"craybench.sweep.ray_backend\n{name}\n.".encode()  # the reference pickle wrote for the class
        assert pickle.loads(saved) is getattr(home, name)
