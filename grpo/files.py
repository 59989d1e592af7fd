"""Files, names and errors, one rule each: `~` in a path setting, local path or Hub id, the Hub's offline switch,
checkpoint folder names, writing aside then renaming, the first line of an error, a note under a traceback, load
errors.

Nothing heavy is imported here: every other module of the package and the scripts use it.
"""

import contextlib
import os
import re
import shutil
import socket
from pathlib import Path

_CHECKPOINT = re.compile(r"checkpoint-([0-9]+)")
SETTINGS_FILE = "run_settings.json"  # in OUTPUT_DIR: what a run was told, read back by evaluate.py and export.py
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


def is_local(name):
    """Whether a MODEL_NAME / DATASET / ADAPTER value names a local path rather than a Hub id.

    >>> is_local("Qwen/Qwen3-8B"), is_local("./Qwen3"), is_local("data/train.jsonl"), is_local("~/m")
    (False, True, True, True)
    """
    name = str(name)
    return (
        Path(name).suffix in (".jsonl", ".json")
        or os.path.exists(os.path.expanduser(name))
        or name.startswith((".", "/", "~"))
    )


def hub_offline():
    """Whether the Hugging Face Hub must not be reached: HF_HUB_OFFLINE as huggingface_hub read it at import, or as
    the environment says now (a test or a launcher may set it later), with huggingface_hub's own true values."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES
    return bool(constants.HF_HUB_OFFLINE or now)


HUB_TIMEOUT = 5  # seconds to reach the Hub before a Hub id is refused (huggingface_hub itself retries for a minute)


def hub_unreachable(repo_id, name, repo_type="model", timeout=HUB_TIMEOUT):
    """Why the Hub id `repo_id` (the setting `name`) cannot be used now, or None: not in the local cache while the
    Hub is offline or its host does not answer a TCP connection within `timeout` seconds. Asked once, before any
    download, so that a machine without the Hub is told so in seconds rather than after huggingface_hub's retries."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = try_to_load_from_cache(
        repo_id, "config.json" if repo_type == "model" else "README.md", repo_type=repo_type
    )
    if isinstance(cached, str) or (repo_type != "model" and _cached_dataset(repo_id)):
        return None
    fix = f"point {name} at a local folder (see README), or run once where the Hub is reachable to fill the cache"
    if hub_offline():
        return f"{name}={repo_id} is a Hub id that is not in the local cache, and HF_HUB_OFFLINE is set: {fix}."
    from urllib.parse import urlparse

    url = urlparse(constants.ENDPOINT)
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as err:
        return (
            f"{name}={repo_id} is a Hub id, but the Hub ({host}:{port}) cannot be reached ({err}).\n"
            f"Set HF_HUB_OFFLINE=1 to use only the local cache, or {fix}."
        )
    return None


def _cached_dataset(repo_id):
    """Whether datasets' cache holds a copy of the Hub dataset `repo_id` (its folder in HF_DATASETS_CACHE)."""
    root = Path(
        os.environ.get("HF_DATASETS_CACHE") or Path(os.environ.get("HF_HOME", "~/.cache/huggingface")) / "datasets"
    )
    return (root.expanduser() / repo_id.replace("/", "___")).is_dir()


def checkpoint_step(path):
    """N for a folder named checkpoint-N (Trainer's name for a checkpoint), else None.

    >>> checkpoint_step("runs/a/checkpoint-40"), checkpoint_step("runs/a"), checkpoint_step("checkpoint-4x")
    (40, None, None)
    """
    match = _CHECKPOINT.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def read_json_object(path):
    """The JSON object in the file `path`; {} when there is no such file. Anything else is refused, naming it."""
    import json

    from grpo.cli import ConfigError

    path = Path(path)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{path} cannot be read ({err}); restore it or delete it.") from None
    if not isinstance(data, dict):  # what later .get() and [key] calls rely on
        raise ConfigError(f"{path} holds a {type(data).__name__}, not a JSON object; restore it or delete it.")
    return data


def first_line(err):
    """`Type: first line of the message`, at most 200 characters of it: an error quoted inside one of ours."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


def exit_as_error(err, note):
    """A RuntimeError for a reward that called sys.exit (which would end the run without a word), with `note`
    under it: raise it `from err`, so that the traceback into the reward is shown too."""
    error = RuntimeError(f"the reward called sys.exit({err.code!r})")
    error.add_note(note)
    return error


class RewardTimeout(BaseException):
    """A reward call that ran past REWARD_TIMEOUT. A BaseException, like KeyboardInterrupt, so that a reward's own
    `except Exception` cannot swallow it and carry on: it ends the run, with the hung line in its traceback."""


@contextlib.contextmanager
def deadline(seconds, entry, where):
    """Raise RewardTimeout inside the block once it has run `seconds` (0 = no limit), naming the REWARD_FUNCS
    `entry` and `where` it was called. A SIGALRM timer, so it interrupts Python code and blocking calls in the
    main thread (where TRL calls plain rewards); elsewhere, and in C code that never returns to Python, it
    cannot, and the block runs unbounded."""
    import signal
    import threading

    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum, frame):
        raise RewardTimeout(
            f"REWARD_FUNCS entry {entry!r} did not return within REWARD_TIMEOUT={seconds:g} s ({where}), so the run "
            "stops.\nFix the reward (the traceback shows the line it was on), or raise REWARD_TIMEOUT (0 = no limit)."
        )

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


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
    aside, then renamed over it; `durable` also fsyncs the file and the directory (for markers a rerun trusts)."""
    path = Path(path)
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


# The functions of transformers' and peft's loading path: a ValueError or RuntimeError raised inside one of them is
# a checkpoint that does not fit (sizes, a torn or foreign file), not a bug of ours.
_LOADERS = {
    "from_pretrained",
    "_load_pretrained_model",
    "load_state_dict",
    "load_shard_file",
    "_load_state_dict_into_meta_model",
    "load_adapter",
    "set_peft_model_state_dict",
    "from_dict",
    "get_checkpoint_shard_files",
    "cached_file",
    "cached_files",
}


def is_load_error(err):
    """Whether `err`, raised while loading a model, means the checkpoint cannot be loaded (a setting or file the
    user can fix): a file or Hub error, safetensors' own, or a ValueError/RuntimeError raised inside the loading
    functions of transformers or peft. Anything else is a bug and should keep its traceback."""
    import torch
    from huggingface_hub.errors import EntryNotFoundError, HFValidationError
    from safetensors import SafetensorError

    if isinstance(err, torch.OutOfMemoryError):  # a RuntimeError, but no fault of the checkpoint's
        return False
    if isinstance(err, OSError | SafetensorError | EntryNotFoundError | HFValidationError):
        return True
    if not isinstance(err, ValueError | RuntimeError):
        return False
    tb = err.__traceback__
    deepest = None
    while tb is not None:  # the frame that raised it is the last one
        deepest = tb.tb_frame
        tb = tb.tb_next
    frame = deepest
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("transformers.", "peft.", "safetensors")) and frame.f_code.co_name in _LOADERS:
            return True
        frame = frame.f_back
    return False
