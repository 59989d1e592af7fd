"""Tests of grpo/preflight.py: settings, OUTPUT_DIR, model folders and rewards checked before training.

.venv/bin/python -m pytest tests/test_preflight.py -q -m "not slow"
"""

import _thread
import asyncio
import contextlib
import json
import math
import os
import re
import shutil
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, custom_code_model, load_rewards, parse, run_in_process, stand_in_nvidia_smi

import grpotrainer
import rewards
from grpo import files, generation, gsm8k, hardware, preflight, reward_guard, settings
from grpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# a damaged model folder, refused before its weights load


def model_folder(tmp_path):
    """A small, whole model folder in Qwen3's layout: config, tokenizer with a chat template, one weights file."""
    from safetensors.torch import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    import torch

    save_file({"w": torch.zeros(4, 4)}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "tokenizer_config.json").write_text("{not json"),
            "tokenizer_config.json is not JSON (JSONDecodeError: Expecting",
        ),
        (lambda f: (f / "generation_config.json").write_bytes(b"\xff\xfe"), "generation_config.json is not JSON"),
        (
            lambda f: (f / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}})
            ),
            "the weight shards model-00002-of-00002.safetensors that model.safetensors.index.json lists are missing",
        ),
    ],
)
def test_a_damaged_model_folder_names_the_file(tmp_path, damage, message):
    from grpo import preflight

    folder = model_folder(tmp_path)
    preflight.refuse_torn_model_folder(str(folder))  # whole: passes
    damage(folder)
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.refuse_torn_model_folder(str(folder))


# ---------------------------------------------------------------------------------------------------------------
# OUTPUT_DIR forms


def test_an_output_dir_through_a_dangling_link_is_refused_naming_the_link(tmp_path):
    from grpo import preflight

    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for out in (tmp_path / "link", tmp_path / "link" / "run"):  # the link itself, or a folder below it
        problem = preflight.output_dir_problem(str(out))
        assert problem == (
            f"OUTPUT_DIR={out}: {tmp_path / 'link'} is a symbolic link to {tmp_path / 'gone'}, which does not exist; "
            "create that folder, or remove the link."
        )


@pytest.mark.parametrize("name", ["with space 🙂", "a,b=c", "-leading-dash"])
def test_an_output_dir_with_spaces_emoji_or_symbols_is_a_folder_like_any(tmp_path, name):
    from grpo import preflight

    assert preflight.output_dir_problem(str(tmp_path / name)) is None  # nothing in the name is special


def test_an_output_dir_name_too_long_for_the_file_system_is_refused():
    from grpo import preflight

    problem = preflight.output_dir_problem("/tmp/" + "y" * 300)
    assert problem.endswith("cannot be created or written (File name too long); choose a writable folder.")


# ---------------------------------------------------------------------------------------------------------------
# The batch rule counts every process of every node


@pytest.mark.parametrize(
    ("world_size", "generations", "problem"),
    [
        (4, 4, None),  # 1 x 4 x 1 = 4: one group per round across 2 nodes x 2 GPUs
        (1, 4, "= 1 x 1 x 1 = 1 completions"),  # the same settings on one process fail
        (4, 8, "= 1 x 4 x 1 = 4 completions"),  # half a group per round ...
    ],
)
def test_batch_rule_counts_every_node(smoke_settings, monkeypatch, world_size, generations, problem):
    from grpo import preflight
    from grpo.errors import ConfigError

    # torchrun and accelerate set WORLD_SIZE to the count over all nodes (2 nodes x 2 processes = 4)
    monkeypatch.setenv("WORLD_SIZE", str(world_size))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # as torchrun sets it beside WORLD_SIZE
    s = {**smoke_settings, "PER_DEVICE_TRAIN_BATCH_SIZE": 1, "GRADIENT_ACCUMULATION_STEPS": 1}
    s["NUM_GENERATIONS"] = generations
    if problem is None:
        preflight.refuse_bad_settings(s, cpu_only=True)
        return
    with pytest.raises(ConfigError) as err:
        preflight.refuse_bad_settings(s, cpu_only=True)
    assert problem in str(err.value)
    assert "(processes count every node)" in str(err.value)


def test_batch_rule_suggests_a_fix_that_counts_every_node(smoke_settings, monkeypatch):
    from grpo import preflight
    from grpo.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    s = {**smoke_settings, "PER_DEVICE_TRAIN_BATCH_SIZE": 1, "GRADIENT_ACCUMULATION_STEPS": 1, "NUM_GENERATIONS": 8}
    with pytest.raises(ConfigError) as err:
        preflight.refuse_bad_settings(s, cpu_only=True)
    assert "Set GRADIENT_ACCUMULATION_STEPS=2, or NUM_GENERATIONS=4." in str(err.value)  # 1 x 4 x 2 = 8


# ---------------------------------------------------------------------------------------------------------------
# 1. a folder holding files no run wrote


