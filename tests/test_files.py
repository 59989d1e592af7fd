"""grpo/files.py: one rule each for writing aside then renaming, a reward's sys.exit, and which load errors are the
user's to fix.

.venv/bin/python -m pytest tests/test_files.py -q
"""

import errno
import os
import subprocess

import pytest
import torch
from conftest import REPO

from grpo import cli, errors, files


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "run_finished.json"
    path.write_text("old")
    files.atomic_write(path, "new", durable=True)
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["run_finished.json"]  # the temporary is renamed, never left beside it


def test_publish_dir_never_shows_half_a_folder(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError), files.publish_dir(target) as tmp:
        (tmp / "config.json").write_text("{}")
        raise RuntimeError("killed while writing")
    assert os.listdir(tmp_path) == []  # nothing at target, no temporary left
    with files.publish_dir(target) as tmp:
        (tmp / "config.json").write_text("{}")
    assert os.listdir(target) == ["config.json"]


def test_publish_dir_keeps_the_folder_another_process_finished_first(tmp_path):
    target = tmp_path / "model"
    with files.publish_dir(target) as tmp:
        target.mkdir()
        (target / "theirs").write_text("")  # a torchrun rank that got there first
        (tmp / "ours").write_text("")
    assert os.listdir(target) == ["theirs"] and os.listdir(tmp_path) == ["model"]


def test_publish_dir_with_replace_puts_the_old_folder_back_when_the_rename_fails(tmp_path, monkeypatch):
    target = tmp_path / "export"
    target.mkdir()
    (target / "old-weights").write_text("")
    real_rename = os.rename

    def rename(src, dst):  # the new folder cannot be moved into place (EXDEV, a full disk's metadata, ...)
        if ".partial-" in str(src):
            raise OSError(errno.EXDEV, "cross-device link")
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(OSError), files.publish_dir(target, replace=True) as tmp:
        (tmp / "new-weights").write_text("")
    assert os.listdir(target) == ["old-weights"] and os.listdir(tmp_path) == ["export"]


def _raised_in(function_name, error):
    """`error` as raised inside a function of that name (the frame is what is_load_error reads)."""
    namespace = {"__name__": "transformers.modeling_utils"}
    exec(f"def {function_name}(error):\n    raise error\n", namespace)
    try:
        namespace[function_name](error)
    except Exception as raised:
        return raised


def test_load_errors_are_the_users_and_everything_else_is_a_bug():
    from safetensors import SafetensorError

    assert errors.is_load_error(FileNotFoundError("no config.json"))  # a missing folder or file, the Hub (OSError)
    assert errors.is_load_error(SafetensorError("header too small"))  # a cut weights file
    # a size mismatch raised while transformers loads the weights: an incompatible checkpoint
    assert errors.is_load_error(_raised_in("_load_pretrained_model", RuntimeError("size mismatch for q_proj")))
    # the same error types raised anywhere else are bugs, and keep their tracebacks
    assert not errors.is_load_error(_raised_in("forward", RuntimeError("shape '[2, 3]' is invalid")))
    assert not errors.is_load_error(KeyError("missing"))
    assert not errors.is_load_error(_raised_in("from_pretrained", torch.OutOfMemoryError("CUDA out of memory")))


def test_the_slurm_script_reads_the_default_model_from_help():
    # slurm/train.slurm --vllm-server serves grpotrainer's default MODEL_NAME when none is given: its sed must read
    # the --help line as the help prints it
    import grpotrainer

    help_text = cli.help_text(REPO / "grpotrainer.py", cli.constants(grpotrainer))
    script = (REPO / "slurm" / "train.slurm").read_text()
    sed = script.split("grpotrainer.py --help | sed -n '")[1].split("'")[0]
    out = subprocess.run(["sed", "-n", sed], input=help_text, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == grpotrainer.MODEL_NAME
