# The two set-up commands of the README: `make test` and `make demo`.
# Each is self-contained on a fresh machine: it creates .venv, installs the
# project with everything its tests need (apt packages included), then runs.

PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# Debian packages the test suite needs: Chromium for MiniWoB++ and the review pages,
# Prometheus for the metrics and dashboard-query tests; npm (Debian's nodejs + npm, unless a
# node with npm is already installed) for the dashboard type check.
APT_PACKAGES ?= chromium chromium-driver prometheus
# Grafana's schema types and TypeScript, to type-check the dashboards (tsc --noEmit).
SCHEMA_DIR := dashboards/schema
# two workers, each test file on one: on two cores one runs while the other waits on a
# broker, a browser or a server
PYTEST_ARGS ?= -n 2 --dist loadfile

.PHONY: test demo install apt services lint bench clean models check-models

test: install services
	$(PY) -m pytest $(PYTEST_ARGS)

demo: install
	$(VENV)/bin/monitor demo

install: $(STAMP)

$(STAMP): pyproject.toml Makefile $(SCHEMA_DIR)/package.json $(SCHEMA_DIR)/package-lock.json
	@$(MAKE) --no-print-directory apt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -e '.[dev]'
	cd $(SCHEMA_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v npm >/dev/null 2>&1 || missing="$$missing nodejs npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing apt packages:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The paging-store tests use the PostgreSQL server on 127.0.0.1:5432 (trust auth).
services:
	@pg_isready -q -h 127.0.0.1 -p 5432 || { \
		echo "starting PostgreSQL"; \
		pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql | head -1) main start; \
		for i in $$(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; }

# The default models shipped in vigil/shipped/: the full defaults the benches measure, built
# in a fresh VIGIL_HOME by the CLI a user runs (the corpus, `monitor calibrate --defaults`:
# world model, provenance, probes, their cross-fit folds, the L2 judge by the default recipe,
# the calibrated policy), its trajectory verdict re-fitted on the val runs of every corpus
# (`monitor calibrate --runs`: long runs as well as short, each corpus a domain), then packed (policy + bundles + manifest; the judge as int4 deltas of
# its changed blocks, about 57 MB). An hour or two on 2 cores; not part of `make test`. The
# Gemma-3-270M conversion under $(MODELS_HOME)/models is kept (a frozen model, not a trained
# one); every trained bundle is rebuilt.
MODELS_HOME ?= $(CURDIR)/build/models-home
CORPORA := agentdojo toolemu miniwob openagentsafety stepshield
models: install
	mkdir -p $(MODELS_HOME)/models
	find $(MODELS_HOME)/models -mindepth 1 -maxdepth 1 ! -name gemma-3-270m-hf -exec rm -rf {} +
	for d in $(CORPORA); do \
		test -f $(MODELS_HOME)/data/$$d/manifest.json || \
			VIGIL_HOME=$(MODELS_HOME) $(VENV)/bin/monitor worldmodel build-data $$d || exit 1; \
	done
	VIGIL_HOME=$(MODELS_HOME) $(VENV)/bin/monitor calibrate --defaults
	VIGIL_HOME=$(MODELS_HOME) $(VENV)/bin/monitor calibrate --split val \
		--runs $(foreach d,$(CORPORA),$(MODELS_HOME)/data/$(d)/trajectories.jsonl) \
		--policy $(MODELS_HOME)/models/policy.json --out $(MODELS_HOME)/models/policy.runs.json
	mv $(MODELS_HOME)/models/policy.runs.json $(MODELS_HOME)/models/policy.json
	VIGIL_HOME=$(MODELS_HOME) $(VENV)/bin/monitor models pack
	$(VENV)/bin/monitor models verify

# Retrain the shipped defaults from scratch in a fresh VIGIL_HOME and check that they land
# on the recorded data hashes and metrics (as long as `make models`; not part of `make test`).
check-models: install
	VIGIL_RETRAIN=1 $(PY) -m pytest -q -p no:xdist tests/tiers/test_retrain.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) $(SCHEMA_DIR)/node_modules .pytest_cache .mypy_cache .ruff_cache .hypothesis
