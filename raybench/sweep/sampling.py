"""How a search draws its configs, without Ray: Optuna distributions of a space, the samplers, and the rule
that a search never hands out the same config twice. The sweep's searcher (raybench.sweep.ray_backend) and
`raybench space draw` both use these, so a drawn table is exactly what a sweep with that seed will run."""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from raybench.sweep.space import Param
from raybench.words import SAMPLERS as SAMPLER_NAMES

# Each sampler raybench.words names, by its name (an import-time error if the two ever disagree)
SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed),
}
if tuple(SAMPLERS) != SAMPLER_NAMES:
    raise ImportError(f"raybench.sweep.sampling builds {tuple(SAMPLERS)}, raybench.words names {SAMPLER_NAMES}")
MAX_REDRAWS = 20


def optuna_distribution(param: Param) -> optuna.distributions.BaseDistribution:
    if param.distribution == "choice":
        return optuna.distributions.CategoricalDistribution(list(param.values))
    assert param.low is not None and param.high is not None
    return optuna.distributions.FloatDistribution(param.low, param.high, log=param.distribution == "loguniform")


def config_key(config: Mapping[str, Any]) -> str:
    return json.dumps(dict(config), sort_keys=True, default=str)


def first_unseen(draw: Callable[[], dict[str, Any] | None], reject: Callable[[], None],
                 handed_out: set[str]) -> dict[str, Any] | None:
    """The rule that a search never hands out one config twice: draw until a config not handed out yet comes up,
    rejecting each repeat (Optuna is told it was pruned, so it moves on), at most MAX_REDRAWS times; only when the
    space seems exhausted does a repeat go out. The sweep's searcher and `space draw` both draw through it."""
    config = None
    for _ in range(MAX_REDRAWS):
        config = draw()
        if config is None or config_key(config) not in handed_out:
            break
        reject()
    if config is not None:
        handed_out.add(config_key(config))
    return config


def draw_configs(search: Mapping[str, Param], count: int, seed: int) -> list[dict[str, Any]]:
    """The first `count` configs the random sampler with `seed` hands a sweep, in order, repeats redrawn as
    the sweep's searcher redraws them. Only the random sampler: TPE's draws depend on the trials' results."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=SAMPLERS["random"](seed), direction="maximize")
    distributions = {name: optuna_distribution(p) for name, p in search.items()}
    handed_out: set[str] = set()
    asked: list[optuna.trial.Trial] = []

    def draw() -> dict[str, Any]:
        asked.append(study.ask(fixed_distributions=distributions))
        return dict(asked[-1].params)

    def reject() -> None:
        study.tell(asked[-1], state=optuna.trial.TrialState.PRUNED)

    return [first_unseen(draw, reject, handed_out) or {} for _ in range(count)]
