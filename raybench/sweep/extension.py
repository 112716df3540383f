"""A finished sweep's search made larger: `raybench sweep ... --resume --trials M`, M above the trials it ran.

Tune's restore keeps the searcher an experiment started with, and its sample count, so one Tune experiment cannot
grow (ray-project/ray#18847, #42221). raybench's search is a seeded stream of configs, so a larger search is well
defined without growing one: each extension is its own Tune experiment, NAME-search-to<M>, whose searcher first
replays the trials already run (ray_search.run_extension) and then draws only configs N+1..M. With the random
sampler the replay asks the same seeded sampler for the same N configs again, so config N+1 is exactly the one a
sweep started with `--trials M` would have drawn (raybench.sweep.sampling.draw_configs); with TPE the finished
trials are told to a fresh searcher with their results (Tune's `Searcher.add_evaluated_point`), as Optuna's own
`study.enqueue_trial`/`add_trial` grow a study.

The trial counts a search ran to are its extents, `<storage>/NAME/search.json`, written (atomically) before an
extension's experiment starts, so an extension cut short by a signal resumes as the extension it was. The first
extent is the sweep's own --trials.

After the search the selection is made again over every trial. Where an extension changed it, the earlier choice
is superseded: the summary and the MLflow parent record by which trial, and the new choice's replicates run (each
selected trial has its own replicate experiment, NAME-replicate-<trial id>).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from raybench.paths import write_text_atomically
from raybench.records import TrialRecord
from raybench.sweep import outcome

EXTENTS_FILE = "search.json"
REPLAYED_SAMPLERS = ("random",)  # samplers whose draws do not depend on results: an extension replays them draw for draw
EXTENSION_KEY = "search_extents"  # summary.report's record of an extended search


class ExtentError(ValueError):
    """A --trials that a recorded search cannot be resumed with (fewer than it ran), in one line."""


def extension_suffix(count: int) -> str:
    """The extension experiment's suffix after NAME-search: one experiment per count the search was grown to."""
    return f"-to{count}"


def stage_folders(storage: Path, name: str) -> list[Path]:
    """The Tune experiments of sweep `name` under `storage`: its search, the search's extensions and every
    replicate experiment (the first count's and each later one's)."""
    return [storage / f"{name}-search", *sorted(storage.glob(f"{name}-search-to*")),
            *sorted(storage.glob(f"{name}-replicate-*"))]


def extents_path(storage: Path, name: str) -> Path:
    return storage / name / EXTENTS_FILE


SEARCH_COUNTS, REPLICATE_COUNTS = "extents", "replicates"  # the file's keys: the search's, the replicates' counts


def read_extents(storage: Path, name: str, recorded: int, key: str = SEARCH_COUNTS) -> tuple[int, ...]:
    """The counts the search (or the selected config's replicates, REPLICATE_COUNTS) was run to: the file's, else
    just the count the sweep recorded when it started."""
    counts = _recorded_counts(extents_path(storage, name)).get(key)
    if not isinstance(counts, list) or not counts or not all(isinstance(c, int) and c >= 0 for c in counts):
        return (recorded,)
    return tuple(counts)


def _recorded_counts(path: Path) -> dict[str, Any]:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def write_extents(storage: Path, name: str, extents: tuple[int, ...], key: str = SEARCH_COUNTS) -> None:
    """Record the counts before the extension runs: a signal in the extension leaves it resumable as such."""
    path = extents_path(storage, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, json.dumps({**_recorded_counts(path), key: list(extents)}) + "\n")


def planned_extents(recorded: tuple[int, ...], wanted: int, flag: str = "--trials",
                    what: str = "this sweep's search ran {} trials") -> tuple[int, ...]:
    """The extents a run with `wanted` (--trials, or --replicates) goes through: those recorded, plus `wanted`
    when it is larger. Fewer than already ran is refused: runs already made cannot be taken back."""
    if wanted > recorded[-1]:
        return (*recorded, wanted) if recorded[-1] > 0 else (wanted,)
    if wanted < recorded[-1]:
        grown = f" (extended from {recorded[0]})" if len(recorded) > 1 else ""
        raise ExtentError(f"--resume: {flag}: {what.format(recorded[-1])}{grown}, got {wanted}; give at least "
                          f"{recorded[-1]} (more extends it)")
    return recorded


@dataclass(frozen=True)
class Supersession:
    """An extension that changed the selection: the trial selected over the first `earlier` trials, and the one
    selected over `trials`, with their selection values."""

    earlier: int
    trials: int
    was: str
    was_value: float
    by: str
    by_value: float

    def words(self) -> str:
        return (f"trial {self.was} (best of the first {self.earlier}, {self.was_value:.4f}) superseded by trial "
                f"{self.by} (best of {self.trials}, {self.by_value:.4f})")


def stage_of(trials: list[TrialRecord], count: int) -> list[TrialRecord]:
    """The trials of the search as it stood at `count` trials (extensions number their trials after the earlier)."""
    return [trial for trial in trials if trial.order <= count]


def supersessions(trials: list[TrialRecord], extents: tuple[int, ...]) -> list[Supersession]:
    """Each extension whose selection differs from the one before it, judged by the sweep's own rule
    (outcome.select_best) on the trials as they stood: what an earlier run of the sweep selected."""
    found = []
    for earlier, count in pairwise(extents):
        was, now = outcome.select_best(stage_of(trials, earlier)), outcome.select_best(stage_of(trials, count))
        if was is not None and now is not None and was.trial_id != now.trial_id:
            found.append(Supersession(earlier, count, was.trial_id, float(was.selection_value or 0.0),
                                      now.trial_id, float(now.selection_value or 0.0)))
    return found


def extension_record(extents: tuple[int, ...], trials: list[TrialRecord]) -> dict[str, Any]:
    """What summary.json keeps of an extended search; nothing for a search run once."""
    if len(extents) < 2:
        return {}
    return {EXTENSION_KEY: {"extents": list(extents),
                            "superseded": [asdict(s) for s in supersessions(trials, extents)]}}


def extension_words(record: dict[str, Any]) -> list[str]:
    """The lines `results` prints about an extended search, from summary.report."""
    extended = record.get(EXTENSION_KEY)
    if not isinstance(extended, dict):
        return []
    counts = " -> ".join(str(c) for c in extended.get("extents", []))
    lines = [f"Search: extended ({counts} trials)"]
    for entry in extended.get("superseded", []):
        try:
            lines.append(f"  selection changed: {Supersession(**entry).words()}")
        except TypeError:  # a record from another version: said as stored
            lines.append(f"  selection changed: {entry}")
    if not extended.get("superseded"):
        lines.append("  the selection did not change")
    return lines
