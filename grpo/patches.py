"""Workarounds for what TRL 1.16 and transformers 5.17 do that a run must undo or reach, each naming the why."""

import functools
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from grpo import files, hardware, weight_sync


class ResumedSettings(TrainerCallback):
    """A resumed run takes this run's save and logging intervals (Trainer restores the checkpoint's) and this run's
    learning rate at the step reached (the optimizer keeps the old schedule's, 0 if the run was made longer)."""

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
    """Put fp32 tensors back after `generate_batch`, before which TRL 1.16 casts the whole model to bf16 (Adam steps
    of 1e-5 would round away, rotary `inv_freq` drift); the cast swaps `.data` for new tensors, sparing the old."""

    def __init__(self, model):
        self.model = model
        self.params = []  # (parameter, its fp32 tensor), taken at each step's start
        buffers = [(module, name, buffer) for module in model.modules() for name, buffer in module._buffers.items()]
        self.buffers = [(m, name, b) for m, name, b in buffers if b is not None and b.dtype == torch.float32]
        generate_batch = model.generate_batch

        def generate_then_restore(*args, **kwargs):
            try:
                return generate_batch(*args, **kwargs)
            finally:
                self.restore()

        model.generate_batch = generate_then_restore

    def on_step_begin(self, args, state, control, **kwargs):
        self.params = [(p, p.data) for p in self.model.parameters() if p.dtype == torch.float32]

    on_train_begin = on_step_begin

    def restore(self):
        for param, data in self.params:
            param.data = data
        for module, name, buffer in self.buffers:
            module._buffers[name] = buffer


def adapter_in_fp32(model):
    """A 4-bit model's trainable weights back in fp32: TRL 1.16 casts them to bf16, where 1e-5 updates round away."""
    for param in model.parameters():
        if param.requires_grad and param.dtype != torch.float32:
            param.data = param.data.float()


class CompileDecode(TrainerCallback):
    """A static cache's decode step compiled: TRL 1.16 sets disable_compile=True on its GenerationConfig."""

    def __init__(self, generation_config):
        self.generation_config = generation_config

    def on_train_begin(self, args, state, control, **kwargs):
        self.generation_config.disable_compile = False
        self.generation_config.compile_config = hardware.decode_options("static")["compile_config"]


def after_init(trainer, load_in_4bit):
    """Before training: a 4-bit adapter in fp32, vLLM's sync out of place, trackio at the step, no credential in
    the arguments, which every checkpoint saves (the model is loaded by now)."""
    if load_in_4bit:
        adapter_in_fp32(trainer.model)
    weight_sync.install(trainer)
    trackio_at_step(trainer)
    files.redact_fields(trainer.args)


def trackio_at_step(trainer):
    """TrackioCallback's on_log at the trainer's step: it logs without one, so held-out points landed off the axis."""
    from transformers.integrations.integration_utils import TrackioCallback, rewrite_logs

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
    """The callbacks above that this trainer's arguments need."""
    callbacks = [ResumedSettings(), UmaskFiles()]
    if trainer.args.cache_implementation == "static":
        callbacks.append(CompileDecode(trainer.generation_config))
    if trainer.args.use_transformers_continuous_batching and trainer.args.bf16:
        callbacks.append(KeepFp32(trainer.model))
    return callbacks


def latest_rewards(trainer):
    """The newest batch's rewards per reward function, from GRPOTrainer's private `_logs`; None when missing."""
    logs = getattr(trainer, "_logs", None)
    if not isinstance(logs, dict) or "rewards" not in logs:
        return None
    return [list(logs["rewards"][name]) for name in trainer.reward_func_names]


def time_generation(trainer):
    """Count calls and wall seconds of `trainer._generate`, which every generation goes through (no public hook)."""
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
