"""Tools for writing search spaces: a starting file for an algorithm (`raybench space new`), what a space becomes
on a dataset (`raybench space show`) and the exact configs a sweep with a seed will run (`raybench space draw`),
all without Ray and without training."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

import pandas as pd
import yaml

from raybench.algorithms import ALGORITHMS, Algorithm
from raybench.budget import ratio_text
from raybench.data.base import ShiftDataset
from raybench.settings import SettingInfo, settings_of
from raybench.sweep.sampling import config_key, draw_configs
from raybench.sweep.space import Derived, Param, ResolvedSpace, SearchSpace
from raybench.trainer.config import TrainConfig


@dataclass(frozen=True)
class DrawnTrial:
    order: int  # 1-based, the order the sweep's searcher hands the configs out
    sampled: dict[str, Any]
    derived: dict[str, Any]
    repeat_of: int | None = None  # a grid ran out: the sweep replays that trial's record, it trains nothing new


def draw(resolved: ResolvedSpace, count: int, seed: int) -> list[DrawnTrial]:
    """The first `count` configs of a random search with `seed`, with the values derived from each."""
    if not resolved.search:
        return [DrawnTrial(1, {}, _derived(resolved, {}))]
    drawn = draw_configs(resolved.search, count, seed)
    first = {}
    for i, sampled in enumerate(drawn):
        first.setdefault(config_key(sampled), i + 1)
    return [DrawnTrial(i + 1, sampled, _derived(resolved, sampled),
                       first[config_key(sampled)] if first[config_key(sampled)] != i + 1 else None)
            for i, sampled in enumerate(drawn)]


def _derived(resolved: ResolvedSpace, sampled: dict[str, Any]) -> dict[str, Any]:
    config = resolved.materialize(sampled)
    return {name: config[name] for name in resolved.derived}


def draws_text(trials: list[DrawnTrial], fmt_name: str) -> str:
    if fmt_name == "json":
        return json.dumps([dataclasses.asdict(t) for t in trials], indent=2)
    repeats = any(t.repeat_of for t in trials)
    frame = pd.DataFrame([{"trial": t.order, **{k: _short(v) for k, v in t.sampled.items()},
                           **{f"{k} (derived)": v for k, v in t.derived.items()},
                           **({"note": f"repeat of {t.repeat_of}" if t.repeat_of else ""} if repeats else {})}
                          for t in trials])
    text = frame.to_string(index=False)
    if repeats:
        text += ("\n\nThe space ran out of distinct configs: a repeat is replayed from the first run's record, "
                 "not trained again.")
    return text


def _short(value: Any) -> Any:
    return float(f"{value:.4g}") if isinstance(value, float) else value


def describe(space: SearchSpace, resolved: ResolvedSpace, dataset: ShiftDataset | None = None) -> str:
    """The space after the dataset's overrides and the derived rules, every distribution with its bounds, and
    (given the dataset) the budget a trial gets at each unlabeled ratio, before anything runs."""
    lines = [f"space {space.path}: {space.algorithm} on {resolved.dataset}"]
    lines += [space.description] if space.description else []
    override = space.datasets.get(resolved.dataset)
    lines.append(f"dataset overrides: {_override_text(override)}" if override else
                 f"dataset overrides: none for {resolved.dataset}")
    written = {**space.search, **(override or {}).get("search", {})}  # as the file says, after the dataset's part
    if any(written[name].distribution == "lr" for name in resolved.search):
        lines += ["", (f"lr centre r = {resolved.lr_center:.4g} (the dataset's lr scaled to this space's batch size x "
                      f"gradient accumulation, WILDS 2.0 App. D)")]
    lines += ["", "searched:"]
    lines += [f"  {name:22s} {_param_text(written.get(name), param)}" for name, param in resolved.search.items()]
    lines += ["  (nothing: one config, run once)"] if not resolved.search else []
    lines += ["", "fixed:"] + [f"  {name:22s} {value!r}" for name, value in sorted(resolved.fixed.items())]
    if resolved.derived:
        lines += ["", "derived:"] + [f"  {name:22s} {_rule_text(rule, resolved)}" for name, rule in resolved.derived.items()]
    if dataset is not None:
        lines += ["", *budget_lines(resolved, dataset)]
    return "\n".join(lines)


def budget_lines(resolved: ResolvedSpace, dataset: ShiftDataset) -> list[str]:
    """The budget table of `space show`: what a trial plans at each unlabeled ratio k (its other sampled values
    do not change it), its steps over ERM's at the same epoch share (about 2 with unlabeled data), and over what
    the WILDS rule gives the method (1.00 = the protocol's budget)."""
    rows = []
    for k in _ratios(resolved):
        config = TrainConfig.from_flat(resolved.materialize(_budget_sample(resolved, k))).resolve(dataset)
        budget = config.budget(dataset)
        rows.append({"k": k if ALGORITHMS.get(resolved.algorithm).uses_unlabeled else "-", "epochs": config.epochs,
                     "steps": budget.steps, "optimizer steps": budget.optimizer_steps,
                     "labeled ex.": budget.labeled_examples, "unlabeled ex.": budget.unlabeled_examples,
                     "labeled passes": f"{budget.labeled_passes:.2f}", "x ERM": ratio_text(budget.erm_ratio),
                     "x protocol": ratio_text(budget.protocol_ratio)})
    lines = ["budget per trial (steps: batches; the trial's own training, not its cached stages):"]
    lines += ["  " + line for line in pd.DataFrame(rows).to_string(index=False).splitlines()]
    if resolved.epochs_scale != 1:  # an attempt of `sweep --converge`: off the protocol's budget on purpose
        lines.append(f"  every config's epochs x{resolved.epochs_scale:g} (an attempt of `sweep --converge`): x ERM "
                     f"and x protocol are against the dataset's own {dataset.defaults.epochs} epochs")
    elif any(float(r["x protocol"]) < 0.9 or float(r["x protocol"]) > 1.1 for r in rows):
        lines.append("  NOT the protocol's budget: a flat max_steps_per_epoch or fixed epochs break the WILDS ratios; "
                     "shorten runs with epoch_fraction instead")
    note = ALGORITHMS.get(resolved.algorithm).budget_note
    if note:
        lines.append(f"  {resolved.algorithm}: {note}")
    return lines


def _ratios(resolved: ResolvedSpace) -> list[int]:
    param = resolved.search.get("unlabeled_ratio")
    if param is not None and param.distribution == "choice":
        return [int(v) for v in param.values]
    return [int(resolved.fixed.get("unlabeled_ratio") or 0)]


def _budget_sample(resolved: ResolvedSpace, k: int) -> dict[str, Any]:
    """A sampled config at ratio `k` (k 0: the dataset's ratio); other searched values at a bound, as they do not
    change the budget."""
    sample: dict[str, Any] = {name: (p.values[0] if p.distribution == "choice" else p.low)
                              for name, p in resolved.search.items()}
    if k:
        sample["unlabeled_ratio"] = k
    else:
        sample.pop("unlabeled_ratio", None)
    return sample


def _override_text(override: dict[str, Any]) -> str:
    parts = []
    for section, values in override.items():
        if not values:
            continue
        shown = ", ".join(f"{k}={_plain_text(v)}" for k, v in values.items())
        parts.append(f"{section} {shown}")
    return "; ".join(parts)


def _plain_text(value: Any) -> str:
    if isinstance(value, Param):
        return value.distribution
    if isinstance(value, Derived):
        return value.rule
    return repr(value)


def _param_text(written: Param | None, param: Param) -> str:
    if param.distribution == "choice":
        return f"choice of {', '.join(repr(v) for v in param.values)}"
    kind = {"loguniform": "log-uniform", "uniform": "uniform"}[param.distribution]
    text = f"{kind} on [{param.low:.4g}, {param.high:.4g}]"
    if written is not None and written.distribution == "lr":
        text += f"  (lr: r x 10^U(-{written.decades:g}, {written.decades:g}))"
    return text


def _rule_text(rule: Derived, resolved: ResolvedSpace) -> str:
    if "unlabeled_ratio" in resolved.search and resolved.search["unlabeled_ratio"].distribution == "choice":
        ratios = list(resolved.search["unlabeled_ratio"].values)
    else:
        ratios = [resolved.fixed.get("unlabeled_ratio") or 1]
    values = ", ".join(f"{resolved.materialize({'unlabeled_ratio': k})[rule.name]} (k={k})" for k in ratios)
    raised = f" (raised x{resolved.epochs_scale:g})" if resolved.epochs_scale != 1 else ""
    return (f"ceil({rule.factor:g} x E / (k + 1)) with E = {resolved.default_epochs} epochs{raised} and k the unlabeled "
            f"ratio: {values}")


# ----- raybench space new -----------------------------------------------------------------------
UNLABELED_RATIOS = (3, 7, 15)  # WILDS 2.0 App. D
UNLABELED_GRAD_ACCUM = 4  # the paper's accumulation steps for methods that use unlabeled data (App. D)
COMMENT_COLUMN = 44


@dataclass(frozen=True)
class SpaceLine:
    """One `name: value` line of a space file, its comment, and whether it is written commented out (a value
    the dataset supplies unless the space sets it)."""

    name: str
    value: str
    comment: str
    commented_out: bool = False

    def render(self, indent: str) -> str:
        text = f"{'# ' if self.commented_out else ''}{self.name}: {self.value}"
        return f"{indent}{text:{COMMENT_COLUMN - len(indent)}s}  # {self.comment}".rstrip()


def new_space_text(algorithm: str) -> str:
    """A starting search space for `algorithm` (`raybench space new`): the paper's protocol where it applies, each
    hyperparameter with a suggested distribution searched, every other one fixed at its default."""
    cls = ALGORITHMS.get(algorithm)
    settings = settings_of(cls.Hparams)
    search = _search_lines(cls, settings)
    lines = _header_lines(cls, algorithm)
    lines += [f"algorithm: {algorithm}", f"description: {yaml_scalar(_description(cls, search))}"]
    lines += _section("search", search, "nothing is searched: one config")
    lines += _section("fixed", _fixed_lines(cls, settings), "nothing else to fix")
    derived = _derived_lines(cls)
    lines += _section("derived", derived, "") if derived else []
    # No per-dataset overrides: the paper's accumulation holds on every dataset, digits-shift included (the
    # shipped spaces no longer drop it there, so a sweep's budget matches WILDS 2.0 App. D).
    return "\n".join(lines) + "\n"


def _header_lines(cls: type[Algorithm], algorithm: str) -> list[str]:
    lines = [f"# A starting search space for {algorithm}, written by `raybench space new {algorithm}`.",
             "# Check it with `raybench space show FILE --dataset D`, then `raybench sweep FILE --smoke`;",
             "# the format is documented in raybench/search_spaces/README.md."]
    if cls.dataset_settings:
        lines.append(f"# {algorithm} runs only on datasets that declare {cls.dataset_settings} "
                     f"(algorithm_hparams.{algorithm}).")
    return lines


def _description(cls: type[Algorithm], search: list[SpaceLine]) -> str:
    summary = (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")
    searched = ", ".join(line.name for line in search) or "nothing"
    return f"{summary}; searched: {searched}."


def _search_lines(cls: type[Algorithm], settings: list[SettingInfo]) -> list[SpaceLine]:
    lines = []
    if cls.trains_by_gradient:
        lines.append(SpaceLine("lr", "{distribution: lr}", "r x 10^U(-1, 1), r the dataset's lr scaled to the "
                                                           "batch (WILDS 2.0 App. D)"))
    if cls.uses_unlabeled:
        lines.append(SpaceLine("unlabeled_ratio", flow({"distribution": "choice", "values": list(UNLABELED_RATIOS)}),
                               "k unlabeled per labeled example (App. D)"))
    lines += [SpaceLine(s.name, flow(s.suggest.as_space()), _setting_comment(s)) for s in settings if s.suggest]
    return lines


def _fixed_lines(cls: type[Algorithm], settings: list[SettingInfo]) -> list[SpaceLine]:
    lines = []
    if cls.models is not None:
        models = sorted(cls.models)
        lines.append(SpaceLine("model", models[0], f"{cls.name} runs on {' or '.join(models)} only"))
    if cls.uses_unlabeled:
        lines.append(SpaceLine("grad_accum", str(UNLABELED_GRAD_ACCUM), "the paper's accumulation for methods that "
                                                                        "use unlabeled data (App. D)"))
    for s in settings:
        if s.suggest:
            continue
        comment = _setting_comment(s) + ("; the dataset's own unless set here" if s.per_dataset else "")
        lines.append(SpaceLine(s.name, yaml_scalar(s.default), comment, commented_out=s.per_dataset))
    return lines


def _setting_comment(setting: SettingInfo) -> str:
    return f"{setting.type}, default {yaml_scalar(setting.default)}; {setting.allowed}"


def _derived_lines(cls: type[Algorithm]) -> list[SpaceLine]:
    lines = []
    if cls.trains_by_gradient:
        lines.append(SpaceLine("batch_size", "{rule: max_batch_size}", "WILDS datasets: MAX_BS of the paper's "
                                                                       "sweep (App. D); others: their default batch"))
    if cls.uses_unlabeled:
        factor = f"{cls.ratio_epochs_factor:g}"
        lines.append(SpaceLine("epochs", f"{{rule: ratio_epochs, factor: {factor}}}",
                               f"ceil({factor} E / (k + 1)): compute about constant across k"))
    return lines


def _section(name: str, lines: list[SpaceLine], when_empty: str) -> list[str]:
    if not lines:
        return [f"{name}: {{}}  # {when_empty}"]
    return [f"{name}:"] + [line.render("  ") for line in lines]


def flow(mapping: dict[str, Any]) -> str:
    """A one-line YAML mapping: {distribution: choice, values: [3, 7, 15]}."""
    def value_text(value: Any) -> str:
        return "[" + ", ".join(yaml_scalar(v) for v in value) + "]" if isinstance(value, list) else yaml_scalar(value)

    return "{" + ", ".join(f"{key}: {value_text(value)}" for key, value in mapping.items()) + "}"


def yaml_scalar(value: Any) -> str:
    """One scalar as YAML writes it (null, true, 1.0e-05, a quoted string where plain text would misread)."""
    return yaml.safe_dump([value], default_flow_style=True, width=1 << 20).strip()[1:-1]
