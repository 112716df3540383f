"""One sweep as a process: `python -m raybench.commands.sweep ARGS` is `raybench sweep ARGS`.

The library's entry point for one sweep. `raybench sweep` (raybench.cli) hands its parsed arguments to `run`, and
`raybench benchmark` (raybench.commands.benchmark) starts this module for each pair, so the library never runs the CLI
(the layers go data -> ... -> sweep -> tracking -> report, the CLI on top). It owns what a sweep process does
beyond the runner: its arguments (as raybench.sweep.options declares them), SIGTERM as a graceful stop, each
error as one line with exit status 2, the interrupted line with the command that resumes it, the final results.

A module of its own rather than the package's `__main__` module: it is imported (by the CLI, by tests) as well as
run, and `python -m raybench.sweep` would name the whole package, which holds far more than one sweep.
Nothing heavy is imported until a sweep runs: a bad argument is refused before torch, Ray or MLflow load.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

from raybench.exits import OneLineParser, Signals, UsageError, run_command
from raybench.records import SweepSummary
from raybench.registry import UnknownNameError
from raybench.sweep import options as sweep_options
from raybench.sweep import progress
from raybench.sweep.errors import ClusterError, OptionError, SweepBusy, SweepExists, SweepInterrupted
from raybench.sweep.space_catalog import SpaceFolderError, user_sources

PROG = "raybench sweep"  # how users call it, so the usage line names the command they type
DESCRIPTION = "random search + seed replicates on Ray, tracked in MLflow (WILDS 2.0 App. D)"


def build_parser() -> argparse.ArgumentParser:
    """`raybench sweep`'s parser, standalone: the same declared flags the CLI's `sweep` subcommand has."""
    parser = OneLineParser(prog=PROG, description=DESCRIPTION)
    sweep_options.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`raybench sweep ARGV` without the CLI: parse, run, and end as every raybench command ends (raybench.exits)."""
    words = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: run(build_parser().parse_args(words), ["sweep", *words]))  # resumed as typed


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the sweep a parsed command line asks for and print its results; 0 when it ran to the end.

    `argv` is the command line after `raybench` as the user typed it (`sweep ...`): the resume line repeats it.
    A bad input raises UsageError (one line, exit 2, from whoever runs the command); a stop signal returns 130 or
    143 after the interrupted line; a full disk 74, sysexits' EX_IOERR (the input was good, a write was not)."""
    from raybench.paths import StorageFull

    check_space_folders(args.spaces)  # a bad $RAYBENCH_SPACES, before anything starts
    load_plugins_or_refuse(args.plugin)  # before a name is checked: a plug-in may define it
    try:
        address = sweep_options.cluster_address(args.address)
    except OptionError as err:
        raise UsageError(str(err)) from None
    if address:
        probe_cluster(address)  # before prepare() writes the storage folder or the tracking store
    resume = resume_command(argv)
    try:
        options = sweep_options.from_namespace(args, resume_command=resume)
    except OptionError as err:  # a --set word that is no KEY=VALUE
        raise UsageError(str(err)) from None
    with Signals() as signals:
        try:
            with progress.showing(progress.display_for(options.quiet, options.progress_every)):
                progress.say(f"sweep {options.sweep_name('')}: checking the search space, the dataset and the flags")
                summary, tracking_uri = _sweep(options)
        except (SweepInterrupted, KeyboardInterrupt) as err:
            print(f"raybench: {interrupted_line(err, options, argv)}", file=sys.stderr)
            return signals.exit_status
        except StorageFull as err:
            again = (f"resume with: {resume}" if sweep_options.resume_accepted(options) or _parent_recorded(options)
                     else f"start it again with: {again_command(argv)}")
            print(f"raybench: {err}; free space and {again}", file=sys.stderr)
            return 74
    _print_results(summary, tracking_uri)
    return 0


def interrupted_line(err: BaseException, options: sweep_options.SweepOptions, argv: Sequence[str]) -> str:
    """What a stopped sweep says: the command that resumes it, but only when a resume would be accepted. A stop
    before the sweep had a folder under --storage (while Ray starts, say) left nothing to resume, and a
    `--resume` would be refused: the same command starts it again."""
    if isinstance(err, SweepInterrupted):
        return f"{err}; resume with: {resume_command(argv)}"
    if sweep_options.resume_accepted(options) or _parent_recorded(options):
        return f"sweep interrupted; resume with: {resume_command(argv)}"
    return (f"sweep {options.sweep_name('')!r} interrupted before it started: nothing was recorded under "
            f"--storage, so there is nothing to resume; start it again with: {again_command(argv)}")


