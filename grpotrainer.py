"""GRPO-tune a Qwen model on GSM8K with TRL's GRPOTrainer and LoRA.

    python grpotrainer.py                          # train with the constants below (CUDA GPU, bf16)
    python grpotrainer.py --smoke                  # the same pipeline offline on the CPU in seconds
    python grpotrainer.py --demo                   # a run that learns, on the CPU (docs/demo.md)
    python grpotrainer.py --real                   # SmolLM2-135M-Instruct learning on the CPU (docs/real-model.md)
    python grpotrainer.py --plan                   # what the run will do and its time, without a GPU (or =json)
    python grpotrainer.py --LEARNING_RATE=2e-5     # a constant as --KEY=value (--help lists them)
    python grpotrainer.py --top_p=0.9              # any other GRPOConfig field, lower case
    python grpotrainer.py --config recipe.yaml     # a YAML recipe: constants, TRL's or open-r1's keys
    torchrun --nproc_per_node 4 grpotrainer.py     # data-parallel; DeepSpeed, FSDP: docs/launch.md

TRL does the GRPO loss, LoRA, logging, checkpointing and distributed launch. This file adds what GSM8K needs,
from the package beside it (grpo/): each setting's checks and names (settings), the data and prompts (gsm8k),
checks in seconds (preflight), the plan, advice and held-out accuracy (callbacks) and run safety (process,
checkpoints); the rewards are in rewards.py. Watch a run with `tensorboard --logdir outputs` (README).
"""

import logging
import time

import rewards
from demo import real, smoke, sums
from grpo import (
    checkpoints,
    cli,
    files,
    generation,
    gsm8k,
    hardware,
    modelcard,
    plan,
    preflight,
    process,
    reward_guard,
)
from grpo.errors import ConfigError, first_line, is_load_error
from grpo.settings import config_kwargs

