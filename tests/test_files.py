"""grpo/files.py: one rule each for writing aside then renaming, the step an adapter is labelled with, credentials
kept out of every file a run writes; grpo/errors.py and grpo/hub.py: which load errors are the user's to fix, and a
Hub that cannot be used, refused in seconds.

.venv/bin/python -m pytest tests/test_files.py -q
"""

import dataclasses
import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo import checkpoints, errors, files, hub, process

# ---------------------------------------------------------------------------------------------------------------
# the Hub: refused in seconds when it cannot be used


def test_a_hub_id_that_is_not_cached_with_hf_hub_offline_is_refused_naming_the_setting(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    problem = hub.hub_unreachable("nobody-here/no-such-model-xyz", "MODEL_NAME")
    assert problem.startswith("MODEL_NAME=nobody-here/no-such-model-xyz is a Hub id that is not in the local cache")
    assert "HF_HUB_OFFLINE is set" in problem


def test_a_hub_that_does_not_answer_is_refused_with_the_offline_hint(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: refused at once
    problem = hub.hub_unreachable("nobody-here/no-such-data", "DATASET", repo_type="dataset", timeout=2)
    assert problem.startswith(
        "DATASET=nobody-here/no-such-data is a Hub id, but the Hub (127.0.0.1:9) cannot be reached"
    )
    assert "Set HF_HUB_OFFLINE=1 to use only the local cache" in problem


def test_a_local_path_is_never_a_hub_problem(monkeypatch, tmp_path):
    # callers pass any setting: a local path (missing or not) is no Hub id, so the Hub is not asked at all
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_unreachable("./no-such-model", "MODEL_NAME") is None
    assert hub.hub_unreachable(str(tmp_path), "DATASET", repo_type="dataset") is None
    assert hub.id_error("./model") and hub.id_error("Qwen/Qwen3-8B") is None


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "run_finished.json"
    path.write_text("old")
    files.atomic_write(path, "new", durable=True)
    assert path.read_text() == "new"
    assert os.listdir(tmp_path) == ["run_finished.json"]  # the temporary is renamed, never left beside it


def test_atomic_write_deletes_what_a_killed_write_left_aside(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # a writer that has ended: what it left aside is litter
    left = tmp_path / f".run_settings.json.tmp-{socket.gethostname()}-{proc.pid}"
    left.write_text('{"half')
    files.atomic_write(tmp_path / "run_settings.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_settings.json"]


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


def test_a_stop_between_the_renames_of_a_replacing_publish_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "export"
    target.mkdir()
    (target / "model.safetensors").write_text("the earlier export")
    real_rename = Path.rename
    calls = []

    def rename(self, to):
        calls.append(self)
        if len(calls) == 2:  # the new folder's rename into place: SIGTERM lands just before it
            raise process.Interrupted(signal.SIGTERM)
        return real_rename(self, to)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(process.Interrupted), files.publish_dir(target, replace=True) as tmp:
        (tmp / "model.safetensors").write_text("the new export")
    monkeypatch.setattr(Path, "rename", real_rename)
    # the earlier export is whole where it was, and nothing half-written is left beside it
    assert (target / "model.safetensors").read_text() == "the earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


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


# ---------------------------------------------------------------------------------------------------------------
# paths, checkpoint folders and records


def test_expand_paths_expands_a_leading_tilde_of_path_settings_only():
    s = files.expand_paths({"OUTPUT_DIR": "~/x", "MODEL_NAME": "Qwen/Qwen3-8B", "SYSTEM_PROMPT": "~"})
    # the shell leaves `--OUTPUT_DIR=~/x` alone; a prompt is text, not a path
    assert s["OUTPUT_DIR"] == os.path.join(os.path.expanduser("~"), "x")
    assert (s["MODEL_NAME"], s["SYSTEM_PROMPT"]) == ("Qwen/Qwen3-8B", "~")


def test_checkpoint_step_reads_only_trainers_folder_names():
    steps = files.checkpoint_step("runs/a/checkpoint-40"), files.checkpoint_step("runs/a")
    assert (*steps, files.checkpoint_step("checkpoint-4x")) == (40, None, None)


def test_type_problem_names_the_first_value_of_the_wrong_type():
    types = {"LORA_R": int, "BF16": bool, "SEED": int}  # an absent key fits
    assert files.type_problem({"LORA_R": [16], "BF16": True}, types) == "LORA_R is [16], not int"
    # a generic's items are checked too
    problem = files.type_problem({"dataset_sizes": {"train": "7"}}, {"dataset_sizes": dict[str, int]})
    assert problem == 'dataset_sizes is {"train": "7"}, not dict[str, int]'


# ---------------------------------------------------------------------------------------------------------------
# the step an adapter is labelled with


def checkpoint(folder, step):
    """A checkpoint-`step` folder as far as its step goes: Trainer's trainer_state.json."""
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
    return folder


def test_the_final_adapter_keeps_its_own_step_when_checkpoints_move_past_it(tmp_path):
    # a run finished at step 4, resumed with MAX_STEPS=8, stopped by SIGTERM after checkpoint-6, and now writing
    # checkpoint-8 (its trainer_state.json not yet there): the final adapter in OUTPUT_DIR is still step 4's
    (tmp_path / "adapter_model.safetensors").write_bytes(b"step-4 weights")
    (tmp_path / files.STEP_FILE).write_text(json.dumps({"global_step": 4}))
    checkpoint(tmp_path / "checkpoint-4", 4)
    checkpoint(tmp_path / "checkpoint-6", 6)
    (tmp_path / "checkpoint-8").mkdir()
    assert files.adapter_step(tmp_path) == 4
    assert files.adapter_step(tmp_path / "checkpoint-6") == 6  # a checkpoint is labelled by its own state
    assert files.adapter_step(None) == 0  # the base model


def test_a_checkpoint_newer_than_the_final_adapter_is_named(tmp_path):
    # a continuation SIGKILLed after checkpoint-6 left step 4's adapter in OUTPUT_DIR: evaluate.py and export.py say so
    (tmp_path / files.STEP_FILE).write_text(json.dumps({"global_step": 4}))
    assert files.newer_checkpoint(tmp_path, 4) is None  # no checkpoint
    for step in (4, 6):
        (checkpoint(tmp_path / f"checkpoint-{step}", step) / "adapter_config.json").write_text("{}")
    (tmp_path / "checkpoint-8").mkdir()  # being written: no adapter yet
    assert "step 4, but checkpoint-6 there is newer" in files.newer_checkpoint(tmp_path, 4)
    assert files.newer_checkpoint(tmp_path, 6) is None  # the run finished at 6
    assert "not recorded, but checkpoint-6" in files.newer_checkpoint(tmp_path, None)
    assert files.newer_checkpoint(tmp_path / "checkpoint-4", 4) is None  # a checkpoint given by hand is what it is


def test_an_adapter_without_a_label_is_not_given_a_checkpoints_step(tmp_path):
    checkpoint(tmp_path / "checkpoint-6", 6)
    (tmp_path / "adapter_model.safetensors").write_bytes(b"weights of an unknown step")
    assert files.adapter_step(tmp_path) is None


# ---------------------------------------------------------------------------------------------------------------
# credentials: never in a file a run writes

TOKEN = "hf_" + "a1B2" * 8  # the shape of a Hugging Face access token


@pytest.mark.parametrize(
    ("value", "key", "expected"),
    [
        ("abc", "token", files.REDACTED),  # under a key named like a credential: the whole text
        ("abc", "hub_token", files.REDACTED),
        ("abc", "WANDB_API_KEY", files.REDACTED),
        ("abc", "api-key", files.REDACTED),
        ("abc", "tokenizer", "abc"),  # a word that merely contains one is not
        ("", "token", ""),  # nothing to hide
        (f"--token {TOKEN} --x", "args", f"--token {files.REDACTED} --x"),  # a Hub token anywhere in a text
        ("http://user:pw@10.0.0.5:8000", "VLLM_SERVER_BASE_URL", f"http://{files.REDACTED}@10.0.0.5:8000"),
        ("http://10.0.0.5:8000", "VLLM_SERVER_BASE_URL", "http://10.0.0.5:8000"),  # no login, nothing changed
        (["a", TOKEN], "REWARD_FUNCS", ["a", files.REDACTED]),
        ((TOKEN,), "x", (files.REDACTED,)),  # a tuple stays a tuple
        (16, "token", 16),  # only texts hold a credential
    ],
)
def test_redact(value, key, expected):
    assert files.redact(value, key) == expected


def test_a_record_holds_paths_that_work_from_any_folder(tmp_path, monkeypatch):
    # a run trained with relative paths, exported or evaluated from another folder: its record names the same files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "base").mkdir(parents=True)
    s = {"MODEL_NAME": "models/base", "DATASET": "openai/gsm8k", "OUTPUT_DIR": "outputs/run", "SEED": 1}
    (tmp_path / "outputs" / "run").mkdir(parents=True)
    record = files.record(s, {}, profile=None, sizes={"train": 1}, processes=2)
    assert record["MODEL_NAME"] == str(tmp_path / "models" / "base")  # a local folder: absolute
    assert record["OUTPUT_DIR"] == str(tmp_path / "outputs" / "run")
    assert record["DATASET"] == "openai/gsm8k" and record["processes"] == 2  # a Hub id stays one


def test_redact_a_record():
    record = {"model_init_kwargs": {"token": "abc", "revision": "main"}, "url": "http://u:p@host:8000"}
    assert files.redact(record) == {
        "model_init_kwargs": {"token": "<redacted>", "revision": "main"},
        "url": "http://<redacted>@host:8000",
    }


def test_redact_argv_hides_a_credentials_value_in_either_form():
    argv = ["--hub_token", "abc", '--model_init_kwargs={"token": "x"}', "--LR=1"]
    assert files.redact_argv(argv) == [
        "--hub_token",
        "<redacted>",
        '--model_init_kwargs={"token": "<redacted>"}',
        "--LR=1",
    ]


def test_redact_reaches_into_nested_records_and_leaves_the_input_alone():
    record = {"grpo_config": {"model_init_kwargs": {"token": "abc", "revision": "main"}}, "LORA_R": 16}
    clean = files.redact(record)
    assert clean == {"grpo_config": {"model_init_kwargs": {"token": files.REDACTED, "revision": "main"}}, "LORA_R": 16}
    assert record["grpo_config"]["model_init_kwargs"]["token"] == "abc"  # a new record: the run still uses its own


def test_redact_fields_cleans_a_config_in_place():
    @dataclasses.dataclass
    class Config:
        hub_token: str = TOKEN
        output_dir: str = "runs/a"
        model_init_kwargs: dict = dataclasses.field(default_factory=lambda: {"token": "abc", "revision": "main"})

    config = Config()
    files.redact_fields(config)
    assert dataclasses.asdict(config) == {
        "hub_token": files.REDACTED,
        "output_dir": "runs/a",
        "model_init_kwargs": {"token": files.REDACTED, "revision": "main"},
    }


def test_run_settings_hold_no_credential_and_still_resume(tmp_path):
    record = {"LORA_R": 16, "VLLM_SERVER_BASE_URL": "http://u:pw@host:8000", "grpo_config": {"hub_token": TOKEN}}
    files.write_settings(tmp_path, record)
    text = (tmp_path / files.SETTINGS_FILE).read_text()
    assert TOKEN not in text and "pw" not in text  # nothing a shared run folder would leak
    # resuming compares the record as it was written: the same settings resume, and no refusal quotes the token
    assert checkpoints.resumed_record(tmp_path, record, tmp_path / "checkpoint-2") == record
    with pytest.raises(errors.ConfigError) as refused:
        checkpoints.resumed_record(tmp_path, {**record, "LORA_R": 8}, tmp_path / "checkpoint-2")
    assert "LORA_R 16 -> 8" in str(refused.value) and TOKEN not in str(refused.value)
