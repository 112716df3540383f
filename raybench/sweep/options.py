"""The options of `raybench sweep`, declared once, on the `SweepOptions` field that holds each: the flag that sets
it, how the flag's word is read, its choices, its help line, whether it repeats.

From these declarations alone come the subcommand's arguments (`add_arguments`), the options a parsed command line
means (`from_namespace`) and the command line that means given options (`command_words`, which `raybench benchmark`
runs for each pair): a flag cannot be added to one of them and forgotten in another. A field no flag sets is
declared `internal`, saying who sets it. raybench.settings declares the trainer's settings the same way.

No torch, Ray or MLflow: the command line builds its parser from this module before any of them loads.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Collection, Iterator
from dataclasses import MISSING, dataclass
from pathlib import Path
from typing import Any

from raybench.flag_types import (
    assignment,
    count_or_auto,
    cpu_amount,
    gpu_amount,
    nonblank,
    number_word,
    positive_float,
    positive_int,
    progress_seconds,
    resource_request,
    seed_int,
)
from raybench.paths import safe_name
from raybench.settings import default_of
from raybench.sweep.converge import DEFAULT_ATTEMPTS, converge_attempts, converge_factor
from raybench.sweep.errors import OptionError
from raybench.sweep.space_catalog import folder_problem
from raybench.sweep.spending import budget_text
from raybench.sweep.trial_slots import slot_folder_problem
from raybench.words import EXECUTORS, SAMPLERS, SCHEDULERS, SELECTION_RULES

METADATA_KEY = "raybench.sweep_option"
DEFAULT_REPLICATES_CAP = 10  # --replicates auto: the most replicates it adds up to



@dataclass(frozen=True)
class Pairs:
    """A repeatable NAME=VALUE flag (`--set lr=0.1 --set epochs=2`): the field keeps one value per name, the last
    one given winning, as a dict (`mapping`) or as a tuple of (name, value) pairs."""

    spell: Callable[[Any], str]  # a value -> the word after NAME=, one that reads back to the value
    split: Callable[[Any], tuple[str, Any]] | None = None  # a parsed word -> (name, value); None: argparse's type did
    mapping: bool = False

    def field_value(self, parsed: list[Any]) -> dict[str, Any] | tuple[tuple[str, Any], ...]:
        """The field's value from the flag's parsed words; ValueError from `split` for a word that is no pair."""
        values = dict(self.split(word) if self.split else word for word in parsed)
        return values if self.mapping else tuple(values.items())

    def words(self, flag: str, value: Any) -> list[str]:
        """The flag once per pair the field holds."""
        items = value.items() if isinstance(value, dict) else value
        return [word for name, item in items for word in (flag, f"{name}={self.spell(item)}")]


@dataclass(frozen=True)
class Words:
    """A repeatable flag of one word each (`--spaces a --spaces b`): the field keeps every word, in the order
    given, as a tuple."""

    def field_value(self, parsed: list[Any]) -> tuple[Any, ...]:
        return tuple(parsed)

    def words(self, flag: str, value: Any) -> list[str]:
        """The flag once per word the field holds."""
        return [word for item in value for word in (flag, str(item))]


@dataclass(frozen=True)
class Flag:
    """How a user sets one option: `flag` such as "--max-concurrent" (None: the positional argument, named after
    its field); `parse`, argparse's type (None: the text as given). A field whose default is a bool is a switch."""

    flag: str | None
    parse: Callable[[str], Any] | None = None
    help: str | None = None
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    repeats: Pairs | Words | None = None
    fixed_on_resume: bool = False  # it decides what is trained or selected: a --resume must give the recorded value

    @property
    def words(self) -> str:
        """The flag as a user names it: `--trials`, or SPACE for the positional."""
        return self.flag or "SPACE"

    def dest(self, field: dataclasses.Field) -> str:
        """Where argparse puts the value: the positional's field name, else the flag's own (--set -> set), as
        argparse names it, so the parsed namespace reads as it always did."""
        return field.name if self.flag is None else self.flag.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class Internal:
    """A field no flag sets; `why` says who sets it instead, so a reader of SweepOptions sees it is not forgotten."""

    why: str


def option(default: Any = MISSING, *, flag: str | None, parse: Callable[[str], Any] | None = None,
           help: str | None = None, choices: tuple[str, ...] = (), metavar: str | None = None,
           repeats: Pairs | Words | None = None, fixed_on_resume: bool = False, default_factory: Any = MISSING) -> Any:
    """A SweepOptions field that `flag` sets; `fixed_on_resume`: a `--resume` may not change it (it decides what
    is trained and selected, and Tune's restore keeps the search it started)."""
    return _field(Flag(flag, parse, help, choices, metavar, repeats, fixed_on_resume), default, default_factory)


