"""Settings declared once, on the dataclass field: its allowed range, a suggested search distribution, a help line.

`TrainConfig` and every algorithm's `Hparams` declare their fields with `setting(...)`, so the range a value is
checked against (`check_allowed`), what `raybench list settings` prints and what `raybench space new` writes all
come from the same declaration and cannot drift apart. No imports beyond the standard library: the trainer, the
algorithms and the command line all read it.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import re
from dataclasses import MISSING, dataclass
from typing import Any

METADATA_KEY = "raybench.setting"


@dataclass(frozen=True)
class Allowed:
    """The values a setting accepts: numbers within bounds (each end open or closed), one of `choices`, or text
    matching `pattern` (said in `words`, e.g. "auto, cpu or cuda[:N]"). None is allowed when the type is Optional."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    choices: tuple[Any, ...] = ()
    pattern: str | None = None
    words: str = ""
    # The largest value any real run uses, where the meaning sets no upper bound (an lr, a count of epochs):
    # beyond it a value is a typo or an attack that would crash a trial after Ray started (an lr of 1e58,
    # 1e20 epochs), so it is refused at load. Kept apart from `high` so the words of the meaning stay as
    # they are ("a finite positive number") and a refusal for size says both.
    limit: float | None = None

    def admits_meaning(self, value: Any) -> bool:
        if self.choices:
            return value in self.choices
        if self.pattern is not None:
            return isinstance(value, str) and re.fullmatch(self.pattern, value) is not None
        number = _as_number(value)
        if number is None or not math.isfinite(number):
            return False
        above = self.low is None or (number > self.low if self.low_open else number >= self.low)
        below = self.high is None or (number < self.high if self.high_open else number <= self.high)
        return above and below

    def beyond_limit(self, value: Any) -> bool:
        """Above `limit` (a number too large for a float is above any limit)."""
        if self.limit is None or self.choices or self.pattern is not None:
            return False
        number = _as_number(value)
        return number is not None and number > self.limit

    def text(self, kind: str) -> str:
        """The range in words, e.g. "a finite positive number", "an integer >= 1", "one of sgd, adam"."""
        if self.words:
            return self.words
        if self.choices:
            return "one of " + ", ".join(str(c) for c in self.choices)
        if self.pattern is not None:
            return f"text matching {self.pattern}"
        noun = "an integer" if kind == "int" else "a finite number"
        if self.high is None and self.low is not None:
            if self.low == 0 and self.low_open and kind != "int":
                return "a finite positive number"
            return f"{noun} {'>' if self.low_open else '>='} {self.low:g}"
        if self.low is None and self.high is not None:
            return f"{noun} {'<' if self.high_open else '<='} {self.high:g}"
        if self.low is None or self.high is None:
            return noun
        if self.low_open and self.high_open:
            return f"{noun} strictly between {self.low:g} and {self.high:g}"
        return f"{noun} in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"

    def full_text(self, kind: str) -> str:
        """The range in words with its limit, e.g. "an integer >= 1, at most 1,000,000" (`raybench list settings`)."""
        return self.text(kind) + (f", at most {number_text(self.limit)}" if self.limit is not None else "")

    def problem(self, value: Any, kind: str) -> str | None:
        """What is wrong with `value` ("expected a finite number > 0, got -1.0" style), or None if it is allowed."""
        if not self.admits_meaning(value):
            return f"expected {self.text(kind)}, got {value!r}"
        if self.beyond_limit(value):
            return f"expected {self.full_text(kind)}, got {value!r}"
        return None


def _as_number(value: Any) -> float | None:
    """`value` as a float; None when it is no number; inf when it is an integer too large for a float."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
    except (TypeError, ValueError):
        return None


def number_text(value: float) -> str:
    """1000000 -> "1,000,000", 4294967295 -> "4,294,967,295", 10.0 -> "10", 0.5 -> "0.5"."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:g}"


# Limits past every real run (WILDS, SpuCo and DABS settings, the shipped search spaces): the largest lr any of
# them uses is 4.8 (SwAV's LARS at batch 4096), the longest stage 100,000 steps (DABS pre-training).
MAX_COUNT = 1_000_000  # epochs, steps, batch sizes, crops, widths
MAX_MAGNITUDE = 1e6  # penalties, weight decays, clip norms, step sizes
MAX_RATE = 10.0  # learning rates and temperatures: beyond 10 nothing trains
MAX_SEED = 2**32 - 1  # numpy's and torch's seeds are 32-bit; replicate seeds are drawn below it

