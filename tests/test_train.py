"""grpotrainer.py: config building, overrides, preflight errors and dataset mapping (fast, in-process).

.venv/bin/python -m pytest tests/test_train.py -q
"""

import json

import pytest
from conftest import REPO, run_script

import cli
import preflight
from cli import ConfigError

FIXTURE = str(REPO / "data" / "smoke_gsm8k.jsonl")
HAS_CUDA = preflight.cuda_available()


def test_import_is_light():
    # importing the script must not pull in torch/transformers/trl (no model, no download, no training)
    out = run_script("-c", "import sys, grpotrainer; print(sorted({'torch','transformers','trl'} & set(sys.modules)))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_config_maps_constants_to_grpo_config(gt, monkeypatch):
    monkeypatch.setattr(preflight, "cuda_available", lambda: False)  # the same answer on a GPU machine
    gt.BF16 = False  # a CPU machine cannot build a bf16 config; everything else keeps the defaults
    config = gt.build_config()
    # the tutorial's names translated to TRL 1.16: kl_coef -> beta, max_new_tokens -> max_completion_length
    assert config.beta == 0.05
    assert config.max_completion_length == 256
    assert config.num_generations == 4
    assert config.temperature == 0.7
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (1, 8)
    assert config.num_train_epochs == 3 and config.max_steps == -1
    assert config.activation_checkpointing is True  # the non-deprecated name of gradient_checkpointing
    assert config.learning_rate == 1e-5
    assert config.reward_weights == [1.0, 0.2]
    assert config.report_to == ["tensorboard"]
    assert config.logging_steps == 1
    assert config.chat_template_kwargs == {"enable_thinking": False}
    assert config.trust_remote_code is False
    # STEPS_PER_GENERATION=0 means "one generation round per optimiser step": 1 x 1 process x 8 micro-batches
    assert (config.steps_per_generation, config.generation_batch_size) == (8, 8)
    assert config.model_init_kwargs == {"dtype": "float32", "attn_implementation": "sdpa"}


def test_checkpointing_flag_follows_the_installed_transformers(gt):
    import dataclasses

    @dataclasses.dataclass
    class OldConfig:  # transformers 5.17 (the vLLM environment) has no activation_checkpointing field
        gradient_checkpointing: bool = False

    gt.ACTIVATION_CHECKPOINTING = False
    assert gt.checkpointing_kwarg(OldConfig) == {"gradient_checkpointing": False}
    from trl import GRPOConfig

    assert gt.checkpointing_kwarg(GRPOConfig) == {"activation_checkpointing": False}


def test_smoke_config_is_fp32_on_cpu(gt):
    gt.__dict__.update(gt.SMOKE)
    config = gt.build_config(smoke=True)
    assert config.use_cpu and not config.bf16
    assert config.model_init_kwargs["attn_implementation"] == "sdpa"  # flash-attn is never picked on CPU


def test_flash_attention_only_in_bf16_on_cuda(gt, monkeypatch):
    monkeypatch.setattr(preflight, "cuda_available", lambda: True)
    monkeypatch.setattr(preflight, "importable", lambda package: True)  # as if flash-attn were installed
    assert gt.model_init_kwargs()["attn_implementation"] == "flash_attention_2"
    gt.BF16 = False  # flash-attn kernels run only in 16-bit: fp32 (e.g. on a V100) must fall back to sdpa
    assert gt.model_init_kwargs() == {"dtype": "float32", "attn_implementation": "sdpa"}
    assert gt.model_init_kwargs(smoke=True)["attn_implementation"] == "sdpa"


def test_lora_config(gt):
    peft = gt.build_peft_config()
    assert (peft.r, peft.lora_alpha, peft.lora_dropout) == (16, 32, 0.05)
    assert peft.target_modules == "all-linear"
    gt.LORA_TARGET_MODULES = "q_proj,v_proj"
    assert set(gt.build_peft_config().target_modules) == {"q_proj", "v_proj"}
    assert gt.build_quantization_config() is None  # LOAD_IN_4BIT is off by default


# --- overrides ---------------------------------------------------------------------------------------------------


def test_overrides_are_typed_by_the_default(gt):
    done = cli.apply_overrides(
        gt,
        [
            "--NUM_GENERATIONS=8",
            "--LEARNING_RATE=2e-5",
            "--BETA=0",  # an int literal for a float constant stays a float
            "--LOAD_IN_4BIT=true",
            "--RESUME=no",
            "--OUTPUT_DIR=runs/x",
            "--REWARD_FUNCS=correctness_reward, math_reward",
            "--REWARD_WEIGHTS=1,0.5",
        ],
    )
    assert done["NUM_GENERATIONS"] == 8 and gt.NUM_GENERATIONS == 8
    assert gt.LEARNING_RATE == 2e-5
    assert gt.BETA == 0.0 and isinstance(gt.BETA, float)
    assert gt.LOAD_IN_4BIT is True and gt.RESUME is False
    assert gt.OUTPUT_DIR == "runs/x"
    assert gt.REWARD_FUNCS == ["correctness_reward", "math_reward"]
    assert gt.REWARD_WEIGHTS == [1.0, 0.5]


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--NUM_GENERATION=8", "Did you mean NUM_GENERATIONS"),
        ("--learning_rate=1e-5", "Did you mean LEARNING_RATE"),
        ("--NUM_GENERATIONS=four", "--NUM_GENERATIONS=four is not a valid int; its default is 4"),
        ("--BF16=maybe", "not a valid bool"),
        ("--REWARD_WEIGHTS=1,x", "not a valid list"),
        ("NUM_GENERATIONS=8", "overrides are written --KEY=value"),
        ("--MAX_STEPS", "overrides are written --KEY=value"),
    ],
)
def test_bad_overrides_are_clear(gt, arg, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        cli.apply_overrides(gt, [arg])


# --- preflight ---------------------------------------------------------------------------------------------------


@pytest.fixture
def smoke_gt(gt):
    """grpotrainer with the --smoke settings, which pass preflight on this CPU machine."""
    gt.__dict__.update(gt.SMOKE)
    preflight.check(gt, smoke=True)  # the baseline is clean, so each test below isolates one mistake
    return gt


@pytest.mark.parametrize(
    "settings, message",
    [
        # 1 x 1 x 3 = 3 completions per round cannot hold whole groups of 4
        (dict(PER_DEVICE_TRAIN_BATCH_SIZE=1, GRADIENT_ACCUMULATION_STEPS=3), "1 x 1 x 3 = 3 completions"),
        (dict(PER_DEVICE_TRAIN_BATCH_SIZE=1, GRADIENT_ACCUMULATION_STEPS=3), "GRADIENT_ACCUMULATION_STEPS=4"),
        (dict(PER_DEVICE_TRAIN_BATCH_SIZE=2, STEPS_PER_GENERATION=1, NUM_GENERATIONS=8), "STEPS_PER_GENERATION=4"),
        (dict(NUM_GENERATIONS=1), "needs at least 2"),
        (dict(REWARD_FUNCS=["correctnes_reward", "format_reward"]), "Did you mean correctness_reward"),
        (dict(REWARD_WEIGHTS=[1.0]), "REWARD_WEIGHTS has 1 weights for 2 REWARD_FUNCS"),
        (dict(LOSS_TYPE="ppo"), "LOSS_TYPE 'ppo' is not one of grpo, dr_grpo, dapo"),
        (dict(TEMPERATURE=0.0), "TEMPERATURE is 0.0"),
        (dict(SCALE_REWARDS="std"), "SCALE_REWARDS 'std'"),
        (dict(BF16=True), "--smoke runs on the CPU in fp32"),
        (dict(LOAD_IN_4BIT=True), "LOAD_IN_4BIT (QLoRA) needs a CUDA GPU"),
        (dict(USE_LIGER_KERNEL=True), "USE_LIGER_KERNEL needs a CUDA GPU"),
        (dict(USE_VLLM=True), "USE_VLLM needs a CUDA GPU"),
        (dict(USE_VLLM=True, LOAD_IN_4BIT=True), "merging into 4-bit weights is lossy"),
        (dict(LORA_R=0), "LORA_R is 0; it must be at least 1"),
        (dict(LOGGING_STEPS=0), "LOGGING_STEPS is 0; it must be at least 1"),
        (dict(SAVE_STEPS=0), "SAVE_STEPS is 0; it must be at least 1"),
        (dict(MAX_COMPLETION_LENGTH=0), "MAX_COMPLETION_LENGTH is 0; it must be at least 1"),
        (dict(MAX_STEPS=0), "MAX_STEPS=0 with NUM_TRAIN_EPOCHS=3 trains nothing"),
        (dict(MAX_STEPS=-1, NUM_TRAIN_EPOCHS=0), "MAX_STEPS=-1 with NUM_TRAIN_EPOCHS=0 trains nothing"),
        (dict(LEARNING_RATE=0.0), "LEARNING_RATE is 0.0"),
        (dict(EVAL_BEFORE=-1), "EVAL_BEFORE and EVAL_AFTER are numbers of test problems"),
        (dict(ATTN_IMPLEMENTATION="flash"), "ATTN_IMPLEMENTATION 'flash' must be one of auto"),
        (dict(ATTN_IMPLEMENTATION="flash_attention_2"), "flash_attention_2 needs a CUDA GPU, BF16=True"),
        (dict(MODEL_NAME="/nonexistent/Qwen3-8B"), "MODEL_NAME points at the folder /nonexistent/Qwen3-8B"),
    ],
)
def test_preflight_errors(smoke_gt, settings, message):
    smoke_gt.__dict__.update(settings)
    with pytest.raises(ConfigError, match=_literal(message)):
        preflight.check(smoke_gt, smoke=True)


def test_preflight_counts_processes(smoke_gt, monkeypatch):
    # torchrun sets WORLD_SIZE; 1 x 2 processes x 1 = 2 completions per round cannot hold a group of 4
    monkeypatch.setenv("WORLD_SIZE", "2")
    smoke_gt.PER_DEVICE_TRAIN_BATCH_SIZE, smoke_gt.GRADIENT_ACCUMULATION_STEPS = 1, 1
    with pytest.raises(ConfigError, match="1 x 2 x 1 = 2 completions"):
        preflight.check(smoke_gt, smoke=True)


def test_real_run_needs_cuda(gt, monkeypatch):
    monkeypatch.setattr(preflight, "cuda_available", lambda: False)
    with pytest.raises(ConfigError, match="no CUDA GPU is visible.*python grpotrainer.py --smoke"):
        preflight.check(gt, smoke=False)


def test_bf16_needs_a_bf16_gpu(gt, monkeypatch):
    monkeypatch.setattr(preflight, "cuda_available", lambda: True)
    monkeypatch.setattr(preflight, "bf16_gpu", lambda: False)  # e.g. a T4 or V100
    monkeypatch.setattr(preflight, "gpu_count", lambda: 1)
    with pytest.raises(ConfigError, match="this one has no bf16 support. Set BF16=False"):
        preflight.check(gt, smoke=False)
    gt.BF16 = False
    preflight.check(gt, smoke=False)  # fp32 on that GPU is allowed


def test_several_gpus_need_one_process_each(gt, monkeypatch):
    monkeypatch.setattr(preflight, "cuda_available", lambda: True)
    monkeypatch.setattr(preflight, "bf16_gpu", lambda: True)
    monkeypatch.setattr(preflight, "gpu_count", lambda: 4)
    # TRL refuses nn.DataParallel only after the weights load; preflight says so first, with the launch line
    with pytest.raises(ConfigError, match="4 GPUs are visible.*torchrun --nproc_per_node 4"):
        preflight.check(gt, smoke=False)
    monkeypatch.setenv("WORLD_SIZE", "4")
    preflight.check(gt, smoke=False)  # one process per GPU is fine


def test_missing_packages_are_explained(gt, monkeypatch):
    monkeypatch.setattr(preflight, "cuda_available", lambda: True)
    monkeypatch.setattr(preflight, "bf16_gpu", lambda: True)
    monkeypatch.setattr(preflight, "gpu_count", lambda: 1)
    monkeypatch.setattr(preflight, "importable", lambda package: False)
    gt.USE_VLLM = True
    with pytest.raises(ConfigError, match="needs the vllm package.*requirements-vllm.txt"):
        preflight.check(gt, smoke=False)


def test_all_problems_reported_at_once(smoke_gt):
    smoke_gt.__dict__.update(TEMPERATURE=-1.0, LOSS_TYPE="x", REWARD_WEIGHTS=[])
    with pytest.raises(ConfigError) as err:
        preflight.check(smoke_gt, smoke=True)
    assert str(err.value).count("\n\n") == 2  # three paragraphs, one per problem


def _literal(text):
    import re

    return re.escape(text)


# --- resuming --------------------------------------------------------------------------------------------------


def _checkpoint(output_dir, step, base="Qwen/Qwen3-8B", complete=True):
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
    if complete:  # transformers writes trainer_state.json last: without it the save was cut off
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return str(folder)


def test_resume_picks_the_newest_complete_checkpoint(gt, tmp_path):
    gt.OUTPUT_DIR = str(tmp_path)
    assert preflight.resume_checkpoint(gt) is None  # nothing to resume
    _checkpoint(tmp_path, 9)
    ten = _checkpoint(tmp_path, 10)  # numeric order: 10 is newer than 9 although "10" < "9" as text
    _checkpoint(tmp_path, 11, complete=False)  # a save cut off by a kill is skipped
    assert preflight.resume_checkpoint(gt) == ten


def test_resume_accepts_a_local_copy_of_the_hub_model(gt, tmp_path):
    gt.OUTPUT_DIR, gt.MODEL_NAME = str(tmp_path), "/models/Qwen3-8B"
    last = _checkpoint(tmp_path, 2, base="Qwen/Qwen3-8B")
    assert preflight.resume_checkpoint(gt) == last


def test_resume_refuses_another_base_model(gt, tmp_path):
    gt.OUTPUT_DIR, gt.MODEL_NAME = str(tmp_path), "Qwen/Qwen3-1.7B"
    _checkpoint(tmp_path, 2, base="Qwen/Qwen3-8B")
    with pytest.raises(ConfigError, match="adapter for Qwen/Qwen3-8B, but MODEL_NAME is Qwen/Qwen3-1.7B"):
        preflight.resume_checkpoint(gt)


def test_starting_over_never_overwrites_checkpoints(gt, tmp_path):
    gt.OUTPUT_DIR, gt.RESUME = str(tmp_path), False
    _checkpoint(tmp_path, 2)
    with pytest.raises(ConfigError, match="already holds 1 checkpoint.*new OUTPUT_DIR"):
        preflight.resume_checkpoint(gt)
    gt.OUTPUT_DIR = str(tmp_path / "fresh")
    assert preflight.resume_checkpoint(gt) is None  # RESUME=False in an empty folder is a plain start


# --- data ----------------------------------------------------------------------------------------------------------


def test_fixture_maps_to_prompt_and_gold(gt):
    gt.DATASET = FIXTURE
    ds = gt.load_gsm8k("train")
    assert len(ds) == 32 and set(ds.column_names) == {"prompt", "answer", "question"}
    first = ds[0]
    assert first["prompt"][0] == {"role": "system", "content": gt.SYSTEM_PROMPT}
    assert first["prompt"][1] == {"role": "user", "content": first["question"]}
    assert first["answer"] == "19"  # the number after "#### ", as a string
    golds = set(ds["answer"])
    assert "2575" in golds  # "#### 2575" in a row whose working writes 2,575
    assert "-6" in golds  # a negative answer keeps its sign
    assert len(gt.load_gsm8k("train", limit=5)) == 5


def test_folder_dataset_reads_split_files(gt, tmp_path):
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    gt.DATASET = str(tmp_path)
    assert gt.load_gsm8k("test")["answer"] == ["2"]
    with pytest.raises(ConfigError, match="train.jsonl, which does not exist"):
        gt.load_gsm8k("train")


def test_missing_dataset_file(gt, tmp_path):
    gt.DATASET = str(tmp_path / "nope.jsonl")
    with pytest.raises(ConfigError, match="DATASET points at .*nope.jsonl, which does not exist"):
        gt.load_gsm8k()


def test_rows_without_answers_are_counted_and_shown(gt, tmp_path):
    rows = [{"question": f"q{i}", "answer": f"so {i}\n#### {i}"} for i in range(5)]
    rows[1]["answer"] = "forgot the marker, 7"
    rows[3]["answer"] = "#### seven"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gt.DATASET = str(bad)
    with pytest.raises(ConfigError, match=r"2 of 5 rows .* e.g. row 2: .*forgot.*; row 4: .*SKIP_BAD_ROWS=True"):
        gt.load_gsm8k()
    gt.SKIP_BAD_ROWS = True
    assert gt.load_gsm8k()["answer"] == ["0", "2", "4"]  # the two bad rows are dropped, the rest kept in order


def test_hub_dataset_errors_are_explained(gt, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ConfigError, match="DATASET 'openai/gsm8k' could not be loaded.*local GSM8K-format"):
        gt.load_gsm8k()


def test_limit_counts_usable_rows(gt, tmp_path):
    rows = [{"question": "q0", "answer": "no marker"}] + [{"question": f"q{i}", "answer": f"#### {i}"} for i in (1, 2)]
    path = tmp_path / "some_bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    gt.DATASET, gt.SKIP_BAD_ROWS = str(path), True
    assert gt.load_gsm8k(limit=2)["answer"] == ["1", "2"]  # MAX_SAMPLES=2 gives 2 rows, after dropping the bad one


def test_wrong_columns_and_bad_json(gt, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"problem": "1+1?", "solution": "2"}) + "\n")
    gt.DATASET = str(other)
    with pytest.raises(ConfigError, match=r"lacks the column\(s\) \['answer', 'question'\]"):
        gt.load_gsm8k()
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "1+1?", "answer": \n')
    gt.DATASET = str(broken)
    with pytest.raises(ConfigError, match="is not valid JSON lines"):
        gt.load_gsm8k()


