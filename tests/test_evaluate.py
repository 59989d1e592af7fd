"""evaluate.py: grading on cases whose answer is known by construction, a stub generator, the result files and
TensorBoard scalars, clean errors, and `python evaluate.py --smoke` end to end.

    python -m pytest tests/test_evaluate.py -q -m "not slow"   # ~20 s on 2 cores
    python -m pytest tests/test_evaluate.py -q -m slow         # saved adapter vs in training, torchrun: ~50 s

The gsm8k-marked test reads ../shared/data/gsm8k/test.jsonl beside the checkout and skips when it is not there.
"""

import json
import re

import pytest
from conftest import GSM8K_DIR, REPO, read_scalars, run_script

import evaluate
from grpo import checkpoints, cli, files, grading, gsm8k, preflight
from grpo.errors import ConfigError

# Four completions whose grades are known by construction, gold "18" throughout unless noted:
CASES = [
    ("9 * 2 = 18\n#### 18", "18", {"extracted": "18", "correct": True, "strict_correct": True, "formatted": True}),
    (
        "So she pays \\boxed{18}.",
        "18",
        {"extracted": "18", "correct": True, "strict_correct": False, "formatted": False},
    ),
    ("#### 17", "18", {"extracted": "17", "correct": False, "strict_correct": False, "formatted": True}),
    ("I am not sure.", "18", {"extracted": None, "correct": False, "strict_correct": False, "formatted": False}),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), CASES)
def test_grade(completion, gold, expected):
    assert grading.grade(completion, gold) == expected


def test_grade_reads_chat_completions_like_plain_text():
    # TRL hands conversational completions as message lists; the grade must not depend on the wrapping.
    chat = [{"role": "assistant", "content": "9 * 2 = 18\n#### 18"}]
    assert grading.grade(chat, "18") == CASES[0][2]


def test_score_counts_the_known_cases():
    golds, completions = [g for _, g, _ in CASES], [c for c, _, _ in CASES]
    metrics = gsm8k.score(golds, completions, completion_tokens=[10, 20, 30, 40], truncated=[False] * 3 + [True])
    # strict: case 1 only; lenient: 1 and 2 (\boxed); format: 1 and 3 have '#### N'; tokens: the mean of 10..40;
    # one of four was cut off at the token limit.
    assert metrics == {
        "n": 4,
        "strict_accuracy": 0.25,
        "lenient_accuracy": 0.5,
        "format_rate": 0.5,
        "mean_completion_tokens": 25.0,
        "truncated_rate": 0.25,
    }
    assert tuple(metrics) == gsm8k.KEYS  # the JSON file's keys, in this order


def test_score_compares_by_value_not_by_text():
    # "1,080", "1080.00" and "$1080" are all 1080 (grading.answers_match compares Decimals): three right of three.
    metrics = gsm8k.score(["1080"] * 3, ["#### 1,080", "#### 1080.00", "The answer is $1080."])
    assert (metrics["strict_accuracy"], metrics["lenient_accuracy"]) == (0.6667, 1.0)


def test_score_of_nothing_is_zero_not_an_error():
    assert gsm8k.score([], []) == dict.fromkeys(gsm8k.KEYS, 0) | {"n": 0}


@pytest.mark.gsm8k
def test_gsm8k_test_solutions_score_full_marks_and_boxed_ones_only_lenient():
    # The trap: a model writing \boxed{} scores 0 on a '####'-only extractor. The gold solutions themselves
    # must score 100% both ways; the same solutions ending in \boxed{N} instead are 100% lenient, 0% strict.
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"GSM8K is not at {GSM8K_DIR}")

    rows = [json.loads(line) for line in (GSM8K_DIR / "test.jsonl").read_text().splitlines()]
    golds = [grading.extract_hash_answer(r["answer"]) for r in rows]
    boxed = [
        r["answer"].rsplit("####", 1)[0] + f"So the answer is \\boxed{{{g}}}."
        for r, g in zip(rows, golds, strict=True)
    ]

    def shares(m):
        return m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"]

    assert shares(gsm8k.score(golds, [r["answer"] for r in rows])) == (1319, 1.0, 1.0, 1.0)
    assert shares(gsm8k.score(golds, boxed)) == (1319, 0.0, 1.0, 0.0)


