"""Tests of grpo/cli.py: overrides, recipes on the command line, `~`, signals and process.run's exits.

.venv/bin/python -m pytest tests/test_cli.py -q -m "not slow"
"""

import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, custom_code_model, parse, run_in_process, run_script

import evaluate
import export
import grpotrainer
from grpo import cli, files, preflight
from grpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# SIGTERM and Ctrl-C at any moment


def run_main(main, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["script.py"])
    with pytest.raises(SystemExit) as stop:
        process.run(main)
    return stop.value.code


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_in_any_phase_ends_with_one_line_naming_it_and_128_plus_the_signal(monkeypatch, capsys, signum, code):
    def main(argv):
        with process.phase("loading the model", "the same command resumes from checkpoint-4"):
            os.kill(os.getpid(), signum)  # delivered here, between two bytecodes of the block
            raise AssertionError("the handler raises before this line")

    assert run_main(main, monkeypatch) == code  # 128 + the signal: the shell's "ended by this signal"
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    # the phase as it was when the signal came, though the block has unwound since
    assert err.strip().splitlines() == [
        f"stopped by {name} while loading the model: the same command resumes from checkpoint-4"
    ]


def test_a_signal_before_any_phase_says_nothing_was_written(monkeypatch, capsys):
    def main(argv):
        os.kill(os.getpid(), signal.SIGTERM)

    assert run_main(main, monkeypatch) == 143
    assert capsys.readouterr().err.strip() == f"stopped by SIGTERM while starting: {process.NOTHING_WRITTEN}"


def test_a_keyboard_interrupt_raised_elsewhere_ends_the_same_way(monkeypatch, capsys):
    def main(argv):  # a library that put back Python's own SIGINT handler
        process.set_phase("scoring 16 test problems")
        raise KeyboardInterrupt

    assert run_main(main, monkeypatch) == 130
    assert "stopped by SIGINT while scoring 16 test problems" in capsys.readouterr().err


def test_run_puts_back_the_callers_handlers_and_a_phase_block_its_phase(monkeypatch):
    mine = signal.getsignal(signal.SIGTERM)
    seen = {}

    def main(argv):
        seen["during"] = signal.getsignal(signal.SIGTERM)
        with process.phase("outer", "o"), process.phase("inner"):
            seen["inner"] = process.stop_message(signal.SIGTERM)
        seen["after"] = process.stop_message(signal.SIGTERM)

    monkeypatch.setattr(sys, "argv", ["script.py"])
    process.run(main)
    assert seen["during"] is process._interrupt  # installed from the first line of main
    assert seen["inner"] == "stopped by SIGTERM while inner: o"  # an inner phase keeps the outer outcome
    assert seen["after"] == f"stopped by SIGTERM while starting: {process.NOTHING_WRITTEN}"
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_stop_between_the_renames_of_a_replacing_publish_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "export"
    target.mkdir()
    (target / "model.safetensors").write_text("the earlier export")
    real_rename = Path.rename
    calls = []

    def rename(self, to):
        calls.append(self)
        if len(calls) == 2:  # the new folder's rename into place: SIGTERM lands just before it
            raise process.Interrupted(signal.SIGTERM, "stopped")
        return real_rename(self, to)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(process.Interrupted), files.publish_dir(target, replace=True) as tmp:
        (tmp / "model.safetensors").write_text("the new export")
    monkeypatch.setattr(Path, "rename", real_rename)
    # the earlier export is whole where it was, and nothing half-written is left beside it
    assert (target / "model.safetensors").read_text() == "the earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


def test_grpoconfig_field_names_are_read_from_trls_source_exactly():
    from trl import GRPOConfig

    # the ast reading follows GRPOConfig -> trl's _BaseConfig -> transformers' TrainingArguments, init fields only
    expected = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    assert cli.source_fields("trl.trainer.grpo_config", "GRPOConfig") == expected


def test_a_class_whose_source_cannot_be_followed_falls_back_to_importing_it():
    assert cli.source_fields("no_such_package_here.mod", "Config") is None
    assert cli.source_fields("json", "JSONDecoder") is None  # a plain module, not a package: not followed


# ---------------------------------------------------------------------------------------------------------------
# pass-through fields that collide with the project's own job


