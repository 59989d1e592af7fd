"""GRPO-tune a Qwen model on GSM8K with TRL's GRPOTrainer and LoRA.

    python grpotrainer.py                          # train with the constants below (CUDA GPU, bf16)
    python grpotrainer.py --smoke                  # the same pipeline offline on CPU in under a minute
    python grpotrainer.py --LEARNING_RATE=2e-5     # any constant can be overridden as --KEY=value
    torchrun --nproc_per_node 4 grpotrainer.py     # data-parallel; see configs/accelerate/ for DeepSpeed
    tensorboard --logdir outputs                   # watch train/reward, train/kl, ... (see README)

TRL does the GRPO loss, LoRA wrapping, logging, checkpointing and distributed launch. This file adds what GSM8K
needs: the prompt, the gold answers, the rewards (rewards.py) and checks that fail in seconds, not after an hour.
"""

import logging
import os
import sys
from pathlib import Path

import cli
import preflight
import rewards
from cli import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# model
MODEL_NAME = "Qwen/Qwen3-8B"  # Hub id, or a local folder holding config.json + weights (see README)
TRUST_REMOTE_CODE = False  # run a model repo's own Python code; Qwen3 needs none, so leave it off
ATTN_IMPLEMENTATION = "auto"  # auto = flash_attention_2 if flash-attn is installed on CUDA, else sdpa; or eager
LOAD_IN_4BIT = False  # QLoRA: 4-bit NF4 base weights via bitsandbytes (CUDA only); ~1/4 of the weight memory
ENABLE_THINKING = False  # Qwen3 thinking mode; needs MAX_COMPLETION_LENGTH >= ~1024 or every reward is 0
# LoRA
LORA_R = 16  # adapter rank: 8-64; higher learns more, costs more memory
LORA_ALPHA = 32  # scale = LORA_ALPHA / LORA_R; keep about 2x the rank
LORA_DROPOUT = 0.05  # dropout on the adapter input, 0-0.1
LORA_TARGET_MODULES = "all-linear"  # "all-linear", or a comma list such as "q_proj,v_proj"
# data
DATASET = "openai/gsm8k"  # Hub id (uses DATASET_CONFIG), or a .jsonl file / folder of {split}.jsonl in GSM8K format
DATASET_CONFIG = "main"  # Hub config name; ignored for local files
MAX_SAMPLES = 0  # use only the first N training problems; 0 = all
SKIP_BAD_ROWS = False  # drop rows whose answer lacks a parseable "#### N" instead of stopping
SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, showing each calculation. "
    "Then write the final answer on its own last line as '#### <number>', with no units."
)
# generation / GRPO
NUM_GENERATIONS = 4  # completions per prompt (the "group"); >= 2, more = better advantage estimates, slower
MAX_COMPLETION_LENGTH = 256  # tokens per completion; GSM8K solutions need ~100-250
TEMPERATURE = 0.7  # sampling temperature, > 0; higher = more diverse groups
BETA = 0.05  # KL coefficient against the base model; raise if train/kl runs away, 0 = no reference model
LOSS_TYPE = "dapo"  # grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo (TRL 1.16); dapo has no length bias
SCALE_REWARDS = "group"  # group, batch or none (Dr. GRPO: none removes the question-difficulty bias)
NUM_ITERATIONS = 1  # optimisation passes per generated batch (GRPO's mu); > 1 reuses generations
STEPS_PER_GENERATION = 0  # micro-batches per generation round; 0 = GRADIENT_ACCUMULATION_STEPS
MASK_TRUNCATED_COMPLETIONS = False  # leave completions cut at MAX_COMPLETION_LENGTH out of the loss (DAPO)
REWARD_FUNCS = ["correctness_reward", "format_reward"]  # names from rewards.REWARDS, "module:function", or callables
REWARD_WEIGHTS = [1.0, 0.2]  # one weight per reward function; correctness should dominate
USE_TRANSFORMERS_CONTINUOUS_BATCHING = False  # generate with transformers' paged continuous batching (no vLLM needed)
USE_VLLM = False  # generate with vLLM (requirements-vllm.txt): several times faster generation
VLLM_MODE = "colocate"  # colocate = on the training GPUs; server = `trl vllm-serve` on other GPUs
VLLM_GPU_MEMORY_UTILIZATION = 0.3  # colocate: share of GPU memory vLLM may take
VLLM_ENABLE_SLEEP_MODE = False  # colocate: free vLLM's memory while training, at some wake-up cost
VLLM_SERVER_BASE_URL = ""  # server: e.g. http://10.0.0.5:8000 for a server on another node; "" = this machine
# optimisation
LEARNING_RATE = 1e-5  # LoRA needs ~10x the full fine-tuning rate (the tutorial's 1e-6 barely moves an adapter)
PER_DEVICE_TRAIN_BATCH_SIZE = 1  # completions per micro-batch per GPU
GRADIENT_ACCUMULATION_STEPS = 8  # micro-batches per optimiser step
NUM_TRAIN_EPOCHS = 3  # passes over the data when MAX_STEPS = -1
MAX_STEPS = -1  # optimiser steps; -1 = use NUM_TRAIN_EPOCHS
ACTIVATION_CHECKPOINTING = True  # recompute activations in the backward pass: much less memory, slower
BF16 = True  # bfloat16 weights and maths (needs an Ampere or newer GPU)
USE_LIGER_KERNEL = False  # Liger's Triton RMSNorm/SwiGLU/RoPE kernels (CUDA, requirements-cuda.txt)
SEED = 42  # seeds LoRA init, sampling and data order
# logging / output
OUTPUT_DIR = "outputs/qwen3-gsm8k-grpo"  # checkpoints, final adapter and TensorBoard runs/ go here
LOGGING_STEPS = 1  # log every N optimiser steps
SAVE_STEPS = 50  # checkpoint every N steps; a killed run loses at most this many
SAVE_TOTAL_LIMIT = 3  # keep only the newest N checkpoints
RESUME = True  # continue from the newest checkpoint-N in OUTPUT_DIR when there is one
EVAL_BEFORE = 0  # GSM8K test problems scored before training (eval/gsm8k_* at step 0); 0 = off, 1319 = all
EVAL_AFTER = 0  # the same after training, at the final step; 0 = off (python evaluate.py does it standalone)
KL_WARN = 10.0  # health advice (monitor.py): warn when train/kl, the mean per-token KL, exceeds this
KL_ACT = 20.0  # advise raising BETA / lowering LEARNING_RATE when train/kl exceeds this
ZERO_STD_FRAC = 0.9  # advise when frac_reward_zero_std (0-1) is at least this ...
ZERO_STD_LOGS = 5  # ... for this many logs in a row: the reward does not tell a group's completions apart
REWARD_FLAT_WINDOW = 50  # logs; the mean reward is "flat" if its two halves differ by < REWARD_FLAT_DELTA; 0 = off
REWARD_FLAT_DELTA = 0.02  # in reward units (correctness 0-1 plus weighted format)
CLIPPED_RATIO_MAX = 0.2  # advise raising MAX_COMPLETION_LENGTH when more completions (0-1) than this are cut off
# ---------------------------------------------------------------------------------------------------------------

