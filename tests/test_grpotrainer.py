"""Tests of grpotrainer.py's own functions: build_config from the settings table, the LoRA config build_trainer
hands TRL, main's checks; and one smoke run for what reaches the adapter and run_settings.json.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_grpotrainer.py -q -m "not slow"   # fast: in-process
OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_grpotrainer.py -q -m slow         # + one smoke run (~20 s)
"""

import json
import re
from types import SimpleNamespace

import pytest
from conftest import parse, run_in_process, run_script, train

import grpotrainer
from demo import smoke
from grpo import cli, generation, gsm8k, hardware, patches
from grpo.errors import ConfigError
from grpo.settings import TABLE, config_kwargs, lora_targets

FIXTURE = str(gsm8k.FIXTURE)


HAS_CUDA = hardware.cuda_available()


def test_import_is_light():
    # importing the script must not pull in torch/transformers/trl (no model, no download, no training)
    out = run_script("-c", "import sys, grpotrainer; print(sorted({'torch','transformers','trl'} & set(sys.modules)))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# as preflight.resolve leaves the constants on this CPU: USE_VLLM and its memory share decided, fp32
RESOLVED = {"BF16": False, "USE_VLLM": False, "VLLM_GPU_MEMORY_UTILIZATION": 0.3}

# For each constant with a GRPOConfig field (grpo/settings.py): a value no default has, and what the field then holds
CHANGED = {
    "TRUST_REMOTE_CODE": (True, True),
    "NUM_GENERATIONS": (4, 4),
    "MAX_COMPLETION_LENGTH": (200, 200),
    "TEMPERATURE": (0.9, 0.9),
    "BETA": (0.03, 0.03),
    "LOSS_TYPE": ("grpo", "grpo"),
    "SCALE_REWARDS": ("batch", "batch"),
    "NUM_ITERATIONS": (2, 2),
    "STEPS_PER_GENERATION": (4, 4),  # 0 is TRL's None: one generation round per optimiser step
    "MASK_TRUNCATED_COMPLETIONS": (True, True),
    "REWARD_WEIGHTS": ([1.0, 0.3], [1.0, 0.3]),
    "USE_TRANSFORMERS_CONTINUOUS_BATCHING": (True, True),
    "CACHE_IMPLEMENTATION": ("static", "static"),
    "USE_VLLM": (True, True),
    "VLLM_MODE": ("server", "server"),
    "VLLM_GPU_MEMORY_UTILIZATION": (0.5, 0.5),
    "VLLM_ENABLE_SLEEP_MODE": (True, True),
    "VLLM_SERVER_BASE_URL": ("http://10.0.0.5:8000", "http://10.0.0.5:8000"),  # "" is TRL's None: this machine
    "LEARNING_RATE": (3e-5, 3e-5),
    "PER_DEVICE_TRAIN_BATCH_SIZE": (4, 4),
    "GRADIENT_ACCUMULATION_STEPS": (2, 2),
    "NUM_TRAIN_EPOCHS": (2, 2),
    "MAX_STEPS": (100, 100),
    "WARMUP_STEPS": (0.2, 0.2),
    "ACTIVATION_CHECKPOINTING": (False, False),  # TRL's gradient_checkpointing
    "BF16": (True, True),
    "SEED": (7, 7),
    "DDP_TIMEOUT": (123, 123),
    "OUTPUT_DIR": ("outputs/elsewhere", "outputs/elsewhere"),
    "REPORT_TO": ("tensorboard, trackio", ["tensorboard", "trackio"]),  # a comma list, as TRL's list
    "LOGGING_STEPS": (3, 3),
    "LOG_COMPLETIONS_STEPS": (0, False),  # 0 = no completions table: TRL's log_completions off
    "SAVE_STEPS": (20, 20),
    "SAVE_TOTAL_LIMIT": (5, 5),
}
FIELDS = {name: row.field for name, row in TABLE.items() if row.field and "." not in row.field}  # GRPOConfig's own


def test_every_constant_with_a_field_has_a_changed_value_here(settings):
    # the walk below covers the table, not a hand-kept list: a new row with a field needs its line in CHANGED
    assert set(CHANGED) == {name for name in FIELDS if name in settings}


@pytest.mark.parametrize("name", CHANGED)
def test_a_constant_with_a_field_reaches_the_grpo_config(settings, name):
    value, expected = CHANGED[name]
    field = FIELDS[name]
    before = grpotrainer.build_config({**settings, **RESOLVED}, {}, cpu_only=True)
    after = grpotrainer.build_config({**settings, **RESOLVED, name: value}, {}, cpu_only=True)
    assert getattr(after, field) == expected != getattr(before, field)  # the field follows its constant


def test_the_config_adds_what_no_single_constant_sets(settings):
    settings.update(RESOLVED, PER_DEVICE_TRAIN_BATCH_SIZE=3, GRADIENT_ACCUMULATION_STEPS=2, NUM_GENERATIONS=6)
    config = grpotrainer.build_config(settings, {}, cpu_only=True)
    assert config.chat_template_kwargs == {"enable_thinking": settings["ENABLE_THINKING"]}
    # STEPS_PER_GENERATION=0 means "one generation round per optimiser step": 3 per micro-batch x 1 process x 2
    assert (config.steps_per_generation, config.generation_batch_size) == (2, 6)
    # from_pretrained's arguments, TRUST_REMOTE_CODE among them so that no --model_init_kwargs key can turn it on
    assert config.model_init_kwargs == {"dtype": "float32", "attn_implementation": "sdpa", "trust_remote_code": False}
    # the CPU profiles' fixed choices: on the CPU, no printed completions, LoRA's weights all used (no DDP search)
    assert (config.use_cpu, config.num_completions_to_print, config.ddp_find_unused_parameters) == (True, 0, False)


def test_no_gradient_checkpointing_turns_activation_checkpointing_off(settings):
    assert parse([]).settings["ACTIVATION_CHECKPOINTING"] is True  # on in the constants: the flag must turn it off
    args = parse(["--no_gradient_checkpointing"])
    # TRL's HfArgumentParser form of --gradient_checkpointing=false, read as the constant with a line saying so
    assert args.settings["ACTIVATION_CHECKPOINTING"] is False and "ACTIVATION_CHECKPOINTING" in args.given
    assert args.notes == ("--gradient_checkpointing is ACTIVATION_CHECKPOINTING here",)
    config = grpotrainer.build_config({**args.settings, **RESOLVED}, args.fields, cpu_only=True)
    assert config.gradient_checkpointing is False


def test_a_static_cache_is_asked_of_trl_and_its_decode_step_compiled(settings):
    from transformers import GenerationConfig

    s = {**settings, "BF16": False, "CACHE_IMPLEMENTATION": "static"}
    config = grpotrainer.build_config(s, {}, cpu_only=True)
    assert config.cache_implementation == "static"
    # TRL 1.16 builds its GenerationConfig with disable_compile=True; CompileDecode turns it back on at train begin
    trainer = SimpleNamespace(args=config, generation_config=GenerationConfig(disable_compile=True), model=None)
    # as grpotrainer.train adds them: ResumedSettings and UmaskFiles always, CompileDecode for the static cache, no
    # KeepFp32 (no continuous batching here)
    _, _, callback = patches.callbacks(trainer)
    assert type(callback) is patches.CompileDecode
    callback.on_train_begin(config, None, None)
    compile_config = trainer.generation_config.compile_config
    assert trainer.generation_config.disable_compile is False
    assert (compile_config.dynamic, compile_config.mode) == (True, "reduce-overhead")
    default = grpotrainer.build_config({**settings, "BF16": False}, {}, cpu_only=True)
    # the defaults need neither CompileDecode nor KeepFp32
    assert [type(c) for c in patches.callbacks(SimpleNamespace(args=default))] == [
        patches.ResumedSettings,
        patches.UmaskFiles,
    ]


def test_the_settings_are_the_constants_block_and_nothing_else():
    # the block between the rulers is what a user sets; the script's own tables (PROFILES, CONFIG_CLASS, PACKAGES)
    # are neither overridable nor written into run_settings.json
    assert set(cli.constants(grpotrainer)) == set(cli.comments(grpotrainer.__file__))
    with pytest.raises(ConfigError, match="unknown setting --CONFIG_CLASS"):
        parse(["--CONFIG_CLASS=os:path"])


def test_settings_are_values_not_module_state(settings):
    # building a config twice from different dicts never leaks one into the other, and the module is unchanged
    before = cli.constants(grpotrainer)
    a = grpotrainer.build_config({**settings, "BF16": False, "LEARNING_RATE": 3e-5}, {}, cpu_only=True)
    b = grpotrainer.build_config({**settings, "BF16": False}, {}, cpu_only=True)
    assert (a.learning_rate, b.learning_rate) == (3e-5, settings["LEARNING_RATE"])
    assert cli.constants(grpotrainer) == before


@pytest.mark.parametrize(
    "report_to, expected",
    [("tensorboard", ["tensorboard"]), ("none", []), ("tensorboard, trackio", ["tensorboard", "trackio"])],
)
def test_report_to(settings, report_to, expected):
    config = grpotrainer.build_config({**settings, "BF16": False, "REPORT_TO": report_to}, {}, cpu_only=True)
    assert config.report_to == expected


def test_grpo_config_fields_pass_through_typed(settings):
    args = parse(["--top_p=0.9", "--epsilon_high=0.28", "--use_transformers_paged=false", "--min_p=0.05"])
    assert args.fields == {"top_p": 0.9, "epsilon_high": 0.28, "use_transformers_paged": False, "min_p": 0.05}
    config = grpotrainer.build_config({**settings, "BF16": False}, args.fields, cpu_only=True)
    assert (config.top_p, config.epsilon_high, config.min_p) == (0.9, 0.28, 0.05)


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--top_pp=0.9", "unknown setting --top_pp: not a constant nor a GRPOConfig field. Did you mean top_p"),
        ("--use_cpu=true", "--use_cpu is set by the CPU profiles"),
        ("--resume_from_checkpoint=x", "--resume_from_checkpoint is set by RESUME"),
        ("--top_p=high", "invalid float value: 'high'"),
    ],
)
def test_bad_grpo_config_fields_are_clear(arg, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse([arg])


def test_grpo_config_refusals_become_config_errors(settings):
    # a combination GRPOConfig itself rejects: an importance-sampling clip range whose minimum exceeds its maximum
    with pytest.raises(ConfigError, match="GRPOConfig refuses these settings"):
        grpotrainer.build_config(
            {**settings, "BF16": False},
            {"vllm_importance_sampling_clip_min": 2.0, "vllm_importance_sampling_clip_max": 1.0},
            cpu_only=True,
        )


def test_smoke_config_is_fp32_on_cpu(smoke_settings):
    config = grpotrainer.build_config(smoke_settings, {}, cpu_only=True)
    assert config.use_cpu and not config.bf16
    assert config.model_init_kwargs["attn_implementation"] == "sdpa"  # flash-attn is never picked on CPU


def built_lora(s, monkeypatch):
    """The peft LoraConfig that build_trainer hands TRL for the settings `s`: TRL's trainer (which would load the
    model) stood in for by one that keeps its arguments."""
    import trl

    monkeypatch.setattr(trl, "GRPOTrainer", lambda **kwargs: SimpleNamespace(**kwargs))
    monkeypatch.setattr(patches, "after_init", lambda trainer, load_in_4bit: None)
    return grpotrainer.build_trainer(s, config=None, reward_funcs=[], train_dataset=None).peft_config


def test_the_lora_settings_reach_peft(settings, monkeypatch):
    s = {**settings, "LORA_R": 12, "LORA_ALPHA": 24, "LORA_DROPOUT": 0.05, "USE_RSLORA": True, "USE_DORA": True}
    # the table's lora_config. rows, each under peft's own name
    expected = {"r": 12, "lora_alpha": 24, "lora_dropout": 0.05, "use_rslora": True, "use_dora": True}
    expected["target_modules"] = lora_targets(s["LORA_TARGET_MODULES"])
    assert config_kwargs(s, "lora_config.") == expected
    lora = built_lora(s, monkeypatch)
    assert {key: getattr(lora, key) for key in expected} == expected
    assert lora.task_type == "CAUSAL_LM"
    lora = built_lora({**settings, "LORA_TARGET_MODULES": "all-linear"}, monkeypatch)
    assert lora.target_modules == "all-linear"  # peft's own keyword, passed as it is
    lora = built_lora({**settings, "LORA_TARGET_MODULES": "q_proj, v_proj"}, monkeypatch)
    assert set(lora.target_modules) == {"q_proj", "v_proj"}
    assert hardware.quantization_config(False, True) is None  # no 4-bit asked: no quantization config


def test_trls_use_rslora_and_use_dora_reach_peft(monkeypatch):
    args = parse(["--use_rslora", "--use_dora"])  # bare flags, as `trl grpo` takes them
    assert set(args.notes) == {"--use_rslora is USE_RSLORA here", "--use_dora is USE_DORA here"}
    lora = built_lora(args.settings, monkeypatch)
    assert (lora.use_rslora, lora.use_dora) == (True, True)
    lora = built_lora(parse([]).settings, monkeypatch)
    assert (lora.use_rslora, lora.use_dora) == (False, False)  # neither given: plain LoRA, as the constants say


# --- the command line, end to end: a clean message, exit 2, no traceback --------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--smoke", "--NUM_GENERATIONS=3"], "not a multiple of NUM_GENERATIONS=3"),
        (["--smoke", "--REWARD_FUNCS=nope_reward", "--REWARD_WEIGHTS=1"], "unknown reward 'nope_reward'"),
        (["--smoke", "--DATASET=/nonexistent/gsm8k.jsonl"], "DATASET=/nonexistent/gsm8k.jsonl: no such file"),
        (["--smoke", "--TEMPERATUR=1"], "Did you mean TEMPERATURE"),
        # refused, not uploaded: Trainer would push checkpoints and TRL's card; export.py pushes the right files
        (["--smoke", "--push_to_hub=true"], "--push_to_hub=true is refused"),
        (["--smoke", "--push_to_hub=true"], "python export.py --ADAPTER="),
        (["--smoke", "--push_to_hub=true"], "--ADAPTER_ONLY=true --PUSH_TO_HUB=you/name"),  # the adapter, as TRL's
        pytest.param(
            [], "no CUDA GPU is visible", marks=pytest.mark.skipif(HAS_CUDA, reason="would start a real run")
        ),
    ],
)
def test_cli_errors_exit_2_without_traceback(args, message, tmp_path, capsys, monkeypatch):
    # preflight's mistakes, through process.run as `python grpotrainer.py` runs it, in this process
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, stderr = run_in_process(grpotrainer.main, *args, f"--OUTPUT_DIR={tmp_path}", capsys=capsys)
    assert code == 2
    assert message in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