def problems(n):
    """A dataset like gsm8k.load's: question i has gold answer str(i)."""
    import datasets

    questions = [f"What is {i} plus zero?" for i in range(n)]
    return datasets.Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": q}] for q in questions],
            "answer": [str(i) for i in range(n)],
            "question": questions,
        }
    )


class StubGenerator:
    """Fixed outputs: right in '####' format for even i, right but boxed for i % 3 == 1, wrong otherwise."""

    def __init__(self):
        self.batches = []

    def __call__(self, prompts):
        self.batches.append(len(prompts))
        out = []
        for prompt in prompts:
            i = int(prompt[-1]["content"].split()[2])
            text = f"#### {i}" if i % 2 == 0 else f"\\boxed{{{i}}}" if i % 3 == 1 else "#### -1"
            out.append((text, i + 1, i == 6))  # the last one was cut off at the token limit
        return out


def test_evaluate_with_a_stub_generator():
    stub = StubGenerator()
    metrics, predictions = gsm8k.evaluate(problems(7), stub, batch_size=3)
    assert stub.batches == [3, 3, 1]  # 7 problems in batches of at most 3
    # i = 0..6. Strict (the even i): 0, 2, 4, 6 -> 4/7. Lenient adds the boxed i = 1 -> 5/7.
    # Format ('####'): the 4 even ones plus the wrong "#### -1" for i = 3 and 5 -> 6/7. Tokens: mean of 1..7 = 4.
    assert {k: metrics[k] for k in gsm8k.KEYS} == {
        "n": 7,
        "strict_accuracy": 0.5714,
        "lenient_accuracy": 0.7143,
        "format_rate": 0.8571,
        "mean_completion_tokens": 4.0,
        "truncated_rate": 0.1429,
    }
    assert predictions[3] == {
        "question": "What is 3 plus zero?",
        "gold": "3",
        "completion": "#### -1",
        "completion_tokens": 4,
        "truncated": False,
        "extracted": "-1",
        "correct": False,
        "strict_correct": False,
        "formatted": True,
    }
    assert [p["gold"] for p in predictions] == [str(i) for i in range(7)]  # in dataset order


def test_a_generator_that_drops_completions_is_an_error():
    with pytest.raises(RuntimeError, match="returned 1 completions for 2"):
        gsm8k.generate_all(problems(2), lambda prompts: [("#### 0", 1, False)], batch_size=2)


