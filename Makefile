# A newcomer's whole set-up: `make demo` (first run) and `make test` (the suite).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

LOCK := requirements.lock

.PHONY: setup test test-fast demo check clean lock docs lint system-packages

setup: $(STAMP)

# Exactly the versions of requirements.lock (its pip first, then every package), then raybench itself without
# resolving anything again; `pip check` fails if the lock no longer satisfies pyproject.toml's ranges.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet "$$(grep '^pip==' $(LOCK))"
	$(BIN)/python -m pip install --quiet -r $(LOCK)
	$(BIN)/python -m pip install --quiet --no-deps -e '.[test]'
	$(BIN)/python -m pip check
	touch $(STAMP)

# Refresh requirements.lock: resolve pyproject.toml's ranges in a fresh environment and freeze it.
lock:
	rm -rf .lock-venv
	$(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install --quiet --upgrade pip
	.lock-venv/bin/python -m pip install --quiet -e '.[test]'
	{ echo "# Exact versions \`make setup\` and CI install; refresh with \`make lock\` after changing pyproject.toml."; \
	  .lock-venv/bin/python -m pip freeze --all --exclude-editable | LC_ALL=C sort -f; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf .lock-venv

# ruff with the rules pyproject.toml configures; CI fails on any finding.
lint: $(STAMP)
	$(BIN)/ruff check raybench tests benchmarks docs examples

# Two pytest workers (pytest-xdist): a Ray test spends much of its time waiting on process start-ups, which
# leaves a core idle that the other worker's test uses. --dist loadscope keeps each test module in one worker,
# so a module's shared fixture (a sweep, a two-node cluster) runs once. TEST_WORKERS=0 runs in one process.
# --no-loadscope-reorder hands the modules out in the order tests/conftest.py gives them: the costliest first, by
# tests/module_costs.json (refresh it with `make test PYTEST_ARGS=--record-module-costs`).
TEST_WORKERS ?= 2
PYTEST_ARGS ?=
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder)
test: $(STAMP) system-packages
	$(BIN)/python -m pytest -q --durations=50 $(XDIST) $(PYTEST_ARGS) tests

# The unit and in-process tests: every test outside the cluster and e2e tiers (tests/tiers.py), at most 5 minutes
# on 2 cores (benchmarks/README.md, "`make test`"). `make test` still runs every tier.
test-fast: $(STAMP) system-packages
	$(BIN)/python -m pytest -q --durations=20 -m "not cluster and not e2e" $(XDIST) $(PYTEST_ARGS) tests

# The Debian packages some tests need (Fashion-MNIST, WordNet, GCIDE, espeak-ng, chromium, redis-server), installed
# when missing, saying what it installs; nothing happens when all are there. A test whose package is still missing
# fails naming its `apt-get install` line.
system-packages:
	scripts/system-packages.sh

# The WILDS 2.0 protocol end to end on the embedded data: 10 random DANN configs on a private local Ray,
# each a Ray Train run, selected on OOD validation, then 3 seed replicates; tracked in ./mlflow.db.
# Sized for 2 CPU cores by the protocol's budget: every epoch covers a quarter of the labeled data (DANN's steps
# stay about 2x ERM's, as in WILDS), and no RandAugment/Cutout (on digits-shift strong
# augmentation costs every method OOD accuracy, see benchmarks/README.md, "Scientific check"). Running it again resumes
# (or just re-reads) the same sweep.
DEMO_FLAGS := --trials 10 --replicates 3 --set augment=false --set epoch_fraction=0.25
demo: $(STAMP)
	$(BIN)/raybench sweep dann --dataset digits-shift $(DEMO_FLAGS) --name demo-dann \
		$(if $(wildcard runs/demo-dann-search),--resume)

# The scientific check (benchmarks/README.md, "Scientific check"): ERM, DANN and FixMatch defaults, 3 seeds each
# (about 8 minutes on 2 cores).
check: $(STAMP)
	$(BIN)/python benchmarks/digits_shift_check.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# The docs site (mkdocs.yml, docs/) built into site/ by `mkdocs build --strict`, in its own .docs-venv holding
# exactly docs/requirements.txt (MkDocs and Material never touch requirements.lock). The build's first step, the
# hook docs/gen_reference.py, runs under the project's Python (it imports raybench) and writes the CLI and
# settings reference pages from the argparse and settings declarations: made on every build, never committed.
DOCS_VENV := .docs-venv
DOCS_STAMP := $(DOCS_VENV)/.installed

$(DOCS_STAMP): docs/requirements.txt
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/python -m pip install --quiet -r docs/requirements.txt
	touch $(DOCS_STAMP)

docs: $(STAMP) $(DOCS_STAMP)
	RAYBENCH_DOCS_PYTHON=$(CURDIR)/$(BIN)/python NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site
