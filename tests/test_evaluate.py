"""evaluate.py: its settings and their refusals (before any weights load), a run's records read back, the result
files and trackers, --ASK, and the script end to end on the tiny smoke model, in this process.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_evaluate.py -q -m "not slow"
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_evaluate.py -q -m slow   # a trained smoke run: ~1 min

The slow tests share conftest's `trained_run` (one smoke training) with test_export.py.
"""

import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, read_scalars, run_in_process, run_script

import evaluate
import export
from grpo import checkpoints, cli, evaluation, files, gsm8k, preflight, process, stats
from grpo.errors import ConfigError

TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7"  # shaped like a Hugging Face access token; no real one


def smoke_settings(tmp_path, **overrides):
    """evaluate.py's --smoke settings with a writable OUTPUT_DIR and a Hub id (passed through) as MODEL_NAME."""
    return {
        **cli.constants(evaluate),
        **evaluate.PROFILES["smoke"],
        "OUTPUT_DIR": str(tmp_path / "out"),
        **overrides,
    }


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("ADAPTER", "no/such/adapter", "ADAPTER=no/such/adapter holds no LoRA adapter"),
        ("LIMIT", -1, "LIMIT=-1 is outside [0, inf]: score only the first N problems"),
        ("EVAL_BATCH_SIZE", 0, "EVAL_BATCH_SIZE=0 is outside [1, inf]: prompts per generate() call"),
        ("SPLIT", "validation", "SPLIT='validation' is not one of test, train"),
        # these failed only once the model loaded (ValueError), or were accepted
        ("ATTN_IMPLEMENTATION", "fastest", "ATTN_IMPLEMENTATION='fastest' is not one of auto, sdpa"),
        ("VLLM_GPU_MEMORY_UTILIZATION", 5.0, "VLLM_GPU_MEMORY_UTILIZATION=5.0 is outside (0, 1]"),
        ("VLLM_GPU_MEMORY_UTILIZATION", 0.0, "VLLM_GPU_MEMORY_UTILIZATION=0.0 is outside (0, 1]"),
        ("VLLM_GPU_MEMORY_UTILIZATION", float("nan"), "VLLM_GPU_MEMORY_UTILIZATION=nan: a number here must be finite"),
        ("MODEL_NAME", "a//b", "MODEL_NAME='a//b' is neither a folder nor a Hub id"),
        ("EVAL_SAMPLES", -1, "EVAL_SAMPLES=-1 is outside [0, inf]: answers sampled per problem"),
        ("TEMPERATURE", 0.0, "TEMPERATURE=0.0 is outside [0.01, inf): their temperature"),
        ("USE_VLLM", "sometimes", "USE_VLLM='sometimes' is not one of auto, True, False"),
        ("REPORT_TO", "tensorbored", "'tensorbored' is not one of tensorboard, trackio, wandb (or none)"),
        ("DATASET", "no/such/file.jsonl", "DATASET=no/such/file.jsonl: no such file or folder"),
    ],
)
def test_check_names_the_constant(tmp_path, setting, value, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        evaluate.refuse_bad_settings(smoke_settings(tmp_path, **{setting: value}), cpu_only=True)


@pytest.mark.parametrize(("length", "refused"), [(32, True), (preflight.THINKING_MIN_TOKENS - 1, True), (1024, False)])
def test_thinking_needs_as_many_tokens_as_training_asks(tmp_path, length, refused):
    # the same threshold as grpotrainer's preflight: thinking cut off before its answer scores 0 on every problem
    s = smoke_settings(tmp_path, ENABLE_THINKING=True, MAX_COMPLETION_LENGTH=length)
    if refused:
        with pytest.raises(ConfigError, match=f"ENABLE_THINKING=True with MAX_COMPLETION_LENGTH={length}: thinking"):
            evaluate.refuse_bad_settings(s, cpu_only=True)
    else:
        evaluate.refuse_bad_settings(s, cpu_only=True)


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
        evaluate.refuse_bad_settings(s, cpu_only=True)


def broken_copy(tiny_model, path, how):
    """A copy of the model folder with the weights cut, the tokenizer removed, or nothing in it."""
    import shutil

    if how == "empty":
        path.mkdir()
        return path
    shutil.copytree(tiny_model, path)
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
def test_a_broken_model_folder_is_refused_before_loading(tmp_path, tiny_model, how, message):
    folder = broken_copy(tiny_model, tmp_path / "model", how)
    with pytest.raises(ConfigError, match=re.escape(f"MODEL_NAME={folder}")) as err:
        evaluate.refuse_bad_settings(smoke_settings(tmp_path, MODEL_NAME=str(folder)), cpu_only=True)
    assert message in str(err.value)


def save_adapter(folder, hidden=32, rank=2):
    """A LoRA adapter folder as peft writes it for q_proj of layer 0 (config and safetensors, zero weights)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {"base_model_name_or_path": "smoke-model", "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank}
    (folder / "adapter_config.json").write_text(json.dumps({**config, "target_modules": ["q_proj"]}))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    # q_proj maps hidden_size to heads x head_dim = 4 x 8 in smoke.TINY_QWEN3
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
        evaluate.refuse_bad_settings(s, cpu_only=True)  # a whole adapter passes
        return
    with pytest.raises(ConfigError, match=re.escape(f"ADAPTER={adapter}: {message}")):
        evaluate.refuse_bad_settings(s, cpu_only=True)


def test_an_adapter_on_a_base_of_other_shapes_is_refused_naming_both(tmp_path, tiny_model):
    # the same layer names, but hidden size 48 where the adapter was trained at 32: peft raised RuntimeError
    from transformers import AutoTokenizer

    from demo import smoke

    wide = tmp_path / "wide" / "smoke-model"  # the name the adapter records, so only the shapes differ
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    smoke.build_model(tokenizer, hidden_size=48).save_pretrained(wide)
    tokenizer.save_pretrained(wide)
    adapter = save_adapter(tmp_path / "run")
    s = smoke_settings(tmp_path, MODEL_NAME=str(wide), ADAPTER=str(adapter))
    with pytest.raises(ConfigError) as err:
        evaluate.load_model(s, cpu_only=True)
    assert str(err.value).startswith(f"ADAPTER={adapter} does not fit MODEL_NAME={wide} (")
    assert "[2, 32]" in str(err.value) and "[2, 48]" in str(err.value)  # peft's size mismatch, quoted
    # export.py refuses with the very same message: both apply the adapter through one function
    from transformers import AutoModelForCausalLM

    with pytest.raises(ConfigError) as again:
        checkpoints.apply_adapter(AutoModelForCausalLM.from_pretrained(wide), adapter, str(wide))
    assert str(again.value) == str(err.value)


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


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("run_settings.json", '{"MAX_COMPLETION_LENGTH": [256]}', "run_settings.json: MAX_COMPLETION_LENGTH is [256]"),
        ("run_settings.json", '{"SYSTEM_PROMPT": {"role": "system"}}', "run_settings.json: SYSTEM_PROMPT is {"),
        ("run_settings.json", '{"TEMPERATURE": "hot"}', 'run_settings.json: TEMPERATURE is "hot", not float'),
        ("run_settings.json", '"Qwen/Qwen3-8B"', "run_settings.json holds a str, not a JSON object"),
        ("adapter_config.json", '{"r": [2], "base_model_name_or_path": "smoke-model"}', "adapter_config.json: r is"),
        ("trainer_state.json", '{"global_step": null}', "trainer_state.json: global_step is null, not int"),
    ],
)
def test_a_run_record_edited_by_hand_is_one_message_naming_the_file(tmp_path, tiny_model, name, text, message, capsys):
    # each once raised a TypeError or AttributeError traceback, some only after the whole generation
    run = save_adapter(tmp_path / "run")
    (run / name).write_text(text)
    code, err = run_in_process(
        evaluate.main, "--smoke", f"--ADAPTER={run}", f"--MODEL_NAME={tiny_model}", capsys=capsys
    )
    assert code == 2 and message in err and str(run) in err
    assert not list(run.glob("eval_*"))  # nothing scored, nothing written


def test_base_model_adapter_and_checkpoint_results_never_share_a_file(tiny_model, monkeypatch):
    # --smoke once wrote all three to outputs/smoke/eval_test.json
    monkeypatch.setattr(evaluate.smoke, "cpu_model", lambda output_dir: tiny_model)  # built already, not in the repo
    base, _ = evaluate.resolve(["--smoke"])
    adapter, _ = evaluate.resolve(["--smoke", "--ADAPTER=runs/a"])
    checkpoint, _ = evaluate.resolve(["--smoke", "--ADAPTER=runs/a/checkpoint-4"])
    assert len({base["OUTPUT_DIR"], adapter["OUTPUT_DIR"], checkpoint["OUTPUT_DIR"]}) == 3
    # beside the checkpoint, not in it: the trainer's rotation (SAVE_TOTAL_LIMIT) deletes checkpoint-N whole
    assert (adapter["OUTPUT_DIR"], checkpoint["OUTPUT_DIR"]) == ("runs/a", "runs/a/eval-checkpoint-4")
    assert not files.checkpoint_dirs("runs/a")  # and eval-checkpoint-4 is not taken for a checkpoint (none exist)


def test_base_models_in_folders_of_one_name_get_their_own_results(tmp_path):
    # /a/model and /b/model once both wrote outputs/eval/model; a link to /a/model is /a/model
    for side in ("a", "b"):
        (tmp_path / side / "model").mkdir(parents=True)
    (tmp_path / "link").symlink_to(tmp_path / "a" / "model")
    a, b, link = (evaluate.default_output_dir("", str(tmp_path / p)) for p in ("a/model", "b/model", "link"))
    assert a != b and a == link.replace("link-", "model-")
    assert evaluate.default_output_dir("", "org/model") != evaluate.default_output_dir("", "other/model")


def test_a_second_dataset_never_overwrites_the_first(tmp_path, tiny_model, monkeypatch):
    # the same model scored on the --smoke fixture, then on another file (and on one of the same name elsewhere):
    # each keeps its own result files and its own TensorBoard run, where all once went to eval_test.json
    fixture = (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()
    other = [tmp_path / "x" / "smoke_gsm8k.jsonl", tmp_path / "y" / "smoke_gsm8k.jsonl"]
    for path, rows in zip(other, (fixture[8:11], fixture[11:15]), strict=True):
        path.parent.mkdir()
        path.write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # one folder for all: runs stay apart
    common = ["--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={tmp_path / 'out'}", "--MAX_COMPLETION_LENGTH=4"]
    for dataset in ([], [f"--DATASET={other[0]}"], [f"--DATASET={other[1]}"]):
        evaluate.main([*common, *dataset])
    results = sorted((tmp_path / "out").glob("eval_*.json"))
    assert len(results) == 3 and results[-1].name == "eval_test.json"  # the run's own data keeps its name
    assert sorted(json.loads(p.read_text())["n"] for p in results) == [3, 4, 8]  # each its own data, none lost
    runs = sorted((tmp_path / "tb" / "runs").iterdir())
    assert len(runs) == 3 and all(len(read_scalars(r)["eval/gsm8k_strict_accuracy"]) == 1 for r in runs)


def no_model(monkeypatch):
    """evaluate.load_model failing the test: what is refused must be refused before any weights load."""
    monkeypatch.setattr(evaluate, "load_model", lambda *args, **kwargs: pytest.fail("the model was loaded"))


def test_missing_adapter_exits_2(tmp_path, tiny_model, monkeypatch, capsys):
    no_model(monkeypatch)
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={tmp_path}", f"--ADAPTER={tmp_path / 'none'}"]
    code, err = run_in_process(evaluate.main, *args, capsys=capsys)
    assert code == 2  # process.run's status for a ConfigError
    assert f"error: ADAPTER={tmp_path / 'none'} holds no LoRA adapter" in err


def test_a_python_without_torch_gets_the_command_that_fixes_it(bare_python, tmp_path):
    # --smoke once built its model first (in a folder where it is not built yet), and ended in a ModuleNotFoundError
    for args in (["--smoke"], []):
        cmd = [*bare_python, str(REPO / "evaluate.py"), *args]
        out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"this Python ({bare_python[0]}) lacks torch" in out.stderr and "make install" in out.stderr


def test_a_full_disk_is_one_message_naming_the_folder(full_disk, tiny_model, capsys):
    # a real full filesystem (tmpfs): writing the results once ended in an OSError traceback
    out = full_disk / "eval"
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={out}", "--LIMIT=2", "--MAX_COMPLETION_LENGTH=4"]
    code, err = run_in_process(evaluate.main, *args, capsys=capsys)
    assert code == 2
    assert f"error: No space left on device while writing to OUTPUT_DIR {out} (OSError: [Errno 28]" in err
    assert "then rerun the same command." in err


def test_a_completion_past_the_models_context_is_refused_before_generating(tmp_path, tiny_model, capsys):
    positions = json.loads((Path(tiny_model) / "config.json").read_text())["max_position_embeddings"]
    s = smoke_settings(tmp_path, MODEL_NAME=tiny_model)
    evaluate.refuse_past_context({**s, "MAX_COMPLETION_LENGTH": positions - 100}, prompt_tokens=100)  # fits exactly
    with pytest.raises(ConfigError, match=f"Set MAX_COMPLETION_LENGTH <= {positions - 100}"):
        evaluate.refuse_past_context({**s, "MAX_COMPLETION_LENGTH": positions - 99}, prompt_tokens=100)
    # end to end: it once generated on, for hours, past the model's positions
    out = tmp_path / "out"
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={out}", "--MAX_COMPLETION_LENGTH=100000"]
    code, err = run_in_process(evaluate.main, *args, capsys=capsys)
    assert code == 2 and f"runs past {tiny_model}'s {positions} positions" in err
    assert "GSM8K test" not in err and not out.exists()  # no progress bar: nothing generated, nothing written


def test_an_unwritable_output_dir_exits_2_before_generating(tmp_path, tiny_model, monkeypatch, capsys):
    # it once generated every answer, then raised NotADirectoryError and lost them
    no_model(monkeypatch)
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "sub"
    code, err = run_in_process(
        evaluate.main, "--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={out}", capsys=capsys
    )
    assert code == 2 and f"error: OUTPUT_DIR={out}: {tmp_path / 'file'} is a file, not a folder" in err


def fixture_questions(n):
    return [json.loads(line)["question"] for line in gsm8k.FIXTURE.read_text().splitlines()[:n]]


def write_baseline(folder, questions, right):
    """An evaluation as evaluate.py writes it, of `questions`, every verdict `right`."""
    predictions = [{"question": q, "correct": right, "strict_correct": right} for q in questions]
    metrics = gsm8k.summarize(predictions, [1] * len(predictions))
    with contextlib.redirect_stdout(io.StringIO()):  # its table: not this test's output
        evaluation.report(metrics, predictions, folder, "eval_test")
    return folder / "eval_test.json"


def test_baseline_lists_the_flips_and_tests_them_on_one_cpu_thread(tmp_path, tiny_model, monkeypatch, capsys):
    import torch

    threads = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(torch, "set_num_threads", threads.append)  # what evaluate.py asks of torch, not applied
    baseline = write_baseline(tmp_path / "base", fixture_questions(4), right=True)
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", "--LIMIT=4", f"--OUTPUT_DIR={tmp_path / 'out'}"]
    metrics = evaluate.main([*args, f"--BASELINE={baseline}"])
    assert threads == [1]  # as training on the CPU: torch's default (one per core) thrashes, 350.7 s against 20.7 s

    # The baseline was right everywhere, so each problem the tiny model gets wrong is one flip down, none up.
    predictions = [json.loads(line) for line in (tmp_path / "out" / "eval_test_predictions.jsonl").open()]
    wrong = [i for i, p in enumerate(predictions) if not p["correct"]]
    strict_wrong = [i for i, p in enumerate(predictions) if not p["strict_correct"]]
    written = json.loads((tmp_path / "out" / "eval_test.json").read_text())["paired"]
    assert written == metrics["paired"] and written["baseline"] == str(baseline)
    assert (written["lenient"]["up"], written["lenient"]["down"]) == (0, len(wrong))
    assert written["strict"]["down"] == len(strict_wrong)
    assert written["strict"]["p_value"] == stats.mcnemar_exact(0, len(strict_wrong))  # 4 down: 2 / 16
    out = capsys.readouterr().out
    assert f"flips against {baseline} ({len(strict_wrong)} problems):" in out
    for i in strict_wrong:
        assert re.search(rf"^  #{i} +strict down", out, re.M), out
    assert f"strict: 1.000 -> {1 - len(strict_wrong) / 4:.3f}" in out  # the paired test closes the table


def test_a_baseline_of_other_problems_is_refused_before_the_model_loads(tmp_path, tiny_model, monkeypatch, capsys):
    no_model(monkeypatch)
    baseline = write_baseline(tmp_path / "base", fixture_questions(8)[4:], right=False)
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", "--LIMIT=4", f"--OUTPUT_DIR={tmp_path / 'out'}"]
    code, err = run_in_process(evaluate.main, *args, f"--BASELINE={baseline}", capsys=capsys)
    assert code == 2
    assert f"error: BASELINE={baseline} scored other problems (4 there, 4 here; the first that differs: #0, " in err
    assert not (tmp_path / "out").exists()  # nothing written


# ---------------------------------------------------------------------------------------------------------------
# old names, sampled accuracy, --ASK, REPORT_TO, credentials


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, tiny_model):
    """A run folder holding a LoRA adapter on the tiny model with random B weights (peft's init_lora_weights=False;
    zero B would leave the model unchanged) and the run_settings.json of a run from before records were redacted:
    a token in its grpo_config's model_init_kwargs and in its system prompt."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    run = tmp_path_factory.mktemp("lora") / "run"
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), lora).save_pretrained(run)
    record = {
        "MODEL_NAME": tiny_model,
        "SYSTEM_PROMPT": f"Solve it; key {TOKEN}",
        "TEMPERATURE": 0.9,
        "grpo_config": {"model_init_kwargs": {"token": TOKEN}},
    }
    (run / "run_settings.json").write_text(json.dumps(record))
    return run


