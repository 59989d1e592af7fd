"""Tests of grpo/generation.py: running a generator over a dataset (generate_all, sample_all) and the transformers
generator evaluation uses (hf_generator), on the tiny smoke model; its compiled decode step (slow).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_generation.py -q -m "not slow"
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_generation.py -q -m slow   # compiled decode: ~2 min
"""

import functools
import json
import sys
from types import SimpleNamespace as NS

import pytest
from conftest import run_script

from grpo import generation, gsm8k
from grpo.errors import ConfigError


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


class Echo:
    """A stub generator: answers "#### i" for question i, in i + 1 tokens, cut off when i is 4; records its batches."""

    def __init__(self):
        self.batches = []

    def __call__(self, prompts):
        self.batches.append(len(prompts))
        numbers = [int(p[-1]["content"].split()[2]) for p in prompts]
        return [(f"#### {i}", i + 1, i == 4) for i in numbers]


def test_generate_all_runs_in_batches_and_keeps_the_dataset_order():
    echo = Echo()
    rows = generation.generate_all(problems(5), echo, batch_size=2, progress=False)
    assert echo.batches == [2, 2, 1]  # 5 problems in batches of at most 2
    assert rows[4] == {
        "question": "What is 4 plus zero?",
        "gold": "4",
        "completion": "#### 4",
        "completion_tokens": 5,
        "truncated": True,
    }
    assert [r["gold"] for r in rows] == ["0", "1", "2", "3", "4"]


def test_a_generator_that_drops_completions_is_an_error():
    with pytest.raises(RuntimeError, match="returned 1 completions for 2"):
        generation.generate_all(problems(2), lambda prompts: [("#### 0", 1, False)], batch_size=2, progress=False)


def test_sample_all_repeats_each_problem_in_place():
    echo = Echo()
    rows = generation.sample_all(problems(3), echo, samples=2, batch_size=4, progress=False)
    assert [r["gold"] for r in rows] == ["0", "0", "1", "1", "2", "2"]  # problem-major: a problem's samples together
    assert echo.batches == [4, 2]  # the 6 prompts batched as any others


def test_eos_ids_put_the_tokenizers_first_and_keep_the_generation_configs():
    # moved from eos_ids's docstring
    assert generation.eos_ids(NS(generation_config=NS(eos_token_id=2)), NS(eos_token_id=1)) == [1, 2]
    assert generation.eos_ids(NS(generation_config=NS(eos_token_id=[2, 0])), NS(eos_token_id=2)) == [2, 0]


