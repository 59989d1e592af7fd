"""GRPO-tune a Qwen model on GSM8K with TRL's GRPOTrainer and LoRA.

    python grpotrainer.py                          # train with the constants below (CUDA GPU, bf16)
    python grpotrainer.py --smoke                  # the same pipeline offline on the CPU in seconds
    python grpotrainer.py --demo                   # a run that learns, on the CPU (docs/demo.md)
    python grpotrainer.py --real                   # SmolLM2-135M-Instruct learning on the CPU (docs/real-model.md)
    python grpotrainer.py --plan                   # what the run will do and its time, without a GPU (or =json)
    python grpotrainer.py --LEARNING_RATE=2e-5     # a constant as --KEY=value (--help lists them)
    python grpotrainer.py --top_p=0.9              # any other GRPOConfig field, lower case
    torchrun --nproc_per_node 4 grpotrainer.py     # data-parallel; DeepSpeed, FSDP: docs/launch.md

TRL does the GRPO loss, LoRA, logging, checkpointing and distributed launch. This file adds what
GSM8K needs, from the package beside it (grpo/): the prompt, data and evaluation (gsm8k), checks in
seconds (preflight), advice (monitor) and run safety (checkpoints, guards); the rewards are in
rewards.py. Watch a run with `tensorboard --logdir outputs` (see README).
"""

import logging
import time
from pathlib import Path

