"""Merge a trained LoRA adapter into its base model as a standalone folder, or write the adapter alone; push either.

    python export.py --ADAPTER=outputs/qwen3-gsm8k-grpo                  # writes outputs/qwen3-gsm8k-grpo-merged
    python export.py --ADAPTER=outputs/qwen3-gsm8k-grpo/checkpoint-100   # writes ...-grpo-checkpoint-100-merged
    python export.py --ADAPTER=outputs/qwen3-gsm8k-grpo --OUTPUT_DIR=outputs/qwen3-8b-gsm8k
    python export.py --ADAPTER=outputs/qwen3-gsm8k-grpo --PUSH_TO_HUB=you/qwen3-8b-gsm8k-grpo   # private repo
    python export.py --ADAPTER=outputs/qwen3-gsm8k-grpo --ADAPTER_ONLY=true   # writes outputs/qwen3-gsm8k-grpo-adapter

It loads with transformers or `vllm serve <folder>` (ADAPTER_ONLY: with peft): the run's dtype and tokenizer, a chat
template defaulting to its thinking mode, a card, export_settings.json. It replaces only exports holding nothing else.
"""

import json
import logging
import re
import shutil
from pathlib import Path

from grpo import checkpoints, cli, errors, files, hub, modelcard, preflight, process
from grpo.errors import ConfigError
from grpo.settings import TABLE

# ---------------------------------------------------------------------------------------------------------------
# what to merge
ADAPTER = ""  # a run's OUTPUT_DIR (its final adapter) or a checkpoint-N folder in it; required
MODEL_NAME = ""  # the base model; "" = the run's (run_settings.json), else adapter_config.json's base model
TRUST_REMOTE_CODE = False  # run a model repo's own Python code; Qwen3 needs none
# what to write
OUTPUT_DIR = ""  # "" = beside the run: <run>-merged, or <run>-checkpoint-N-merged for a checkpoint (-adapter)
ADAPTER_ONLY = False  # write the adapter itself (no merge), with tokenizer and card, as TRL users share one
DTYPE = ""  # bfloat16, float16 or float32; "" = the run's (BF16 in run_settings.json), else the base's config
ENABLE_THINKING = False  # the chat template's default for enable_thinking; the run's unless given here
# where to publish
PUSH_TO_HUB = ""  # a Hub repo id (you/name) to upload the folder to; "" = do not push
PRIVATE = True  # create the Hub repo private; it is never made public by this script once it exists
# ---------------------------------------------------------------------------------------------------------------

adapter_files = ("adapter_config.json", "adapter_model.safetensors", "adapter_model.bin")  # what peft saves
marker = "export_settings.json"  # written into every export: marks a folder export.py may replace, lists its files
card = "README.md"  # the model card, written into the export after the folder is in place
dtypes = ("bfloat16", "float16", "float32")
run_types = {**modelcard.SETTING_TYPES, "BF16": bool, "LOAD_IN_4BIT": bool}  # what is read from run_settings.json
log = logging.getLogger("grpotrainer.export")