def test_old_names_are_read_as_the_new_ones_with_a_line(lora_run, capsys):
    process.setup_logging("evaluate")  # its lines to this test's stderr, as main() sets it up
    old = ["--SAMPLES=2", "--BATCH_SIZE=3", "--SAMPLE_TEMPERATURE=1.5"]
    s, args = evaluate.resolve([f"--ADAPTER={lora_run}", *old])
    assert (s["EVAL_SAMPLES"], s["EVAL_BATCH_SIZE"], s["TEMPERATURE"]) == (2, 3, 1.5)  # not the run's 0.9: given here
    assert {"EVAL_SAMPLES", "EVAL_BATCH_SIZE", "TEMPERATURE"} <= args.given
    assert capsys.readouterr().err.splitlines() == [
        "[evaluate] --SAMPLES is EVAL_SAMPLES here",
        "[evaluate] --BATCH_SIZE is EVAL_BATCH_SIZE here",
        "[evaluate] --SAMPLE_TEMPERATURE is TEMPERATURE here",
    ]
    assert evaluate.resolve([f"--ADAPTER={lora_run}"])[0]["TEMPERATURE"] == 0.9  # the run's, as GRPO sampled


def predictions_of(folder, stem="eval_test"):
    return [json.loads(line) for line in (folder / f"{stem}_predictions.jsonl").read_text().splitlines()]


