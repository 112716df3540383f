"""Markdown tables of runs over seeds, shared by the check scripts (mean ± sample std, ddof=1, in %)."""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{100 * statistics.mean(values):.1f} ± {100 * std:.1f}"


def seed_table(runs: list[dict[str, Any]], columns: Sequence[tuple[str, str]]) -> str:
    """One row per run label (in first-seen order), one column per (metric key, title)."""
    lines = ["| run | " + " | ".join(title for _, title in columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for label in dict.fromkeys(r["label"] for r in runs):
        mine = [r for r in runs if r["label"] == label]
        lines.append(f"| {label} | " + " | ".join(mean_std([r[k] for r in mine]) for k, _ in columns) + " |")
    return "\n".join(lines)
