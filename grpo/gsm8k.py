"""The GSM8K task, shared by training (grpotrainer.py) and evaluation (evaluate.py): prompts, data, scoring.

Both scripts import this module and never each other, so a before/after accuracy is measured with exactly the prompt,
chat template and grader that training used (grpo/grading.py's `grade`: no credit for thinking that never closed,
for a cut-off completion, or for one that repeats or pads past its answer). Metrics (`KEYS`): strict_accuracy (the
last '####' number), lenient_accuracy (any answer form the grader reads), format_rate, mean_completion_tokens,
truncated_rate, padded_rate (the share that repeats or pads past its answer: after training, no higher than before);
a lenient accuracy far above the strict one means the model solves the problems but ignores the asked format.
Sampled accuracy (`SAMPLED_KEYS`): k completions per problem at a temperature, c/k per problem (pass@1 estimated
from k) averaged over problems: at training's TEMPERATURE, what GRPO's correctness reward pays on average.
"""

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path

from grpo import errors, grading, hardware, hub
from grpo.errors import ConfigError

# The instruction before every problem; grpotrainer.py and evaluate.py start from this default.
SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, showing each calculation. "
    "Then write the final answer on its own last line as '#### <number>', with no units."
)
FIXTURE = Path(__file__).resolve().parents[1] / "data" / "smoke_gsm8k.jsonl"  # our own 32 problems, for --smoke
KEYS = (
    "n",
    "strict_accuracy",
    "lenient_accuracy",
    "format_rate",
    "mean_completion_tokens",
    "truncated_rate",
    "padded_rate",
)
SCALARS = {
    "strict_accuracy": "eval/gsm8k_strict_accuracy",
    "lenient_accuracy": "eval/gsm8k_lenient_accuracy",
    "format_rate": "eval/gsm8k_format_rate",
    "sampled_accuracy": "eval/gsm8k_sampled_accuracy",
    "sampled_strict_accuracy": "eval/gsm8k_sampled_strict_accuracy",
}
CONTEXT_MARGIN = 64  # tokens of vLLM context over the longest prompt plus a completion (see `context_length`)
SAMPLED_KEYS = ("samples", "sample_temperature", "sampled_accuracy", "sampled_strict_accuracy")
log = logging.getLogger("grpotrainer.gsm8k")


# ---------------------------------------------------------------------------------------------------------------
# Prompts and data


# The longest row a local dataset may hold: GSM8K's longest line (train and test) is 1,744 characters, so a row 37
# times longer is not a word problem; refused with its line number instead of stalling tokenization for minutes.
MAX_ROW_CHARS = 64 * 1024
# What a gold '#### N' holds: a number, perhaps after $, and then no other digit (units may follow, "#### 18 pens")
GOLD_NUMBER = re.compile(r"[ \t]*\$?[ \t]*-?[0-9][0-9,]*(?:\.[0-9]+)?(?P<rest>.*)", re.S)


def make_prompt(question, system_prompt=SYSTEM_PROMPT):
    """Chat messages for one problem: the system prompt, then the question.

    >>> make_prompt("1+1?", "Be brief.")
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': '1+1?'}]
    """
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]


def load(
    dataset, split="train", *, config="main", limit=0, skip_bad_rows=False, system_prompt=SYSTEM_PROMPT, name="DATASET"
):
    """GSM8K (or a local file in its format) as a Dataset with `prompt` (chat messages), `answer` and `solution` (the
    gold number, under both names so that TRL's own rewards, which read `solution`, run beside ours) and `question`.

    `dataset` is a Hub id (with `config`), a .jsonl file, or a folder holding {split}.jsonl. Rows whose answer has no
    '#### N' are an error naming them, or are dropped with `skip_bad_rows`. `limit` keeps the first N usable rows.
    """
    rows, source = (
        _read_local(dataset, split, name) if hub.is_local(dataset) else _read_hub(dataset, config, split, name)
    )
    golds = [gold_answer(row["answer"]) for row in rows]
    if bad := [i for i, gold in enumerate(golds) if gold is None]:
        shown = "; ".join(f"{rows[i].get('line', f'row {i + 1}')}: ...{rows[i]['answer'][-40:]!r}" for i in bad[:3])
        if not skip_bad_rows:
            raise ConfigError(
                f"{len(bad)} of {len(rows)} rows of {name} {source} have no '#### N' answer that reads as one number, "
                f"e.g. {shown}.\nFix those rows, or set SKIP_BAD_ROWS=True to train without them."
            )
        log.warning("skipping %d rows without a '#### N' answer (SKIP_BAD_ROWS=True), e.g. %s", len(bad), shown)
    keep = [i for i, gold in enumerate(golds) if gold is not None][: limit or None]
    import datasets

    questions = [rows[i]["question"] for i in keep]
    return datasets.Dataset.from_dict(
        {
            "prompt": [make_prompt(q, system_prompt) for q in questions],
            "answer": [golds[i] for i in keep],
            "solution": [golds[i] for i in keep],
            "question": questions,
        }
    )