def test_eval_samples_scores_sampled_accuracy_under_either_name(tmp_path, tiny_model, capsys):
    common = ["--smoke", f"--MODEL_NAME={tiny_model}", "--LIMIT=3", "--MAX_COMPLETION_LENGTH=4", "--REPORT_TO=none"]
    new = evaluate.main([*common, f"--OUTPUT_DIR={tmp_path / 'new'}", "--EVAL_SAMPLES=2", "--TEMPERATURE=1.5"])
    old = evaluate.main([*common, f"--OUTPUT_DIR={tmp_path / 'old'}", "--SAMPLES=2", "--SAMPLE_TEMPERATURE=1.5"])
    assert (new["samples"], new["sample_temperature"], list(new["pass_at_k"])) == (2, 1.5, ["1", "2"])
    assert {k: v for k, v in old.items() if k != "seconds"} == {k: v for k, v in new.items() if k != "seconds"}
    written = json.loads((tmp_path / "new" / "eval_test.json").read_text())
    assert (written["samples"], written["settings"]["EVAL_SAMPLES"]) == (2, 2)
    # each problem's count of right samples, kept for a later paired test; seeded, so both runs drew the same
    counts = [p["sampled_correct"] for p in predictions_of(tmp_path / "new")]
    assert len(counts) == 3 and set(counts) <= {0, 1, 2}
    assert predictions_of(tmp_path / "old") == predictions_of(tmp_path / "new")


