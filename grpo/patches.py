"""Workarounds for what TRL 1.16 and transformers 5.17 do that this project's runs must undo or reach: each names
the library behaviour it answers, and reaches into private state only where no public hook exists.

- `ResumedSettings`: a resumed run's SAVE_STEPS, LOGGING_STEPS and learning-rate schedule.
- `KeepFp32`, `adapter_in_fp32`: TRL's casts of fp32 weights to bf16 (continuous batching, 4-bit).
- `CompileDecode`: TRL's generation config that never compiles the static-cache decode step.
- `time_generation`, `latest_rewards`: generation's wall time and the newest batch's rewards, which TRL keeps private.
"""

import functools
import time
from pathlib import Path

from transformers import TrainerCallback

from grpo import files, hardware, weight_sync


class ResumedSettings(TrainerCallback):
    """A resumed run takes this run's SAVE_STEPS and LOGGING_STEPS, and the learning rate of the schedule Trainer
    built for this run's length at the step reached (README: resuming).

    Trainer restores the checkpoint's trainer_state.json over the new intervals (its old SAVE_STEPS would then
    decide what a kill loses), and the optimizer's learning rate is the old schedule's: after a raised MAX_STEPS,
    the old end's 0 for the first resumed step. The new scheduler (its length, warm-up and decay) then runs from
    the next step only. On a fresh start, or a resume at the same length, both are what Trainer has already.
    """

    def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        state.compute_steps(args, state.max_steps)
        scheduler = getattr(lr_scheduler, "scheduler", lr_scheduler)  # accelerate's wrapper, when there is one
        if optimizer is None or not hasattr(scheduler, "lr_lambdas"):  # not a LambdaLR (DeepSpeed's own)
            return
        step = scheduler.last_epoch
        rates = [base * rate(step) for base, rate in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]
        for group, lr in zip(optimizer.param_groups, rates, strict=True):
            group["lr"] = lr
        scheduler._last_lr = rates  # what get_last_lr(), the logged learning_rate, reads; no public setter


class KeepFp32(TrainerCallback):
    """Keep what the model holds in fp32 in fp32 under USE_TRANSFORMERS_CONTINUOUS_BATCHING with BF16.

    TRL 1.16 casts the whole model to bf16 right before `generate_batch` and never back: the LoRA weights would then
    train in bf16 (an Adam step of 1e-5 rounds away above ~3e-3), and the rotary `inv_freq` drifts 0.35 rad of phase
    at position 300. Right after generation this puts back every fp32 tensor held here (torch's cast swaps `.data`
    for a new tensor, so the originals stay intact). No public hook sits between generation and the loss, so
    `generate_batch` is wrapped on the PeftModel TRL generates with.
    """

    def __init__(self, model):
        import torch

        self.model = model
        self.params = []  # (parameter, its fp32 tensor), taken at each step's start
        self.buffers = [
            (module, name, buffer)
            for module in model.modules()
            for name, buffer in module._buffers.items()
            if buffer is not None and buffer.dtype == torch.float32
        ]
        generate_batch = model.generate_batch

        def generate_then_restore(*args, **kwargs):
            try:
                return generate_batch(*args, **kwargs)
            finally:
                self.restore()

        model.generate_batch = generate_then_restore

    def on_step_begin(self, args, state, control, **kwargs):
        import torch

        self.params = [(p, p.data) for p in self.model.parameters() if p.dtype == torch.float32]

    on_train_begin = on_step_begin

    def restore(self):
        for param, data in self.params:
            param.data = data
        for module, name, buffer in self.buffers:
            module._buffers[name] = buffer


def adapter_in_fp32(model):
    """Put the trainable (LoRA) weights of a 4-bit model back in fp32, before the optimizer is built: TRL 1.16 casts
    them to bf16, where at LEARNING_RATE=1e-5 75 % of q_proj's lora_A entries never move (updates round away)."""
    import torch

    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


class CompileDecode(TrainerCallback):
    """CACHE_IMPLEMENTATION=static in training: TRL 1.16 builds its GenerationConfig with disable_compile=True, so
    the decode step would never compile. This turns it back on, on trainer.generation_config (no public hook)."""

    def __init__(self, generation_config):
        self.generation_config = generation_config

    def on_train_begin(self, args, state, control, **kwargs):
        self.generation_config.disable_compile = False
        self.generation_config.compile_config = hardware.decode_options("static")["compile_config"]


def after_init(trainer, load_in_4bit):
    """What a built trainer needs before it trains: a 4-bit model's adapter back in fp32, trackio's logs at the
    trainer's step, and no credential left in its arguments, which Trainer saves with every checkpoint
    (training_args.bin) and the trackers record (the model is loaded by now: the token has done its job)."""
    if load_in_4bit:
        adapter_in_fp32(trainer.model)
    weight_sync.install(trainer)  # vLLM gets base + LoRA summed aside, never merged into the trained model
    trackio_at_step(trainer)
    files.redact_fields(trainer.args)


def trackio_at_step(trainer):
    """transformers' TrackioCallback logs without a step, so trackio counts its own: held-out points landed at 0, 2,
    10 beside training's 1, 3, 5. Its on_log again, at the trainer's step (the callback has no setting for it)."""
    from transformers.integrations import TrackioCallback
    from transformers.integrations.integration_utils import rewrite_logs

    def on_log(args, state, control, model=None, logs=None, callback=None, **kwargs):
        if not callback._initialized:
            callback.setup(args, state, model)
        if state.is_world_process_zero:
            logs = rewrite_logs({k: v for k, v in (logs or {}).items() if not k.startswith(("train_", "total_flos"))})
            callback._trackio.log({**logs, "train/global_step": state.global_step}, step=state.global_step)

    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TrackioCallback):
            callback.on_log = functools.partial(on_log, callback=callback)


class UmaskFiles(TrainerCallback):
    """Each checkpoint's weights as readable as the user's umask allows: safetensors writes them 0600."""

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            files.honour_umask(Path(args.output_dir) / f"checkpoint-{state.global_step}")


def callbacks(trainer):
    """The callbacks undoing what TRL 1.16 and transformers do that this run's settings meet: a resumed run's
    intervals and schedule (ResumedSettings), private weight files (UmaskFiles), static-cache compilation
    (CompileDecode), fp32 weights (KeepFp32)."""
    callbacks = [ResumedSettings(), UmaskFiles()]
    if trainer.args.cache_implementation == "static":
        callbacks.append(CompileDecode(trainer.generation_config))
    if trainer.args.use_transformers_continuous_batching and trainer.args.bf16:
        callbacks.append(KeepFp32(trainer.model))
    return callbacks


def latest_rewards(trainer):
    """The newest batch's rewards, one list per reward function, over all processes. GRPOTrainer keeps them in
    its private `_logs` and has no public hook: read here only, None when missing (another TRL version)."""
    logs = getattr(trainer, "_logs", None)
    if not isinstance(logs, dict) or "rewards" not in logs:
        return None
    return [list(logs["rewards"][name]) for name in trainer.reward_func_names]


def time_generation(trainer):
    """Wrap `trainer._generate` so that its wall seconds add up in the returned dict's "seconds"; return the dict.

    TRL 1.16 has no public hook around generation: GRPOTrainer._generate is the one method through which every
    generation round goes (HF generate, paged batching or vLLM), prompts in, completion ids out, so the time spent in
    it is generation's share of a step. Rewards and log-probs are computed outside it."""
    original = trainer._generate
    clock = {"seconds": 0.0, "calls": 0}

    @functools.wraps(original)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            clock["seconds"] += time.perf_counter() - start
            clock["calls"] += 1

    trainer._generate = timed
    return clock