@pytest.mark.parametrize(
    ("args", "constant", "value"),
    [
        (["--output_dir=runs/a"], "OUTPUT_DIR", "runs/a"),  # a GRPOConfig field a constant of its name sets
        (["--learning_rate", "1e-5"], "LEARNING_RATE", 1e-5),  # with a space, as TrlParser reads it
        (["--gradient_checkpointing=false"], "ACTIVATION_CHECKPOINTING", False),  # owned under another name
        (["--model_name_or_path", "models/m"], "MODEL_NAME", "models/m"),  # trl grpo's ModelConfig names
        (["--lora_r", "8"], "LORA_R", 8),
        (["--lora_target_modules", "q_proj", "v_proj"], "LORA_TARGET_MODULES", "q_proj,v_proj"),  # nargs="+"
        (["--dataset_name=data/gsm8k.jsonl"], "DATASET", "data/gsm8k.jsonl"),
        (["--torch_dtype=float32"], "BF16", False),  # open-r1's recipes' name for the dtype
        (["--load_in_4bit"], "LOAD_IN_4BIT", True),  # a bare boolean is true, as argparse reads it
    ],
)
def test_a_trl_name_is_read_as_the_constant_it_means_with_a_line_saying_so(args, constant, value):
    parsed = parse(args)
    assert parsed.settings[constant] == value and constant in parsed.given
    assert parsed.fields == {}  # never passed on as well: one setting, one value
    assert len(parsed.notes) == 1 and constant in parsed.notes[0] and args[0].partition("=")[0] in parsed.notes[0]


