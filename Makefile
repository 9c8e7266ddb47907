# The README's two commands.  Each installs what it needs on a fresh Debian
# machine (apt packages, the virtualenv with vcsched installed editable) and runs.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Python writes its bytecode caches (gitignored __pycache__) whatever the environment says: where
# PYTHONDONTWRITEBYTECODE=1 is set (this machine kind sets it), every Python process a test run or the demo
# starts (hundreds: CLI runs, daemons, xdist workers) compiled scipy, cvxpy, numpy, ... again from source,
# 4-5 s of CPU each instead of 1.5-2 s, and pytest re-wrote every test module's asserts (collection 11.5 s -> 3.6 s).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: demo test lint bench clean

demo: $(STAMP)
	VENV=$(VENV) scripts/demo

test: $(STAMP)
	VENV=$(VENV) scripts/test

lint: $(STAMP)
	$(VENV)/bin/ruff check vcsched hypervisor acting lab faultsim calibration cli tests
	$(VENV)/bin/mypy

bench: $(STAMP)
	$(VENV)/bin/vcsched bench --output docs/benchmarks.md

$(STAMP): pyproject.toml setup.py vcsched/solvers/_mcbc.c scripts/install-system-deps
	scripts/install-system-deps
	@[ -x $(PY) ] || python3 -m venv $(VENV)
	# --no-compile: byte-compiling every installed module (scipy, cvxpy, ...) costs ~20 s of CPU; Python compiles
	# what it imports on first use instead.  pip is not upgraded: any pip >= 21.3 installs editable from pyproject.
	$(PY) -m pip install -q --no-compile -e '.[test,plot,docs]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info site
