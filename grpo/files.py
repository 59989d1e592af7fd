"""The files of a run: `~` in paths, checkpoint-N folders, the run's record, atomic writes, credentials kept out."""

import contextlib
import json
import os
import re
import shutil
import socket
from pathlib import Path
from types import GenericAlias, UnionType

from grpo.errors import ConfigError
from grpo.settings import TABLE

_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")
SETTINGS_FILE = "run_settings.json"  # what a run was told, read back by evaluate.py and export.py
STEP_FILE = "adapter_step.json"  # beside the final adapter: the step its weights are from
PATH_SETTINGS = [name for name, row in TABLE.items() if row.path]  # the settings naming a file or folder


def expand_paths(settings):
    """`settings` (a new dict) with a leading `~` of each path expanded, which a shell leaves in `--NAME=~/x`."""
    paths = {key: os.path.expanduser(settings[key]) for key in PATH_SETTINGS if isinstance(settings.get(key), str)}
    return {**settings, **paths}


def checkpoint_step(path):
    """N for a folder named checkpoint-N (Trainer's name for a checkpoint), else None."""
    match = _CHECKPOINT.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def checkpoint_dirs(output_dir):
    """The checkpoint-N folders Trainer wrote in output_dir, oldest (lowest N) first, intact or not."""
    found = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def adapter_checkpoints(output_dir):
    """checkpoint_dirs that hold an adapter (adapter_config.json), oldest first."""
    return [c for c in checkpoint_dirs(output_dir) if (c / "adapter_config.json").is_file()]


def read_json_object(path, types=None):
    """The JSON object in `path` ({} when absent); anything else, or a value not of its `types`, is a ConfigError."""
    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} cannot be read ({err}); restore it or delete it.") from None
    if not isinstance(data, dict):  # what later .get() and [key] calls rely on
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a JSON object; restore it or delete it.")
    if types and (problem := type_problem(data, types)):
        raise ConfigError(f"{path}: {problem}; correct it or restore the file.")
    return data