@pytest.mark.parametrize(
    "field", [k for k, v in grpotrainer.owned.items() if isinstance(v, str) and v not in cli.constants(grpotrainer)]
)
def test_an_owned_field_that_no_constant_names_is_refused_with_what_to_type(field):
    with pytest.raises(ConfigError) as refused:
        parse([f"--{field}=true"])
    message = str(refused.value)
    assert message.startswith(f"--{field} is set by ") and "----" not in message
    # every --NAME it suggests exists: a profile or a constant (the use_cpu message once said ----smoke=...)
    for name in re.findall(r"--([A-Za-z_]+)", message.removeprefix(f"--{field}")):
        assert name in grpotrainer.profile_settings or name in cli.constants(grpotrainer), name


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--use_peft=false"], "--use_peft=false: this script takes only true here"),
        (["--torch_dtype=float16"], "takes only bfloat16 or float32"),
        (["--dataset_train_split=validation"], "takes only train here"),
    ],
)
def test_a_trl_name_with_a_value_this_script_cannot_honour_is_refused(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(args)


def test_key_space_value_is_key_equals_value_and_flags_take_none():
    spaced = parse(["--smoke", "--MAX_STEPS", "2", "--top_p", "0.9", "--RESUME", "--MAX_COMPLETION_LENGTH", "-1"])
    joined = parse(["--smoke", "--MAX_STEPS=2", "--top_p=0.9", "--RESUME=true", "--MAX_COMPLETION_LENGTH=-1"])
    assert (spaced.profile, spaced.settings, spaced.fields) == (joined.profile, joined.settings, joined.fields)
    assert parse(["--use_liger_kernel"]).fields == {"use_liger_kernel": True}  # a bare boolean field: true
    with pytest.raises(ConfigError, match="cannot read the argument 'x'"):
        parse(["--smoke", "x"])  # a profile takes no value


# ---------------------------------------------------------------------------------------------------------------
# 2. `~` in every path setting of every script


@pytest.mark.parametrize("script", [grpotrainer, evaluate, export])
def test_tilde_is_the_home_folder_in_every_path_setting(script, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    names = [n for n in files.PATH_SETTINGS if n in cli.constants(script)]
    args = cli.parse(cli.constants(script), [f"--{name}=~/{name.lower()}" for name in names])
    # the shell leaves ~ alone after "="; every script reads the same folder transformers would
    assert {n: args.settings[n] for n in names} == {n: str(tmp_path / n.lower()) for n in names}
    assert len(names) >= 3  # MODEL_NAME, DATASET/ADAPTER, OUTPUT_DIR at least


# --- overrides ---------------------------------------------------------------------------------------------------


def test_overrides_are_typed_by_the_default():
    args = parse(
        [
            "--NUM_GENERATIONS=16",
            "--LEARNING_RATE=2e-5",
            "--BETA=0",  # an int literal for a float constant stays a float
            "--LOAD_IN_4BIT=true",
            "--RESUME=no",
            "--OUTPUT_DIR=runs/x",
            "--REWARD_FUNCS=correctness_reward, math_reward",
            "--REWARD_WEIGHTS=1,0.5",
        ]
    )
    s = args.settings
    assert s["NUM_GENERATIONS"] == 16 and s["LEARNING_RATE"] == 2e-5
    assert s["BETA"] == 0.0 and isinstance(s["BETA"], float)
    assert s["LOAD_IN_4BIT"] is True and s["RESUME"] is False
    assert s["OUTPUT_DIR"] == "runs/x"
    assert s["REWARD_FUNCS"] == ["correctness_reward", "math_reward"]
    assert s["REWARD_WEIGHTS"] == [1.0, 0.5]
    assert args.given == {"NUM_GENERATIONS", "LEARNING_RATE", "BETA", "LOAD_IN_4BIT", "RESUME", "OUTPUT_DIR"} | {
        "REWARD_FUNCS",
        "REWARD_WEIGHTS",
    }
    assert grpotrainer.NUM_GENERATIONS != 16  # parsing never writes the module's constants


def test_profile_then_command_line():
    args = parse(["--smoke", "--MAX_STEPS=7"])
    assert args.profile == "smoke"
    assert args.settings["MAX_STEPS"] == 7  # the command line wins over the profile ...
    assert args.settings["MAX_COMPLETION_LENGTH"] == 32  # ... which wins over the constant


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--NUM_GENERATION=8", "Did you mean NUM_GENERATIONS"),
        ("--NUM_GENERATIONS=four", "--NUM_GENERATIONS=four is not a valid int (default"),
        ("--BF16=maybe", "not a valid bool"),
        ("--REWARD_WEIGHTS=1,x", "not a valid list"),
        ("NUM_GENERATIONS=8", "write --KEY=value"),
        ("--MAX_STEPS", "write --KEY=value"),
    ],
)
def test_bad_overrides_are_clear(arg, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse([arg])


@pytest.mark.parametrize("script", ["evaluate.py", "export.py", "grpotrainer.py"])
def test_help_prints_each_constant_under_a_section_and_no_stray_header(script):
    result = run_script(script, "--help")
    assert result.returncode == 0, result.stderr
    settings = result.stdout.split("settings (--KEY=value", 1)[1].split("\n--", 1)[0]
    blocks = [block for block in settings.split("\n\n") if block.strip()][1:]  # after the settings line itself
    # every section is a header followed by its constants: a wrapped comment would make a header with none
    for block in blocks:
        header, *body = block.splitlines()
        assert not header.startswith("  --") and body, f"stray header {header!r}"
        assert all(re.match(r"  --[A-Z][A-Z0-9_]*=|        \S", line) for line in body), block


def test_a_full_line_comment_after_a_constant_is_a_header(tmp_path):
    # the reason OUTPUT_DIR's comment must fit on its line: help_text cannot tell a wrapped comment from a header
    source = tmp_path / "s.py"
    source.write_text('"""S."""\n# ----\n# one\nA = 1  # a\n# two\nB = 2  # b\n# ----\n')
    text = cli.help_text(source)
    assert "\n one\n  --A=1\n        a\n\n two\n  --B=2\n        b" in text


def test_a_recipe_sets_constants_and_fields_and_the_command_line_wins(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("MAX_STEPS: 2\nREWARD_FUNCS: [correctness_reward]\nREWARD_WEIGHTS: [1.0]\ntop_p: 0.9\n")
    args = parse(["--smoke", "--config", str(recipe)])
    assert args.settings["MAX_STEPS"] == 2  # the file over --smoke's 4
    assert args.settings["REWARD_FUNCS"] == ["correctness_reward"] and args.settings["REWARD_WEIGHTS"] == [1.0]
    assert args.fields == {"top_p": 0.9}  # a lower-case key is a GRPOConfig field, typed by transformers
    assert "MAX_STEPS" in args.given  # a recipe's constant counts as given, as on the command line
    args = parse(["--smoke", f"--config={recipe}", "--MAX_STEPS=3", "--top_p=0.8"])
    assert (args.settings["MAX_STEPS"], args.fields["top_p"]) == (3, 0.8)  # the command line wins


@pytest.mark.parametrize(
    "text, message",
    [
        # every unknown key at once, each with its nearest name
        (
            "MAX_STEP: 2\ntop_pp: 0.9\n",
            "--config {path}: unknown settings MAX_STEP (did you mean MAX_STEPS?), top_pp (did",
        ),
        ("MAX_STEPS: many\n", "--config {path}: --MAX_STEPS=many is not a valid int"),
        ("- MAX_STEPS\n", "--config {path}: a recipe is a mapping of KEY: value lines"),
        ("MAX_STEPS: [\n", "--config {path} is not valid YAML"),
    ],
)
def test_a_bad_recipe_names_the_file_and_the_key(tmp_path, text, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(message.format(path=recipe))):
        parse(["--config", str(recipe)])


def test_the_shipped_recipe_parses():
    args = parse(["--config", str(REPO / "configs" / "gsm8k-qwen3-8b.yaml")])
    assert args.settings["NUM_GENERATIONS"] == 8 and args.settings["WARMUP_STEPS"] == 0.1 and args.fields == {}


@pytest.mark.parametrize("script", ["grpotrainer.py", "evaluate.py", "export.py"])
def test_help_into_a_closed_pipe_ends_quietly_as_sigpipe_would(script):
    # `python grpotrainer.py --help | head -1`: the reader is gone before the script writes
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, script, "--help"], cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert result.returncode == 128 + signal.SIGPIPE  # the shell's code for a command ended by SIGPIPE
    assert result.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit


# --- recipes that are not what they seem ---------------------------------------------------------------------------

BILLION_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8)
)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # nine levels of nine aliases: 9**9 values once expanded; refused at the first alias, before any expansion
        (BILLION_LAUGHS, "line 2 uses a YAML alias (*name): write the value out"),
        ("MAX_STEPS: 2\nLORA_R: 8\nMAX_STEPS: 3\n", "MAX_STEPS is set twice (line 3): keep one"),
        (b"MAX_STEPS: 2\nSYSTEM_PROMPT: caf\xe9\n", "is not UTF-8 text (byte 31): save it as UTF-8"),
        ("a: " + "[" * 5000 + "]" * 5000 + "\n", "line 1 nests deeper than"),
        ("a: {b: {c: {d: {e: {f: {g: {h: {i: 1}}}}}}}}\n", "line 1 nests deeper than"),
    ],
)
def test_a_recipe_yaml_cannot_hang_or_crash_the_reader(tmp_path, content, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        parse(["--config", str(recipe)])
    assert str(refused.value).startswith(f"--config {recipe}")  # the file named


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("TRUST_REMOTE_CODE: true", "TRUST_REMOTE_CODE"),
        ("trust_remote_code: true", "trust_remote_code"),
        ("Trust-Remote-Code: yes", "Trust-Remote-Code"),
        ("model_init_kwargs: {trust_remote_code: true}", "trust_remote_code"),  # at any depth
    ],
)
def test_a_recipe_never_turns_on_remote_code_and_nothing_runs_the_folders_code(
    line, key, tmp_path, tiny_model, capsys, monkeypatch
):
    model = custom_code_model(tmp_path / "custom", tiny_model)
    ran = tmp_path / "ran"
    monkeypatch.setenv("CUSTOM_CODE_RAN", str(ran))
    recipe = tmp_path / "shared.yaml"
    recipe.write_text(f"MODEL_NAME: {model}\n{line}\n")
    out = tmp_path / "out"
    code, stderr = run_in_process(
        grpotrainer.main, "--smoke", "--config", str(recipe), f"--OUTPUT_DIR={out}", capsys=capsys
    )
    assert code == 2 and "running a model folder's own code is never taken from a file" in stderr
    assert f"sets {key}:" in stderr  # the key, as the recipe spells it
    assert not ran.exists() and not out.exists()  # refused before anything loaded or was written


