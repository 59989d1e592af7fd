"""Measure GSM8K accuracy of a model, alone or with a trained LoRA adapter, exactly as its training run prompted it.

    python evaluate.py                                       # the base model on the whole test split (1319 problems)
    python evaluate.py --ADAPTER=outputs/qwen3-gsm8k-grpo    # the adapter a run saved (or one of its checkpoint-N)
    python evaluate.py --LIMIT=200                           # a quick subset: the first 200 problems
    python evaluate.py --smoke                               # tiny model and fixture, offline on CPU, in seconds
    python evaluate.py --EVAL_SAMPLES=8                      # also the accuracy of 8 sampled answers per problem
    python evaluate.py --ADAPTER=outputs/run --BASELINE=outputs/eval/Qwen3-8B   # what changed, problem by problem
    python evaluate.py --ADAPTER=outputs/run --ASK="Tom has 3 pens and buys 4. How many?"   # try it on a question
    python evaluate.py --help                                # every constant with its comment

Prompts and grader are training's (grpo/gsm8k.py); results in OUTPUT_DIR/eval_<SPLIT>.json, its _predictions.jsonl.
"""

import functools
import hashlib
import logging
import os
from pathlib import Path

from demo import smoke
from grpo import checkpoints, cli, evaluation, files, generation, gsm8k, hardware, hub, preflight, process
from grpo.errors import ConfigError, is_load_error
from grpo.grading import extract_answer
from grpo.settings import problems as setting_problems

# ---------------------------------------------------------------------------------------------------------------
# model (with ADAPTER, the run's run_settings.json replaces these defaults; a --KEY=value here still wins)
MODEL_NAME = "Qwen/Qwen3-8B"  # Hub id or local folder of the base model
ADAPTER = ""  # folder of a trained LoRA adapter (a run's OUTPUT_DIR or a checkpoint-N in it); "" = base model alone
TRUST_REMOTE_CODE = False  # run a model repo's own Python code
ATTN_IMPLEMENTATION = "auto"  # auto = fastest installed on CUDA in bf16 (docs/gpu.md), else sdpa; or sdpa, eager, ...
BF16 = True  # bfloat16 weights (CUDA); False = fp32
ENABLE_THINKING = False  # Qwen3 thinking mode; keep it as in training
# data
DATASET = "openai/gsm8k"  # Hub id, or a .jsonl file / folder of {split}.jsonl in GSM8K format
DATASET_CONFIG = "main"  # Hub config name; ignored for local files
QUESTION_FIELD = "question"  # the dataset's column holding the problem
ANSWER_FIELD = "answer"  # the column holding the answer: a GSM8K solution ending "#### N", or a bare number
SYSTEM_PROMPT = gsm8k.DEFAULT_PROMPT  # the instruction before every problem, as in training
SPLIT = "test"  # test (1319 problems) or train
LIMIT = 0  # score only the first N problems; 0 = all
BASELINE = ""  # an earlier evaluation of the same problems (eval_<SPLIT>.json, or its folder): flips and exact test
ASK = []  # questions of your own (--ASK="..." once per question): each answer and what the grader reads; no scoring
# generation
EVAL_BATCH_SIZE = 64  # prompts per generate() call with transformers (old name BATCH_SIZE); lower it on out-of-memory
MAX_COMPLETION_LENGTH = 256  # new tokens per answer; as in training, so numbers compare
CACHE_IMPLEMENTATION = "dynamic"  # or static: static KV cache + compiled decode step (transformers; CUDA; ~1 min)
USE_VLLM = "auto"  # auto = vLLM when it imports and a GPU is visible (several times faster); or True, False
VLLM_GPU_MEMORY_UTILIZATION = 0.85  # share of GPU memory vLLM may take
EVAL_SAMPLES = 0  # answers sampled per problem (sampled accuracy, pass@k; old name SAMPLES); 0 = off
TEMPERATURE = 0.7  # their temperature (old name SAMPLE_TEMPERATURE); with ADAPTER the run's, as GRPO sampled
# output
OUTPUT_DIR = ""  # results go here; "" = ADAPTER (eval-checkpoint-N beside a checkpoint), else outputs/eval/<model>
REPORT_TO = "tensorboard"  # tensorboard, trackio, wandb, a list (tensorboard,wandb) or none
# ---------------------------------------------------------------------------------------------------------------

