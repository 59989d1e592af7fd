"""grpotrainer.py: config building, overrides, preflight errors and dataset mapping (fast, in-process).

.venv/bin/python -m pytest tests/test_train.py -q
"""

import json
import math
import re
from pathlib import Path

import pytest
from conftest import REPO, run_in_process, run_script

import grpotrainer
from grpo import cli, gsm8k, hardware, plan, preflight, reward_guard
from grpo.errors import ConfigError

FIXTURE = str(gsm8k.FIXTURE)
HAS_CUDA = hardware.cuda_available()


def test_import_is_light():
    # importing the script must not pull in torch/transformers/trl (no model, no download, no training)
    out = run_script("-c", "import sys, grpotrainer; print(sorted({'torch','transformers','trl'} & set(sys.modules)))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_config_maps_constants_to_grpo_config(settings):
    settings["BF16"] = False  # a CPU machine cannot build a bf16 config; everything else keeps the defaults
    s, _ = plan.resolve_generation(settings, cuda=False, vllm_installed=False)  # USE_VLLM=auto, as main resolves it
    config = grpotrainer.build_config(s, {}, cpu_only=True)
    # the tutorial's names translated to TRL 1.16: kl_coef -> beta, max_new_tokens -> max_completion_length
    assert config.beta == s["BETA"]
    assert config.max_completion_length == s["MAX_COMPLETION_LENGTH"]
    assert config.num_generations == s["NUM_GENERATIONS"]
    assert config.temperature == s["TEMPERATURE"]
    batch, accumulation = s["PER_DEVICE_TRAIN_BATCH_SIZE"], s["GRADIENT_ACCUMULATION_STEPS"]
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (batch, accumulation)
    assert config.num_train_epochs == s["NUM_TRAIN_EPOCHS"] and config.max_steps == s["MAX_STEPS"]
    assert config.warmup_steps == s["WARMUP_STEPS"] and config.use_vllm is False
    assert config.gradient_checkpointing is True
    assert config.learning_rate == s["LEARNING_RATE"]
    assert config.reward_weights == [1.0, 0.2]
    assert config.report_to == ["tensorboard"]
    assert config.logging_steps == 1
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.trust_remote_code is False
    assert config.ddp_timeout == settings["DDP_TIMEOUT"]
    # STEPS_PER_GENERATION=0 means "one generation round per optimiser step": batch x 1 process x accumulation
    assert (config.steps_per_generation, config.generation_batch_size) == (accumulation, batch * accumulation)
    assert config.model_init_kwargs == {"dtype": "float32", "attn_implementation": "sdpa"}
    assert config.cache_implementation == "dynamic"  # transformers' default KV cache, eager decoding


def test_a_static_cache_is_asked_of_trl_and_its_decode_step_compiled(settings):
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from grpo import guards

    s = {**settings, "BF16": False, "CACHE_IMPLEMENTATION": "static"}
    config = grpotrainer.build_config(s, {}, cpu_only=True)
    assert config.cache_implementation == "static"
    # TRL 1.16 builds its GenerationConfig with disable_compile=True; CompileDecode turns it back on at train begin
    trainer = SimpleNamespace(args=config, generation_config=GenerationConfig(disable_compile=True), model=None)
    (callback,) = guards.generation_guards(trainer)  # no KeepFp32: no continuous batching here
    callback.on_train_begin(config, None, None)
    compile_config = trainer.generation_config.compile_config
    assert trainer.generation_config.disable_compile is False
    assert (compile_config.dynamic, compile_config.mode) == (True, "reduce-overhead")
    default = grpotrainer.build_config({**settings, "BF16": False}, {}, cpu_only=True)
    assert guards.generation_guards(SimpleNamespace(args=default)) == []  # the defaults need neither guard


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
        ("--learning_rate=1e-5", "--learning_rate is set by the constant LEARNING_RATE"),
        ("--gradient_checkpointing=true", "set by the constant ACTIVATION_CHECKPOINTING"),
        ("--top_p=high", "invalid float value: 'high'"),
    ],
)
def test_bad_grpo_config_fields_are_clear(arg, message):
    with pytest.raises(ConfigError, match=_literal(message)):
        parse([arg])


