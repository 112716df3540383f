"""The SpuCoMNIST tables' commands (docs/reference/spurious-correlations.md), smoke-sized: every cell runs, beside the
paper's figure, with its selection's verdict and the group counts selection saw."""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers.paths import REPO
from test_spuco_data import require_fashion

METHODS = ("ERM", "GroupDRO", "GB", "JTT", "DFR")
PAPER_CELLS = {("large", "GB"): "76.8 ± 2.8", ("medium", "ERM"): "66.0 ± 5.0", ("small", "JTT"): "94.8 ± 1.0"}


def run_table(base: str, magnitudes: str, env: dict) -> str:
    command = [sys.executable, str(REPO / "benchmarks" / "spuco_check.py"), "--part", "paper", "--base", base,
               "--magnitudes", magnitudes, "--smoke", "--seeds", "1", "--workers", "2"]
    proc = subprocess.run(command, cwd=REPO / "benchmarks", env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def rows(table: str) -> dict[tuple[str, str], list[str]]:
    cells = [line.strip("|").split(" | ") for line in table.splitlines() if line.startswith("| ")]
    return {(c[0].strip(), c[1].strip()): [x.strip() for x in c] for c in cells
            if len(c) == 8 and c[0].strip() != "magnitude"}


@pytest.fixture
def table_env(shared_data_dir):
    import os

    return {**os.environ, "RAYBENCH_DATA_DIR": str(shared_data_dir), "OMP_NUM_THREADS": "1"}


def test_the_spuco_digits_table_command_runs_every_cell_beside_the_paper(table_env):
    out = run_table("spuco-digits", "large,medium,small", table_env)
    table = rows(out)
    assert set(table) == {(m, method) for m in ("large", "medium", "small") for method in METHODS}
    for (magnitude, method), paper in PAPER_CELLS.items():
        assert table[magnitude, method][4] == paper
    assert table["large", "DFR"][4] == "-"  # the paper has no DFR row for SpuCoMNIST
    assert all(row[7] == "sees" or row[7].startswith("BLIND: ") for row in table.values())
    for magnitude in ("large", "medium", "small"):
        assert f"{magnitude}: train 25 groups of 12 to 9,950; val 25 groups of 500; test 25 groups of 100" in out


def test_the_spuco_fashion_table_command_runs_at_large_magnitude(table_env):
    require_fashion()
    out = run_table("spuco-fashion", "large", table_env)
    assert set(rows(out)) == {("large", method) for method in METHODS}
    assert "large: train 25 groups of 12 to 9,552; val 25 groups of 480; test 25 groups of 400" in out
