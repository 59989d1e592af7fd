"""The generation engines evaluation runs on, one contract for all: `generate(prompts, temperature=...)` takes chat
prompts and returns one `(text, completion tokens, cut off)` per prompt; and which engine a machine gets."""

import contextlib
import json
import logging
from pathlib import Path

from grpo import hardware, weight_sync
from grpo.cli import FALSE, TRUE
from grpo.errors import ConfigError
from grpo.plan import assumptions, model_shape, read_model_config

CONTEXT_MARGIN = 64  # tokens of vLLM context over the longest prompt plus a completion
PROMPT_TOKENS = assumptions["prompt_tokens"]  # a typical GSM8K chat prompt, as the plan assumes it
VLLM_OVERHEAD_GB = 3.0  # vLLM's CUDA graphs, activations and allocator slack besides weights and KV cache
VLLM_SHARE_BOUNDS = (0.1, 0.9)  # the automatic share of GPU memory stays within these
VLLM_SHARE_FALLBACK = 0.3  # ... and is this when the model's config or the card's memory is unknown
ROW = ("question", "gold", "completion", "completion_tokens", "truncated")
log = logging.getLogger("grpotrainer.generation")


def generate_all(dataset, generate, batch_size, desc="GSM8K", progress=True, check=None):
    """Run `generate` over the dataset's prompts in batches, with a progress bar: a row (ROW) per problem."""
    from tqdm.auto import tqdm

    rows = []
    with tqdm(total=len(dataset), desc=desc, unit="problem", disable=not (progress and len(dataset))) as bar:
        for start in range(0, len(dataset), batch_size):
            batch = dataset[start : start + batch_size]
            outputs = generate(batch["prompt"])
            if len(outputs) != len(batch["prompt"]):
                raise RuntimeError(f"the generator returned {len(outputs)} completions for {len(batch['prompt'])}")
            for question, gold, output in zip(batch["question"], batch["answer"], outputs, strict=True):
                rows.append(dict(zip(ROW, (question, gold, *output), strict=True)))
            bar.update(len(batch["prompt"]))
            if check is not None:  # a signal's stop, between two calls
                check()
    return rows


def sample_all(dataset, generate, samples, batch_size, desc="GSM8K", progress=True, seed=0, check=None):
    """`samples` completions per problem, problem-major, drawn with torch seeded with `seed` and put back after:
    a training run's own random stream is the same with or without this evaluation."""
    import torch

    repeated = dataset.select([i for i in range(len(dataset)) for _ in range(samples)])
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(seed)
        return generate_all(repeated, generate, batch_size, f"{desc}, {samples} samples each", progress, check)


def eos_ids(model, tokenizer):
    """Token ids that end a completion, by GRPOTrainer's rule: the tokenizer's EOS, then the generation config's.
    A converted folder may name an EOS other than its end of turn (SmolLM2's GGUF): then either ends one."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos = [tokenizer.eos_token_id, *eos]
    return eos


def hf_generator(model, tokenizer, max_new_tokens, enable_thinking=False, cache_implementation="dynamic", eos=None):
    """A `generate` on a transformers model, as GRPOTrainer generates: left padding, greedy at temperature 0, else
    sampled without top-k or top-p; tokens counted up to the first end of turn (`eos`, else `eos_ids`), included,
    and decoded without special tokens; none means cut off. A missing pad token becomes the first end of turn."""
    import torch
    from transformers import GenerationConfig

    eos = eos_ids(model, tokenizer) if eos is None else list(eos)
    if not eos:
        raise ConfigError(
            "the model names no EOS token in its tokenizer or generation config, so no completion could end.\n"
            "Set eos_token_id in the model folder's generation_config.json to its end-of-turn token."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.convert_ids_to_tokens(eos[0])
    limits = dict(max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)
    decode = hardware.decode_options(cache_implementation)

    def generate(prompts, temperature=0.0):
        sampling = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else {}
        config = GenerationConfig(**{"do_sample": False, **sampling}, **limits)
        texts = render(tokenizer, prompts, enable_thinking)
        inputs = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        inputs = inputs.to(model.device)
        with torch.no_grad():
            output = model.generate(**inputs, generation_config=config, **decode)
        return [completion(tokenizer, ids, eos) for ids in output[:, inputs["input_ids"].shape[1] :].tolist()]

    return generate


def completion(tokenizer, ids, eos):
    """(text, tokens, cut off) of generated `ids`: counted up to the first end of turn in `eos`, included, and decoded
    without special tokens; none means cut off."""
    end = next((i for i, t in enumerate(ids) if t in eos), None)
    n_tokens = len(ids) if end is None else end + 1
    return tokenizer.decode(ids[:n_tokens], skip_special_tokens=True), n_tokens, end is None


def vllm_completions(outs):
    """(text, tokens, cut off) of each of vLLM's RequestOutputs, its first sample's."""
    return [(o.outputs[0].text, len(o.outputs[0].token_ids), o.outputs[0].finish_reason == "length") for o in outs]


def render(tokenizer, prompts, enable_thinking=False):
    """The chat prompts as training renders them: the chat template with the generation prompt."""
    options = dict(tokenize=False, add_generation_prompt=True, enable_thinking=enable_thinking)
    return [tokenizer.apply_chat_template(p, **options) for p in prompts]


def refuses_system_turn(model_name, trust_remote_code=False):
    """Whether the model's chat template raises on a system turn (Gemma's, Mistral's); False when not cached here."""
    from jinja2.exceptions import TemplateError
    from transformers import AutoTokenizer

    turns = [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}]
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            model_name, local_files_only=True, trust_remote_code=trust_remote_code
        )
        tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    except TemplateError:  # the template's own raise_exception("System role not supported")
        return True
    except (OSError, ValueError):  # not cached or not a tokenizer (loading says why), or no chat template (preflight)
        pass
    return False


