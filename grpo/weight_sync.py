"""vLLM beside a LoRA model in training: weights sent out of place, a vllm that cannot be imported kept from crashing
the run, held-out evaluation on the run's own engine.

TRL 1.16 sends weights by merging the adapter into the bf16 base in place, reading it and unmerging
(VLLMGeneration._iter_named_params); bf16 cannot undo the addition exactly, so the frozen base drifts at every sync
(TRL issue 6688) and the saved adapter no longer fits the base it was trained on. `install(trainer)` sends each
adapted weight as base + B @ A x scaling, summed in fp32 and rounded once, and never writes the model.
Nothing heavy is imported at import: `vllm_status` must run before anything imports trl.
"""

import importlib.util
import sys
import types

from grpo import errors


def vllm_status():
    """(usable, reason): whether vllm imports as TRL imports it; not installed: (False, None). Installed but broken
    (a CUDA 13 wheel on a CUDA 12 driver: ImportError), its half-imported modules are dropped and sys.modules maps
    "vllm" to None, for which find_spec answers None: TRL's is_vllm_available() is then False and trl imports."""
    if importlib.util.find_spec("vllm") is None:
        return False, None
    try:  # what trl/generation/vllm_generation.py and vllm_client.py import when vllm is installed
        from vllm import LLM, RequestOutput, SamplingParams  # noqa: F401
        from vllm.sampling_params import StructuredOutputsParams  # noqa: F401
        from vllm.utils.network_utils import get_ip  # noqa: F401
    except (ImportError, OSError, RuntimeError) as err:  # a missing library or symbol, a CUDA or torch mismatch
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]
        sys.modules["vllm"] = None
        import torch

        fix = f"pip install a vllm build matching torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"
        return False, f"vllm cannot be imported ({errors.first_line(err)}); {fix}, or pip uninstall vllm"
    return True, None


def vllm_choice(use_vllm, reason):
    """USE_VLLM's answer to a vllm that cannot be imported (`reason`, from vllm_status): under auto the line to log
    (HF generate runs), under True a ConfigError, else None."""
    value = str(use_vllm).lower()
    if reason is None or value not in ("auto", "true", "1", "yes", "on"):  # USE_VLLM's values that ask for vLLM
        return None
    if value == "auto":
        return f"USE_VLLM=auto: HF generate, as {reason}"
    raise errors.ConfigError(f"USE_VLLM={use_vllm}, but {reason} and set USE_VLLM=auto.")


def fsdp_problem(use_vllm, fsdp_version):
    """Why vLLM with LoRA cannot run under FSDP, for preflight before any weights load, or None."""
    if not (use_vllm and fsdp_version):
        return None
    return (
        f"USE_VLLM=True under FSDP{fsdp_version}: the LoRA weights cannot be sent to vLLM from FSDP's shards without "
        "writing the base.\nLaunch with configs/accelerate/zero3.yaml or ddp.yaml (docs/launch.md), or USE_VLLM=False."
    )


def install(trainer):
    """Make the trainer's vLLM weight sync out of place (colocate and server; one GPU, DDP, ZeRO-3). Nothing without
    vLLM or LoRA. Returns whether it did."""
    from accelerate.utils import is_peft_model

    if not trainer.args.use_vllm or not is_peft_model(trainer.vllm_generation.model):
        return False
    fsdp = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if problem := fsdp_problem(True, fsdp and fsdp.fsdp_version):
        raise errors.ConfigError(problem)
    from peft.tuners.lora import Linear, LoraLayer

    for name, layer in trainer.vllm_generation.model.named_modules():
        plain = isinstance(layer, Linear) and not layer.lora_variant and not any(layer.lora_bias.values())
        if isinstance(layer, LoraLayer) and not plain:  # DoRA, a LoRA bias, embeddings, 4-bit: not B @ A alone
            raise NotImplementedError(f"the out-of-place vLLM sync covers plain LoRA on Linear layers, not {name}")
    replace_weight_walk(trainer.vllm_generation)
    return True


def replace_weight_walk(generation):
    # TRL has no public hook for the weights it sends to vLLM: sync_weights() reads them from this private method in
    # colocate and server mode alike, so binding ours on the instance covers both and leaves TRL's class as it is.
    generation._iter_named_params = types.MethodType(out_of_place_params, generation)


def out_of_place_params(generation):
    """(name, tensor) as TRL's _iter_named_params yields them for a PEFT model, each adapted weight as base + the
    active adapters' deltas in fp32, cast once to the base's dtype. The whole model is gathered around the walk as
    TRL gathers it (ZeRO-3: collective, so every process walks); nothing of it is written."""
    from peft.tuners.lora import LoraLayer

    model = generation.model
    with generation._dist.gather_params(list(model.parameters())):
        layers = {}  # base weight -> its LoRA layer
        for module in model.modules():
            if isinstance(module, LoraLayer) and not module.merged:
                layers[id(module.get_base_layer().weight)] = module
        for name, param in model.named_parameters():
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if model.prefix in name or "original_module" in name:  # the adapter itself; a module_to_save's original
                continue
            name = generation._fix_param_name_to_vllm(name, extra_prefixes=["modules_to_save.default."])
            layer = layers.get(id(param))
            yield name, param.data if layer is None else merged_weight(layer, param.data)


