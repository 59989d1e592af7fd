"""grpo/recipes.py: `--config recipe.yaml`, a flat YAML recipe of constants, GRPOConfig fields, TRL's and open-r1's
keys, read before the command line (which wins) and safely: no aliases, no key twice, no deep nesting, UTF-8 only,
never trust_remote_code.

.venv/bin/python -m pytest tests/test_recipes.py -q
"""

import json
import re

import pytest
from conftest import REPO, custom_code_model, parse, run_in_process

import grpotrainer
from grpo import cli, gsm8k, preflight, recipes, settings
from grpo.errors import ConfigError


def write(tmp_path, content, name="r.yaml"):
    recipe = tmp_path / name
    recipe.write_bytes(content if isinstance(content, bytes) else content.encode())
    return recipe


def test_a_recipe_sets_constants_and_fields_and_the_command_line_wins(tmp_path):
    recipe = write(tmp_path, "MAX_STEPS: 2\nREWARD_FUNCS: [correctness_reward]\nREWARD_WEIGHTS: [1.0]\ntop_p: 0.9\n")
    args = parse(["--smoke", "--config", str(recipe)])
    assert args.settings["MAX_STEPS"] == 2  # the file over --smoke's 4
    assert args.settings["REWARD_FUNCS"] == ["correctness_reward"] and args.settings["REWARD_WEIGHTS"] == [1.0]
    assert args.fields == {"top_p": 0.9}  # a lower-case key is a GRPOConfig field, typed by transformers
    assert "MAX_STEPS" in args.given  # a recipe's constant counts as given, as on the command line
    args = parse(["--smoke", f"--config={recipe}", "--MAX_STEPS=3", "--top_p=0.8"])
    assert (args.settings["MAX_STEPS"], args.fields["top_p"]) == (3, 0.8)  # the command line wins


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_the_shipped_recipes_parse_and_pass_the_tables_checks(path):
    args = parse(["--config", str(path)])
    text = path.read_text(encoding="utf-8")
    # every key of the file is given, read as it is written (the comments after values are YAML's, not values)
    keys = re.findall(r"^([A-Za-z_]+):", text, re.M)
    assert args.given == set(keys) and args.fields == {} and args.notes == ()
    assert settings.problems(args.settings) == []


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
        ("1: 2\n", "--config {path}: a recipe is a mapping of KEY: value lines"),  # a key that is not text
        ("MAX_STEPS: [\n", "--config {path}: not valid YAML"),
    ],
)
def test_a_bad_recipe_names_the_file_and_the_key(tmp_path, text, message):
    recipe = write(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(message.format(path=recipe))):
        parse(["--config", str(recipe)])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config"], "--config needs a recipe file: --config configs/recipe.yaml"),
        (["--config", "no-such.yaml"], "--config no-such.yaml: cannot read it (No such file or directory)"),
    ],
)
def test_a_recipe_that_cannot_be_read_is_one_line(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(argv)


def test_a_text_that_yaml_cuts_at_a_hash_is_refused_naming_the_line(tmp_path):
    # YAML reads " #### <number>." as a comment: the prompt would silently lose the answer format it asks for
    recipe = write(
        tmp_path, "MAX_STEPS: 2  # a comment after a number is one\nSYSTEM_PROMPT: Answer as #### <number>.\n"
    )
    with pytest.raises(ConfigError) as refused:
        parse(["--config", str(recipe)])
    assert str(refused.value).startswith(f"--config {recipe}: line 2: YAML reads '#### <number>.' after SYSTEM_PROMPT")
    # quoted, the whole text is the value
    recipe = write(
        tmp_path, "MAX_STEPS: 2  # two\nSYSTEM_PROMPT: 'Answer as #### <number>.'\nREPORT_TO: none  # off\n"
    )
    s = parse(["--config", str(recipe)]).settings
    assert (s["MAX_STEPS"], s["SYSTEM_PROMPT"], s["REPORT_TO"]) == (2, "Answer as #### <number>.", "none")
    # a note after a text of several words is a comment as the writer meant it: read, not refused
    recipe = write(tmp_path, "SYSTEM_PROMPT: Solve it step by step  # our own prompt\n")
    assert parse(["--config", str(recipe)]).settings["SYSTEM_PROMPT"] == "Solve it step by step"


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
        ("a: {b: {c: {d: {e: {f: {g: {h: {i: 1}}}}}}}}\n", f"line 1 nests deeper than {recipes.DEPTH} levels"),
    ],
)
def test_a_recipe_yaml_cannot_hang_or_crash_the_reader(tmp_path, content, message):
    recipe = write(tmp_path, content)
    with pytest.raises(ConfigError, match=re.escape(message)) as refused:
        parse(["--config", str(recipe)])
    assert str(refused.value).startswith(f"--config {recipe}")  # the file named


