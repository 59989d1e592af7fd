"""Checks that run in seconds, before any weights load, so that a mistake costs a message rather than a GPU hour.
`refuse_bad_settings` reports every problem of the settings at once, each in at most two lines; `refuse_before_loading`
and `refuse_bad_grpo_config` check what needs the rewards, the data, the model's config or the GRPOConfig."""

import asyncio
import dataclasses
import difflib
import inspect
import json
import logging
import math
import netrc
import os
import re
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlparse

from grpo import checkpoints, errors, files, generation, hardware, hub, reward_guard, settings, weight_sync
from grpo.errors import ConfigError

log = logging.getLogger("grpotrainer.preflight")

TRACKERS = ("tensorboard", "trackio", "wandb")
# GRPOConfig fields a --field=value can set, which nothing checks before the first step: (name, low, high)
FIELD_RANGES = (("epsilon", 0, 1), ("epsilon_high", 0, 10), ("top_entropy_quantile", 0, 1))
FIELD_RANGES += (("dataloader_num_workers", 0, 1024), ("max_grad_norm", 0, math.inf), ("warmup_steps", 0, math.inf))
# the optimizer's, for any --optim (torch checks only its own, at the first step): a beta of 1 torch refuses too
FIELD_RANGES += (("adam_beta1", 0, 1), ("adam_beta2", 0, 1), ("adam_epsilon", 1e-30, 1), ("weight_decay", 0, math.inf))
FIELD_CHOICES = {"importance_sampling_level": ("token", "sequence")}  # (TRL 1.16's GRPOConfig documentation)
# generation_kwargs keys that TRL would let override a setting or a checked field: each refused, naming its owner
GENERATION_OWNED = dict.fromkeys(
    ("max_new_tokens", "max_length", "min_new_tokens", "min_length", "max_tokens", "min_tokens"),
    "MAX_COMPLETION_LENGTH, which the rewards' cut-off rule and the truncation mask also read",
)
GENERATION_OWNED |= dict.fromkeys(("num_return_sequences", "n"), "NUM_GENERATIONS, GRPO's group size")
GENERATION_OWNED |= {"temperature": "TEMPERATURE", "do_sample": "GRPO itself (its groups must be sampled)"}
GENERATION_OWNED |= {k: f"--{k}, checked before the run" for k in ("top_p", "top_k", "min_p", "repetition_penalty")}
FSDP2_WARNING = (
    "FSDP2 is experimental with this script: TRL 1.16 generates through FSDP2's hooks, so every decoded token "
    "all-gathers the whole model (a full weight transfer per token), and vLLM with LoRA under FSDP is not done in "
    "TRL. Prefer configs/accelerate/zero3.yaml (one gather per generate call) or ddp.yaml (docs/launch.md)."
)
THINKING_MIN_TOKENS = 1024  # Qwen3's thinking on GSM8K runs to several hundred tokens before the answer


def resolve(args, cpu_only, profiles, known_rewards, comments=None):
    """The run's settings (cli.parse's `args`), each decided and checked once: weights of 1 as TRL's, vLLM chosen
    for this machine, every value checked, then the profile's task and model (--plan: this machine's refusals warn)."""
    s = dict(args.settings)
    if "REWARD_FUNCS" in args.given and "REWARD_WEIGHTS" not in args.given:
        s["REWARD_WEIGHTS"] = [1.0] * len(s["REWARD_FUNCS"])
        log.info("REWARD_WEIGHTS=%s: 1 for each of REWARD_FUNCS, as TRL weighs them (give REWARD_WEIGHTS to change)",
                 ",".join("1" for _ in s["REWARD_FUNCS"]))  # fmt: skip
    s = choose_generation(s, hardware.on_gpu(cpu_only))
    task = not args.profile or "DATASET" in args.given  # else the profile's own, which its prepare writes below
    refuse_bad_settings(s, cpu_only, known_rewards, args.fields, not args.plan, comments=comments, dataset=task)
    return profiles[args.profile].prepare(s, args.given) if args.profile else s


def choose_generation(s, cuda):
    """The settings with USE_VLLM True or False for this machine and VLLM_GPU_MEMORY_UTILIZATION a share."""
    fsdp = hardware.fsdp_version()
    # vLLM gets merged weights: lossy in 4 bits, not B @ A for DoRA; none from FSDP's shards
    blocked = f"FSDP{fsdp} shards keep the LoRA weights from vLLM" if fsdp else None
    if s["LOAD_IN_4BIT"] or s["USE_DORA"]:
        blocked = "LOAD_IN_4BIT or USE_DORA is on (no exact merge for vLLM)"
    use_vllm, share = generation.choose(
        s["USE_VLLM"],
        cuda,
        mode=s["VLLM_MODE"],
        share=s["VLLM_GPU_MEMORY_UTILIZATION"],
        model_name=s["MODEL_NAME"],
        sequences=s["PER_DEVICE_TRAIN_BATCH_SIZE"] * (s["STEPS_PER_GENERATION"] or s["GRADIENT_ACCUMULATION_STEPS"]),
        tokens=s["MAX_COMPLETION_LENGTH"],
        blocked=blocked,
    )
    return {**s, "USE_VLLM": use_vllm, "VLLM_GPU_MEMORY_UTILIZATION": share}