def test_grpo_config_refusals_become_config_errors(settings):
    # a combination GRPOConfig itself rejects: an importance-sampling clip range whose minimum exceeds its maximum
    with pytest.raises(ConfigError, match="GRPOConfig refuses these settings"):
        grpotrainer.build_config(
            {**settings, "BF16": False},
            {"vllm_importance_sampling_clip_min": 2.0, "vllm_importance_sampling_clip_max": 1.0},
            cpu_only=True,
        )


def test_help_lists_every_constant_with_its_comment():
    out = run_script("grpotrainer.py", "--help")
    assert out.returncode == 0 and not out.stderr
    for name in cli.constants(grpotrainer):
        assert f"--{name}=" in out.stdout
    assert "adapter rank: 8-64" in out.stdout  # LORA_R's comment
    # no dropout by default: TRL computes the "old" log-probs in train mode, where dropout is noise
    assert '--LORA_DROPOUT=0.0\n        0-0.1; 0 as TRL\'s "old" log-probs run in train mode' in out.stdout
    assert out.stdout.startswith("GRPO-tune a Qwen model on GSM8K")  # the summary line first
    # command-line syntax, not Python literals: what a user can paste back
    assert "--REWARD_FUNCS=correctness_reward,format_reward\n" in out.stdout
    assert "--MODEL_NAME=Qwen/Qwen3-8B\n" in out.stdout and "--BF16=true\n" in out.stdout
    assert "--smoke sets, before the command line's own --KEY=value:" in out.stdout
    assert "MAX_STEPS=4" in out.stdout.split("--smoke sets")[1]  # what the profile overrides


def test_smoke_config_is_fp32_on_cpu(smoke_settings):
    config = grpotrainer.build_config(smoke_settings, {}, cpu_only=True)
    assert config.use_cpu and not config.bf16
    assert config.model_init_kwargs["attn_implementation"] == "sdpa"  # flash-attn is never picked on CPU


def test_flash_attention_only_in_bf16_on_cuda(gpu):
    gpu(packages={"flash_attn"})
    assert hardware.model_init_kwargs("auto", True, cpu_only=False)["attn_implementation"] == "flash_attention_2"
    # flash-attn kernels run only in 16-bit: fp32 (e.g. on a V100) must fall back to sdpa
    kwargs = hardware.model_init_kwargs("auto", False, cpu_only=False)
    assert kwargs == {"dtype": "float32", "attn_implementation": "sdpa"}
    assert hardware.model_init_kwargs("auto", True, cpu_only=True)["attn_implementation"] == "sdpa"


def test_lora_config(settings):
    peft = grpotrainer.build_peft_config(settings)
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (16, 32, 0.0)
    assert peft.target_modules == "all-linear"
    peft = grpotrainer.build_peft_config({**settings, "LORA_TARGET_MODULES": "q_proj, v_proj"})
    assert set(peft.target_modules) == {"q_proj", "v_proj"}
    assert hardware.quantization_config(False, True) is None  # LOAD_IN_4BIT is off by default


# --- overrides ---------------------------------------------------------------------------------------------------


def parse(argv):
    return cli.parse(
        cli.constants(grpotrainer), argv, grpotrainer.profile_settings, "trl:GRPOConfig", grpotrainer.owned
    )


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
    assert grpotrainer.NUM_GENERATIONS != 16  # the module keeps its defaults


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
    with pytest.raises(ConfigError, match=_literal(message)):
        parse([arg])


# --- preflight ---------------------------------------------------------------------------------------------------


@pytest.fixture
def smoke_ok(smoke_settings):
    preflight.check(smoke_settings, cpu_only=True)  # the baseline is clean, so each test below isolates one mistake
    return smoke_settings


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
        (dict(BF16=True), "--smoke and --demo run on the CPU in fp32"),
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

    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check({**smoke_ok, **changes}, cpu_only=True, known_rewards=rewards.REWARDS)