def test_ask_prints_each_answer_and_what_the_grader_reads(capsys):
    # a stub generator: one formatted answer, one cut off at the token limit (no credit, so nothing read)
    answers = {"Tom has 3 pens, buys 4, gives 2 away. How many?": ("Tom keeps 5 pens.\n#### 5", 9, False)}
    answers["What is 6 * 7?"] = ("It is 42", 32, True)
    s = {"ASK": list(answers), "SYSTEM_PROMPT": "Be exact.", "ENABLE_THINKING": False}
    seen = []

    def generate(prompts):
        seen.extend(prompts)
        return [answers[p[-1]["content"]] for p in prompts]

    evaluate.ask(s, generate)
    assert seen == [gsm8k.make_prompt(q, "Be exact.") for q in answers]  # training's prompt, one call for all
    assert capsys.readouterr().out == (
        "Q: Tom has 3 pens, buys 4, gives 2 away. How many?\nA: Tom keeps 5 pens.\n#### 5\n"
        "-> the grader reads 5 (9 tokens)\n\n"
        "Q: What is 6 * 7?\nA: It is 42\n-> the grader reads no final answer (32 tokens, cut off)\n\n"
    )


ASKED = ["Tom has 3 pens, buys 4, then gives 2 away. How many pens, in all, does he keep?", "What is 6 * 7?"]
ANSWER = re.compile(r"^Q: (.*?)\nA: (.*?)\n-> the grader reads ([^\n]+?) \((\d+) tokens(, cut off)?\)\n$", re.S | re.M)


