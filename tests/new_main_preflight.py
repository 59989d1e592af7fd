"""preflight's GPU diagnosis: no NVIDIA driver at all, or a driver this torch's CUDA build cannot use.

.venv/bin/python -m pytest tests/new_main_preflight.py -q
"""

import os
import stat

import pytest
import torch
from conftest import run_script

from grpo import preflight


def stand_in_nvidia_smi(folder, driver):
    """An nvidia-smi on PATH that reports `driver`, as the real one answers --query-gpu=driver_version."""
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho '{driver}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return folder


def test_the_driver_is_read_from_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{stand_in_nvidia_smi(tmp_path, '550.54.15')}{os.pathsep}{os.environ['PATH']}")
    assert preflight.nvidia_driver() == "550.54.15"
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no nvidia-smi anywhere
    assert preflight.nvidia_driver() is None


@pytest.mark.parametrize(
    "built, driver, says",
    [
        (None, "550.54.15", "a CPU-only build"),  # a CPU wheel on a GPU host
        ("13.0", "550.54.15", "built for CUDA 13.0, which needs driver >= 580"),  # the registry's default build
        ("12.8", "470.82.01", "built for CUDA 12.8, which needs driver >= 525"),
    ],
)
def test_a_driver_torch_cannot_use_is_named_with_both_fixes(built, driver, says, monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", built)
    message = preflight.no_gpu_problem(driver)
    assert f"driver {driver}" in message and says in message
    assert "pip install torch==" in message and "--index-url https://download.pytorch.org/whl/cu12" in message
    assert "upgrade the driver to >= 580" in message
    assert message.count("\n") <= 1  # two lines at most


def test_a_new_enough_driver_points_elsewhere(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    message = preflight.no_gpu_problem("580.65.06")
    assert "new enough" in message and "CUDA_VISIBLE_DEVICES=''" in message and "pip install" not in message


def test_without_a_driver_the_message_is_the_cpu_one():
    assert "make smoke" in preflight.no_gpu_problem(None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU would start a real run")
def test_a_real_run_on_a_host_with_driver_550_exits_2_naming_it(tmp_path):
    bin_dir = stand_in_nvidia_smi(tmp_path, "550.54.15")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    out = run_script("grpotrainer.py", f"--OUTPUT_DIR={tmp_path / 'run'}", env={"PATH": path}, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "driver 550.54.15" in out.stderr and "torch 2" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "gens, accumulation, fix",
    [
        (1_000_000_007, 8, "NUM_GENERATIONS=8"),  # a huge prime group: the closest divisor of 8, found at once
        (7, 10**11, "GRADIENT_ACCUMULATION_STEPS=100000000002"),  # the next multiple of 7, without counting to it
    ],
)
def test_the_batch_rule_answers_at_once_for_huge_values(gens, accumulation, fix, settings):
    import time

    s = {**settings, "NUM_GENERATIONS": gens, "GRADIENT_ACCUMULATION_STEPS": accumulation}
    s |= {"PER_DEVICE_TRAIN_BATCH_SIZE": 1, "STEPS_PER_GENERATION": 0}
    start = time.process_time()
    (message,) = preflight._batch(s)
    assert fix in message
    assert time.process_time() - start < 5  # CPU seconds: it was minutes (a loop to 1e11)


@pytest.mark.parametrize("field", ["--adam_beta1=2", "--adam_beta2=-0.5", "--adam_epsilon=-1"])
def test_out_of_range_optimizer_fields_are_refused_before_training(field, tmp_path, capsys, monkeypatch):
    from conftest import run_in_process

    import grpotrainer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = f"--OUTPUT_DIR={tmp_path / 'run'}"
    code, stderr = run_in_process(grpotrainer.main, "--smoke", field, out, capsys=capsys)
    assert code == 2 and "optimizer settings are invalid" in stderr and "Traceback" not in stderr


def test_fsdp2_is_marked_experimental_by_preflight(settings, monkeypatch, caplog, gpu):
    gpu(count=1)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    preflight.hardware_problems(settings, cpu_only=False)
    assert any("FSDP2 is experimental" in r.message and "all-gathers" in r.message for r in caplog.records)
    caplog.clear()
    monkeypatch.setenv("FSDP_VERSION", "1")
    preflight.hardware_problems(settings, cpu_only=False)
    assert not any("FSDP2" in r.message for r in caplog.records)


def test_under_fsdp_the_model_loads_without_a_device_map(settings, monkeypatch):
    import grpotrainer

    assert "device_map" not in grpotrainer.build_model_init_kwargs(settings, cpu_only=True)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    assert grpotrainer.build_model_init_kwargs(settings, cpu_only=True)["device_map"] is None


@pytest.mark.parametrize("gold", ["#### 1e3", "#### 1 000", "#### 2^10", "#### 1.5.2"])
def test_a_gold_that_does_not_read_as_one_number_is_refused_with_its_line(gold, tmp_path):
    import json

    from grpo import gsm8k
    from grpo.errors import ConfigError

    path = tmp_path / "train.jsonl"
    rows = [{"question": "q", "answer": "#### 5"}, {"question": "q", "answer": f"so\n{gold}"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(ConfigError, match="line 2: "):
        gsm8k.load(str(path))
    assert gsm8k.load(str(path), skip_bad_rows=True)["answer"] == ["5"]  # never read as a different number