@pytest.mark.parametrize(
    "changes, message",
    [
        # the categories of settings that once ran a wasted run or ended in a traceback after the weights loaded
        (dict(LORA_ALPHA=0), "LORA_ALPHA=0 is outside (0, inf]"),
        (dict(LORA_DROPOUT=1.0), "LORA_DROPOUT=1.0 is outside [0, 1)"),
        (dict(LORA_DROPOUT=-0.1), "LORA_DROPOUT=-0.1 is outside [0, 1)"),
        (dict(BETA=-1.0), "BETA=-1.0 is outside [0, 10]"),
        (dict(BETA=math.nan), "BETA=nan is outside [0, 10]"),
        (dict(TEMPERATURE=math.inf), "TEMPERATURE=inf is outside [0.01, inf)"),
        (dict(TEMPERATURE=math.nan), "TEMPERATURE=nan is outside [0.01, inf)"),
        (dict(LEARNING_RATE=math.nan), "LEARNING_RATE=nan is outside (0, 1]"),
        (dict(LEARNING_RATE=1e6), "LEARNING_RATE=1000000.0 is outside (0, 1]"),
        (dict(STEPS_PER_GENERATION=-1), "STEPS_PER_GENERATION=-1 is outside [0, inf]"),
        (dict(REWARD_WEIGHTS=[0.0, 0.0]), "REWARD_WEIGHTS=[0.0, 0.0]: every weight must be finite"),
        (dict(REWARD_WEIGHTS=[1.0, math.nan]), "REWARD_WEIGHTS=[1.0, nan]: every weight must be finite"),
        (dict(REWARD_FUNCS=[], REWARD_WEIGHTS=[]), "REWARD_FUNCS is empty"),
        (dict(SEED=-1), "SEED=-1 is outside [0, 4.29497e+09]"),
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
    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check({**smoke_ok, **changes}, cpu_only=True)


@pytest.mark.parametrize("gens", [3, 5, 6, 7, 9, 12])
@pytest.mark.parametrize("per_device, gas, spg", [(1, 1, 0), (4, 1, 0), (2, 3, 0), (3, 1, 2), (8, 2, 5)])
def test_the_batch_rule_suggests_only_fixes_that_pass(smoke_ok, gens, per_device, gas, spg):
    # once, NUM_GENERATIONS=3 drew the advice STEPS_PER_GENERATION=0, which preflight then refused
    s = {**smoke_ok, "NUM_GENERATIONS": gens, "PER_DEVICE_TRAIN_BATCH_SIZE": per_device}
    s |= {"GRADIENT_ACCUMULATION_STEPS": gas, "STEPS_PER_GENERATION": spg}
    try:
        preflight.check(s, cpu_only=True)
        return  # the rule holds already
    except ConfigError as err:
        fixes = re.findall(r"(?:Set |or )([A-Z_]+)=(\d+)", str(err))
    assert fixes
    for name, value in fixes:
        preflight.check({**s, name: int(value)}, cpu_only=True)  # every suggestion passes on its own


def test_a_model_folder_cut_short_is_refused_before_loading(tmp_path):
    from grpo import profiles

    model = Path(profiles.ensure_model_dir(tmp_path / "m"))
    preflight.check_model_folder(str(model))  # whole: fine
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ConfigError, match="model.safetensors is cut short"):
        preflight.check_model_folder(str(model))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    with pytest.raises(ConfigError, match="holds no tokenizer files"):
        preflight.check_model_folder(str(model))


def test_every_message_is_at_most_two_lines(smoke_ok):
    # many mistakes at once: each problem is one paragraph of at most two lines (constant=value, why, the fix)
    bad = dict(TEMPERATURE=-1.0, LOSS_TYPE="x", REWARD_WEIGHTS=[], LORA_ALPHA=0, BETA=-1.0, SEED=-1, MAX_SAMPLES=-2)
    with pytest.raises(ConfigError) as err:
        preflight.check({**smoke_ok, **bad, "ENABLE_THINKING": True, "USE_VLLM": True}, cpu_only=True)
    paragraphs = str(err.value).split("\n\n")
    assert len(paragraphs) == 9
    assert all(p.count("\n") <= 1 for p in paragraphs), paragraphs


def test_preflight_counts_processes(smoke_ok, monkeypatch):
    # torchrun sets WORLD_SIZE; 1 x 2 processes x 1 = 2 completions per round cannot hold a group of 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="1 x 2 x 1 = 2 completions"):
        preflight.check({**smoke_ok, "PER_DEVICE_TRAIN_BATCH_SIZE": 1}, cpu_only=True)


def test_real_run_needs_cuda(settings, gpu):
    gpu(count=0)
    with pytest.raises(ConfigError, match="(?s)no CUDA GPU is visible.*make smoke"):
        preflight.check(settings, cpu_only=False)


def test_bf16_needs_a_bf16_gpu(settings, gpu):
    gpu(count=1, bf16=False)  # e.g. a T4 or V100
    with pytest.raises(ConfigError, match="this one has no bf16.\nSet BF16=False"):
        preflight.check(settings, cpu_only=False)
    preflight.check({**settings, "BF16": False}, cpu_only=False)  # fp32 on that GPU is allowed


def test_several_gpus_need_one_process_each(settings, gpu, monkeypatch):
    gpu(count=4)
    # TRL refuses nn.DataParallel only after the weights load; preflight says so first, with the launch line
    with pytest.raises(ConfigError, match="(?s)4 GPUs are visible.*torchrun --nproc_per_node 4"):
        preflight.check(settings, cpu_only=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    preflight.check({**settings, "GRADIENT_ACCUMULATION_STEPS": 1}, cpu_only=False)  # one process per GPU is fine


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
    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check({**settings, **changes}, cpu_only=False)


def _literal(text):
    import re

    return re.escape(text)


# --- data ----------------------------------------------------------------------------------------------------------


def test_fixture_maps_to_prompt_and_gold():
    ds = gsm8k.load(FIXTURE, "train", system_prompt="Be exact.")
    assert len(ds) == 32 and set(ds.column_names) == {"prompt", "answer", "solution", "question"}
    first = ds[0]
    assert first["prompt"][0] == {"role": "system", "content": "Be exact."}
    assert first["prompt"][1] == {"role": "user", "content": first["question"]}
    assert first["answer"] == first["solution"] == "19"  # the number after "#### ", under both names
    golds = set(ds["answer"])
    assert "2575" in golds  # "#### 2575" in a row whose working writes 2,575
    assert "-6" in golds  # a negative answer keeps its sign
    assert len(gsm8k.load(FIXTURE, "train", limit=5)) == 5


def test_folder_dataset_reads_split_files(tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    assert gsm8k.load(str(tmp_path), "test")["answer"] == ["2"]
    with pytest.raises(ConfigError, match="train.jsonl, which does not exist"):
        gsm8k.load(str(tmp_path), "train")


def test_missing_dataset_file(tmp_path):
    with pytest.raises(ConfigError, match="points at .*nope.jsonl, which does not exist"):
        gsm8k.load(str(tmp_path / "nope.jsonl"))


def test_rows_without_answers_are_counted_and_shown(tmp_path):
    rows = [{"question": f"q{i}", "answer": f"so {i}\n#### {i}"} for i in range(5)]
    rows[1]["answer"] = "forgot the marker, 7"
    rows[3]["answer"] = "#### seven"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match=r"(?s)2 of 5 rows .* e.g. line 2: .*forgot.*; line 4: .*SKIP_BAD_ROWS=True"):
        gsm8k.load(str(bad))
    # the two bad rows are dropped, the rest kept in order
    assert gsm8k.load(str(bad), skip_bad_rows=True)["answer"] == ["0", "2", "4"]


def test_hub_dataset_errors_are_explained(monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setattr(gsm8k.hub, "hub_unreachable", lambda *args, **kwargs: None)  # the Hub answers; the load fails
    with pytest.raises(ConfigError, match="(?s)DATASET 'openai/gsm8k' could not be loaded.*local GSM8K-format"):
        gsm8k.load("openai/gsm8k")


def test_limit_counts_usable_rows(tmp_path):
    rows = [{"question": "q0", "answer": "no marker"}] + [{"question": f"q{i}", "answer": f"#### {i}"} for i in (1, 2)]
    path = tmp_path / "some_bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # MAX_SAMPLES=2 gives 2 rows, after dropping the bad one
    assert gsm8k.load(str(path), limit=2, skip_bad_rows=True)["answer"] == ["1", "2"]


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "holds no problems"),
        (b"\n\n  \n", "holds no problems"),
        (b'{"question": "1+1?", "answer": \n', "line 1: not JSON"),
        (b'{"problem": "1+1?", "solution": "2"}\n', "line 1: 'question' is missing, not text"),
        (b'{"question": null, "answer": "#### 2"}\n', "line 1: 'question' is a NoneType, not text"),
        (b'{"question": "1+1?", "answer": 2}\n', "line 1: 'answer' is a int, not text"),
        (b'{"question": "1+1?", "answer": "#### 2"}\n[1, 2]\n', "line 2: a list, not an object"),
        (b'{"question": "caf\xe9", "answer": "#### 2"}\n', "is not UTF-8 text (line 1"),
    ],
)
def test_bad_dataset_content_names_the_line(tmp_path, content, message):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=_literal(message)):
        gsm8k.load(str(path))


