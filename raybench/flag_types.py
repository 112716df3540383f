"""How the command line reads a flag's words: bounded numbers, NAME=AMOUNT resources, KEY=VALUE settings.

Kept apart from raybench.cli so that the sweep's options (raybench.sweep.options), which declare these as their
parsers, and every subcommand read a word the same way; only the standard library and raybench.settings are
imported, so building a parser loads no torch, Ray or MLflow.
"""
from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from raybench.settings import MAX_COUNT, MAX_MAGNITUDE, MAX_SEED, number_text


def bounded(kind: type, minimum: float, maximum: float, strict: bool = False) -> Callable[[str], Any]:
    """An argparse type: `kind` (int or float) at least `minimum` (greater, if `strict`) and at most `maximum`,
    named in errors. Every flag has both ends: a value past any real use (1e20 trials, a 1e300-second wait)
    would otherwise fail only after Ray started."""
    noun = "an integer" if kind is int else "a finite number"
    expected = f"expected {noun} {'>' if strict else '>='} {minimum:g}"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
        if (kind is float and not math.isfinite(value)) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(f"{expected}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{expected}, at most {number_text(maximum)}, got {value}")
        return value

    return parse


positive_int = bounded(int, 1, MAX_COUNT)  # trials, epochs, workers, grace periods
non_negative_int = bounded(int, 0, MAX_COUNT)  # replicates
AUTO = "auto"


def count_or_auto(text: str) -> int | str:
    """`--replicates`: a count, or `auto` (as many as a sequential rule asks for, raybench.sweep.seed_rules)."""
    return AUTO if text.strip().lower() == AUTO else non_negative_int(text)
seed_int = bounded(int, 0, MAX_SEED)  # as the trainer's `seed`: numpy's seeds are 32-bit
non_negative_float = bounded(float, 0, MAX_MAGNITUDE)
positive_float = bounded(float, 0, MAX_MAGNITUDE, strict=True)  # factors, seconds

# The smallest amount of a Ray resource Ray itself can tell from none (ray._raylet.RESOURCE_UNIT_SCALING is
# 10,000): below it a request counts as zero, which Ray refuses only once it has started.
RAY_RESOURCE_STEP = 0.0001
# The smallest share of a CPU or GPU a trial worker may ask for: a hundred workers on one core or one GPU. Below
# it (0.00001 CPUs) Ray packs thousands of training workers onto a core and the machine stalls.
MIN_DEVICE_SHARE = 0.01
cpu_amount = bounded(float, MIN_DEVICE_SHARE, MAX_MAGNITUDE)  # --cpus-per-worker
resource_amount = bounded(float, RAY_RESOURCE_STEP, MAX_MAGNITUDE)  # a custom resource's NAME=AMOUNT
# --progress-every: a line at most once a second; 0.001 printed 25,000 lines in 41 s.
progress_seconds = bounded(float, 1, MAX_MAGNITUDE)


def gpu_amount(text: str) -> float:
    """An argparse type for --gpus-per-worker: 0 (no GPU), a share of one GPU in [0.01, 1], or a whole number of
    GPUs. Ray places a fraction only below one GPU (1.5 GPUs is no request it can satisfy), and a share under a
    hundredth would pack a hundred training workers onto one GPU."""
    expected = (f"expected 0 (no GPU), a share of one GPU in [{MIN_DEVICE_SHARE:g}, 1] or a whole number of GPUs "
                f"up to {number_text(MAX_MAGNITUDE)}")
    try:
        value = non_negative_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"{expected}, got {text!r}") from None
    if value == 0 or MIN_DEVICE_SHARE <= value <= 1 or value.is_integer():
        return value
    raise argparse.ArgumentTypeError(f"{expected}, got {value:g}")


def nonblank(what: str) -> Callable[[str], str]:
    """An argparse type for a flag that names a file, folder, URI or run: the word as given, refused when empty
    or only blanks. `Path("")` is the working folder, which the user did not name, and an empty word given to a
    flag with a default silently meant the default (`--output ''` wrote nothing, `--root ''` read the default
    root, `--address ''` started a private Ray)."""

    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return text

    return parse


# Resources Ray or raybench already asks for by their own flags or for the trial drivers.
RESERVED_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory", "trial_driver")
RESOURCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.:-]{0,63}")


def resource_request(text: str) -> tuple[str, float]:
    """An argparse type: NAME=AMOUNT, a custom Ray resource every trial worker asks for."""
    name, sep, amount = text.partition("=")
    if not sep or not RESOURCE_NAME.fullmatch(name.strip()):
        raise argparse.ArgumentTypeError(f"expected NAME=AMOUNT, a custom resource such as raybench_worker=1, got {text!r}")
    name = name.strip()
    if name in RESERVED_RESOURCES:
        raise argparse.ArgumentTypeError(f"{name} is not a custom resource (use --cpus-per-worker/--gpus-per-worker); "
                                         f"got {text!r}")
    return name, resource_amount(amount.strip())


def assignment(text: str) -> tuple[str, str]:
    """KEY=VALUE, as `--set` takes it, into its stripped key and value; ValueError says what was expected. Read
    after parsing, not as an argparse type, so a bad one is reported where `--set` always reported it."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected key=value, got {text!r}")
    return key.strip(), value.strip()


def number_word(value: float) -> str:
    """A number as a flag's word that reads back to the same value: 1.0 -> "1", 0.25 -> "0.25", 1e-07 -> "1e-07"."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
