"""The suite's tiers: `make test-fast` runs the unit and in-process tests, `make test` everything.

A test is in the `cluster` tier when it uses a Ray cluster the session starts (its fixtures, transitively), and in
the `e2e` tier when it starts raybench processes, servers or real sweeps: by the fixtures that do so, or, for a
module whose tests start Ray or sweeps in-process without such a fixture, by the module's name below. conftest's
collection hook marks each test; tests/test_tiers.py holds the fast tier to what it claims."""
from __future__ import annotations

import pytest

CLUSTER_FIXTURES = frozenset({"ray_head", "head_env"})  # the session's Ray head
E2E_FIXTURES = frozenset({"sweep_env", "mlflow_server"})  # a raybench subprocess's environment, an MLflow server
# Modules whose tests start Ray, sweeps, benchmarks or servers in-process or by subprocess without those fixtures.
E2E_MODULES = frozenset({
    "test_asha", "test_benchmark", "test_cluster", "test_converge", "test_fault_tolerance", "test_interrupt",
    "test_mlflow_ui", "test_mlflow_ui_start", "test_multinode", "test_new_algorithm", "test_packaging",
    "test_plugins", "test_ray_session", "test_search_growth", "test_self_training_health", "test_signals", "test_spuco_sweep",
    "test_spuco_tables", "test_ssl_sweeps", "test_storage_full", "test_sweep_e2e", "test_sweep_ownership",
    "test_sweep_safety", "test_tracking_outage", "test_train_path", "test_trial_slots", "test_wilds_datasets",
})
TIERS = {"cluster": "uses the session's Ray cluster", "e2e": "starts raybench processes, servers or real sweeps"}


def tier_of(item: pytest.Item) -> set[str]:
    """The tiers of one collected test."""
    fixtures = set(getattr(item, "fixturenames", ()))
    tiers = {"cluster"} if fixtures & CLUSTER_FIXTURES else set()
    if fixtures & E2E_FIXTURES or item.module is not None and item.module.__name__.rpartition(".")[2] in E2E_MODULES:
        tiers.add("e2e")
    return tiers


def mark_tiers(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in tier_of(item):
            item.add_marker(getattr(pytest.mark, tier))