def gold_answer(answer):
    """The gold number of a GSM8K answer ("... #### 1,080" -> "1080"), or None when it has none, or when the text
    after its '####' holds more digits than the number read (`#### 1e3`, `#### 1 000`): such a row is refused
    rather than trained on as 1.

    >>> [gold_answer(a) for a in ("3 * 6 = 18\\n#### 18", "#### $1,000", "#### 1e3", "#### 1 000")]
    ['18', '1000', None, None]
    """
    value = grading.extract_hash_answer(answer)
    number = GOLD_NUMBER.match(answer.rpartition("####")[2])
    return value if value is not None and number and not re.search("[0-9]", number["rest"]) else None


def _read_hub(dataset, config, split, name):
    if problem := hub.hub_unreachable(dataset, name, repo_type="dataset"):
        raise ConfigError(problem)
    import datasets

    try:
        ds = datasets.load_dataset(dataset, config, split=split)
    except (OSError, ValueError) as err:  # not found, offline, a connection (OSError); a bad config or split
        raise ConfigError(
            f"{name} {dataset!r} could not be loaded from the Hugging Face Hub ({errors.first_line(err)}).\n"
            f"Without Hub access, point {name} at a local GSM8K-format .jsonl file or folder (see README)."
        ) from None
    if missing := {"question", "answer"} - set(ds.column_names):
        raise ConfigError(f"{name} {dataset} lacks the column(s) {sorted(missing)}; GSM8K rows have question, answer.")
    return [{"question": q, "answer": a} for q, a in zip(ds["question"], ds["answer"], strict=True)], dataset


def _read_local(dataset, split, name):
    """The rows of a GSM8K-format .jsonl file, checked line by line: every problem names its line number.

    Read by hand rather than with datasets' JSON builder, whose errors name neither the line nor the field.
    A byte-order mark and blank lines are tolerated.
    """
    path = Path(dataset)
    path = path / f"{split}.jsonl" if path.is_dir() else path
    where = f"{name}={dataset}" + (f" ({split} split)" if path.name == f"{split}.jsonl" else "")
    if not path.is_file():
        raise ConfigError(
            f"{where} points at {path}, which {'is not a regular file' if path.exists() else 'does not exist'}.\n"
            "Give a GSM8K-format .jsonl file "
            '(one {"question": ..., "answer": "... #### N"} per line), a folder with train.jsonl and test.jsonl, '
            "or the Hub id openai/gsm8k."
        )
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{where}: {path} is not UTF-8 text (line {line}, byte {err.start}); save it as UTF-8."
        ) from None
    rows, problems = [], []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if len(line) > MAX_ROW_CHARS:  # before json.loads and the grader, which a megabyte row would stall
            problems.append(f"line {number}: {len(line)} characters, above the bound of {MAX_ROW_CHARS} per row")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            problems.append(f"line {number}: not JSON ({err.msg})")
            continue
        if not isinstance(row, dict):
            problems.append(f"line {number}: a {type(row).__name__}, not an object")
            continue
        for key in ("question", "answer"):
            if not isinstance(row.get(key), str) or not row[key].strip():
                what = "missing" if key not in row else "empty" if row[key] == "" else f"a {type(row[key]).__name__}"
                problems.append(f"line {number}: {key!r} is {what}, not text")
        rows.append({**row, "line": f"line {number}"})
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ConfigError(
            f"{where}: {path} has bad rows: {'; '.join(problems[:3])}{more}.\nEach line must be "
            '{"question": "...", "answer": "... #### N"}.'
        )
    if not rows:
        raise ConfigError(f"{where}: {path} holds no problems; give a GSM8K-format .jsonl file with rows.")
    return rows, path


# ---------------------------------------------------------------------------------------------------------------
# Grading and scoring


