# Crucible: `make run` (set up + whole graph on the tiny profile), `make test` (set up + tests).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STATE ?= .crucible
export CRUCIBLE_STATE_DIR := $(abspath $(STATE))
export DAGSTER_HOME := $(CRUCIBLE_STATE_DIR)/dagster
export CRUCIBLE_PROFILE ?= tiny
export PYTHONUNBUFFERED := 1
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(abspath $(BIN))/python
export TORCH_EXTENSIONS_DIR := $(abspath $(STATE))/torch_extensions
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION := false
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1
UI_HOST ?= 127.0.0.1
DAGSTER_PORT ?= 3000
MLFLOW_PORT ?= 5000
# Which torch build pip picks depends on the machine's pip configuration: a stock PyPI index on Linux serves
# the multi-GB CUDA build. TORCH_INDEX=<URL of PyTorch's CPU wheel index, or a mirror of it> adds that index so
# pip can pick the CPU build; empty (the default) uses pip's configured index only, so set-up never waits on
# an unreachable index.
TORCH_INDEX ?=

.PHONY: setup run test lint ui system-deps browser-deps postgres-deps clean

setup: $(VENV)/.installed $(DAGSTER_HOME)/dagster.yaml

# torch first and pinned (its build: see TORCH_INDEX above). The editable install also compiles
# the one C extension (setup.py: the code-language tokenizer) in place, with the machine's gcc.
# pip byte-compiles every installed file in one process (~35 s here); compileall does it on every core.
# Compiled up front either way: with PYTHONDONTWRITEBYTECODE set (as on some CI machines) nothing is cached
# at import time, and every process of a run would compile torch, transformers and Dagster again.
PIP_INSTALL := $(BIN)/pip install --quiet --no-compile
$(VENV)/.installed: pyproject.toml setup.py classifiers/_codetok.c pipelines/dedup/_minhash.c
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --upgrade pip wheel setuptools
	$(PIP_INSTALL) $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) torch==2.13.0
	DS_BUILD_OPS=0 $(PIP_INSTALL) -e '.[dev]'
	$(BIN)/python -m compileall -q -j 0 $(VENV)/lib > /dev/null || true  # a third-party file that does not compile is not ours to fix
	$(BIN)/pip check
	touch $@

$(DAGSTER_HOME)/dagster.yaml: dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp dagster.yaml $@

# Debian tools the stages call (apt-get download / dpkg-deb for the local web and code crawl).
system-deps:
	@command -v apt-get >/dev/null || { echo "apt-get not found: point the crawl at your own seeds or WARC files (see README)"; exit 0; }
	@test -n "$$(ls /var/lib/apt/lists/*_Packages 2>/dev/null | head -1)" || apt-get update -qq || echo "apt-get update failed: the local web needs Debian doc packages"

# Headless Chromium for the browser test (tests/browser): Debian's build, driven by Playwright; nothing
# downloads a browser of its own. Needs root (apt-get install); without apt-get the browser test skips.
browser-deps: system-deps
	@command -v chromium >/dev/null && exit 0; \
	command -v apt-get >/dev/null || { echo "apt-get not found: install Chromium to run tests/browser"; exit 0; }; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
	  || echo "apt-get install chromium failed (root needed): tests/browser will skip"

# Debian's PostgreSQL server binaries (initdb, postgres) for the deployment tests (tests/deploy: Dagster and
# MLflow on a throwaway Postgres). Best effort like browser-deps: without them those tests skip.
postgres-deps: system-deps
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && exit 0; \
	command -v apt-get >/dev/null || { echo "apt-get not found: install PostgreSQL to run the Postgres tests in tests/deploy"; exit 0; }; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null; } \
	  || echo "apt-get install postgresql failed (root needed): the Postgres tests in tests/deploy will skip"

run: setup system-deps
	$(BIN)/crucible run

# Test processes (pytest-xdist): the tests are mostly single-threaded (OMP_NUM_THREADS=1), so one per core.
# Modules in collection order (tests/conftest.py puts the longest, the whole-graph run, first), not by test count.
TEST_WORKERS ?= 2

# Temp files of the tests and of every process they start (TMPDIR: pytest's tmp_path, Spark, Dagster runs) go
# under the state dir, removed before each run and after a passing one: runs on one machine never fill /tmp (a
# failing run's files stay for debugging until the next run).
TEST_TMP := $(abspath $(STATE))/test-tmp

test: setup system-deps browser-deps postgres-deps lint
	rm -rf $(TEST_TMP) && mkdir -p $(TEST_TMP)
	TMPDIR=$(TEST_TMP) CRUCIBLE_PROFILE=micro $(BIN)/pytest -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
	rm -rf $(TEST_TMP)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Dagster webserver + daemon and the MLflow UI on 127.0.0.1; Ctrl-C stops both.
ui: setup
	$(BIN)/crucible ui --host $(UI_HOST) --dagster-port $(DAGSTER_PORT) --mlflow-port $(MLFLOW_PORT)

clean:
	rm -rf $(STATE)