# --smoke: the tiny random Qwen3 of grpotrainer --smoke (built if missing) on the fixture, fp32 on CPU.
PROFILES = {"smoke": dict(DATASET=str(gsm8k.FIXTURE), LIMIT=8, EVAL_BATCH_SIZE=4, MAX_COMPLETION_LENGTH=32)}
PROFILES["smoke"] |= dict(BF16=False, USE_VLLM=False)
# What a run's run_settings.json decides for its adapter unless given here. Never a security setting: a folder
# someone sent must not switch on remote code, nor name a Hub kernel (code) as ATTN_IMPLEMENTATION.
FROM_RUN = ("MODEL_NAME", "ATTN_IMPLEMENTATION", "BF16", "ENABLE_THINKING", "DATASET", "DATASET_CONFIG")
FROM_RUN += ("QUESTION_FIELD", "ANSWER_FIELD", "SYSTEM_PROMPT", "MAX_COMPLETION_LENGTH", "TEMPERATURE")
log = logging.getLogger("grpotrainer.evaluate")


def resolve(argv):
    """The settings: defaults < --smoke < the adapter's run settings < this command line. Returns (settings, args)."""
    args = cli.parse(cli.constants(globals()), argv, PROFILES, source=__file__)
    for note in args.notes:  # an old name read as its constant (--SAMPLES is EVAL_SAMPLES here): a line each
        log.info(note)
    process.require(("torch", "transformers", "peft", "datasets"), "evaluate.py")  # before --smoke builds its model
    s = dict(args.settings)
    types = {key: type(s[key]) for key in FROM_RUN} | {"TEMPERATURE": float}  # what is read from the run
    run = files.run_settings(s["ADAPTER"], types) if s["ADAPTER"] else {}
    s.update({key: run[key] for key in FROM_RUN if key in run and key not in args.given})
    if s["ATTN_IMPLEMENTATION"] not in hardware.ATTENTION and "ATTN_IMPLEMENTATION" not in args.given:
        kernel, s["ATTN_IMPLEMENTATION"] = s["ATTN_IMPLEMENTATION"], args.settings["ATTN_IMPLEMENTATION"]
        log.warning("not using the run's ATTN_IMPLEMENTATION=%s (code from the Hub); give it here to use it", kernel)
    if args.profile == "smoke" and "MODEL_NAME" not in args.given and "MODEL_NAME" not in run:
        s["MODEL_NAME"] = smoke.cpu_model(smoke.SETTINGS["OUTPUT_DIR"])  # grpotrainer --smoke's, built if missing
    s["OUTPUT_DIR"] = s["OUTPUT_DIR"] or default_output_dir(s["ADAPTER"], s["MODEL_NAME"])
    return s, args


def default_output_dir(adapter, model_name):
    """Where results go when OUTPUT_DIR is "": beside what they score, but not in a checkpoint-N, which the trainer's
    rotation deletes whole. A base model gets its own: a Hub id as org--name, a folder as its name and `short_hash`."""
    if not adapter:
        local = hub.is_local(model_name)
        name = f"{Path(model_name).name}-{short_hash(model_name)}" if local else model_name.replace("/", "--")
        return os.path.join("outputs", "eval", name)
    path = Path(adapter)
    return str(path.parent / f"eval-{path.name}") if files.checkpoint_step(path) is not None else adapter