# --smoke: the same pipeline on a tiny random Qwen3 (smoke.py) and our own fixture, fp32 on CPU, in seconds.
SMOKE = dict(
    DATASET=str(Path(__file__).resolve().parent / "data" / "smoke_gsm8k.jsonl"),
    OUTPUT_DIR="outputs/smoke",
    MAX_COMPLETION_LENGTH=32,
    PER_DEVICE_TRAIN_BATCH_SIZE=4,
    GRADIENT_ACCUMULATION_STEPS=1,
    MAX_STEPS=4,
    SAVE_STEPS=2,
    TEMPERATURE=1.0,
    LEARNING_RATE=1e-3,
    BF16=False,
    ACTIVATION_CHECKPOINTING=False,
)
log = logging.getLogger("grpotrainer")


def build_config(smoke=False):
    """The GRPOConfig for the current constants. Derived values (precision, device) are decided here."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=OUTPUT_DIR,
        trust_remote_code=TRUST_REMOTE_CODE,
        model_init_kwargs=model_init_kwargs(smoke),
        chat_template_kwargs={"enable_thinking": ENABLE_THINKING},
        num_generations=NUM_GENERATIONS,
        max_completion_length=MAX_COMPLETION_LENGTH,
        temperature=TEMPERATURE,
        beta=BETA,
        loss_type=LOSS_TYPE,
        scale_rewards=SCALE_REWARDS,
        num_iterations=NUM_ITERATIONS,
        steps_per_generation=STEPS_PER_GENERATION or None,
        mask_truncated_completions=MASK_TRUNCATED_COMPLETIONS,
        reward_weights=REWARD_WEIGHTS,
        use_transformers_continuous_batching=USE_TRANSFORMERS_CONTINUOUS_BATCHING,
        use_vllm=USE_VLLM,
        vllm_mode=VLLM_MODE,
        vllm_gpu_memory_utilization=VLLM_GPU_MEMORY_UTILIZATION,
        vllm_enable_sleep_mode=VLLM_ENABLE_SLEEP_MODE,
        vllm_server_base_url=VLLM_SERVER_BASE_URL or None,
        learning_rate=LEARNING_RATE,
        per_device_train_batch_size=PER_DEVICE_TRAIN_BATCH_SIZE,
        gradient_accumulation_steps=GRADIENT_ACCUMULATION_STEPS,
        num_train_epochs=NUM_TRAIN_EPOCHS,
        max_steps=MAX_STEPS,
        **checkpointing_kwarg(GRPOConfig),
        bf16=BF16,
        use_liger_kernel=USE_LIGER_KERNEL,
        use_cpu=smoke,
        ddp_find_unused_parameters=False,  # LoRA gives every adapter weight a gradient: skip DDP's extra search
        seed=SEED,
        report_to=["tensorboard"],  # event files in OUTPUT_DIR/runs/<date>_<host>/
        logging_steps=LOGGING_STEPS,
        save_steps=SAVE_STEPS,
        save_total_limit=SAVE_TOTAL_LIMIT,
    )


def checkpointing_kwarg(config_class):
    """ACTIVATION_CHECKPOINTING under the name this transformers knows: 5.24 (requirements.txt) calls it
    activation_checkpointing and keeps gradient_checkpointing as a deprecated alias; 5.17, which vLLM pins
    (requirements-vllm.txt), has only gradient_checkpointing."""
    new = "activation_checkpointing" in config_class.__dataclass_fields__
    return {"activation_checkpointing" if new else "gradient_checkpointing": ACTIVATION_CHECKPOINTING}


def model_init_kwargs(smoke=False):
    """from_pretrained arguments: bf16 and the fastest attention kernel on CUDA, fp32 and sdpa on CPU."""
    attn = ATTN_IMPLEMENTATION
    if attn == "auto":  # flash-attn kernels run only in 16-bit, and we never train in fp16
        fa2 = BF16 and preflight.on_gpu(smoke) and preflight.importable("flash_attn")
        attn = "flash_attention_2" if fa2 else "sdpa"
    return {"dtype": "bfloat16" if BF16 else "float32", "attn_implementation": attn}


def build_peft_config():
    from peft import LoraConfig

    names = [name.strip() for name in LORA_TARGET_MODULES.split(",") if name.strip()]
    targets = "all-linear" if names == ["all-linear"] else names
    return LoraConfig(
        r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=LORA_DROPOUT, target_modules=targets, task_type="CAUSAL_LM"
    )


def build_quantization_config():
    if not LOAD_IN_4BIT:
        return None
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16 if BF16 else torch.float32,
        bnb_4bit_quant_storage=torch.bfloat16 if BF16 else torch.uint8,  # ZeRO-3/FSDP shard it as the weights' dtype
    )


def make_prompt(question):
    """Chat messages for one problem; evaluate.py uses the same so that before/after accuracies compare."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]


