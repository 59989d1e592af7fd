"""The project's errors, the lowest module of the package (it imports no other): `ConfigError` for a mistake the user
can fix, `first_line` to quote a library's error inside one of ours, and `is_load_error`, which tells a checkpoint
that cannot be loaded from a bug by the exception's type and where it was raised, never by its words.
"""

import traceback


class ConfigError(Exception):
    """A problem the user can fix by changing a constant, an override or a file. One message, exit 2."""


def first_line(err):
    """`Type: first line of the message`, at most 200 characters of it: an error quoted inside one of ours."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:200] if text else ''}"


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
    if not isinstance(err, ValueError | RuntimeError) or err.__traceback__ is None:
        return False
    raised = list(traceback.walk_tb(err.__traceback__))[-1][0]  # the frame that raised it is the last one
    for frame, _ in traceback.walk_stack(raised):  # it, then its callers
        module = frame.f_globals.get("__name__", "")
        if module.startswith(("transformers.", "peft.", "safetensors")) and frame.f_code.co_name in _LOADERS:
            return True
    return False