def results_name(s, given):
    """The stem of the result files: eval_<SPLIT> for the run's own data (or this file's), eval_<name>-<hash>_<SPLIT>
    when DATASET or DATASET_CONFIG is given here, so that a second dataset never overwrites the first."""
    if not {"DATASET", "DATASET_CONFIG"} & set(given):
        return f"eval_{s['SPLIT']}"
    dataset = s["DATASET"]
    identity = dataset if hub.is_local(dataset) else f"{dataset}:{s['DATASET_CONFIG']}"  # a file has no config
    return f"eval_{Path(dataset).stem}-{short_hash(identity)}_{s['SPLIT']}"


def short_hash(name):
    """8 hex digits of a local path's real path (symlinks and `..` resolved), or of a Hub id as it is."""
    key = os.path.realpath(name) if hub.is_local(name) else name
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:8]


def refuse_bad_settings(s, cpu_only=False):
    """Settings that would fail after the model has loaded, reported before any weights load."""
    problems = []
    if s["ADAPTER"] and not (Path(s["ADAPTER"]) / "adapter_config.json").is_file():
        problems.append(
            f"ADAPTER={s['ADAPTER']} holds no LoRA adapter (no adapter_config.json there).\n"
            'Point it at a training run\'s OUTPUT_DIR or a checkpoint-N in it; ADAPTER="" scores the base model.'
        )
    elif s["ADAPTER"] and (problem := checkpoints.adapter_problem(s["ADAPTER"])):
        problems.append(problem)
    problems += setting_problems(s, cli.comments(__file__)) + preflight.report_problems(s["REPORT_TO"])
    problems += preflight.tracker_problems(s["REPORT_TO"])
    if s["ENABLE_THINKING"] and s["MAX_COMPLETION_LENGTH"] < preflight.THINKING_MIN_TOKENS:
        problems.append(
            f"ENABLE_THINKING=True with MAX_COMPLETION_LENGTH={s['MAX_COMPLETION_LENGTH']}: thinking is cut off "
            f"before the answer, so nearly every problem scores 0.\nSet MAX_COMPLETION_LENGTH >= "
            f"{preflight.THINKING_MIN_TOKENS}, or ENABLE_THINKING=False."
        )
    problems += [preflight.model_name_problem(s["MODEL_NAME"]), preflight.output_dir_problem(s["OUTPUT_DIR"])]
    problems += [None if s["ASK"] else preflight.dataset_problem(s["DATASET"])]
    if problems := [p for p in problems if p]:  # path and value mistakes at once, before the checks that import torch
        raise ConfigError("\n\n".join(problems))
    attn = hardware.attention_problem(
        s["ATTN_IMPLEMENTATION"], cuda=hardware.on_gpu(cpu_only), bf16=s["BF16"], importable=hardware.importable
    )
    problems = [attn] if attn else []
    try:
        preflight.refuse_torn_model_folder(s["MODEL_NAME"])  # a local folder's tokenizer, whole weights (headers)
    except ConfigError as err:
        problems.append(str(err))
    if problems:
        raise ConfigError("\n\n".join(problems))
    if warning := preflight.thinking_ignored(s["MODEL_NAME"], s["ENABLE_THINKING"]):
        log.warning(warning)
    if not cpu_only and not hardware.cuda_available():
        log.warning("no CUDA GPU is visible: generating on CPU is slow; consider a small LIMIT")


