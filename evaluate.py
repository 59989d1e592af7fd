"""Measure GSM8K accuracy of MODEL_NAME, alone or with a trained LoRA adapter, exactly as training prompts it.

    python evaluate.py                                       # the base model on the whole test split (1319 problems)
    python evaluate.py --ADAPTER=outputs/qwen3-gsm8k-grpo    # the adapter a run saved (or one of its checkpoint-N)
    python evaluate.py --LIMIT=200                           # a quick subset: the first 200 problems
    python evaluate.py --smoke                               # tiny model and fixture, offline on CPU, in seconds

A before/after accuracy means something only when both use the same prompt and the same extractor, so this file
reuses training's: grpotrainer.make_prompt (system prompt + question as chat messages), the chat template with
ENABLE_THINKING, and rewards' answer extractors. Decoding is greedy. It reports

    strict_accuracy         the number after the last '####' (GSM8K's official format) equals the gold answer
    lenient_accuracy        rewards.extract_answer ('####', \\boxed{}, 'the answer is', last number) equals the gold
    format_rate             share of completions with a readable '#### N'
    mean_completion_tokens  generated tokens per problem, the end-of-turn token included
    seconds                 wall time of the generation

A lenient accuracy far above the strict one means the model solves the problems but ignores the asked format.
Results go to OUTPUT_DIR/eval_<SPLIT>.json (these keys), every prediction to eval_<SPLIT>_predictions.jsonl, and
the scalars eval/gsm8k_strict_accuracy, eval/gsm8k_lenient_accuracy and eval/gsm8k_format_rate to a TensorBoard run
in OUTPUT_DIR/runs/.
grpotrainer.py calls `in_training` for EVAL_BEFORE / EVAL_AFTER, on the model it is training.
"""

import contextlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import cli
import grpotrainer
import preflight
import rewards
from cli import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# model (defaults follow grpotrainer.py, so that an adapter is evaluated on the base model it was trained from)
MODEL_NAME = grpotrainer.MODEL_NAME  # Hub id or local folder of the base model
ADAPTER = ""  # folder of a trained LoRA adapter (a run's OUTPUT_DIR or a checkpoint-N in it); "" = base model alone
TRUST_REMOTE_CODE = grpotrainer.TRUST_REMOTE_CODE  # run a model repo's own Python code
ATTN_IMPLEMENTATION = grpotrainer.ATTN_IMPLEMENTATION  # auto, flash_attention_2, sdpa or eager
BF16 = grpotrainer.BF16  # bfloat16 weights (CUDA); False = fp32
ENABLE_THINKING = grpotrainer.ENABLE_THINKING  # Qwen3 thinking mode; keep it as in training
# data
DATASET = grpotrainer.DATASET  # Hub id, or a .jsonl file / folder of {split}.jsonl in GSM8K format
DATASET_CONFIG = grpotrainer.DATASET_CONFIG  # Hub config name; ignored for local files
SPLIT = "test"  # test (1319 problems) or train
LIMIT = 0  # score only the first N problems; 0 = all
# generation
BATCH_SIZE = 64  # prompts per generate() call with transformers; lower it on out-of-memory
MAX_COMPLETION_LENGTH = grpotrainer.MAX_COMPLETION_LENGTH  # new tokens per answer; as in training, so numbers compare
USE_VLLM = True  # generate with vLLM when it is installed and a GPU is visible (several times faster); False = never
VLLM_GPU_MEMORY_UTILIZATION = 0.85  # share of GPU memory vLLM may take
# output
OUTPUT_DIR = ""  # eval_<SPLIT>.json, predictions and runs/ go here; "" = ADAPTER, or outputs/eval/<model> without
# ---------------------------------------------------------------------------------------------------------------

# --smoke: the tiny random Qwen3 that grpotrainer --smoke trains (built if missing) on the fixture, fp32 on CPU.
SMOKE = dict(
    DATASET=grpotrainer.SMOKE["DATASET"],
    OUTPUT_DIR=grpotrainer.SMOKE["OUTPUT_DIR"],
    LIMIT=8,
    BATCH_SIZE=4,
    MAX_COMPLETION_LENGTH=grpotrainer.SMOKE["MAX_COMPLETION_LENGTH"],
    BF16=False,
    USE_VLLM=False,
)
# grpotrainer's helpers (load_gsm8k, model_init_kwargs) read these from their own module, so main() hands them over.
SHARED = ("DATASET", "DATASET_CONFIG", "ATTN_IMPLEMENTATION", "BF16", "TRUST_REMOTE_CODE", "ENABLE_THINKING")
KEYS = ("n", "strict_accuracy", "lenient_accuracy", "format_rate", "mean_completion_tokens", "seconds")
SCALARS = {
    "strict_accuracy": "eval/gsm8k_strict_accuracy",
    "lenient_accuracy": "eval/gsm8k_lenient_accuracy",
    "format_rate": "eval/gsm8k_format_rate",
}
log = logging.getLogger("grpotrainer.evaluate")


