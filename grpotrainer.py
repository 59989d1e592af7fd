"""GRPO-tune a Qwen model on GSM8K with TRL's GRPOTrainer and LoRA.

    python grpotrainer.py                          # train with the constants below (CUDA GPU, bf16)
    python grpotrainer.py --smoke                  # the same pipeline offline on CPU in seconds (--demo: it learns)
    python grpotrainer.py --LEARNING_RATE=2e-5     # a constant as --KEY=value (--help lists them); --top_p=0.9 ...
    torchrun --nproc_per_node 4 grpotrainer.py     # data-parallel; docs/launch.md: DeepSpeed, FSDP, several nodes

TRL does the GRPO loss, LoRA, logging, checkpointing and distributed launch. This file adds what GSM8K needs: the
prompt and data (gsm8k.py), rewards (rewards.py), checks in seconds (preflight.py), advice (monitor.py) and run
safety (runguard.py). Watch a run with `tensorboard --logdir outputs` (see README).
"""

import logging

import cli
import demo
import gsm8k
import hardware
import modelcard
import preflight
import rewards
import smoke

# ---------------------------------------------------------------------------------------------------------------
# model
MODEL_NAME = "Qwen/Qwen3-8B"  # Hub id, or a local folder holding config.json + weights (see README)
TRUST_REMOTE_CODE = False  # run a model repo's own Python code; Qwen3 needs none, so leave it off
ATTN_IMPLEMENTATION = "auto"  # auto = fastest installed on CUDA in bf16 (docs/gpu.md), else sdpa; or sdpa, eager, ...
LOAD_IN_4BIT = False  # QLoRA: 4-bit NF4 base weights via bitsandbytes (CUDA only); ~1/4 of the weight memory
ENABLE_THINKING = False  # Qwen3 thinking mode; needs MAX_COMPLETION_LENGTH >= 1024 or every reward is 0
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
SYSTEM_PROMPT = gsm8k.SYSTEM_PROMPT  # the instruction before every problem; asks for a last line "#### <number>"
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
REWARD_FUNCS = ["correctness_reward", "format_reward"]  # names from rewards.REWARDS, or "module:function"
REWARD_WEIGHTS = [1.0, 0.2]  # one weight per reward function; correctness should dominate
USE_TRANSFORMERS_CONTINUOUS_BATCHING = False  # generate with transformers' paged continuous batching (no vLLM)
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
SEED = 42  # seeds LoRA init, sampling and data order
DDP_TIMEOUT = 600  # seconds a torchrun process waits for the others before the run stops, naming a stall
# logging / output
OUTPUT_DIR = "outputs/qwen3-gsm8k-grpo"  # checkpoints, final adapter, run_settings.json and TensorBoard runs/
REPORT_TO = "tensorboard"  # tensorboard, trackio, wandb or none
LOGGING_STEPS = 1  # log every N optimiser steps
SAVE_STEPS = 50  # checkpoint every N steps; a killed run loses at most this many
SAVE_TOTAL_LIMIT = 3  # keep only the newest N checkpoints
RESUME = True  # continue from the newest checkpoint-N in OUTPUT_DIR when there is one
EVAL_BEFORE = 0  # GSM8K test problems scored before training (eval/gsm8k_* at step 0); 0 = off, 1319 = all
EVAL_AFTER = 0  # the same after training, at the final step; 0 = off (python evaluate.py does it standalone)
EVAL_BATCH_SIZE = 64  # prompts per generate() call in EVAL_BEFORE/EVAL_AFTER; lower it on out-of-memory
EVAL_SAMPLES = 4  # answers sampled per problem at TEMPERATURE there too (eval/gsm8k_sampled_accuracy); 0 = off
# health advice (monitor.py), printed and written to TensorBoard's Text tab
KL_WARN = 10.0  # warn when train/kl, the mean per-token KL, exceeds this
KL_ACT = 20.0  # advise raising BETA / lowering LEARNING_RATE when train/kl exceeds this
ZERO_STD_FRAC = 0.9  # advise when frac_reward_zero_std (0-1) is at least this ...
ZERO_STD_LOGS = 5  # ... for this many logs in a row: the reward does not tell a group's completions apart
REWARD_FLAT_WINDOW = 50  # logs; the mean reward is "flat" if its two halves differ by < REWARD_FLAT_DELTA; 0 = off
REWARD_FLAT_DELTA = 0.02  # in reward units (correctness 0-1 plus weighted format)
CLIPPED_RATIO_MAX = 0.2  # advise raising MAX_COMPLETION_LENGTH when more completions (0-1) than this are cut off
GRAD_NORM_MAX = 100.0  # advise lowering LEARNING_RATE when grad_norm exceeds this (divergence without NaN)
# ---------------------------------------------------------------------------------------------------------------