def test_context_length_and_the_choices_for_vllm():
    # moved from the docstrings of context_length, generation_choice and vllm_memory_share
    assert generation.context_length(180, 256) == 500
    choice = generation.generation_choice("auto", cuda=False, vllm_installed=True)
    assert choice == (False, "USE_VLLM=auto: HF generate, as no CUDA GPU is visible")
    assert generation.vllm_memory_share("auto", None, 80, 64, 406) == 0.3
    assert generation.vllm_memory_share("0.5", None, 80, 64, 406) == 0.5


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """(model, tokenizer) of the tiny smoke model, fp32, in eval mode: one load for the module."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


def test_sampling_is_seeded_and_leaves_the_global_random_state_alone(tiny):
    import torch

    sample = functools.partial(generation.hf_generator(*tiny, max_new_tokens=6), temperature=1.0)  # as evaluation
    dataset = gsm8k.load(gsm8k.FIXTURE, "train", limit=2)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    first = generation.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=5)
    after = torch.rand(1)
    again = generation.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=5)
    other = generation.sample_all(dataset, sample, 3, batch_size=6, progress=False, seed=6)
    assert first == again  # same seed, same samples
    assert other != first  # another seed draws others: the seed is what decides them
    assert before == after  # training's own random stream is untouched by the evaluation
    assert [r["question"] for r in first] == [q for q in dataset["question"] for _ in range(3)]  # problem-major
    assert len({r["completion"] for r in first}) > 1  # sampled, not greedy: a random model's samples differ


def test_hf_generator_pads_on_the_left_so_batching_does_not_change_greedy_output(tiny):
    # Left padding puts every prompt's last token right before the first generated one; with right padding a
    # shorter prompt would continue from pad tokens and its greedy completion would change with its batch.
    generate = generation.hf_generator(*tiny, max_new_tokens=8)
    prompts = [[{"role": "user", "content": q}] for q in ("Hi", "What is 12 plus 7 pencils in all, Mia?")]
    together = generate(prompts)
    alone = [generate([p])[0] for p in prompts]
    assert together == alone
    assert all(1 <= n <= 8 and cut == (n == 8) for _, n, cut in together)  # no end-of-turn within 8: cut off


def test_a_completion_ends_at_the_first_end_of_turn_token_counted_with_it(tiny):
    # the token greedy decoding writes first, made the end of turn, ends every completion at once
    import torch

    model, tokenizer = tiny
    prompts = [[{"role": "user", "content": "Hi"}]]
    text = tokenizer.apply_chat_template(prompts[0], tokenize=False, add_generation_prompt=True, enable_thinking=False)
    with torch.no_grad():
        first = model(**tokenizer(text, return_tensors="pt", add_special_tokens=False)).logits[0, -1].argmax().item()
    assert generation.hf_generator(model, tokenizer, max_new_tokens=4)(prompts)[0][1] > 1  # it wrote on before
    ended = generation.hf_generator(model, tokenizer, max_new_tokens=4, eos=[first])(prompts)[0]
    assert ended == (tokenizer.decode([first], skip_special_tokens=True), 1, False)  # one token, counted: not cut


def test_a_chat_template_that_refuses_a_system_turn_is_told_apart(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    assert not generation.refuses_system_turn(tiny_model)  # the smoke model's template takes a system turn
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    refuse = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    tokenizer.chat_template = refuse + "{{ messages[-1]['content'] }}"  # as Gemma's and Mistral's templates do
    tokenizer.save_pretrained(tmp_path / "refuses")
    assert generation.refuses_system_turn(str(tmp_path / "refuses"))
    tokenizer.chat_template = None
    tokenizer.save_pretrained(tmp_path / "no-template")
    # no chat template, or no tokenizer at all: not this question's to answer (preflight and loading name them)
    assert not generation.refuses_system_turn(str(tmp_path / "no-template"))
    assert not generation.refuses_system_turn(str(tmp_path / "missing"))


def test_vllm_generator_starts_its_own_engine_with_the_adapter_as_a_lora_request(monkeypatch, tmp_path):
    # vllm as modules whose LLM records how it was made and asked: no GPU, no vllm install
    made, asked = {}, []

    class LLM:
        def __init__(self, **kwargs):
            made.update(kwargs)

        def chat(self, prompts, params, lora_request, chat_template_kwargs, use_tqdm):
            asked.append((params, lora_request, chat_template_kwargs))
            return [NS(outputs=[NS(text="#### 4", token_ids=[1, 2, 3], finish_reason="length")]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", NS(LLM=LLM, SamplingParams=lambda **kwargs: kwargs))
    monkeypatch.setitem(sys.modules, "vllm.lora", NS())
    monkeypatch.setitem(sys.modules, "vllm.lora.request", NS(LoRARequest=lambda *args: args))
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 12}))
    generate = generation.vllm_generator(
        "base",
        str(tmp_path),
        prompt_tokens=180,
        max_completion_length=256,
        enable_thinking=False,
        bf16=True,
        trust_remote_code=False,
        gpu_memory_utilization=0.4,
    )
    assert made == {
        "model": "base",
        "dtype": "bfloat16",
        "max_model_len": 180 + 256 + generation.CONTEXT_MARGIN,  # the longest prompt and a whole completion
        "enable_lora": True,
        "max_lora_rank": 16,  # vLLM's smallest choice that holds rank 12
        "seed": 0,
        "trust_remote_code": False,
        "gpu_memory_utilization": 0.4,
    }
    assert generate([[{"role": "user", "content": "2+2?"}]]) == [("#### 4", 3, True)]  # cut off at the limit
    assert generate([[{"role": "user", "content": "2+2?"}]], temperature=0.7)
    (greedy, lora, thinking), (sampled, _, _) = asked
    assert (greedy, sampled) == ({"temperature": 0.0, "max_tokens": 256}, {"temperature": 0.7, "max_tokens": 256})
    assert lora == ("adapter", 1, str(tmp_path.resolve())) and thinking == {"enable_thinking": False}


def test_a_model_that_names_no_eos_is_refused():
    model, tokenizer = NS(generation_config=NS(eos_token_id=None)), NS(eos_token_id=None, pad_token_id=None)
    with pytest.raises(ConfigError, match="the model names no EOS token"):
        generation.hf_generator(model, tokenizer, max_new_tokens=8)


COMPILED_DECODE = """
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo import generation, gsm8k, hardware

original = hardware.decode_options


def on_every_device(cache_implementation):
    options = original(cache_implementation)
    if options:
        options["compile_config"]._compile_all_devices = True
    return options


hardware.decode_options = on_every_device
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
prompts = gsm8k.load(str(gsm8k.FIXTURE), "train", limit=4)["prompt"]
eager = generation.hf_generator(model, tokenizer, 24)(prompts)
compiled = generation.hf_generator(model, tokenizer, 24, cache_implementation="static")
assert compiled(prompts) == eager, "the first compiled call"  # (text, tokens, truncated) for each prompt, greedy
assert hasattr(model, "_compiled_call"), "transformers did not compile the decode step"
assert compiled(prompts) == eager, "the second call"  # it runs the compiled graph as it is
"""


@pytest.mark.slow
def test_the_compiled_decode_step_generates_the_eager_tokens(tiny_model):
    # transformers compiles only on CUDA; its own test switch compiles on the CPU too (inductor, ~1-2 min). In a
    # fresh Python: dynamo's caches and torch's settings are process-wide, and the suite's earlier tests leave theirs
    out = run_script("-c", COMPILED_DECODE, tiny_model, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