def score(golds, completions, completion_tokens=None, truncated=None):
    """The metrics dict (keys `KEYS`) for completions graded against their gold answers; pure, no model.

    Shares are rounded to 4 decimals, so 1 of 3 is 0.3333.

    >>> m = score(["18", "5", "7"], ["#### 18", "The answer is 5.", "#### 8"], [4, 6, 2])
    >>> m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"], m["mean_completion_tokens"]
    (3, 0.3333, 0.6667, 0.6667, 4.0)
    """
    truncated = truncated or [False] * len(completions)
    graded = [
        {**grading.grade(c, g, truncated=t), "truncated": t}
        for c, g, t in zip(completions, golds, truncated, strict=True)
    ]
    return summarize(graded, completion_tokens or [0] * len(graded))


def summarize(graded, completion_tokens):
    """The metrics of already graded completions (dicts from `grade`, with `truncated`) and their token counts."""
    n = len(graded)

    def share(key):
        return round(sum(bool(g.get(key)) for g in graded) / n, 4) if n else 0.0

    return {
        "n": n,
        "strict_accuracy": share("strict_correct"),
        "lenient_accuracy": share("correct"),
        "format_rate": share("formatted"),
        "mean_completion_tokens": round(sum(completion_tokens) / n, 2) if n else 0.0,
        "truncated_rate": share("truncated"),
        "padded_rate": share("padded"),
    }


def sampled_metrics(golds, completions, samples, temperature, thinking=False, truncated=None):
    """The sampled-accuracy metrics (keys `SAMPLED_KEYS`) of `samples` completions per problem; pure, no model.

    `completions` are problem-major: the first `samples` belong to golds[0], the next to golds[1], ... For one
    problem with c correct of k, c/k is the unbiased estimate of the chance that one sample is correct (pass@1);
    sampled_accuracy is its mean over the problems, rounded to 4 decimals.

    >>> sampled_metrics(["18", "5"], ["#### 18", "The answer is 18.", "#### 4", "#### 5"], 2, 1.0)
    {'samples': 2, 'sample_temperature': 1.0, 'sampled_accuracy': 0.75, 'sampled_strict_accuracy': 0.5}
    """
    if len(completions) != len(golds) * samples:
        raise ValueError(f"{len(completions)} completions for {len(golds)} problems x {samples} samples")
    truncated = truncated or [False] * len(completions)
    graded = [
        grading.grade(c, golds[i // samples], truncated=truncated[i], thinking=thinking)
        for i, c in enumerate(completions)
    ]

    def mean_per_problem(key):
        per_problem = [sum(g[key] for g in graded[i : i + samples]) / samples for i in range(0, len(graded), samples)]
        return round(sum(per_problem) / len(per_problem), 4) if per_problem else 0.0

    return {
        "samples": samples,
        "sample_temperature": temperature,
        "sampled_accuracy": mean_per_problem("correct"),
        "sampled_strict_accuracy": mean_per_problem("strict_correct"),
    }


# ---------------------------------------------------------------------------------------------------------------
# Generating and evaluating


def generate_all(dataset, generate, batch_size, desc="GSM8K", progress=True):
    """Run `generate` over the dataset's prompts in batches, with a progress bar.

    `generate(prompts)` takes a list of chat prompts (lists of messages) and returns one `(text, n_tokens, truncated)`
    per prompt: `hf_generator` and `vllm_generator` make one from a model, and a test can pass a stub.
    Returns one row per problem: question, gold, completion, completion_tokens, truncated.
    """
    from tqdm.auto import tqdm

    rows = []
    with tqdm(total=len(dataset), desc=desc, unit="problem", disable=not (progress and len(dataset))) as bar:
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start : start + batch_size]
            outputs = generate(batch["prompt"])
            if len(outputs) != len(batch["prompt"]):
                raise RuntimeError(f"the generator returned {len(outputs)} completions for {len(batch['prompt'])}")
            for question, gold, (text, n_tokens, cut) in zip(batch["question"], batch["answer"], outputs, strict=True):
                rows.append(
                    {
                        "question": question,
                        "gold": gold,
                        "completion": text,
                        "completion_tokens": n_tokens,
                        "truncated": cut,
                    }
                )
            bar.update(len(batch["prompt"]))
    return rows


def sample_all(dataset, generate, samples, batch_size, desc="GSM8K", progress=True, seed=0):
    """`samples` completions per problem from a sampling `generate`, problem-major, as `generate_all` returns rows.

    The random state is seeded with `seed` for the sampling and restored afterwards, so a training run's own
    sampling stream is the same with or without this evaluation.
    """
    repeated = dataset.select([i for i in range(len(dataset)) for _ in range(samples)])
    with seeded(seed):
        return generate_all(repeated, generate, batch_size, f"{desc}, {samples} samples each", progress)


@contextlib.contextmanager
def seeded(seed):
    """torch's random state seeded with `seed` inside the block and put back as it was after it."""
    import torch

    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def results(rows, seconds, thinking=False, sampled_rows=(), samples=0, temperature=0.0):
    """The metrics and the prediction records (question, gold, completion, extracted, correct, ...) of `rows`;
    with `sampled_rows` (from `sample_all`) the sampled-accuracy metrics too."""
    predictions = [
        {**r, **grading.grade(r["completion"], r["gold"], truncated=r["truncated"], thinking=thinking)} for r in rows
    ]
    metrics = summarize(predictions, [r["completion_tokens"] for r in rows])
    if samples:
        golds, completions = [r["gold"] for r in sampled_rows[::samples]], [r["completion"] for r in sampled_rows]
        cut = [r["truncated"] for r in sampled_rows]
        metrics |= sampled_metrics(golds, completions, samples, temperature, thinking, cut)
    return {**metrics, "seconds": round(seconds, 2)}, predictions


def evaluate(dataset, generate, batch_size, desc="GSM8K", thinking=False, *, sampler=None, samples=0, temperature=0.0):
    """Generate for every problem of `dataset` (columns prompt, answer, question) and score: (metrics, predictions).

    With `samples` > 0, `sampler` (a `generate` that samples at `temperature`) also writes that many completions per
    problem, scored as sampled accuracy (see `sampled_metrics`).
    """
    start = time.perf_counter()
    rows = generate_all(dataset, generate, batch_size, desc)
    sampled = sample_all(dataset, sampler, samples, batch_size, desc) if samples else []
    return results(rows, time.perf_counter() - start, thinking, sampled, samples, temperature)


def report(metrics, predictions, output_dir, stem, logdir=None, step=0, title="GSM8K", settings=None):
    """Print the table; write <stem>.json (the metrics and, under "settings", what they were measured with) and
    <stem>_predictions.jsonl; log the TensorBoard scalars at `step` when `logdir` is given."""
    print(format_table(metrics, title), flush=True)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {**metrics, "step": step, "settings": settings or {}}
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    with open(out / f"{stem}_predictions.jsonl", "w", encoding="utf-8") as f:
        for p in predictions:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    if logdir:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(logdir)) as writer:
            for key, tag in SCALARS.items():
                if key in metrics:  # the sampled accuracy only when it was measured
                    writer.add_scalar(tag, metrics[key], step)
    log.info(
        "wrote %s/%s.json and %s_predictions.jsonl%s", out, stem, stem, f"; TensorBoard: {logdir}" if logdir else ""
    )