# The shape of an open-r1 GRPO recipe (huggingface/open-r1, recipes/Qwen2.5-1.5B-Instruct/grpo/config_demo.yaml):
# TRL's lower-case keys, ModelConfig's and open-r1's own names, publishing and evaluation settings of its script.
OPEN_R1_RECIPE = """# Model arguments
model_name_or_path: Qwen/Qwen2.5-1.5B-Instruct
model_revision: main
torch_dtype: bfloat16
attn_implementation: sdpa

# Data training arguments
dataset_name: openai/gsm8k
dataset_configs:
- main
system_prompt: "Solve the problem step by step, then give the answer as #### <number>."

# GRPO trainer config
bf16: true
use_vllm: true
vllm_device: auto
vllm_gpu_memory_utilization: 0.7
do_eval: false
gradient_accumulation_steps: 4
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: Qwen2.5-1.5B-Open-R1-GRPO
hub_strategy: every_save
learning_rate: 2.0e-05
log_completions: true
log_level: info
logging_first_step: true
logging_steps: 1
logging_strategy: steps
lr_scheduler_type: cosine
max_prompt_length: 512
max_completion_length: 1024
max_steps: -1
num_generations: 16
num_train_epochs: 1
output_dir: data/Qwen2.5-1.5B-Open-R1-GRPO
overwrite_output_dir: true
per_device_eval_batch_size: 16
per_device_train_batch_size: 16
push_to_hub: true
report_to:
- wandb
reward_funcs:
- accuracy
- format
save_strategy: "epoch"
save_total_limit: 1
seed: 42
warmup_ratio: 0.1
"""


