"""vLLM beside a LoRA model in training: the weights sent out of place (TRL 1.16 merges the adapter into the bf16
base and unmerges, so the base drifts at every sync: TRL issue 6688), a broken vllm kept from TRL (held-out
evaluation on the run's engine: generation.trainer_vllm_generator). Nothing heavy at import: `vllm_status` runs
before anything imports trl."""

import importlib.util
import sys
import types

from grpo import errors


def vllm_status():
    """(usable, reason): whether vllm imports as TRL imports it; (False, None) when not installed. A broken one (a
    CUDA 13 wheel on a CUDA 12 driver) is mapped to None in sys.modules, so TRL's is_vllm_available() is False."""
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
    """`use_vllm`'s answer to a vllm that cannot be imported (`reason`): auto's line to log, True's ConfigError."""
    value = str(use_vllm).lower()
    if reason is None or value not in ("auto", "true", "1", "yes", "on"):  # the values that ask for vLLM
        return None
    if value == "auto":
        return f"USE_VLLM=auto: HF generate, as {reason}"
    raise errors.ConfigError(f"USE_VLLM={use_vllm}, but {reason} and set USE_VLLM=auto.")


def fsdp_problem(use_vllm, fsdp_version):
    """Why vLLM with LoRA cannot run under FSDP, or None."""
    if not (use_vllm and fsdp_version):
        return None
    return (
        f"USE_VLLM=True under FSDP{fsdp_version}: the LoRA weights cannot be sent to vLLM from FSDP's shards without "
        "writing the base.\nLaunch with configs/accelerate/zero3.yaml or ddp.yaml (docs/launch.md), or USE_VLLM=False."
    )


def install(trainer):
    """Make the trainer's vLLM weight sync out of place (colocate and server; one GPU, DDP, ZeRO-3); whether it did."""
    from peft import PeftModel
    from peft.tuners.lora import Linear, LoraLayer

    if not trainer.args.use_vllm or not isinstance(trainer.vllm_generation.model, PeftModel):
        return False
    fsdp = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if problem := fsdp_problem(True, fsdp and fsdp.fsdp_version):
        raise errors.ConfigError(problem)
    for name, layer in trainer.vllm_generation.model.named_modules():
        plain = isinstance(layer, Linear) and not layer.lora_variant and not any(layer.lora_bias.values())
        if isinstance(layer, LoraLayer) and not plain:  # DoRA, a LoRA bias, embeddings, 4-bit: not B @ A alone
            raise NotImplementedError(f"the out-of-place vLLM sync covers plain LoRA on Linear layers, not {name}")
    replace_weight_walk(trainer.vllm_generation)
    return True


def replace_weight_walk(generation):
    """Bind ours on the instance: TRL's sync_weights reads this private method in either mode (no public hook)."""
    generation._iter_named_params = types.MethodType(out_of_place_params, generation)


def out_of_place_params(generation):
    """(name, tensor) as TRL's _iter_named_params yields them, each adapted weight merged (`merged_weight`), the
    model gathered as TRL gathers it (ZeRO-3: collective, every process walks); nothing of it is written."""
    from peft.tuners.lora import LoraLayer

    model = generation.model
    with generation._dist.gather_params(list(model.parameters())):
        layers = {  # base weight -> its LoRA layer
            id(m.get_base_layer().weight): m for m in model.modules() if isinstance(m, LoraLayer) and not m.merged
        }
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
    """peft's LoRA delta (B @ A x scaling) in fp32: under ZeRO-3 TRL keeps the adapter in bf16, where peft's own
    product would round. Detached: autograd history would make every tensor vLLM copies it into part of a graph."""
    product = layer.lora_B[adapter].weight.detach().float() @ layer.lora_A[adapter].weight.detach().float()
    product.mul_(layer.scaling[adapter])
    return product.T if layer.fan_in_fan_out else product