def format_table(metrics, title="GSM8K"):
    """The metrics as a small aligned text table."""
    lines = [title, *(f"  {key:<24}{value:>10}" for key, value in metrics.items())]
    return "\n".join(lines)


def eos_ids(model, tokenizer):
    """Token ids that end a completion, by GRPOTrainer's rule: the tokenizer's EOS, then the generation config's
    (Qwen3: <|im_end|>, <|endoftext|>). A converted folder may name another EOS than the end of turn its generation
    config stops at (SmolLM2's GGUF: <|im_start|> and <|im_end|>): then either ends a completion, as in training.

    >>> from types import SimpleNamespace as NS
    >>> eos_ids(NS(generation_config=NS(eos_token_id=2)), NS(eos_token_id=1))
    [1, 2]
    >>> eos_ids(NS(generation_config=NS(eos_token_id=[2, 0])), NS(eos_token_id=2))
    [2, 0]
    """
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos = [tokenizer.eos_token_id, *eos]
    return eos


def hf_generator(
    model, tokenizer, max_new_tokens, enable_thinking=False, temperature=0.0, cache_implementation="dynamic", eos=None
):
    """A `generate(prompts, temperature=temperature)` for `generate_all` on a transformers model, as training
    generates: its chat template and `enable_thinking`, left padding, greedy at temperature 0 else sampled from the
    full distribution (no top-k or top-p, GRPOTrainer's default). Tokens are counted up to and including the first
    end-of-turn token (`eos`, a trainer's `eos_token_ids`, else `eos_ids`) and the text decoded without special
    tokens, as TRL does for the rewards; no end-of-turn token means cut off. A tokenizer without a pad token is
    given the first end-of-turn token, as GRPOTrainer does."""
    import torch
    from transformers import GenerationConfig

    eos = eos_ids(model, tokenizer) if eos is None else list(eos)
    if not eos:
        raise ConfigError(
            "the model names no EOS token in its tokenizer or generation config, so no completion could end.\n"
            "Set eos_token_id in the model folder's generation_config.json to its end-of-turn token."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos[0])
    pad = tokenizer.pad_token_id

    def generate(prompts, temperature=temperature):
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
        config = GenerationConfig(
            **{"do_sample": False, **sampling}, max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad
        )
        texts = [
            tokenizer.apply_chat_template(
                p, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
            )
            for p in prompts
        ]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        inputs = inputs.to(model.device)
        with torch.no_grad():
            output = model.generate(
                **inputs, generation_config=config, **hardware.decode_options(cache_implementation)
            )
        outputs = []
        for ids in output[:, inputs["input_ids"].shape[1] :].tolist():
            end = next((i for i, t in enumerate(ids) if t in eos), None)
            n_tokens = len(ids) if end is None else end + 1
            outputs.append((tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens, end is None))
        return outputs

    return generate