# --- rewards wiring ------------------------------------------------------------------------------------------------


def brevity_reward(completions, **kwargs):
    return [1.0 / (1 + len(str(c))) for c in completions]


def test_reward_funcs_by_name_import_path_and_callable(gt):
    import rewards

    gt.REWARD_FUNCS = ["correctness_reward", "test_train:brevity_reward", brevity_reward, "overlong_reward"]
    funcs = gt.build_reward_funcs()
    assert funcs[0] is rewards.REWARDS["correctness_reward"]
    assert funcs[1].__name__ == "brevity_reward" and funcs[2] is brevity_reward
    # parameterised rewards in the registry are classes, built with the run's completion length
    assert funcs[3].__name__ == "overlong_reward"
    assert funcs[3]([[1] * 10], completion_ids=[[1] * 10]) == [0.0]


def test_unimportable_reward(gt):
    gt.REWARD_FUNCS = ["no_such_module:f"]
    with pytest.raises(ConfigError, match="'no_such_module:f' could not be imported"):
        gt.build_reward_funcs()


# --- the command line, end to end: a clean message, exit 2, no traceback --------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--smoke", "--NUM_GENERATIONS=3"], "must be a multiple of NUM_GENERATIONS (3)"),
        (["--smoke", "--REWARD_FUNCS=nope_reward", "--REWARD_WEIGHTS=1"], "unknown reward 'nope_reward'"),
        (["--smoke", "--DATASET=/nonexistent/gsm8k.jsonl"], "DATASET points at /nonexistent/gsm8k.jsonl"),
        (["--smoke", "--TEMPERATUR=1"], "Did you mean TEMPERATURE"),
        (["--smoke", "--MODEL_NAME=nobody/no-such-model"], "MODEL_NAME 'nobody/no-such-model' could not be loaded"),
        (["--smoke", "--LORA_TARGET_MODULES=no_such_proj"], "LORA_TARGET_MODULES='no_such_proj' matches no layer"),
        pytest.param(
            [], "no CUDA GPU is visible", marks=pytest.mark.skipif(HAS_CUDA, reason="would start a real run")
        ),
    ],
)
def test_cli_errors_exit_2_without_traceback(args, message, tmp_path):
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
