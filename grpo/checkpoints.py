"""Checkpoints a run can resume from (broken ones moved aside, never deleted), adapters that fit their base, and
finished runs. The checks read headers and folders, never tensors: milliseconds each."""

import json
import logging
import time
import zipfile
from pathlib import Path

from grpo import files
from grpo.errors import ConfigError, is_load_error
from grpo.files import checkpoint_dirs, checkpoint_step
from grpo.settings import changeable

log = logging.getLogger("grpotrainer")
FINISHED_NAME = "run_finished.json"  # in OUTPUT_DIR, written last by a run that trained to the end
FINISHED_TYPES = {"global_step": int, "MAX_STEPS": int, "NUM_TRAIN_EPOCHS": float}
BROKEN_DIR = "broken"  # OUTPUT_DIR/broken/checkpoint-N-<time>: checkpoints that cannot be resumed, kept for a look
TORCH_FILES = (".pt", ".pth", ".bin")  # torch.save writes zip archives under these names in a checkpoint
DERIVED = ("dataset_sizes", "segments")  # in the run record, computed from the settings or by `resumed_record`
# what this project reads of adapter_config.json: the base model, the rank for vLLM, the card's LoRA settings
ADAPTER_CONFIG_TYPES = dict(
    base_model_name_or_path=str | None, r=int, lora_alpha=float, target_modules=list[str] | str | None
)


def checkpoint_problem(checkpoint_dir):
    """None when the checkpoint folder can be resumed from, else the reason it cannot (one short phrase)."""
    folder = Path(checkpoint_dir)
    state, reason = read_json(folder / "trainer_state.json")
    if reason:
        return reason
    needed = ("global_step", "max_steps", "train_batch_size")  # what Trainer reads back to resume
    if not isinstance(state, dict) or (missing := [k for k in needed if not isinstance(state.get(k), int)]):
        return f"trainer_state.json lacks {', '.join(missing) if isinstance(state, dict) else 'everything'}"
    reason = read_json(folder / "adapter_config.json")[1] or safetensors_problem(folder / "adapter_model.safetensors")
    return reason or optimizer_problem(folder)


def read_json(path):
    """(the JSON in the file `path`, None), or (None, why it cannot be read)."""
    try:
        return json.loads(path.read_bytes()), None
    except FileNotFoundError:
        return None, f"{path.name} is missing"
    except (OSError, ValueError) as err:  # ValueError: JSONDecodeError, UnicodeDecodeError
        return None, f"{path.name} does not parse ({err})"


