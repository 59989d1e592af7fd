"""What a run will do (`--plan`), before anything heavy loads: steps, generation calls, evaluation points,
checkpoints, and from the model's config time estimates on common GPUs, from an explicit arithmetic model.
"""

import json
import math
import os
from pathlib import Path

from grpo import hub
from grpo.settings import config_kwargs, levers

# --------------------------------------------------------------------------------------------------
# hardware: per-GPU memory bandwidth (GB/s), dense bf16 tensor-core TFLOP/s (no sparsity), memory (GB), from NVIDIA's
# data sheets of the H100 SXM5 80 GB, H200 SXM 141 GB, A100 SXM 80 GB and L40S, and for the RTX 4090 (bf16 with fp32
# accumulation) the Ada whitepaper's appendix.
gpus = {
    "H100": {"bandwidth_gbs": 3350, "bf16_tflops": 989, "memory_gb": 80},
    "H200": {"bandwidth_gbs": 4800, "bf16_tflops": 989, "memory_gb": 141},
    "A100-80GB": {"bandwidth_gbs": 2039, "bf16_tflops": 312, "memory_gb": 80},
    "L40S": {"bandwidth_gbs": 864, "bf16_tflops": 362, "memory_gb": 48},
    "RTX 4090": {"bandwidth_gbs": 1008, "bf16_tflops": 165, "memory_gb": 24},
}
# the time model's assumptions, each an estimate until the GPU check measures it (in the plan's JSON)
assumptions = dict(
    launches_per_token_reference=4100,  # kernel launches per decoded token, HF eager generate, unmerged LoRA ...
    launches_reference_layers=36,  # ... counted by torch.profiler at Qwen3-8B depth; scaled by layer count
    launch_seconds=10e-6,  # host cost per kernel launch (Python dispatch): 4,100 x 10 us = ~40 ms/token
    train_launch_factor=4,  # a micro-batch's launches vs one decode token: forward, recompute, backward
    vllm_sync_seconds_per_gb=0.1,  # colocate: pushing merged weights into vLLM per generation call
    prompt_tokens=150,  # GSM8K prompt with system prompt and chat template (Qwen tokenizer, typical)
    completion_fill=1.0,  # share of the completion length decoded: 1.0 = every call runs to the cap
    mfu=0.3,  # model FLOPs utilisation of prefill and training (bf16, micro-batches of a few sequences)
    train_flops_per_token=6,  # x params: forward 2 + backward 2 (LoRA: no weight grads) + recompute 2
    forward_flops_per_token=2,  # x params: one forward (the reference model's, or the old log-probs)
    vllm_max_num_seqs=256,  # vLLM's default batch of sequences: evaluation's prompts go in at that width
    trainer_start_seconds=60,  # imports, CUDA context, building the trainer and LoRA, before the weights
    load_gbs=1.0,  # GB/s reading weights from a local disk (or the page cache: faster)
    vllm_start_seconds=120,  # vLLM's engine: profiling, KV-cache allocation, CUDA-graph capture (1-3 min)
    save_seconds=2.0,  # a checkpoint's fixed cost besides its bytes: the trainer state, RNG, rotation
)
bytes_per_param = {"bf16": 2.0, "4bit": 0.5}  # weight bytes read per decoded token: params x 2 (bf16), / 4 (NF4)
# --------------------------------------------------------------------------------------------------


def stderr_points(n, p=0.5):
    """Standard error of an accuracy measured on `n` problems, in accuracy points, at accuracy `p` (0.5: the worst)."""
    return math.sqrt(p * (1 - p) / n) * 100 if n else None


def optimizer_steps(c, train_size, world_size=1):
    """trainer.state.max_steps as TRL 1.16 + transformers 5 compute it from the GRPOConfig `c`: RepeatSampler yields
    each chunk of generation_batch_size // num_generations prompts (a partial one dropped) num_iterations x
    steps_per_generation times; Trainer makes an epoch max(ceil(batches / gradient_accumulation_steps), 1) steps."""
    if c.max_steps >= 0:  # Trainer counts in epochs only when max_steps < 0
        return c.max_steps
    generation_batch = c.per_device_train_batch_size * world_size * c.steps_per_generation
    chunks = train_size // (generation_batch // c.num_generations)
    batches = chunks * c.num_iterations * c.steps_per_generation
    per_epoch = max(math.ceil(batches / c.gradient_accumulation_steps), 1)
    return math.ceil(c.num_train_epochs * per_epoch)


def eval_steps(every, max_steps, final):
    """The steps HeldOutEval scores: each `every` (-1: each 10 %); with `final`, the last is the final one's."""
    interval = 0 if not every else every if every > 0 else max(1, round(max_steps / 10))
    if not interval:
        return []
    return [step for step in range(interval, max_steps + 1, interval) if not (final and step >= max_steps)]