def run_into(folder, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return run_in_process(grpotrainer.main, "--smoke", f"--OUTPUT_DIR={folder}", capsys=capsys)


@pytest.mark.parametrize(
    "names", [["README.md", "tokenizer.json"], ["notes.txt"], ["checkpoint-2/"], [".git/"], ["smoke-model", "x.py"]]
)
def test_a_folder_with_the_users_files_is_refused_and_left_alone(tmp_path, capsys, monkeypatch, names):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in names:  # a name ending in / is a folder
        (folder / name).mkdir() if name.endswith("/") else (folder / name).write_text("the user's")
    before = sorted(p.name for p in folder.iterdir())
    code, err = run_into(folder, capsys, monkeypatch)
    assert code == 2 and f"OUTPUT_DIR={folder} holds files no training run wrote" in err  # refused, naming it
    assert "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written, nothing replaced


@pytest.mark.parametrize("where", ["cwd", "checkout", "checkout parent", "home", "/"])
def test_the_current_folder_the_checkout_and_home_are_refused(tmp_path, capsys, monkeypatch, where):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    folder = {"cwd": ".", "checkout": REPO, "checkout parent": REPO.parent, "home": "~", "/": "/"}[where]
    code, err = run_into(folder, capsys, monkeypatch)
    assert code == 2 and "a run writes README.md, tokenizer and adapter files there" in err
    assert "OUTPUT_DIR=" in err


def test_a_runs_own_folder_is_accepted(tmp_path, smoke_settings):
    # missing, empty, the profile's model only, a run's settings, a killed run's lock: each is a run's own
    empty = tmp_path / "empty"
    empty.mkdir()
    profile = tmp_path / "profile"
    (profile / "smoke-model").mkdir(parents=True)
    (profile / "demo-sums-seed0").mkdir()
    (profile / "demo-sums-model-seed0.sft123").mkdir()
    ran = tmp_path / "ran"
    files.write_settings(ran, {**smoke_settings, "grpo_config": {}})
    (ran / "README.md").write_text("our card")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "run.lock").write_text("")  # filelock's file, and the holder beside it, as a killed run leaves them
    (locked / "run.lock.json").write_text(json.dumps({"pid": 1, "host": "h"}))
    for folder in (tmp_path / "missing", empty, profile, ran, locked):
        assert preflight.run_folder_problem(folder) is None, folder
    (empty / "run_settings.json").write_text('{"something": "else"}')  # a file of that name, not ours
    assert "holds files no training run wrote (run_settings.json)" in preflight.run_folder_problem(empty)


# ---------------------------------------------------------------------------------------------------------------
# 4. pass-through fields that would switch off checkpoints or override a constant


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"save_strategy": "no"}, "--save_strategy=no: this script saves a checkpoint every SAVE_STEPS"),
        ({"save_strategy": "epoch"}, "--save_strategy=epoch: this script saves a checkpoint every SAVE_STEPS"),
        ({"save_only_model": True}, "--save_only_model=true: a checkpoint without the optimizer"),
        ({"generation_kwargs": {"max_new_tokens": 9}}, "sets max_new_tokens, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"max_length": 9}}, "sets max_length, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"min_new_tokens": 9}}, "sets min_new_tokens, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"max_tokens": 9}}, "sets max_tokens, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"temperature": 0.1}}, "sets temperature, which is set by TEMPERATURE"),
        ({"generation_kwargs": {"do_sample": False}}, "sets do_sample, which is set by GRPO itself"),
        (
            {"generation_kwargs": {"num_return_sequences": 2}},
            "sets num_return_sequences, which is set by NUM_GENERATIONS",
        ),
    ],
)
def test_fields_that_switch_off_saving_or_override_a_constant_are_refused(smoke_settings, fields, message):
    config = grpotrainer.build_config(smoke_settings, fields, cpu_only=True)
    with pytest.raises(ConfigError) as err:
        preflight.refuse_bad_grpo_config(config, smoke_settings, 32)
    assert message in str(err.value)  # refused before the first step, naming the owner and why


def test_generation_kwargs_a_constant_does_not_own_pass(smoke_settings):
    config = grpotrainer.build_config(smoke_settings, {"generation_kwargs": {"no_repeat_ngram_size": 3}}, True)
    preflight.refuse_bad_grpo_config(config, smoke_settings, 32)  # no exception: TRL passes it to generate()


# ---------------------------------------------------------------------------------------------------------------
# 5. a hung reward, signals during it, exports cut short, untrusted pickles


def hung_reward(completions, **kwargs):
    try:
        while True:
            time.sleep(0.01)
    except Exception:  # a reward that swallows errors must not swallow the timeout
        return [0.0] * len(completions)


async def async_hung_reward(completions, **kwargs):
    await asyncio.Event().wait()  # awaited by preflight's own asyncio.run, outside TRL's loop


@pytest.mark.parametrize("name", ["hung_reward", "async_hung_reward"])
def test_preflight_bounds_a_hung_reward_too(smoke_settings, monkeypatch, name):
    fired, waiting = [], [True]

    def expire(message, frame=None, source=None):  # the watchdog's end, without ending pytest: record, then wake
        fired.append(message)
        if waiting:
            _thread.interrupt_main()

    monkeypatch.setattr(reward_guard, "_expire", expire)
    entry = f"test_preflight:{name}"
    funcs = reward_guard.load([entry], rewards.REWARDS, max_completion_length=32, timeout=0.2)
    dataset = gsm8k.load(smoke_settings["DATASET"], "train", limit=3)
    # interrupt_main does nothing where SIGINT is ignored, as a shell's background job inherits it: Python's own here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises((KeyboardInterrupt, reward_guard.RewardTimeout)) as err:
            preflight.try_rewards(funcs, [entry], dataset, 32)
    finally:
        signal.signal(signal.SIGINT, previous)
    waiting.clear()  # an async reward's watchdog, left armed for the unwinding, may fire later: no interrupt then
    # a plain reward is ended by the watchdog; an async one is cancelled (its watchdog stays armed for the unwinding)
    said = fired[0] if err.type is KeyboardInterrupt else str(err.value)
    assert f"entry '{entry}' did not return within REWARD_TIMEOUT=0.2 s (at training step 0)" in said
    assert (err.type is KeyboardInterrupt) == (name == "hung_reward")


FIXTURE = str(gsm8k.FIXTURE)