profiles = {"smoke": smoke.PROFILE, "demo": demo.PROFILE}  # offline on the CPU in fp32 (smoke.py, demo.py)
owned = {"chat_template_kwargs": "ENABLE_THINKING", "model_init_kwargs": "ATTN_IMPLEMENTATION", "use_cpu": "--smoke"}
owned |= {"gradient_checkpointing": "ACTIVATION_CHECKPOINTING", "resume_from_checkpoint": "RESUME"}
log = logging.getLogger("grpotrainer")


def build_config(s, fields, cpu_only):
    """The GRPOConfig for the settings `s`, plus lower-case `fields` from the command line, checked by TRL."""
    from trl import GRPOConfig

    if cpu_only:  # one thread (a given MODEL_NAME too); gloo with DDP_TIMEOUT, which transformers drops on CPU
        hardware.one_cpu_thread()
        hardware.init_cpu_process_group(s["DDP_TIMEOUT"])
    try:
        return GRPOConfig(
            output_dir=s["OUTPUT_DIR"],
            trust_remote_code=s["TRUST_REMOTE_CODE"],
            model_init_kwargs=hardware.model_init_kwargs(s["ATTN_IMPLEMENTATION"], s["BF16"], cpu_only),
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
            use_vllm=s["USE_VLLM"],
            vllm_mode=s["VLLM_MODE"],
            vllm_gpu_memory_utilization=s["VLLM_GPU_MEMORY_UTILIZATION"],
            vllm_enable_sleep_mode=s["VLLM_ENABLE_SLEEP_MODE"],
            vllm_server_base_url=s["VLLM_SERVER_BASE_URL"] or None,
            learning_rate=s["LEARNING_RATE"],
            per_device_train_batch_size=s["PER_DEVICE_TRAIN_BATCH_SIZE"],
            gradient_accumulation_steps=s["GRADIENT_ACCUMULATION_STEPS"],
            num_train_epochs=s["NUM_TRAIN_EPOCHS"],
            max_steps=s["MAX_STEPS"],
            bf16=s["BF16"],
            seed=s["SEED"],
            ddp_timeout=s["DDP_TIMEOUT"],
            report_to=[] if s["REPORT_TO"] == "none" else [s["REPORT_TO"]],
            logging_steps=s["LOGGING_STEPS"],
            log_completions=True,  # each logged batch to OUTPUT_DIR/completions/*.parquet: the completions table
            num_completions_to_print=0,  # ... and not to the console
            save_steps=s["SAVE_STEPS"],
            save_total_limit=s["SAVE_TOTAL_LIMIT"],
            use_cpu=cpu_only,
            ddp_find_unused_parameters=False,  # LoRA gives every adapter weight a gradient: skip DDP's extra search
            gradient_checkpointing=s["ACTIVATION_CHECKPOINTING"],
            **fields,
        )
    except Exception as err:  # GRPOConfig's own checks, e.g. on a --field=value (ValueError, ImportError, ...)
        raise cli.ConfigError(f"GRPOConfig refuses these settings: {type(err).__name__}: {err}") from None


def build_peft_config(s):
    from peft import LoraConfig

    targets, alpha, dropout = preflight.lora_targets(s["LORA_TARGET_MODULES"]), s["LORA_ALPHA"], s["LORA_DROPOUT"]
    return LoraConfig(
        r=s["LORA_R"], lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, task_type="CAUSAL_LM"
    )


def build_trainer(s, config, reward_funcs, train_dataset):
    """GRPOTrainer on MODEL_NAME with the LoRA config (TRL loads and wraps the model); a failed load exits 2."""
    from safetensors import SafetensorError
    from trl import GRPOTrainer

    try:
        return GRPOTrainer(
            model=s["MODEL_NAME"],
            reward_funcs=reward_funcs,
            args=config,
            train_dataset=train_dataset,
            peft_config=build_peft_config(s),
            quantization_config=hardware.quantization_config(s["LOAD_IN_4BIT"], s["BF16"]),
        )
    except (OSError, SafetensorError, ValueError, TypeError, RuntimeError, ImportError, KeyError) as err:
        raise cli.ConfigError(f"MODEL_NAME={s['MODEL_NAME']} could not be loaded with these settings: {err}") from None


def load_data(s):
    """The training set and, when EVAL_BEFORE/EVAL_AFTER ask for it, the test set: a missing split fails now."""
    evals = max(s["EVAL_BEFORE"], s["EVAL_AFTER"])
    kwargs = dict(config=s["DATASET_CONFIG"], skip_bad_rows=s["SKIP_BAD_ROWS"], system_prompt=s["SYSTEM_PROMPT"])
    train = gsm8k.load(s["DATASET"], "train", limit=s["MAX_SAMPLES"], **kwargs)
    return train, gsm8k.load(s["DATASET"], "test", limit=evals, **kwargs) if evals else None