import rewards
from demo import real, sums
from grpo import checkpoints, cli, errors, files, gsm8k, hardware, modelcard, plan, preflight, profiles, reward_guard

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
# data
DATASET = "openai/gsm8k"  # Hub id (with DATASET_CONFIG), or a .jsonl file / folder of {split}.jsonl
DATASET_CONFIG = "main"  # Hub config name; ignored for local files
MAX_SAMPLES = 0  # use only the first N training problems; 0 = all
SKIP_BAD_ROWS = False  # drop rows whose answer lacks a parseable "#### N" instead of stopping
SYSTEM_PROMPT = gsm8k.SYSTEM_PROMPT  # the instruction before every problem; asks for "#### <number>"
# generation / GRPO
NUM_GENERATIONS = 8  # the group per prompt; 8-16 (TRL, open-r1): at 90 % solved 43 % of groups tie (of 4: 66 %)
MAX_COMPLETION_LENGTH = 256  # tokens per completion; GSM8K solutions need ~100-250
TEMPERATURE = 0.7  # sampling temperature, > 0; higher = more diverse groups
BETA = 0.0  # KL coefficient; 0 (TRL, DAPO) = no reference forward; 0.001-0.04 (verl) if the policy drifts
LOSS_TYPE = "dapo"  # grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo; dapo has no length bias
SCALE_REWARDS = "group"  # group, batch or none (Dr. GRPO: none removes the difficulty bias)
NUM_ITERATIONS = 1  # optimisation passes per generated batch (GRPO's mu); > 1 reuses generations
STEPS_PER_GENERATION = 0  # micro-batches per generation call (0 = accumulation); more = faster decoding per token
MASK_TRUNCATED_COMPLETIONS = False  # leave completions cut at MAX_COMPLETION_LENGTH out of the loss
REWARD_FUNCS = ["correctness_reward", "format_reward"]  # rewards.REWARDS names, or "module:function"
REWARD_WEIGHTS = [1.0, 0.2]  # one weight per reward function; correctness should dominate
REWARD_TIMEOUT = 600  # seconds a reward call may take, or the run stops naming it; 0 = no limit
USE_TRANSFORMERS_CONTINUOUS_BATCHING = False  # transformers' paged continuous batching (no vLLM)
CACHE_IMPLEMENTATION = "dynamic"  # or static: static KV cache + compiled decode step (CUDA; ~1 min)
USE_VLLM = "auto"  # auto = vLLM when it imports on a CUDA machine, else HF generate; True or False to choose
VLLM_MODE = "colocate"  # colocate = on the training GPUs; server = `trl vllm-serve` on other GPUs
VLLM_GPU_MEMORY_UTILIZATION = "auto"  # colocate: GPU memory share for vLLM; auto = weights + KV cache / card
VLLM_ENABLE_SLEEP_MODE = False  # colocate: free vLLM's memory while training, at some wake-up cost
VLLM_SERVER_BASE_URL = ""  # server: e.g. http://10.0.0.5:8000 on another node; "" = this machine
# optimisation
LEARNING_RATE = 5e-6  # 3e-6 to 5e-6 (Unsloth's LoRA GRPO, verl, willccbb); TRL's 1e-6 barely moves LoRA
PER_DEVICE_TRAIN_BATCH_SIZE = 8  # completions per micro-batch per GPU; lower it (raise accumulation) on OOM
GRADIENT_ACCUMULATION_STEPS = 8  # micro-batches per optimiser step: 8 x 8 = 64 completions = 8 prompts x 8
NUM_TRAIN_EPOCHS = 1  # passes over the data when MAX_STEPS = -1
MAX_STEPS = 250  # optimiser steps (Unsloth 100-250): 2,000 problems, ~1 h on an H100 (--plan); -1 = epochs
WARMUP_STEPS = 0.1  # learning-rate warm-up: steps, or below 1 a share of the run (willccbb: 0.1)
ACTIVATION_CHECKPOINTING = True  # recompute activations in the backward pass: less memory, slower
BF16 = True  # bfloat16 weights and maths (needs an Ampere or newer GPU)
SEED = 42  # seeds LoRA init, sampling and data order
DDP_TIMEOUT = 600  # seconds a torchrun process waits for the others before the run names a stall
# logging / output
OUTPUT_DIR = "outputs/qwen3-gsm8k-grpo"  # checkpoints, adapter, run_settings.json, TensorBoard runs/
REPORT_TO = "tensorboard"  # tensorboard, trackio, wandb, a list (tensorboard,trackio) or none
LOGGING_STEPS = 1  # log every N optimiser steps
LOG_COMPLETIONS_STEPS = 10  # a logged batch's completions every N steps: Text tab, parquet, W&B/trackio table; 0 = off
SAVE_STEPS = 50  # checkpoint every N steps; a killed run loses at most this many
SAVE_TOTAL_LIMIT = 3  # keep only the newest N checkpoints
RESUME = True  # continue from the newest checkpoint-N in OUTPUT_DIR when there is one
STOP_GRACE = 300  # seconds a step may take after SIGTERM/Ctrl-C, or the run ends without saving it; 0 = wait
EVAL_BEFORE = 0  # GSM8K test problems scored before training (eval/gsm8k_* at step 0); 0 = off
EVAL_AFTER = 1319  # the same after training: all 1,319 test problems, stderr 1.4 points; 0 = off
EVAL_STEPS = 50  # score EVAL_SUBSET test problems every N steps; -1 = each 10 % of the run; 0 = off
EVAL_SUBSET = 256  # test problems at each EVAL_STEPS point (the first N): stderr 3.1 points at 50 %, 1.9 at 90 %
EVAL_BATCH_SIZE = 128  # prompts per generate() call in evaluation; many at once: lower on out-of-memory
EVAL_SAMPLES = 4  # answers sampled per problem at TEMPERATURE there (sampled accuracy); 0 = off
# health advice (grpo/monitor.py): printed, in TensorBoard's Text tab and as W&B/trackio alerts
KL_WARN = 10.0  # warn when train/kl, the mean per-token KL, exceeds this
KL_ACT = 20.0  # advise raising BETA / lowering LEARNING_RATE when train/kl exceeds this
ZERO_STD_FRAC = 0.9  # advise when frac_reward_zero_std (0-1) is at least this ...
ZERO_STD_LOGS = 5  # ... for this many logs in a row: the reward does not tell completions apart
REWARD_FLAT_WINDOW = 50  # logs; the reward is "flat" if its halves differ by < REWARD_FLAT_DELTA; 0 = off
REWARD_FLAT_DELTA = 0.02  # in reward units (correctness 0-1 plus weighted format)
CLIPPED_RATIO_MAX = 0.2  # advise raising MAX_COMPLETION_LENGTH when more than this share is cut off
GRAD_NORM_MAX = 100.0  # advise lowering LEARNING_RATE when grad_norm exceeds this (divergence)
# --------------------------------------------------------------------------------------------------