def internal(default: Any, *, why: str) -> Any:
    """A SweepOptions field that no flag sets."""
    return _field(Internal(why), default, MISSING)


def _field(declared: Flag | Internal, default: Any, default_factory: Any) -> Any:
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={METADATA_KEY: declared})
    return dataclasses.field(default=default, metadata={METADATA_KEY: declared})


def setting_word(value: Any) -> str:
    """A `--set` value as the command line spells it (none, true, false, else its text), so the sweep reads the
    value the caller meant."""
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


RESOURCES = Pairs(spell=number_word)  # resource_request already split NAME=AMOUNT
SETTINGS = Pairs(spell=setting_word, split=assignment, mapping=True)  # split after parsing: see `assignment`
WORDS = Words()


def space_folder(text: str) -> str:
    """--spaces: an existing folder of search spaces, refused now rather than found empty by the lookup."""
    problem = folder_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


# What Ray's job supervisor sets in a submitted job's driver: the cluster's GCS address, and the job's config.
RAY_ADDRESS_VARIABLE = "RAY_ADDRESS"
RAY_JOB_VARIABLE = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def shown_address(address: str) -> str:
    """An address as every message prints it: a `user:password@` in it replaced by `***@`."""
    scheme, sep, rest = address.rpartition("://")
    netloc, slash, path = rest.partition("/")
    if "@" not in netloc:
        return address
    return f"{scheme}{sep}***@{netloc.rpartition('@')[2]}{slash}{path}"


ADDRESS_WORDS = "host:port (a port 1-65535), ray://host:port or auto"


def address_problem(address: str) -> str | None:
    """What is wrong with a cluster address, before anything connects: Ray's own client retries a port it can
    never reach (`127.0.0.1:-1`) for ever. None for `auto`, `host:port` and `ray://host:port` (IPv6 in [])."""
    if address == "auto":
        return None
    expected = f"expected {ADDRESS_WORDS}"
    scheme, sep, rest = address.rpartition("://")
    if sep and scheme != "ray":
        return f"{expected}, got the scheme {scheme!r}"
    hostport = rest.partition("/")[0].rpartition("@")[2]
    host, colon, port = hostport.rpartition(":")
    if not colon or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"{expected}, got {shown_address(address)!r}"
    if host.startswith("[") != host.endswith("]") or (host.startswith("[") and not _is_ipv6(host[1:-1])):
        return f"{expected}, got {shown_address(address)!r} (an IPv6 host is written in brackets: [::1]:6379)"
    return None


