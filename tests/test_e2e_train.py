"""End to end, fast: `grpotrainer.py` in a subprocess for --help, mistakes, logging and import weight.

.venv/bin/python -m pytest tests/test_e2e_train.py -q -m "not slow"
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO, event_dirs, read_texts, run_script, stand_in_nvidia_smi, train

import grpotrainer
from grpo import cli, profiles, stats

# ---------------------------------------------------------------------------------------------------------------
# arguments read and checked before torch, transformers or TRL


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("evaluate.py", ["--ADAPTER=/nonexistent"], "ADAPTER=/nonexistent holds no LoRA adapter"),
        ("export.py", ["--ADAPTER=/nonexistent"], "ADAPTER='/nonexistent' holds no LoRA adapter"),
        ("evaluate.py", ["--LIMIT=-1"], "LIMIT=-1 must be at least 0"),
        ("grpotrainer.py", ["--top_pp=0.9"], "unknown setting --top_pp: not a constant nor a GRPOConfig field"),
        ("grpotrainer.py", ["--use_cpu=true"], "--use_cpu is set by the CPU profiles: run --smoke or --demo"),
        ("grpotrainer.py", ["--MAX_STEPS=1e3"], "--MAX_STEPS=1e3 is not a valid int"),
        ("grpotrainer.py", ["MAX_STEPS=3"], "cannot read the argument 'MAX_STEPS=3'"),
    ],
)
def test_a_mistake_is_refused_before_torch_transformers_or_trl_is_imported(script, args, message):
    # a child that never imports torch (so this stays cheap): it reports the heavy modules it loaded and its exit
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{script!r}, *{args!r}]\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    code = stop.code\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets') if m in sys.modules), code)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[] 2", done.stderr  # nothing heavy imported; exit 2 for the user's mistake
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_help_lists_every_constant_with_its_comment():
    out = run_script("grpotrainer.py", "--help")
    assert out.returncode == 0 and not out.stderr
    for name in cli.constants(grpotrainer):
        assert f"--{name}=" in out.stdout
    # each constant's own comment, read from the source, is printed right under it
    source = (REPO / "grpotrainer.py").read_text()
    for name in ("LORA_R", "LORA_DROPOUT"):
        comment = re.search(rf"^{name} = .*?  # (.*)$", source, re.M).group(1)
        printed = out.stdout.split(f"--{name}=")[1].split("\n--")[0]
        assert " ".join(comment.split()) in " ".join(printed.split()[1:])
    assert out.stdout.startswith(grpotrainer.__doc__.strip().splitlines()[0])  # the summary line first
    # command-line syntax, not Python literals: what a user can paste back
    assert f"--REWARD_FUNCS={','.join(grpotrainer.REWARD_FUNCS)}\n" in out.stdout
    assert f"--MODEL_NAME={grpotrainer.MODEL_NAME}\n" in out.stdout
    assert f"--BF16={str(grpotrainer.BF16).lower()}\n" in out.stdout
    assert "--smoke sets, before the command line's own --KEY=value:" in out.stdout
    assert f"MAX_STEPS={profiles.SMOKE['MAX_STEPS']}" in out.stdout.split("--smoke sets")[1]  # the profile's


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        # offline, a Hub id not in the cache is refused before any load is tried (issue 22), with the way out
        (
            ["--smoke", "--MODEL_NAME=nobody/no-such-model"],
            "MODEL_NAME=nobody/no-such-model is a Hub id that is not in",
        ),
        (["--smoke", "--LORA_TARGET_MODULES=no_such_proj"], "no_such_proj matches no layer"),
    ],
)
def test_cli_errors_found_by_loading_exit_2_without_traceback(args, message, tmp_path):
    # these need the model's config or the process group: a fresh Python, as a user runs it
    out = train(tmp_path, *args, profile=None)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    # nothing written: the LoRA targets are checked on the smoke model's config before it is built
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_trl_users_command_line_trains(tmp_path, tiny_model):
    # what `trl grpo` users type: their flag names, `--key value`, and fields the script also sets, all at once
    args = ["--model_name_or_path", tiny_model, "--learning_rate", "1e-5", "--max_steps", "2", "--use_peft"]
    args += ["--log_completions=false", "--num_completions_to_print=2", "--ddp_find_unused_parameters=true"]
    args += ['--model_init_kwargs={"revision": "main"}']
    out = train(tmp_path / "run", "--smoke", *args, profile=None)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("--model_name_or_path is MODEL_NAME here", "--learning_rate is LEARNING_RATE here"):
        assert line in out.stderr
    assert (tmp_path / "run" / "checkpoint-2").is_dir() and not (tmp_path / "run" / "smoke-model").exists()
    assert not (tmp_path / "run" / "completions").exists()  # --log_completions=false was honoured


def test_missing_test_split_fails_before_training(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((REPO / "data" / "smoke_gsm8k.jsonl").read_text())
    out_dir = tmp_path / "out"
    out = train(out_dir, f"--DATASET={data}", "--EVAL_AFTER=2")
    # EVAL_AFTER needs test.jsonl: found missing before any weights load, not after the whole training
    assert out.returncode == 2 and "test.jsonl, which does not exist" in out.stderr
    assert not out_dir.exists()


def test_a_python_without_the_packages_gets_the_command_that_fixes_it(tmp_path):
    # the system python of a fresh machine has no trl: a clear message and exit 2, not a ModuleNotFoundError
    out = run_script(
        "-c", "from grpo import cli; cli.run(lambda argv: cli.require(['no_such_package_xyz'], 'grpotrainer.py'))"
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "lacks no_such_package_xyz" in out.stderr and "make install" in out.stderr


def test_logging_prints_each_library_message_once():
    # huggingface_hub attaches its own handler; configuring the root logger as well printed each Hub retry twice
    code = (
        "import logging, huggingface_hub.utils.logging as h; from grpo import cli; cli.setup_logging('grpotrainer'); "
        "h.get_logger('huggingface_hub.test').warning('retrying in 1s'); logging.getLogger('grpotrainer.x').info('hi')"
    )
    out = run_script("-c", code)
    assert out.stderr.count("retrying in 1s") == 1
    assert "[grpotrainer] hi" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU would start a real run")
def test_a_real_run_on_a_host_with_driver_550_exits_2_naming_it(tmp_path):
    bin_dir = stand_in_nvidia_smi(tmp_path, "550.54.15")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    out = run_script("grpotrainer.py", f"--OUTPUT_DIR={tmp_path / 'run'}", env={"PATH": path}, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "driver 550.54.15" in out.stderr and "torch 2" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_carries_the_paired_test_in_its_files_curve_text_card_and_last_line(tmp_path):
    args = ["--MAX_STEPS=2", "--EVAL_BEFORE=8", "--EVAL_AFTER=8", "--EVAL_STEPS=1", "--EVAL_SUBSET=4"]
    out = train(tmp_path, *args, "--EVAL_SAMPLES=2")
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = (json.loads((tmp_path / f"eval_test_{when}.json").read_text()) for when in ("before", "after"))
    for label in ("strict", "lenient"):
        test, accuracy = after["paired"][label], f"{label}_accuracy"
        # on the same 8 problems the flips are the change in accuracy, and the p-value is their exact test
        assert test["n"] == 8 and test["up"] - test["down"] == round((after[accuracy] - before[accuracy]) * 8)
        assert test["p_value"] == stats.mcnemar_exact(test["up"], test["down"])
    # every evaluation carries its intervals, pass@k for k = 1..EVAL_SAMPLES and lm-eval's figures
    for metrics in (before, after):
        assert metrics["pass_at_k"]["1"] == pytest.approx(metrics["sampled_accuracy"], abs=1e-4)
        assert set(metrics["pass_at_k"]) == {"1", "2"}
        assert {"lm_eval_strict_match_ci95", "lenient_accuracy_ci95", "sampled_accuracy_ci95"} <= set(metrics)
    # the held-out point (step 1, the first 4 problems) pairs with the first 4 of EVAL_BEFORE's 8; before does not
    points = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    paired = [
        (p["when"], p["metrics"]["paired"]["lenient"]["n"] if "paired" in p["metrics"] else None) for p in points
    ]
    assert paired == [("before", None), ("during", 4), ("after", 8)]
    last = out.stderr.strip().splitlines()[-1]
    assert "paired exact test (8 test problems)" in last and f"{after['paired']['lenient']['down']} down, p = " in last
    card = (tmp_path / "README.md").read_text()
    assert "model-index:" in card and "- lenient: " in card
    (run,) = event_dirs(tmp_path)
    assert [step for step, _ in read_texts(run)["eval/paired"]] == [1, 2]  # TensorBoard's Text tab, each point