# --- preflight ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes, message",
    [
        # 1 x 1 x 3 = 3 completions per round cannot hold whole groups of 4
        (dict(PER_DEVICE_TRAIN_BATCH_SIZE=1, GRADIENT_ACCUMULATION_STEPS=3), "1 x 1 x 3 = 3 completions"),
        (dict(PER_DEVICE_TRAIN_BATCH_SIZE=1, GRADIENT_ACCUMULATION_STEPS=3), "GRADIENT_ACCUMULATION_STEPS=4"),
        (dict(PER_DEVICE_TRAIN_BATCH_SIZE=2, STEPS_PER_GENERATION=1, NUM_GENERATIONS=8), "STEPS_PER_GENERATION=4"),
        (dict(NUM_GENERATIONS=1), "NUM_GENERATIONS=1 is outside [2, inf]"),
        (dict(REWARD_FUNCS=["correctnes_reward", "format_reward"]), "Did you mean correctness_reward"),
        (dict(REWARD_WEIGHTS=[1.0]), "REWARD_WEIGHTS has 1 weights for 2 REWARD_FUNCS"),
        (dict(LOSS_TYPE="ppo"), "LOSS_TYPE='ppo' is not one of grpo, dr_grpo, dapo"),
        (dict(TEMPERATURE=0.0), "TEMPERATURE=0.0 is outside [0.01, inf)"),
        (dict(SCALE_REWARDS="std"), "SCALE_REWARDS='std'"),
        (dict(LOSS_TYPE="DAPO"), "LOSS_TYPE='DAPO' is not one of"),  # TRL compares the text as written
        (dict(SCALE_REWARDS="Group"), "SCALE_REWARDS='Group' is not one of group, batch, none"),
        (
            dict(REPORT_TO="tensorbaord"),
            "REPORT_TO='tensorbaord': 'tensorbaord' is not one of tensorboard, trackio, wandb (or none). "
            "Did you mean tensorboard?",
        ),
        (
            dict(REPORT_TO="tensorboard,wandbb"),
            "REPORT_TO='tensorboard,wandbb': 'wandbb' is not one of tensorboard, trackio, wandb (or none). "
            "Did you mean wandb?",
        ),
        (dict(LOAD_IN_4BIT=True), "LOAD_IN_4BIT=True needs a CUDA GPU"),
        (dict(USE_VLLM=True), "USE_VLLM=True needs a CUDA GPU"),
        (dict(USE_VLLM=True, LOAD_IN_4BIT=True), "lossy in 4-bit"),
        (
            dict(CACHE_IMPLEMENTATION="static", USE_TRANSFORMERS_CONTINUOUS_BATCHING=True),
            "CACHE_IMPLEMENTATION=static does nothing with USE_TRANSFORMERS_CONTINUOUS_BATCHING=True",
        ),
        (
            dict(CACHE_IMPLEMENTATION="Static"),
            "CACHE_IMPLEMENTATION='Static' is not one of dynamic, static. Did you mean static?",
        ),
        (dict(LORA_R=0), "LORA_R=0 is outside [1, inf]"),
        (dict(LOGGING_STEPS=0), "LOGGING_STEPS=0 is outside [1, inf]"),
        (dict(SAVE_STEPS=0), "SAVE_STEPS=0 is outside [1, inf]"),
        (dict(MAX_COMPLETION_LENGTH=0), "MAX_COMPLETION_LENGTH=0 is outside [1, inf]"),
        (dict(MAX_STEPS=0, NUM_TRAIN_EPOCHS=3), "MAX_STEPS=0 with NUM_TRAIN_EPOCHS=3 trains nothing"),
        (dict(MAX_STEPS=-1, NUM_TRAIN_EPOCHS=0), "MAX_STEPS=-1 with NUM_TRAIN_EPOCHS=0 trains nothing"),
        (dict(LEARNING_RATE=0.0), "LEARNING_RATE=0.0 is outside (0, 1]"),
        (dict(EVAL_BEFORE=-1), "EVAL_BEFORE=-1 is outside [0, inf]"),
        (dict(ATTN_IMPLEMENTATION="flash"), "ATTN_IMPLEMENTATION='flash' is not one of auto"),
        (dict(ATTN_IMPLEMENTATION="flash_attention_2"), "flash_attention_2 needs a CUDA GPU and BF16=True"),
        (
            dict(MODEL_NAME="/nonexistent/Qwen3-8B"),
            "MODEL_NAME=/nonexistent/Qwen3-8B: that folder holds no config.json",
        ),
    ],
)
def test_preflight_errors(smoke_ok, changes, message):
    import rewards

    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.refuse_bad_settings({**smoke_ok, **changes}, cpu_only=True, known_rewards=rewards.REWARDS)