def test_an_open_r1_recipe_is_read_key_by_key(tmp_path):
    recipe = tmp_path / "config_demo.yaml"
    recipe.write_text(OPEN_R1_RECIPE)
    args = parse(["--config", str(recipe)])
    s = args.settings
    # TRL's names read as the constants they mean
    assert (s["MODEL_NAME"], s["DATASET"], s["LEARNING_RATE"], s["WARMUP_STEPS"]) == (
        "Qwen/Qwen2.5-1.5B-Instruct",
        "openai/gsm8k",
        2e-5,
        0.1,
    )
    assert (s["NUM_GENERATIONS"], s["PER_DEVICE_TRAIN_BATCH_SIZE"], s["MAX_STEPS"], s["BF16"]) == (16, 16, -1, True)
    assert (s["REWARD_FUNCS"], s["REPORT_TO"], s["ACTIVATION_CHECKPOINTING"]) == (
        ["accuracy", "format"],
        "wandb",
        True,
    )
    # the other GRPOConfig fields pass through, typed; model_revision joins model_init_kwargs
    assert args.fields["lr_scheduler_type"] == "cosine" and args.fields["model_init_kwargs"] == '{"revision": "main"}'
    assert args.fields["gradient_checkpointing_kwargs"] == '{"use_reentrant": false}'
    # each key this script does not honour: one line naming it
    ignored = [note.split()[2] for note in args.notes if note.startswith("recipe key")]
    expected = ["vllm_device", "do_eval", "hub_strategy", "max_prompt_length", "overwrite_output_dir", "push_to_hub"]
    assert sorted(ignored) == sorted(expected + ["dataset_configs", "save_strategy"])


def test_an_open_r1_recipe_answers_with_one_message_and_runs_once_its_rewards_exist(
    tmp_path, tiny_model, capsys, monkeypatch
):
    recipe = tmp_path / "config_demo.yaml"
    recipe.write_text(OPEN_R1_RECIPE)
    out = tmp_path / "out"
    code, stderr = run_in_process(
        grpotrainer.main, "--smoke", "--config", str(recipe), f"--OUTPUT_DIR={out}", capsys=capsys
    )
    # open-r1's rewards are not this script's: one message (with the CPU's own refusals), no traceback, nothing written
    assert code == 2 and "unknown reward 'accuracy'" in stderr and "Traceback" not in stderr
    assert not out.exists()
    # with this script's rewards, and the CPU's bf16 and HF generate, every recipe key reaches a GRPOConfig TRL takes
    cpu = ["--REWARD_FUNCS=correctness_reward,format_reward", "--BF16=false", "--USE_VLLM=false", "--REPORT_TO=none"]
    args = parse(["--smoke", "--config", str(recipe), f"--MODEL_NAME={tiny_model}", *cpu])
    config = grpotrainer.build_config(args.settings, args.fields, cpu_only=True)
    preflight.refuse_bad_grpo_config(config, args.settings, train_size=32 * 16)
    assert (config.lr_scheduler_type, config.learning_rate, config.num_generations) == ("cosine", 2e-5, 16)
    assert config.model_init_kwargs["revision"] == "main" and config.gradient_checkpointing_kwargs == {
        "use_reentrant": False
    }
