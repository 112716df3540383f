"""ASHA against FIFO on the same seeded search: what early stopping saves, and what it selects.

Runs the same `--trials` configs (one Optuna random sampler seed, so the same draws in the same order)
twice through `raybench sweep`'s runner on the default Ray Train executor: once with every trial run to its
end (`--scheduler fifo`), once with ASHA on OOD validation (`--scheduler asha`), each followed by the WILDS
replicates of its selected config. It prints, for each: the search's compute (trial-seconds, CPU-seconds),
how many trials ASHA stopped early, the selected config, and the replicates' OOD-test and ID-test mean ± std;
then ASHA's share of FIFO's search compute and whether ASHA's selected OOD-test mean lies within one std
(FIFO's replicates) of FIFO's. Goal (ASHA's, with the sweep overhead's): <= 50 % of the compute, within one std.

    .venv/bin/python benchmarks/asha_compare.py [--space erm] [--trials 20] [--seed 0] [--grace-period 1]
        [--reduction-factor 3] [--replicates 3] [--set KEY=VALUE ...]
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raybench.records import SweepSummary


def parse_assignments(pairs: list[str]) -> dict:
    from raybench.cli import parse_assignments as parse

    return parse(pairs)


def run(args: argparse.Namespace, scheduler: str, root: Path) -> tuple[SweepSummary, float]:
    from raybench.report.record import SWEEP_RECORD
    from raybench.sweep.runner import SweepOptions, prepare, run_sweep

    options = SweepOptions(space=args.space, dataset=args.dataset, trials=args.trials, replicates=args.replicates,
                           seed=args.seed, max_concurrent=args.concurrent, storage=str(root / "runs"),
                           tracking_uri=f"sqlite:///{root}/mlflow.db", name=f"bench-{scheduler}", scheduler=scheduler,
                           grace_period=args.grace_period, reduction_factor=args.reduction_factor,
                           extra_fixed=parse_assignments(args.set))
    start = time.perf_counter()
    summary = run_sweep(prepare(options), SWEEP_RECORD)
    return summary, time.perf_counter() - start


def cell(summary: SweepSummary, key: str) -> tuple[float, float]:
    found = summary.replicates.summary.get(key, {})
    return 100 * found.get("mean", float("nan")), 100 * found.get("std", float("nan"))


def describe(scheduler: str, summary: SweepSummary, wall: float, metric: str) -> None:
    from raybench.records import TrialStatus

    search = (summary.compute or {})["search"]
    stopped = sum(t.status == TrialStatus.STOPPED for t in summary.trials)
    selected = summary.selected
    ood, ood_std = cell(summary, f"best/test/{metric}")
    iid, iid_std = cell(summary, f"best/id_test/{metric}")
    print(f"\n{scheduler}: sweep wall {wall:.1f} s; search {search['wall_s']:.1f} trial-s, {search['cpu_s']:.1f} CPU-s, "
          f"{int(search['runs'])} trials, {stopped} stopped early")
    timed = [t.metrics for t in summary.trials if "time/startup_s" in t.metrics]
    if timed:
        print(f"  per trial: start-up {sum(m['time/startup_s'] for m in timed) / len(timed):.1f} s, teardown "
              f"{sum(m['time/teardown_s'] for m in timed) / len(timed):.1f} s, training "
              f"{sum(m['time/trial_s'] - m['time/report_wait_s'] for m in timed) / len(timed):.1f} s (means)")
    print(f"  selected {selected.trial_id} (OOD val {selected.selection_value:.4f}, best epoch "
          f"{selected.best_epoch}): {selected.sampled}")
    print(f"  replicates ({summary.replicates.ok} seeds): OOD test {ood:.2f} ± {ood_std:.2f} %, "
          f"ID test {iid:.2f} ± {iid_std:.2f} %")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--space", default="erm")
    parser.add_argument("--dataset", default="digits-shift")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replicates", type=int, default=3)
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument("--grace-period", type=int, default=1)
    parser.add_argument("--reduction-factor", type=float, default=3.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a trainer setting, as the CLI's")
    args = parser.parse_args()
    import ray
    import torch

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, ray {ray.__version__}; "
          f"{args.space} on {args.dataset}, {args.trials} trials (seed {args.seed}), {args.concurrent} at a time, "
          f"ASHA grace {args.grace_period} epoch(s), reduction factor {args.reduction_factor:g}", flush=True)
    summaries = {}
    for scheduler in ("fifo", "asha"):
        with tempfile.TemporaryDirectory() as tmp:
            summaries[scheduler], wall = run(args, scheduler, Path(tmp))
        describe(scheduler, summaries[scheduler], wall, summaries[scheduler].metric_names[0])
    fifo, asha = summaries["fifo"], summaries["asha"]
    same = [t.sampled for t in fifo.trials] == [t.sampled for t in asha.trials]
    share = (asha.compute or {})["search"]["wall_s"] / (fifo.compute or {})["search"]["wall_s"]
    metric = fifo.metric_names[0]
    (fifo_ood, fifo_std), (asha_ood, _) = cell(fifo, f"best/test/{metric}"), cell(asha, f"best/test/{metric}")
    print(f"\nsame {args.trials} configs in both searches: {same}")
    print(f"ASHA's search compute / FIFO's: {share:.4f} (goal <= 0.50: {'met' if share <= 0.5 else 'missed'})")
    print(f"selected OOD test: ASHA {asha_ood:.2f} vs FIFO {fifo_ood:.2f} ± {fifo_std:.2f} %, difference "
          f"{asha_ood - fifo_ood:+.2f} (within one std: {'yes' if abs(asha_ood - fifo_ood) <= fifo_std else 'no'})")


if __name__ == "__main__":
    main()