def refuse_past_context(s, prompt_tokens):
    """Refuse a MAX_COMPLETION_LENGTH that takes the longest prompt (`prompt_tokens`) past the model's positions:
    generation would run on for hours where the model never trained, rather than stop (vLLM refuses it later)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(s["MODEL_NAME"], trust_remote_code=s["TRUST_REMOTE_CODE"])
    except (OSError, ValueError):  # unreadable or foreign: loading the model says why
        return
    positions = getattr(config.get_text_config(), "max_position_embeddings", None)
    if positions and prompt_tokens + s["MAX_COMPLETION_LENGTH"] > positions:
        raise ConfigError(
            f"MAX_COMPLETION_LENGTH={s['MAX_COMPLETION_LENGTH']} after the longest prompt ({prompt_tokens} tokens) "
            f"runs past {s['MODEL_NAME']}'s {positions} positions (max_position_embeddings).\n"
            f"Set MAX_COMPLETION_LENGTH <= {positions - prompt_tokens}."
        )


def load_model(s, cpu_only=False):
    """MODEL_NAME with ADAPTER applied (when given), in eval mode, and its tokenizer, through transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_name, adapter, remote = s["MODEL_NAME"], s["ADAPTER"], s["TRUST_REMOTE_CODE"]
    cuda = hardware.on_gpu(cpu_only)
    kwargs = hardware.model_init_kwargs(s["ATTN_IMPLEMENTATION"], s["BF16"], cpu_only, trust_remote_code=remote)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_name, **kwargs, device_map="auto" if cuda else None)
    except Exception as err:  # a folder torn or of another format is the user's to fix; anything else is a bug
        if not is_load_error(err):
            raise
        raise ConfigError(f"MODEL_NAME={model_name} could not be loaded: {err}") from None
    # the run's tokenizer, which trainer.save_model writes beside the adapter
    source = adapter if adapter and (Path(adapter) / "tokenizer_config.json").exists() else model_name
    tokenizer = AutoTokenizer.from_pretrained(source, padding_side="left", trust_remote_code=remote)
    if adapter:
        if base := checkpoints.other_base_model(adapter, model_name):
            log.warning("ADAPTER was trained on %s but MODEL_NAME is %s: set MODEL_NAME=%s", base, model_name, base)
        model = checkpoints.apply_adapter(model, adapter, model_name)
    if not cuda and kwargs["dtype"] == "bfloat16":
        model = model.to(torch.float32)  # bf16 matmuls on CPU are slow and not what a GPU would compute
    return model.eval(), tokenizer


def engine(s, cpu_only, prompt_tokens):
    """(generate, prompts per call, its name): vLLM when USE_VLLM allows and a GPU has it, else transformers."""
    cuda, share = hardware.on_gpu(cpu_only), s["VLLM_GPU_MEMORY_UTILIZATION"]
    # training's choice, a broken vllm named; the share is a number here, so no model, sequences or tokens size it
    vllm, share = generation.choose(
        s["USE_VLLM"], cuda, mode="colocate", share=share, model_name="", sequences=0, tokens=0
    )
    if vllm:
        generate = generation.vllm_generator(
            s["MODEL_NAME"],
            s["ADAPTER"],
            prompt_tokens=prompt_tokens,
            max_completion_length=s["MAX_COMPLETION_LENGTH"],
            enable_thinking=s["ENABLE_THINKING"],
            bf16=s["BF16"],
            trust_remote_code=s["TRUST_REMOTE_CODE"],
            gpu_memory_utilization=share,
        )
        return generate, 1 << 30, "vLLM"  # vLLM schedules its own batches
    # one thread on the CPU, as training: 17 times faster than torch's default 2 threads on 8 problems
    if not cuda:
        hardware.one_cpu_thread()
    with process.phase("loading the model"):
        model, tokenizer = load_model(s, cpu_only)
    length, thinking, cache = s["MAX_COMPLETION_LENGTH"], s["ENABLE_THINKING"], s["CACHE_IMPLEMENTATION"]
    generate = generation.hf_generator(model, tokenizer, length, thinking, cache_implementation=cache)
    return generate, s["EVAL_BATCH_SIZE"], "transformers"


def ask(s, generate, fold=False):
    """Each ASK question through the model as training prompts it: the answer, and what the grader reads in it."""
    prompts = [gsm8k.make_prompt(question, s["SYSTEM_PROMPT"], fold) for question in s["ASK"]]
    for question, (text, tokens, cut) in zip(s["ASK"], generate(prompts), strict=True):
        reads = extract_answer(text, truncated=cut, thinking=s["ENABLE_THINKING"]) or "no final answer"
        print(f"Q: {question}\nA: {text}\n-> the grader reads {reads} ({tokens} tokens{', cut off' * cut})\n")