def test_report_writes_the_files_and_the_tensorboard_scalars(tmp_path, capsys):
    metrics = gsm8k.score(["18"] * 4, [c for c, _, _ in CASES], [1, 2, 3, 4])
    predictions = [{"question": "q", "gold": "18", "completion": c} for c, _, _ in CASES]
    settings = {"SYSTEM_PROMPT": "Be exact.", "MAX_COMPLETION_LENGTH": 24}
    gsm8k.report(metrics, predictions, tmp_path, "eval_test", tmp_path / "runs" / "x", 7, settings=settings)

    assert json.loads((tmp_path / "eval_test.json").read_text()) == {**metrics, "step": 7, "settings": settings}
    lines = (tmp_path / "eval_test_predictions.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == predictions
    # 0.25 and 0.5 are exact in float32, the scalars' storage type.
    assert read_scalars(tmp_path / "runs" / "x") == {
        "eval/gsm8k_strict_accuracy": [(7, 0.25)],
        "eval/gsm8k_lenient_accuracy": [(7, 0.5)],
        "eval/gsm8k_format_rate": [(7, 0.5)],
    }
    assert "strict_accuracy" in capsys.readouterr().out  # the table is printed


def smoke_settings(tmp_path, **overrides):
    """evaluate.py's --smoke settings with a writable OUTPUT_DIR and a Hub id (passed through) as MODEL_NAME."""
    return {
        **cli.constants(evaluate),
        **evaluate.profile_settings["smoke"],
        "OUTPUT_DIR": str(tmp_path / "out"),
        **overrides,
    }


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("ADAPTER", "no/such/adapter", "ADAPTER=no/such/adapter holds no LoRA adapter"),
        ("LIMIT", -1, "LIMIT=-1 must be at least 0"),
        ("BATCH_SIZE", 0, "BATCH_SIZE=0 must be at least 1"),
        ("SPLIT", "validation", "SPLIT='validation' must be test or train"),
        # these failed only once the model loaded (ValueError), or were accepted
        ("ATTN_IMPLEMENTATION", "fastest", "ATTN_IMPLEMENTATION='fastest' is not one of auto, sdpa"),
        ("VLLM_GPU_MEMORY_UTILIZATION", 5.0, "VLLM_GPU_MEMORY_UTILIZATION=5.0 is outside (0, 1]"),
        ("VLLM_GPU_MEMORY_UTILIZATION", 0.0, "VLLM_GPU_MEMORY_UTILIZATION=0.0 is outside (0, 1]"),
        ("VLLM_GPU_MEMORY_UTILIZATION", float("nan"), "VLLM_GPU_MEMORY_UTILIZATION=nan is outside (0, 1]"),
        ("MODEL_NAME", "a//b", "MODEL_NAME='a//b' is neither a folder nor a Hub id"),
    ],
)
def test_check_names_the_constant(tmp_path, setting, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        evaluate.check(smoke_settings(tmp_path, **{setting: value}), cpu_only=True)


@pytest.mark.parametrize(("length", "refused"), [(32, True), (preflight.THINKING_MIN_TOKENS - 1, True), (1024, False)])
def test_thinking_needs_as_many_tokens_as_training_asks(tmp_path, length, refused):
    # the same threshold as grpotrainer's preflight: thinking cut off before its answer scores 0 on every problem
    s = smoke_settings(tmp_path, ENABLE_THINKING=True, MAX_COMPLETION_LENGTH=length)
    if refused:
        with pytest.raises(ConfigError, match=f"ENABLE_THINKING=True with MAX_COMPLETION_LENGTH={length}: thinking"):
            evaluate.check(s, cpu_only=True)
    else:
        evaluate.check(s, cpu_only=True)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("file", "OUTPUT_DIR={tmp}/file: {tmp}/file is a file, not a folder"),
        ("file/sub", "OUTPUT_DIR={tmp}/file/sub: {tmp}/file is a file, not a folder"),
        ("/proc/grpotrainer-eval", "OUTPUT_DIR=/proc/grpotrainer-eval cannot be created or written"),  # even root
    ],
)
def test_an_output_dir_that_cannot_be_written_is_refused_before_any_weights(tmp_path, where, message):
    # these once failed after the whole generation, losing it
    (tmp_path / "file").write_text("not a folder")
    s = smoke_settings(tmp_path, OUTPUT_DIR=str(tmp_path / where))
    with pytest.raises(ConfigError, match=re.escape(message.format(tmp=tmp_path))):
        evaluate.check(s, cpu_only=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A whole tiny model folder (grpo/profiles.py's), to cut copies of."""
    from grpo import profiles

    return profiles.ensure_model_dir(tmp_path_factory.mktemp("models") / "smoke-model")


def broken_copy(model_dir, path, how):
    """A copy of the model folder with the weights cut, the tokenizer removed, or nothing in it."""
    import shutil

    if how == "empty":
        path.mkdir()
        return path
    shutil.copytree(model_dir, path)
    if how == "weights cut":
        with open(path / "model.safetensors", "r+b") as f:
            f.truncate(20000)
    else:
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (path / name).unlink(missing_ok=True)
    return path


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("weights cut", "model.safetensors is cut short or damaged ("),  # was SafetensorError at load
        ("empty", "that folder holds no config.json"),  # was ValueError
        ("no tokenizer", "it holds no tokenizer files"),  # was IndexError
    ],
)
def test_a_broken_model_folder_is_refused_before_loading(tmp_path, model_dir, how, message):
    folder = broken_copy(model_dir, tmp_path / "model", how)
    with pytest.raises(ConfigError, match=re.escape(f"MODEL_NAME={folder}")) as err:
        evaluate.check(smoke_settings(tmp_path, MODEL_NAME=str(folder)), cpu_only=True)
    assert message in str(err.value)


