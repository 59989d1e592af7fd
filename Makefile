# Targets a newcomer can guess. Each one sets up .venv on first use, so they work on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install install-cuda train smoke test test-fast lint bench

$(VENV)/installed: requirements.txt requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/installed

# flash-attn, bitsandbytes, DeepSpeed and Liger: CUDA machines only (see requirements-cuda.txt).
install-cuda: install
	$(PY) -m pip install --quiet setuptools wheel ninja packaging psutil
	MAX_JOBS=4 $(PY) -m pip install --quiet --no-build-isolation -r requirements-cuda.txt

train: install
	@if command -v nvidia-smi >/dev/null; then $(MAKE) --no-print-directory install-cuda; fi
	$(PY) grpotrainer.py $(ARGS)

smoke: install
	$(PY) grpotrainer.py --smoke $(ARGS)

test: install
	$(PY) -m pytest -q $(ARGS)

test-fast: install
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install
	$(PY) bench/bench_rewards.py
	$(PY) bench/bench_overhead.py