def checkpoint_steps(save_steps, max_steps):
    """The steps a checkpoint is written at: each `save_steps`, and the last."""
    if 0 < save_steps < 1:  # transformers reads a float below 1 as a share of the run
        save_steps = math.ceil(max_steps * save_steps)
    steps = list(range(save_steps, max_steps + 1, save_steps)) if save_steps > 0 else []
    return steps if max_steps in steps or max_steps <= 0 else steps + [max_steps]


def model_shape(c):
    """Parameters and layers of a decoder from its config.json's dict: embeddings, attention (q, k, v, o) and a gated
    MLP (gate, up, down) per layer, and the LM head unless tied."""
    hidden, layers, heads = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    inter = c["intermediate_size"]
    block = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * inter
    embeddings = c["vocab_size"] * hidden * (1 if c.get("tie_word_embeddings") else 2)
    # in + out of each linear layer of a block: q, k, v, o, then gate, up, down
    sides = 2 * (hidden + heads * head_dim) + 2 * (hidden + kv_heads * head_dim) + 3 * (hidden + inter)
    return {"params": embeddings + layers * block, "layers": layers, "linear_sides": sides}


def lora_params(shape, rank):
    """The adapter's parameters with LoRA of `rank` on every linear layer (all-linear): r x (in + out) each."""
    return rank * shape["layers"] * shape["linear_sides"]


def estimate_times(shape, c, s, plan):
    """Seconds per step and hours per run by phase on each GPU in `gpus`, per process. Decoding a token takes the
    largest of: reading the weights (bandwidth floor), the host's kernel launches (none with vLLM), FLOPs at mfu."""
    a, params, world = assumptions, shape["params"], plan["world_size"]
    weight_gb = params * bytes_per_param["4bit" if s.get("LOAD_IN_4BIT") else "bf16"] / 1e9
    decoded = math.ceil(c.max_completion_length * a["completion_fill"])
    launches = a["launches_per_token_reference"] * shape["layers"] / a["launches_reference_layers"]
    host = 0.0 if c.use_vllm else launches * a["launch_seconds"]  # vLLM: no per-token host floor
    sync = a["vllm_sync_seconds_per_gb"] * weight_gb if c.use_vllm else 0.0
    tokens = a["prompt_tokens"] + decoded
    # a forward of the step's completions: the reference model's when beta > 0; the old policy's when reused or
    # when vLLM sampled them (TRL's importance-sampling correction needs the trainer's own log-probs)
    forwards = (c.beta > 0) + (c.num_iterations > 1 or bool(c.use_vllm))
    held_out = config_kwargs(s, "held_out.")
    eval_batch = max(held_out["batch_size"], a["vllm_max_num_seqs"]) if c.use_vllm else held_out["batch_size"]
    samples = plan["eval_samples"]
    eval_calls = [  # per point, per process: the greedy answers, then the samples of each
        (math.ceil(n / world / eval_batch), math.ceil(n * samples / world / eval_batch), min(n, eval_batch))
        for n in (point["problems"] for point in plan["eval_points"])
    ]
    lora_gb = 3 * 4 * lora_params(shape, config_kwargs(s, "lora_config.")["r"]) / 1e9  # fp32 weights, Adam's 2 moments
    startup = a["trainer_start_seconds"] + weight_gb / a["load_gbs"]
    startup += a["vllm_start_seconds"] + weight_gb / a["load_gbs"] if c.use_vllm else 0.0
    saves = len(plan["checkpoints"]) * (a["save_seconds"] + lora_gb / a["load_gbs"])
    table = {}
    for name, gpu in gpus.items():
        flops = gpu["bf16_tflops"] * 1e12 * a["mfu"]
        bandwidth_floor = weight_gb / gpu["bandwidth_gbs"]

        def call(sequences, flops=flops, floor=bandwidth_floor):  # one generate call: (seconds, per-token seconds)
            per_token = max(floor, host, 2 * params * sequences / flops)
            return decoded * per_token + 2 * params * a["prompt_tokens"] * sequences / flops, per_token

        generate, per_token = call(plan["sequences_per_generation_call"])
        generation = plan["generation_calls_per_step"] * (generate + sync)
        train_flops = (a["train_flops_per_token"] + a["forward_flops_per_token"] * forwards) * params * tokens
        launched = c.gradient_accumulation_steps * a["train_launch_factor"] * host
        step_flops = c.per_device_train_batch_size * c.gradient_accumulation_steps * train_flops
        training = max(step_flops / flops, launched)
        step = generation + training
        evaluation = sum((greedy + sampled) * call(batch)[0] + sync for greedy, sampled, batch in eval_calls)
        phases = dict(zip(PHASES, (step * plan["optimizer_steps"], evaluation, startup, saves), strict=True))
        table[name] = {
            "seconds_per_step": round(step, 2),
            "generation_seconds_per_step": round(generation, 2),
            "training_seconds_per_step": round(training, 2),
            "decode_ms_per_token": round(per_token * 1e3, 1),
            "bandwidth_floor_ms_per_token": round(bandwidth_floor * 1e3, 1),
            **{f"{phase}_hours": round(seconds / 3600, 3) for phase, seconds in phases.items()},
            "hours_per_run": round(sum(phases.values()) / 3600, 3),
        }
    return table