# The offline profiles, on the CPU (grpo/profiles.py, demo/sums.py, demo/real.py): settings over the constants above.
profile_settings = {"smoke": profiles.SMOKE, "demo": sums.DEMO, "real": real.REAL}
# GRPOConfig fields the script sets whose name is no constant's: --gradient_checkpointing is read as the constant,
# the others are refused with the sentence (grpo/cli.py's translate; TRL's own names are in cli.TRL_NAMES).
owned = {
    "gradient_checkpointing": "ACTIVATION_CHECKPOINTING",
    "use_cpu": "the CPU profiles: run --smoke or --demo, or on a GPU without either",
    "resume_from_checkpoint": "RESUME, from the newest checkpoint-N in OUTPUT_DIR: --RESUME=false starts afresh",
    "log_completions": {"true": "--LOG_COMPLETIONS_STEPS=1", "false": "--LOG_COMPLETIONS_STEPS=0"},
}
# Dict fields merged with the user's keys; a key both set is refused naming the constants that set it.
merged = {
    "model_init_kwargs": "ATTN_IMPLEMENTATION, BF16 and TRUST_REMOTE_CODE",
    "chat_template_kwargs": "ENABLE_THINKING",
}
log = logging.getLogger("grpotrainer")


def build_config(s, fields, cpu_only, train_dataset=None):
    """The GRPOConfig for the settings `s` and the command line's lower-case `fields`, checked by TRL."""
    from trl import GRPOConfig

    if s["USE_VLLM"] is True:  # vLLM's context, bound as in evaluation (gsm8k.context_length); auto: main chose
        tok = {"enable_thinking": s["ENABLE_THINKING"], "trust_remote_code": s["TRUST_REMOTE_CODE"]}
        prompts = gsm8k.longest_prompt(train_dataset, s["MODEL_NAME"], **tok)
        fields = {"vllm_max_model_length": gsm8k.context_length(prompts, s["MAX_COMPLETION_LENGTH"]), **fields}

    if cpu_only:
        # one thread (a given MODEL_NAME too); gloo with DDP_TIMEOUT (transformers drops it on the CPU)
        hardware.one_cpu_thread()
        hardware.init_cpu_process_group(s["DDP_TIMEOUT"])
    try:  # the user's fields merged with these (cli.merge_fields): none given twice, which GRPOConfig refuses
        return cli.with_fields(GRPOConfig, fields, owners=merged)(
            output_dir=s["OUTPUT_DIR"],
            trust_remote_code=s["TRUST_REMOTE_CODE"],
            model_init_kwargs=build_model_init_kwargs(s, cpu_only),
            chat_template_kwargs={"enable_thinking": s["ENABLE_THINKING"]},
            num_generations=s["NUM_GENERATIONS"],
            max_completion_length=s["MAX_COMPLETION_LENGTH"],
            temperature=s["TEMPERATURE"],
            beta=s["BETA"],
            loss_type=s["LOSS_TYPE"],
            scale_rewards=s["SCALE_REWARDS"],
            num_iterations=s["NUM_ITERATIONS"],
            steps_per_generation=s["STEPS_PER_GENERATION"] or None,
            mask_truncated_completions=s["MASK_TRUNCATED_COMPLETIONS"],
            reward_weights=s["REWARD_WEIGHTS"],
            use_transformers_continuous_batching=s["USE_TRANSFORMERS_CONTINUOUS_BATCHING"],
            cache_implementation=s["CACHE_IMPLEMENTATION"],
            use_vllm=s["USE_VLLM"] is True,
            vllm_mode=s["VLLM_MODE"],
            vllm_gpu_memory_utilization=plan.vllm_memory_share(s["VLLM_GPU_MEMORY_UTILIZATION"]),
            vllm_enable_sleep_mode=s["VLLM_ENABLE_SLEEP_MODE"],
            vllm_server_base_url=s["VLLM_SERVER_BASE_URL"] or None,
            learning_rate=s["LEARNING_RATE"],
            warmup_steps=s["WARMUP_STEPS"],
            per_device_train_batch_size=s["PER_DEVICE_TRAIN_BATCH_SIZE"],
            gradient_accumulation_steps=s["GRADIENT_ACCUMULATION_STEPS"],
            num_train_epochs=s["NUM_TRAIN_EPOCHS"],
            max_steps=s["MAX_STEPS"],
            bf16=s["BF16"],
            seed=s["SEED"],
            ddp_timeout=s["DDP_TIMEOUT"],
            report_to=preflight.trackers(s["REPORT_TO"]),
            logging_steps=s["LOGGING_STEPS"],
            # a logged batch to OUTPUT_DIR/completions/*.parquet and the trackers' table, every LOG_COMPLETIONS_STEPS
            log_completions=s["LOG_COMPLETIONS_STEPS"] > 0,
            num_completions_to_print=0,
            save_steps=s["SAVE_STEPS"],
            save_total_limit=s["SAVE_TOTAL_LIMIT"],
            use_cpu=cpu_only,
            # LoRA gives every adapter weight a gradient: skip DDP's search for unused ones
            ddp_find_unused_parameters=False,
            gradient_checkpointing=s["ACTIVATION_CHECKPOINTING"],
        )
    except (ValueError, ImportError) as err:  # GRPOConfig's own checks, e.g. of a --field=value
        raise errors.ConfigError(f"GRPOConfig refuses these settings: {errors.first_line(err)}") from None