# --------------------------------------------------------------------------------------------------
# model
MODEL_NAME = "Qwen/Qwen3-8B"  # Hub id, or a local folder holding config.json + weights (see README)
TRUST_REMOTE_CODE = False  # run a model repo's own Python code; Qwen3 needs none, so leave it off
ATTN_IMPLEMENTATION = "auto"  # auto = fastest installed on CUDA in bf16 (docs/gpu.md), else sdpa
LOAD_IN_4BIT = False  # QLoRA: 4-bit NF4 base weights via bitsandbytes (CUDA only): ~1/4 the memory
ENABLE_THINKING = False  # Qwen3 thinking mode; needs MAX_COMPLETION_LENGTH >= 1024 or every reward is 0
# LoRA
LORA_R = 16  # adapter rank: 8-64; higher learns more, costs more memory
LORA_ALPHA = 32  # scale = LORA_ALPHA / LORA_R; keep about 2x the rank
LORA_DROPOUT = 0.0  # 0-0.1; 0 as TRL's "old" log-probs run in train mode (noise in KL, IS)
LORA_TARGET_MODULES = "all-linear"  # "all-linear", or a comma list such as "q_proj,v_proj"
USE_RSLORA = False  # rank-stabilised LoRA: scale LORA_ALPHA / sqrt(LORA_R), for high ranks
USE_DORA = False  # weight-decomposed LoRA (DoRA): a magnitude per output, slower steps
# data
DATASET = "openai/gsm8k"  # Hub id (with DATASET_CONFIG), or a .jsonl file / folder of {split}.jsonl
DATASET_CONFIG = "main"  # Hub config name (main, socratic); ignored for local files
QUESTION_FIELD = "question"  # the dataset's column holding the problem
ANSWER_FIELD = "answer"  # the column holding the answer: a GSM8K solution ending "#### N", or a bare number
MAX_SAMPLES = 0  # use only the first N training problems; 0 = all
SKIP_BAD_ROWS = False  # drop rows whose answer lacks a parseable "#### N" instead of stopping
SYSTEM_PROMPT = gsm8k.DEFAULT_PROMPT  # the instruction before every problem; asks for "#### <number>"
# generation / GRPO
NUM_GENERATIONS = 8  # the group per prompt; 8-16 (TRL, open-r1): at 90 % solved 43 % of groups tie
MAX_COMPLETION_LENGTH = 256  # tokens per completion; GSM8K solutions need ~100-250
TEMPERATURE = 0.7  # sampling temperature, > 0; higher = more diverse groups
BETA = 0.0  # KL coefficient; 0 (TRL, DAPO) = no reference forward; 0.001-0.04 if the policy drifts
LOSS_TYPE = "dapo"  # grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo; dapo has no length bias
SCALE_REWARDS = "group"  # group, batch or none (Dr. GRPO: none removes the difficulty bias)
NUM_ITERATIONS = 1  # optimisation passes per generated batch (GRPO's mu); > 1 reuses generations
STEPS_PER_GENERATION = 0  # micro-batches per generation call (0 = accumulation); more = faster decoding
MASK_TRUNCATED_COMPLETIONS = False  # leave completions cut at MAX_COMPLETION_LENGTH out of the loss
REWARD_FUNCS = ["correctness_reward", "format_reward"]  # rewards.py names, TRL's, or "module:function"
REWARD_WEIGHTS = [1.0, 0.2]  # one weight per reward function; correctness should dominate
REWARD_TIMEOUT = 600  # seconds a reward call may take, or the run stops naming it; 0 = no limit
USE_TRANSFORMERS_CONTINUOUS_BATCHING = False  # transformers' paged continuous batching (no vLLM)
CACHE_IMPLEMENTATION = "dynamic"  # or static: static KV cache + compiled decode step (CUDA; ~1 min)
USE_VLLM = "auto"  # auto = vLLM when it imports on a CUDA machine, else HF generate; or True, False
VLLM_MODE = "colocate"  # colocate = on the training GPUs; server = `trl vllm-serve` on other GPUs
VLLM_GPU_MEMORY_UTILIZATION = "auto"  # colocate: vLLM's share of GPU memory; auto = what it needs
VLLM_ENABLE_SLEEP_MODE = False  # colocate: free vLLM's memory while training, at some wake-up cost
VLLM_SERVER_BASE_URL = ""  # server: e.g. http://10.0.0.5:8000 on another node; "" = this machine
# optimisation
LEARNING_RATE = 5e-6  # 3e-6 to 5e-6 for LoRA (Unsloth, verl); TRL's 1e-6 barely moves LoRA
PER_DEVICE_TRAIN_BATCH_SIZE = 8  # completions per micro-batch per GPU; lower it on out-of-memory
GRADIENT_ACCUMULATION_STEPS = 8  # micro-batches per step: 8 x 8 = 64 completions = 8 prompts x 8
NUM_TRAIN_EPOCHS = 1  # passes over the data when MAX_STEPS = -1
MAX_STEPS = 250  # optimiser steps (Unsloth 100-250): 2,000 problems (--plan: its time); -1 = epochs
WARMUP_STEPS = 0.1  # learning-rate warm-up: steps, or below 1 a share of the run
ACTIVATION_CHECKPOINTING = True  # recompute activations in the backward pass: less memory, slower
BF16 = True  # bfloat16 weights and maths (needs an Ampere or newer GPU)
SEED = 42  # seeds LoRA init, sampling and data order
DDP_TIMEOUT = 600  # seconds a torchrun process waits for the others before the run names a stall
# logging / output
OUTPUT_DIR = "outputs/qwen3-gsm8k-grpo"  # checkpoints, adapter, run_settings.json, TensorBoard runs/
REPORT_TO = "tensorboard"  # tensorboard, trackio, wandb, a list (tensorboard,trackio) or none
LOGGING_STEPS = 1  # log every N optimiser steps
LOG_COMPLETIONS_STEPS = 10  # a table of a logged batch's completions every N steps; 0 = off
SAVE_STEPS = 50  # checkpoint every N steps; a killed run loses at most this many
SAVE_TOTAL_LIMIT = 3  # keep only the newest N checkpoints
RESUME = True  # continue from the newest checkpoint-N in OUTPUT_DIR when there is one
STOP_GRACE = 300  # seconds a step may take after SIGTERM/Ctrl-C, or it ends unsaved; 0 = wait
EVAL_BEFORE = 0  # test problems scored before training (eval/gsm8k_* at step 0); 0 = off
EVAL_AFTER = 1319  # the same after training: all 1,319 test problems, stderr 1.4 points; 0 = off
EVAL_STEPS = 50  # score EVAL_SUBSET test problems every N steps; -1 = each 10 % of the run; 0 = off
EVAL_SUBSET = 256  # test problems at each EVAL_STEPS point (the first N): stderr 3.1 points at 50 %
EVAL_BATCH_SIZE = 128  # prompts per generate() call in evaluation: lower it on out-of-memory
EVAL_SAMPLES = 4  # answers sampled per problem at TEMPERATURE there (sampled accuracy); 0 = off
# health advice: printed, and in every tracker (docs/troubleshooting.md)
KL_WARN = 10.0  # warn when train/kl, the mean per-token KL, exceeds this
KL_ACT = 20.0  # advise raising BETA / lowering LEARNING_RATE when train/kl exceeds this
ZERO_STD_FRAC = 0.9  # advise when the share of tied groups (0-1) is at least this ...
ZERO_STD_LOGS = 5  # ... for this many logs in a row: the reward does not tell completions apart
REWARD_FLAT_WINDOW = 50  # logs; the reward is "flat" if its halves differ by < REWARD_FLAT_DELTA; 0 = off
REWARD_FLAT_DELTA = 0.02  # in reward units (correctness 0-1 plus weighted format)
CLIPPED_RATIO_MAX = 0.2  # advise on MAX_COMPLETION_LENGTH when more than this share is cut off
GRAD_NORM_MAX = 100.0  # advise lowering LEARNING_RATE when grad_norm exceeds this (divergence)
# --------------------------------------------------------------------------------------------------