@pytest.mark.parametrize(
    "changes, message",
    [
        # the categories of settings that once ran a wasted run or ended in a traceback after the weights loaded
        (dict(LORA_ALPHA=0), "LORA_ALPHA=0 is outside (0, inf]"),
        (dict(LORA_DROPOUT=1.0), "LORA_DROPOUT=1.0 is outside [0, 1)"),
        (dict(LORA_DROPOUT=-0.1), "LORA_DROPOUT=-0.1 is outside [0, 1)"),
        (dict(BETA=-1.0), "BETA=-1.0 is outside [0, 10]"),
        (dict(BETA=math.nan), "BETA=nan: a number here must be finite."),
        (dict(TEMPERATURE=math.inf), "TEMPERATURE=inf: a number here must be finite."),
        (dict(TEMPERATURE=math.nan), "TEMPERATURE=nan: a number here must be finite."),
        (dict(LEARNING_RATE=math.nan), "LEARNING_RATE=nan: a number here must be finite."),
        (dict(LEARNING_RATE=1e6), "LEARNING_RATE=1000000.0 is outside (0, 1]"),
        (dict(STEPS_PER_GENERATION=-1), "STEPS_PER_GENERATION=-1 is outside [0, inf]"),
        (dict(REWARD_WEIGHTS=[0.0, 0.0]), "REWARD_WEIGHTS=[0.0, 0.0]: every weight must be finite"),
        (dict(REWARD_WEIGHTS=[1.0, math.nan]), "REWARD_WEIGHTS=[1.0, nan]: every weight must be finite"),
        (dict(REWARD_FUNCS=[], REWARD_WEIGHTS=[]), "REWARD_FUNCS is empty"),
        (dict(SEED=-1), "SEED=-1 is outside [0, 4294967295]"),
        (dict(SEED=2**40), "SEED=1099511627776 is outside"),
        (dict(MAX_SAMPLES=-1), "MAX_SAMPLES=-1 is outside [0, inf]"),
        (dict(NUM_TRAIN_EPOCHS=math.nan, MAX_STEPS=-1), "NUM_TRAIN_EPOCHS=nan"),
        (dict(OUTPUT_DIR=""), "OUTPUT_DIR is empty"),
        (dict(OUTPUT_DIR=__file__), "is a file, not a folder"),
        (dict(ENABLE_THINKING=True), "ENABLE_THINKING=True with MAX_COMPLETION_LENGTH=32: thinking is cut off"),
        (dict(KL_WARN=30.0), "KL_ACT=20.0 is below KL_WARN=30.0"),
        (dict(DDP_TIMEOUT=0), "DDP_TIMEOUT=0 is outside [1, 604800]"),
        (dict(TEMPERATURE=1e-300), "TEMPERATURE=1e-300 is outside [0.01, inf)"),
        (dict(BETA=1e300), "BETA=1e+300 is outside [0, 10]"),
    ],
)
def test_settings_that_would_waste_a_run_are_refused(smoke_ok, changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.refuse_bad_settings({**smoke_ok, **changes}, cpu_only=True)


@pytest.mark.parametrize("gens", [3, 5, 6, 7, 9, 12])
@pytest.mark.parametrize("per_device, gas, spg", [(1, 1, 0), (4, 1, 0), (2, 3, 0), (3, 1, 2), (8, 2, 5)])
def test_the_batch_rule_suggests_only_fixes_that_pass(smoke_ok, gens, per_device, gas, spg):
    # once, NUM_GENERATIONS=3 drew the advice STEPS_PER_GENERATION=0, which preflight then refused
    s = {**smoke_ok, "NUM_GENERATIONS": gens, "PER_DEVICE_TRAIN_BATCH_SIZE": per_device}
    s |= {"GRADIENT_ACCUMULATION_STEPS": gas, "STEPS_PER_GENERATION": spg}
    try:
        preflight.refuse_bad_settings(s, cpu_only=True)
        return  # the rule holds already
    except ConfigError as err:
        fixes = re.findall(r"(?:Set |or )([A-Z_]+)=(\d+)", str(err))
    assert fixes
    for name, value in fixes:
        preflight.refuse_bad_settings({**s, name: int(value)}, cpu_only=True)  # every suggestion passes on its own


def copy_of(tiny_model, tmp_path):
    """A copy of the session's tiny model folder, to damage."""
    return Path(shutil.copytree(tiny_model, tmp_path / "m"))


def test_a_model_folder_cut_short_is_refused_before_loading(tmp_path, tiny_model):
    model = copy_of(tiny_model, tmp_path)
    preflight.refuse_torn_model_folder(str(model))  # whole: fine
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ConfigError, match="model.safetensors is cut short"):
        preflight.refuse_torn_model_folder(str(model))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    with pytest.raises(ConfigError, match="holds no tokenizer files"):
        preflight.refuse_torn_model_folder(str(model))


def test_every_message_is_at_most_two_lines(smoke_ok):
    # many mistakes at once: each problem is one paragraph of at most two lines (constant=value, why, the fix)
    bad = dict(TEMPERATURE=-1.0, LOSS_TYPE="x", REWARD_WEIGHTS=[], LORA_ALPHA=0, BETA=-1.0, SEED=-1, MAX_SAMPLES=-2)
    with pytest.raises(ConfigError) as err:
        preflight.refuse_bad_settings({**smoke_ok, **bad, "ENABLE_THINKING": True, "USE_VLLM": True}, cpu_only=True)
    paragraphs = str(err.value).split("\n\n")
    assert len(paragraphs) == 9
    assert all(p.count("\n") <= 1 for p in paragraphs), paragraphs


def test_preflight_counts_processes(smoke_ok, monkeypatch):
    # torchrun sets WORLD_SIZE; 1 x 2 processes x 1 = 2 completions per round cannot hold a group of 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="1 x 2 x 1 = 2 completions"):
        preflight.refuse_bad_settings({**smoke_ok, "PER_DEVICE_TRAIN_BATCH_SIZE": 1}, cpu_only=True)


def test_real_run_needs_cuda(settings, gpu):
    gpu(count=0)
    with pytest.raises(ConfigError, match="(?s)no CUDA GPU is visible.*make smoke"):
        preflight.refuse_bad_settings(settings, cpu_only=False)


def test_bf16_needs_a_bf16_gpu(settings, gpu):
    gpu(count=1, bf16=False)  # e.g. a T4 or V100
    with pytest.raises(ConfigError, match="this one has no bf16.\nSet BF16=False"):
        preflight.refuse_bad_settings(settings, cpu_only=False)
    preflight.refuse_bad_settings({**settings, "BF16": False}, cpu_only=False)  # fp32 on that GPU is allowed


