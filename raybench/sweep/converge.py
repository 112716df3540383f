"""The convergence rule of WILDS 2.0 App. D as a loop over sweeps: `raybench sweep --converge FACTOR`.

WILDS 2.0 set each dataset's epochs "with some upwards adjustments ... if we found that the best hyperparameter
configuration had not converged on the validation set". Here that is a rule: a sweep whose selected config mostly
peaked in its last epochs (raybench.sweep.outcome.RowHealth) is run again, the same search (seed, sampled
configs, trials, replicates, selection) with every config's epochs raised by FACTOR alike, so that a method's
budget keeps its ratio to ERM's; then by FACTOR^2, up to the attempts asked for. Each attempt is an ordinary sweep
under its own name (`NAME`, `NAME-epochs-x2`, `NAME-epochs-x4`), so `--resume` reads a finished attempt and
continues an interrupted one, and the earlier attempts stay in storage and MLflow; the last attempt's summary names
them (`SweepSummary.attempts`, each with its budget and why it was not enough), and it is the sweep's result.

The loop takes the function that runs one attempt, so it is the same loop for `raybench sweep`, each pair of
`raybench benchmark` (whose sweep process runs it) and the tests, which run it without Ray. Only the standard
library and raybench.records at import: the command line's flags are declared from here.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from raybench.records import ConvergenceAttempt, SweepSummary

DEFAULT_ATTEMPTS = 3
MIN_FACTOR = 1.01  # a smaller factor gives attempts whose names (`x1`) and epochs cannot be told apart
MAX_FACTOR = 10.0
MAX_ATTEMPTS = 10
FACTOR_WORDS = f"a number > 1 (from {MIN_FACTOR:g} to {MAX_FACTOR:g}), the factor each attempt raises the epochs by"
ATTEMPTS_WORDS = f"a whole number of attempts in all, the first included, from 2 to {MAX_ATTEMPTS}"
NAME_SUFFIX = "-epochs-x"


def factor_problem(value: Any) -> str | None:
    """Why `value` cannot be a --converge factor (`converge.factor` of a benchmark file), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"expected {FACTOR_WORDS}, got {value!r}"
    if not MIN_FACTOR <= value <= MAX_FACTOR:
        return f"expected {FACTOR_WORDS}, got {value:g}"
    return None


def attempts_problem(value: Any) -> str | None:
    """Why `value` cannot be a --converge-attempts count (`converge.attempts`), or None."""
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= MAX_ATTEMPTS:
        return f"expected {ATTEMPTS_WORDS}, got {value!r}"
    return None