PROFILES = {"smoke": smoke, "demo": sums, "real": real}  # CPU runs: their settings over the constants
CONFIG_CLASS = "trl.trainer.grpo_config:GRPOConfig"
PACKAGES = ("torch", "transformers", "trl", "peft", "datasets", "accelerate")
log = logging.getLogger("grpotrainer")


def build_config(s, fields, cpu_only, datasets=()):
    """The GRPOConfig of the settings `s` (each constant's field is in grpo/settings.py) and the command
    line's lower-case `fields`, checked by TRL itself. Without a GPU (--plan), as the CPU would run it."""
    from trl import GRPOConfig

    cpu_only = cpu_only or not hardware.on_gpu(cpu_only)
    ours = config_kwargs(s, prefix="")
    attention = s["ATTN_IMPLEMENTATION"]
    remote = s["TRUST_REMOTE_CODE"]
    ours["model_init_kwargs"] = hardware.model_init_kwargs(attention, s["BF16"], cpu_only, trust_remote_code=remote)
    if hardware.fsdp_version():  # TRL sets device_map=None for DDP and DeepSpeed only; "auto" fills each GPU whole
        ours["model_init_kwargs"]["device_map"] = None
    ours["chat_template_kwargs"] = {"enable_thinking": s["ENABLE_THINKING"]}
    if s["USE_VLLM"] is True:  # the longest prompt and completion, not the model's whole context
        lengths = dict(max_completion_length=s["MAX_COMPLETION_LENGTH"], enable_thinking=s["ENABLE_THINKING"])
        ours["vllm_max_model_length"] = generation.vllm_context(datasets, s["MODEL_NAME"], remote, **lengths)
    ours |= dict(num_completions_to_print=0, use_cpu=cpu_only, ddp_find_unused_parameters=False)
    if cpu_only:  # one thread; gloo with DDP_TIMEOUT (transformers drops it on the CPU)
        hardware.one_cpu_thread()
        hardware.init_cpu_process_group(s["DDP_TIMEOUT"])
    owners = {"model_init_kwargs": "ATTN_IMPLEMENTATION, BF16 and TRUST_REMOTE_CODE"}
    owners["chat_template_kwargs"] = "ENABLE_THINKING"
    try:
        return GRPOConfig(**cli.merge_fields(ours, fields, owners))
    except (ValueError, ImportError) as err:  # GRPOConfig's own checks, e.g. of a --field=value
        message = f"GRPOConfig refuses these settings: {first_line(err)}"
        raise ConfigError(message) from None