def test_a_bom_and_blank_lines_are_tolerated(tmp_path):
    path = tmp_path / "data.jsonl"
    row = json.dumps({"question": "1+1?", "answer": "#### 2"})
    path.write_bytes(("\ufeff" + row + "\n\n  \n" + row + "\n").encode("utf-8"))
    assert gsm8k.load(str(path))["answer"] == ["2", "2"]


# --- rewards wiring ------------------------------------------------------------------------------------------------


def load_rewards(names, max_completion_length):
    """REWARD_FUNCS entries loaded and guarded as grpotrainer.py does it."""
    import rewards

    return reward_guard.load(names, rewards.REWARDS, max_completion_length=max_completion_length)


def brevity_reward(completions, **kwargs):
    return [1.0 / (1 + len(str(c))) for c in completions]


def test_reward_funcs_by_name_and_import_path():

    funcs = load_rewards(["correctness_reward", "test_train:brevity_reward", "overlong_reward"], 10)
    assert funcs[0].__name__ == "correctness_reward"
    assert funcs[1].func is brevity_reward and funcs[1].__name__ == "brevity_reward"  # guarded, as TRL names it
    # parameterised rewards in the registry are functions, bound to the run's completion length
    assert funcs[2].__name__ == "overlong_reward"
    assert funcs[2]([[1] * 10], completion_ids=[[1] * 10]) == [-1.0]