def longest_prompt(dataset, model_name, enable_thinking=False, trust_remote_code=False):
    """The token count of the longest prompt of `dataset` in the model's chat template, as training renders it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_name, trust_remote_code=trust_remote_code)
    texts = render(tokenizer, dataset["prompt"], enable_thinking)
    return max(len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"])


def vllm_context(datasets, model_name, trust_remote_code, *, max_completion_length, enable_thinking):
    """vLLM's context for a run (`context_length`), from the longest prompt of its `datasets` (training's and the
    held-out one, which its engine also scores), else PROMPT_TOKENS."""
    read = [data for data in datasets or () if data is not None and not isinstance(data, int)]
    if not read:
        return context_length(PROMPT_TOKENS, max_completion_length)
    prompts = {"prompt": [prompt for data in read for prompt in data["prompt"]]}  # one tokenizer load for all
    longest = longest_prompt(prompts, model_name, enable_thinking, trust_remote_code)
    return context_length(longest, max_completion_length)


def context_length(prompt_tokens, max_completion_length):
    """vLLM's context: the longest prompt, a whole completion and CONTEXT_MARGIN. Without it vLLM reserves KV cache
    for the model's full context (40,960 positions for Qwen3-8B) where a prompt and its completion need ~1,300."""
    return prompt_tokens + max_completion_length + CONTEXT_MARGIN


def vllm_generator(model_name, adapter, *, prompt_tokens, max_completion_length, enable_thinking, bf16, **engine):
    """A `generate` on a vLLM engine of its own, the adapter as a LoRA request; `prompt_tokens` bound its context.
    `engine`: the LLM's own arguments as named (trust_remote_code, gpu_memory_utilization)."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    rank = json.loads((Path(adapter) / "adapter_config.json").read_text())["r"] if adapter else 0
    llm = LLM(
        model=model_name,
        dtype="bfloat16" if bf16 else "float32",
        max_model_len=context_length(prompt_tokens, max_completion_length),
        enable_lora=bool(adapter),
        max_lora_rank=hardware.vllm_lora_rank(rank) if adapter else 16,
        seed=0,
        **engine,
    )
    lora = LoRARequest("adapter", 1, str(Path(adapter).resolve())) if adapter else None

    def generate(prompts, temperature=0.0):
        params = SamplingParams(temperature=temperature, max_tokens=max_completion_length)
        kwargs = {"enable_thinking": enable_thinking}
        outs = llm.chat(prompts, params, lora_request=lora, chat_template_kwargs=kwargs, use_tqdm=True)
        return vllm_completions(outs)

    return generate


def trainer_vllm_generator(trainer, max_new_tokens, enable_thinking):
    """A `generate(prompts, temperature=0.0)` on the run's vLLM engine with hf_generator's contract, the
    weights synced first when stale. Syncing (ZeRO-3) and server mode are collective: every rank calls as often."""
    generation = trainer.vllm_generation
    if generation.mode == "colocate" and generation.tensor_parallel_size > 1:  # its ranks must all send the same
        raise NotImplementedError("held-out evaluation on a tensor-parallel colocated vLLM engine")
    thinking = {"enable_thinking": enable_thinking}

    def generate(prompts, temperature=0.0):
        # stale after a step, or discarded by sleep mode: read from TRL's private markers, as it has no public way
        asleep = generation.mode == "colocate" and generation.enable_sleep_mode and generation._llm_weights_sleeping
        if trainer.state.global_step != trainer._last_loaded_step or asleep:
            generation.sync_weights()
            trainer._last_loaded_step = trainer.state.global_step
        sampling = dict(n=1, temperature=temperature, top_k=0, top_p=1.0, max_tokens=max_new_tokens)
        if generation.mode == "server":
            return server_generate(trainer, prompts, sampling, thinking)
        from vllm import SamplingParams

        params = SamplingParams(**sampling)
        if generation.enable_sleep_mode:  # as TRL's generate: the KV cache woken, then everything asleep again
            generation.llm.wake_up(tags=["kv_cache"])
        try:
            outs = generation.llm.chat(prompts, params, chat_template_kwargs=thinking, use_tqdm=False)
        finally:
            if generation.enable_sleep_mode:  # level 2 drops the weights: the next generation re-sends them
                generation.llm.sleep(level=2)
                generation._llm_weights_sleeping = True
        return vllm_completions(outs)

    return generate


def server_generate(trainer, prompts, sampling, thinking):
    """This rank's completions of every rank's prompts, sent by the main process, decoded as hf_generator does."""
    from accelerate.utils import broadcast_object_list, gather_object

    acc, tokenizer, eos = trainer.accelerator, trainer.processing_class, trainer.eos_token_ids
    per_rank = gather_object([prompts])  # one list of prompts per rank, in rank order
    result = [None]
    if acc.is_main_process:
        answer = trainer.vllm_generation.vllm_client.chat(sum(per_rank, []), **sampling, chat_template_kwargs=thinking)
        result = [answer["completion_ids"]]
    broadcast_object_list(result, from_process=0)
    start = sum(len(rank) for rank in per_rank[: acc.process_index])
    return [completion(tokenizer, ids, eos) for ids in result[0][start : start + len(prompts)]]


@contextlib.contextmanager
def generation_ready(trainer):
    """The trainer's model ready to generate, as GRPOTrainer's own generation gets it (ZeRO-3 parameters gathered,
    FSDP's summoned, no activation checkpointing), in eval mode (no LoRA dropout), its mode put back after."""
    import torch
    from trl.distributed import DistributedBackend
    from trl.models import unwrap_model_for_generation

    was_training = trainer.model.training
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
        DistributedBackend(trainer.accelerator).summon_full_params(trainer.model_wrapped, recurse=False),
    ):
        model.eval()
        try:
            yield model
        finally:
            trainer.model.train(was_training)