# --- vLLM's context, LoRA dropout --------------------------------------------------------------------------------


def test_vllm_context_is_bounded_by_the_data_unless_given(smoke_ok, tiny_model):
    data = gsm8k.load(FIXTURE, "train")
    longest = generation.longest_prompt(data, tiny_model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rendered = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, enable_thinking=False) for p in data["prompt"]
    ]
    # the longest prompt of the data rendered as TRL renders it (ENABLE_THINKING=False: the empty think block too)
    assert longest == max(len(r["input_ids"]) for r in rendered)
    s = {**smoke_ok, "USE_VLLM": True, "MODEL_NAME": tiny_model}
    config = grpotrainer.build_config(s, {}, cpu_only=True, datasets=(data, None))
    # prompt + MAX_COMPLETION_LENGTH (32 in --smoke) + the margin: the rule evaluation's vllm_generator uses
    assert config.vllm_max_model_length == longest + 32 + generation.CONTEXT_MARGIN
    assert config.vllm_max_model_length == generation.context_length(longest, 32)
    config = grpotrainer.build_config(s, {"vllm_max_model_length": 4096}, cpu_only=True, datasets=(data, None))
    assert config.vllm_max_model_length == 4096  # the user's --vllm_max_model_length wins
    config = grpotrainer.build_config(s, {}, cpu_only=True)
    # --plan (no data loaded): a typical GSM8K prompt, as the plan's time estimates assume
    assert config.vllm_max_model_length == generation.context_length(generation.PROMPT_TOKENS, 32)
    config = grpotrainer.build_config(smoke_ok, {}, cpu_only=True)
    assert config.vllm_max_model_length is None  # without vLLM nothing is set