def main(argv=()):
    args = cli.parse(cli.constants(globals()), list(argv), source=__file__)
    c = dict(args.settings)
    process.setup_logging("export")
    process.require(("torch", "transformers", "peft"), "export.py")
    if c["PUSH_TO_HUB"]:
        refuse_bad_push(c["PUSH_TO_HUB"])  # before any work: a missing token must not cost a merge first
    run = resolve(c, given=args.given)
    out, only, adapter = Path(c["OUTPUT_DIR"]), c["ADAPTER_ONLY"], Path(c["ADAPTER"])
    # for the card, the run folder's (a checkpoint-N's parent); a damaged record is named before any work
    metrics = modelcard.read_metrics(adapter.parent if files.checkpoint_step(adapter) is not None else adapter)
    refuse_foreign_output_dir(out)
    own = (adapter / "tokenizer_config.json").is_file()  # the run's tokenizer, saved beside its adapter
    # the base's files are read unless only the adapter and its own tokenizer are written
    if (not only or not own) and (problem := hub.hub_unreachable(c["MODEL_NAME"], "MODEL_NAME")):
        raise ConfigError(problem)
    what = "the adapter" if only else "the merged model"
    with process.phase(f"loading {what}"):  # with ADAPTER_ONLY, the adapter's own files are copied as they are
        model = None if only else merged_model(c["MODEL_NAME"], c["ADAPTER"], c["DTYPE"], c["TRUST_REMOTE_CODE"])
        tokenizer = load_tokenizer(adapter if own else c["MODEL_NAME"], c["ENABLE_THINKING"], c["TRUST_REMOTE_CODE"])
    keys = ("ADAPTER", "MODEL_NAME", "ENABLE_THINKING", "ADAPTER_ONLY", *(() if only else ("DTYPE",)))
    # what was merged, as the folder's record (uploaded with it): the run's settings without credentials
    record = files.redact({**{k: c[k] for k in keys}, "step": c["STEP"], "run_settings": run})
    copied = [adapter / name for name in adapter_files if only and (adapter / name).is_file()]
    redo = f"{out} is as it was before; the same command exports again"  # publish_dir: the whole folder or none
    with process.phase(f"writing {out}", redo), process.faults(out, then="rerun the same command"):
        write_folder(out, model, tokenizer, record, [*copied, *licence_files(c["MODEL_NAME"])], [card])
    redo = f"{out} is complete but its model card may be missing; the same command exports again"
    with process.phase("writing the model card", redo), process.faults(out, then="rerun the same command"):
        modelcard.write_card(
            out,
            run,
            library_name="peft" if only else "transformers",
            metrics_before=metrics[0],
            metrics_after=metrics[1],
            steps=c["STEP"] or None,
            repo_id=c["PUSH_TO_HUB"],
            adapter_dir=None if only else c["ADAPTER"],
        )
    loader = f"PeftModel.from_pretrained(<{c['MODEL_NAME']}>, " if only else "AutoModelForCausalLM.from_pretrained("
    log.info("wrote %s: load it with %s%r)", out, loader, str(out))
    if c["PUSH_TO_HUB"]:
        push(out, c["PUSH_TO_HUB"], c["PRIVATE"], what)
    return out


def resolve(c, given=frozenset()):
    """Fill in, in place, the settings left "" (and STEP, and ENABLE_THINKING unless `given`) from the run's
    records; return the run's settings dict for the model card."""
    adapter = c["ADAPTER"]
    if not adapter:
        raise ConfigError("give the adapter to merge: --ADAPTER=<a run's OUTPUT_DIR or a checkpoint-N in it>.")
    config = files.read_json_object(Path(adapter) / "adapter_config.json")
    if not config:
        mergeable = files.adapter_checkpoints(adapter)
        hint = f" The newest checkpoint there is {mergeable[-1]}." if mergeable else ""
        raise ConfigError(
            f"ADAPTER={adapter!r} holds no LoRA adapter (no adapter_config.json). Point it at a training run's "
            f"OUTPUT_DIR or a checkpoint-N folder in it.{hint}"
        )
    if problem := checkpoints.adapter_problem(adapter):  # weights missing or cut short: peft fails only after the base
        raise ConfigError(problem)
    run = files.run_settings(adapter, run_types) or settings_from_adapter(config)
    c["MODEL_NAME"] = c["MODEL_NAME"] or run.get("MODEL_NAME") or config.get("base_model_name_or_path") or ""
    if not c["MODEL_NAME"]:
        raise ConfigError(f"the base model of {adapter} is not recorded; give it: --MODEL_NAME=<Hub id or folder>.")
    if trained_on := checkpoints.other_base_model(config, c["MODEL_NAME"]):
        raise ConfigError(
            f"ADAPTER {adapter} was trained on {trained_on}, but MODEL_NAME is {c['MODEL_NAME']}: merging it there "
            f"gives a broken model. Leave MODEL_NAME empty to use {trained_on} (a local copy must keep its name)."
        )
    c["DTYPE"] = c["DTYPE"] or run_dtype(run, c["MODEL_NAME"])
    if c["DTYPE"] not in dtypes:
        raise ConfigError(f'DTYPE is {c["DTYPE"]!r}; give one of {", ".join(dtypes)}, or "" for the run\'s.')
    if "ENABLE_THINKING" not in given:
        c["ENABLE_THINKING"] = bool(run.get("ENABLE_THINKING", False))
    c["OUTPUT_DIR"] = c["OUTPUT_DIR"] or default_output_dir(adapter, "-adapter" if c["ADAPTER_ONLY"] else "-merged")
    c["STEP"] = files.adapter_step(adapter)
    if newer := files.newer_checkpoint(adapter, c["STEP"]):
        log.warning(newer)
    run = {**run, "MODEL_NAME": c["MODEL_NAME"], "ENABLE_THINKING": c["ENABLE_THINKING"]}
    if run.get("LOAD_IN_4BIT") and not c["ADAPTER_ONLY"]:
        log.warning("the run trained on 4-bit (QLoRA) base weights; the merge uses %s weights instead", c["DTYPE"])
    return run