def build_trainer(s, config, reward_funcs, train_dataset):
    """GRPOTrainer on MODEL_NAME with LoRA (TRL loads and wraps the model). A model that cannot load is
    the one-line MODEL_NAME message; any other error is a bug and keeps its traceback."""
    from peft import LoraConfig
    from trl import GRPOTrainer

    from grpo import patches  # transformers' callbacks: imported once the settings are known good

    lora = LoraConfig(task_type="CAUSAL_LM", **config_kwargs(s, prefix="lora_config."))
    try:
        trainer = GRPOTrainer(
            model=s["MODEL_NAME"],
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=train_dataset,
            peft_config=lora,
            quantization_config=hardware.quantization_config(s["LOAD_IN_4BIT"], s["BF16"]),
        )
    except Exception as err:
        if not is_load_error(err):
            raise
        message = f"MODEL_NAME={s['MODEL_NAME']} could not be loaded: {err}"
        raise ConfigError(message) from None
    # a 4-bit model's adapter back in fp32, vLLM's weight sync out of place, no credential kept
    patches.after_init(trainer, s["LOAD_IN_4BIT"])
    return trainer


def load_data(s, plan_only=False):
    """The training set and, when an evaluation asks, the test set: a missing split fails now.
    For --plan where the Hub cannot be reached, GSM8K's known sizes stand in."""
    if plan_only and (sizes := gsm8k.known_sizes(s["DATASET"], s["DATASET_CONFIG"])):
        return sizes
    # Gemma's and Mistral's templates refuse a system turn: the prompt then goes in the user turn
    fold = generation.refuses_system_turn(s["MODEL_NAME"], s["TRUST_REMOTE_CODE"])
    options = dict(
        config=s["DATASET_CONFIG"],
        skip_bad_rows=s["SKIP_BAD_ROWS"],
        system_prompt=s["SYSTEM_PROMPT"],
        question=s["QUESTION_FIELD"],
        answer=s["ANSWER_FIELD"],
        fold=fold,
    )
    train_dataset = gsm8k.load(s["DATASET"], "train", limit=s["MAX_SAMPLES"], **options)
    evals = max(s["EVAL_BEFORE"], s["EVAL_AFTER"], s["EVAL_SUBSET"] if s["EVAL_STEPS"] else 0)
    eval_dataset = gsm8k.load(s["DATASET"], "test", limit=evals, **options) if evals else None
    return train_dataset, eval_dataset