def build_model_init_kwargs(s, cpu_only):
    """from_pretrained's arguments: dtype and attention kernel; under FSDP, device_map=None, which TRL 1.16 sets for
    DDP and DeepSpeed but not FSDP, where its "auto" would place the whole model on each rank's GPU before sharding."""
    kwargs = hardware.model_init_kwargs(s["ATTN_IMPLEMENTATION"], s["BF16"], cpu_only)
    kwargs["trust_remote_code"] = s["TRUST_REMOTE_CODE"]  # TRL's default too: set here, no --model_init_kwargs sets it
    return {**kwargs, "device_map": None} if hardware.fsdp_version() else kwargs


def build_peft_config(s):
    from peft import LoraConfig

    return LoraConfig(
        r=s["LORA_R"],
        lora_alpha=s["LORA_ALPHA"],
        lora_dropout=s["LORA_DROPOUT"],
        target_modules=preflight.lora_targets(s["LORA_TARGET_MODULES"]),
        task_type="CAUSAL_LM",
    )


def build_trainer(s, config, reward_funcs, train_dataset):
    """GRPOTrainer on MODEL_NAME with the LoRA config (TRL loads and wraps the model). A failed
    load is the one-line MODEL_NAME message; any other error is a bug and keeps its traceback."""
    from trl import GRPOTrainer

    try:
        trainer = GRPOTrainer(
            model=s["MODEL_NAME"],
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=train_dataset,
            peft_config=build_peft_config(s),
            quantization_config=hardware.quantization_config(s["LOAD_IN_4BIT"], s["BF16"]),
        )
    except Exception as err:
        if not errors.is_load_error(err):
            raise
        raise errors.ConfigError(f"MODEL_NAME={s['MODEL_NAME']} could not be loaded: {err}") from None
    if s["LOAD_IN_4BIT"]:  # TRL casts a quantized model's adapter to bf16, where small updates round away
        from grpo import guards

        guards.adapter_in_fp32(trainer.model)
    return trainer


def load_data(s):
    """The training set and, when EVAL_BEFORE/EVAL_AFTER ask, the test set: a missing split fails now."""
    options = dict(config=s["DATASET_CONFIG"], skip_bad_rows=s["SKIP_BAD_ROWS"], system_prompt=s["SYSTEM_PROMPT"])
    train_dataset = gsm8k.load(s["DATASET"], "train", limit=s["MAX_SAMPLES"], **options)
    evals = max(s["EVAL_BEFORE"], s["EVAL_AFTER"], s["EVAL_SUBSET"] if s["EVAL_STEPS"] else 0)
    eval_dataset = gsm8k.load(s["DATASET"], "test", limit=evals, **options) if evals else None
    return train_dataset, eval_dataset