@pytest.mark.parametrize("flags", [True, False])
def test_bf16_on_the_cpu_follows_its_bf16_instructions(smoke_ok, monkeypatch, flags):
    monkeypatch.setattr(hardware, "cpu_bf16", lambda: flags)  # avx512_bf16 or AMX, or neither
    bf16 = {**smoke_ok, "BF16": True}
    if flags:  # a CPU that computes in bf16 runs the CPU profiles in it
        preflight.refuse_bad_settings(bf16, cpu_only=True)
    else:
        with pytest.raises(ConfigError, match="this CPU has no bf16 instructions"):
            preflight.refuse_bad_settings(bf16, cpu_only=True)
    preflight.refuse_bad_settings({**bf16, "BF16": False}, cpu_only=True)  # fp32 runs everywhere


def test_several_gpus_need_one_process_each(settings, gpu, monkeypatch):
    gpu(count=4)
    # TRL refuses nn.DataParallel only after the weights load; preflight says so first, with the launch line
    with pytest.raises(ConfigError, match="(?s)4 GPUs are visible.*torchrun --nproc_per_node 4"):
        preflight.refuse_bad_settings(settings, cpu_only=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    # one process per GPU is fine
    preflight.refuse_bad_settings({**settings, "GRADIENT_ACCUMULATION_STEPS": 1}, cpu_only=False)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(USE_VLLM=True), "USE_VLLM=True needs the vllm package"),
        (dict(REPORT_TO="wandb"), "REPORT_TO=wandb needs the wandb package"),
        (dict(LOAD_IN_4BIT=True), "LOAD_IN_4BIT=True needs the bitsandbytes package"),
    ],
)
def test_missing_packages_are_explained(settings, gpu, changes, message):
    gpu(count=1, packages=set())
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.refuse_bad_settings({**settings, **changes}, cpu_only=False)


def wrong_length_reward(completions, **kwargs):
    return [1.0]


def text_reward(completions, **kwargs):
    return ["good" for _ in completions]


def raising_reward(completions, **kwargs):
    raise KeyError("difficulty")


@pytest.mark.parametrize(
    "name, message",
    [
        ("test_preflight:wrong_length_reward", "returned 1 values for 3 completions"),
        ("test_preflight:text_reward", "returned 'good' for completion 0: not a finite number"),
    ],
)
def test_every_reward_is_tried_on_real_rows_before_training(name, message):

    funcs = load_rewards(["correctness_reward", name], 32)
    dataset = gsm8k.load(FIXTURE, limit=4)
    with pytest.raises(ConfigError, match=re.escape(f"REWARD_FUNCS entry {name!r} ") + ".*" + re.escape(message)):
        preflight.try_rewards(funcs, ["correctness_reward", name], dataset, 32)


def two_rewards(completions, **kwargs):
    return [1.0, 0.0]  # right only for a batch of two


def infinite_reward(completions, **kwargs):
    return [float("inf")] * len(completions)


def numpy_reward(completions, **kwargs):
    import numpy

    return numpy.zeros(len(completions), dtype=numpy.float32)  # TRL takes numpy numbers


async def async_reward(completions, **kwargs):
    return [0.5] * len(completions)  # TRL 1.16 awaits async rewards


def exits_reward(completions, **kwargs):
    raise SystemExit(3)


@pytest.mark.parametrize(
    "name, message",
    [
        ("test_preflight:two_rewards", "returned 2 values for 3 completions"),
        ("test_preflight:infinite_reward", "returned inf for completion 0: not a finite number"),
    ],
)
def test_more_reward_faults_are_found_before_training(name, message):

    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.try_rewards(load_rewards([name], 32), [name], gsm8k.load(FIXTURE, limit=4), 32)


@pytest.mark.parametrize("name", ["test_preflight:numpy_reward", "test_preflight:async_reward"])
def test_rewards_that_trl_accepts_pass(name):

    preflight.try_rewards(load_rewards([name], 32), [name], gsm8k.load(FIXTURE, limit=4), 32)


def _raised_here(excinfo):
    """The file and function of the frame that raised: a bug's traceback must end in the reward itself."""
    frame = excinfo.traceback[-1]
    return Path(str(frame.path)).name, frame.name


@pytest.mark.parametrize(
    "name, error, function",
    [
        ("test_preflight:raising_reward", KeyError, "raising_reward"),
        ("test_preflight:exits_reward", RuntimeError, "exits_reward"),  # sys.exit in a reward: a bug, shown as one
    ],
)
def test_a_reward_that_raises_in_preflight_keeps_its_traceback(name, error, function):

    funcs = load_rewards(["correctness_reward", name], 32)
    with pytest.raises(error) as excinfo:
        preflight.try_rewards(funcs, ["correctness_reward", name], gsm8k.load(FIXTURE, limit=4), 32)
    assert not isinstance(excinfo.value, ConfigError)  # a bug, not a setting: process.run shows its traceback
    assert f"REWARD_FUNCS entry {name!r}" in "\n".join(excinfo.value.__notes__)
    if error is RuntimeError:  # raised from the SystemExit, whose traceback goes into the reward
        assert isinstance(excinfo.value.__cause__, SystemExit)
        frame = excinfo.value.__cause__.__traceback__
        while frame.tb_next:
            frame = frame.tb_next
        assert (Path(frame.tb_frame.f_code.co_filename).name, frame.tb_frame.f_code.co_name) == (
            "test_preflight.py",
            function,
        )
    elif function:
        assert _raised_here(excinfo) == ("test_preflight.py", function)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"top_k": -5}, "the sampling settings are invalid"),
        ({"repetition_penalty": 0.0}, "the sampling settings are invalid"),
        ({"top_p": 2.0}, "`top_p` has to be a float > 0 and < 1"),
        ({"min_p": math.nan}, "`min_p` has to be a float in the [0, 1] interval"),
        ({"max_grad_norm": math.nan}, "--max_grad_norm=nan: a number here must be finite"),
        ({"epsilon": -1.0}, "--epsilon=-1.0 must lie in [0, 1]"),
        ({"top_entropy_quantile": 2.0}, "--top_entropy_quantile=2.0 must lie in [0, 1]"),
        ({"dataloader_num_workers": -1}, "--dataloader_num_workers=-1 must lie in [0, 1024]"),
        ({"importance_sampling_level": "bogus"}, "--importance_sampling_level=bogus must be one of token, sequence"),
        ({"eval_strategy": "steps", "eval_steps": 1}, "--eval_strategy=steps: evaluation runs through EVAL_BEFORE"),
    ],
)
def test_passed_through_fields_are_checked_before_training(smoke_ok, fields, message):
    config = grpotrainer.build_config(smoke_ok, fields, cpu_only=True)
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.refuse_bad_grpo_config(config, smoke_ok, 32)