def asked(out):
    """[(question, answer, tokens)] of --ASK's output."""
    return [(q, a, int(n)) for q, a, _, n, _ in ANSWER.findall(out)]


def test_ask_answers_each_question_with_the_base_model_or_the_adapter(tmp_path, tiny_model, lora_run, capsys):
    out = tmp_path / "out"
    questions = [f"--ASK={q}" for q in ASKED]  # given once each; the commas inside one stay in it
    nowhere = f"--DATASET={tmp_path / 'none.jsonl'}"  # no data is read, so none need be there
    evaluate.main(["--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={out}", nowhere, *questions])
    base = asked(capsys.readouterr().out)
    evaluate.main(["--smoke", f"--ADAPTER={lora_run}", f"--OUTPUT_DIR={out}", *questions])
    tuned = asked(capsys.readouterr().out)
    assert [q for q, _, _ in base] == [q for q, _, _ in tuned] == ASKED  # each question whole, in order
    assert all(1 <= n <= 32 for _, _, n in base + tuned)  # --smoke's MAX_COMPLETION_LENGTH
    assert [a for _, a, _ in base] != [a for _, a, _ in tuned]  # the adapter was applied: it writes otherwise
    assert not out.exists()  # no scoring: nothing written


@pytest.mark.parametrize(("report_to", "runs"), [("tensorboard", 1), ("none", 0)])
def test_report_to_decides_the_tensorboard_run(tmp_path, tiny_model, monkeypatch, report_to, runs, capsys):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    out = tmp_path / "out"
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={out}", "--LIMIT=2", "--MAX_COMPLETION_LENGTH=4"]
    metrics = evaluate.main([*args, f"--REPORT_TO={report_to}"])
    assert json.loads((out / "eval_test.json").read_text())["n"] == 2  # the results either way
    found = sorted((out / "runs").iterdir()) if (out / "runs").exists() else []
    assert len(found) == runs
    if runs:  # the run's own scalars, at step 0: no adapter, no training step
        (strict,) = read_scalars(found[0])["eval/gsm8k_strict_accuracy"]
        assert strict == (0, pytest.approx(metrics["strict_accuracy"], abs=1e-6))  # float32 of the same number


