"""Hub ids and local paths: whether a setting names a local path, whether the Hub may be reached, and a quick
answer when a Hub id can be neither read from the cache nor downloaded."""

import os
import socket
from pathlib import Path
from urllib.parse import urlparse


def is_local(name):
    """Whether a model, dataset or adapter setting names a local path rather than a Hub id.

    >>> is_local("Qwen/Qwen3-8B"), is_local("./Qwen3"), is_local("data/train.jsonl"), is_local("~/m")
    (False, True, True, True)
    """
    name = str(name)
    path_like = name.startswith((".", "/", "~")) or Path(name).suffix in (".jsonl", ".json")
    return path_like or os.path.exists(os.path.expanduser(name))


def id_error(name):
    """huggingface_hub's reason why `name` is no valid Hub id, or None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError as err:
        return err
    return None


def hub_offline():
    """HF_HUB_OFFLINE as huggingface_hub read it at import, or as the environment says now (set later by a test)."""
    from huggingface_hub import constants

    now = os.environ.get("HF_HUB_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES
    return bool(constants.HF_HUB_OFFLINE or now)


def hub_unreachable(repo_id, name, repo_type="model", timeout=5):
    """Why the Hub id `repo_id` (the setting `name`) cannot be used now, or None (also for a local path): not cached,
    and the Hub is offline or does not answer in `timeout` seconds (huggingface_hub would retry for a minute)."""
    from huggingface_hub import constants, try_to_load_from_cache

    filename = "config.json" if repo_type == "model" else "README.md"
    cached = is_local(repo_id) or isinstance(try_to_load_from_cache(repo_id, filename, repo_type=repo_type), str)
    if cached or (repo_type != "model" and _cached_dataset(repo_id)):
        return None
    fix = f"point {name} at a local folder (see README), or run once where the Hub is reachable to fill the cache"
    if hub_offline():
        return f"{name}={repo_id} is a Hub id that is not in the local cache, and HF_HUB_OFFLINE is set: {fix}."
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
    """Whether datasets' own cache (HF_DATASETS_CACHE) holds the Hub dataset `repo_id`."""
    home = Path(os.environ.get("HF_HOME", "~/.cache/huggingface"))
    root = Path(os.environ.get("HF_DATASETS_CACHE") or home / "datasets").expanduser()
    return (root / repo_id.replace("/", "___")).is_dir()