def _is_ipv6(text: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def cluster_address(flag: str | None) -> str | None:
    """The cluster a sweep joins, as Ray users expect: `--address`, else `$RAY_ADDRESS` (a submitted Ray job's
    driver always has it), else None (a private local Ray). Inside a job an --address naming another cluster is
    refused: the job's trials would run on a cluster the job does not hold. A malformed address is refused before
    anything is written or connects."""
    given = os.environ.get(RAY_ADDRESS_VARIABLE, "").strip() or None
    for source, address in (("--address", flag), (f"${RAY_ADDRESS_VARIABLE}", given)):
        problem = address_problem(address) if address else None
        if problem:
            raise OptionError(f"{source}: {problem}")
    if flag is None or flag == "auto":
        return given or flag
    if RAY_JOB_VARIABLE in os.environ and given not in (None, "auto") and flag != given:
        raise OptionError("--address: this sweep runs inside a Ray job, on the cluster its $RAY_ADDRESS names, and "
                          "--address names another; leave --address out (or give 'auto') to use the job's cluster")
    return flag


def trial_slot_folder(text: str) -> str:
    """--trial-slots: an existing folder that holds slot files (trial_slots.py); an empty word is refused as
    such, not looked for in the working folder."""
    problem = slot_folder_problem(nonblank("a folder of trial slots")(text))
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return text


@dataclass
class SweepOptions:
    """One sweep as `raybench sweep` takes it, its fields in the order `raybench sweep --help` lists their flags."""

    space: str = option(flag=None, help="a search-space name (e.g. dann; raybench list spaces) or a path to a YAML file")
    spaces: tuple[str, ...] = option((), flag="--spaces", parse=space_folder, repeats=WORDS, metavar="DIR",
                                     help="a folder of your own search spaces (NAME.yaml), looked up before "
                                          "$RAYBENCH_SPACES, plug-ins' and raybench's own (repeatable)")
    dataset: str = option("digits-shift", flag="--dataset", fixed_on_resume=True)
    trials: int | None = option(None, flag="--trials", parse=positive_int,  # None: 10, or 2 with smoke
                                help="random configs to try (default 10; 2 with --smoke); with --resume, more "
                                     "than a finished sweep ran extends its search with the next configs of the "
                                     "same seeded stream")  # a resume may grow it: raybench.sweep.extension judges it
    budget: str | None = option(None, flag="--budget", parse=budget_text, metavar="AMOUNT",
                                help="stop drawing configs once another trial (and the selected config's "
                                     "replicates) would not fit: wall-clock (90m, 2h) or GPU-hours (12gpu-h), "
                                     "counted from the runs' records, so it holds across --resume")
    replicates: int | str | None = option(None, flag="--replicates", parse=count_or_auto, metavar="N|auto",  # None: the dataset's count
                                    help="seeds for the selected config (default: the dataset's, e.g. camelyon17 10, "
                                         "else 3; 2 with --smoke), or auto: that many, then one more at a time until "
                                         "Welch's test tells it from --baseline (alpha 0.05 over all looks) or "
                                         "--replicates-cap; with --resume, more than a finished sweep ran adds "
                                         "seeds to its selected config")  # judged by raybench.sweep.extension
    replicates_cap: int = option(
        DEFAULT_REPLICATES_CAP, flag="--replicates-cap", parse=positive_int, metavar="N", fixed_on_resume=True,
        help="with --replicates auto: the most replicates it runs (default 10)")
    baseline: str | None = option(
        None, flag="--baseline", parse=nonblank("a sweep name"), metavar="SWEEP", fixed_on_resume=True,
        help="with --replicates auto: the finished sweep (on the same dataset, in the same store) this one is told "
             "apart from on the ranking column")
    seed: int = option(0, flag="--seed", parse=seed_int, help="the search's seed (Optuna sampler)", fixed_on_resume=True)
    sampler: str = option("random", flag="--sampler", choices=SAMPLERS, fixed_on_resume=True)
    max_concurrent: int = option(2, flag="--max-concurrent", parse=positive_int)
    workers_per_trial: int = option(1, flag="--workers-per-trial", parse=positive_int, fixed_on_resume=True)
    cpus_per_worker: float = option(1.0, flag="--cpus-per-worker", parse=cpu_amount)
    gpus_per_worker: float = option(0.0, flag="--gpus-per-worker", parse=gpu_amount)
    worker_resources: tuple[tuple[str, float], ...] = option(
        (), flag="--worker-resource", parse=resource_request, repeats=RESOURCES, metavar="NAME=AMOUNT",
        help="a custom Ray resource every trial worker asks for, e.g. raybench_worker=1 to run trials only on the "
             "worker nodes of cluster/local-up.sh (repeatable)")
    trial_resources: tuple[tuple[str, float], ...] = option(
        (), flag="--trial-resource", parse=resource_request, repeats=RESOURCES, metavar="NAME=AMOUNT",
        help="a custom Ray resource each trial holds once while it runs, whatever its workers: `raybench benchmark` "
             "passes raybench_slot=1, its trial queue (repeatable)")
    trial_slots: str | None = option(
        None, flag="--trial-slots", parse=trial_slot_folder, metavar="FOLDER",
        help="a folder of trial slots on this host that other sweeps share: a trial starts only once it holds a "
             "free one (`raybench benchmark` passes its trial queue on a cluster at --address)")
    address: str | None = option(None, flag="--address", parse=nonblank(ADDRESS_WORDS), help="Ray cluster address ('auto' inside a submitted job); "
                                                              "default: a private local Ray")
    tracking_uri: str | None = option(None, flag="--tracking-uri", parse=nonblank("an MLflow tracking URI"), help="MLflow tracking URI; default: "
                                                                        "sqlite:///mlflow.db in the working directory")
    experiment: str = option("raybench", flag="--experiment", parse=nonblank("an MLflow experiment name"),
                             metavar="NAME", fixed_on_resume=True,
                             help="the MLflow experiment the sweep's runs are filed under (default: raybench); "
                                  "`results` and `compare` find a sweep by its name in any experiment")
    storage: str = option("runs", flag="--storage", parse=nonblank("a folder"), help="Tune storage folder (shared storage on a multi-node cluster)")
    name: str | None = option(None, flag="--name", help="sweep name; default: SPACE-DATASET-seedSEED")
    smoke: bool = option(False, flag="--smoke", help="a few steps per trial (and by default 2 trials, 2 replicates)", fixed_on_resume=True)
    resume: bool = option(False, flag="--resume", help="continue an interrupted sweep of the same name")
    autoscaling: bool = option(False, flag="--autoscaling", help="the cluster adds nodes on demand: accept resource "
                                                                 "requests no current node can satisfy")
    executor: str = option("train", flag="--executor", choices=EXECUTORS,
                           help="train: each trial a Ray Train TorchTrainer (default); function: plain Tune trials, "
                                "single worker", fixed_on_resume=True)
    selection: str = option("ood_val", flag="--selection", choices=tuple(SELECTION_RULES), fixed_on_resume=True)
    scheduler: str = option("fifo", flag="--scheduler", choices=SCHEDULERS,
                            help="fifo: every trial runs all its epochs; asha: stop trials early on the selection "
                                 "metric (each still selected on its best epoch so far)", fixed_on_resume=True)
    grace_period: int = option(1, flag="--grace-period", parse=positive_int,
                               help="asha: epochs before a trial can be stopped", fixed_on_resume=True)
    reduction_factor: float = option(3.0, flag="--reduction-factor", parse=positive_float,
                                     help="asha: at each rung keep the top 1/FACTOR of trials (> 1)", fixed_on_resume=True)
    converge: float | None = option(
        None, flag="--converge", parse=converge_factor, metavar="FACTOR",
        help="WILDS 2.0 App. D's convergence rule: while most runs of the selected config peak in their last 10 %% "
             "of epochs, run the same search again with every config's epochs x FACTOR (attempt 2 is the sweep "
             "NAME-epochs-xFACTOR, attempt 3 x FACTOR^2, ...); the last attempt is the result")
    converge_attempts: int | None = option(
        None, flag="--converge-attempts", parse=converge_attempts, metavar="N",
        help=f"with --converge: the attempts in all, the first included (default {DEFAULT_ATTEMPTS})")
    extra_fixed: dict[str, Any] = option(  # noqa: RUF009  option() is dataclasses.field, with a default_factory
        flag="--set", default_factory=dict, repeats=SETTINGS, metavar="KEY=VALUE",
        help="fix a trainer setting for every trial")
    plugins: tuple[str, ...] = option(
        (), flag="--plugin", parse=nonblank("a module, .py file or package folder"), repeats=WORDS,
        metavar="MODULE|PATH",
        help="a module, .py file or package folder that registers algorithms, datasets, models or search spaces; "
             "imported in the driver and in every trial and worker (repeatable; also $RAYBENCH_PLUGINS and the "
             "raybench.plugins entry points)")
    progress_every: float = option(30.0, flag="--progress-every", parse=progress_seconds, metavar="SECONDS",
                                   help="without a terminal (a file, a pipe, CI) or with --quiet: seconds between "
                                        "progress lines while trials run")
    quiet: bool = option(False, flag="--quiet", help="no live progress display on a terminal: plain lines, as in a log")
    parent_run: str | None = option(None, flag="--parent-run", parse=nonblank("an MLflow run id"), metavar="RUN_ID",
                                    help="nest the sweep's MLflow run under this run (a benchmark passes its own)")
    max_failures: int = internal(2, why="a fixed policy: how often Ray restarts a trial whose worker failed")
    epochs_scale: float = internal(1.0, why="the convergence rule (raybench.sweep.converge): the factor this attempt "
                                             "raises every config's epochs by")
    resume_command: str | None = internal(None, why="the sweep's entry point (raybench.commands.sweep), from its argv: "
                                                    "the command shown (and tagged) when the sweep is interrupted")

    def sweep_name(self, algorithm: str) -> str:
        return self.name or safe_name(f"{Path(self.space).stem}-{self.dataset}-seed{self.seed}{'-smoke' if self.smoke else ''}")


def started_folders(storage: Path, name: str) -> list[Path]:
    """The folders sweep `name` has under `storage` once it started (its search, results, replicates): a
    `--resume` is accepted when one exists (or the tracking store holds its parent run), so the interrupted
    line offers one only then."""
    own = [folder for folder in (storage / f"{name}-search", storage / name) if folder.exists()]
    try:
        return own + sorted(storage.glob(f"{name}-replicate*"))
    except OSError:  # an unreadable --storage holds no sweep a resume could find
        return own


def resume_accepted(options: SweepOptions) -> bool:
    """Whether `raybench sweep ... --resume` would find this sweep under its --storage (the runner refuses a
    resume of a sweep that has no folder there)."""
    try:
        storage = Path(options.storage).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):  # a --storage that cannot even be resolved holds no sweep
        return False
    return bool(started_folders(storage, options.sweep_name("")))