def save_adapter(folder, hidden=32, rank=2):
    """A LoRA adapter folder as peft writes it for q_proj of layer 0 (config and safetensors, zero weights)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": "smoke-model", "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}
    (folder / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    # q_proj maps hidden_size to heads x head_dim = 4 x 8 in profiles.TINY_QWEN3
    tensors = {f"{prefix}.lora_A.weight": torch.zeros(rank, hidden), f"{prefix}.lora_B.weight": torch.zeros(32, rank)}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    return folder


@pytest.mark.parametrize(
    ("how", "message"),
    [
        (None, None),
        ("cut", "adapter_model.safetensors is cut short or damaged ("),  # was SafetensorError at load
        ("config only", "adapter_model.safetensors is missing"),  # peft then asked the Hub: HFValidationError
        ("config a list", "adapter_config.json is not a JSON object"),
    ],
)
def test_an_adapter_with_missing_or_cut_weights_is_refused_before_loading(tmp_path, how, message):
    adapter = save_adapter(tmp_path / "run" / "checkpoint-2")
    weights = adapter / "adapter_model.safetensors"
    if how == "cut":
        weights.write_bytes(weights.read_bytes()[:-4])  # the header whole, a tensor short
    elif how == "config only":
        weights.unlink()
    elif how == "config a list":
        (adapter / "adapter_config.json").write_text("[]")
    s = smoke_settings(tmp_path, ADAPTER=str(adapter))
    if message is None:
        evaluate.check(s, cpu_only=True)  # a whole adapter passes
        return
    with pytest.raises(ConfigError, match=re.escape(f"ADAPTER={adapter}: {message}")):
        evaluate.check(s, cpu_only=True)


def test_an_adapter_on_a_base_of_other_shapes_is_refused_naming_both(tmp_path):
    # the same layer names, but hidden size 48 where the adapter was trained at 32: peft raised RuntimeError
    from grpo import profiles

    wide = tmp_path / "wide" / "smoke-model"  # the name the adapter records, so only the shapes differ
    tokenizer = profiles.build_tokenizer()
    profiles.build_model(tokenizer, hidden_size=48).save_pretrained(wide)
    tokenizer.save_pretrained(wide)
    adapter = save_adapter(tmp_path / "run")
    s = smoke_settings(tmp_path, MODEL_NAME=str(wide), ADAPTER=str(adapter))
    with pytest.raises(ConfigError) as err:
        evaluate.load_model(s, cpu_only=True)
    expected = f"ADAPTER={adapter} does not fit MODEL_NAME={wide} (model.layers.0.self_attn.q_proj: adapter input"
    assert str(err.value).startswith(expected + " size 32, layer 48)")
    # export.py refuses with the very same message: one function writes it
    from transformers import AutoModelForCausalLM

    assert checkpoints.misfit_problem(AutoModelForCausalLM.from_pretrained(wide), adapter, str(wide)) == str(err.value)


def test_the_run_settings_decide_unless_given_here(tmp_path):
    # the adapter's run recorded its prompt, length and base model; this command line still wins where it speaks
    (tmp_path / "adapter_config.json").write_text("{}")
    recorded = {"SYSTEM_PROMPT": "Be exact.", "MAX_COMPLETION_LENGTH": 24, "MODEL_NAME": "/m", "LEARNING_RATE": 1.0}
    files.write_settings(tmp_path, recorded)
    s, _ = evaluate.resolve([f"--ADAPTER={tmp_path}", "--MAX_COMPLETION_LENGTH=48"])
    assert (s["SYSTEM_PROMPT"], s["MAX_COMPLETION_LENGTH"], s["MODEL_NAME"]) == ("Be exact.", 48, "/m")
    assert s["OUTPUT_DIR"] == str(tmp_path)  # results go beside the adapter
    s, _ = evaluate.resolve([f"--ADAPTER={tmp_path / 'checkpoint-2'}", "--SYSTEM_PROMPT=x"])
    assert (s["SYSTEM_PROMPT"], s["MAX_COMPLETION_LENGTH"]) == ("x", 24)  # a checkpoint reads its run's settings


def test_base_model_adapter_and_checkpoint_results_never_share_a_file():
    # --smoke once wrote all three to outputs/smoke/eval_test.json
    base, _ = evaluate.resolve(["--smoke"])
    adapter, _ = evaluate.resolve(["--smoke", "--ADAPTER=runs/a"])
    checkpoint, _ = evaluate.resolve(["--smoke", "--ADAPTER=runs/a/checkpoint-4"])
    assert len({base["OUTPUT_DIR"], adapter["OUTPUT_DIR"], checkpoint["OUTPUT_DIR"]}) == 3
    # beside the checkpoint, not in it: the trainer's rotation (SAVE_TOTAL_LIMIT) deletes checkpoint-N whole
    assert (adapter["OUTPUT_DIR"], checkpoint["OUTPUT_DIR"]) == ("runs/a", "runs/a/eval-checkpoint-4")
    assert not files.checkpoint_dirs("runs/a")  # and eval-checkpoint-4 is not taken for a checkpoint (none exist)


def test_missing_adapter_exits_2_without_a_traceback(tmp_path):
    result = run_script("evaluate.py", "--smoke", f"--OUTPUT_DIR={tmp_path}", f"--ADAPTER={tmp_path / 'none'}")
    assert result.returncode == 2  # cli.run's status for a ConfigError
    assert "error: ADAPTER=" in result.stderr and "Traceback" not in result.stderr


def test_an_unwritable_output_dir_exits_2_before_generating(tmp_path):
    # it once generated every answer, then raised NotADirectoryError and lost them
    (tmp_path / "file").write_text("")
    result = run_script("evaluate.py", "--smoke", f"--OUTPUT_DIR={tmp_path / 'file' / 'sub'}")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: OUTPUT_DIR={tmp_path / 'file' / 'sub'}: " in result.stderr
    assert "GSM8K test" not in result.stderr + result.stdout  # no progress bar: nothing was generated


@pytest.mark.slow  # `python evaluate.py --smoke` end to end, as the README runs it
def test_smoke_cli_writes_json_predictions_and_scalars(tmp_path):
    result = run_script("evaluate.py", "--smoke", f"--OUTPUT_DIR={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval_test.json").read_text())
    assert tuple(metrics) == (*gsm8k.KEYS, "seconds", "step", "settings")
    assert metrics["n"] == 8  # --smoke's LIMIT
    assert 1 <= metrics["mean_completion_tokens"] <= 32  # at most --smoke's MAX_COMPLETION_LENGTH, EOS included
    rows = [json.loads(line) for line in (tmp_path / "eval_test_predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and {"question", "gold", "completion", "extracted", "correct"} <= set(rows[0])
    fixture = [json.loads(line) for line in (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()]
    assert [r["question"] for r in rows] == [f["question"] for f in fixture[:8]]  # LIMIT keeps the first problems
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("_eval-test")
    scalars = read_scalars(run)
    # No ADAPTER, so no training step to log at: step 0. Scalars are float32, the JSON rounds to 4 decimals.
    assert [s for s, _ in scalars["eval/gsm8k_strict_accuracy"]] == [0]
    assert scalars["eval/gsm8k_strict_accuracy"][0][1] == pytest.approx(metrics["strict_accuracy"], abs=1e-4)
    assert scalars["eval/gsm8k_lenient_accuracy"][0][1] == pytest.approx(metrics["lenient_accuracy"], abs=1e-4)


def test_hf_generator_pads_on_the_left_so_batching_does_not_change_greedy_output(tmp_path):
    # Left padding puts every prompt's last token right before the first generated one; with right padding a
    # shorter prompt would continue from pad tokens and its greedy completion would change with its batch.
    from grpo.profiles import build_model, build_tokenizer

    tokenizer = build_tokenizer()
    model = build_model(tokenizer).eval()
    generate = gsm8k.hf_generator(model, tokenizer, max_new_tokens=8)
    prompts = [[{"role": "user", "content": q}] for q in ("Hi", "What is 12 plus 7 pencils in all, Mia?")]
    together = generate(prompts)
    alone = [generate([p])[0] for p in prompts]
    assert together == alone
    assert all(1 <= n <= 8 and cut == (n == 8) for _, n, cut in together)  # no end-of-turn within 8: cut off


def length_reward(completions, **kwargs):
    """A reward that tells any two completions of different lengths apart, so that a few steps move the adapter."""

    return [len(grading.completion_to_text(c)) / 100 for c in completions]


@pytest.mark.slow
def test_standalone_evaluation_of_a_saved_adapter_matches_the_in_training_one(tmp_path):
    # Same prompts, same greedy decoding, same weights: `evaluate.py --ADAPTER` must reproduce EVAL_AFTER row by row.
    args = ["grpotrainer.py", "--smoke", f"--OUTPUT_DIR={tmp_path}", "--EVAL_BEFORE=4", "--EVAL_AFTER=4"]
    args += ["--REWARD_FUNCS=test_evaluate:length_reward", "--REWARD_WEIGHTS=1", "--LEARNING_RATE=0.05"]
    train = run_script(*args, env={"PYTHONPATH": str(REPO / "tests")})
    assert train.returncode == 0, train.stderr[-3000:]
    args = ["evaluate.py", "--smoke", f"--OUTPUT_DIR={tmp_path}", f"--ADAPTER={tmp_path}", "--LIMIT=4"]
    result = run_script(*args)
    assert result.returncode == 0, result.stderr[-3000:]

    def completions(name):
        return [json.loads(line)["completion"] for line in (tmp_path / name).read_text().splitlines()]

    # The adapter changed what the model writes (else this test could not tell an adapter from none) ...
    assert completions("eval_test_before_predictions.jsonl") != completions("eval_test_after_predictions.jsonl")
    # ... and the saved adapter, loaded afresh, writes exactly what the model in training wrote.
    assert completions("eval_test_predictions.jsonl") == completions("eval_test_after_predictions.jsonl")
    # ... and scored with the run's own settings, read back from run_settings.json
    assert json.loads((tmp_path / "eval_test.json").read_text())["settings"]["MODEL_NAME"].endswith("smoke-model")
    keep = ("n", "strict_accuracy", "lenient_accuracy", "format_rate", "mean_completion_tokens")
    in_training = json.loads((tmp_path / "eval_test_after.json").read_text())
    standalone = json.loads((tmp_path / "eval_test.json").read_text())
    assert {k: in_training[k] for k in keep} == {k: standalone[k] for k in keep}


@pytest.mark.slow
def test_two_processes_share_the_evaluation_and_rank_0_writes_all_of_it(tmp_path):
    # Under torchrun each rank generates a contiguous shard (5 problems -> 3 + 2) and rank 0 gathers them in order.
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    args = ["grpotrainer.py", "--smoke", f"--OUTPUT_DIR={tmp_path}", "--EVAL_BEFORE=5", "--EVAL_AFTER=5"]
    result = run_script(*torchrun, *args, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    fixture = [json.loads(line)["question"] for line in (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()]
    for when in ("before", "after"):
        rows = (tmp_path / f"eval_test_{when}_predictions.jsonl").read_text().splitlines()
        assert [json.loads(line)["question"] for line in rows] == fixture[:5]
    (run,) = (tmp_path / "runs").iterdir()  # only rank 0 wrote TensorBoard events
    assert [s for s, _ in read_scalars(run)["eval/gsm8k_strict_accuracy"]] == [0, 4]