def test_a_token_in_the_runs_record_reaches_no_result_file(tmp_path, lora_run, monkeypatch, capsys):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    out = tmp_path / "out"
    evaluate.main(
        ["--smoke", f"--ADAPTER={lora_run}", f"--OUTPUT_DIR={out}", "--LIMIT=2", "--MAX_COMPLETION_LENGTH=4"]
    )
    written = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {p.name for p in written} >= {"eval_test.json", "eval_test_predictions.jsonl"} and len(written) == 3
    assert not [p for p, data in written.items() if TOKEN.encode() in data]  # the JSON, predictions, TensorBoard
    # the prompt the run recorded is the one used and recorded, its credential redacted
    assert json.loads((out / "eval_test.json").read_text())["settings"]["SYSTEM_PROMPT"] == "Solve it; key <redacted>"


def test_a_static_cache_scores_the_eager_answers(tmp_path, tiny_model, capsys):
    args = ["--smoke", f"--MODEL_NAME={tiny_model}", "--LIMIT=4", "--REPORT_TO=none"]
    for name in ("dynamic", "static"):
        evaluate.main([*args, f"--OUTPUT_DIR={tmp_path / name}", f"--CACHE_IMPLEMENTATION={name}"])
    eager, static = (predictions_of(tmp_path / name) for name in ("dynamic", "static"))
    assert len(eager) == 4
    assert static == eager  # greedy: the same tokens, so the same completions, extractions and grades