def type_problem(record, types):
    """The first key of `record` whose value is not its type in `types`, in words, or None; an int fits float."""
    for key, want in types.items():
        if key in record and not _fits(record[key], want):
            shown = json.dumps(record[key], default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return f"{key} is {shown}, not {want.__name__ if isinstance(want, type) else want}"
    return None


def _fits(value, want):
    if isinstance(want, UnionType):
        return any(_fits(value, option) for option in want.__args__)
    if isinstance(want, GenericAlias):  # list[str], dict[str, int]: the container, then each item
        items = value.values() if isinstance(value, dict) else value
        return isinstance(value, want.__origin__) and all(_fits(item, want.__args__[-1]) for item in items)
    if isinstance(value, bool):
        return want is bool
    return isinstance(value, want) or (want is float and isinstance(value, int))


def _aside(path, kind):
    """A hidden sibling of `path` for work in progress; host and pid, since nodes may share the file system."""
    return path.parent / f".{path.name}.{kind}-{socket.gethostname()}-{os.getpid()}"


def atomic_write(path, text, durable=False):
    """Write `text` aside, then rename it over `path`: never half a file. `durable` fsyncs the file and folder too."""
    path = Path(path)
    for _, stale in _stale(path):
        stale.unlink(missing_ok=True)
    tmp = _aside(path, "tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if durable:
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def pid_alive(pid):
    """Whether a process with this pid runs on this machine."""
    try:
        os.kill(pid, 0)
    except OSError as err:  # PermissionError: it exists, as another user
        return not isinstance(err, ProcessLookupError)
    return True


def _stale(target):
    """(kind, path) of the hidden siblings of `target` (see `_aside`) left by a process of this host that is gone."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|partial|old)-(.+)-([0-9]+)")
    for path in target.parent.glob(f".{target.name}.*"):
        match = pattern.fullmatch(path.name)
        if match and match.group(2) == socket.gethostname() and not pid_alive(int(match.group(3))):
            yield match.group(1), path


@contextlib.contextmanager
def publish_dir(target, replace=False):
    """Fill a hidden sibling folder in the block, then rename it to `target`: never half a folder there. Without
    `replace`, a `target` another process (a torchrun rank) finished first is kept; with it, the old `target` is
    renamed aside and comes back if the new one's rename fails or is cut (by a kill too: put back next time)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    for kind, path in _stale(target):
        if kind == "old" and not target.exists():
            path.rename(target)
        else:
            shutil.rmtree(path, ignore_errors=True)
    tmp, old = _aside(target, "partial"), _aside(target, "old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if replace and target.exists():
            target.rename(old)
        try:
            tmp.rename(target)
        except OSError:
            if old.exists() or not target.exists():
                raise  # not another process's finished folder: a real failure
    finally:
        if old.exists() and not target.exists():  # a failed rename, or a stop between the two: the old one back
            old.rename(target)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def record(s, fields, profile, sizes, processes=1):
    """A run's record: its settings (local paths made absolute), GRPOConfig fields, profile, data sizes, processes."""
    paths = {key: s[key] for key in PATH_SETTINGS if isinstance(s.get(key), str)}
    paths = {key: os.path.abspath(path) for key, path in paths.items() if os.path.exists(os.path.expanduser(path))}
    return {**s, **paths, "grpo_config": fields, "profile": profile, "dataset_sizes": sizes, "processes": processes}


def honour_umask(folder):
    """Give the weights under `folder` (safetensors writes them 0600) the mode the user's umask allows."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).rglob("*.safetensors"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != 0o666 & ~mask:
            path.chmod(0o666 & ~mask)


def unshare(output_dir):
    """Give each hard-linked file under `output_dir` (a `cp -al` backup) its own copy: peft rewrites files in place."""
    for path in Path(output_dir).rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1:
            copy = _aside(path, "tmp")
            shutil.copy2(path, copy)
            os.replace(copy, path)


def write_settings(output_dir, settings, main_process=True):
    """Write a run's settings, without credentials, to `output_dir`/run_settings.json."""
    if main_process:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        atomic_write(Path(output_dir) / SETTINGS_FILE, json.dumps(redact(settings), indent=2, default=str) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Credentials: never in a file a run, evaluation or export writes, nor in a tracker

SECRET_KEY = re.compile(r"(^|[_-])(token|secret|password|passwd|api[_-]?key|authorization|credentials?)$", re.I)
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}")  # a Hugging Face access token, wherever it appears in a text
URL_LOGIN = re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.I)  # the user:password@ of a URL
REDACTED = "<redacted>"


def redact(value, key=""):
    """`value` (a record, list or text) with every credential replaced: a secret key's text, HF tokens, URL logins."""
    if isinstance(value, dict):
        return {k: redact(v, k) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(redact(item) for item in value)
    if isinstance(value, str):
        if value and isinstance(key, str) and SECRET_KEY.search(key):
            return REDACTED
        return URL_LOGIN.sub(rf"\1{REDACTED}@", HF_TOKEN.sub(REDACTED, value))
    return value


def redact_argv(argv):
    """The command line `argv` without credentials, for what records it (W&B)."""
    out = []
    for i, arg in enumerate(argv):
        key, sep, value = arg.removeprefix("--").partition("=")
        if i and not sep and SECRET_KEY.search(argv[i - 1].removeprefix("--")) and "=" not in argv[i - 1]:
            out.append(REDACTED)  # the value of `--hub_token abc`
            continue
        parsed = None
        with contextlib.suppress(ValueError):  # not JSON: a text
            parsed = json.loads(value) if value.startswith("{") else None
        value = json.dumps(redact(parsed)) if isinstance(parsed, dict) else redact(value, key)
        out.append(f"--{key}={value}" if sep else redact(arg))
    return out


def redact_fields(config):
    """Redact, in place, every field of a dataclass (a GRPOConfig) that holds a credential (`redact`)."""
    for name in config.__dataclass_fields__:
        value = getattr(config, name, None)
        if isinstance(value, str | dict | list | tuple) and (clean := redact(value, name)) != value:
            setattr(config, name, clean)


def run_settings(adapter, types=None):
    """The settings a run recorded, for its output folder or a checkpoint-N in it; {} if none."""
    found = [f / SETTINGS_FILE for f in (Path(adapter), Path(adapter).parent) if (f / SETTINGS_FILE).is_file()]
    return read_json_object(found[0], types) if found else {}


def newer_checkpoint(adapter, step):
    """A line when the run folder `adapter` (adapter from `step`) holds a newer checkpoint: a continuation that was
    stopped before its final save (SIGKILL, a node lost), whose final adapter is still the older one; else None."""
    newer = adapter_checkpoints(adapter)
    if checkpoint_step(adapter) is not None or not newer or (step is not None and checkpoint_step(newer[-1]) <= step):
        return None
    known = f"the adapter of step {step}" if step is not None else "an adapter whose step is not recorded"
    return (
        f"ADAPTER={adapter} holds {known}, but {newer[-1].name} there is newer: a continuation stopped before its "
        f"final save. This uses the older adapter; rerun training to finish, or set ADAPTER={newer[-1]}."
    )


def adapter_step(adapter):
    """The training step an adapter's weights are from: a checkpoint's trainer_state.json, or the label a final save
    wrote beside it; 0 for no adapter (the base), None when not recorded. Never the newest checkpoint's step."""
    if not adapter:
        return 0
    for name in ("trainer_state.json", STEP_FILE):
        step = read_json_object(Path(adapter) / name, {"global_step": int}).get("global_step")
        if step is not None:
            return step
    return None