def train(s, record, config, reward_funcs, datasets, started):
    """One run in its locked OUTPUT_DIR: resume or start, train, save, score, mark it finished, say so in a line."""
    train_dataset, eval_dataset = datasets
    from grpo import guards, monitor  # transformers' callbacks: imported once the settings are known good

    out = s["OUTPUT_DIR"]
    rank0 = config.process_index == 0
    last = checkpoints.resume_checkpoint(
        out,
        resume=s["RESUME"],
        model_name=s["MODEL_NAME"],
        lora_r=s["LORA_R"],
        lora_alpha=s["LORA_ALPHA"],
        target_modules=s["LORA_TARGET_MODULES"],
        main_process=rank0,
    )
    record = checkpoints.resumed_record(out, record, last)  # refuses settings that change what the run is
    log.info("model %s, %s%s", s["MODEL_NAME"], config.model_init_kwargs, f"; resuming from {last}" if last else "")
    # a SIGTERM from here on says what the rerun does; past STOP_GRACE the step is given up
    stopper = guards.StopOnSignal(resuming=last, grace=s["STOP_GRACE"])
    trainer = build_trainer(s, config, reward_funcs=reward_funcs, train_dataset=train_dataset)
    # advice and the NaN stop; SIGTERM and Ctrl-C; samples in TensorBoard; TRL's generation choices undone
    scoring = dict(dataset=eval_dataset, batch_size=s["EVAL_BATCH_SIZE"], settings=record, samples=s["EVAL_SAMPLES"])
    health = monitor.HealthMonitor(monitor.Thresholds.from_settings(s), trainer).install(trainer)
    # EVAL_BEFORE, EVAL_STEPS and EVAL_AFTER inside train(), through the trainer's log to every tracker
    held_out = monitor.HeldOutEval(
        trainer,
        every=s["EVAL_STEPS"],
        subset=s["EVAL_SUBSET"],
        scoring=scoring,
        before=0 if last else s["EVAL_BEFORE"],
        after=s["EVAL_AFTER"],
        finished=lambda: not (stopper.signal_name or health.stopped),
    ).install(trainer)
    callbacks = [stopper, monitor.PerfMonitor(trainer), monitor.CompletionSamples(trainer, s["LOG_COMPLETIONS_STEPS"])]
    callbacks.append(guards.ResumedSettings())  # this run's SAVE_STEPS and learning rate on resume
    for callback in callbacks + guards.generation_guards(trainer):
        trainer.add_callback(callback)
    files.write_settings(out, record, rank0)  # what evaluate.py --ADAPTER=OUTPUT_DIR reads back
    try:
        if last and checkpoints.reached(last, s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"]):
            checkpoints.restore(trainer, last)  # cut after its last checkpoint: finish, no step
            held_out.score("after", s["EVAL_AFTER"])
        else:
            trainer.train(resume_from_checkpoint=str(last) if last else None)
    finally:
        stopper.restore()
    if not (stopper.signal_name or health.stopped):
        checkpoints.save_adapter(trainer, out, rank0)  # the LoRA adapter, the tokenizer and the adapter's step
        if rank0:  # our card over TRL's, then run_finished.json, then the last lines
            ends = {"max_steps": s["MAX_STEPS"], "num_train_epochs": s["NUM_TRAIN_EPOCHS"], "resumed": bool(last)}
            before = held_out.metrics.get("before")
            after = held_out.metrics.get("after")
            before = modelcard.finish_run(trainer.state, out, record, metrics=(before, after), **ends)
            sums.log_summary(out, record["profile"])  # --demo: its one before -> after line
            log.info(gsm8k.summary_line(trainer.state.global_step, started, (before, after)))
    trainer.accelerator.wait_for_everyone()  # no rank exits while another uses the process group
    trainer.accelerator.end_training()  # ... which is then torn down, as accelerate asks at the end
    if stopper.signal_name:  # the step it stopped at was checkpointed: the same command resumes
        log.warning(stopper.message())
        raise SystemExit(stopper.exit_code)
    if health.stopped:
        raise errors.ConfigError(f"training stopped: {health.stopped.message}")
    return trainer


def check_and_plan(s, args, cpu_only, machine=True):
    """(settings, datasets, plan): USE_VLLM=auto chosen, the settings checked in seconds (without `machine`, for
    --plan, not what only training needs of this machine: a GPU, bf16, kernels), the data loaded and the plan made
    from the model's config alone. The profiles' models are named here, built later (never for --plan)."""
    s, note = plan.resolve_generation(s, hardware.on_gpu(cpu_only), hardware.importable("vllm"))
    preflight.refuse_bad_settings(s, cpu_only, known_rewards=rewards.REWARDS, fields=args.fields, machine=machine)
    if args.profile == "demo":
        s = sums.prepare(s, args.given, build=machine)  # its task and warm-started Qwen3
    if args.profile == "real":
        s = real.prepare(s, args.given)  # its task, and bf16 where the CPU has it
    train_dataset, eval_dataset = load_data(s)
    if machine:  # before the smoke model is written: a refusal leaves OUTPUT_DIR untouched
        config = build_config(s, args.fields, cpu_only, train_dataset=train_dataset)
        preflight.refuse_bad_grpo_config(config, s, len(train_dataset))
    if args.profile == "smoke" and "MODEL_NAME" not in args.given:  # a tiny Qwen3
        s["MODEL_NAME"] = str(Path(s["OUTPUT_DIR"]) / "smoke-model")
        if machine:  # its LoRA targets checked against its config first; then built
            preflight.refuse_misfit_model(s, config=profiles.model_config())
            profiles.cpu_model(s["OUTPUT_DIR"])
    sizes = {"train": len(train_dataset), "test": len(eval_dataset or [])}
    s, run_plan = plan.for_run(s, sizes, hardware.world_size(), note=note, cuda=hardware.on_gpu(cpu_only))
    return s, (train_dataset, eval_dataset), run_plan


def main(argv=()):
    argv, show_plan = plan.take_flag(argv)
    config_class = "trl.trainer.grpo_config:GRPOConfig"  # read from its source: TRL is not imported yet
    options = dict(profiles=profile_settings, config_class=config_class, owned=owned, source=__file__)
    args = cli.parse(cli.constants(globals()), argv, **options)
    started = time.monotonic()
    s = dict(args.settings)
    cpu_only = args.profile is not None
    cli.setup_logging("grpotrainer", hardware.is_main_process())
    for note in args.notes:  # TRL names read as constants, recipe keys ignored: a line each
        log.info(note)
    done = s["RESUME"] and checkpoints.finished(s["OUTPUT_DIR"], s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"])
    if done and not show_plan:
        return log.info(done)  # a finished run, run again: said in a second, before TRL or the demo's warm start
    cli.require(("torch", "transformers", "trl", "peft", "datasets", "accelerate"), "grpotrainer.py")
    s, datasets, run_plan = check_and_plan(s, args, cpu_only, machine=not show_plan)
    if show_plan:  # --plan or --plan=json: what the run will do, and nothing more
        return print(plan.plan_json(run_plan) if show_plan == "json" else plan.format_plan(run_plan), flush=True)
    log.info(plan.format_plan(run_plan))
    bound = dict(max_completion_length=s["MAX_COMPLETION_LENGTH"], enable_thinking=s["ENABLE_THINKING"])  # rewards'
    reward_funcs = reward_guard.load(s["REWARD_FUNCS"], rewards.REWARDS, timeout=s["REWARD_TIMEOUT"], **bound)
    config = build_config(s, args.fields, cpu_only, train_dataset=datasets[0])
    preflight.refuse_before_loading(
        s, config, reward_funcs=reward_funcs, train_dataset=datasets[0], answer_blind=rewards.ANSWER_BLIND
    )
    sizes = {"train": run_plan["train_problems"], "test": run_plan["test_problems"]}  # for the model card
    record = {**s, "grpo_config": args.fields, "profile": args.profile, "dataset_sizes": sizes}
    from grpo import guards

    lock = guards.output_lock(s["OUTPUT_DIR"], config.process_index == 0)
    with lock, guards.faults(s["OUTPUT_DIR"], s["DDP_TIMEOUT"]):
        return train(s, record, config, reward_funcs=reward_funcs, datasets=datasets, started=started)


if __name__ == "__main__":
    cli.run(main)
