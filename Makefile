# Set-up and the two entry points of the README: `make study` (the embedded default study, offline,
# CPU) and `make test` (the test suite). Both create .venv on first use.
VENV ?= .venv
CORES ?= $(shell nproc)
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export HF_HUB_OFFLINE ?= 1

.PHONY: setup study smoke test slow lint
setup: $(VENV)/.installed

# torch first and pinned: 2.13.0 is the CPU build this project's machines carry; a newer one pulls CUDA.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet "torch==2.13.0"
	$(VENV)/bin/python -m pip install --quiet -e ".[test,slurm]"
	touch $@

study: setup
	snakemake --cores $(CORES) all

smoke: setup
	snakemake --cores 2 all --configfile config/smoke.yaml

# the default test run: everything but the tests marked slow (the real Snakemake/DVC/MLflow/SLURM runs)
test: setup
	python -m pytest -q -m "not slow"

# the tests marked slow: the smoke study through Snakemake, DVC and SLURM, on real services (CI runs them too)
slow: setup
	python -m pytest -q -m slow

lint: setup
	ruff check .