def test_under_fsdp_the_model_loads_without_a_device_map(settings, monkeypatch):
    s = {**settings, **RESOLVED}
    assert "device_map" not in grpotrainer.build_config(s, {}, cpu_only=True).model_init_kwargs
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    # TRL sets device_map=None for DDP and DeepSpeed, not FSDP, where "auto" would fill one GPU before sharding
    assert grpotrainer.build_config(s, {}, cpu_only=True).model_init_kwargs["device_map"] is None


# --- pass-through: every field build_config sets, given again by the user ----------------------------------------

# values for the fields build_config leaves None, which have no value of their own to give back
GIVEN_FOR_NONE = {"steps_per_generation": "2", "vllm_server_base_url": "http://127.0.0.1:8000"}


def passed_fields(s, monkeypatch):
    """{field: value} that build_config passes GRPOConfig for the settings `s`."""
    import trl

    seen = {}
    real = trl.GRPOConfig
    monkeypatch.setattr(trl, "GRPOConfig", lambda **kwargs: seen.update(kwargs) or real(**kwargs))
    grpotrainer.build_config(s, {}, cpu_only=True)
    monkeypatch.setattr(trl, "GRPOConfig", real)
    return seen


def as_argument(field, value):
    if isinstance(value, dict):  # a key of the user's own, beside the script's
        return f"--{field}=" + json.dumps({"revision": "main"} if field == "model_init_kwargs" else {"mine": 1})
    if isinstance(value, list):
        return f"--{field}=" + ",".join(str(item) for item in value)
    if value is None:
        return f"--{field}={GIVEN_FOR_NONE[field]}"
    return f"--{field}={str(value).lower() if isinstance(value, bool) else value}"