# ---------------------------------------------------------------------------------------------------------------
# end to end


@pytest.mark.slow  # `python evaluate.py --smoke` end to end, as the README runs it
def test_smoke_cli_writes_json_predictions_and_scalars(tmp_path):
    result = run_script("evaluate.py", "--smoke", f"--OUTPUT_DIR={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval_test.json").read_text())
    assert tuple(metrics)[: len(gsm8k.KEYS)] == gsm8k.KEYS and tuple(metrics)[-2:] == ("step", "settings")
    for key in gsm8k.ACCURACIES:  # each accuracy with its 95 % interval around it
        low, high = metrics[key + gsm8k.INTERVAL]
        assert low <= metrics[key] <= high
    assert metrics["n"] == 8  # --smoke's LIMIT
    assert 1 <= metrics["mean_completion_tokens"] <= 32  # at most --smoke's MAX_COMPLETION_LENGTH, EOS included
    rows = predictions_of(tmp_path)
    assert len(rows) == 8 and {"question", "gold", "completion", "extracted", "correct"} <= set(rows[0])
    assert [r["question"] for r in rows] == fixture_questions(8)  # LIMIT keeps the first problems
    (run,) = (tmp_path / "runs").iterdir()
    assert run.name.endswith("_eval-test")
    scalars = read_scalars(run)
    # No ADAPTER, so no training step to log at: step 0. Scalars are float32, the JSON rounds to 4 decimals.
    assert [s for s, _ in scalars["eval/gsm8k_strict_accuracy"]] == [0]
    assert scalars["eval/gsm8k_strict_accuracy"][0][1] == pytest.approx(metrics["strict_accuracy"], abs=1e-4)
    assert scalars["eval/gsm8k_lenient_accuracy"][0][1] == pytest.approx(metrics["lenient_accuracy"], abs=1e-4)


@pytest.mark.slow
def test_standalone_evaluation_of_a_saved_adapter_matches_the_in_training_one(trained_run, tmp_path, capsys):
    # Same prompts, same greedy decoding, same weights: `evaluate.py --ADAPTER` must reproduce EVAL_AFTER row by row.
    out = tmp_path / "eval"
    evaluate.main(["--smoke", f"--ADAPTER={trained_run}", f"--OUTPUT_DIR={out}", "--LIMIT=4"])

    def completions(folder, stem):
        return [p["completion"] for p in predictions_of(folder, stem)]

    # The adapter changed what the model writes (else this test could not tell an adapter from none) ...
    assert completions(trained_run, "eval_test_before") != completions(trained_run, "eval_test_after")
    # ... and the saved adapter, loaded afresh, writes exactly what the model in training wrote.
    assert completions(out, "eval_test") == completions(trained_run, "eval_test_after")
    # ... and scored with the run's own settings, read back from run_settings.json
    standalone = json.loads((out / "eval_test.json").read_text())
    assert standalone["settings"]["MODEL_NAME"] == str(trained_run / "smoke-model")
    keep = ("n", "strict_accuracy", "lenient_accuracy", "format_rate", "mean_completion_tokens")
    in_training = json.loads((trained_run / "eval_test_after.json").read_text())
    assert {k: in_training[k] for k in keep} == {k: standalone[k] for k in keep}