def load_gsm8k(split="train", limit=0):
    """GSM8K (or a local file in its format) as a Dataset with `prompt` (chat messages), `answer` (gold number)
    and `question`. TRL passes every column to the reward functions, so the gold reaches them as `answer=`."""
    import datasets

    path = Path(DATASET).expanduser()
    if path.suffix in (".jsonl", ".json") or path.exists() or DATASET.startswith((".", "/", "~")):
        path = path / f"{split}.jsonl" if path.is_dir() else path
        if not path.is_file():
            raise ConfigError(
                f"DATASET points at {path}, which does not exist. Give a GSM8K-format .jsonl file (one "
                '{"question": ..., "answer": "... #### N"} per line), a folder holding train.jsonl and test.jsonl, '
                "or the Hub id openai/gsm8k."
            )
        try:
            ds = datasets.load_dataset("json", data_files=str(path), split="train")
        except datasets.exceptions.DatasetGenerationError as err:
            raise ConfigError(f"DATASET file {path} is not valid JSON lines ({err.__cause__ or err}).") from None
    else:
        try:
            ds = datasets.load_dataset(DATASET, DATASET_CONFIG, split=split)
        except Exception as err:  # the Hub's errors have many types; each says what went wrong
            raise ConfigError(
                f"DATASET {DATASET!r} could not be loaded from the Hugging Face Hub ({type(err).__name__}: {err}). "
                "Without Hub access, point DATASET at a local GSM8K-format .jsonl file or folder (see README)."
            ) from None
    if missing := {"question", "answer"} - set(ds.column_names):
        raise ConfigError(f"DATASET {path} lacks the column(s) {sorted(missing)}; GSM8K rows have question, answer.")
    golds = [rewards.extract_hash_answer(text) for text in ds["answer"]]
    if bad := [i for i, gold in enumerate(golds) if gold is None]:
        shown = "; ".join(f"row {i + 1}: ...{ds[i]['answer'][-40:]!r}" for i in bad[:3])
        if not SKIP_BAD_ROWS:
            raise ConfigError(
                f"{len(bad)} of {len(ds)} rows of DATASET {path} ({split}) have no parseable '#### N' answer, "
                f"e.g. {shown}. Fix those rows, or set SKIP_BAD_ROWS=True to train without them."
            )
        log.warning("skipping %d rows without a '#### N' answer (SKIP_BAD_ROWS=True), e.g. %s", len(bad), shown)
    keep = [i for i, gold in enumerate(golds) if gold is not None][: limit or None]
    questions = [ds[i]["question"] for i in keep]
    return datasets.Dataset.from_dict(
        {"prompt": [make_prompt(q) for q in questions], "answer": [golds[i] for i in keep], "question": questions}
    )