def test_every_field_build_config_sets_is_read_as_its_constant_merged_or_refused(smoke_settings, monkeypatch):
    passed = passed_fields(smoke_settings, monkeypatch)
    assert len(passed) > 30  # the walk covers what build_config sets, not a hand-kept list
    outcomes = {}
    for field, value in passed.items():
        argument = as_argument(field, value)
        try:
            args = parse(["--smoke", argument])
            config = grpotrainer.build_config(args.settings, args.fields, cpu_only=True)
        except ConfigError as err:  # one message naming the field, never a TypeError for a keyword given twice
            assert str(err).startswith(f"--{field}") and "----" not in str(err), (argument, err)
            outcomes[field] = "refused"
            continue
        if field in args.fields:  # passed through: the user's value, a dict merged with the script's keys
            mine = args.fields[field]
            got = getattr(config, field)
            if isinstance(value, dict):
                assert got == {**value, **json.loads(mine)}, argument
            else:
                assert got == mine, argument
            outcomes[field] = "merged"
        else:  # read as the constant it means, with a line saying so
            (note,) = args.notes
            constant = note.split()[2].lstrip("-").partition("=")[0]  # "LEARNING_RATE" or "--LOG_COMPLETIONS_STEPS=0"
            assert note.startswith(f"--{field}") and constant in args.given, (argument, note)
            outcomes[field] = "constant"
    # the three that once ended in "GRPOConfig() got multiple values for keyword argument"
    assert {outcomes[f] for f in ("num_completions_to_print", "ddp_find_unused_parameters")} == {"merged"}
    assert outcomes["log_completions"] == "constant"  # LOG_COMPLETIONS_STEPS: 0 = off, 1 = every step
    assert outcomes["use_cpu"] == "refused" and outcomes["learning_rate"] == "constant"


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("--log_completions=false", {"log_completions": False}),  # read as LOG_COMPLETIONS_STEPS=0
        ("--num_completions_to_print=2", {"num_completions_to_print": 2}),
        ("--ddp_find_unused_parameters=true", {"ddp_find_unused_parameters": True}),
        ("--use_liger_kernel=true", {"use_liger_kernel": True}),  # TRL's own field: docs/gpu.md points here
    ],
)
def test_a_field_build_config_also_sets_takes_the_users_value(smoke_settings, argument, expected):
    args = parse(["--smoke", argument])
    config = grpotrainer.build_config(args.settings, args.fields, cpu_only=True)
    assert {key: getattr(config, key) for key in expected} == expected


