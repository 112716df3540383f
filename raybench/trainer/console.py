"""A callback that prints one line per epoch and, given a directory, keeps a resumable checkpoint there."""
from __future__ import annotations

from pathlib import Path
from typing import TextIO

from raybench.report_keys import SELECTION_BEST
from raybench.trainer.callbacks import Callback, EpochReport, StageReport


class ConsoleCallback(Callback):
    def __init__(self, stream: TextIO, checkpoint_dir: Path | None = None) -> None:
        self.stream = stream
        self.checkpoint_dir = checkpoint_dir

    def on_info(self, facts: dict[str, str]) -> None:
        for key, value in facts.items():
            print(f"[info] {key}: {value}", file=self.stream, flush=True)

    def on_epoch_end(self, report: EpochReport) -> None:
        shown = {k: v for k, v in report.metrics.items()
                 if k.startswith(("train/loss/total", "id_val/", "val/", "test/", "id_test/")) and k.count("/") == 1}
        text = "  ".join(f"{k}={v:.4f}" for k, v in shown.items())
        star = " *" if report.is_best else ""
        print(f"epoch {report.epoch:3d}  {text}{star}", file=self.stream, flush=True)
        if self.checkpoint_dir is not None:
            report.write_checkpoint(self.checkpoint_dir)

    def on_stage(self, report: StageReport) -> None:
        source = f"loaded from cache {report.key}" if report.cached else (f"trained {report.key}" if report.key else "done")
        bookkeeping = ("lr", "epoch", "epochs_since_best", SELECTION_BEST)
        shown = "  ".join(f"{k}={v:.4f}" for k, v in report.metrics.items()
                          if not k.startswith("train/") and k.count("/") <= 1 and k not in bookkeeping)
        print(f"[stage] {report.name}: {source}  {shown}", file=self.stream, flush=True)