def build_reward_funcs():
    """REWARD_FUNCS as callables: registry names, "module:function" strings or callables given directly."""
    import importlib

    funcs = []
    for func in REWARD_FUNCS:
        if isinstance(func, str) and func in rewards.REWARDS:
            func = rewards.REWARDS[func]
        elif isinstance(func, str):  # "module:function" (preflight has already rejected unknown plain names)
            module, _, name = func.partition(":")
            try:
                func = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError) as err:
                raise ConfigError(f"REWARD_FUNCS entry {func!r} could not be imported: {err}.") from None
        funcs.append(func(max_completion_length=MAX_COMPLETION_LENGTH) if isinstance(func, type) else func)
    return funcs


def build_trainer(config, reward_funcs, train_dataset, callbacks):
    """GRPOTrainer on MODEL_NAME with the LoRA config: TRL loads the model and wraps it."""
    from peft import NoMatchingPeftModuleError
    from trl import GRPOTrainer

    try:
        return GRPOTrainer(
            model=MODEL_NAME,
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=train_dataset,
            peft_config=build_peft_config(),
            quantization_config=build_quantization_config(),
            callbacks=callbacks,
        )
    except OSError as err:  # transformers' "not a valid model identifier", missing weights or tokenizer
        raise ConfigError(f"MODEL_NAME {MODEL_NAME!r} could not be loaded: {err}") from None
    except NoMatchingPeftModuleError as err:
        raise ConfigError(
            f"LORA_TARGET_MODULES={LORA_TARGET_MODULES!r} matches no layer of the model: {err}"
        ) from None


def main(argv=()):
    global MODEL_NAME
    smoke, overrides = cli.parse(sys.modules[__name__], argv)
    rank0 = os.environ.get("RANK", "0") == "0"
    logging.basicConfig(level=logging.INFO if rank0 else logging.WARNING, format="[grpotrainer] %(message)s")

    preflight.check(sys.modules[__name__], smoke)
    reward_funcs = build_reward_funcs()
    train_dataset = load_gsm8k("train", limit=MAX_SAMPLES)
    eval_dataset = load_gsm8k("test", limit=max(EVAL_BEFORE, EVAL_AFTER)) if EVAL_BEFORE or EVAL_AFTER else None
    if smoke and "MODEL_NAME" not in overrides:
        from smoke import ensure_model_dir

        MODEL_NAME = ensure_model_dir(Path(OUTPUT_DIR) / "smoke-model")
    last = preflight.resume_checkpoint(sys.modules[__name__])
    config = build_config(smoke)
    kwargs = config.model_init_kwargs
    log.info("model %s, %s, attention %s", MODEL_NAME, kwargs["dtype"], kwargs["attn_implementation"])

    import evaluate
    import monitor

    health = monitor.HealthMonitor(monitor.Thresholds.from_constants(sys.modules[__name__]))  # advice; NaN stop
    samples = monitor.CompletionSamples(train_dataset)  # completions table in TensorBoard's Text tab
    trainer = build_trainer(config, reward_funcs, train_dataset, callbacks=[health, samples])
    health.trainer = samples.trainer = trainer  # they write through its TensorBoard writer (see monitor.py)
    if last:
        log.info("resuming from %s (the baseline evaluation, if any, was done by the first run)", last)
    else:
        evaluate.in_training(trainer, eval_dataset, EVAL_BEFORE, "before")  # baseline test accuracy at step 0
    trainer.train(resume_from_checkpoint=last)
    if health.stopped:
        raise ConfigError(f"training stopped: {health.stopped.message}")
    trainer.save_model(OUTPUT_DIR)  # the LoRA adapter and the tokenizer
    log.info("saved the adapter to %s", OUTPUT_DIR)
    evaluate.in_training(trainer, eval_dataset, EVAL_AFTER, "after")  # test accuracy at the final step
    trainer.accelerator.wait_for_everyone()  # no rank exits while another still uses the process group
    trainer.accelerator.end_training()  # ... which is then torn down, as accelerate asks at the end of a script
    return trainer


if __name__ == "__main__":
    cli.run(main)