# The ranges most settings share; a redeclared field (a subclass's own default) reuses the base's constant.
# Every numeric setting declares both ends: its meaning's bounds, or a `limit` where the meaning has none.
POSITIVE = Allowed(low=0, low_open=True, limit=MAX_RATE)  # learning rates, temperatures
NON_NEGATIVE = Allowed(low=0, limit=MAX_MAGNITUDE)  # penalties, weight decays
AT_LEAST_ONE = Allowed(low=1, limit=MAX_COUNT)  # counts: epochs, steps, batch sizes
AT_LEAST_TWO = Allowed(low=2, limit=MAX_COUNT)  # counts that need two: batch sizes, folds, prototypes, crops
COUNT = Allowed(low=0, limit=MAX_COUNT)  # counts that may be zero: prefetched batches, extra crops
PROBABILITY = Allowed(low=0, high=1)  # confidence thresholds, dropout
OPEN_FRACTION = Allowed(low=0, high=1, low_open=True, high_open=True)  # a share that must leave something on both sides
SEED = Allowed(low=0, high=MAX_SEED, words="an integer in [0, 2^32 - 1]")


@dataclass(frozen=True)
class Distribution:
    """A search distribution in the search-space format: `loguniform` / `uniform` over [low, high], `choice` among
    `values`, or `lr`, log-uniform over `decades` either side of the dataset's default (WILDS 2.0 App. D). The one
    type for both sides of a search: a setting's suggested search (`raybench space new` writes it under `search:`)
    and a space's searched parameter (raybench.sweep.space.Param, which adds its name)."""

    distribution: str
    low: float | None = None
    high: float | None = None
    values: tuple[Any, ...] = ()
    decades: float = 1.0

    @classmethod
    def loguniform(cls, low: float, high: float) -> Distribution:
        return cls("loguniform", low=low, high=high)

    @classmethod
    def uniform(cls, low: float, high: float) -> Distribution:
        return cls("uniform", low=low, high=high)

    @classmethod
    def choice(cls, *values: Any) -> Distribution:
        return cls("choice", values=tuple(values))

    @property
    def scale(self) -> str:
        """How the values are spread, as a plot axis: log, linear or categorical."""
        return {"loguniform": "log", "lr": "log", "uniform": "linear"}.get(self.distribution, "categorical")

    def as_space(self) -> dict[str, Any]:
        """The mapping a search-space file holds for this distribution."""
        if self.distribution == "choice":
            return {"distribution": "choice", "values": list(self.values)}
        if self.distribution == "lr":
            return {"distribution": "lr", "decades": self.decades}
        return {"distribution": self.distribution, "low": self.low, "high": self.high}


Suggest = Distribution  # how a setting's declaration reads: setting(..., suggest=Suggest.loguniform(0.1, 10))


@dataclass(frozen=True)
class Declared:
    """What `setting` stores in a field's metadata.

    `per_dataset`: datasets are expected to supply this value (their `algorithm_hparams`, or `augment` turned off
    where they have no strong augmentation), so `raybench space new` leaves it to them: a space that fixed it would
    override every dataset's choice.
    """

    allowed: Allowed | None = None
    suggest: Suggest | None = None
    help: str = ""
    per_dataset: bool = False


def setting(default: Any = MISSING, *, default_factory: Any = MISSING,
            allowed: Allowed | None = None, suggest: Suggest | None = None, help: str = "",
            per_dataset: bool = False) -> Any:
    """A dataclass field carrying its allowed range, suggested search distribution and help line."""
    declared = Declared(allowed, suggest, help, per_dataset)
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={METADATA_KEY: declared})
    return dataclasses.field(default=default, metadata={METADATA_KEY: declared})


def declared(field: dataclasses.Field) -> Declared:
    """The field's declaration; a plain field (no `setting`) declares nothing beyond its type."""
    return field.metadata.get(METADATA_KEY, Declared())


