"""The benchmarks run end to end on CPU: the GPU check's --dry-run (tiny shapes, the same code path as on a GPU) and a
short overhead benchmark; plus the sizes and rooflines the GPU check's figures are computed from.

    pytest tests/test_bench.py -m "not slow"     # seconds
    pytest tests/test_bench.py                   # + the dry run, ~3-6 min on 2 shared cores
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_script

from bench import gpu_check

# Parameters of the real models, and of those the parameters a decode step reads (all but Qwen3-8B's untied input
# embedding, 151936 x 4096 = 622,329,856, which is only a row lookup). 0.6B and 8B match the Hub's configs' sizes.
REAL_SIZES = {
    "qwen3-0.6b": (596_049_920, 596_049_920),
    "qwen3-1.7b": (1_720_574_976, 1_720_574_976),
    "qwen3-8b": (8_190_735_360, 7_568_405_504),
}


@pytest.mark.parametrize("name", REAL_SIZES)
def test_param_count_matches_the_model_transformers_builds(name):
    from demo import smoke

    with gpu_check.build_defaults("meta", torch.bfloat16):  # shapes only: no memory, no initialisation maths
        model = smoke.build_model(smoke.build_tokenizer(), **gpu_check.SHAPES[name])
    shape = gpu_check.SHAPES[name]
    assert sum(p.numel() for p in model.parameters()) == gpu_check.param_count(shape) == REAL_SIZES[name][0]
    assert gpu_check.decode_params(shape) == REAL_SIZES[name][1]
    assert model.config.initializer_range == 0.02  # Qwen's, not smoke.TINY_QWEN3's 0.2 (random logits stay sane)


def test_decode_step_bytes_counts_weights_and_kv_cache():
    # Qwen3-0.6B, bf16: 28 layers x (K and V) x 8 heads x 128 dims x 2 bytes = 114,688 bytes per token of context.
    # At batch 64, a 100-token prompt and 256 new tokens (228 tokens of context on average), the KV cache read per
    # step is 64 x 228 x 114,688 = 1,673,527,296 bytes, 1.4x the 1,192,099,840 bytes of weights.
    assert gpu_check.kv_bytes_per_token(gpu_check.SHAPES["qwen3-0.6b"], 2) == 114_688
    step = gpu_check.decode_step_bytes(gpu_check.SHAPES["qwen3-0.6b"], 2, 64, 100, 256)
    assert step == 1_192_099_840 + 1_673_527_296


@pytest.mark.parametrize(("beta", "passes"), [(0.05, 3), (0.0, 2)])
def test_training_flops_count_the_reference_forward_only_with_beta(beta, passes):
    # 2 FLOPs per parameter and token per pass: forward, backward to the activations, and the reference forward
    shape = gpu_check.SHAPES["qwen3-8b"]
    assert gpu_check.training_flops_per_token(shape, beta) == 2 * 7_568_405_504 * passes


def test_grpo_defaults_are_read_from_grpotrainer_without_importing_it():
    # the same numbers as the script's constants, read from its source (the check never imports the script)
    import grpotrainer

    s = grpotrainer.cli.constants(grpotrainer)
    rounds = s["STEPS_PER_GENERATION"] or s["GRADIENT_ACCUMULATION_STEPS"]
    expected = {"generation_batch": s["PER_DEVICE_TRAIN_BATCH_SIZE"] * rounds, "beta": s["BETA"]}
    assert gpu_check.grpo_defaults() == {**expected, "completion_tokens": s["MAX_COMPLETION_LENGTH"]}


def test_script_defaults_reads_literals_only_of_the_names_asked(tmp_path):
    (tmp_path / "s.py").write_text('import os\nA = 3  # c\nB = [1, "x"]\nC = os.sep\nA2: int = 5\n')
    assert gpu_check.script_defaults(tmp_path / "s.py", ("A", "B")) == {"A": 3, "B": [1, "x"]}


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    env = {"OUT": str(tmp_path / "out"), "PYTHON": os.environ.get("PYTHON", sys.executable)}
    env["GPU_CHECK_VENV"] = str(tmp_path / "venv")  # its own, seeing this environment's packages
    env["GPU_CHECK_OUT"] = ""  # the default: under $OUT, as on the GPU machine
    result = run_script_bash("bench/gpu_check.sh", "--dry-run", "--work", str(tmp_path / "work"), env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = tmp_path / "out" / "gpu_check.json"
    report = json.loads(out.read_text())
    assert (report["dry_run"], report["complete"]) == (True, True)
    assert (report["failed"], report["skipped"]) == ([], ["qwen3-8b eval-vllm", "qwen3-8b step-vllm"])
    assert report["plan"][0] == "qwen3-8b build"  # the default model first (tiny shapes in a dry run)
    cases = {c["case"]: c for c in report["cases"]}
    names = ["calibrate", "build", "step-generate", "weight-sync", "decode-lora-b1", "decode-lora-grpo", "eval-hf"]
    names += ["step-cb", "dtype-after-cb", "step-large", "decode-static-b1", "decode-static-grpo"]
    assert list(cases) == [*names, "eval-vllm", "step-vllm"]  # CASES' order
    vllm = dict.fromkeys(("eval-vllm", "step-vllm"), "skipped")  # no vllm on the CPU
    assert {k: c["status"] for k, c in cases.items()} == {**dict.fromkeys(cases, "ok"), **vllm}
    assert {c["model"] for c in report["cases"][1:]} == {"qwen3-8b"}
    assert (out.parent / "gpu_check-logs" / "qwen3-8b-decode-static.log").is_file()  # the logs lie beside the JSON
    for case in report["cases"]:  # the keys the issue asks every case to carry, measured or not
        assert set(gpu_check.KEYS) <= set(case), case["case"]
    for name in ("decode-lora-b1", "decode-lora-grpo", "decode-static-b1", "decode-static-grpo"):
        decode = cases[name]
        assert decode["lora"] is True and len(decode["decode_step_seconds_repeats"]) == gpu_check.DECODE_REPEATS
        assert decode["decode_step_seconds"] == gpu_check.median(decode["decode_step_seconds_repeats"])
        assert decode["cpu_seconds_per_token"] > 0 and decode["launches_per_token"] > 0
    assert (cases["decode-lora-b1"]["cache_implementation"], cases["decode-static-b1"]["cache_implementation"]) == (
        "dynamic",
        "static",
    )
    assert cases["decode-static-b1"]["warmup_seconds"] > 0  # the compile, apart from the timed repeats
    default = gpu_check.grpo_defaults()["generation_batch"]  # the script's layout: one generate call's sequences
    large = gpu_check.grpo_defaults(**gpu_check.LARGE_LAYOUT)["generation_batch"]
    assert (cases["decode-lora-b1"]["batch"], cases["decode-lora-grpo"]["batch"]) == (1, default)
    for name, completions in (("step-generate", default), ("step-cb", default), ("step-large", large)):
        step = cases[name]
        assert step["completions"] == completions and len(step["steps_seconds"]) == 3  # one warm-up step, two timed
        assert step["step_seconds"] == gpu_check.median(step["steps_seconds"][1:])
        assert 0 < step["generation_share"] < 1 and step["step_seconds"] > 0 and step["matmul_efficiency"] > 0
        assert {"--EVAL_STEPS=0", "--EVAL_BEFORE=0", "--EVAL_AFTER=0"} <= set(step["grpotrainer_args"])
        assert step["peak_memory_gib"] is None  # CPU: no CUDA allocator to ask
    sync = cases["weight-sync"]  # ours leaves the bf16 base alone and sends the fp32 merge; TRL's moves the base
    assert (sync["passed"], sync["base_bit_identical"], sync["engine_off_exact_merge_share"]) == (True, True, 0.0)
    assert len(sync["sync_seconds_repeats"]) == len(sync["trl_sync_seconds_repeats"]) == gpu_check.SYNCS
    assert sync["trl_base_changed_share"] > 0 and sync["trl_base_max_abs_drift"] > 0
    held_out = cases["eval-hf"]  # one evaluation call: the script's EVAL_BATCH_SIZE prompts, every one answered
    batch = gpu_check.script_defaults(REPO / "grpotrainer.py", ("EVAL_BATCH_SIZE",))["EVAL_BATCH_SIZE"]
    assert held_out["prompts"] == batch
    assert held_out["eval_call_seconds"] > 0 and held_out["completion_tokens"] >= held_out["prompts"]
    dtype_check = cases["dtype-after-cb"]
    assert dtype_check["passed"] is True and dtype_check["dtypes_per_step"][-1] == {
        "lora": ["float32"],
        "inv_freq": ["float32"],
    }
    host = report["host"]
    assert host["cpu_count"] == os.cpu_count() and host["cpu_model"]
    assert host["cpu_seconds_per_token"] > 0 and host["launches_per_token"] > 0
    assert report["calibration"]["bandwidth_bytes_per_s"] > 0 and report["calibration"]["matmul_flops_per_s"] > 0


def test_an_install_that_fails_still_leaves_a_json_with_the_step_and_the_log(tmp_path):
    # a machine without trl, and a wheel folder without its wheels: pip cannot install, and says so in the JSON
    venv, pip_only = tmp_path / "venv", tmp_path / "pip-only"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    pip_only.mkdir()
    (pip_only / "pip").symlink_to(Path(importlib.util.find_spec("pip").origin).parent)
    purelib = subprocess.run(
        [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "pip-only.pth").write_text(f"{pip_only}\n")  # pip, and no trl, no datasets
    (tmp_path / "no-wheels").mkdir()
    env = {"OUT": str(tmp_path / "out"), "GPU_CHECK_OUT": "", "GPU_CHECK_VENV": str(venv)}
    env["GPU_CHECK_WHEELS"] = str(tmp_path / "no-wheels")
    result = run_script_bash("bench/gpu_check.sh", "--dry-run", env=env)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    assert (report["failed_step"], report["failed"], report["complete"]) == ("install", ["install"], False)
    assert "trl" in report["log_tail"] and Path(report["log"]).is_file()
    assert "install" in result.stderr  # the same said on the terminal


def test_default_plan_measures_qwen3_8b_first_and_the_small_model_after_or_in_quick():
    args = gpu_check.parse_args([])
    assert args.models == ["qwen3-8b", "qwen3-0.6b"] and args.cases[0] == "step-generate"
    assert args.cases.index("decode") < args.cases.index("decode-static")
    assert gpu_check.parse_args(["--quick"]).models == ["qwen3-0.6b"]
    assert gpu_check.parse_args(["--dry-run"]).models == ["qwen3-8b"]


def test_default_call_fits_one_15_minute_loan_with_the_machine_start():
    # the deadline the case budgets are checked against, install included (gpu_check.sh passes what it spent); the
    # loan holds the machine's start (~3 min) and one command of at most 10 min, the deadline a minute under it
    assert gpu_check.DEADLINE + 60 <= 10 * 60 and 3 * 60 + 10 * 60 <= 15 * 60
    args = gpu_check.parse_args(["--spent", "30"])
    assert args.deadline == gpu_check.DEADLINE - 30


def test_by_budget_alone_the_default_call_reaches_the_held_out_evaluation_of_qwen3_8b():
    # after ~30 s of install: calibrate, build, then each case up to eval, at their budgets, within the deadline
    cases = gpu_check.CASES[: gpu_check.CASES.index("eval") + 1]
    budgets = [gpu_check.budget_of("calibrate"), *(gpu_check.budget_of(c, "qwen3-8b") for c in ("build", *cases))]
    assert cases == ("step-generate", "weight-sync", "decode", "eval")
    assert 30 + sum(budgets) <= gpu_check.DEADLINE


@pytest.mark.parametrize("case", gpu_check.STEP_CASES)
@pytest.mark.parametrize("dry_run", [False, True])
def test_step_cases_run_with_evaluation_off(case, dry_run, tmp_path):
    flags = ["--dry-run"] if dry_run else []
    args = gpu_check.parse_args([*flags, "--cases", case])
    args.case, args.model_dir = case, str(tmp_path / "m")
    argv = gpu_check.step_arguments(args, tmp_path / "run")
    assert {"--EVAL_STEPS=0", "--EVAL_BEFORE=0", "--EVAL_AFTER=0"} <= set(argv)
    assert len({a.split("=")[0] for a in argv}) == len(argv)  # each setting given once


def test_the_large_layout_decodes_twice_the_default_in_one_generate_call():
    large = gpu_check.grpo_defaults(**gpu_check.LARGE_LAYOUT)
    default = gpu_check.grpo_defaults()
    assert large["generation_batch"] == 2 * default["generation_batch"] == 128  # in one generate call


def test_host_facts_name_the_cpu_and_its_cores():
    host = gpu_check.host_facts()
    assert host["cpu_count"] == os.cpu_count() and 1 <= host["usable_cpus"] <= os.cpu_count()
    assert isinstance(host["cpu_model"], str) and host["cpu_model"]


def test_a_step_case_reports_each_figure_as_the_median_of_the_timed_steps():
    steps = [{"step_seconds": 9.0, "generation_share": 0.2}, {"step_seconds": 5.0, "generation_share": 0.6}]
    steps.append({"step_seconds": 6.0, "generation_share": 0.4})
    assert gpu_check.medians(steps) == {"step_seconds": 6.0, "generation_share": 0.4}  # not one step's pair
    assert gpu_check.medians(steps[:2]) == {"step_seconds": 7.0, "generation_share": 0.4}


def test_repeats_leave_the_warm_up_out_and_launches_count_ops():
    calls = []
    times, warmup = gpu_check.repeat_times(lambda: calls.append(1), 3)
    assert len(times) == 3 and len(calls) == 4 and warmup >= 0  # the warm-up call is not among the repeats
    # on the CPU every aten op counts (what would each launch a kernel on a GPU): 3 adds, 3 more than 0
    x = torch.ones(4)
    assert gpu_check.launches(lambda: x + x + x + x, cuda=False) - gpu_check.launches(lambda: None, cuda=False) >= 3


def test_fp32_check_sees_a_bf16_rotary_buffer_and_adapter():
    from peft import LoraConfig, get_peft_model

    from demo import smoke

    model = smoke.build_model(smoke.build_tokenizer())
    model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    assert gpu_check.fp32_check(model) == {"lora": ["float32"], "inv_freq": ["float32"]}
    model.to(torch.bfloat16)  # what TRL does before continuous batching, without the guard
    assert gpu_check.fp32_check(model) == {"lora": ["bfloat16"], "inv_freq": ["bfloat16"]}


def test_a_case_whose_budget_exceeds_the_time_left_is_skipped_not_started(tmp_path):
    args = gpu_check.parse_args(["--dry-run", "--work", str(tmp_path)])
    args.logs = str(tmp_path / "logs")  # never created: nothing starts, so no log is opened
    deadline = time.monotonic() + 30
    result, status, reason, seconds = gpu_check.in_child(args, "calibrate", 60, deadline)
    assert (result, status, seconds) == (None, "skipped", 0.0)
    assert reason in ("its budget of 60 s is more than the 30 s left", "its budget of 60 s is more than the 29 s left")
    assert not (tmp_path / "logs").exists()


def test_a_tiny_deadline_skips_every_case_reports_it_and_exits_0(tmp_path, monkeypatch):
    monkeypatch.delenv("GPU_CHECK_OUT", raising=False)
    monkeypatch.setenv("OUT", str(tmp_path / "out"))  # the GPU machine's folder: the JSON lands under it
    report = gpu_check.main(["--dry-run", "--deadline", "1", "--work", str(tmp_path / "work")])
    # calibrate's budget (DRY_BUDGET) is more than 1 s: skipped, and nothing after it can run without it
    assert [(c["case"], c["status"]) for c in report["cases"]] == [("calibrate", "skipped")]
    assert report["plan"][:2] == ["qwen3-8b build", "qwen3-8b step-generate"]  # the default model's cases first
    assert (report["failed"], report["skipped"], report["complete"]) == ([], ["device calibrate"], False)
    assert gpu_check.exit_status(report) == 0  # nothing failed
    assert json.loads((tmp_path / "out" / "gpu_check.json").read_text())["cases"] == report["cases"]


@pytest.mark.parametrize(
    ("statuses", "complete", "exit_status"),
    [(["ok", "skipped"], True, 0), (["ok", "timeout"], False, 1), (["error", "skipped"], False, 1)],
)
def test_complete_means_every_case_that_ran_succeeded(statuses, complete, exit_status):
    # a timeout is a case that ran past its own budget: a failure, unlike a case skipped for want of time
    cases = [gpu_check.case_record(f"c{i}", "m", status=status) for i, status in enumerate(statuses)]
    report = gpu_check.summarise({"cases": cases})
    assert (report["complete"], gpu_check.exit_status(report)) == (complete, exit_status)


class FakeCase:
    """subprocess.Popen for gpu_check's children on a fake clock: each case "takes" SECONDS[case] and writes the
    result a real child would (in shape); one that takes longer than its timeout raises as the real wait does."""

    SECONDS = dict.fromkeys(("calibrate", "build", "step-generate", "decode", "step-cb", "step-large"), 10)
    SECONDS |= dict.fromkeys(("decode-static", "weight-sync", "eval"), 10)
    DTYPES_PASS = True  # what step-cb's dtype check finds
    SYNC_PASS = True  # what weight-sync's check finds

    def __init__(self, cmd, clock, **kwargs):
        self.case, self.result, self.clock, self.pid = (
            cmd[cmd.index("--case") + 1],
            cmd[cmd.index("--result") + 1],
            clock,
            0,
        )

    def wait(self, timeout=None):
        import subprocess

        took = self.SECONDS[self.case]
        if getattr(self, "killed", False):  # the wait after os.killpg: the process is gone at once
            return -9
        if timeout is not None and took > timeout:
            self.killed = True
            self.clock[0] += timeout
            raise subprocess.TimeoutExpired(self.case, timeout)
        self.clock[0] += took
        calibration = {"bandwidth_bytes_per_s": 1.0, "matmul_flops_per_s": 1.0, "matmul_dtype": "float32"}
        names = {"decode": ["decode-lora-b1", "decode-lora-grpo"], "step-cb": ["step-cb", "dtype-after-cb"]}
        names |= {"decode-static": ["decode-static-b1", "decode-static-grpo"], "eval": ["eval-hf"]}
        records = [gpu_check.case_record(name, "qwen3-8b") for name in names.get(self.case, [self.case])]
        if self.case == "step-cb":
            records[1]["passed"] = self.DTYPES_PASS
        if self.case == "weight-sync":
            records[0].update(passed=self.SYNC_PASS, base_bit_identical=self.SYNC_PASS)
        result = {"calibrate": calibration, "build": {"params": 1}}.get(self.case, {"records": records})
        Path(self.result).write_text(json.dumps(result))
        return 0


def run_faked(tmp_path, monkeypatch, deadline):
    """gpu_check.main's dry run with FakeCase children on a fake clock, every budget DRY_BUDGET = 100 s."""
    from types import SimpleNamespace

    clock = [0.0]
    monkeypatch.setattr(gpu_check, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(gpu_check.subprocess, "Popen", lambda cmd, **kw: FakeCase(cmd, clock))
    monkeypatch.setattr(gpu_check.os, "killpg", lambda pid, sig: None)
    monkeypatch.setattr(gpu_check, "DRY_BUDGET", 100)
    monkeypatch.setenv("GPU_CHECK_OUT", str(tmp_path / "gpu.json"))
    return gpu_check.main(["--dry-run", "--deadline", str(deadline), "--work", str(tmp_path / "work")])


def test_skipped_when_the_budget_exceeds_the_time_left_timed_out_past_its_own(tmp_path, monkeypatch):
    monkeypatch.setitem(FakeCase.SECONDS, "step-large", 150)
    report = run_faked(tmp_path, monkeypatch, 260)
    statuses = [(c["case"], c["status"]) for c in report["cases"]]
    # 7 cases of 10 s leave 190 s: step-large (budget 100) starts, and is killed at its budget, 150 > 100;
    # 90 s are left, less than decode-static's budget of 100: skipped, not started and cut off by the deadline
    assert statuses == [
        ("calibrate", "ok"),
        ("build", "ok"),
        ("step-generate", "ok"),
        ("weight-sync", "ok"),
        ("decode-lora-b1", "ok"),
        ("decode-lora-grpo", "ok"),
        ("eval-hf", "ok"),
        ("step-cb", "ok"),
        ("dtype-after-cb", "ok"),
        ("step-large", "timeout"),
        ("decode-static", "skipped"),
        ("eval-vllm", "skipped"),
        ("step-vllm", "skipped"),
    ]
    assert report["cases"][-3]["reason"] == "its budget of 100 s is more than the 90 s left"
    assert (report["failed"], report["complete"], gpu_check.exit_status(report)) == (
        ["qwen3-8b step-large"],
        False,
        1,
    )


def test_a_dtype_check_that_finds_bf16_is_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeCase, "DTYPES_PASS", False)
    report = run_faked(tmp_path, monkeypatch, 1000)
    check = next(c for c in report["cases"] if c["case"] == "dtype-after-cb")
    assert (check["status"], check["passed"]) == ("error", False)
    assert (report["failed"], gpu_check.exit_status(report)) == (["qwen3-8b dtype-after-cb"], 1)