def test_a_generation_round_larger_than_the_data_is_refused(smoke_ok):
    # once: 0 steps trained, an untrained adapter saved and the run marked finished, exit 0
    config = grpotrainer.build_config({**smoke_ok, "PER_DEVICE_TRAIN_BATCH_SIZE": 256}, {}, cpu_only=True)
    with pytest.raises(ConfigError, match="the training set has 32 problems, but each generation round takes 64"):
        preflight.refuse_bad_grpo_config(config, smoke_ok, 32)


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(LORA_TARGET_MODULES="norm"), "LORA_TARGET_MODULES: norm are not linear layers"),
        (dict(LORA_TARGET_MODULES="mlp"), "LORA_TARGET_MODULES: mlp are not linear layers"),
        (dict(LORA_TARGET_MODULES=","), "LORA_TARGET_MODULES is empty"),
        (dict(LORA_TARGET_MODULES="q_proj,nope"), "LORA_TARGET_MODULES: nope matches no layer"),
        (dict(LORA_R=1_000_000_000), "LORA_R=1000000000 exceeds 16, the smaller side of the adapted layers"),
        (dict(MAX_COMPLETION_LENGTH=100_000), "MAX_COMPLETION_LENGTH=100000 does not fit"),
    ],
)
def test_the_models_config_decides_before_its_weights_load(smoke_ok, tiny_model, changes, message):
    model = tiny_model
    preflight.refuse_misfit_model({**smoke_ok, "MODEL_NAME": model})  # the defaults fit
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.refuse_misfit_model({**smoke_ok, "MODEL_NAME": model, **changes})


def test_weights_that_do_not_fit_the_config_are_refused(smoke_ok, tmp_path, tiny_model):
    model = copy_of(tiny_model, tmp_path)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(ConfigError, match=r"mlp.down_proj.weight is \[32, 64\] in model.safetensors, \[32, 128\]"):
        preflight.refuse_misfit_model({**smoke_ok, "MODEL_NAME": str(model)})


def test_the_registry_passes_the_reward_check():
    import rewards

    names = list(rewards.REWARDS)
    preflight.try_rewards(load_rewards(names, 32), names, gsm8k.load(FIXTURE, limit=4), 32)


@pytest.mark.parametrize("length", [1, 8])
def test_the_reward_check_probes_finished_completions_at_any_limit(length, caplog):
    # the probe's completions are shorter than MAX_COMPLETION_LENGTH: a cut-off one earns nothing, right or wrong,
    # which would read as a reward blind to the answer
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        rows = gsm8k.load(FIXTURE, limit=4)
        preflight.try_rewards(load_rewards(["correctness_reward"], length), ["correctness_reward"], rows, length)
    assert caplog.records == []


# --- vLLM's context, LoRA dropout --------------------------------------------------------------------------------


def test_lora_dropout_with_vllm_importance_sampling_warns(smoke_ok, tiny_model, caplog):
    s = {**smoke_ok, "USE_VLLM": True, "LORA_DROPOUT": 0.05, "MODEL_NAME": tiny_model}
    data = gsm8k.load(FIXTURE, "train")
    config = grpotrainer.build_config(s, {}, cpu_only=True, datasets=(data, None))
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        preflight.refuse_bad_grpo_config(config, s, 32)
    assert "LORA_DROPOUT=0.05 with vLLM's importance-sampling correction" in caplog.text  # a warning, not a refusal
    caplog.clear()
    config = grpotrainer.build_config({**s, "LORA_DROPOUT": 0.0}, {}, cpu_only=True, datasets=(data, None))
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        preflight.refuse_bad_grpo_config(config, {**s, "LORA_DROPOUT": 0.0}, 32)
    assert "LORA_DROPOUT" not in caplog.text  # no dropout: nothing to warn about


def string_length_reward(completions, **kwargs):
    # written for plain strings: on TRL's chat lists len() counts messages, so every completion scores 1.0
    return [min(1.0, len(c) / 1.0) for c in completions]


def test_a_reward_blind_to_the_answer_is_warned_about_by_name(caplog):
    import rewards

    names = ["correctness_reward", "format_reward", "reasoning_reward", "overlong_reward"]
    names += ["test_preflight:string_length_reward"]
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        funcs = load_rewards(names, 32)
        preflight.try_rewards(funcs, names, gsm8k.load(FIXTURE, limit=4), 32, answer_blind=rewards.ANSWER_BLIND)
    warned = [r.getMessage() for r in caplog.records]
    # one warning, not a refusal: the string reward scores 1.0 right or wrong; correctness_reward tells them apart,
    # and the registry's format, reasoning and length rewards are answer-blind by design (rewards.ANSWER_BLIND)
    assert [w.split(" scores")[0] for w in warned] == ["REWARD_FUNCS entry 'test_preflight:string_length_reward'"]
    assert "a right and a wrong answer to the same problems alike ([1.0, 1.0, 1.0])" in warned[0]


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