def refuse_bad_settings(s, cpu_only=False, known_rewards=(), fields=None, machine=True, comments=None, dataset=True):
    """Refuse at once every setting that would fail (or silently waste) a run. `known_rewards`: the registry's
    names; `fields`: the command line's GRPOConfig fields; `machine=False` (--plan): this machine's problems are
    warnings; `comments`: each constant's comment, for range messages; `dataset=False`: a profile's task, unchecked."""
    problems = settings.problems(s, comments)
    problems += report_problems(s["REPORT_TO"]) + _batch(s) + _rewards(s, known_rewards) + _steps(s)
    out = output_dir_problem(s["OUTPUT_DIR"]) or run_folder_problem(s["OUTPUT_DIR"])
    data = dataset_problem(s["DATASET"]) if dataset else None
    problems += [p for p in (model_name_problem(s["MODEL_NAME"]), data, out) if p]
    problems += prompt_problems(s) + launcher_problems(os.environ)
    if machine:
        problems += hardware_problems(s, cpu_only)
    for problem in [] if machine else hardware_problems(s, cpu_only):
        log.warning("on this machine the run would stop: %s", problem.replace("\n", " "))
    # export.py publishes, with our card and an allow-list of files; Trainer's push would upload every checkpoint
    if (fields or {}).get("push_to_hub"):
        problems.append(
            "--push_to_hub=true is refused: Trainer would upload each checkpoint with run files and TRL's card.\n"
            f"Push the adapter and its card: python export.py --ADAPTER={s['OUTPUT_DIR']} --ADAPTER_ONLY=true "
            "--PUSH_TO_HUB=you/name (or, without ADAPTER_ONLY, the merged model)"
        )
    if s["ENABLE_THINKING"] and s["MAX_COMPLETION_LENGTH"] < THINKING_MIN_TOKENS:
        problems.append(
            f"ENABLE_THINKING=True with MAX_COMPLETION_LENGTH={s['MAX_COMPLETION_LENGTH']}: thinking is cut off "
            f"before the answer, so every reward is 0.\nSet MAX_COMPLETION_LENGTH >= {THINKING_MIN_TOKENS}, "
            "or ENABLE_THINKING=False."
        )
    if problems:
        raise ConfigError("\n\n".join(dict.fromkeys(problems)))


# chat markers of ChatML, Llama 3, Gemma and Mistral (a local tokenizer's own special tokens are added)
CHAT_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|start_header_id|>")
CHAT_MARKERS += ("<|end_header_id|>", "<start_of_turn>", "<end_of_turn>", "[INST]", "[/INST]", "<|begin_of_text|>")
# the rewards that pay a right answer (this project's, TRL's, open-r1's names): a negative weight pays wrong ones
CORRECTNESS = ("correctness_reward", "math_reward", "accuracy_reward", "reasoning_accuracy_reward", "accuracy")
FORMAT_READERS = ("correctness_reward", "format_reward", "math_reward", "accuracy", "format")  # read '#### N'


def prompt_problems(s):
    """A system prompt holding chat control tokens (refused), or one not asking for the '#### N' the rewards read,
    and a negative weight on a correctness reward (warned about)."""
    prompt = s["SYSTEM_PROMPT"]
    added = _json_object(Path(s["MODEL_NAME"]) / "tokenizer.json").get("added_tokens")
    specials = [t["content"] for t in added or () if isinstance(t, dict) and t.get("special") and t.get("content")]
    if forged := [m for m in (*CHAT_MARKERS, *specials) if m and m in prompt]:
        return [
            f"SYSTEM_PROMPT holds {forged[0]!r}, a control token of the chat template: it would end the system turn "
            "and forge another in every prompt.\nRemove it from SYSTEM_PROMPT (write plain instructions)."
        ]
    if "####" not in prompt and (readers := [f for f in s["REWARD_FUNCS"] if f in FORMAT_READERS]):
        log.warning(
            "SYSTEM_PROMPT does not ask for the final answer as '#### <number>', which %s and strict accuracy read "
            "(a recipe's unquoted '#' starts a YAML comment): %r",
            ", ".join(readers),
            prompt[-80:],
        )
    for name, weight in zip(s["REWARD_FUNCS"], s["REWARD_WEIGHTS"], strict=False):
        if name in CORRECTNESS and weight < 0:
            log.warning("REWARD_WEIGHTS gives %s the weight %g: wrong answers earn more than right ones", name, weight)
    return []