def test_a_weight_sync_that_moved_the_base_is_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(FakeCase, "SYNC_PASS", False)
    report = run_faked(tmp_path, monkeypatch, 1000)
    check = next(c for c in report["cases"] if c["case"] == "weight-sync")
    assert (check["status"], check["passed"]) == ("error", False) and "base_bit_identical" in check["reason"]
    assert (report["failed"], gpu_check.exit_status(report)) == (["qwen3-8b weight-sync"], 1)


def test_quick_runs_the_small_model_alone_in_its_own_deadline():
    args = gpu_check.parse_args(["--quick"])
    assert (args.models, args.cases) == (["qwen3-0.6b"], gpu_check.QUICK["cases"])
    assert args.deadline == gpu_check.QUICK["deadline"] < gpu_check.DEADLINE


def run_script_bash(*args, env):
    """run_script's environment (offline, one thread), for a bash script."""
    import subprocess

    base = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        ["bash", *args], cwd=REPO, env={**os.environ, **base, **env}, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow  # a real benchmark process, 8 smoke steps
def test_overhead_bench_runs_and_times_the_same_work(tmp_path):
    args = ["--steps", "4", "--warmup", "1", "--repeats", "1", "--json", str(tmp_path / "overhead.json")]
    result = run_script("bench/bench_overhead.py", *args)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "overhead.json").read_text())
    assert report["same_tokens"] is True  # same seed, model, prompts: both sides sampled the same completions
    assert report["timed_steps"] == 2  # 4 steps: 3 step-to-step intervals, the first dropped as warm-up
    assert report["ratio"] > 0 and report["ratio_q1"] <= report["ratio"] <= report["ratio_q3"]