def train(s, record, config, reward_funcs, train_dataset, eval_dataset, runguard):
    """One run in its locked OUTPUT_DIR: resume or start, train, then save, score, and mark the run finished."""
    import monitor

    rank0, lora = config.process_index == 0, (s["LORA_R"], s["LORA_ALPHA"], s["LORA_TARGET_MODULES"])
    last = runguard.resume_checkpoint(s["OUTPUT_DIR"], s["RESUME"], s["MODEL_NAME"], *lora, main_process=rank0)
    log.info("model %s, %s%s", s["MODEL_NAME"], config.model_init_kwargs, f"; resuming from {last}" if last else "")
    trainer = build_trainer(s, config, reward_funcs, train_dataset)
    health, stopper = monitor.HealthMonitor(monitor.Thresholds.from_settings(s), trainer), runguard.StopOnSignal()
    for callback in (health, stopper, monitor.CompletionSamples(trainer)):  # advice, NaN stop; SIGTERM; samples
        trainer.add_callback(callback)
    gsm8k.write_settings(s["OUTPUT_DIR"], record, rank0)  # what evaluate.py --ADAPTER=OUTPUT_DIR reads back
    evals = (eval_dataset, s["EVAL_BATCH_SIZE"], record, s["EVAL_SAMPLES"])
    before = gsm8k.evaluate_trainer(trainer, "before", 0 if last else s["EVAL_BEFORE"], *evals)  # resumed: done
    try:
        if last and runguard.reached(last, s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"]):  # cut after its last checkpoint
            runguard.restore(trainer, last)
        else:
            trainer.train(resume_from_checkpoint=str(last) if last else None)
    finally:
        stopper.restore()
    if not (stopper.signal_name or health.stopped):
        trainer.save_model(s["OUTPUT_DIR"])  # the LoRA adapter and the tokenizer
        after = gsm8k.evaluate_trainer(trainer, "after", s["EVAL_AFTER"], *evals)
        if rank0:  # our card, after save_model rewrote TRL's (see modelcard.py); then the run is finished
            step, epoch = trainer.state.global_step, trainer.state.epoch
            before = modelcard.read_metrics(s["OUTPUT_DIR"])[0] if last else before  # from the first run
            modelcard.write_card(s["OUTPUT_DIR"], record, metrics_before=before, metrics_after=after, steps=step)
            runguard.mark_finished(s["OUTPUT_DIR"], step, epoch, s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"])
    trainer.accelerator.wait_for_everyone()  # no rank exits while another still uses the process group
    trainer.accelerator.end_training()  # ... which is then torn down, as accelerate asks at the end of a script
    if stopper.signal_name:  # the step it stopped at was checkpointed: the same command resumes
        log.warning(stopper.message())
        raise SystemExit(stopper.exit_code)
    if health.stopped:
        raise cli.ConfigError(f"training stopped: {health.stopped.message}")
    return trainer


def main(argv=()):
    args = cli.parse(cli.constants(globals()), argv, profiles, "trl:GRPOConfig", owned, __file__)
    s, cpu_only = dict(args.settings), args.profile is not None
    cli.setup_logging("grpotrainer", hardware.is_main_process())
    cli.require(("torch", "transformers", "trl", "peft", "datasets", "accelerate"), "grpotrainer.py")
    preflight.check(s, cpu_only)  # every setting, in seconds
    s = demo.prepare(s, args.given) if args.profile == "demo" else s  # its task and warm-started Qwen3 (demo.py)
    train_dataset, eval_dataset = load_data(s)
    reward_funcs = rewards.load(s["REWARD_FUNCS"], s["MAX_COMPLETION_LENGTH"], s["ENABLE_THINKING"])
    import runguard  # transformers' callbacks: imported once the settings and data are known to be good

    if s["RESUME"] and (done := runguard.finished(s["OUTPUT_DIR"], s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"])):
        return log.info(done)  # a finished run, run again, changes nothing
    if args.profile == "smoke" and "MODEL_NAME" not in args.given:  # before GRPOConfig starts torch.distributed
        s["MODEL_NAME"] = smoke.cpu_model(s["OUTPUT_DIR"])  # a tiny Qwen3 in OUTPUT_DIR/smoke-model; one thread
    config = build_config(s, args.fields, cpu_only)
    preflight.check_loaded(s, config, reward_funcs, train_dataset)  # rewards on real rows, the model's config
    sizes = {"train": len(train_dataset), "test": len(eval_dataset or [])}  # recorded, for the model card
    record = {**s, "grpo_config": args.fields, "profile": args.profile, "dataset_sizes": sizes}
    out = s["OUTPUT_DIR"]
    with runguard.output_lock(out, config.process_index == 0), runguard.faults(out, s["DDP_TIMEOUT"]):
        return train(s, record, config, reward_funcs, train_dataset, eval_dataset, runguard)


if __name__ == "__main__":
    cli.run(main)