def declaration(field: dataclasses.Field) -> Flag | Internal | None:
    """What a SweepOptions field declares: the flag that sets it, that it is internal, or None (undeclared)."""
    return field.metadata.get(METADATA_KEY)


def flagged() -> Iterator[tuple[dataclasses.Field, Flag]]:
    """Every field a flag sets, with its flag, in declaration order (the order `--help` lists them)."""
    for field in dataclasses.fields(SweepOptions):
        declared = declaration(field)
        if isinstance(declared, Flag):
            yield field, declared


def fixed_on_resume() -> dict[str, str]:
    """The options a `--resume` may not change, field name -> the flag that sets it, in declaration order."""
    return {field.name: flag.words for field, flag in flagged() if flag.fixed_on_resume}


def flag_words(name: str) -> str:
    """How a user names the flag that sets the field `name`."""
    return next(flag.words for field, flag in flagged() if field.name == name)


def internal_names() -> list[str]:
    """The fields no flag sets."""
    return [f.name for f in dataclasses.fields(SweepOptions) if isinstance(declaration(f), Internal)]


# ----- the command line from the declarations --------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of `raybench sweep` on `parser`, in declaration order."""
    for field, flag in flagged():
        if flag.flag is None:
            parser.add_argument(field.name, help=flag.help)
        else:
            parser.add_argument(flag.flag, dest=flag.dest(field), help=flag.help, **_reading(field, flag))