def _flag_type(text: str, parse: Callable[[str], Any], words: str, problem_of: Callable[[Any], str | None]) -> Any:
    """`text` parsed and checked for argparse: an ArgumentTypeError naming what was expected."""
    try:
        value = parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {words}, got {text!r}") from None
    problem = problem_of(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def converge_factor(text: str) -> float:
    """argparse's type for --converge."""
    return _flag_type(text, float, FACTOR_WORDS, factor_problem)


def converge_attempts(text: str) -> int:
    """argparse's type for --converge-attempts."""
    return _flag_type(text, int, ATTEMPTS_WORDS, attempts_problem)


def scaled_epochs(epochs: float, scale: float) -> int:
    """`epochs` raised by `scale`, rounded up to whole epochs (at least one). Rounded to 9 places first, so that
    a product float arithmetic lands a hair above a whole number (50 x 1.1 = 55.00000000000001) is not one
    epoch more."""
    return max(1, math.ceil(round(float(epochs) * scale, 9)))


def scale_text(scale: float) -> str:
    """An epochs scale as names and lines spell it: `2`, `2.25`, `1953125`; never in exponent form, whose `+`
    no sweep name may hold (`:g` writes 10^6 as `1e+06`) and whose six digits would round a large scale."""
    return f"{scale:.12g}"


@dataclass(frozen=True)
class ConvergeRule:
    """--converge FACTOR --converge-attempts N: attempt a (1-based) trains every config's epochs x FACTOR^(a-1)."""

    factor: float
    attempts: int = DEFAULT_ATTEMPTS

    def scale(self, number: int) -> float:
        """Attempt `number`'s epochs scale, rounded to 12 significant digits so it names and records cleanly."""
        return float(f"{self.factor ** (number - 1):.12g}")

    def name(self, base: str, number: int) -> str:
        """Attempt `number`'s sweep name: `base` for the first, `base-epochs-x<scale>` after it."""
        return base if number == 1 else f"{base}{NAME_SUFFIX}{scale_text(self.scale(number))}"

    def names(self, base: str) -> list[str]:
        return [self.name(base, number) for number in range(1, self.attempts + 1)]


@dataclass(frozen=True)
class Attempt:
    """One attempt the loop asks for: its number of `of`, its sweep name and epochs scale, and the attempts
    before it that it supersedes (what its summary records)."""

    number: int
    of: int
    name: str
    epochs_scale: float
    earlier: tuple[ConvergenceAttempt, ...] = ()


RunAttempt = Callable[[Attempt], SweepSummary]


def run_until_converged(base: str, rule: ConvergeRule, run_attempt: RunAttempt,
                        say: Callable[[str], None] = print) -> SweepSummary:
    """Run attempt 1, and while the attempt's selected config had not converged, the next one with the epochs
    raised again, up to `rule.attempts`: the summary of the last attempt run, which is the sweep's result. One
    line per attempt as it ends. A stop signal or an input error inside an attempt leaves through here as it
    came (the attempts before it are finished sweeps, which a `--resume` reads)."""
    from raybench.sweep.outcome import RowHealth

    earlier: list[ConvergenceAttempt] = []
    for number in range(1, rule.attempts + 1):
        attempt = Attempt(number, rule.attempts, rule.name(base, number), rule.scale(number), tuple(earlier))
        summary = run_attempt(attempt)
        health = RowHealth.of(summary)
        last = number == rule.attempts or not health.not_converged
        say(attempt_line(attempt, summary, health, None if last else rule.scale(number + 1)))
        if last:
            return summary
        earlier.append(ConvergenceAttempt(attempt.name, attempt.epochs_scale, budget_words(summary), health.late_reason))
    raise AssertionError("unreachable: the loop returns at its last attempt")


def attempt_line(attempt: Attempt, summary: SweepSummary, health: Any, next_scale: float | None) -> str:
    """`attempt 2 of 3: NAME-epochs-x2, epochs x2: 780 steps, 2.00x the protocol's; converged`, or why another
    attempt follows, or that the cap was reached with the row marked."""
    head = f"attempt {attempt.number} of {attempt.of}: {attempt.name}, epochs x{scale_text(attempt.epochs_scale)}: " \
           f"{budget_words(summary, short=True)}; "
    if health.runs == 0:
        return head + "nothing to judge: no run of a selected config finished"
    if not health.not_converged:
        return head + "converged"
    late = f"not converged ({health.late}/{health.runs} peaked late)"
    if next_scale is not None:
        return head + f"{late}: raising the epochs x{scale_text(next_scale)}"
    return head + (f"still {late} at the cap of {attempt.of} attempts; its row is marked not converged")


def budget_words(summary: SweepSummary, short: bool = False) -> str:
    """The selected config's planned budget in words: its replicates' mean (the row a comparison shows), else
    the selected trial's own; `short` for the console line."""
    from raybench.sweep.outcome import BudgetSummary

    budget = BudgetSummary.from_metrics(summary.replicates.summary)
    if budget is None and summary.selected is not None:
        budget = BudgetSummary.from_metrics(summary.selected.metrics)
    if budget is None:
        return "budget not recorded"
    if short:
        return f"{budget.steps:.0f} steps, {budget.protocol_ratio:.2f}x the protocol's"
    return budget.text()


@dataclass(frozen=True)
class Counted:
    """Which attempt of a pair's sweep counts (benchmark): its name and epochs scale, and its summary (None
    while it has not finished: that attempt is the one to run or resume)."""

    name: str
    epochs_scale: float
    summary: SweepSummary | None


def counting_attempt(base: str, rule: ConvergeRule | None,
                     read: Callable[[str], SweepSummary | None]) -> Counted:
    """The attempt that stands for sweep `base` under `rule`, from what each attempt left on disk (`read`: its
    summary by name, None before it wrote one): the first not finished yet, else the first that converged, else
    the last. Without a rule, `base` itself."""
    from raybench.sweep.outcome import RowHealth

    if rule is None:
        return Counted(base, 1.0, read(base))
    for number in range(1, rule.attempts + 1):
        name, scale = rule.name(base, number), rule.scale(number)
        summary = read(name)
        if summary is None or not summary.finished:
            return Counted(name, scale, None)
        if number == rule.attempts or not RowHealth.of(summary).not_converged:
            return Counted(name, scale, summary)
    raise AssertionError("unreachable: the loop returns at its last attempt")