def test_nesting_up_to_depth_is_read():
    # DEPTH counts the recipe's mapping as a level: a dict field's value nested to the limit still loads
    text = "a: " + "{b: " * (recipes.DEPTH - 2) + "1" + "}" * (recipes.DEPTH - 2) + "\n"
    assert recipes.load(text)["a"] is not None
    with pytest.raises(ConfigError, match="nests deeper than"):
        recipes.load("a: " + "{b: " * (recipes.DEPTH - 1) + "1" + "}" * (recipes.DEPTH - 1) + "\n")


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("TRUST_REMOTE_CODE: true", "TRUST_REMOTE_CODE"),
        ("trust_remote_code: true", "trust_remote_code"),
        ("Trust-Remote-Code: yes", "Trust-Remote-Code"),
        ("model_init_kwargs: {trust_remote_code: true}", "trust_remote_code"),  # at any depth
        ("x: [{trust_remote_code: false}]", "trust_remote_code"),  # in a list, and even when false
    ],
)
def test_a_recipe_never_turns_on_remote_code_and_nothing_runs_the_folders_code(
    line, key, tmp_path, tiny_model, capsys, monkeypatch
):
    model = custom_code_model(tmp_path / "custom", tiny_model)
    ran = tmp_path / "ran"
    monkeypatch.setenv("CUSTOM_CODE_RAN", str(ran))
    recipe = write(tmp_path, f"MODEL_NAME: {model}\n{line}\n", name="shared.yaml")
    out = tmp_path / "out"
    code, stderr = run_in_process(
        grpotrainer.main, "--smoke", "--config", str(recipe), f"--OUTPUT_DIR={out}", capsys=capsys
    )
    assert code == 2 and "running a model folder's own code is never taken from a file" in stderr
    assert f"sets {key}:" in stderr  # the key, as the recipe spells it
    assert not ran.exists() and not out.exists()  # refused before anything loaded or was written


def test_keep_drops_ignored_keys_with_a_line_each_and_refuses_all_unknown_keys_at_once():
    kept, notes = recipes.keep(["--MAX_STEPS=2", "--push_to_hub=true", "--top_p=0.9"], {"MAX_STEPS", "top_p"})
    assert kept == ["--MAX_STEPS=2", "--top_p=0.9"]
    assert notes == [f"recipe key push_to_hub ignored: {recipes.IGNORED['push_to_hub']}"]
    with pytest.raises(ConfigError, match=re.escape("unknown settings MAX_STEP (did you mean MAX_STEPS?), zzz:")):
        recipes.keep(["--MAX_STEP=2", "--zzz=1"], {"MAX_STEPS"})


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
    recipe = write(tmp_path, OPEN_R1_RECIPE, name="config_demo.yaml")
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
    assert (s["USE_VLLM"], s["LOG_COMPLETIONS_STEPS"]) == ("true", 1)  # typed as USE_VLLM's "auto" is, a text
    # the other GRPOConfig fields pass through, typed; model_revision joins model_init_kwargs
    assert args.fields["lr_scheduler_type"] == "cosine" and args.fields["model_init_kwargs"] == '{"revision": "main"}'
    assert args.fields["gradient_checkpointing_kwargs"] == '{"use_reentrant": false}'
    # each key this script does not honour: one line naming it
    ignored = [note.split()[2] for note in args.notes if note.startswith("recipe key")]
    expected = ["vllm_device", "do_eval", "hub_strategy", "max_prompt_length", "overwrite_output_dir", "push_to_hub"]
    expected += ["dataset_configs", "save_strategy", "hub_model_id", "per_device_eval_batch_size"]
    assert sorted(ignored) == sorted(expected) and not set(ignored) & set(args.fields)


