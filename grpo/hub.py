"""Hub ids and local paths: whether a MODEL_NAME / DATASET / ADAPTER value is a local path, whether the Hub may be
reached (HF_HUB_OFFLINE), and a quick answer when a Hub id can be neither read from the cache nor downloaded.
"""

import os
import socket
from pathlib import Path
from urllib.parse import urlparse


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
