# Two commands do all the set-up:  `make images` (the main job) and `make test`.
SHELL := /bin/bash
VENV := .venv
PYTHON := $(VENV)/bin/python
ENGINE_ENV := .engine/env
# Empty: the rows for the engine's machine (x86_64 or -arm64): all of them where the engine has the NVIDIA runtime,
# else the CPU rows (build.py says so).
SELECTION ?=
WHEELHOUSE ?= wheelhouse
# classic (the default) or buildkit: the engine's builder the main job builds with (docs/building.md, "The builder").
BUILDER ?= classic
PYTEST_ARGS ?=
# pytest-xdist workers for the engine-free tests: twice the cores, since about a third of their time is spent waiting
# (the bound tests' deliberate stalls, subprocesses): 83 s with 2 workers, 65 s with 4 on 2 cores
# (docs/benchmarks-log.md).
TEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))

.PHONY: setup engine engine-down cosign softhsm stargz render render-check lint images test test-fast bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -e '.[test]'
	touch $@

engine: setup
	$(PYTHON) -m devtools.localengine up

engine-down:
	$(PYTHON) -m devtools.localengine down

# The real cosign CLI, which the signing tests verify published images with (unpacked under .tools/).
cosign: setup
	$(PYTHON) -m devtools.cosign
	$(PYTHON) -m devtools.sigstore_js --optional

# SoftHSM2, the software PKCS#11 token the hardware-key tests sign with (Debian's softhsm2: a file check once there).
softhsm: setup
	$(PYTHON) -m devtools.softhsm

# Debian's stargz-snapshotter (its ctr-remote, unpacked under .tools/): the eStargz tests check that its TOC reader
# takes the blobs publish --lazy writes, through a private containerd (devtools/stargz.py).
stargz: setup
	$(PYTHON) -m devtools.stargz

render: setup
	$(PYTHON) build.py render

render-check: setup
	$(PYTHON) build.py render --check

lint: setup
	$(VENV)/bin/ruff check torchimages devtools bench tests build.py
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/hadolint --config .hadolint.yaml images/*/Dockerfile
	$(VENV)/bin/actionlint .github/workflows/*.yml

# The main job sets up emulation and the arm64 base only when its selection names an -arm64 row (make test always does).
images: render-check setup
	$(PYTHON) -m devtools.localengine up $(if $(findstring arm64,$(SELECTION)),,--native-only)
	source $(ENGINE_ENV) && $(PYTHON) build.py images $(SELECTION) --wheelhouse $(WHEELHOUSE) --builder $(BUILDER)

# The slowest tests are listed at the end: the suite must stay well inside CI's budget (docs/benchmarks.md).
# The engine and cosign set up while the render check, lint and the engine-free tests run, then the engine tests on
# two processes (devtools/test_lanes.sh).
test: setup softhsm stargz
	TEST_WORKERS=$(TEST_WORKERS) devtools/test_lanes.sh $(PYTHON) $(PYTEST_ARGS)

# Everything that needs no Docker engine: matrix, render, plan, catalog, hostile input, the GPU-simulation lane.
# On TEST_WORKERS processes (pytest-xdist): these tests share no engine, port or folder; those that import torch run on
# one of them (tests/conftest.py's groups).
test-fast: render-check lint softhsm stargz
	$(PYTHON) -m pytest -m "not engine" -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

bench: engine
	source $(ENGINE_ENV) && for script in bench/*_bench.py; do $(PYTHON) $$script || exit 1; done

clean:
	rm -rf reports $(WHEELHOUSE)