def test_an_open_r1_recipes_keys_reach_a_grpoconfig_trl_takes(tmp_path, tiny_model):
    recipe = write(tmp_path, OPEN_R1_RECIPE, name="config_demo.yaml")
    # the CPU's bf16 and HF generate: every other recipe key reaches a GRPOConfig TRL takes
    cpu = ["--BF16=false", "--USE_VLLM=false", "--REPORT_TO=none"]
    args = parse(["--smoke", "--config", str(recipe), f"--MODEL_NAME={tiny_model}", *cpu])
    assert args.settings["REWARD_FUNCS"] == ["accuracy", "format"]  # open-r1's names, read by reward_guard
    config = grpotrainer.build_config(args.settings, args.fields, cpu_only=True)
    preflight.refuse_bad_grpo_config(config, args.settings, train_size=32 * 16)
    assert (config.lr_scheduler_type, config.learning_rate, config.num_generations) == ("cosine", 2e-5, 16)
    assert config.model_init_kwargs["revision"] == "main" and config.gradient_checkpointing_kwargs == {
        "use_reentrant": False
    }
    assert cli.constants(grpotrainer)["LEARNING_RATE"] != 2e-5  # the recipe set the run's value, not the module's


# open-r1's GRPO recipe in its current shape, with CPU values and a local dataset of open-r1's columns
OPEN_R1_CPU_RECIPE = """model_name_or_path: {model}
model_revision: main
torch_dtype: float32
attn_implementation: sdpa
dataset_name: {data}
dataset_prompt_column: problem
system_prompt: "Solve the problem step by step, then give the final answer on its own last line as #### <number>."
reward_funcs:
- accuracy
- format
reward_weights:
- 1.0
- 0.2
bf16: false
use_vllm: false
gradient_checkpointing: false
gradient_checkpointing_kwargs:
  use_reentrant: false
hub_model_id: SmolQwen-GRPO
hub_strategy: every_save
log_level: info
logging_first_step: true
logging_steps: 1
learning_rate: 1.0e-03
max_completion_length: 32
max_steps: 2
num_generations: 4
per_device_train_batch_size: 4
push_to_hub: false
report_to:
- none
save_strategy: steps
save_steps: 2
seed: 42
"""


@pytest.mark.slow
def test_an_open_r1_recipe_as_written_trains_with_smoke(tmp_path, tiny_model, capsys):
    data = tmp_path / "data"
    data.mkdir()
    rows = [json.loads(line) for line in gsm8k.FIXTURE.read_text().splitlines()]
    for split in ("train", "test"):  # open-r1's columns: problem and solution
        lines = [json.dumps({"problem": r["question"], "solution": r["answer"]}) for r in rows]
        (data / f"{split}.jsonl").write_text("\n".join(lines) + "\n")
    recipe = write(tmp_path, OPEN_R1_CPU_RECIPE.format(model=tiny_model, data=data), name="config.yaml")
    out = tmp_path / "out"
    code, stderr = run_in_process(
        grpotrainer.main, "--smoke", "--config", str(recipe), f"--OUTPUT_DIR={out}", capsys=capsys
    )
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert (out / "run_finished.json").is_file()
    # open-r1's reward names, read as this project's, with the weights the recipe gave
    settings = json.loads((out / "run_settings.json").read_text())
    assert settings["REWARD_FUNCS"] == ["accuracy", "format"] and settings["REWARD_WEIGHTS"] == [1.0, 0.2]
    assert settings["QUESTION_FIELD"] == "problem" and "open-r1's format" in stderr