@pytest.mark.slow
def test_ask_answers_as_the_run_scored_before_and_after_training(trained_run, tmp_path, capsys):
    # the first problem asked of the base smoke model and of the trained adapter: their greedy answers are the ones
    # EVAL_BEFORE (the adapter at zero) and EVAL_AFTER wrote for it, so --ASK prompts exactly as training did
    question = fixture_questions(1)[0]
    out = tmp_path / "out"
    evaluate.main(
        ["--smoke", f"--MODEL_NAME={trained_run / 'smoke-model'}", f"--ASK={question}", f"--OUTPUT_DIR={out}"]
    )
    evaluate.main(["--smoke", f"--ADAPTER={trained_run}", f"--ASK={question}", f"--OUTPUT_DIR={out}"])
    (base, tuned) = asked(capsys.readouterr().out)
    assert base[:2] == (question, predictions_of(trained_run, "eval_test_before")[0]["completion"])
    assert tuned[:2] == (question, predictions_of(trained_run, "eval_test_after")[0]["completion"])


# ---------------------------------------------------------------------------------------------------------------
# 3. a run's files never switch on remote code


def evil_model(tiny_model, folder, marker):
    """A copy of the tiny model whose config and tokenizer point (auto_map) at its own evil.py, which writes
    `marker`."""
    shutil.copytree(tiny_model, folder)
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import Qwen3Config, Qwen3ForCausalLM, PreTrainedTokenizerFast\n"
        # subclasses: transformers marks a remote class as such, which must not touch its own Qwen3 classes
        "class C(Qwen3Config):\n    pass\n"
        "class M(Qwen3ForCausalLM):\n    config_class = C\n"
        "class T(PreTrainedTokenizerFast):\n    pass\n"
    )
    for name, auto_map in (
        ("config.json", {"AutoConfig": "evil.C", "AutoModelForCausalLM": "evil.M"}),
        ("tokenizer_config.json", {"AutoTokenizer": [None, "evil.T"]}),
    ):
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**data, "auto_map": auto_map}))
    return folder


def test_a_run_folder_cannot_switch_on_remote_code(tmp_path, tiny_model):
    marker = tmp_path / "ran.txt"
    base = evil_model(tiny_model, tmp_path / "models" / "smoke-model", marker)
    run = save_adapter(tmp_path / "run")
    sent = {"MODEL_NAME": str(base), "TRUST_REMOTE_CODE": True, "ATTN_IMPLEMENTATION": "someone/kernel"}
    (run / "run_settings.json").write_text(json.dumps(sent))
    s, _ = evaluate.resolve(["--smoke", f"--ADAPTER={run}"])
    assert (s["MODEL_NAME"], s["TRUST_REMOTE_CODE"], s["ATTN_IMPLEMENTATION"]) == (str(base), False, "auto")
    evaluate.load_model(s, cpu_only=True)
    assert not marker.exists()  # the folder's Python never ran
    export.main([f"--ADAPTER={run}", f"--OUTPUT_DIR={tmp_path / 'merged'}"])
    assert not marker.exists()  # nor when exported
    evaluate.load_model({**s, "TRUST_REMOTE_CODE": True}, cpu_only=True)
    assert marker.read_text() == "ran"  # the user's own switch does run it: the test above could fail


def test_evaluate_loads_a_model_in_a_shell_left_set_for_fsdp(tmp_path, tiny_model, monkeypatch):
    # training's FSDP device_map is training's: evaluate.py passes its own, and the two must not meet
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    s, _ = evaluate.resolve(["--smoke", f"--MODEL_NAME={tiny_model}"])
    model, _ = evaluate.load_model(s, cpu_only=True)
    assert not model.training


def test_default_output_dir_of_a_checkpoint_and_a_hub_model():
    # beside a checkpoint-N, never in it; a Hub id as org--name
    assert evaluate.default_output_dir("runs/a/checkpoint-4", "m") == "runs/a/eval-checkpoint-4"
    assert evaluate.default_output_dir("", "Qwen/Qwen3-8B") == "outputs/eval/Qwen--Qwen3-8B"


def test_results_name_of_a_dataset_given_here():
    s = {"DATASET": "openai/gsm8k", "DATASET_CONFIG": "socratic", "SPLIT": "test"}
    assert evaluate.results_name(s, {"DATASET_CONFIG"}) == "eval_gsm8k-94056f14_test"
    assert evaluate.results_name(s, set()) == "eval_test"  # the run's own data
