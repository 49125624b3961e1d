# `make test` on a fresh Debian 12 machine, as root: system packages, .venv,
# the project, the local Slurm cluster, then pytest. Re-runs skip what is done.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-unit sysdeps venv clis cluster-up cluster-down bench lint clean scripts

test: sysdeps venv cluster-up clis
	$(BIN)/pytest $(PYTEST_ARGS)

# Everything that needs neither root nor Slurm (a cluster login node).
test-unit: venv
	$(BIN)/pytest -m "not slurm" $(PYTEST_ARGS)

sysdeps:
	@tools/sysdeps.sh

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,train,mpi]'
	touch $@

# Claude Code and Qwen Code at pinned versions, for the harness tests (needs npm)
clis:
	@tools/install_agent_clis.sh

cluster-up: venv
	$(BIN)/agentrl cluster up

cluster-down:
	$(BIN)/agentrl cluster down

bench: venv
	$(BIN)/python benchmarks/ledger_bench.py

lint: venv
	$(BIN)/ruff check hpc agentrl tests benchmarks tools

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .hypothesis .agent-clis

# slurm/*.sbatch from configs/cluster-*.yaml (a test fails when they are stale)
scripts: venv
	$(BIN)/python tools/render_slurm_scripts.py