def _reading(field: dataclasses.Field, flag: Flag) -> dict[str, Any]:
    """How argparse reads the flag: a switch, a repeated word collected in a list, or one value (the field's
    default when absent)."""
    default = default_of(field)
    if isinstance(default, bool):
        return {"action": "store_true"}
    given = {"type": flag.parse, "metavar": flag.metavar}
    if flag.repeats is not None:
        return {**given, "action": "append", "default": []}
    return {**given, "default": default, "choices": flag.choices or None}


def from_namespace(args: argparse.Namespace, **internal: Any) -> SweepOptions:
    """The options a parsed `raybench sweep` command line means, in one call; `internal` gives the fields no flag
    sets (the resume_command raybench.commands.sweep builds). A repeated NAME=VALUE word that is no pair
    (`--set lr`) raises OptionError naming its flag."""
    stray = sorted(set(internal) - set(internal_names()))
    if stray:
        raise TypeError(f"from_namespace: {stray[0]!r} is set by a flag, not given as internal")
    return SweepOptions(**{field.name: _field_value(flag, getattr(args, flag.dest(field))) for field, flag in flagged()},
                        **internal)


def _field_value(flag: Flag, parsed: Any) -> Any:
    if flag.repeats is None:
        return parsed
    try:
        return flag.repeats.field_value(parsed)
    except ValueError as err:
        raise OptionError(f"{flag.flag}: {err}") from None


def command_words(options: SweepOptions, spell: Collection[str] = ()) -> list[str]:
    """The `raybench sweep` arguments that parse back to `options` (internal fields aside: the sweep sets them):
    each flag whose value is not its default, and each field named in `spell` even at its default, so a command
    that a log shows names what its caller decided. A switch that is off and a value of None have no words."""
    words: list[str] = []
    for field, flag in flagged():
        value = getattr(options, field.name)
        if field.name in spell or value != default_of(field):
            words += _words(flag, value)
    return words


def check_values(options: SweepOptions) -> None:
    """Each option a flag sets, read back through that flag's own parser from the words that spell it: options
    the Python API builds (`api.sweep(cpus_per_worker=0.00001, tracking_uri="")`) are held to the same bounds as
    the command line's, before anything is written. Defaults are valid by construction and skipped. Raises
    OptionError naming the flag."""
    for field, flag in flagged():
        value = getattr(options, field.name)
        if flag.parse is None or flag.flag is None or value == default_of(field):
            continue
        for word in _words(flag, value)[1::2]:  # [flag, word, flag, word, ...]
            try:
                flag.parse(word)
            except (argparse.ArgumentTypeError, ValueError) as err:
                raise OptionError(f"{flag.flag}: {err}") from None


def _words(flag: Flag, value: Any) -> list[str]:
    if flag.flag is None:
        return [str(value)]
    if value is None or value is False:
        return []
    if value is True:
        return [flag.flag]
    if flag.repeats is not None:
        return flag.repeats.words(flag.flag, value)
    return [flag.flag, number_word(value) if isinstance(value, float) else str(value)]