def launcher_problems(environ):
    """Launcher variables left by an earlier job (a launcher sets MASTER_ADDR too): torch would wait forever."""
    left = [f"{key}={environ[key]}" for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK") if key in environ]
    if not left or "MASTER_ADDR" in environ:
        return []
    return [
        f"{', '.join(left)} set, but no launcher started this process (no MASTER_ADDR): left from an earlier job?\n"
        "Unset them (unset WORLD_SIZE RANK LOCAL_RANK), or start with torchrun (docs/launch.md)."
    ]


def tracker_problems(report_to, environ=os.environ):
    """A tracker whose package is missing, or W&B without a login outside offline mode: both fail mid-run."""
    names = settings.trackers(report_to)
    missing = [t for t in names if t in ("trackio", "wandb") and not hardware.importable(t)]
    problems = [f"REPORT_TO={report_to} needs the {t} package: pip install {t}." for t in missing]
    offline = environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
    if "wandb" in names and not problems and not offline and not _wandb_key(environ):
        problems.append(
            f"REPORT_TO={report_to}, but W&B is not logged in here: run `wandb login` (or set WANDB_API_KEY), or "
            "log offline with WANDB_MODE=offline and `wandb sync` later."
        )
    return problems


def _wandb_key(environ):
    """An API key in the environment, or in ~/.netrc for the W&B host, as `wandb login` leaves it."""
    host = urlparse(environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return bool(environ.get("WANDB_API_KEY")) or netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def report_problems(text):
    names = settings.trackers(text)
    if not names and text.strip() != "none":
        return [f"REPORT_TO={text!r} names no tracker: give tensorboard, trackio, wandb, a comma list, or none."]
    bad = [n for n in names if n not in TRACKERS]
    close = [c for n in bad for c in difflib.get_close_matches(n, TRACKERS, n=1)]
    hint = f" Did you mean {close[0]}?" if close else ""
    return [f"REPORT_TO={text!r}: {bad[0]!r} is not one of {', '.join(TRACKERS)} (or none).{hint}"] if bad else []


def _batch(s):
    """GRPO's batch rule: a generation round must hold whole groups. Every suggested fix obeys it."""
    gens, per_device, spg = s["NUM_GENERATIONS"], s["PER_DEVICE_TRAIN_BATCH_SIZE"], s["STEPS_PER_GENERATION"]
    if gens < 2 or per_device < 1 or spg < 0 or s["GRADIENT_ACCUMULATION_STEPS"] < 1:
        return []  # reported by the ranges
    name = "STEPS_PER_GENERATION" if spg else "GRADIENT_ACCUMULATION_STEPS"
    steps, procs = s[name], hardware.world_size()
    per_round = per_device * procs
    if per_round * steps % gens == 0:
        return []
    step = gens // math.gcd(per_round, gens)  # the multiples of this hold whole groups: the next one above steps
    fix = (steps // step + 1) * step
    alt = _divisors(per_round * steps) - {1}
    other = f", or NUM_GENERATIONS={min(alt, key=lambda g: (abs(g - gens), g))}" if alt else ""
    return [
        f"PER_DEVICE_TRAIN_BATCH_SIZE x processes x {name} = {per_device} x {procs} x {steps} = {per_round * steps} "
        f"completions per generation round, not a multiple of NUM_GENERATIONS={gens} (processes count every node).\n"
        f"Set {name}={fix}{other}."
    ]


def _divisors(n):
    """The divisors of n, in O(sqrt(n)) steps: an accumulation of 1e11 steps must not stall preflight."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return set(small) | {n // d for d in small}


def _rewards(s, known):
    funcs, weights = s["REWARD_FUNCS"], s["REWARD_WEIGHTS"]
    if not funcs:
        return ["REWARD_FUNCS is empty: GRPO needs at least one reward, e.g. correctness_reward."]
    problems = []
    if len(weights) != len(funcs):
        problems.append(
            f"REWARD_WEIGHTS has {len(weights)} weights for {len(funcs)} REWARD_FUNCS ({funcs}); "
            "give one weight per function, in the same order."
        )
    elif any(not math.isfinite(w) for w in weights) or not any(weights):
        problems.append(f"REWARD_WEIGHTS={weights}: every weight must be finite and one at least non-zero.")
    plain = [f for f in funcs if known and isinstance(f, str) and not {":", "."} & set(f)]
    for name in [f for f in plain if f in reward_guard.UNSUPPORTED]:
        problems.append(f"REWARD_FUNCS names open-r1's {name!r}, unused here: {reward_guard.UNSUPPORTED[name]}.")
    for name in [f for f in plain if f not in known and f not in reward_guard.OTHER_NAMES | reward_guard.UNSUPPORTED]:
        close = difflib.get_close_matches(name, [*known, *reward_guard.OTHER_NAMES], n=1)
        hint = f"Did you mean {close[0]}? " if close else ""
        problems.append(
            f"REWARD_FUNCS names an unknown reward {name!r}. {hint}\n"
            f"Known: {', '.join(known)}; or give your own as 'module:function' (or TRL's 'module.function')."
        )
    return problems


def _steps(s):
    if s["MAX_STEPS"] == 0 or s["MAX_STEPS"] < -1 or (s["MAX_STEPS"] == -1 and not s["NUM_TRAIN_EPOCHS"] > 0):
        return [
            f"MAX_STEPS={s['MAX_STEPS']} with NUM_TRAIN_EPOCHS={s['NUM_TRAIN_EPOCHS']} trains nothing.\n"
            "Set MAX_STEPS to a positive number of steps, or to -1 with NUM_TRAIN_EPOCHS > 0."
        ]
    if s["KL_ACT"] < s["KL_WARN"]:
        return [f"KL_ACT={s['KL_ACT']} is below KL_WARN={s['KL_WARN']}; the act level must be the higher one."]
    return []


WRITE_PROBE = ".write-test-"  # the prefix of the empty folder that checks the output folder is writable, then goes
CHECKOUT = Path(__file__).resolve().parents[1]  # the folder holding grpotrainer.py
# What a run writes before its run_settings.json: the CPU profiles' model and data folders (the demo's warm start in
# progress too), files.py's hidden work in progress, and the run.lock of a run killed before its run.lock.json.
PROFILE_FOLDERS = re.compile(
    r"smoke-model|demo-(sums-)?(data-|model-)?seed\d+(\.sft\d+)?|\..+\.(tmp|partial|old)-.+|run\.lock"
)


def run_folder_problem(out):
    """Why a training run must not write into the folder `out`, or None: it takes a missing or empty folder or one of
    its own runs, never the current folder, the checkout or home, or a folder above them."""
    path = Path(out).resolve()
    guarded = (("the current folder", Path.cwd()), ("the checkout", CHECKOUT), ("the home folder", Path.home()))
    for what, folder in guarded:
        if (folder := folder.resolve()).is_relative_to(path):
            where = what if folder == path else f"above {what} ({folder})"
            return (
                f"OUTPUT_DIR={out} is {where}: a run writes README.md, tokenizer and adapter files there.\n"
                "Give the run a folder of its own, e.g. --OUTPUT_DIR=outputs/run1."
            )
    # another rank's writability probe may sit there for an instant: ours, never a user's file
    entries = sorted(p.name for p in path.iterdir() if not p.name.startswith(WRITE_PROBE)) if path.is_dir() else []
    # a run's own record: its run_settings.json, or the run.lock.json of a run killed before writing that
    records = (("run_settings.json", ("OUTPUT_DIR", "grpo_config")), ("run.lock.json", ("pid", "host")))
    own = any(all(key in _json_object(path / name) for key in keys) for name, keys in records)
    if own or all(PROFILE_FOLDERS.fullmatch(name) for name in entries):
        return None
    shown = ", ".join(entries[:3]) + (f", ... ({len(entries)} in all)" if len(entries) > 3 else "")
    return (
        f"OUTPUT_DIR={out} holds files no training run wrote ({shown}); a run would overwrite or delete them.\n"
        "Give the run a new or empty folder, e.g. --OUTPUT_DIR=outputs/run1."
    )


def _json_object(path):
    """The JSON object in the file `path`, or {} when there is none to read: another check names a torn file."""
    data = checkpoints.read_json(path)[0]
    return data if isinstance(data, dict) else {}


def model_name_problem(model_name):
    """Why the model setting names neither a folder with a config.json nor a valid Hub id, or None."""
    if not hub.is_local(model_name):
        err = hub.id_error(model_name)
        return f"MODEL_NAME={model_name!r} is neither a folder nor a Hub id ({err})." if err else None
    if not (Path(model_name) / "config.json").is_file():
        return (
            f"MODEL_NAME={model_name}: that folder holds no config.json.\n"
            "Give a folder with a model's config.json, weights and tokenizer, or a Hub id such as Qwen/Qwen3-8B."
        )
    return None


def dataset_problem(dataset):
    """Why the dataset setting names neither a local file or folder that exists nor a valid Hub id, or None."""
    if not str(dataset).strip():
        return "DATASET is empty: give openai/gsm8k (a Hub id), a .jsonl file or a folder of train.jsonl/test.jsonl."
    if hub.is_local(dataset):
        return None if Path(dataset).exists() else f"DATASET={dataset}: no such file or folder."
    if err := hub.id_error(dataset):
        return f"DATASET={dataset!r} is neither a local file or folder nor a Hub id such as openai/gsm8k ({err})."
    return None


def output_dir_problem(out):
    """Why the folder `out` cannot be created and written, or None; tried for real (os.access misjudges mounts)."""
    if not str(out).strip():
        return "OUTPUT_DIR is empty; name the folder for checkpoints and the adapter."
    path = Path(out)
    try:
        if dangling := next((p for p in (path, *path.parents) if p.is_symlink() and not p.exists()), None):
            return (
                f"OUTPUT_DIR={out}: {dangling} is a symbolic link to {os.readlink(dangling)}, which does not exist; "
                "create that folder, or remove the link."
            )
        existing = next(p for p in (path, *path.parents) if p.exists())
        if not existing.is_dir():
            return f"OUTPUT_DIR={out}: {existing} is a file, not a folder; give a folder path."
        os.rmdir(tempfile.mkdtemp(prefix=WRITE_PROBE, dir=existing))
    except OSError as err:
        return f"OUTPUT_DIR={out} cannot be created or written ({err.strerror or err}); choose a writable folder."
    return None


def hardware_problems(s, cpu_only):
    """What the requested precision, quantisation, generation and kernels need from this machine."""
    problems = []
    cuda = hardware.on_gpu(cpu_only)
    if cuda and hardware.world_size() == 1 and (gpus := hardware.gpu_count()) > 1:
        problems.append(
            f"{gpus} GPUs are visible but one process was started, and TRL will not spread one process over several.\n"
            f"Run torchrun --nproc_per_node {gpus} grpotrainer.py (see docs/launch.md), or set CUDA_VISIBLE_DEVICES=0."
        )
    if not cpu_only and not cuda:
        problems.append(no_gpu_problem(nvidia_driver()))
    elif s["BF16"] and not (hardware.cpu_bf16() if cpu_only else cuda and hardware.bf16_gpu()):
        problems.append(
            "BF16=True, but this CPU has no bf16 instructions (avx512_bf16 or AMX) and torch would emulate them.\n"
            "Set BF16=False (fp32) here; --real sets it by itself."
            if cpu_only
            else "BF16=True needs an Ampere or newer GPU, and this one has no bf16.\n"
            "Set BF16=False (fp32: slower, twice the memory; consider LOAD_IN_4BIT or a smaller MODEL_NAME)."
        )
    for flag, package, install in [
        ("LOAD_IN_4BIT", "bitsandbytes", "pip install -r requirements-cuda.txt"),
        ("USE_VLLM", "vllm", "pip install -r requirements-vllm.txt (adds vllm to this environment)"),
    ]:
        if s[flag] is True and not cuda:
            problems.append(f"{flag}=True needs a CUDA GPU; set {flag}=False on this machine.")
        elif s[flag] is True and not hardware.importable(package):
            problems.append(f"{flag}=True needs the {package} package, which is not installed: {install}")
    problems += tracker_problems(s["REPORT_TO"])
    if s["USE_VLLM"] is True and s["LOAD_IN_4BIT"]:
        problems.append(
            "USE_VLLM=True with LOAD_IN_4BIT=True: TRL merges LoRA into the base weights for vLLM, lossy in 4-bit.\n"
            "Use vLLM with bf16 LoRA, or QLoRA with transformers generation (TRL issues 3466, 3654)."
        )
    if s["USE_VLLM"] is True and s["USE_DORA"]:
        problems.append("USE_VLLM=True with USE_DORA=True: vLLM gets plain LoRA's merge only; set USE_VLLM=False.")
    attn = hardware.attention_problem(
        s["ATTN_IMPLEMENTATION"], cuda=cuda, bf16=s["BF16"], importable=hardware.importable
    )
    problems += [p for p in (attn, weight_sync.fsdp_problem(s["USE_VLLM"] is True, hardware.fsdp_version())) if p]
    if hardware.fsdp_version() == 2:
        log.warning(FSDP2_WARNING)
    for other in ("USE_VLLM", "USE_TRANSFORMERS_CONTINUOUS_BATCHING"):
        if s["CACHE_IMPLEMENTATION"] == "static" and s[other]:
            problems.append(
                f"CACHE_IMPLEMENTATION=static does nothing with {other}=True, which generates without generate().\n"
                f"Set CACHE_IMPLEMENTATION=dynamic, or {other}=False to decode with the static cache."
            )
    return problems


# The oldest NVIDIA driver for each CUDA major version of torch's wheels; requirements.txt's torch is a CUDA 13 build
DRIVER_FLOOR = {12: 525, 13: 580}
CUDA12_WHEELS = "https://download.pytorch.org/whl/cu128"  # PyTorch's own index of CUDA 12.8 builds


def nvidia_driver():
    """The NVIDIA driver version nvidia-smi reports ("550.54.15"), or None."""
    query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
    try:
        found = subprocess.run(query, capture_output=True, text=True, timeout=20, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):  # not installed, failed, or hung
        return None
    return found[0] if found else None


def no_gpu_problem(driver):
    """Why torch sees no GPU: no NVIDIA driver (`driver` None), or one this torch's build cannot use."""
    if driver is None:
        return (
            "no CUDA GPU is visible; a real run needs one (bf16 training of a 1B+ model on a CPU takes weeks).\n"
            "Try the pipeline offline on the CPU with: make smoke"
        )
    import torch

    version = torch.__version__.partition("+")[0]
    built = torch.version.cuda  # None for a CPU-only build
    major = int(driver.partition(".")[0])
    floor = DRIVER_FLOOR.get(int(built.partition(".")[0]), 0) if built else None
    if floor is not None and major >= floor:  # the driver is new enough: something else hides the GPU
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
        return (
            f"nvidia-smi reports NVIDIA driver {driver}, new enough for torch {torch.__version__}, but torch sees "
            f"no GPU{f' (CUDA_VISIBLE_DEVICES={hidden!r})' if hidden is not None else ''}.\n"
            "Check CUDA_VISIBLE_DEVICES and that python -c 'import torch; torch.cuda.init()' works on this node."
        )
    if not built and major >= DRIVER_FLOOR[13]:  # a CPU-only torch on a new driver
        return (
            f"nvidia-smi reports NVIDIA driver {driver}, but torch {torch.__version__} is a CPU-only build: it sees "
            f"no GPU.\nInstall its CUDA build: pip install --force-reinstall torch=={version} (PyPI's CUDA 13 build "
            f"runs on this driver), then rerun."
        )
    why = f"built for CUDA {built}, which needs driver >= {floor}" if built else "a CPU-only build"
    return (
        f"nvidia-smi reports NVIDIA driver {driver}, but torch {torch.__version__} sees no GPU: it is {why}.\n"
        f"Install its CUDA 12 build (driver >= {DRIVER_FLOOR[12]}): pip install torch=={version} --index-url "
        f"{CUDA12_WHEELS}, or upgrade the driver to >= {DRIVER_FLOOR[13]} (docs/gpu.md)."
    )


def refuse_before_loading(s, reward_funcs, train_dataset, answer_blind=()):
    """The checks that need the rewards, the data or the model's files, still before any weights load."""
    try_rewards(reward_funcs, s["REWARD_FUNCS"], train_dataset, s["MAX_COMPLETION_LENGTH"], answer_blind)
    if problem := hub.hub_unreachable(s["MODEL_NAME"], "MODEL_NAME"):
        raise ConfigError(problem)  # in seconds, not after huggingface_hub's minute of retries
    refuse_torn_model_folder(s["MODEL_NAME"])
    if warning := thinking_ignored(s["MODEL_NAME"], s["ENABLE_THINKING"]):
        log.warning(warning)
    refuse_misfit_model(s)


def refuse_torn_model_folder(model_name):
    """A model folder cut short (tokenizer, template, JSON, weights) fails minutes into loading: refuse it now."""
    folder = Path(model_name)
    if not (folder / "config.json").is_file():
        return  # a Hub id: transformers downloads and checks it
    tokenizer = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
    problems = [] if any((folder / name).is_file() for name in tokenizer) else ["it holds no tokenizer files"]
    config = folder / "tokenizer_config.json"
    template = config.is_file() and "chat_template" in config.read_text(encoding="utf-8", errors="replace")
    if not problems and not template and not any(folder.glob("chat_template.j*")):  # .jinja or .json
        problems.append("its tokenizer has no chat template (GSM8K prompts are chat messages)")
    for path in sorted(folder.glob("*.json")):  # config, tokenizer, generation config, shard index: all JSON
        try:
            json.loads(path.read_bytes())
        except ValueError as err:  # UnicodeDecodeError too
            problems.append(f"{path.name} is not JSON ({errors.first_line(err)})")
    weights = sorted(folder.glob("*.safetensors"))
    problems += [p for path in weights if (p := checkpoints.safetensors_problem(path))]
    weight_map = _json_object(folder / "model.safetensors.index.json").get("weight_map")
    listed = {str(name) for name in weight_map.values()} if isinstance(weight_map, dict) else set()
    if shards := sorted(listed - {path.name for path in weights}):
        problems.append(
            f"the weight shards {', '.join(shards[:3])} that model.safetensors.index.json lists are missing"
        )
    if not weights and not any(folder.glob("*.bin")):
        problems.append("it holds no weights (*.safetensors)")
    if problems:
        raise ConfigError(
            f"MODEL_NAME={model_name}: {'; '.join(problems[:3])}.\n"
            "Copy or download the model folder again, whole (an instruct model's folder has a chat template)."
        )


def thinking_ignored(model_name, enable_thinking):
    """The warning for thinking asked of a local model whose chat template(s) never read enable_thinking, or None (a
    Hub id, or a folder without a template). A warning: some models think without their template asking."""
    folder = Path(model_name).expanduser()
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.glob("chat_template.jinja"))]
    template = _json_object(folder / "tokenizer_config.json").get("chat_template") or ""
    templates = template if isinstance(template, list) else [template]  # or named ones: {"name", "template"}
    texts += [t if isinstance(t, str) else t.get("template", "") for t in templates]
    source = "\n".join(t for t in texts if isinstance(t, str))
    if not enable_thinking or not source or "enable_thinking" in source:
        return None
    return (
        f"ENABLE_THINKING=True, but the chat template of MODEL_NAME={model_name} never reads enable_thinking: unless "
        "the model writes <think>...</think> by itself, no completion has an answer (every reward and accuracy is 0). "
        "Set ENABLE_THINKING=False for a model without a thinking mode."
    )


def try_rewards(funcs, names, dataset, max_completion_length, answer_blind=()):
    """Call every reward through its guard as GRPOTrainer will, on three real rows: a raise or a bad value stops
    here. Then warn about one not in `answer_blind` that scores a right and a wrong answer alike."""
    from transformers import TrainerState

    rows = dataset.select(range(min(3, len(dataset))))
    # lists, as TRL passes them (a datasets Column is no list: `answer[i] is None` tests would differ)
    columns = {key: list(rows[key]) for key in rows.column_names if key != "prompt"}
    kwargs = dict(
        prompts=list(rows["prompt"]),
        # fewer ids than the limit: finished completions (one as long as the limit is cut off and earns nothing)
        completion_ids=[[0] * min(8, max_completion_length - 1)] * len(rows),
        trainer_state=TrainerState(),  # step 0, as at the first generation
        log_extra=lambda column, values: None,
        log_metric=lambda name, value: None,
        **columns,
    )

    def scores(func, answers):
        completions = [[{"role": "assistant", "content": f"{a} + 0 = {a}\n#### {a}"}] for a in answers]
        out = func(**kwargs, completions=completions)
        return list(asyncio.run(out) if inspect.isawaitable(out) else out)  # TRL awaits async reward functions

    for func, name in zip(funcs, names, strict=True):
        right = scores(func, rows["answer"])
        # the same problems answered wrongly, in the same shape: a reward that scores both alike cannot teach GSM8K
        if name not in answer_blind and scores(func, map(_wrong, rows["answer"])) == right:
            log.warning(
                "REWARD_FUNCS entry %r scores a right and a wrong answer to the same problems alike (%s): if it is "
                "meant to reward correctness, check what it reads (completions are chat lists, see README).",
                name,
                right,
            )


def _wrong(answer):
    """A wrong GSM8K answer beside `answer`: one more, or the text with a digit added."""
    try:
        return str(int(answer) + 1)
    except ValueError:
        return f"{answer}1"


def refuse_bad_grpo_config(config, s, train_size):
    """What the built GRPOConfig implies and GRPOTrainer finds only at its first step: the sampling settings (any
    --top_k, --min_p, ... passed through), the data a generation round needs, and fields this script cannot serve."""
    import transformers as tf

    if train_size == 0:
        raise ConfigError(f"DATASET={s['DATASET']} leaves no training problems (MAX_SAMPLES={s['MAX_SAMPLES']}).")
    problems = []
    warpers = [(tf.TemperatureLogitsWarper, config.temperature)]  # built as generate() builds them, which checks
    warpers += [(tf.TopKLogitsWarper, config.top_k)] if config.top_k else []
    warpers += [(tf.TopPLogitsWarper, config.top_p)] if config.top_p is not None and config.top_p != 1.0 else []
    warpers += [(tf.MinPLogitsWarper, config.min_p)] if config.min_p is not None else []
    penalty = config.repetition_penalty
    warpers += [(tf.RepetitionPenaltyLogitsProcessor, penalty)] if penalty is not None and penalty != 1.0 else []
    try:
        for warper, value in warpers:
            warper(value)
        tf.GenerationConfig(**(config.generation_kwargs or {})).validate(strict=True)
    except (ValueError, TypeError) as err:  # each names the value; a generation_kwargs that is no dict: TypeError
        problems.append(f"the sampling settings are invalid: {errors.first_line(err)}")
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    bad = [name for name, value in values.items() if isinstance(value, float) and not math.isfinite(value)]
    problems += [f"--{name}={getattr(config, name)}: a number here must be finite" for name in bad]
    for name, low, high in FIELD_RANGES:  # passed-through fields that TRL or Trainer check only at the first step
        if (value := values.get(name)) is not None and not low <= value <= high:
            problems.append(f"--{name}={value} must lie in [{low:g}, {high:g}]")
    for name, allowed in FIELD_CHOICES.items():
        if values.get(name) not in allowed:
            problems.append(f"--{name}={values.get(name)} must be one of {', '.join(allowed)}")
    problems += _optimizer(config)
    prompts = config.generation_batch_size // config.num_generations
    if train_size < prompts:
        problems.append(
            f"the training set has {train_size} problems, but each generation round takes {prompts} "
            "(PER_DEVICE_TRAIN_BATCH_SIZE x processes x steps per generation / NUM_GENERATIONS): no step would run"
        )
    if (strategy := getattr(config.eval_strategy, "value", config.eval_strategy)) != "no":
        problems.append(f"--eval_strategy={strategy}: evaluation runs through EVAL_BEFORE/EVAL_AFTER here")
    if config.use_vllm and config.vllm_importance_sampling_correction and s["LORA_DROPOUT"] > 0:
        log.warning(  # a warning: some users want the regularisation and accept the noise
            "LORA_DROPOUT=%g with vLLM's importance-sampling correction: TRL computes the old log-probs in train "
            "mode, so dropout noise enters the ratio and the KL. LORA_DROPOUT=0 avoids it.",
            s["LORA_DROPOUT"],
        )
    problems += _saving(config)
    if getattr(config, "use_liger_kernel", False) and not hardware.importable("liger_kernel"):
        problems.append("--use_liger_kernel=true needs the liger-kernel package (deprecated in TRL 1.16)")
    if problems:
        raise ConfigError("\n\n".join(f"{p}." for p in problems))


def _optimizer(config):
    """Built on a placeholder weight now, as Trainer builds it at the first step, where torch refuses a beta of 2."""
    import torch
    from transformers import Trainer

    try:
        optimizer_class, kwargs = Trainer.get_optimizer_cls_and_kwargs(config)
    except (ValueError, ImportError) as err:  # an --optim Trainer does not know; a missing optional package
        return [f"--optim={config.optim}: {errors.first_line(err)}"] if isinstance(err, ValueError) else []
    except (TypeError, AttributeError):  # it needs the model to build
        return []
    try:
        optimizer_class([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    except ValueError as err:  # torch's own range checks, naming the value
        return [f"the optimizer settings are invalid: {errors.first_line(err)}"]
    return []


def _saving(config):
    """Passed-through fields that would switch off what resuming relies on, or give a setting a second value."""
    problems = []
    if (strategy := getattr(config.save_strategy, "value", config.save_strategy)) != "steps":
        problems.append(
            f"--save_strategy={strategy}: this script saves a checkpoint every SAVE_STEPS, which resuming and the "
            "stop on SIGTERM rely on; set --SAVE_STEPS instead"
        )
    if config.save_only_model:
        problems.append(
            "--save_only_model=true: a checkpoint without the optimizer, scheduler and RNG state cannot be resumed, "
            "so a rerun would set every one aside and start again from step 0; leave it off"
        )
    kwargs = config.generation_kwargs if isinstance(config.generation_kwargs, dict) else {}
    for key in [key for key in kwargs if key in GENERATION_OWNED]:
        problems.append(f"--generation_kwargs sets {key}, which is set by {GENERATION_OWNED[key]}: leave it out")
    return problems


def refuse_misfit_model(s, config=None):
    """What the model's config (a local folder's, the Hub cache's, or `config`) decides, on the meta device: a causal
    LM whose weight files fit it, LoRA targets and rank that fit its layers, a completion length that fits."""
    import torch
    import transformers as tf

    name, remote, local = s["MODEL_NAME"], s["TRUST_REMOTE_CODE"], (Path(s["MODEL_NAME"]) / "config.json").is_file()
    try:
        config = config or tf.AutoConfig.from_pretrained(name, local_files_only=True, trust_remote_code=remote)
        with torch.device("meta"):
            model = tf.AutoModelForCausalLM.from_config(config, trust_remote_code=remote)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:  # unreadable, foreign; or not cached
        if not local:
            return
        if not remote and "auto_map" in files.read_json_object(Path(name) / "config.json"):
            raise ConfigError(
                f"MODEL_NAME={name}: its config.json names the folder's own Python code (auto_map), which runs only "
                "with --TRUST_REMOTE_CODE=true typed on the command line: read that code first."
            ) from None
        what = errors.first_line(err)
        raise ConfigError(f"MODEL_NAME={name}: its config.json is not a causal language model's ({what}).") from None
    problems = _weight_shapes(Path(name), model) if local else []
    architecture = (getattr(config, "architectures", None) or [None])[0]
    # trusted remote code: the class is the folder's own (its config's auto_map), built above
    custom = remote and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    if local and not custom and not hasattr(tf, str(architecture)):  # TRL loads the class it names
        problems.append(f"MODEL_NAME: config.json names no model class transformers has ({architecture})")
    elif local and not custom and not issubclass(getattr(tf, architecture), tf.GenerationMixin):
        problems.append(
            f"MODEL_NAME: config.json names {architecture}, a model that does not generate text (an encoder or "
            "a bare model without its language-model head); GRPO samples completions: give a causal LM such as "
            "Qwen3ForCausalLM"
        )
    modules = dict(model.named_modules())
    targets = settings.lora_targets(s["LORA_TARGET_MODULES"])
    if not targets:
        problems.append("LORA_TARGET_MODULES is empty: give all-linear or layer names such as q_proj,v_proj")
    matched = {n: m for n, m in modules.items() if _is_target(n, m, targets)}
    listed = [] if targets == "all-linear" else targets
    if missing := [t for t in listed if not any(n == t or n.endswith("." + t) for n in modules)]:
        problems.append(f"LORA_TARGET_MODULES: {', '.join(missing)} matches no layer of {name}")
    if odd := sorted({n.rsplit(".", 1)[-1] for n, m in matched.items() if not _lora_layer(m)}):
        problems.append(f"LORA_TARGET_MODULES: {', '.join(odd)} are not linear layers, which LoRA adapts")
    if problems and (targets == [] or missing or odd):
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in modules.items() if isinstance(m, torch.nn.Linear)})
        problems[-1] += f" (its linear layers: {', '.join(linear)}; or all-linear)"
    sides = [min(m.in_features, m.out_features) for m in matched.values() if isinstance(m, torch.nn.Linear)]
    if sides and s["LORA_R"] > min(sides):
        problems.append(
            f"LORA_R={s['LORA_R']} exceeds {min(sides)}, the smaller side of the adapted layers: 8-64 is usual"
        )
    positions = getattr(config, "max_position_embeddings", None)
    if positions and s["MAX_COMPLETION_LENGTH"] >= positions:
        problems.append(
            f"MAX_COMPLETION_LENGTH={s['MAX_COMPLETION_LENGTH']} does not fit {name}'s {positions} positions"
        )
    if problems:
        raise ConfigError("\n\n".join(f"{p}." for p in problems))


def _is_target(name, module, targets):
    if targets == "all-linear":  # as peft reads it: every linear layer but the output head
        return name != "lm_head" and not name.endswith(".lm_head") and type(module).__name__ == "Linear"
    return any(name == t or name.endswith("." + t) for t in targets)


def _lora_layer(module):
    import torch

    kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    return isinstance(module, kinds) or type(module).__name__ == "Conv1D"  # transformers' GPT-2 style linear


def _weight_shapes(folder, model):
    """Tensors in the folder's safetensors files whose shape differs from the config's model (read from headers)."""
    from safetensors import safe_open

    wanted = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    problems = []
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has keys() but is not iterable)
                shape = tuple(f.get_slice(key).get_shape())
                if key in wanted and wanted[key] != shape:
                    problems.append(
                        f"MODEL_NAME: {key} is {list(shape)} in {path.name}, {list(wanted[key])} by config.json"
                    )
    return problems[:3]
