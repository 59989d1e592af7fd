"""Issue 27 end to end: --plan and --plan=json through grpotrainer.main, offline: the defaults' plan from GSM8K's
known sizes and Qwen3's known config, the recipes' plans, the profiles' plans, and --plan refusing what the run
refuses. The fast tests run main in this process; one slow test runs `python grpotrainer.py --plan=json` itself (a
new Python importing TRL: ~8 CPU seconds).

OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -m "not slow" tests/test_e2e_plan.py   # fast: in-process plans
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -m slow tests/test_e2e_plan.py         # the script itself (~10 s)
"""

import json
import resource

import pytest
from conftest import GSM8K_DIR, REPO, run_in_process, run_script

import grpotrainer
from demo import smoke, sums
from grpo import gsm8k, hardware

needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "train.jsonl").is_file(), reason="real GSM8K is not beside the repo")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No Hub, as on a machine without one (HF_HUB_OFFLINE, read by grpo/hub.py when asked), in a folder of the
    test's own: a relative OUTPUT_DIR (the constants', a recipe's) lands there, if anywhere."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def plan_of(capsys, *args):
    """`python grpotrainer.py --plan=json *args`, in this process: the plan as a dict."""
    grpotrainer.main(["--plan=json", *args])
    return json.loads(capsys.readouterr().out)  # stdout holds the one JSON object and nothing else


@pytest.mark.slow
def test_the_defaults_plan_offline_as_a_script(tmp_path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = run_script("grpotrainer.py", "--plan=json", f"--OUTPUT_DIR={tmp_path / 'run'}", timeout=120)  # offline
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert out.returncode == 0, out.stderr[-3000:]
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 60  # CPU s: no GPU, no weights
    p = json.loads(out.stdout)  # stdout: one JSON object, the lines for a person on stderr
    # GSM8K's known sizes and Qwen3-8B's known config stand in for the Hub: the plan and its time estimates
    assert (p["train_problems"], p["test_problems"]) == gsm8k.KNOWN_SIZES["openai/gsm8k"]
    assert p["estimates"]["H100"]["seconds_per_step"] > 0 and p["layers"] == 36  # Qwen3-8B: 36 layers
    assert set(p["levers"]) >= {"optimiser steps", "per step", "time (estimate)"}  # the settings behind each line
    if not hardware.cuda_available():  # what stops the run here is a warning for its plan
        assert "on this machine the run would stop: no CUDA GPU is visible" in out.stderr
    assert not (tmp_path / "run").exists()  # nothing written: no lock, no checkpoint, no model folder


def test_the_defaults_plan_meets_the_issues_lines(offline, capsys):
    p = plan_of(capsys, f"--OUTPUT_DIR={offline / 'run'}")
    assert p["completions_per_step"] >= 64 and p["group_size"] >= 8 and p["optimizer_steps"] <= 1000
    assert p["final_eval_problems"] == 1319 and p["final_eval_stderr"] <= 1.5
    assert "grpo/plan.py" in p["model_config_source"]  # not cached, the Hub unreachable: the copy kept here
    assert (p["train_problems"], p["test_problems"]) == gsm8k.KNOWN_SIZES["openai/gsm8k"]  # GSM8K's known sizes
    assert not (offline / "run").exists()


@needs_gsm8k
def test_the_plan_counts_the_data_as_a_run_loads_it(offline, capsys):
    p = plan_of(capsys, f"--DATASET={GSM8K_DIR}", "--MAX_SAMPLES=5000", f"--OUTPUT_DIR={offline / 'run'}")
    # GSM8K's own files, read as training reads them; MAX_SAMPLES caps the training problems, not the test set's
    assert (p["train_problems"], p["test_problems"]) == (5000, 1319)


def test_the_plan_follows_the_settings(offline, capsys):
    p = plan_of(capsys, "--MAX_STEPS=10", "--NUM_GENERATIONS=4")
    # 10 steps of 64 completions in groups of 4: 16 prompts per step; the final eval unchanged
    assert (p["optimizer_steps"], p["group_size"], p["prompts_per_step"]) == (10, 4, 16)
    assert p["checkpoints"] == [10] and p["final_eval_problems"] == 1319


def test_the_plan_text_names_the_sizes(offline, capsys):
    grpotrainer.main(["--plan"])
    out = capsys.readouterr().out
    # the block every run logs, on stdout here; every time figure labelled an estimate
    assert out.startswith("plan:") and "64 completions" in out and "1,319 problems" in out
    assert all("estimate" in line for line in out.splitlines() if " s/step" in line)


@pytest.mark.parametrize("recipe", ["gsm8k-qwen3-8b.yaml", "gsm8k-qwen3-1.7b.yaml"])
def test_each_recipe_plans_a_run_that_learns_and_measures(offline, capsys, recipe):
    p = plan_of(capsys, "--config", str(REPO / "configs" / recipe))
    assert p["completions_per_step"] >= 64 and p["group_size"] >= 8 and p["optimizer_steps"] <= 1000
    assert p["final_eval_stderr"] <= 1.5
    # the time estimates need the model's config: the cache or plan.known_configs
    assert p["estimates"]["H100"]["seconds_per_step"] > 0
    assert list(offline.iterdir()) == []  # the recipe's OUTPUT_DIR not made


@pytest.mark.parametrize("profile", ["smoke", "demo"])
def test_profiles_plan_without_building_their_model(offline, capsys, profile):
    p = plan_of(capsys, f"--{profile}", f"--OUTPUT_DIR={offline / 'run'}")
    # the model the profile will use, named in OUTPUT_DIR, not built: no folder, no warm start
    assert p["model"].startswith(str(offline / "run"))
    assert not (offline / "run" / "smoke-model").exists() and not list((offline / "run").glob("demo-sums-model-*"))
    expected = {"smoke": smoke.SETTINGS, "demo": sums.SETTINGS}[profile]
    assert p["optimizer_steps"] == expected["MAX_STEPS"]


def test_plan_reads_a_models_config_and_never_its_weights(offline, capsys, monkeypatch, tiny_model):
    import safetensors
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("--plan loaded weights")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(safetensors, "safe_open", refuse)
    p = plan_of(capsys, "--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={offline / 'out'}")
    # the folder's config.json gives the shape: the tiny model's 2 layers
    assert p["model_config_source"] == f"{tiny_model}/config.json" and p["layers"] == 2


def test_a_bad_plan_flag_is_one_message(capsys):
    code, err = run_in_process(grpotrainer.main, "--plan=yaml", capsys=capsys)
    assert code == 2 and "--plan=json" in err


@pytest.mark.parametrize("profile", [["--smoke"], []])
def test_plan_refuses_a_config_the_run_refuses_with_the_same_message(offline, capsys, profile):
    out = f"--OUTPUT_DIR={offline / 'run'}"
    code, err = run_in_process(grpotrainer.main, *profile, "--eval_strategy=steps", "--plan", out, capsys=capsys)
    # --plan builds the GRPOConfig and runs its checks, as the run does before loading anything
    assert code == 2 and "Traceback" not in err
    said = err.partition("\nerror: ")[2].strip()
    assert said.startswith("--eval_strategy=steps: evaluation runs through EVAL_BEFORE/EVAL_AFTER here")
    if profile:  # the run itself (on the CPU profile: the defaults' run needs a GPU) ends with the same paragraph
        run_code, run_err = run_in_process(grpotrainer.main, *profile, "--eval_strategy=steps", out, capsys=capsys)
        assert (run_code, run_err.partition("\nerror: ")[2].strip()) == (code, said)
    assert not (offline / "run").exists()  # refused before anything is written
