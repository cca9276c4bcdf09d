# make demo : set up everything from nothing (venv, torch, build) and train the example model
# make test : set up everything from nothing and run the test suite
# make build: (re)build the extension in place after a change under csrc/
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.14.1
MAX_JOBS ?= 2
SOURCES := $(shell find csrc -type f) setup.py pyproject.toml

.PHONY: demo test build clean

$(VENV)/.deps:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_SPEC)" numpy pytest ninja setuptools wheel transformers
	touch $@

$(VENV)/.built: $(VENV)/.deps $(SOURCES)
	MAX_JOBS=$(MAX_JOBS) $(PY) -m pip install --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.built

demo: build
	$(PY) examples/train_lm.py

test: build
	$(PY) -m pytest tests -q

clean:
	rm -rf build flashattn_ext/*.so *.egg-info $(VENV)/.built