def generation_choice(use_vllm, cuda, vllm_installed, mode="colocate", blocked=None):
    """(whether vLLM generates, a line saying which engine and why, or None when chosen by hand). `blocked`: why
    vLLM cannot run this configuration, which sends "auto" to HF generate (preflight refuses it under True)."""
    value = use_vllm.lower() if isinstance(use_vllm, str) else use_vllm
    if isinstance(value, bool) or value in TRUE | FALSE:
        return value is True or value in TRUE, None
    if value != "auto":
        raise ConfigError(f"USE_VLLM={use_vllm!r} is not one of auto, True, False.")
    if not cuda or not vllm_installed:
        blocked = "no CUDA GPU is visible" if not cuda else "vllm is not installed (requirements-vllm.txt adds it)"
    if blocked:
        return False, f"USE_VLLM=auto: HF generate, as {blocked}"
    return True, f"USE_VLLM=auto: vLLM ({mode}), as vllm imports and a CUDA GPU is visible"


def choose(use_vllm, cuda, *, mode, share, model_name, sequences, tokens, blocked=None):
    """(whether vLLM generates on this machine, its reason logged; vLLM's share of GPU memory, for `sequences` of
    `tokens` per generation call). `blocked`: why vLLM cannot run this configuration (`generation_choice`)."""
    usable, broken = weight_sync.vllm_status()  # before trl imports vllm: a broken one is kept from it
    if note := weight_sync.vllm_choice(use_vllm, broken):
        log.warning(note)
    use_vllm, note = generation_choice(use_vllm, cuda, usable, mode, blocked=blocked)
    if note:
        log.info(note)
    card_gb, config = 0, None
    if share == "auto" and use_vllm and cuda:
        import torch

        card_gb, config = torch.cuda.get_device_properties(0).total_memory / 1e9, read_model_config(model_name)[0]
    return use_vllm, vllm_memory_share(share, config, card_gb, sequences, PROMPT_TOKENS + tokens)


def vllm_memory_share(value, config=None, card_gb=0, sequences=0, tokens=0):
    """vLLM's share of GPU memory: a number as given, or for "auto" (bf16 weights, twice the KV cache of one call's
    `sequences` of `tokens`, VLLM_OVERHEAD_GB) / the card's memory; `config`: read_model_config's dict."""
    if value != "auto":
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"VLLM_GPU_MEMORY_UTILIZATION={value!r} is not auto nor a share such as 0.3.") from None
    if not config or not card_gb:
        return VLLM_SHARE_FALLBACK
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    kv_bytes_per_token = 2 * config["num_hidden_layers"] * (config.get("num_key_value_heads") or heads) * head_dim * 2
    need_gb = model_shape(config)["params"] * 2 / 1e9 + 2 * kv_bytes_per_token * sequences * tokens / 1e9
    low, high = VLLM_SHARE_BOUNDS
    return round(min(max((need_gb + VLLM_OVERHEAD_GB) / card_gb, low), high), 2)
