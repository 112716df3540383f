"""Which searched hyperparameters matter for a sweep's selection metric, from the trials it already ran.

`importances(summary)` rates each searched hyperparameter with fANOVA (Hutter et al. 2014, Optuna's
FanovaImportanceEvaluator, seeded, so the same summary always gives the same numbers). fANOVA, not PED-ANOVA:
PED-ANOVA contrasts the best 10 % of trials with the rest and wants at least 5 trials in that top, 50 in all; a
sweep here runs 10 to 30, and fANOVA fits its random forest to every one of them.

Nothing is re-run and no space file is read: an Optuna study is built from the summary's records, so the chart
beside the sweep, `raybench results` and `raybench compare` compute the same numbers from the same file. The
space a summary names may have changed or moved since the sweep, and resolving its `lr` bounds needs the dataset
(and torch); the records say what was drawn. Each parameter's distribution is the range it took over the counted
trials, on the scale the space sampled it (`space_scales`): a log-uniform parameter is rated on log10 of its
values, as it was drawn (Optuna's fANOVA works on raw values, where 1e-5..1e-1 would be weighed by its top
decade), a choice, a string or a bool as a category.

Which trials count: those that finished, to their end or stopped early by ASHA, with a finite selection value.
A trial ASHA stopped counts with its value at its best epoch before the stop, as selection counts it; it trained
fewer epochs, so its value may understate what a full run reaches, and the notes say how many there were.

The importance of a parameter is its share of the summed main effects (the shares add to 1; interactions are
left out, and a note says how much of the forest's variance the main effects explain). A parameter that took one
value, or a sweep with fewer than MIN_TRIALS counted trials, gets no importance but the reason. Under
ROUGH_BELOW trials the importances are shown with a note that they are rough.
"""
from __future__ import annotations

import json
import math
import warnings
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from raybench.records import Importances, ParamImportance, SweepSummary, TrialRecord, TrialStatus, is_finite_number

LOG, LINEAR, CATEGORICAL = "log", "linear", "categorical"  # Param.scale's words (raybench.settings.Distribution)
SEED = 0  # the forest's seed: one summary, one set of numbers
N_TREES = 64  # Optuna's default
MIN_TRIALS = 3  # fewer counted trials: no importance at all
ROUGH_BELOW = 30  # fewer counted trials: importances shown, and said to be rough
EVALUATOR = f"fANOVA (Optuna FanovaImportanceEvaluator, {N_TREES} trees, seed {SEED})"


def importances(summary: SweepSummary, scales: Mapping[str, str] | None = None) -> Importances:
    """Each searched hyperparameter's importance for the sweep's selection metric (see the module's docstring);
    `scales` overrides the summary's space_scales (the search plot's scales, so both figures agree)."""
    scales = summary.space_scales if scales is None else scales
    names = sorted({name for trial in summary.trials for name in trial.sampled})
    counted = [t for t in summary.trials if _counts(t) and all(name in t.sampled for name in names)]
    found = Importances(summary.selection.metric, EVALUATOR, len(counted), len(summary.trials), (),
                        notes=tuple(caveats(summary, counted)))
    if not names:
        return replace(found, notes=(*found.notes, "nothing was searched"))
    encoded = {name: _Encoded.of(name, [t.sampled[name] for t in counted], scales.get(name)) for name in names}
    params, explained, notes = _rate(encoded, [float(t.selection_value) for t in counted])  # type: ignore[arg-type]
    return replace(found, params=params, explained=explained, notes=(*found.notes, *notes))


def sweep_importances(summary: SweepSummary) -> Importances:
    """The importances the summary keeps (rated once, when the sweep wrote it), else rated now: a summary written
    before they were kept, or one whose trials changed since. Reading them spares `results` and `compare --stats`
    the forest's fit and the imports it needs (Optuna's importance module, scikit-learn)."""
    return summary.recorded_importances or importances(summary)