def test_unimportable_reward():

    # a module that is not on the path is the user's to fix: the message says where it must live
    with pytest.raises(ConfigError, match="there is no module 'no_such_module' on the Python path") as err:
        load_rewards(["no_such_module:f"], 10)
    assert "repository root (beside grpotrainer.py) or in a folder on PYTHONPATH" in str(err.value)
    with pytest.raises(ConfigError, match="has no 'no_such_reward'"):
        load_rewards(["test_train:no_such_reward"], 10)


def test_trls_dotted_reward_path_is_accepted_beside_the_colon_form():

    (dotted,) = load_rewards(["test_train.brevity_reward"], 10)
    (colon,) = load_rewards(["test_train:brevity_reward"], 10)
    assert dotted.func is colon.func is brevity_reward


def wrong_length_reward(completions, **kwargs):
    return [1.0]


def text_reward(completions, **kwargs):
    return ["good" for _ in completions]


def raising_reward(completions, **kwargs):
    raise KeyError("difficulty")


def no_kwargs_reward(completions):
    return [0.0 for _ in completions]


@pytest.mark.parametrize(
    "name, message",
    [
        ("test_train:wrong_length_reward", "returned 1 values for 3 completions"),
        ("test_train:text_reward", "returned 'good' for completion 0: not a finite number"),
    ],
)
def test_every_reward_is_tried_on_real_rows_before_training(name, message):

    funcs = load_rewards(["correctness_reward", name], 32)
    dataset = gsm8k.load(FIXTURE, limit=4)
    with pytest.raises(ConfigError, match=_literal(f"REWARD_FUNCS entry {name!r} ") + ".*" + _literal(message)):
        preflight.check_rewards(funcs, ["correctness_reward", name], dataset, 32)


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