def merged_weight(layer, weight):
    """`weight` + `layer`'s active adapters' deltas, summed in fp32 and cast once to its dtype (a new tensor)."""
    deltas = [lora_delta(layer, a) for a in layer.active_adapters if a in layer.lora_A]
    if not deltas:
        return weight
    merged = sum(deltas[1:], deltas[0])  # one adapter: its fresh fp32 delta itself, which the base is added into
    return merged.add_(weight).to(weight.dtype)


def lora_delta(layer, adapter):
    """peft's LoRA delta (Linear.get_delta_weight: B @ A x scaling) in fp32 whatever the adapter's dtype: under ZeRO-3
    TRL keeps the adapter in bf16 (autocast_adapter_dtype=False), where peft's own product would round on the GPU.
    Detached: a delta carrying autograd history makes every tensor vLLM copies it into part of a growing graph."""
    from peft.utils.other import transpose

    product = layer.lora_B[adapter].weight.detach().float() @ layer.lora_A[adapter].weight.detach().float()
    return transpose(product.mul_(layer.scaling[adapter]), layer.fan_in_fan_out)


def trainer_vllm_generator(trainer, max_new_tokens, enable_thinking):
    """A `generate(prompts, temperature=0.0)` on the run's vLLM engine with gsm8k.hf_generator's contract (one (text,
    n_tokens, truncated) per chat prompt; greedy at 0, else sampled without top-k or top-p), the engine's weights
    synced first when stale. Colocate: each rank's own engine. Server: only the main process talks to the server.
    Syncing (ZeRO-3) and server mode are collective: every rank must call as often (evaluate_trainer's shards do)."""
    generation = trainer.vllm_generation
    if generation.mode == "colocate" and generation.tensor_parallel_size > 1:  # its ranks must all send the same
        raise NotImplementedError("held-out evaluation on a tensor-parallel colocated vLLM engine")
    thinking = {"enable_thinking": enable_thinking}

    def generate(prompts, temperature=0.0):
        sync_if_stale(trainer)
        if generation.mode == "server":
            return server_generate(trainer, prompts, temperature, max_new_tokens, thinking)
        from vllm import SamplingParams

        params = SamplingParams(n=1, temperature=temperature, top_k=0, top_p=1.0, max_tokens=max_new_tokens)
        sleeps = generation.enable_sleep_mode  # as TRL's generate: the KV cache woken, then everything asleep again
        if sleeps:
            generation.llm.wake_up(tags=["kv_cache"])
        try:
            outs = generation.llm.chat(prompts, params, chat_template_kwargs=thinking, use_tqdm=False)
        finally:
            if sleeps:  # level 2 discards the weights: training's next generation re-sends them, as ours does
                generation.llm.sleep(level=2)
                generation._llm_weights_sleeping = True
        outs = [out.outputs[0] for out in outs]
        return [(o.text, len(o.token_ids), o.finish_reason == "length") for o in outs]

    return generate


def sync_if_stale(trainer):
    # GRPOTrainer syncs lazily, before a generation in a step it has not synced in (_generate_single_turn), and
    # sleep mode (level 2) discards the engine's weights; TRL offers no public way to ask, so this reads its markers.
    generation = trainer.vllm_generation
    asleep = generation.mode == "colocate" and generation.enable_sleep_mode and generation._llm_weights_sleeping
    if trainer.state.global_step != trainer._last_loaded_step or asleep:
        generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


def server_generate(trainer, prompts, temperature, max_new_tokens, thinking):
    """This rank's completions, every rank's prompts sent from the main process in one call; counted and decoded
    as gsm8k.hf_generator does (up to the first end of turn, without special tokens; none = cut off)."""
    from accelerate.utils import broadcast_object_list, gather_object

    acc, tokenizer, eos = trainer.accelerator, trainer.processing_class, trainer.eos_token_ids
    per_rank = gather_object([prompts])  # one list of prompts per rank, in rank order
    result = [None]
    if acc.is_main_process:
        everyone = [p for rank in per_rank for p in rank]
        sampling = dict(n=1, temperature=temperature, top_k=0, top_p=1.0, max_tokens=max_new_tokens)
        answer = trainer.vllm_generation.vllm_client.chat(everyone, **sampling, chat_template_kwargs=thinking)
        result = [answer["completion_ids"]]
    broadcast_object_list(result, from_process=0)
    start = sum(len(rank) for rank in per_rank[: acc.process_index])
    outputs = []
    for ids in result[0][start : start + len(prompts)]:
        end = next((i for i, t in enumerate(ids) if t in eos), None)
        n_tokens = len(ids) if end is None else end + 1
        outputs.append((tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens, end is None))
    return outputs