def make_plan(c, s, train_size, test_size, world_size=1, model_config=None, model_source=None):
    """What the run of the GRPOConfig `c` and the settings `s` will do, as a JSON-serialisable dict, on `world_size`
    processes; `model_config` (config.json's dict, read from `model_source`) enables the time estimates."""
    group, iterations, accumulation = c.num_generations, c.num_iterations, c.gradient_accumulation_steps
    per_generation = c.steps_per_generation  # TRL sets it to gradient_accumulation_steps unless given
    used = min(train_size, s["MAX_SAMPLES"]) if s["MAX_SAMPLES"] else train_size
    steps = optimizer_steps(c, used, world_size)
    sequences_per_call = c.per_device_train_batch_size * per_generation  # per process: the generation batch's share
    completions = c.per_device_train_batch_size * accumulation * world_size
    # a generation round feeds per_generation micro-batches, num_iterations times over
    calls = math.ceil(steps * accumulation / (per_generation * iterations))
    prompts_seen = calls * sequences_per_call * world_size / group
    held_out = config_kwargs(s, "held_out.")
    subset = min(held_out["subset"], test_size) if held_out["every"] else 0
    final = min(held_out["after"], test_size)
    before = min(held_out["before"], test_size)
    points = [{"step": 0, "problems": before, "kind": "before"}] if before else []
    during = eval_steps(held_out["every"], steps, final)
    points += [{"step": k, "problems": subset, "kind": "held-out"} for k in during]
    points += [{"step": steps, "problems": final, "kind": "after"}] if final else []
    plan = {
        "model": s["MODEL_NAME"],
        "model_config_source": model_source if model_config is not None else None,
        "world_size": world_size,
        "train_problems": used,
        "test_problems": test_size,
        "optimizer_steps": steps,
        "group_size": group,
        "completions_per_step": completions,
        "prompts_per_step": completions / group,
        "new_prompts_per_step": completions / group / iterations,
        "epochs_covered": round(prompts_seen / used, 3) if used else 0.0,
        "generation_calls": calls,
        "sequences_per_generation_call": sequences_per_call,
        "generation_calls_per_step": accumulation / (per_generation * iterations),
        "max_completion_length": c.max_completion_length,
        "eval_points": points,
        "eval_subset": subset,
        "eval_subset_stderr": stderr_points(subset),
        "eval_samples": held_out["samples"],
        "final_eval_problems": final,
        "final_eval_stderr": stderr_points(final),
        "checkpoints": checkpoint_steps(c.save_steps, steps),
        "generation": "vLLM" if c.use_vllm else "HF generate",
        "estimates": None,
        "estimates_omitted": model_source or "the model's config could not be read",
    }
    if model_config is not None:
        shape = model_shape(model_config)
        plan |= {"params": shape["params"], "layers": shape["layers"], "estimates_omitted": None}
        plan["estimates"] = estimate_times(shape, c, s, plan)
        plan["assumptions"] = dict(assumptions)
    return plan