def later_reward(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 1:
        raise ZeroDivisionError("division by zero")
    return [0.0] * len(completions)


class NeedsArgReward:
    def __init__(self, scale):
        self.scale = scale


@pytest.mark.parametrize(
    "name, message",
    [
        ("test_train:two_rewards", "returned 2 values for 3 completions"),
        ("test_train:infinite_reward", "returned inf for completion 0: not a finite number"),
    ],
)
def test_more_reward_faults_are_found_before_training(name, message):

    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check_rewards(load_rewards([name], 32), [name], gsm8k.load(FIXTURE, limit=4), 32)


@pytest.mark.parametrize("name", ["test_train:numpy_reward", "test_train:async_reward"])
def test_rewards_that_trl_accepts_pass(name):

    preflight.check_rewards(load_rewards([name], 32), [name], gsm8k.load(FIXTURE, limit=4), 32)


def _raised_here(excinfo):
    """The file and function of the frame that raised: a bug's traceback must end in the reward itself."""
    frame = excinfo.traceback[-1]
    return Path(str(frame.path)).name, frame.name


def test_a_reward_without_kwargs_is_refused_when_loaded():

    # TRL calls it with prompts=, completion_ids=, trainer_state= and the columns: it could never run
    with pytest.raises(
        ConfigError, match=r"'test_train:no_kwargs_reward' is not a reward function: it takes \(completions\)"
    ):
        load_rewards(["test_train:no_kwargs_reward"], 32)


@pytest.mark.parametrize(
    "name, error, function",
    [
        ("test_train:raising_reward", KeyError, "raising_reward"),
        ("test_train:exits_reward", RuntimeError, "exits_reward"),  # sys.exit in a reward: a bug, shown as one
    ],
)
def test_a_reward_that_raises_in_preflight_keeps_its_traceback(name, error, function):

    funcs = load_rewards(["correctness_reward", name], 32)
    with pytest.raises(error) as excinfo:
        preflight.check_rewards(funcs, ["correctness_reward", name], gsm8k.load(FIXTURE, limit=4), 32)
    assert not isinstance(excinfo.value, ConfigError)  # a bug, not a setting: cli.run shows its traceback
    assert f"REWARD_FUNCS entry {name!r}" in "\n".join(excinfo.value.__notes__)
    if error is RuntimeError:  # raised from the SystemExit, whose traceback goes into the reward
        assert isinstance(excinfo.value.__cause__, SystemExit)
        frame = excinfo.value.__cause__.__traceback__
        while frame.tb_next:
            frame = frame.tb_next
        assert (Path(frame.tb_frame.f_code.co_filename).name, frame.tb_frame.f_code.co_name) == (
            "test_train.py",
            function,
        )
    elif function:
        assert _raised_here(excinfo) == ("test_train.py", function)


def test_a_reward_class_that_cannot_be_built_keeps_its_traceback():

    with pytest.raises(TypeError) as excinfo:
        load_rewards(["test_train:NeedsArgReward"], 32)
    assert "REWARD_FUNCS entry 'test_train:NeedsArgReward'" in excinfo.value.__notes__[0]


def test_a_reward_that_raises_during_training_keeps_its_traceback_and_names_its_entry():
    from transformers import TrainerState

    (func,) = load_rewards(["test_train:later_reward"], 32)
    assert func(["x"], trainer_state=TrainerState(global_step=0)) == [0.0]
    with pytest.raises(ZeroDivisionError) as excinfo:
        func(["x"], trainer_state=TrainerState(global_step=3))
    assert excinfo.value.__notes__ == [
        "raised by the reward REWARD_FUNCS entry 'test_train:later_reward' at training step 3"
    ]
    assert _raised_here(excinfo) == ("test_train.py", "later_reward")  # the user's own file and line


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
    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check_config(config, smoke_ok, 32)


def test_a_generation_round_larger_than_the_data_is_refused(smoke_ok):
    # once: 0 steps trained, an untrained adapter saved and the run marked finished, exit 0
    config = grpotrainer.build_config({**smoke_ok, "PER_DEVICE_TRAIN_BATCH_SIZE": 256}, {}, cpu_only=True)
    with pytest.raises(ConfigError, match="the training set has 32 problems, but each generation round takes 64"):
        preflight.check_config(config, smoke_ok, 32)


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
def test_the_models_config_decides_before_its_weights_load(smoke_ok, tmp_path, changes, message):
    from grpo import profiles

    model = profiles.ensure_model_dir(tmp_path / "m")
    preflight.check_model({**smoke_ok, "MODEL_NAME": model})  # the defaults fit
    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check_model({**smoke_ok, "MODEL_NAME": model, **changes})


def test_weights_that_do_not_fit_the_config_are_refused(smoke_ok, tmp_path):
    from grpo import profiles

    model = Path(profiles.ensure_model_dir(tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "intermediate_size": 128}))
    with pytest.raises(ConfigError, match=r"mlp.down_proj.weight is \[32, 64\] in model.safetensors, \[32, 128\]"):
        preflight.check_model({**smoke_ok, "MODEL_NAME": str(model)})