def main(argv=()):
    process.setup_logging("evaluate")
    s, args = resolve(argv)
    cpu_only = args.profile is not None
    refuse_bad_settings(s, cpu_only)
    step = files.adapter_step(s["ADAPTER"])  # a trainer_state.json edited by hand is named before any work
    if s["ADAPTER"] and (newer := files.newer_checkpoint(s["ADAPTER"], step)):
        log.warning(newer)
    if problem := hub.hub_unreachable(s["MODEL_NAME"], "MODEL_NAME"):
        raise ConfigError(problem)  # in seconds, not after huggingface_hub's minute of retries
    fold = generation.refuses_system_turn(s["MODEL_NAME"], s["TRUST_REMOTE_CODE"])  # Gemma's, Mistral's templates
    if s["ASK"]:
        return ask(s, engine(s, cpu_only, prompt_tokens=512)[0], fold)
    options = dict(config=s["DATASET_CONFIG"], limit=s["LIMIT"], system_prompt=s["SYSTEM_PROMPT"], fold=fold)
    with process.phase("loading the data"):
        dataset = gsm8k.load(
            s["DATASET"], s["SPLIT"], question=s["QUESTION_FIELD"], answer=s["ANSWER_FIELD"], **options
        )
        stem = results_name(s, args.given)  # a second dataset gets its own files and TensorBoard run
        baseline = s["BASELINE"] and evaluation.load_baseline(s["BASELINE"], s["SPLIT"], dataset["question"], stem)
    prompt_tokens = generation.longest_prompt(dataset, s["MODEL_NAME"], s["ENABLE_THINKING"], s["TRUST_REMOTE_CODE"])
    refuse_past_context(s, prompt_tokens)
    generate, batch_size, engine_name = engine(s, cpu_only, prompt_tokens)
    name = s["MODEL_NAME"] + (f" + {s['ADAPTER']}" if s["ADAPTER"] else "")
    log.info("%s on %d %s problems, greedy, with %s", name, len(dataset), s["SPLIT"], engine_name)
    with process.phase(f"scoring {len(dataset)} {s['SPLIT']} problems"):
        metrics, predictions = evaluation.evaluate(
            dataset,
            generate,
            batch_size,
            f"GSM8K {s['SPLIT']}",
            s["ENABLE_THINKING"],
            sampler=functools.partial(generate, temperature=s["TEMPERATURE"]),  # one model or engine serves both
            samples=s["EVAL_SAMPLES"],
            temperature=s["TEMPERATURE"],
        )
    if baseline:  # the problems that flipped since BASELINE; the table below ends with the paired test
        before_metrics, before, where = baseline
        samples = (before_metrics.get("samples", 0), s["EVAL_SAMPLES"])
        metrics["paired"] = evaluation.compare(before, predictions, str(where), samples)
        flips = evaluation.flip_lines(before, predictions)
        print(f"flips against {where} ({len(flips)} problems):", *flips, sep="\n  ", flush=True)
    title = f"{name}, GSM8K {s['SPLIT']}"
    redo = f"the results in {s['OUTPUT_DIR']} may be half-written; the same command scores and writes them again"
    with process.phase("writing the results", redo), process.faults(s["OUTPUT_DIR"], then="rerun the same command"):
        evaluation.report(metrics, predictions, s["OUTPUT_DIR"], stem, step=step, title=title, settings=s)
        evaluation.to_trackers(metrics, s, stem, step, name, report_to=s["REPORT_TO"], out=s["OUTPUT_DIR"])
    if s["ADAPTER"] and not (Path(s["ADAPTER"]) / "adapter_config.json").is_file():
        gone = "was deleted or moved while it was scored: these are the scores of the weights read before"
        log.warning("ADAPTER=%s %s. %s", s["ADAPTER"], gone, checkpoints.GONE)
    return metrics


if __name__ == "__main__":
    process.run(main)