def test_trust_remote_code_on_the_command_line_loads_a_folders_own_model_class(smoke_ok, tiny_model, tmp_path):
    model = custom_code_model(tmp_path / "custom", tiny_model)
    # without it, the folder's code is not run, and the config is refused as no causal LM transformers knows
    with pytest.raises(ConfigError, match="names the folder's own Python code .* --TRUST_REMOTE_CODE=true typed"):
        preflight.refuse_misfit_model({**smoke_ok, "MODEL_NAME": model, "TRUST_REMOTE_CODE": False})
    # with it (typed on the command line), the folder's class is the model: no false "no model class" refusal
    preflight.refuse_misfit_model({**smoke_ok, "MODEL_NAME": model, "TRUST_REMOTE_CODE": True})
    with pytest.raises(ConfigError, match="nope matches no layer"):  # and its layers are still checked
        preflight.refuse_misfit_model(
            {**smoke_ok, "MODEL_NAME": model, "TRUST_REMOTE_CODE": True, "LORA_TARGET_MODULES": "nope"}
        )


# ---------------------------------------------------------------------------------------------------------------
# resolve: every setting decided once, then checked, then the profile's own files


def resolved(argv, cpu_only=True):
    """preflight.resolve on grpotrainer.py's command line `argv`, as its main() calls it."""
    return preflight.resolve(parse(argv), cpu_only, grpotrainer.PROFILES, rewards.REWARDS)


def test_reward_funcs_given_without_weights_weigh_one_each_with_a_line(tmp_path, caplog):
    three = "--REWARD_FUNCS=correctness_reward,format_reward,reasoning_reward"
    with caplog.at_level("INFO", logger="grpotrainer.preflight"):
        s = resolved(["--smoke", three, f"--OUTPUT_DIR={tmp_path}"])
    # TRL weighs each reward 1 when no weights are given; the constants' two weights would not fit three rewards
    assert s["REWARD_WEIGHTS"] == [1.0, 1.0, 1.0]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("REWARD_WEIGHTS=")]
    assert len(said) == 1 and said[0].startswith("REWARD_WEIGHTS=1,1,1: ")  # one line, naming the weights chosen


@pytest.mark.parametrize(
    ("argv", "weights"),
    [
        (["--REWARD_FUNCS=correctness_reward,format_reward", "--REWARD_WEIGHTS=1,0.5"], [1.0, 0.5]),  # both given
        (["--REWARD_WEIGHTS=1,0.5"], [1.0, 0.5]),  # weights alone, for the constants' two rewards
        ([], [1.0, 0.2]),  # neither: the constants' own weights (grpotrainer.py's REWARD_WEIGHTS)
    ],
)
def test_given_reward_weights_win_without_a_line(tmp_path, caplog, argv, weights):
    with caplog.at_level("INFO", logger="grpotrainer.preflight"):
        s = resolved(["--smoke", *argv, f"--OUTPUT_DIR={tmp_path}"])
    assert s["REWARD_WEIGHTS"] == weights
    assert not [r for r in caplog.records if r.getMessage().startswith("REWARD_WEIGHTS=")]


@pytest.mark.parametrize(
    ("gpus", "packages", "chosen", "why"),
    [
        (1, ("vllm",), True, "vLLM (colocate), as vllm imports and a CUDA GPU is visible"),
        (1, (), False, "HF generate, as vllm is not installed"),
        (0, ("vllm",), False, "HF generate, as no CUDA GPU is visible"),
    ],
)
def test_use_vllm_auto_is_chosen_for_this_machine(gpu, monkeypatch, tmp_path, caplog, gpus, packages, chosen, why):
    gpu(count=gpus, packages=packages)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # Qwen3-8B's shape from plan.known_configs
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80e9))
    with caplog.at_level("INFO", logger="grpotrainer"):
        s = resolved(["--plan", f"--OUTPUT_DIR={tmp_path}"], cpu_only=False)
    assert s["USE_VLLM"] is chosen
    (said,) = [m for m in caplog.messages if m.startswith("USE_VLLM=auto: ")]
    assert said.startswith(f"USE_VLLM=auto: {why}")  # the choice said in one line, with its reason
    caplog.clear()
    with caplog.at_level("INFO", logger="grpotrainer"):
        s = resolved(["--plan", "--USE_VLLM=false", f"--OUTPUT_DIR={tmp_path}"], cpu_only=False)
    assert s["USE_VLLM"] is False  # chosen by hand: as given, the text read as a boolean, without a line
    assert not [m for m in caplog.messages if m.startswith("USE_VLLM")]


def test_use_vllm_auto_under_fsdp_falls_back_to_hf_and_true_is_refused(gpu, monkeypatch, tmp_path, caplog):
    # vLLM cannot get the LoRA from FSDP's shards: auto chooses HF generate and says why, True is a mistake
    gpu(count=1, packages=("vllm",))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: SimpleNamespace(total_memory=80e9))
    with caplog.at_level("INFO", logger="grpotrainer"):
        s = resolved(["--plan", f"--OUTPUT_DIR={tmp_path}"], cpu_only=False)
    assert s["USE_VLLM"] is False
    assert "USE_VLLM=auto: HF generate, as FSDP1 shards" in caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="grpotrainer"), contextlib.suppress(ConfigError):
        resolved(["--plan", "--USE_VLLM=true", f"--OUTPUT_DIR={tmp_path}"], cpu_only=False)
    assert "USE_VLLM=True under FSDP1" in caplog.text  # --plan says what would stop the run