@pytest.mark.slow  # a real benchmark process: two syncs each way on the 71M-parameter bf16 model
def test_weight_sync_bench_shows_trls_drift_and_none_of_ours(tmp_path):
    result = run_script("bench/bench_weight_sync.py", "--syncs", "2", "--json", str(tmp_path / "sync.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "sync.json").read_text())
    assert report["ours"]["base_changed_share"] == 0 and report["ours"]["engine_off_exact_merge_share"] == 0
    assert report["trl"]["base_changed_share"] > 0  # the control: TRL's in-place merge and unmerge move the base
    assert report["cpu_ratio_ours_over_trl"] > 0


def test_fetch_wheels_finds_python_312_past_a_failing_shim(tmp_path):
    # python3.12 on PATH is a pyenv shim that fails; the pyenv version behind it is found and used
    shims, version = tmp_path / "shims", tmp_path / "pyenv" / "versions" / "3.12.9" / "bin"
    shims.mkdir()
    version.mkdir(parents=True)
    (shims / "python3.12").write_text("#!/bin/sh\necho 'pyenv: python3.12: command not found' >&2\nexit 127\n")
    (version / "python3.12").write_text("#!/bin/sh\nexit 0\n")  # stands in for a Python 3.12: the check passes
    for script in (shims / "python3.12", version / "python3.12"):
        script.chmod(0o755)
    finder = 'source <(sed -n "/^find_python312()/,/^}/p" bench/fetch_wheels.sh) && find_python312'
    env = {"PATH": f"{shims}:/usr/bin:/bin", "PYENV_ROOT": str(tmp_path / "pyenv"), "PYTHON": ""}
    result = run_script_bash("-c", finder, env=env)
    assert (result.returncode, result.stdout.strip()) == (0, str(version / "python3.12")), result.stderr