# Hub configs (config.json) of the Qwen3 models the recipes use, for a plan on a machine without the Hub
qwen3 = dict(num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True)
known_configs = {
    "Qwen/Qwen3-0.6B": {**qwen3, "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28},
    "Qwen/Qwen3-1.7B": {**qwen3, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28},
    "Qwen/Qwen3-4B": {**qwen3, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
                      "num_attention_heads": 32},
    "Qwen/Qwen3-8B": {**qwen3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                      "num_attention_heads": 32, "tie_word_embeddings": False},
}  # fmt: skip


def read_model_config(model_name):
    """(config dict, where it was read) without loading weights, or (None, why not): a folder's config.json, the cache,
    the Hub if reachable, else a Qwen3's copy in `known_configs`. Never runs a repository's own code."""
    folder = Path(os.path.expanduser(str(model_name)))
    if (folder / "config.json").is_file():
        return json.loads((folder / "config.json").read_text()), f"{folder}/config.json"
    if hub.is_local(model_name) or str(model_name).count("/") > 1:  # a Hub id is owner/name
        return None, f"{folder} holds no config.json (yet: --smoke and --demo build theirs on the first run)"
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(model_name, local_files_only=True).to_dict(), "the Hugging Face cache"
    except (OSError, ValueError) as err:
        cache_miss = f"{model_name} is not in the Hugging Face cache ({type(err).__name__})"
    if (unreachable := hub.hub_unreachable(model_name, "MODEL_NAME")) and model_name in known_configs:
        return known_configs[model_name], "grpo/plan.py's copy of its config.json (not cached; the Hub unreachable)"
    if unreachable:
        return None, cache_miss
    try:
        return AutoConfig.from_pretrained(model_name).to_dict(), "the Hugging Face Hub"
    except (OSError, ValueError) as err:
        return None, f"{model_name}'s config could not be read: {type(err).__name__}"


def duration(seconds):
    """`seconds` as 1h01m, 12m05s or 42s."""
    seconds = round(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


PHASES = ("training", "evaluation", "startup", "checkpoint")  # hours_per_run's parts: <phase>_hours in the JSON
LINES = ("model", "optimiser steps", "per step", "data", "generation", "held-out eval", "eval before", "final eval")
LINES += ("checkpoints", "time (estimate)")  # format_plan's rows, which grpo/settings.py's plan column names


def format_plan(plan):
    """The plan as the aligned block every run prints before loading weights; time figures labelled estimates."""
    points = plan["eval_points"]
    held_out = [p["step"] for p in points if p["kind"] == "held-out"]
    rows = [
        ("model", plan["model"] + (f" (config: {source})" if (source := plan.get("model_config_source")) else "")),
        ("optimiser steps", f"{plan['optimizer_steps']:,}"),
        ("per step", f"{plan['prompts_per_step']:g} prompts x group {plan['group_size']} "
                     f"= {plan['completions_per_step']} completions"),
        ("data", f"{plan['train_problems']:,} problems, {plan['epochs_covered']:g} epochs covered"),
        ("generation", f"{plan['generation']}: {plan['generation_calls']:,} calls x "
                       f"{plan['sequences_per_generation_call']} sequences (per process), "
                       f"up to {plan['max_completion_length']} tokens"),
        ("held-out eval", f"{len(held_out)} x {plan['eval_subset']} problems at steps {_steps(held_out)}"
                          f"{_stderr(plan['eval_subset'])}" if held_out else "off"),
        ("eval before", _eval(points, "before")),
        ("final eval", _eval(points, "after")),
        ("checkpoints", f"steps {_steps(plan['checkpoints'])}" if plan["checkpoints"] else "none"),
    ]  # fmt: skip
    if plan["estimates"]:
        size = f"{plan['params'] / 1e9:.2f} B" if plan["params"] >= 1e9 else f"{plan['params'] / 1e6:.1f} M"
        rows.append(("time (estimate)", f"{size} params, {plan['layers']} layers; per step"))
        for name, e in plan["estimates"].items():
            phases = ", ".join(f"{phase} {duration(e[f'{phase}_hours'] * 3600)}" for phase in PHASES)
            rows.append((
                f"  {name}",
                f"{e['seconds_per_step']:.1f} s/step (generation {e['generation_seconds_per_step']:.1f} s); "
                f"run {duration(e['hours_per_run'] * 3600)} = {phases}  estimate",
            ))  # fmt: skip
    else:
        rows.append(("time (estimate)", f"omitted: {plan['estimates_omitted']}"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(["plan:"] + [f"  {label:<{width}}  {value}" for label, value in rows])


def _steps(steps, shown=6):  # shortened in the middle when long
    text = [f"{step:,}" for step in steps]
    return ", ".join(text if len(text) <= shown else text[:3] + ["..."] + text[-2:])


def _stderr(n):
    return f", stderr +-{stderr_points(n):.1f} points" if n else ""


def _eval(points, kind):
    n, step = next(((p["problems"], p["step"]) for p in points if p["kind"] == kind), (0, 0))
    return f"{n:,} problems at step {step:,}{_stderr(n)}" if n else "off"


def plan_json(plan):
    """The plan as one JSON object, for --plan=json."""
    return json.dumps(plan, sort_keys=True)


def for_run(s, c, datasets, world_size):
    """The plan of the run with the settings `s` and its GRPOConfig `c` on `datasets` (train and test sets, or their
    sizes), with time estimates when the model's config can be read, and the settings that move each line."""
    sizes = [data if isinstance(data, int) else len(data or []) for data in datasets]
    model_config, source = read_model_config(s["MODEL_NAME"])
    plan = make_plan(c, s, *sizes, world_size, model_config=model_config, model_source=source)
    return {**plan, "levers": {line: levers(line) for line in LINES}}