def test_the_registry_passes_the_reward_check():
    import rewards

    names = list(rewards.REWARDS)
    preflight.check_rewards(load_rewards(names, 32), names, gsm8k.load(FIXTURE, limit=4), 32)


# --- the command line, end to end: a clean message, exit 2, no traceback --------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--smoke", "--NUM_GENERATIONS=3"], "not a multiple of NUM_GENERATIONS=3"),
        (["--smoke", "--REWARD_FUNCS=nope_reward", "--REWARD_WEIGHTS=1"], "unknown reward 'nope_reward'"),
        (["--smoke", "--DATASET=/nonexistent/gsm8k.jsonl"], "DATASET=/nonexistent/gsm8k.jsonl points at"),
        (["--smoke", "--TEMPERATUR=1"], "Did you mean TEMPERATURE"),
        # refused, not uploaded: Trainer would push checkpoints and TRL's card; export.py pushes the right files
        (["--smoke", "--push_to_hub=true"], "--push_to_hub=true is refused"),
        (["--smoke", "--push_to_hub=true"], "python export.py --ADAPTER="),
        pytest.param(
            [], "no CUDA GPU is visible", marks=pytest.mark.skipif(HAS_CUDA, reason="would start a real run")
        ),
    ],
)
def test_cli_errors_exit_2_without_traceback(args, message, tmp_path, capsys, monkeypatch):
    # preflight's mistakes, through cli.run as `python grpotrainer.py` runs it, in this process
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, stderr = run_in_process(grpotrainer.main, *args, f"--OUTPUT_DIR={tmp_path}", capsys=capsys)
    assert code == 2
    assert message in stderr and "Traceback" not in stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


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
    out = run_script("grpotrainer.py", *args, f"--OUTPUT_DIR={tmp_path}")
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    # nothing written, except for errors that only loading can find: then the smoke model folder is all there is
    assert [p.name for p in tmp_path.iterdir()] in ([], ["smoke-model"])


def test_missing_test_split_fails_before_training(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((REPO / "data" / "smoke_gsm8k.jsonl").read_text())
    out_dir = tmp_path / "out"
    out = run_script("grpotrainer.py", "--smoke", f"--DATASET={data}", "--EVAL_AFTER=2", f"--OUTPUT_DIR={out_dir}")
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


# --- vLLM's context, LoRA dropout --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smoke_model(tmp_path_factory):
    from grpo import profiles

    return profiles.cpu_model(tmp_path_factory.mktemp("vllm"))


def test_vllm_context_is_bounded_by_the_data_unless_given(smoke_ok, smoke_model):
    data = gsm8k.load(FIXTURE, "train")
    longest = gsm8k.longest_prompt(data, smoke_model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smoke_model)
    rendered = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, enable_thinking=False) for p in data["prompt"]
    ]
    # the longest prompt of the data rendered as TRL renders it (ENABLE_THINKING=False: the empty think block too)
    assert longest == max(len(r["input_ids"]) for r in rendered)
    s = {**smoke_ok, "USE_VLLM": True, "MODEL_NAME": smoke_model}
    config = grpotrainer.build_config(s, {}, cpu_only=True, train_dataset=data)
    # prompt + MAX_COMPLETION_LENGTH (32 in --smoke) + the margin: the rule evaluation's vllm_generator uses
    assert config.vllm_max_model_length == longest + 32 + gsm8k.CONTEXT_MARGIN
    assert config.vllm_max_model_length == gsm8k.context_length(longest, 32)
    config = grpotrainer.build_config(s, {"vllm_max_model_length": 4096}, cpu_only=True, train_dataset=data)
    assert config.vllm_max_model_length == 4096  # the user's --vllm_max_model_length wins
    config = grpotrainer.build_config(smoke_ok, {}, cpu_only=True)
    assert config.vllm_max_model_length is None  # without vLLM nothing is set


