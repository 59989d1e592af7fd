# Targets a newcomer can guess. Each one sets up .venv on first use, so they work on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install install-dev install-cuda train smoke demo test test-fast lint bench

$(VENV)/installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

$(VENV)/installed-dev: $(VENV)/installed requirements-dev.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

# flash-attn, bitsandbytes, DeepSpeed and Liger: CUDA machines only, all optional (see requirements-cuda.txt).
# flash-attn compiles against the installed torch and needs nvcc; without it, training uses PyTorch's sdpa.
$(VENV)/installed-cuda: $(VENV)/installed requirements-cuda.txt
	$(PY) -m pip install --quiet setuptools wheel ninja packaging psutil
	MAX_JOBS=4 $(PY) -m pip install --quiet --no-build-isolation -r requirements-cuda.txt
	touch $@

install: $(VENV)/installed
install-dev: $(VENV)/installed-dev
install-cuda: $(VENV)/installed-cuda

train: install
	@if command -v nvidia-smi >/dev/null && [ ! -f $(VENV)/installed-cuda ]; then \
		echo "note: for flash-attn, QLoRA, DeepSpeed and Liger run 'make install-cuda' once (optional)"; fi
	$(PY) grpotrainer.py $(ARGS)

smoke: install
	$(PY) grpotrainer.py --smoke $(ARGS)

# GRPO visibly raising held-out accuracy on the CPU in minutes (docs/demo.md); plot it with bench/plot_demo.py.
demo: install
	$(PY) grpotrainer.py --demo $(ARGS)

test: install-dev
	$(PY) -m pytest -q $(ARGS)

test-fast: install-dev
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: install-dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install-dev
	$(PY) bench/bench_rewards.py
	$(PY) bench/bench_overhead.py