def test_vllm_memory_share_auto_fits_the_model_on_this_card(gpu, monkeypatch, tmp_path):
    gpu(count=1, packages=("vllm",))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    shares = {}
    for card_gb in (48, 80):
        card = SimpleNamespace(total_memory=card_gb * 1e9)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index, card=card: card)
        shares[card_gb] = resolved(["--plan", f"--OUTPUT_DIR={tmp_path}"], False)["VLLM_GPU_MEMORY_UTILIZATION"]
    # Qwen3-8B's 16.4 GB of bf16 weights alone are 0.34 of a 48 GB card (a fixed 0.3 could not hold them); the
    # same need is a smaller share of an 80 GB card
    assert shares[48] * 48 > 16.4 + generation.VLLM_OVERHEAD_GB and shares[80] < shares[48]
    s = resolved(["--plan", "--VLLM_GPU_MEMORY_UTILIZATION=0.5", f"--OUTPUT_DIR={tmp_path}"], cpu_only=False)
    assert s["VLLM_GPU_MEMORY_UTILIZATION"] == 0.5  # a share given by hand is kept
    with pytest.raises(ConfigError, match="VLLM_GPU_MEMORY_UTILIZATION='lots' is not auto nor a share"):
        resolved(["--plan", "--VLLM_GPU_MEMORY_UTILIZATION=lots", f"--OUTPUT_DIR={tmp_path}"], cpu_only=False)


def test_the_profiles_prepare_runs_after_the_checks_so_a_refusal_writes_nothing(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=re.escape("LEARNING_RATE=0.0 is outside (0, 1]")):
        resolved(["--demo", "--LEARNING_RATE=0", f"--OUTPUT_DIR={out}"])
    assert not out.exists()  # the demo's prepare writes its task into OUTPUT_DIR: never reached
    s = resolved(["--demo", f"--OUTPUT_DIR={out}"])
    # checked clean, then prepared: the task written and named in OUTPUT_DIR, the warm-started model named there
    assert Path(s["DATASET"]).parent == out and Path(s["DATASET"]).exists()
    assert Path(s["MODEL_NAME"]).parent == out


def test_a_given_dataset_is_checked_under_a_profile_too(tmp_path):
    # the profile's own task is left to its prepare; a DATASET the user gives is checked before anything is written
    with pytest.raises(ConfigError, match=re.escape("DATASET=nope.jsonl: no such file or folder.")):
        resolved(["--demo", "--DATASET=nope.jsonl", f"--OUTPUT_DIR={tmp_path / 'run'}"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("plan", [False, True])
def test_without_a_gpu_plan_warns_where_the_run_refuses(settings, gpu, caplog, tmp_path, plan):
    gpu(count=0)
    s = {**settings, "USE_VLLM": False, "OUTPUT_DIR": str(tmp_path)}
    if not plan:  # the run: refused, no GPU
        with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
            preflight.refuse_bad_settings(s, cpu_only=False, machine=True)
        return
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        preflight.refuse_bad_settings(s, cpu_only=False, machine=False)  # --plan: no exception
    (warned,) = [r.getMessage() for r in caplog.records]
    assert warned.startswith("on this machine the run would stop: no CUDA GPU is visible")


def test_with_plan_the_settings_own_mistakes_are_still_refused(settings, gpu, tmp_path):
    gpu(count=0)
    # only this machine's problems become warnings: a wrong value is wrong on every machine
    with pytest.raises(ConfigError, match="LORA_R=0 is outside"):
        preflight.refuse_bad_settings({**settings, "LORA_R": 0, "OUTPUT_DIR": str(tmp_path)}, machine=False)


# ---------------------------------------------------------------------------------------------------------------
# DATASET, checked as MODEL_NAME is: one line, exit 2, no traceback


@pytest.mark.parametrize(
    ("argv", "recipe", "message"),
    [
        ([], "dataset_name:\n", "DATASET is empty: give openai/gsm8k (a Hub id), a .jsonl file"),
        (["--DATASET=openai/gsm8k/main"], None, "DATASET='openai/gsm8k/main' is neither a local file or folder nor"),
        (["--DATASET=/nonexistent/gsm8k.jsonl"], None, "DATASET=/nonexistent/gsm8k.jsonl: no such file or folder."),
        (["--DATASET=missing.jsonl"], None, "DATASET=missing.jsonl: no such file or folder."),  # relative: a path
    ],
)
def test_a_dataset_that_is_neither_a_path_nor_a_hub_id_is_one_line(
    tmp_path, capsys, monkeypatch, argv, recipe, message
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    if recipe is not None:  # a blank value in a recipe: YAML's null, read as ""
        (tmp_path / "recipe.yaml").write_text(recipe)
        argv = [*argv, "--config", "recipe.yaml"]
    code, err = run_in_process(grpotrainer.main, "--smoke", *argv, f"--OUTPUT_DIR={tmp_path / 'run'}", capsys=capsys)
    assert code == 2 and "Traceback" not in err
    said = err.partition("\nerror: ")[2].strip()  # process.run's paragraph for a ConfigError
    assert said.startswith(message) and "\n" not in said  # one line, naming the value
    assert not (tmp_path / "run").exists()  # refused before anything is written


# ---------------------------------------------------------------------------------------------------------------
# small helpers' contracts


def test_divisors_include_one_and_the_number():
    assert sorted(preflight._divisors(12)) == [1, 2, 3, 4, 6, 12]


def test_lora_targets_as_peft_takes_them():
    assert (settings.lora_targets("q_proj, v_proj"), settings.lora_targets("all-linear")) == (
        ["q_proj", "v_proj"],
        "all-linear",
    )


def test_the_chat_template_of_a_hub_id_is_not_read_for_thinking():
    assert preflight.thinking_ignored("Qwen/Qwen3-8B", True) is None