def settings_from_adapter(config):
    """What an adapter_config.json says about a run that left no run_settings.json (runs from before it existed):
    the base model, and each setting of a LoraConfig field (grpo/settings.py) that it holds."""
    lora = {name: row.field.removeprefix("lora_config.") for name, row in TABLE.items() if "lora_config." in row.field}
    found = {name: config[field] for name, field in lora.items() if field in config}
    # peft saves its set of target modules as a list: the setting's text is the names joined
    found = {name: ",".join(sorted(v)) if isinstance(v, list) else v for name, v in found.items()}
    return {"MODEL_NAME": config.get("base_model_name_or_path") or "", **found}


def run_dtype(run, model_name):
    """The dtype the run computed in: BF16 from its settings, else the base model's config.json, else float32."""
    if "BF16" in run:
        return "bfloat16" if run["BF16"] else "float32"
    config = files.read_json_object(Path(model_name) / "config.json") if Path(model_name).is_dir() else {}
    dtype = config.get("dtype") or config.get("torch_dtype")
    return dtype if dtype in dtypes else "float32"


def default_output_dir(adapter, suffix="-merged"):
    """<run>-merged beside the run, or <run>-checkpoint-N-merged (`suffix`: -adapter for ADAPTER_ONLY): never
    inside the run, whose folders Trainer owns."""
    path = Path(adapter).resolve()
    return f"{path.parent}-{path.name}{suffix}" if files.checkpoint_step(path) is not None else f"{path}{suffix}"


def refuse_bad_push(repo_id):
    """Refuse PUSH_TO_HUB without a Hub token or with the Hub switched off, naming the fix."""
    from huggingface_hub import get_token

    if err := hub.id_error(repo_id):
        raise ConfigError(f"PUSH_TO_HUB={repo_id!r} is not a Hub repo id ({err}); write it as you/name.")
    if hub.hub_offline():
        raise ConfigError(
            f"PUSH_TO_HUB={repo_id} needs the Hub, but HF_HUB_OFFLINE is set. Unset it, or export without "
            "PUSH_TO_HUB and upload the folder later (hf upload)."
        )
    if get_token() is None:
        raise ConfigError(
            f"PUSH_TO_HUB={repo_id} needs a Hugging Face token with write access: run `hf auth login` or set HF_TOKEN."
        )