def grade(completion, gold):
    """One completion against its gold answer: what the lenient extractor reads, and the three verdicts.

    >>> grade("9 * 2 = 18\\n#### 18", "18")
    {'extracted': '18', 'correct': True, 'strict_correct': True, 'formatted': True}
    >>> grade("So the answer is \\\\boxed{18}.", "18")
    {'extracted': '18', 'correct': True, 'strict_correct': False, 'formatted': False}
    """
    text = rewards.completion_to_text(completion)
    extracted, strict = rewards.extract_answer(text), rewards.extract_hash_answer(text)
    return {
        "extracted": extracted,
        "correct": rewards.answers_match(extracted, gold),
        "strict_correct": rewards.answers_match(strict, gold),
        "formatted": strict is not None,
    }


def score(golds, completions, completion_tokens=None, seconds=0.0):
    """The metrics dict (keys `KEYS`) for completions graded against their gold answers; pure, no model.

    Shares are rounded to 4 decimals, so 1 of 3 is 0.3333.

    >>> m = score(["18", "5", "7"], ["#### 18", "The answer is 5.", "#### 8"], [4, 6, 2], seconds=1.5)
    >>> m["n"], m["strict_accuracy"], m["lenient_accuracy"], m["format_rate"], m["mean_completion_tokens"]
    (3, 0.3333, 0.6667, 0.6667, 4.0)
    """
    graded = [grade(c, g) for c, g in zip(completions, golds, strict=True)]
    return summarize(graded, completion_tokens or [0] * len(graded), seconds)


def summarize(graded, completion_tokens, seconds):
    """The metrics of already graded completions (dicts from `grade`) and their token counts."""
    n = len(graded)

    def share(key):
        return round(sum(g[key] for g in graded) / n, 4) if n else 0.0

    return {
        "n": n,
        "strict_accuracy": share("strict_correct"),
        "lenient_accuracy": share("correct"),
        "format_rate": share("formatted"),
        "mean_completion_tokens": round(sum(completion_tokens) / n, 2) if n else 0.0,
        "seconds": round(seconds, 2),
    }


def generate_all(dataset, generate, batch_size, desc="GSM8K", progress=True):
    """Run `generate` over the dataset's prompts in batches, with a progress bar.

    `generate(prompts)` takes a list of chat prompts (lists of messages) and returns one `(text, n_tokens)` pair per
    prompt: `hf_generator` and `vllm_generator` make one from a model, and a test can pass a stub with fixed outputs.
    Returns one row per problem: question, gold, completion, completion_tokens.
    """
    from tqdm.auto import tqdm

    rows = []
    with tqdm(total=len(dataset), desc=desc, unit="problem", disable=not (progress and len(dataset))) as bar:
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start : start + batch_size]
            outputs = generate(batch["prompt"])
            if len(outputs) != len(batch["prompt"]):
                raise RuntimeError(f"the generator returned {len(outputs)} completions for {len(batch['prompt'])}")
            for question, gold, (text, n_tokens) in zip(batch["question"], batch["answer"], outputs, strict=True):
                rows.append({"question": question, "gold": gold, "completion": text, "completion_tokens": n_tokens})
            bar.update(len(batch["prompt"]))
    return rows


def results(rows, seconds):
    """The metrics and the prediction records (question, gold, completion, extracted, correct, ...) of `rows`."""
    predictions = [{**r, **grade(r["completion"], r["gold"])} for r in rows]
    return summarize(predictions, [r["completion_tokens"] for r in rows], seconds), predictions


def evaluate(dataset, generate, batch_size, desc="GSM8K"):
    """Generate for every problem of `dataset` (columns prompt, answer, question) and score: (metrics, predictions)."""
    start = time.perf_counter()
    rows = generate_all(dataset, generate, batch_size, desc)
    return results(rows, time.perf_counter() - start)


