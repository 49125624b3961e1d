# `make test` on a fresh Debian 12 machine, as root: system packages, .venv,
# the project, the local Slurm cluster, then pytest. Re-runs skip what is done.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test test-fast test-stress test-unit demo learn sysdeps venv clis cluster-up cluster-down bench lint clean scripts verifier \
	gpu-wheels gpu-check gluster-up gluster-down

# Every tier (setup.cfg's markers: unit, integration, slurm, e2e), as CI runs it: on TEST_WORKERS pytest-xdist
# workers (each module's tests on one, the modules with slow tests first: tests/conftest.py), then the tests
# marked alone, one at a time with the machine to themselves; each part ends with its slowest tests.
# (pytest's exit 5 is "nothing selected": PYTEST_ARGS may select tests of one part only.) Two workers: three
# were faster but exposed a requeue race under load (docs/testing.md, "Three workers, tried").
TEST_WORKERS ?= 2
test: sysdeps venv cluster-up clis
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not alone" --durations=25 $(PYTEST_ARGS) || test $$? -eq 5
	$(BIN)/pytest -m alone --durations=5 $(PYTEST_ARGS) || test $$? -eq 5

# The whole loop on this machine (configs/tiny-local.yaml): CPU inference with a tiny model, bubblewrap
# sandboxes, the builtin agent, the bundled tasks, the torch trainer; then each checkpoint's eval, the report, and
# the trajectory viewer's site (it prints how to open it: a file:// address, or --serve for an ssh tunnel).
DEMO_RUN ?= runs/demo
demo: sysdeps venv
	@test ! -e $(DEMO_RUN) || { echo "$(DEMO_RUN) exists: remove it, or run make demo DEMO_RUN=runs/another"; exit 1; }
	@mkdir -p .cache/demo
	@test -f .cache/demo/tiny-model/agentrl_tiny.json || $(BIN)/python tools/make_tiny_model.py .cache/demo/tiny-model
	$(BIN)/agentrl convert harbor agentrl/swe/bundled_tasks --out .cache/demo/prompts.jsonl
	$(BIN)/agentrl launch configs/tiny-local.yaml --executor local --run-dir $(DEMO_RUN)
	$(BIN)/agentrl eval --watch $(DEMO_RUN) --until-done
	$(BIN)/agentrl report $(DEMO_RUN)
	$(BIN)/agentrl view $(DEMO_RUN)

# Does it learn? Tasks, a scripted teacher, the warm start, then GRPO and a control run (rewards shuffled)
# through the whole loop, each checkpoint scored on held-out tasks (benchmarks/learning_bench.py,
# docs/learning.md). About an hour on 2 cores; a stage whose output is in .cache/learn is not redone.
# HARNESS=mini_swe_agent_text: every attempt, the teacher's included, by the real mini-swe-agent CLI (about 2 hours).
learn: sysdeps venv $(if $(filter-out builtin,$(HARNESS)),clis)
	$(BIN)/python -m benchmarks.learning_bench $(if $(HARNESS),--harness $(HARNESS)) $(LEARN_ARGS)

# Everything but the tests marked slow (over 15 s each: the learning test, the demos, the end-to-end runs on
# Slurm; docs/testing.md): every tier, in under 10 minutes on 2 cores.
test-fast: sysdeps venv cluster-up clis
	$(BIN)/pytest -m "not slow" --durations=10 $(PYTEST_ARGS)

# The non-slow tiers three times beside one busy process per core (tools/stress_tests.py, docs/testing.md): a
# timing bound that holds only on a quiet machine fails here. About an hour on 2 cores (20 minutes a run).
test-stress: sysdeps venv cluster-up clis
	$(BIN)/python tools/stress_tests.py --runs 3 --workers $(TEST_WORKERS) $(if $(PYTEST_ARGS),-- $(PYTEST_ARGS))

# The unit tier: no root, no Slurm, no sandboxes or servers (a cluster login node); under 2 minutes on 2 cores.
test-unit: venv
	$(BIN)/pytest -m unit --durations=10 $(PYTEST_ARGS)

sysdeps:
	@tools/sysdeps.sh

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[dev,train,mpi,megatron,wandb,weave,weave-test]'
	touch $@

# Claude Code, Qwen Code, Codex (npm) and mini-swe-agent (PyPI) at the versions agentrl/harness pins, for the
# harness tests (needs npm and the registries; does nothing when all are in place)
clis: venv
	@AGENTRL_PYTHON=$(BIN)/python tools/install_agent_clis.sh

# The local Slurm cluster (hpc/localcluster), its nodes sharing a GlusterFS volume, each through a client of its own
cluster-up: sysdeps venv
	$(BIN)/agentrl cluster up --shared

cluster-down:
	$(BIN)/agentrl cluster down

bench: venv
	$(BIN)/python -m benchmarks.ledger_bench

# ruff, then mypy (pyproject.toml [tool.mypy]: hpc and agentrl). CI (.ci/run) runs it before make test.
lint: venv
	$(BIN)/ruff check hpc agentrl tests benchmarks tools
	$(BIN)/mypy

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache .mypy_cache .hypothesis .agent-clis

# A GlusterFS volume mounted as several nodes' clients (hpc/localcluster/glusterfs.py; docs/architecture.md,
# "The shared filesystem"): GLUSTER_DIR/client-0 ... client-2. The tests make their own.
GLUSTER_DIR ?= /tmp/agentrl-gluster
gluster-up: sysdeps venv
	$(BIN)/python -m hpc.localcluster.glusterfs up $(GLUSTER_DIR) --clients 3

gluster-down: venv
	$(BIN)/python -m hpc.localcluster.glusterfs down $(GLUSTER_DIR)

# On a GPU node (docs/train.md, "On a GPU node"): the checks this machine cannot run, one line each.
# gpu-wheels fetches, where PyPI is reachable, what a node's python3 with torch lacks (.gpu-wheels/).
gpu-wheels: venv
	tools/gpu_wheels.sh

gpu-check:
	tools/gpu_check.sh

# every bundled task's tests/test.sh and tests/grade.py from agentrl/swe/verifier/ (a test fails when one is stale)
verifier: venv
	$(BIN)/python tools/sync_verifier.py

# slurm/*.sbatch from configs/cluster-*.yaml (a test fails when they are stale)
scripts: venv
	$(BIN)/python tools/render_slurm_scripts.py