def caveats(summary: SweepSummary, counted: list[TrialRecord]) -> list[str]:
    """Whether the selection was blind, what was left out, how trials ASHA stopped are counted, and whether so few
    trials make rough numbers. A blind selection comes first: its values never told the configs apart, so a
    forest fit to them rates noise, and a chart shown without `raybench results` beside it must say so."""
    kept = {id(t) for t in counted}
    left = Counter(_left_out_why(t) for t in summary.trials if id(t) not in kept)
    notes = [blind_note(summary.selection_blind)] if summary.selection_blind else []
    notes += ["left out: " + ", ".join(f"{n} {why}" for why, n in sorted(left.items()))] if left else []
    stopped = sum(t.status == TrialStatus.STOPPED for t in counted)
    if stopped:
        notes.append(f"{stopped} trials stopped early (ASHA) count with their best epoch's value; with fewer epochs "
                     "they may understate a full run")
    if MIN_TRIALS <= len(counted) < ROUGH_BELOW:
        notes.append(f"{len(counted)} trials make rough importances: a forest fit to so few points can credit noise; "
                     "trust the order of large shares, not the decimals")
    return notes


def blind_note(why: str) -> str:
    """The caveat for a sweep whose selection could not tell its configs apart (SweepSummary.selection_blind)."""
    return f"the selection was blind ({why}): these shares rate noise, not the hyperparameters"


def _left_out_why(trial: TrialRecord) -> str:
    if not trial.status.selectable:
        return trial.status.value
    return "without a finite value" if not is_finite_number(trial.selection_value) else "without every searched setting"


def _counts(trial: TrialRecord) -> bool:
    return trial.status.selectable and is_finite_number(trial.selection_value)


@dataclass(frozen=True)
class _Encoded:
    """One parameter's values as fANOVA sees them: numbers (log10 of a log-scale one) or categories, with the
    Optuna distribution spanning what the counted trials took."""

    name: str
    scale: str
    values: tuple[Any, ...]
    note: str | None = None

    @classmethod
    def of(cls, name: str, raw: Sequence[Any], scale: str | None) -> _Encoded:
        if not all(is_finite_number(v) for v in raw) or scale not in (LOG, LINEAR, None):
            return cls(name, CATEGORICAL, tuple(_choice(v) for v in raw))
        if scale == LOG and all(v > 0 for v in raw):
            return cls(name, LOG, tuple(math.log10(v) for v in raw))
        why = {None: "the summary records no scale", LOG: "a value <= 0 has no logarithm"}.get(scale)
        return cls(name, LINEAR, tuple(float(v) for v in raw), f"{name} rated on a linear scale: {why}" if why else None)

    @property
    def distinct(self) -> list[Any]:
        return sorted(set(self.values), key=lambda v: (type(v).__name__, str(v)))

    def distribution(self) -> Any:
        from optuna.distributions import CategoricalDistribution, FloatDistribution

        if self.scale == CATEGORICAL:
            return CategoricalDistribution(self.distinct)
        return FloatDistribution(min(self.values), max(self.values))

    def one_value(self) -> str:
        value = self.distinct[0]
        return f"{10 ** value:.4g}" if self.scale == LOG else f"{value:.4g}" if isinstance(value, float) else str(value)


