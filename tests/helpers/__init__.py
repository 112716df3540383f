"""What the tests share besides their fixtures, one module per concern. Test files import these by name
(`from helpers.cli import cli`); tests/conftest.py holds only pytest's hooks and the fixtures, whose bodies call
these. tests/test_helpers_layout.py holds conftest and the test files to that.

- datasets: the tiny synthetic image dataset (and its group-robustness form), the tiny text dataset on the real
  MiniLM and the classifier over it (MINILM_FOLDER, TEXTS, text_model, tiny_text_dataset)
- processes: the processes a test started, found by the private folder their command lines name, and stopped
  by PID (processes_under, recorded_under, stop_processes_under, signal_and_wait)
- system_packages: the Debian packages scripts/system-packages.sh installs, and failing (or skipping) a test
  this machine cannot run (system_packages, require_system_package, skip_unless_required)
- mlflow_stores: MLflow SQLite stores copied from the session's migrated empty one, and a real `mlflow server`
  (seeded_store, start_mlflow_server, stop_mlflow_server)
- cli: the `raybench` command line, in this process or as a subprocess, and joining the session's Ray head
  (cli, run_cli, on_head, fail_on_reaching, command_env)
- paths: this checkout (REPO) and the interpreter's bin folder (BIN)

The session's local Ray clusters are tests/clusters.py, the test tiers tests/tiers.py, the collection order
tests/module_costs.py: modules of their own beside this package, as before.
"""
