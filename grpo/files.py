"""The files of a run, one rule each: `~` in a path setting, checkpoint-N folders, the run's record
(run_settings.json), writing aside then renaming (a file or a whole folder), and whether a pid is alive.

Nothing heavy is imported here: every other module of the package and the scripts use it.
"""

import contextlib
import json
import os
import re
import shutil
import socket
from pathlib import Path
from types import GenericAlias, UnionType

from grpo.errors import ConfigError

_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")
SETTINGS_FILE = "run_settings.json"  # in OUTPUT_DIR: what a run was told, read back by evaluate.py and export.py
STEP_FILE = "adapter_step.json"  # in OUTPUT_DIR, beside the final adapter: the step its weights are from
# The settings of every script that name a file or folder: `~` in them means the home folder, as in a shell.
PATH_SETTINGS = ("MODEL_NAME", "DATASET", "OUTPUT_DIR", "ADAPTER")


def expand_paths(settings):
    """`settings` (a new dict) with a leading `~` or `~user` of each path setting expanded, as a shell would.

    The shell leaves `--OUTPUT_DIR=~/x` alone (`~` expands only at the start of a word); transformers and our code
    would then disagree on where `~/x` is. Every script's `cli.parse` applies this once, to defaults and overrides.

    >>> s = expand_paths({"OUTPUT_DIR": "~/x", "MODEL_NAME": "Qwen/Qwen3-8B", "SYSTEM_PROMPT": "~"})
    >>> s["OUTPUT_DIR"] == os.path.join(os.path.expanduser("~"), "x"), s["MODEL_NAME"], s["SYSTEM_PROMPT"]
    (True, 'Qwen/Qwen3-8B', '~')
    """
    out = dict(settings)
    for key in PATH_SETTINGS:
        if isinstance(out.get(key), str) and out[key].startswith("~"):
            out[key] = os.path.expanduser(out[key])
    return out


def checkpoint_step(path):
    """N for a folder named checkpoint-N (Trainer's name for a checkpoint), else None.

    >>> checkpoint_step("runs/a/checkpoint-40"), checkpoint_step("runs/a"), checkpoint_step("checkpoint-4x")
    (40, None, None)
    """
    match = _CHECKPOINT.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def checkpoint_dirs(output_dir):
    """The checkpoint-N folders Trainer wrote in output_dir, oldest (lowest N) first, intact or not."""
    found = [p for p in Path(output_dir).glob("checkpoint-*") if p.is_dir() and checkpoint_step(p) is not None]
    return sorted(found, key=checkpoint_step)


def read_json_object(path, types=None):
    """The JSON object in the file `path`; {} when there is no such file. Anything else is refused, naming it, and
    so is a value of another type than `types` gives for its key (`type_problem`): a record edited by hand."""

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
    """The first key of `record` whose value is not of its type in `types`, said in words; None if all fit. A type
    may be a union (`str | None`) or `list[str]` / `dict[str, int]`, whose items are checked too. Absent keys fit;
    an int fits float; a bool (JSON true) fits only bool.
    >>> type_problem({"LORA_R": [16], "BF16": True}, {"LORA_R": int, "BF16": bool, "SEED": int})
    'LORA_R is [16], not int'
    >>> type_problem({"dataset_sizes": {"train": "7"}}, {"dataset_sizes": dict[str, int]})
    'dataset_sizes is {"train": "7"}, not dict[str, int]'
    """
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
    path = Path(path)
    return path.parent / f".{path.name}.{kind}-{socket.gethostname()}-{os.getpid()}"


def fsync_dir(path):
    """Make a rename inside `path` durable (POSIX: the directory entry lives in the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path, text, durable=False):
    """Write `text` to `path` so that a reader sees the old file or the new one, never half of either: written
    aside, then renamed over it; `durable` also fsyncs the file and the directory (for markers a rerun trusts).
    What a killed earlier write of this host left aside is deleted first."""
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
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    if durable:
        fsync_dir(path.parent)
    return path


def pid_alive(pid):
    """Whether a process with this pid runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, as another user
        return True
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
    """Fill a hidden sibling folder in the block, then rename it to `target`: never half a folder at `target`.

    Without `replace`, a `target` that another process (a torchrun rank) finished first is kept and ours dropped.
    With it, an existing `target` is renamed aside, the new one renamed in, and the old one deleted; if that second
    rename fails or is interrupted, the old one is renamed back. A block that raises leaves `target` as it was.
    Siblings left by a killed earlier call on this host are cleaned up first, and an old `target` that a kill
    left aside between the two renames is put back, so `target` is never lost."""
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
            except BaseException:  # KeyboardInterrupt too: the earlier folder comes back
                old.rename(target)
                raise
        else:
            try:
                tmp.rename(target)
            except OSError:
                if not target.exists():
                    raise  # not another process's finished folder: a real failure
    finally:
        if old.exists() and not target.exists():  # a failed rename, or a stop between the two: the old one back
            old.rename(target)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------------
# The record of a run: its settings, written by grpotrainer.py and read back by evaluate.py and export.py