def _rate(encoded: Mapping[str, _Encoded], values: list[float]
          ) -> tuple[tuple[ParamImportance, ...], float | None, list[str]]:
    """fANOVA over the parameters that varied: the rated ones (most important first) and a reason for each one
    that could not be rated; the main effects' summed fraction of the variance; notes on how they were rated."""
    notes = [e.note for e in encoded.values() if e.note]
    if len(values) < MIN_TRIALS:  # first: with no counted trial, no parameter has a value to name
        reasons = {name: f"{len(values)} counted trials: fANOVA needs at least {MIN_TRIALS}" for name in encoded}
    elif len(set(values)) < 2:
        reasons = {name: f"every counted trial scored {values[0]:.4f}: nothing to attribute" for name in encoded}
    else:
        reasons = {name: f"took one value ({e.one_value()}) in the counted trials"
                   for name, e in encoded.items() if len(e.distinct) < 2}
    varied = [name for name in encoded if name not in reasons]
    effects, failure = _safe_main_effects({name: encoded[name] for name in varied}, values) if varied else ({}, None)
    total = sum(effects.values())
    if varied and total <= 0:
        reasons.update({name: failure or "the forest found no main effect" for name in varied})
    rated = sorted((ParamImportance(name, encoded[name].scale, effects[name] / total, effects[name])
                    for name in varied if total > 0), key=lambda p: (-(p.share or 0.0), p.name))
    if len(rated) == 1:
        notes.append(f"only {rated[0].name} could be rated: its share is 1 by construction")
    unrated = [ParamImportance(name, encoded[name].scale, reason=reason) for name, reason in sorted(reasons.items())]
    return (*rated, *unrated), (min(total, 1.0) if rated else None), notes


def _safe_main_effects(encoded: Mapping[str, _Encoded], values: list[float]) -> tuple[dict[str, float], str | None]:
    """_main_effects, or none and why: the sweep writes summary.md and its figures through here when it ends, and
    an analysis that fails must not cost the sweep its summary.json."""
    try:
        return _main_effects(encoded, values), None
    except Exception as err:  # noqa: BLE001 - any failure of Optuna or scikit-learn becomes a reason, not a crash
        return {}, f"fANOVA failed: {type(err).__name__}: {err}"


def _main_effects(encoded: Mapping[str, _Encoded], values: list[float]) -> dict[str, float]:
    """The fraction of the forest's variance each parameter's main effect explains (fANOVA, not normalised)."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "A new study created" line per call
    study = optuna.create_study(direction="maximize")
    distributions = {name: e.distribution() for name, e in encoded.items()}
    for i, value in enumerate(values):
        params = {name: e.values[i] for name, e in encoded.items()}
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
    evaluator = optuna.importance.FanovaImportanceEvaluator(n_trees=N_TREES, seed=SEED)
    with warnings.catch_warnings():  # normalize=False is marked experimental; the raw fractions are needed here
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        raw = optuna.importance.get_param_importances(study, evaluator=evaluator, normalize=False)
    return {name: max(float(raw.get(name, 0.0)), 0.0) for name in encoded}


def _choice(value: Any) -> Any:
    """A value Optuna accepts as a category: scalars as they are, anything else as its JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return json.dumps(value, sort_keys=True, default=str)



def table_lines(found: Importances) -> list[str]:
    """The text table `raybench results` prints: one row per searched hyperparameter, then the notes."""
    lines = [f"hyperparameter importance for {found.metric}: {found.evaluator}, {found.n_trials} trials"]
    if found.params:
        width = max(len(f"{p.name} ({p.scale})") for p in found.params)
        lines += [f"  {p.name + f' ({p.scale})':<{width}}  {_cell(p)}" for p in found.params]
    return lines + [f"  - {note}" for note in _all_notes(found)]


def markdown_lines(found: Importances) -> list[str]:
    """The same as a Markdown table, for summary.md (the parent run's description)."""
    lines = [f"Hyperparameter importance for `{found.metric}`: {found.evaluator}, {found.n_trials} trials", ""]
    if found.params:
        lines += ["| hyperparameter | scale | share of main effects |", "|---|---|---|"]
        lines += [f"| `{p.name}` | {p.scale} | {_cell(p)} |" for p in found.params]
        lines.append("")
    return lines + [f"- {note}" for note in _all_notes(found)]


def _all_notes(found: Importances) -> list[str]:
    return [found.counted_line, *([found.explained_line] if found.explained_line else []), *found.notes]


def _cell(param: ParamImportance) -> str:
    if param.share is None:
        return f"not rated: {param.reason}"
    return f"{100 * param.share:5.1f}%"