def _parent_recorded(options: sweep_options.SweepOptions) -> bool:
    """Whether the tracking store holds the sweep's parent run: a stop after it was made and before Tune's first
    folder leaves only that, and `--resume` then accepts the sweep (runner._check_storage_for)."""
    from raybench.sweep.runner import recorded_in_store
    from raybench.tracking import default_tracking_uri

    return recorded_in_store(options.tracking_uri or default_tracking_uri(), options.sweep_name(""))


def again_command(argv: Sequence[str]) -> str:
    """The command as typed (credentials redacted), without the --resume that resume_command adds."""
    command = resume_command(argv)
    return command if "--resume" in argv else command.removesuffix(" --resume")


def _sweep(options: sweep_options.SweepOptions) -> tuple[SweepSummary, str]:
    """(the sweep's summary, its tracking URI); each input error the library raises as a UsageError naming the
    flag (or file) to change."""
    from raybench.report.record import SWEEP_RECORD
    from raybench.sweep.runner import sweep_until_converged
    from raybench.sweep.space import SpaceError
    from raybench.tracking import TrackingError
    from raybench.trainer import ConfigError

    try:
        return sweep_until_converged(options, recorder=SWEEP_RECORD)  # one sweep, or the attempts of --converge
    except (SpaceError, SpaceFolderError, SweepExists, SweepBusy, OptionError) as err:
        raise UsageError(str(err)) from None
    except UnknownNameError as err:
        raise UsageError(f"--dataset/--selection: {err}") from None
    except ConfigError as err:
        raise UsageError(f"--set {err.key}: {err.detail}") from None
    except TrackingError as err:
        raise UsageError(f"--tracking-uri: {err}") from None
    except ClusterError as err:
        raise UsageError(f"{'--address' if 'answers at' in str(err) else 'cluster'}: {err}") from None


def _print_results(summary: SweepSummary, tracking_uri: str) -> None:
    """What `raybench results NAME` shows, importances included, then where to look at it in MLflow."""
    from raybench.report.results_text import results_text
    from raybench.tracking import redact_uri

    print(results_text(summary, "table"))
    print(f"\nMLflow: {mlflow_hint(redact_uri(tracking_uri), summary.mlflow or {})}")


def resume_command(argv: Sequence[str]) -> str:
    """The command that continues this sweep (or benchmark): `raybench`, the same arguments, plus --resume, with
    credentials redacted. Always the command users type, whichever process runs the sweep."""
    from raybench.tracking import redact_uri

    def redacted(word: str) -> str:
        flag, sep, value = word.partition("=") if word.startswith("--") else ("", "", word)
        return f"{flag}{sep}{redact_uri(value)}"

    words = [redacted(word) for word in argv]
    return shlex.join(["raybench", *words, *([] if "--resume" in words else ["--resume"])])


def mlflow_hint(uri: str, ids: dict[str, str], port: int | None = None) -> str:
    """Where to look at the sweep: its parent run's page on the server, or the command that starts a UI on a local
    store (raybench.tracking.ui_command, at `port`) and the page to open there, in MLflow's model-training view."""
    from raybench.tracking import UI_PORT, ui_command, ui_link

    if uri.startswith(("http://", "https://")):
        server, prefix = uri, "open "
    else:
        port = UI_PORT if port is None else port
        server, prefix = f"http://127.0.0.1:{port}", f"{ui_command(uri, port)}, then open "
    return prefix + (ui_link(server, ids["experiment_id"], ids["run_id"]) if ids else ui_link(server))


def check_space_folders(folders: Sequence[str]) -> None:
    """Refuse, in one line, a --spaces folder or a $RAYBENCH_SPACES entry that is no folder: a space name would
    otherwise be looked up without it, and a sweep start on another space of the same name."""
    try:
        user_sources(folders)
    except SpaceFolderError as err:
        raise UsageError(str(err)) from None


def load_plugins_or_refuse(flags: Sequence[str]) -> None:
    """Import the plug-ins the flags, $RAYBENCH_PLUGINS and the entry points name, and name them in the
    environment of every process this one starts; a plug-in that cannot be used is one line naming it."""
    from raybench.plugins import PluginError, export_to_children, load_plugins

    try:
        load_plugins(flags)
    except PluginError as err:
        raise UsageError(f"--plugin: {err}") from None
    export_to_children()


def probe_cluster(address: str) -> None:
    """Refuse, in one line, an --address no Ray answers at (or a node temp dir that cannot work) before anything
    is written: Ray's own retries would take minutes to say so."""
    from raybench.sweep.ray_backend import node_temp_dir, probe_address

    try:
        node_temp_dir()
    except ClusterError as err:
        raise UsageError(str(err)) from None
    try:
        probe_address(address)
    except ClusterError as err:
        raise UsageError(f"--address: {err}") from None


if __name__ == "__main__":
    sys.exit(main())