def record(s, fields, profile, sizes, processes=1):
    """What a run records of itself (run_settings.json, the card, evaluations' settings): its settings with local
    paths made absolute (so that evaluate.py and export.py find them from any folder), the command line's GRPOConfig
    fields, the profile, the data's sizes and the number of processes, which the batch counts (a resume with
    another is refused like any other change of what the run is)."""
    paths = {key: os.path.abspath(s[key]) for key in PATH_SETTINGS if key in s and _is_path(s[key])}
    return {**s, **paths, "grpo_config": fields, "profile": profile, "dataset_sizes": sizes, "processes": processes}


def _is_path(value):
    return isinstance(value, str) and bool(value) and os.path.exists(os.path.expanduser(value))


def honour_umask(folder):
    """Give the files under `folder` that a library wrote private (safetensors writes 0600) the mode the user's
    umask allows, as any other file of theirs gets: colleagues on a shared machine can read the adapter."""
    mask = os.umask(0)
    os.umask(mask)
    for path in Path(folder).rglob("*.safetensors"):
        if path.is_file() and not path.is_symlink() and path.stat().st_mode & 0o777 != 0o666 & ~mask:
            path.chmod(0o666 & ~mask)


def unshare(output_dir):
    """Give every file under OUTPUT_DIR that another name shares (a `cp -al` or `rsync --link-dest` backup) a copy
    of its own, so that what transformers and peft rewrite in place (README.md, adapter_config.json,
    training_args.bin, the weights) changes this run's files and never the backup's."""
    for path in Path(output_dir).rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_nlink > 1:
            copy = _aside(path, "tmp")
            shutil.copy2(path, copy)
            os.replace(copy, path)


def write_settings(output_dir, settings, main_process=True):
    """Write the resolved settings of a run, without credentials (`redact`), to OUTPUT_DIR/run_settings.json
    (atomically, by the main process of a torchrun job only); return the path."""
    path = Path(output_dir) / SETTINGS_FILE
    if not main_process:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, json.dumps(redact(settings), indent=2, default=str) + "\n")


# ---------------------------------------------------------------------------------------------------------------
# Credentials: never in a file a run, evaluation or export writes, nor in a tracker

SECRET_KEY = re.compile(r"(^|[_-])(token|secret|password|passwd|api[_-]?key|authorization|credentials?)$", re.I)
HF_TOKEN = re.compile(r"\bhf_[A-Za-z0-9]{20,}")  # a Hugging Face access token, wherever it appears in a text
URL_LOGIN = re.compile(r"([a-z][a-z0-9+.-]*://)[^/\s@]+@", re.I)  # the user:password@ of a URL
REDACTED = "<redacted>"


def redact(value, key=""):
    """`value` (a record, a list, a text) with every credential replaced by REDACTED: the text under a key named
    like one (token, secret, password, api_key, authorization), a Hugging Face token anywhere in a text, and the
    user and password of a URL.

    >>> redact({"model_init_kwargs": {"token": "abc", "revision": "main"}, "url": "http://u:p@host:8000"})
    {'model_init_kwargs': {'token': '<redacted>', 'revision': 'main'}, 'url': 'http://<redacted>@host:8000'}
    """
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
    """The command line `argv` without credentials (`redact`), for what records it: W&B keeps it in its metadata.

    >>> redact_argv(["--hub_token", "abc", '--model_init_kwargs={"token": "x"}', "--LR=1"])
    ['--hub_token', '<redacted>', '--model_init_kwargs={"token": "<redacted>"}', '--LR=1']
    """
    out = []
    for i, arg in enumerate(argv):
        key, sep, value = arg.removeprefix("--").partition("=")
        if i and not sep and SECRET_KEY.search(argv[i - 1].removeprefix("--")) and "=" not in argv[i - 1]:
            out.append(REDACTED)  # the value of `--hub_token abc`
            continue
        try:
            parsed = json.loads(value) if value.startswith("{") else None
        except ValueError:
            parsed = None
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
    """The settings a run recorded, for an adapter folder (a run's OUTPUT_DIR or a checkpoint-N in it); {} if none.
    `types`: those of the settings the caller reads (`read_json_object`)."""
    for folder in (Path(adapter), Path(adapter).parent):
        if (folder / SETTINGS_FILE).is_file():
            return read_json_object(folder / SETTINGS_FILE, types)
    return {}


def adapter_step(adapter):
    """The training step an adapter's weights are from: a checkpoint-N's own trainer_state.json, or the label a
    run's final save wrote beside its adapter (`checkpoints.save_adapter`); 0 for no adapter (the base model), None
    when not recorded (another tool's adapter, or a final save cut short). Never the newest checkpoint's step, which
    a run resumed past the final adapter (or saving a checkpoint now) has moved on from."""
    if not adapter:
        return 0
    for name in ("trainer_state.json", STEP_FILE):
        step = read_json_object(Path(adapter) / name, {"global_step": int}).get("global_step")
        if step is not None:
            return step
    return None
