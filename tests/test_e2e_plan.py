"""Issue 27 end to end: --plan and --plan=json, the recipes' plans, the plan and the pace in every run, the kept
evaluation points, USE_VLLM=auto and the timed generation.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q tests/test_e2e_plan.py          # fast: plans in seconds
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -m slow tests/test_e2e_plan.py  # + a smoke run (~20 s)
"""

import json
import resource

import pytest
from conftest import GSM8K_DIR, REPO, run_in_process, run_script

import grpotrainer
from demo import sums
from grpo import profiles

needs_gsm8k = pytest.mark.skipif(not (GSM8K_DIR / "train.jsonl").is_file(), reason="real GSM8K is not beside the repo")


def plan_of(*args):
    out = run_script("grpotrainer.py", "--plan=json", *args, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)  # stdout holds the one JSON object and nothing else


@needs_gsm8k
def test_plan_for_the_defaults_meets_the_issues_lines(tmp_path):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = plan_of(f"--DATASET={GSM8K_DIR}", f"--OUTPUT_DIR={tmp_path / 'run'}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert cpu < 60  # CPU seconds: no GPU, no weights, whatever the machine's load
    assert p["completions_per_step"] >= 64 and p["group_size"] >= 8 and p["optimizer_steps"] <= 1000
    assert p["final_eval_problems"] == 1319 and p["final_eval_stderr"] <= 1.5
    assert p["train_problems"] == 7473  # the data loaded as a run loads it
    assert not (tmp_path / "run").exists()  # nothing written: no lock, no checkpoint, no model folder


@needs_gsm8k
def test_plan_follows_the_settings():
    p = plan_of(f"--DATASET={GSM8K_DIR}", "--MAX_STEPS=10", "--NUM_GENERATIONS=4")
    # 10 steps of 64 completions in groups of 4: 16 prompts per step; the final eval unchanged
    assert (p["optimizer_steps"], p["group_size"], p["prompts_per_step"]) == (10, 4, 16)
    assert p["checkpoints"] == [10] and p["final_eval_problems"] == 1319


@needs_gsm8k
def test_plan_text_names_the_sizes():
    out = run_script("grpotrainer.py", "--plan", f"--DATASET={GSM8K_DIR}", timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    # the block every run logs, on stdout here; every time figure labelled an estimate
    assert out.stdout.startswith("plan:") and "64 completions" in out.stdout and "1,319 problems" in out.stdout
    assert all("estimate" in line for line in out.stdout.splitlines() if " s/step" in line)


@needs_gsm8k
@pytest.mark.parametrize("recipe", ["gsm8k-qwen3-8b.yaml", "gsm8k-qwen3-1.7b.yaml"])
def test_each_recipe_plans_a_run_that_learns_and_measures(recipe):
    p = plan_of("--config", str(REPO / "configs" / recipe), f"--DATASET={GSM8K_DIR}")
    assert p["completions_per_step"] >= 64 and p["group_size"] >= 8 and p["optimizer_steps"] <= 1000
    assert p["final_eval_stderr"] <= 1.5
    # the time estimates need the model's config: the Hub, the cache or plan.known_configs
    assert p["estimates"]["H100"]["seconds_per_step"] > 0


@pytest.mark.parametrize("profile", ["--smoke", "--demo"])
def test_profiles_plan_without_building_their_model(profile, tmp_path):
    p = plan_of(profile, f"--OUTPUT_DIR={tmp_path}")
    # the model the profile will use, named, not built: no folder, no warm start
    assert p["model"].startswith(str(tmp_path)) and not (tmp_path / "smoke-model").exists()
    assert not list(tmp_path.glob("demo-sums-model-*"))
    expected = smoke.SMOKE if profile == "--smoke" else sums.DEMO
    assert p["optimizer_steps"] == expected["MAX_STEPS"]


def test_plan_reads_a_models_config_and_never_its_weights(tmp_path, monkeypatch, capsys):
    import safetensors
    import transformers

    model = smoke.ensure_model_dir(tmp_path / "model")

    def refuse(*args, **kwargs):
        raise AssertionError("--plan loaded weights")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(refuse))
    monkeypatch.setattr(safetensors, "safe_open", refuse)
    grpotrainer.main(["--smoke", "--plan=json", f"--MODEL_NAME={model}", f"--OUTPUT_DIR={tmp_path / 'out'}"])
    p = json.loads(capsys.readouterr().out)
    # the folder's config.json gives the shape: the tiny model's 2 layers
    assert p["model_config_source"] == f"{model}/config.json" and p["layers"] == 2


def test_a_bad_plan_flag_is_one_message(capsys):
    code, err = run_in_process(grpotrainer.main, "--plan=yaml", capsys=capsys)
    assert code == 2 and "--plan=json" in err