def report(metrics, predictions, output_dir, stem, logdir=None, step=0, title="GSM8K"):
    """Print the table, write <stem>.json and <stem>_predictions.jsonl, and log the TensorBoard scalars at `step`."""
    print(format_table(metrics, title), flush=True)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    with open(out / f"{stem}_predictions.jsonl", "w", encoding="utf-8") as f:
        for p in predictions:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    if logdir:
        from torch.utils.tensorboard import SummaryWriter

        with SummaryWriter(log_dir=str(logdir)) as writer:
            for key, tag in SCALARS.items():
                writer.add_scalar(tag, metrics[key], step)
    log.info(
        "wrote %s/%s.json and %s_predictions.jsonl%s", out, stem, stem, f"; TensorBoard: {logdir}" if logdir else ""
    )


def format_table(metrics, title="GSM8K"):
    """The metrics as a small aligned text table."""
    lines = [title, *(f"  {key:<24}{value:>10}" for key, value in metrics.items())]
    return "\n".join(lines)


def eos_ids(model, tokenizer):
    """Token ids that end a completion: the generation config's (Qwen3: <|im_end|>, <|endoftext|>), else the EOS."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = tokenizer.eos_token_id if eos is None else eos
    return [eos] if isinstance(eos, int) else list(eos)


def hf_generator(model, tokenizer, max_new_tokens, enable_thinking=False):
    """A `generate(prompts)` for `generate_all` on a transformers model: chat template, left padding, greedy.

    Prompts are rendered with the same chat template and `enable_thinking` as training, left-padded so that every
    prompt ends right where generation starts, and decoded greedily. Each completion's tokens are counted up to and
    including the first end-of-turn token (the rest is padding), as TRL counts them; its text is decoded without
    special tokens, as TRL decodes it for the rewards.
    """
    import torch
    from transformers import GenerationConfig

    eos = eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos, pad_token_id=pad)

    def generate(prompts):
        texts = [
            tokenizer.apply_chat_template(
                p, tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking
            )
            for p in prompts
        ]
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        inputs = inputs.to(model.device)
        with torch.no_grad():
            output = model.generate(**inputs, generation_config=config)
        outputs = []
        for ids in output[:, inputs["input_ids"].shape[1] :].tolist():
            end = next((i for i, t in enumerate(ids) if t in eos), None)
            n_tokens = len(ids) if end is None else end + 1
            outputs.append((tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens))
        return outputs

    return generate


def vllm_generator(adapter=""):
    """A `generate(prompts)` backed by vLLM, with the adapter as a LoRA request; reads this module's constants."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"] if adapter else 0
    llm = LLM(
        model=MODEL_NAME,
        dtype="bfloat16" if BF16 else "float32",
        trust_remote_code=TRUST_REMOTE_CODE,
        gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION,
        max_model_len=MAX_COMPLETION_LENGTH + 1024,  # GSM8K prompts are well under 1024 tokens
        enable_lora=bool(adapter),
        max_lora_rank=next((r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= rank), rank) if adapter else 16,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=MAX_COMPLETION_LENGTH)
    lora = LoRARequest("adapter", 1, str(Path(adapter).resolve())) if adapter else None

    def generate(prompts):
        outs = llm.chat(
            prompts,
            params,
            lora_request=lora,
            chat_template_kwargs={"enable_thinking": ENABLE_THINKING},
            use_tqdm=True,
        )
        return [(o.outputs[0].text, len(o.outputs[0].token_ids)) for o in outs]

    return generate


