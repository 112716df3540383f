"""The MLflow UI, in headless Chromium, opens on a sweep's runs: the link the sweep prints shows the parent run
with its description and nested runs, the experiment page lists them, and a plot artifact is served as a PNG.

Chromium is Debian's `chromium` (`make test` installs it when missing); its `--dump-dom` and `--screenshot` modes are the
driver, so nothing is downloaded at run time. The screenshot is kept under test-artifacts/.
"""
from __future__ import annotations

import html
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path

from helpers.cli import on_head, run_cli
from helpers.paths import REPO
from helpers.system_packages import require_system_package
from mlflow.tracking import MlflowClient

from raybench.tracking import ui_link

ARTIFACTS = REPO / "test-artifacts"
PAGE_BUDGET_MS = 20000  # Chromium's virtual time for the page's scripts and API calls to settle


def chromium_binary() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    require_system_package(found is not None, "chromium", "the MLflow UI test's headless browser")
    return found


def chromium(binary: str, profile: Path, *args: str, timeout: float = 180) -> str:
    """Run headless Chromium in its own session with a private profile; stop all of it, whatever happens."""
    command = [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
               f"--virtual-time-budget={PAGE_BUDGET_MS}", "--window-size=1400,900", *args]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return out
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def page_text(dom: str) -> str:
    dom = re.sub(r"<script.*?</script>|<style.*?</style>", " ", dom, flags=re.DOTALL)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom)))


def test_the_ui_opens_on_the_sweeps_runs_and_serves_its_plots(tmp_path, ray_head, mlflow_server):
    binary = chromium_binary()
    done = run_cli(on_head(["sweep", "erm", "--smoke", "--trials", "2", "--replicates", "1", "--executor", "function",
                            "--max-concurrent", "1",  # one trial actor, reused: the UI is the subject
                            "--name", "ui-check", "--storage", str(tmp_path / "runs"), "--tracking-uri", mlflow_server],
                           ray_head), ray_head.env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    client = MlflowClient(tracking_uri=mlflow_server)
    experiment = client.get_experiment_by_name("raybench")
    (parent,) = client.search_runs([experiment.experiment_id], "tags.stage = 'sweep'")
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert len(children) == 3  # two trials and one replicate
    link = ui_link(mlflow_server, experiment.experiment_id, parent.info.run_id)
    assert f"MLflow: open {link}" in done.stdout  # the sweep says where to look
    assert "View run" not in done.stdout + done.stderr  # and MLflow's own links (to its GenAI view) are off

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "mlflow_ui_sweep_run.png"
    shot.unlink(missing_ok=True)
    # One Chromium run serves the run page's DOM and its screenshot (each start renders MLflow's whole UI bundle).
    run_page = page_text(chromium(binary, tmp_path / "profile", "--dump-dom", f"--screenshot={shot}", link))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    selected = re.search(r"Selected trial `([^`]+)`", parent.data.tags["mlflow.note.content"]).group(1)
    assert "Description" in run_page and f"Selected trial {selected}" in run_page, run_page[:3000]
    assert "Child runs" in run_page
    for child in children:
        assert child.info.run_name in run_page, (child.info.run_name, run_page[:3000])

    runs_page = page_text(chromium(binary, tmp_path / "profile", "--dump-dom",
                                   ui_link(mlflow_server, experiment.experiment_id)))
    assert "ui-check" in runs_page and "4 matching runs" in runs_page, runs_page[:3000]  # the parent and its nested runs
    assert "No data available" not in runs_page  # not the GenAI traces overview

    url = f"{mlflow_server}/get-artifact?path=plots/search.png&run_uuid={parent.info.run_id}"
    with urllib.request.urlopen(url, timeout=30) as response:
        assert response.headers["Content-Type"].startswith("image/png")
        assert response.read()[:8] == b"\x89PNG\r\n\x1a\n"
