# Adaptive DHiSparse reproduction harness. `make help` lists the targets.
SHELL := /bin/bash
PY    := .venv/bin/python
STAMP := .venv/.installed
# GPU machines already carry a CUDA torch: the venv sees it instead of installing a CPU build.
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
DEFAULT_EXP := $(if $(HAS_GPU),default_h200,default_cpu)
EXP ?=
ARGS ?=

.PHONY: help venv run test lint server figures reproduce gpu-check compact clean test-sglang dashboard presets-doc

help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@echo ">> creating .venv ($(if $(HAS_GPU),GPU: system torch,CPU torch 2.13.0))"
	python3 -m venv $(if $(HAS_GPU),--system-site-packages) .venv
	$(PY) -m pip install -q --upgrade pip
	$(if $(HAS_GPU),,$(PY) -m pip install -q torch==2.13.0)
	$(if $(HAS_GPU),,$(PY) -m pip install -q triton==3.6.0 "numpy<2.4")
	$(PY) -m pip install -q -e '.[test,fast]'
	touch $(STAMP)

venv: $(STAMP)  ## create the environment in .venv/ (idempotent)

run: $(STAMP)  ## the embedded default benchmark (tiny model on CPU, H200 preset on a GPU)
	$(PY) -m harness.run experiment=$(DEFAULT_EXP) $(ARGS)

TEST_WORKERS ?= 2
test: $(STAMP)  ## ruff (lint + format check), then the CPU test suite (what CI runs) in TEST_WORKERS processes (a module marked xdist_group in one of them), then the solo tests alone
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-solo tests $(ARGS)
	$(PY) -m pytest --solo-only tests $(ARGS)

lint: $(STAMP)  ## ruff check and ruff format --check (configured in pyproject.toml)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

server: $(STAMP)  ## serve the bundled engine on 127.0.0.1:30000 with `make run`'s model and pools (ARGS="system=... model=...")
	$(PY) -m systems.engine.server --port 30000 experiment=$(DEFAULT_EXP) $(ARGS)

test-sglang: $(STAMP)  ## SGLang adapter tests; builds .venv-sglang (torch 2.14.1 + sglang 0.5.23, ~11 GB) on first use
	bash scripts/sglang_env.sh $(ARGS)

WANDB ?=
figures: $(STAMP)  ## draw every figure/table from results/ (CPU) and write REPRODUCTION.md; WANDB=1 also logs them to W&B
	$(PY) -m figures.make_all
	$(if $(WANDB),$(PY) -m harness.wandb_logger --attach-figures figures/out)

presets-doc: $(STAMP)  ## regenerate docs/presets.md (the H200 presets' derivation) from figures/presets.py
	$(PY) -m figures.presets --write docs/presets.md

dashboard: $(STAMP)  ## the W&B workspace + report (harness/dashboard.py): published with WANDB_MODE=online, else written to outputs/
	$(PY) -m harness.dashboard $(ARGS)

DRY ?=
reproduce: gpu-check $(STAMP)  ## run every experiment on the GPU (EXP=fig9 for one), then the figures; DRY=1 lists the plan
ifneq ($(DRY),)
	$(PY) -m harness.reproduce --dry-run $(if $(EXP),--only $(EXP)) $(ARGS)
else
	$(PY) -m harness.reproduce $(if $(EXP),--only $(EXP)) $(ARGS)
	$(PY) -m harness.compact --results results
	$(PY) -m figures.make_all
endif

# before the venv is built: a machine without a GPU learns at once what reproduce needs
gpu-check:
	@$(if $(or $(HAS_GPU),$(DRY)),true,echo "make reproduce needs a CUDA GPU (one H200-class GPU, 80+ GB; up to 64 GiB of pinned host memory; README: GPU prerequisites) and nvidia-smi finds none. make reproduce DRY=1 lists the plan; .venv/bin/python -m harness.reproduce --smoke runs it small on CPU." && exit 2)

compact: $(STAMP)  ## xz-compress the request records of finished runs under results/ (before a commit)
	$(PY) -m harness.compact --results results

clean:  ## remove the environment and caches (keeps results/)
	rm -rf .venv .pytest_cache .hypothesis outputs multirun