def load_model(smoke=False):
    """MODEL_NAME with ADAPTER applied (when given), in eval mode, and its tokenizer, through transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cuda = preflight.on_gpu(smoke)
    kwargs = grpotrainer.model_init_kwargs(smoke)
    try:
        model = AutoModelForCausalLM.from_pretrained(
            MODEL_NAME, **kwargs, trust_remote_code=TRUST_REMOTE_CODE, device_map="auto" if cuda else None
        )
    except OSError as err:
        raise ConfigError(f"MODEL_NAME {MODEL_NAME!r} could not be loaded: {err}") from None
    has_tokenizer = ADAPTER and (Path(ADAPTER) / "tokenizer_config.json").exists()  # trainer.save_model writes one
    tokenizer = AutoTokenizer.from_pretrained(
        ADAPTER if has_tokenizer else MODEL_NAME, padding_side="left", trust_remote_code=TRUST_REMOTE_CODE
    )
    if ADAPTER:
        from peft import PeftModel

        if base := preflight.other_base_model(ADAPTER, MODEL_NAME):
            log.warning("ADAPTER was trained on %s but MODEL_NAME is %s: set MODEL_NAME=%s", base, MODEL_NAME, base)
        model = PeftModel.from_pretrained(model, ADAPTER)
    if not cuda and kwargs["dtype"] == "bfloat16":
        model = model.to(torch.float32)  # bf16 matmuls on CPU are slow and not what a GPU would compute
    return model.eval(), tokenizer


def check(smoke=False):
    """Settings that would fail after the model has loaded, reported at once, naming the constant to change."""
    problems = []
    config = Path(ADAPTER) / "adapter_config.json"
    if ADAPTER and not config.is_file():
        problems.append(
            f"ADAPTER={ADAPTER!r} is not a folder holding a LoRA adapter (no adapter_config.json there). Point it "
            "at a training run's OUTPUT_DIR (e.g. outputs/qwen3-gsm8k-grpo) or a checkpoint-N folder in it; "
            'ADAPTER="" evaluates the base model alone.'
        )
    if LIMIT < 0:
        problems.append(f"LIMIT is {LIMIT}; give the number of problems to score, or 0 for all of them.")
    if BATCH_SIZE < 1:
        problems.append(f"BATCH_SIZE is {BATCH_SIZE}; give at least 1 (lower it from 64 only on out-of-memory).")
    if MAX_COMPLETION_LENGTH < 1:
        problems.append(f"MAX_COMPLETION_LENGTH is {MAX_COMPLETION_LENGTH}; GSM8K solutions need ~100-250 tokens.")
    if SPLIT not in ("train", "test"):
        problems.append(f"SPLIT {SPLIT!r} must be test or train (GSM8K has no other split).")
    if problems:
        raise ConfigError("\n\n".join(problems))
    if not smoke and not preflight.cuda_available():
        log.warning("no CUDA GPU is visible: generating on CPU is slow; consider a small LIMIT")


def adapter_step(adapter):
    """The training step an adapter was saved at: a checkpoint-N's own trainer_state.json, or for a run's final
    adapter its newest checkpoint's (transformers always checkpoints the last step); 0 when unknown."""
    if not adapter:
        return 0
    state = Path(adapter) / "trainer_state.json"
    if not state.is_file() and (newest := preflight.newest_checkpoint(adapter)) is not None:
        state = newest / "trainer_state.json"
    return json.loads(state.read_text()).get("global_step", 0) if state.is_file() else 0


def new_logdir(output_dir, suffix=""):
    """A new TensorBoard run folder, output_dir/runs/<date>_<host><suffix>, named as transformers names its runs."""
    from transformers.integrations.integration_utils import default_logdir

    return os.environ.get("TENSORBOARD_LOGGING_DIR") or os.path.join(output_dir, default_logdir() + suffix)


def main(argv=()):
    global MODEL_NAME, OUTPUT_DIR
    smoke, overrides = cli.parse(sys.modules[__name__], argv)
    logging.basicConfig(level=logging.INFO, format="[evaluate] %(message)s")
    check(smoke)
    if not OUTPUT_DIR:  # next to the adapter it scores, so that scoring the base model never overwrites it
        OUTPUT_DIR = ADAPTER or os.path.join("outputs", "eval", Path(MODEL_NAME).name)
    if smoke and "MODEL_NAME" not in overrides:
        from smoke import ensure_model_dir

        MODEL_NAME = ensure_model_dir(Path(OUTPUT_DIR) / "smoke-model")

    for name in SHARED:  # grpotrainer's helpers read their own module's constants
        setattr(grpotrainer, name, globals()[name])
    dataset = grpotrainer.load_gsm8k(SPLIT, limit=LIMIT)
    vllm = USE_VLLM and preflight.on_gpu(smoke) and preflight.importable("vllm")
    if vllm:
        generate, batch_size = vllm_generator(ADAPTER), len(dataset)  # vLLM schedules its own batches
    else:
        model, tokenizer = load_model(smoke)
        generate, batch_size = hf_generator(model, tokenizer, MAX_COMPLETION_LENGTH, ENABLE_THINKING), BATCH_SIZE
    name = MODEL_NAME + (f" + {ADAPTER}" if ADAPTER else "")
    log.info("%s on %d %s problems, greedy, with %s", name, len(dataset), SPLIT, "vLLM" if vllm else "transformers")

    metrics, predictions = evaluate(dataset, generate, batch_size, desc=f"GSM8K {SPLIT}")
    logdir = new_logdir(OUTPUT_DIR, suffix=f"_eval-{SPLIT}")
    report(metrics, predictions, OUTPUT_DIR, f"eval_{SPLIT}", logdir, adapter_step(ADAPTER), f"{name}, GSM8K {SPLIT}")
    return metrics