def test_model_init_kwargs_merge_with_attn_implementation_and_a_clash_is_one_message(smoke_settings):
    args = parse(["--smoke", '--model_init_kwargs={"revision": "main", "use_kernels": true}', "--model_revision=v2"])
    config = grpotrainer.build_config(args.settings, args.fields, cpu_only=True)
    # the user's keys beside the script's dtype and attention kernel; TRL's --model_revision is the same key, later
    assert config.model_init_kwargs == {
        "dtype": "float32",
        "attn_implementation": "sdpa",
        "trust_remote_code": False,
        "revision": "v2",
        "use_kernels": True,
    }
    for key in ("dtype", "attn_implementation", "trust_remote_code"):
        args = parse(["--smoke", f'--model_init_kwargs={{"{key}": "x"}}'])
        with pytest.raises(ConfigError, match=f"^--model_init_kwargs sets {key}, which ATTN_IMPLEMENTATION, BF16"):
            grpotrainer.build_config(args.settings, args.fields, cpu_only=True)


@pytest.mark.parametrize(
    "args",
    [
        ["--top_p=1.5"],
        ["--save_strategy=nope"],
        ["--save_strategy=epoch"],
        ["--adam_beta1=2"],
        ["--adam_epsilon=0"],
        ["--weight_decay=-1"],
        ["--LORA_TARGET_MODULES=nope_proj"],
        ["--LORA_TARGET_MODULES=q_proj", "--LORA_R=1000"],
    ],
)
def test_a_config_or_lora_mistake_is_refused_before_the_smoke_model_is_built(args, tmp_path, capsys, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the smoke model was built before the refusal")

    # the work a refusal must not do: build (and write) the smoke model, or load weights
    monkeypatch.setattr(smoke, "ensure_model_dir", never)
    monkeypatch.setattr(grpotrainer, "build_trainer", never)
    code, stderr = run_in_process(grpotrainer.main, "--smoke", *args, f"--OUTPUT_DIR={tmp_path}", capsys=capsys)
    assert code == 2 and "Traceback" not in stderr, stderr
    assert list(tmp_path.iterdir()) == []  # nothing written, as the message says


# --- one smoke run: what the command line's TRL names leave in the adapter and the run's record --------------------


@pytest.fixture(scope="module")
def rslora_run(tmp_path_factory):
    """A --smoke run given TRL's --use_rslora, and a recipe turning gradient checkpointing on that the command line's
    --no_gradient_checkpointing turns off again: (its OUTPUT_DIR, the finished process)."""
    folder = tmp_path_factory.mktemp("rslora")
    (folder / "recipe.yaml").write_text(
        "gradient_checkpointing: true\n"
    )  # TRL's name, read as ACTIVATION_CHECKPOINTING
    out = folder / "run"
    done = train(out, "--use_rslora", "--config", str(folder / "recipe.yaml"), "--no_gradient_checkpointing")
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


@pytest.mark.slow
def test_use_rslora_reaches_the_saved_adapter(rslora_run):
    out, done = rslora_run
    # peft wrote the LoraConfig build_trainer made: rank-stabilised scaling (alpha / sqrt(r)), the TRL flag's doing
    assert json.loads((out / "adapter_config.json").read_text())["use_rslora"] is True
    assert "--use_rslora is USE_RSLORA here" in done.stderr


@pytest.mark.slow
def test_no_gradient_checkpointing_is_recorded_off_over_the_recipe(rslora_run):
    out, done = rslora_run
    record = json.loads((out / "run_settings.json").read_text())
    # the command line wins over the recipe; the record holds the constant (what evaluate.py and a resume read)
    assert record["ACTIVATION_CHECKPOINTING"] is False and record["USE_RSLORA"] is True
    assert "--gradient_checkpointing is ACTIVATION_CHECKPOINTING here" in done.stderr
    # only settings in the record: no module table of the script (PROFILES, CONFIG_CLASS) written as one
    assert not {"PROFILES", "CONFIG_CLASS", "PACKAGES"} & set(record)