def train(s, record, config, reward_funcs, datasets, started):
    """One run in its locked OUTPUT_DIR: resume or start, train, save, score, mark it finished."""
    from grpo import callbacks

    out = s["OUTPUT_DIR"]
    rank0 = config.process_index == 0
    last = checkpoints.resume_checkpoint(out, s, main_process=rank0)
    # a resume may change how the run is saved or watched, never what it trains
    record = checkpoints.resumed_record(out, record, last)
    log.info("model %s%s", s["MODEL_NAME"], f"; resuming from {last}" if last else "")
    stopper = callbacks.StopOnSignal(resuming=last, grace=s["STOP_GRACE"])
    trainer = build_trainer(s, config, reward_funcs=reward_funcs, train_dataset=datasets[0])
    profile = PROFILES.get(record["profile"])
    fixed = profile.FIXED if profile else ()
    # advice, held-out accuracy, pace, samples, signals: see grpo/callbacks.py
    health, held_out = callbacks.install(
        trainer, s, record, stopper=stopper, eval_dataset=datasets[1], resumed=last, fixed=fixed
    )
    if rank0:  # a hard-linked backup of OUTPUT_DIR keeps its own files
        files.unshare(out)
    files.write_settings(out, record, rank0)  # what evaluate.py --ADAPTER=OUTPUT_DIR reads back
    try:
        if last and checkpoints.reached(last, s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"]):
            checkpoints.restore(trainer, last)  # cut after its last checkpoint: score it, no step
            held_out.score("after", s["EVAL_AFTER"])
        else:
            trainer.train(resume_from_checkpoint=str(last) if last else None)
    finally:
        stopper.restore()
    stopped = stopper.signal_name or health.stopped
    if not stopped or held_out.interrupted == "after":  # the adapter, also when EVAL_AFTER was cut
        checkpoints.save_adapter(trainer, out, rank0)
    if not stopped and rank0:  # our card over TRL's, then run_finished.json, then the last lines
        metrics = held_out.metrics
        lines = modelcard.finish_run(trainer.state, out, record, metrics=metrics, started=started, resumed=last)
        for line in [*lines, profile.finish(out) if profile else None]:
            if line:
                log.info(line)
    trainer.accelerator.wait_for_everyone()  # no rank exits while another uses the process group
    trainer.accelerator.end_training()  # ... which is then torn down, as accelerate asks at the end
    if stopper.signal_name:  # the step it stopped at was checkpointed: the same command resumes
        log.warning(stopper.message())
        raise SystemExit(stopper.exit_code)
    if health.stopped:
        raise ConfigError(f"training stopped: {health.stopped.message}")
    return trainer


def main(argv=()):
    profiles = {name: profile.SETTINGS for name, profile in PROFILES.items()}
    constants = cli.constants(globals())
    args = cli.parse(constants, argv, profiles, config_class=CONFIG_CLASS, source=__file__)
    started = time.monotonic()
    process.setup_logging("grpotrainer", hardware.is_main_process())
    process.require(PACKAGES, "grpotrainer.py")
    for note in args.notes:  # names read as constants, recipe keys ignored: a line each
        log.info(note)
    done = args.settings["RESUME"] and checkpoints.finished(args.settings)
    if done and not args.plan:  # a finished run, run again: said before TRL loads
        return log.info(done)
    cpu_only = args.profile is not None
    # every setting decided and checked here, a refused value with its constant's comment
    s = preflight.resolve(args, cpu_only, PROFILES, known_rewards=rewards.REWARDS, comments=cli.comments(__file__))
    datasets = load_data(s, plan_only=bool(args.plan))
    config = build_config(s, args.fields, cpu_only, datasets=() if args.plan else datasets)
    run_plan = plan.for_run(s, config, datasets, world_size=hardware.world_size())
    preflight.refuse_bad_grpo_config(config, s, run_plan["train_problems"])
    if args.plan:  # --plan or --plan=json: what the run will do, and nothing more
        return print(plan.plan_json(run_plan) if args.plan == "json" else plan.format_plan(run_plan))
    log.info(plan.format_plan(run_plan))
    bound = dict(max_completion_length=s["MAX_COMPLETION_LENGTH"], enable_thinking=s["ENABLE_THINKING"])
    bound["timeout"] = s["REWARD_TIMEOUT"]
    reward_funcs = reward_guard.load(s["REWARD_FUNCS"], rewards.REWARDS, **bound)
    if args.profile:  # the smoke model, the demo's warm start
        PROFILES[args.profile].build(s)
    preflight.refuse_before_loading(s, reward_funcs, datasets[0], answer_blind=rewards.ANSWER_BLIND)
    sizes = {"train": run_plan["train_problems"], "test": run_plan["test_problems"]}
    record = files.record(s, args.fields, profile=args.profile, sizes=sizes, processes=hardware.world_size())
    lock = process.output_lock(s["OUTPUT_DIR"], config.process_index == 0)
    with lock, process.faults(s["OUTPUT_DIR"], s["DDP_TIMEOUT"]):
        return train(s, record, config, reward_funcs=reward_funcs, datasets=datasets, started=started)


if __name__ == "__main__":
    process.run(main)