def safetensors_problem(path):
    """None when the safetensors file is whole, else the reason (safe_open raises on a cut or padded file)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "np"):
            return None
    except FileNotFoundError:
        return f"{path.name} is missing"
    except (OSError, SafetensorError) as err:
        return f"{path.name} is cut short or damaged ({err})"


def torch_file_problem(path):
    """None when `path` is a whole torch.save zip archive: a cut anywhere loses the central directory at its end."""
    try:
        size = path.stat().st_size
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (OSError, zipfile.BadZipFile) as err:
        return f"{path.name} is not a whole torch file ({err})"
    if not any(m.filename.endswith("data.pkl") for m in members):
        return f"{path.name} is not a torch file (no data.pkl)"
    if any(m.header_offset + m.compress_size > size for m in members):
        return f"{path.name} is cut short"
    return None


def optimizer_problem(folder):
    """The optimizer, scheduler and RNG files beside the adapter, present and whole (DeepSpeed's in `latest`)."""
    states = []
    if (folder / "latest").is_file():
        tag = (folder / "latest").read_text().strip()
        states = list((folder / tag).glob("*.pt")) if tag else []
        if not states:
            return f"the DeepSpeed state folder {tag or '(empty name)'} holds no .pt files"
    elif not (folder / "optimizer.pt").is_file() and not list(folder.glob("optimizer_0*")):  # FSDP: optimizer_0*
        return "optimizer.pt is missing"
    elif not (folder / "scheduler.pt").is_file():
        return "scheduler.pt is missing"
    if not list(folder.glob("rng_state*.pth")):
        return "rng_state.pth is missing"
    for path in sorted(p for p in folder.iterdir() if p.suffix in TORCH_FILES and p.is_file()) + states:
        if reason := torch_file_problem(path) or unsafe_pickle_problem(path):
            return reason
    return None


def unsafe_pickle_problem(path):
    """Why Trainer's torch.load(weights_only=True) would refuse `path` (code off its allow-list), read statically."""
    if path.name == "training_args.bin":  # never loaded on resume
        return None
    import torch
    from transformers.trainer_pt_utils import safe_globals

    with safe_globals():
        unsafe = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    if unsafe:
        return f"{path.name} names code outside torch's safe list ({', '.join(unsafe[:3])}), so it is not loaded"
    return None


def resume_checkpoint(output_dir, s, *, main_process=True, now=time.time):
    """The newest intact checkpoint to resume from (None for a fresh start), refusing an unsafe resume. Broken ones
    are moved aside, not skipped: Trainer's rotation counts every checkpoint-N folder and would delete intact ones."""
    output_dir, resume = Path(output_dir), s["RESUME"]
    names = [p for p in output_dir.glob("checkpoint-*") if checkpoint_step(p) is not None] + [output_dir / BROKEN_DIR]
    if taken := sorted(p.name for p in names if (p.exists() or p.is_symlink()) and not p.is_dir()):
        raise ConfigError(
            f"OUTPUT_DIR {output_dir} holds {', '.join(taken)}: a file of yours where a run keeps checkpoint folders, "
            "which it never overwrites.\nMove it out of OUTPUT_DIR, or give this run a new OUTPUT_DIR."
        )
    found = checkpoint_dirs(output_dir)
    if not resume and (found or (output_dir / FINISHED_NAME).is_file()):
        held = f"{len(found)} checkpoint(s)" if found else "a finished adapter"
        raise ConfigError(
            f"RESUME=False, but OUTPUT_DIR {output_dir} already holds {held} of an earlier run, which this run would "
            "overwrite or rotate away.\nGive this run a new OUTPUT_DIR, move the old one away, or set RESUME=True."
        )
    reasons = {folder: checkpoint_problem(folder) for folder in reversed(found)}  # newest first
    for folder, reason in reasons.items():
        if reason and main_process:  # the other ranks leave it to the main one
            put_aside(folder, reason, output_dir, now)
    chosen = next((folder for folder, reason in reasons.items() if not reason), None)
    if chosen is None:
        return None
    config = json.loads((chosen / "adapter_config.json").read_text())
    # the target modules the run was told, which PEFT saved expanded
    given = files.read_json_object(output_dir / files.SETTINGS_FILE).get("LORA_TARGET_MODULES")
    lora = (s["MODEL_NAME"], s["LORA_R"], s["LORA_ALPHA"], s["LORA_TARGET_MODULES"])
    if problem := adapter_mismatch(config, *lora, trained_with=given):
        raise ConfigError(f"cannot resume {chosen}: {problem}, or give this run a new OUTPUT_DIR.")
    return chosen


def resumed_record(output_dir, record, checkpoint):
    """The run record to write when resuming `checkpoint`, checked against the one its run wrote: a changed setting
    that is not `changeable` is refused, the others are logged and kept in "segments" (from which step, old, new)."""
    if checkpoint is None:
        return record
    path = Path(output_dir) / files.SETTINGS_FILE
    old = _flat(files.read_json_object(path))
    new = _flat(json.loads(json.dumps(files.redact(record), default=str)))  # as write_settings writes it
    keys = [k for k in new if k in old or k.startswith("--")] + [k for k in old if k.startswith("--") and k not in new]
    changed = {k: (old.get(k, "(unset)"), new.get(k, "(unset)")) for k in keys if not _same(k, old.get(k), new.get(k))}
    if refused := [k for k in changed if k not in changeable()]:
        raise ConfigError(
            f"cannot resume {checkpoint}: {_changes(changed, refused)} differ from its run's ({path}), and the "
            "adapter would mix two runs.\nSet them back to resume, or give this run a new OUTPUT_DIR to start over."
        )
    if not changed:
        return record
    log.info("resuming %s with changed settings: %s", checkpoint, _changes(changed, changed))
    segment = {"from_step": checkpoint_step(checkpoint), "changed": {k: list(v) for k, v in changed.items()}}
    return {**record, "segments": [*files.read_json_object(path).get("segments", []), segment]}


def _flat(record):
    """A record with its GRPOConfig fields as "--field" keys beside the settings, without DERIVED ones."""
    fields = record.get("grpo_config") if isinstance(record.get("grpo_config"), dict) else {}
    flat = {k: v for k, v in record.items() if k not in (*DERIVED, "grpo_config")}
    return {**flat, **{f"--{k}": v for k, v in fields.items()}}


def _same(key, old, new):
    """Equal settings; a model by folder name (a Hub id and its local copy), a local dataset by where it is."""
    if key == "MODEL_NAME" and isinstance(old, str) and isinstance(new, str):
        return Path(old).name == Path(new).name
    if key == "DATASET" and isinstance(old, str) and isinstance(new, str) and Path(old).exists():
        return Path(new).exists() and Path(old).resolve() == Path(new).resolve()
    return old == new


def _changes(changed, keys):
    """`KEY old -> new` for each of `keys`, values cut to 100 characters (a prompt may be long)."""

    def cut(value):
        text = json.dumps(value) if not isinstance(value, str) else repr(value)
        return text if len(text) <= 100 else text[:97] + "..."

    return ", ".join(f"{k} {cut(changed[k][0])} -> {cut(changed[k][1])}" for k in keys)


def put_aside(folder, reason, output_dir, now=time.time):
    """Move `folder`, which cannot be resumed for `reason`, to BROKEN_DIR/<name>-<time>, and log why."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now()))
    target, i = output_dir / BROKEN_DIR / f"{folder.name}-{stamp}", 0
    while target.exists():  # two moves in one second get distinct names
        i += 1
        target = output_dir / BROKEN_DIR / f"{folder.name}-{stamp}-{i}"
    target.parent.mkdir(exist_ok=True)
    folder.rename(target)  # same filesystem: atomic, and no bytes copied on a full disk
    log.warning("%s cannot be resumed (%s); moved it to %s", folder, reason, target)


def other_base_model(config, model_name):
    """The base model an adapter_config.json (a dict, or the adapter folder) names, if not `model_name` by name."""
    if not isinstance(config, dict):
        config = files.read_json_object(Path(config) / "adapter_config.json")
    base = config.get("base_model_name_or_path")
    return base if base and Path(base).name != Path(model_name).name else None


def adapter_mismatch(config, model_name, lora_r, lora_alpha, target_modules, trained_with=None):
    """What differs between a saved adapter_config.json and this run's model and LoRA settings, or None. PEFT saves
    "all-linear" expanded, so it is known by dotted paths or by `trained_with`, the run's recorded setting."""
    if base := other_base_model(config, model_name):
        return f"it is an adapter for {base}, and MODEL_NAME is {model_name}: set MODEL_NAME={base}"
    for name, key, now in (("LORA_R", "r", lora_r), ("LORA_ALPHA", "lora_alpha", lora_alpha)):
        if (saved := config.get(key)) is not None and saved != now:
            return f"it was trained with {name}={saved}, and {name} is {now}: set {name}={saved}"
    wanted = [t.strip() for t in target_modules.split(",")] if isinstance(target_modules, str) else target_modules
    wanted = [t for t in wanted if t]
    saved = config.get("target_modules")
    saved = [saved] if isinstance(saved, str) else list(saved or [])
    was = [t.strip() for t in trained_with.split(",")] if isinstance(trained_with, str) else trained_with
    expanded = any("." in t for t in saved) or was == ["all-linear"]  # PEFT's expansion of "all-linear"
    if wanted == ["all-linear"]:
        same = expanded or saved == ["all-linear"]
    else:
        same = {t.rsplit(".", 1)[-1] for t in saved} == {t.rsplit(".", 1)[-1] for t in wanted}
    if not same:
        shown = "all-linear" if expanded else ",".join(saved)
        given = ",".join(wanted)
        return f"it was trained with LORA_TARGET_MODULES={shown}, and it is {given}: set LORA_TARGET_MODULES={shown}"
    return None


def adapter_problem(adapter):
    """Why the adapter folder `adapter` cannot load (config or weights), or None; peft reads an adapter_model.bin."""
    folder = Path(adapter)
    config, reason = read_json(folder / "adapter_config.json")
    if reason is None and not isinstance(config, dict):
        reason = "adapter_config.json is not a JSON object"
    elif reason is None and (wrong := files.type_problem(config, ADAPTER_CONFIG_TYPES)):  # edited by hand
        reason = f"adapter_config.json: {wrong}"
    weights = folder / "adapter_model.safetensors"
    if reason is None and (weights.exists() or not (folder / "adapter_model.bin").is_file()):
        reason = safetensors_problem(weights)
    if reason is None:
        return None
    return (
        f"ADAPTER={adapter}: {reason}.\n"
        "Copy the adapter folder again whole, or point ADAPTER at the run's OUTPUT_DIR or another checkpoint-N in it."
    )


GONE = "A training run deletes its older checkpoints as it saves (SAVE_TOTAL_LIMIT): copy one aside to score it."


def apply_adapter(model, adapter, model_name):
    """The base `model` with the LoRA adapter at `adapter` applied by peft; one message when it does not fit."""
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors import safe_open

    weights = Path(adapter) / "adapter_model.safetensors"
    try:
        loaded = PeftModel.from_pretrained(model, adapter)
        detail = None
    except Exception as err:  # peft's size mismatch or absent target modules is the user's to fix; a bug goes on
        if not is_load_error(err):
            raise
        if not (Path(adapter) / "adapter_config.json").is_file():  # a run's SAVE_TOTAL_LIMIT rotated it away
            raise ConfigError(f"ADAPTER={adapter} was deleted or moved while it loaded.\n{GONE}") from None
        # torch's size mismatch lists one layer a line after its header: quote the header and the first
        detail = " ".join(line.strip() for line in str(err).splitlines()[:2])
    # peft loads with strict=False: the weights of layers the base lacks (a deeper model's adapter) go nowhere
    if detail is None and weights.is_file():  # not an older peft's adapter_model.bin
        with safe_open(weights, "pt") as f:
            unused = sorted(set(f.keys()) - set(get_peft_model_state_dict(loaded)))
        detail = f"{unused[0]}: no such layer in the base model" if unused else None
    if detail:
        raise ConfigError(
            f"ADAPTER={adapter} does not fit MODEL_NAME={model_name} ({detail}): it was trained on another model.\n"
            "Leave MODEL_NAME unset to use the run's base model (run_settings.json), "
            "or give the one it was trained on."
        )
    return loaded


def save_adapter(trainer, output_dir, main_process):
    """`trainer.save_model(output_dir)` on every rank, labelled with its step once whole. The earlier label goes
    first: a save cut short leaves no label, never the earlier step's on new weights."""
    label = Path(output_dir) / files.STEP_FILE
    if main_process:
        label.unlink(missing_ok=True)
    trainer.save_model(output_dir)
    if main_process:
        files.honour_umask(output_dir)
        files.atomic_write(label, json.dumps({"global_step": trainer.state.global_step}) + "\n", durable=True)


def mark_finished(output_dir, global_step, epoch, max_steps, num_train_epochs):
    """Write FINISHED_NAME durably: the main process's last write, after the final adapter."""
    output_dir = Path(output_dir)
    record = dict(global_step=global_step, epoch=epoch, MAX_STEPS=max_steps, NUM_TRAIN_EPOCHS=num_train_epochs)
    record["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    files.atomic_write(output_dir / FINISHED_NAME, json.dumps(record, indent=1), durable=True)
    log.info("saved the adapter and its model card to %s; the run is finished", output_dir)
    return output_dir / FINISHED_NAME


def finished(s):
    """A message when the output folder holds a run that already trained as far as asked, else None."""
    output_dir, max_steps, num_train_epochs = Path(s["OUTPUT_DIR"]), s["MAX_STEPS"], s["NUM_TRAIN_EPOCHS"]
    try:
        done = files.read_json_object(output_dir / FINISHED_NAME, FINISHED_TYPES)
    except ConfigError as err:  # torn or edited by hand: the run is finished again from its newest checkpoint
        log.warning("%s; the run is finished again from its newest checkpoint", str(err).partition(";")[0])
        return None
    step = done.get("global_step")
    # no marker; or the final save was lost after it: resume and save again
    if step is None or safetensors_problem(output_dir / "adapter_model.safetensors"):
        return None
    epochs_done = done.get("MAX_STEPS", 0) <= 0 and done.get("NUM_TRAIN_EPOCHS", 0) >= num_train_epochs
    if not (step >= max_steps if max_steps > 0 else epochs_done):
        return None
    return (
        f"OUTPUT_DIR {output_dir} holds a finished run ({step} steps, adapter saved); nothing to do. To train "
        "further raise MAX_STEPS or NUM_TRAIN_EPOCHS; to start over give a new OUTPUT_DIR."
    )


def reached(checkpoint, max_steps, num_train_epochs):
    """Whether a checkpoint holds the steps asked for (killed before its marker): `restore` finishes it, no step."""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    if max_steps > 0:
        return state["global_step"] >= max_steps
    return state["global_step"] >= state["max_steps"] and state.get("num_train_epochs") == num_train_epochs


def restore(trainer, checkpoint):
    """Put a checkpoint's adapter weights and trainer state into `trainer` without training (see `reached`)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState

    set_peft_model_state_dict(trainer.model, load_file(Path(checkpoint) / "adapter_model.safetensors"))
    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    log.info("%s already holds the last step: the run is finished from it, without training", checkpoint)
