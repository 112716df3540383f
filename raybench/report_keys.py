"""The names a run's reports and records use, declared once.

The trainer writes them, the Ray worker and driver carry them through Tune's results, and results, compare,
plots and tracking read them back from a sweep's records; every part imports the name from here instead of
spelling the string itself."""
from __future__ import annotations

SELECTION_BEST = "selection/best"  # the best selection value so far: what Tune's searcher and schedulers rank
BEST_PREFIX = "best/"  # a trial's metrics at its selected (best) epoch
REPLICATES_PREFIX = "replicates/"  # a sweep's parent run: `replicates/<key>/mean` and `/std` over its replicates
INFO_PREFIX = "info/"  # facts a run reports about itself (its node, why its selection is blind), not measurements
TIME_PREFIX = "time/"  # seconds a run used, by part

WALL_S = f"{TIME_PREFIX}wall_s"
CPU_S = f"{TIME_PREFIX}cpu_s"
GPU_S = f"{TIME_PREFIX}gpu_s"
# Wall-clock stamps a trial's reports carry for the driver's start-up and teardown shares: moments, not seconds
# used, so never logged to MLflow as metrics nor averaged over replicates.
TRAINER_STARTED_AT = f"{TIME_PREFIX}trainer_started_at"
REPORTED_AT = f"{TIME_PREFIX}reported_at"
CLOCK_STAMPS = frozenset({TRAINER_STARTED_AT, REPORTED_AT})
NODE = f"{INFO_PREFIX}node"  # the Ray node an epoch ran on (rank 0's), as it names itself
BLIND_INFO = f"{INFO_PREFIX}selection_blind"
NOTE_INFO = f"{INFO_PREFIX}selection_note"
# The trainer's facts about what its selected epoch can be trusted for (raybench.trainer.health), by fact name.
CONVERGENCE_FACT = "not_converged"  # why its best epoch came too late
PSEUDO_FACT = "pseudo_labels"  # its selected epoch's pseudo-labels, in words
COLLAPSE_FACT = "pseudo_labels_collapsed"  # why they count as collapsed onto a class; "" when they do not
CONVERGENCE_INFO = f"{INFO_PREFIX}{CONVERGENCE_FACT}"
PSEUDO_INFO = f"{INFO_PREFIX}{PSEUDO_FACT}"
COLLAPSE_INFO = f"{INFO_PREFIX}{COLLAPSE_FACT}"

# What a self-training algorithm logs each step (the trainer averages them over the epoch, as `train/<name>`): the
# share of its unlabeled rows it pseudo-labelled, and its kept pseudo-labels per class (a vector, one metric each).
PSEUDO_KEPT = "pseudo/kept"
PSEUDO_CLASSES = "pseudo/classes"
# The train log a run also reports at its best epoch (as `best/train/pseudo/kept`), beside its evaluation metrics:
# `compare` shows it beside a self-training row's accuracy.
KEPT_AT_BEST = f"train/{PSEUDO_KEPT}"

STAGE_WEIGHTS_FACT = "weights"  # the stage fact naming its cached weights file (tracking uploads it as an artifact)

# The fact a run carries when its selection metric never moved: choosing an epoch by it chose nothing.
SELECTION_BLIND = "selection metric constant: selection is blind"

# A sweep's results/summary.json says which shape it has. Version 1 added the key itself; a summary without it
# was written before (version 0) and has the same keys, so both load. A reader refuses a newer one by name.
SCHEMA_VERSION = "schema_version"
SUMMARY_SCHEMA = 1