def refuse_foreign_output_dir(out):
    """OUTPUT_DIR (and its parent, where the export is built) writable, and new, empty, or an earlier export
    holding only the files that export wrote."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"OUTPUT_DIR={out} is a file; give a folder path.")
    if problem := preflight.output_dir_problem(out) or preflight.output_dir_problem(out.parent):
        raise ConfigError(problem)
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / marker).is_file():
        raise ConfigError(
            f"OUTPUT_DIR={out} already holds files that export.py did not write; it will not overwrite them.\n"
            "Give a new folder: --OUTPUT_DIR=<path>."
        )
    written = files.read_json_object(out / marker).get("files")
    if not isinstance(written, list):  # an export.py from before the list: what it wrote is not known
        raise ConfigError(
            f"OUTPUT_DIR={out} is an earlier export whose {marker} does not list its files, so files added there "
            "cannot be told apart.\nDelete that folder (after keeping what you added), or give a new --OUTPUT_DIR."
        )
    if extra := sorted(p.name for p in out.iterdir() if p.name not in written):
        shown = ", ".join(extra[:5]) + (f", ... ({len(extra)} in all)" if len(extra) > 5 else "")
        raise ConfigError(
            f"OUTPUT_DIR={out} holds {shown}, which the earlier export there did not write; replacing the folder "
            "would delete them.\nMove them out of it, or give a new folder: --OUTPUT_DIR=<path>."
        )


def merged_model(model_name, adapter, dtype, trust_remote_code=False):
    """The base model in `dtype` on the CPU with the adapter merged into its weights: a plain transformers model."""
    from transformers import AutoModelForCausalLM

    log.info("merging %s into %s (%s)", Path(adapter), model_name, dtype)
    try:
        base = AutoModelForCausalLM.from_pretrained(model_name, dtype=dtype, trust_remote_code=trust_remote_code)
    except Exception as err:  # a torn or foreign folder is the user's to fix; anything else is a bug
        if not errors.is_load_error(err):
            raise
        raise ConfigError(f"MODEL_NAME {model_name!r} could not be loaded: {err}") from None
    model = checkpoints.apply_adapter(base, adapter, model_name)
    return model.merge_and_unload().eval()  # W + scale * B @ A in every adapted layer; the LoRA modules removed


def load_tokenizer(source, enable_thinking, trust_remote_code=False):
    """The tokenizer in `source` (the run's, or the base's), its chat template defaulting to the run's thinking."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named templates (e.g. default and tool_use): each gets the default
        tokenizer.chat_template = {k: with_thinking_default(v, enable_thinking) for k, v in template.items()}
    elif template:
        tokenizer.chat_template = with_thinking_default(template, enable_thinking)
    return tokenizer


def with_thinking_default(template, enable_thinking):
    """`template` with enable_thinking defaulting to the run's value (an earlier default replaced): Qwen3's thinks
    when it is undefined, a mode a run trained without thinking never learnt. A caller's explicit value still wins."""
    if "enable_thinking" not in template:
        return template
    head = "{%- if enable_thinking is not defined %}{%- set enable_thinking = X %}{%- endif %}"
    template = re.sub("^" + re.escape(head).replace("X", "(true|false)"), "", template)
    return head.replace("X", "true" if enable_thinking else "false") + template


def licence_files(model_name):
    """The base model folder's LICENSE / NOTICE files, which its licence (e.g. Apache-2.0) asks to pass on."""
    found = Path(model_name).glob("*")  # none for a Hub id
    return sorted(p for p in found if p.is_file() and p.name.upper().startswith(("LICENSE", "NOTICE")))


def write_folder(out, model, tokenizer, record, extra_files=(), later=()):
    """Write `model` (None with ADAPTER_ONLY), `tokenizer` and `extra_files` beside `out`, then move them into place:
    never half an export nor stale shards. The marker lists every name, with `later` (the card), for replacing it."""
    if out.exists():
        log.info("replacing the earlier export in %s", out)
    with files.publish_dir(out, replace=True) as partial:
        if model is not None:  # None with ADAPTER_ONLY: the adapter's files come in `extra_files`
            model.save_pretrained(partial)  # model.safetensors (or shards), config.json, generation_config.json
        tokenizer.save_pretrained(partial)  # tokenizer files and chat_template.jinja
        for path in extra_files:
            shutil.copy2(path, partial / path.name)
        files.honour_umask(partial)
        record = {**record, "files": sorted({p.name for p in partial.iterdir()} | {marker, *later})}
        (partial / marker).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")


def push(out, repo_id, private, what):
    """Create the Hub repo (private unless PRIVATE=False; an existing repo keeps its visibility) and upload."""
    from huggingface_hub import create_repo, upload_folder

    url = create_repo(repo_id, private=private, exist_ok=True)
    upload_folder(repo_id=repo_id, folder_path=str(out), commit_message=f"Upload {what} (GRPO on GSM8K)")
    log.info("pushed %s to %s", out, url)


if __name__ == "__main__":
    process.run(main)
