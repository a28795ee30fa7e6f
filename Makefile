# The README's commands. `make serve` and `make test` set everything up on a fresh Debian machine.
SHELL := /bin/bash
PY ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
BIN := $(VENV)/bin
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: help venv lyceum-cli compiler servers serve demo test check fmt bench openapi clean

help:
	@echo "make serve   - set up and start the API (samples this host into the embedded store; or GPULENS_PROMETHEUS_URL)"
	@echo "make demo    - serve generated GPU history of a few runs (healthy, input-bound, throttled, OOM)"
	@echo "make test    - set up and run every check and test (installs Prometheus, Alertmanager, VictoriaMetrics, PostgreSQL, Slurm; the Slurm tests run as root)"
	@echo "make bench   - benchmarks: gpulens vs raw Prometheus, as ratios"

# the compiled grid path (src/gpulens/_gridjson.c) is built by the install: a change to it reinstalls
$(BIN)/.installed: pyproject.toml src/gpulens/_gridjson.c
	@$(PY) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "gpulens needs Python >= 3.11")'
	@$(MAKE) --no-print-directory compiler
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(BIN)/.installed

# The public lyceum CLI lives in its own venv: it pins typer==0.24.1, and users run it unchanged.
LYCEUM_VENV ?= .venv-lyceum
$(LYCEUM_VENV)/.installed:
	$(PY) -m venv $(LYCEUM_VENV)
	$(LYCEUM_VENV)/bin/python -m pip install -q lyceum-cli==1.2.2
	@touch $@

lyceum-cli: $(LYCEUM_VENV)/.installed

# A C compiler and Python's headers, for the compiled grid path (docs/architecture.md). Without them
# the install still succeeds and gpulens runs its Python paths (the tests then fail under CI=true).
compiler:
	@if ! command -v cc >/dev/null || ! $(PY) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))'; then \
	  echo "installing gcc and python3-dev (the compiled grid path)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  ( $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends gcc python3-dev >/dev/null ) \
	    || echo "could not install them: gpulens will run its Python paths"; \
	fi

# Debian packages of the real servers the integration tests start on 127.0.0.1 (a one-node Slurm
# too: munge, slurmctld, slurmd, slurmrestd with JWT auth), and the chromium the dashboard's
# browser test drives (Playwright's own browser download is never used).
servers:
	@missing=""; \
	command -v prometheus >/dev/null && command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v victoria-metrics >/dev/null || missing="$$missing victoria-metrics"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	for p in munge slurmctld slurmd slurmrestd slurm-client slurm-wlm-jwt-plugin; do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

serve: venv
	$(BIN)/gpulens serve

demo: venv lyceum-cli
	$(BIN)/gpulens demo

check: venv
	$(BIN)/ruff check src gpulens_testkit tests bench
	$(BIN)/ruff format --check src gpulens_testkit tests bench
	$(BIN)/mypy  # src/gpulens and gpulens_testkit (pyproject)
	$(BIN)/mypy bench  # the benchmark too: it caught a digest of a function instead of a module
	$(BIN)/lint-imports

fmt: venv
	$(BIN)/ruff format src gpulens_testkit tests bench
	$(BIN)/ruff check --fix src gpulens_testkit tests bench

# the suite on this many processes (pytest-xdist; each starts the servers its tests need): on CI's
# two cores, two nearly halve the time (1,957 tests: 501-704 s against 896-1,159 s on one), as the
# tests that wait on real time (live alerts, outages, a server's start) leave a core to the other
TEST_WORKERS ?= 2

test: venv lyceum-cli servers check
	$(BIN)/pytest -q -n $(TEST_WORKERS)

# schemathesis against openapi.json, many more cases than the ~650 of `make test` (tests/api/test_fuzz.py)
.PHONY: fuzz
fuzz: venv
	GPULENS_FUZZ_CASES=$${GPULENS_FUZZ_CASES:-10000} $(BIN)/pytest -q tests/api/test_fuzz.py

openapi: venv
	$(BIN)/python -m gpulens.api.openapi_dump > openapi.json

bench: venv servers
	$(BIN)/python -m bench $(BENCH)

clean:
	rm -rf $(VENV) $(LYCEUM_VENV) .pytest_cache .mypy_cache .ruff_cache build src/gpulens/_gridjson.*.so