@dataclass(frozen=True)
class FieldType:
    """A field's annotation read the way `coerce` reads it: the base kind and whether None is allowed."""

    kind: str  # bool, int, float or str
    optional: bool

    @classmethod
    def of(cls, annotation: Any) -> FieldType:
        text = str(annotation).replace("typing.", "")
        kind = next((t for t in ("bool", "int", "float", "str") if t in text), "str")
        return cls(kind, "Optional" in text or "None" in text)

    @property
    def text(self) -> str:
        return f"{self.kind} or none" if self.optional else self.kind

    @property
    def continuous(self) -> bool:
        """Whether a search may draw real numbers for it (uniform, log-uniform): a float setting only. A drawn
        37.4 for an integer (a batch size) fails every trial; for a bool or text setting it means nothing."""
        return self.kind == "float"

    def written_expectation(self, value: Any) -> str | None:
        """What a file should have written instead of `value` ("an integer", "a number or null"), or None when it
        is of this type. A search-space file's value must already be of its setting's type (the command line's
        text is coerced; a file has types of its own): a 64.0 for a batch size, a 1 for a switch, a 5 for a model
        name, or `1e-3` for an lr (YAML 1.1 reads it as text) is a mistake that would reach the trials, their
        identities and the results as another type."""
        if value is None and self.optional:
            return None
        if isinstance(value, WRITTEN_TYPES[self.kind]) and (self.kind == "bool" or not isinstance(value, bool)):
            return None
        return f"{WRITTEN_WORDS[self.kind]}{' or null' if self.optional else ''}"

    def written_hint(self, value: Any) -> str:
        """The likely slip behind a value of another type, in words ("" when none is likely)."""
        if self.kind == "float" and isinstance(value, str) and _as_number(value) is not None:
            if re.fullmatch(r"[+-]?\d+[eE][+-]?\d+", value.strip()):
                return "YAML 1.1 reads 1e-3 as text: write 1.0e-3"
            return "a number is written without quotes"
        if self.kind == "str" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return "quote a number meant as text: '1'"
        return ""


# What a YAML value of each kind of setting is: an int is a number a float setting takes, never the reverse.
WRITTEN_TYPES: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}
WRITTEN_WORDS = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "text"}


TYPE_RANGES = {"bool": "true/false", "int": "an integer", "float": "any finite number", "str": "text"}


def allowed_text(field: dataclasses.Field) -> str:
    """The field's allowed range in words: its `Allowed`, else what its type alone admits; ", or none" if Optional."""
    kind = FieldType.of(field.type)
    allowed = declared(field).allowed
    text = allowed.full_text(kind.kind) if allowed else TYPE_RANGES[kind.kind]
    return f"{text}, or none" if kind.optional else text


@dataclass(frozen=True)
class Problem:
    """A value outside its field's allowed range: the field and "expected ..., got ..."."""

    name: str
    detail: str


def find_problem(instance: Any) -> Problem | None:
    """The first field (in declaration order) whose value its `Allowed` refuses. None passes: coercion lets it into
    Optional fields only, where it means "the default's source decides"."""
    for field in dataclasses.fields(instance):
        allowed, value = declared(field).allowed, getattr(instance, field.name)
        if allowed is None or value is None:
            continue
        detail = allowed.problem(value, FieldType.of(field.type).kind)
        if detail:
            return Problem(field.name, detail)
    return None


def check_allowed(instance: Any) -> None:
    """Raise ValueError("<field>: expected ..., got ...") for the first value outside its declared range."""
    problem = find_problem(instance)
    if problem:
        raise ValueError(f"{problem.name}: {problem.detail}")


@dataclass(frozen=True)
class SettingInfo:
    """One setting as `raybench list settings` shows it and `raybench space new` writes it."""

    name: str
    type: str
    default: Any
    allowed: str
    help: str
    suggest: Suggest | None
    owner: str  # the class that declares the field (a base class for inherited settings)
    per_dataset: bool


def settings_of(cls: type) -> list[SettingInfo]:
    """Every field of the dataclass `cls`, in declaration order, with or without `setting` metadata."""
    return [SettingInfo(name=f.name, type=FieldType.of(f.type).text, default=default_of(f), allowed=allowed_text(f),
                        help=declared(f).help, suggest=declared(f).suggest, owner=owner_of(cls, f.name),
                        per_dataset=declared(f).per_dataset)
            for f in dataclasses.fields(cls)]


def default_of(field: dataclasses.Field) -> Any:
    if field.default is not MISSING:
        return field.default
    if field.default_factory is not MISSING:
        return field.default_factory()
    return MISSING


def owner_of(cls: type, name: str) -> str:
    """The most derived class in `cls`'s MRO that declares `name` itself."""
    return next(k.__name__ for k in cls.__mro__ if name in inspect.get_annotations(k))


def default_text(value: Any) -> str:
    """A default as the command line takes it (`--set key=none`, `true`), for `raybench list settings`."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value or '""'
    return str(value)


def settings_table(title: str, settings: list[SettingInfo], notes: dict[str, str]) -> str:
    """A titled table of settings: name, type, default, allowed range, help (with any note for that name)."""
    if not settings:
        return f"{title}:\n  (none)"
    rows = [("name", "type", "default", "allowed", "help")]
    for s in settings:
        extra = [s.help] + (["the dataset's own unless set"] if s.per_dataset else []) + [notes.get(s.name, "")]
        rows.append((s.name, s.type, default_text(s.default), s.allowed, "; ".join(e for e in extra if e)))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{title}:"]
    lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[4] for row in rows]
    return "\n".join(line.rstrip() for line in lines)