# ---------------------------------------------------------------------------------------------------------------
# EVAL_BEFORE / EVAL_AFTER: grpotrainer.py scores the model it is training, without loading a second copy.


def in_training(trainer, dataset, limit, when):
    """Score the trainer's model (LoRA adapter active) on the first `limit` test problems; rank 0 gets the metrics.

    `when` is "before" (logged at step 0) or "after" (at the final step). The scalars go into the TensorBoard run
    that training writes, so one run shows the baseline and the final accuracy; the files are
    OUTPUT_DIR/eval_test_<when>.json and eval_test_<when>_predictions.jsonl. `dataset` is the test split, loaded by
    the caller before any weights (grpotrainer.load_gsm8k, so a missing file fails early); the prompts, chat
    template kwargs and completion length are training's own; the batch size is this module's BATCH_SIZE.

    Under torchrun every process generates a contiguous shard of the problems and rank 0 gathers the rows: no rank
    idles at a barrier while another generates (NCCL would time out on a long evaluation), and N GPUs finish N
    times sooner. The model is put in eval mode (no LoRA dropout) without activation checkpointing and restored
    afterwards. DeepSpeed and FSDP shard or wrap the weights differently before and after `train()`, so there this
    is skipped with a warning: evaluate the saved adapter with evaluate.py instead.
    """
    if not limit:
        return None
    if trainer.is_deepspeed_enabled or trainer.is_fsdp_enabled:
        log.warning(
            "EVAL_%s is skipped: in-training evaluation supports single-process and torchrun (DDP) runs, not "
            "DeepSpeed or FSDP. Evaluate the saved adapter instead: python evaluate.py --ADAPTER=%s --LIMIT=%d",
            when.upper(),
            trainer.args.output_dir,
            limit,
        )
        return None
    from accelerate.utils import gather_object

    acc, args = trainer.accelerator, trainer.args
    dataset = dataset.select(range(min(limit, len(dataset))))
    per_rank = math.ceil(len(dataset) / acc.num_processes)
    lo = min(len(dataset), acc.process_index * per_rank)
    shard = dataset.select(range(lo, min(len(dataset), lo + per_rank)))
    thinking = (args.chat_template_kwargs or {}).get("enable_thinking", False)
    start = time.perf_counter()
    with generation_ready(trainer) as model:
        generate = hf_generator(model, trainer.processing_class, args.max_completion_length, thinking)
        rows = generate_all(shard, generate, BATCH_SIZE, f"GSM8K test, {when} training", acc.is_main_process)
    rows = gather_object(rows)  # every rank's rows, in rank order
    if not acc.is_main_process:
        return None
    metrics, predictions = results(rows, time.perf_counter() - start)
    step = 0 if when == "before" else trainer.state.global_step
    title = f"GSM8K test {when} training (step {step})"
    report(metrics, predictions, args.output_dir, f"eval_test_{when}", training_logdir(trainer), step, title)
    return metrics


@contextlib.contextmanager
def generation_ready(trainer):
    """The trainer's unwrapped model in eval mode without activation checkpointing, under no_grad; restored after.

    TRL's unwrap_model_for_generation (what GRPOTrainer itself generates under) turns activation checkpointing off
    and back on; eval mode switches LoRA dropout off for greedy decoding, and the train/eval mode is put back.
    """
    import torch
    from trl.models import unwrap_model_for_generation

    was_training = trainer.model.training
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
    ):
        model.eval()
        try:
            yield model
        finally:
            trainer.model.train(was_training)


def training_logdir(trainer):
    """The folder transformers' TensorBoardCallback writes this run's events to, fixed now if it is not yet.

    The callback picks OUTPUT_DIR/runs/<date>_<host> when training begins unless its `logging_dir` is already set;
    setting it before `train()` makes the baseline accuracy land in the same run as the training curves.
    """
    from monitor import tensorboard_callback

    callback = tensorboard_callback(trainer)
    if callback is None:
        return new_logdir(trainer.args.output_dir)
    callback.logging_dir = callback.logging_dir or new_logdir(trainer.args.output_dir)
    return callback.logging_dir


if __name__ == "__main__":
    cli.run(main)