def test_lora_dropout_with_vllm_importance_sampling_warns(smoke_ok, smoke_model, caplog):
    s = {**smoke_ok, "USE_VLLM": True, "LORA_DROPOUT": 0.05, "MODEL_NAME": smoke_model}
    data = gsm8k.load(FIXTURE, "train")
    config = grpotrainer.build_config(s, {}, cpu_only=True, train_dataset=data)
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        preflight.check_config(config, s, 32)
    assert "LORA_DROPOUT=0.05 with vLLM's importance-sampling correction" in caplog.text  # a warning, not a refusal
    caplog.clear()
    config = grpotrainer.build_config({**s, "LORA_DROPOUT": 0.0}, {}, cpu_only=True, train_dataset=data)
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        preflight.check_config(config, {**s, "LORA_DROPOUT": 0.0}, 32)
    assert "LORA_DROPOUT" not in caplog.text  # the default, 0, is quiet


def string_length_reward(completions, **kwargs):
    # written for plain strings: on TRL's chat lists len() counts messages, so every completion scores 1.0
    return [min(1.0, len(c) / 1.0) for c in completions]


def test_a_reward_blind_to_the_answer_is_warned_about_by_name(caplog):
    import rewards

    names = ["correctness_reward", "format_reward", "reasoning_reward", "overlong_reward"]
    names += ["test_train:string_length_reward"]
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        funcs = load_rewards(names, 32)
        preflight.check_rewards(funcs, names, gsm8k.load(FIXTURE, limit=4), 32, answer_blind=rewards.ANSWER_BLIND)
    warned = [r.getMessage() for r in caplog.records]
    # one warning, not a refusal: the string reward scores 1.0 right or wrong; correctness_reward tells them apart,
    # and the registry's format, reasoning and length rewards are answer-blind by design (rewards.ANSWER_BLIND)
    assert [w.split(" scores")[0] for w in warned] == ["REWARD_FUNCS entry 'test_train:string_length_reward'"]
    assert "a right and a wrong answer to the same problems alike ([1.0, 1.0, 1.0])" in warned[0]


# --- --config recipe.yaml ---------------------------------------------------------------------------------------


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
        ("MAX_STEP: 2\n", "--config {path}: unknown setting --MAX_STEP. Did you mean MAX_STEPS"),
        ("top_pp: 0.9\n", "--config {path}: unknown setting --top_pp: not a constant nor a GRPOConfig field. Did you"),
        ("MAX_STEPS: many\n", "--config {path}: --MAX_STEPS=many is not a valid int"),
        ("- MAX_STEPS\n", "--config {path}: a recipe is a mapping of KEY: value lines"),
        ("MAX_STEPS: [\n", "--config {path} is not valid YAML"),
    ],
)
def test_a_bad_recipe_names_the_file_and_the_key(tmp_path, text, message):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=_literal(message.format(path=recipe))):
        parse(["--config", str(recipe)])


def test_the_shipped_recipe_parses():
    args = parse(["--config", str(REPO / "configs" / "gsm8k-qwen3-8b.yaml")])
    assert args.settings["NUM_GENERATIONS"] == 8 and args.settings["WARMUP_STEPS"] == 0.1 and args.fields == {}