def longest_prompt(dataset, model_name, enable_thinking=False, trust_remote_code=False):
    """The token count of the longest prompt of `dataset` as training and evaluation render it: MODEL_NAME's chat
    template with the generation prompt. Loads only the tokenizer (a second for all of GSM8K's train split)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name, trust_remote_code=trust_remote_code)
    texts = [
        tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)
        for p in dataset["prompt"]
    ]
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def context_length(prompt_tokens, max_completion_length):
    """vLLM's context bound for a GSM8K run, training's `vllm_max_model_length` and evaluation's `max_model_len`:
    the longest prompt plus a whole completion plus CONTEXT_MARGIN. Without it vLLM reserves KV cache for the
    model's full context (40,960 positions for Qwen3-8B) when a prompt and its completion need ~1,300.

    >>> context_length(180, 256)
    500
    """
    return prompt_tokens + max_completion_length + CONTEXT_MARGIN


def vllm_generator(
    model_name,
    adapter,
    *,
    prompt_tokens,
    max_completion_length,
    enable_thinking,
    bf16,
    trust_remote_code,
    gpu_memory_utilization,
    temperature=0.0,
):
    """A `generate(prompts, temperature=temperature)` backed by vLLM, greedy at temperature 0, with the adapter (if
    any) as a LoRA request. One engine serves every temperature. `prompt_tokens`: the longest prompt's length
    (`longest_prompt`), which bounds vLLM's context (`context_length`)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"] if adapter else 0
    llm = LLM(
        model=model_name,
        dtype="bfloat16" if bf16 else "float32",
        trust_remote_code=trust_remote_code,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=context_length(prompt_tokens, max_completion_length),
        enable_lora=bool(adapter),
        max_lora_rank=hardware.vllm_lora_rank(rank) if adapter else 16,
        seed=0,
    )
    lora = LoRARequest("adapter", 1, str(Path(adapter).resolve())) if adapter else None

    def generate(prompts, temperature=temperature):
        params = SamplingParams(temperature=temperature, max_tokens=max_completion_length)
        kwargs = {"enable_thinking": enable_thinking}
        outs = llm.chat(prompts, params, lora_request=lora, chat_template_kwargs=kwargs, use_tqdm=True)
        return [(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length") for o in outs]

    return generate


def summary_line(steps, started, metrics=(None, None), now=time.monotonic):
    """The one line a run ends with: its steps, its wall time since `started`, and the strict accuracy before ->
    after training when both were scored (`metrics`: before, after).

    >>> scored = ({"strict_accuracy": 0.25, "n": 64}, {"strict_accuracy": 0.5, "n": 64})
    >>> summary_line(50, 0.0, scored, now=lambda: 754.0)
    'finished: 50 steps in 12m34s; GSM8K strict accuracy 0.250 -> 0.500 (64 test problems)'
    """
    before, after = metrics
    minutes, seconds = divmod(round(now() - started), 60)
    line = f"finished: {steps} steps in {minutes}m{seconds:02d}s"
    if before and after:
        line += f"; GSM8K strict accuracy {before['strict_accuracy']:.3f} -> {after['strict_accuracy']:.3f}"
        line += f" ({after['n']} test problems)"
    elif after:
        line += f"; GSM8K strict accuracy after {after['strict_accuracy']:.3f} ({after['n']} test problems)"
    return line


def new_logdir(output_dir, suffix=""):
    """A new TensorBoard run folder, output_dir/runs/<date>_<host><suffix>, named as transformers names its runs."""
    from transformers.integrations.integration_utils import default_logdir

    return os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(output_dir, default_logdir() + suffix)
