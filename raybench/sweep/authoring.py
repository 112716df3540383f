"""Tools for writing search spaces: what a space becomes on a dataset (`raybench space show`) and the exact
configs a sweep with a seed will run (`raybench space draw`), both without Ray and without training."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Optional

import pandas as pd

from raybench.sweep.sampling import config_key, draw_configs
from raybench.sweep.space import Derived, Param, ResolvedSpace, SearchSpace


@dataclass(frozen=True)
class DrawnTrial:
    order: int  # 1-based, the order the sweep's searcher hands the configs out
    sampled: dict[str, Any]
    derived: dict[str, Any]
    repeat_of: Optional[int] = None  # a grid ran out: the sweep replays that trial's record, it trains nothing new


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


def describe(space: SearchSpace, resolved: ResolvedSpace) -> str:
    """The space after the dataset's overrides and the derived rules, every distribution with its bounds."""
    lines = [f"space {space.path}: {space.algorithm} on {resolved.dataset}"]
    lines += [space.description] if space.description else []
    override = space.datasets.get(resolved.dataset)
    lines.append(f"dataset overrides: {_override_text(override)}" if override else
                 f"dataset overrides: none for {resolved.dataset}")
    written = {**space.search, **(override or {}).get("search", {})}  # as the file says, after the dataset's part
    if any(written[name].distribution == "lr" for name in resolved.search):
        lines += ["", f"lr centre r = {resolved.lr_center:.4g} (the dataset's lr scaled to this space's batch size x "
                      f"gradient accumulation, WILDS 2.0 App. D)"]
    lines += ["", "searched:"]
    lines += [f"  {name:22s} {_param_text(written.get(name), param)}" for name, param in resolved.search.items()]
    lines += ["  (nothing: one config, run once)"] if not resolved.search else []
    lines += ["", "fixed:"] + [f"  {name:22s} {value!r}" for name, value in sorted(resolved.fixed.items())]
    if resolved.derived:
        lines += ["", "derived:"] + [f"  {name:22s} {_rule_text(rule, resolved)}" for name, rule in resolved.derived.items()]
    return "\n".join(lines)


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
    return (f"ceil({rule.factor:g} x E / (k + 1)) with E = {resolved.default_epochs} epochs and k the unlabeled "
            f"ratio: {values}")
