"""Tests of grpo/checkpoints.py: intact checks, put_aside, resume choice, the finished marker, untrusted pickles.

.venv/bin/python -m pytest tests/test_checkpoints.py -q -m "not slow"
"""

import json
import logging
import shutil
import time

import pytest
import torch
from safetensors.torch import save_file

from grpo import checkpoints, files
from grpo.errors import ConfigError
from grpo.settings import TABLE, changeable

LORA = {"base_model_name_or_path": "/models/Qwen3-8B", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}


def write_checkpoint(folder, step, adapter_config=LORA, log_rows=60):
    """A checkpoint-`step` folder laid out as Trainer saves a PEFT model (see tests below for the file list)."""
    folder.mkdir(parents=True)
    state = {"global_step": step, "max_steps": 100, "train_batch_size": 4}  # what Trainer reads back to resume
    state["log_history"] = [{"step": i, "loss": 0.5, "reward": 0.25} for i in range(log_rows)]
    (folder / "trainer_state.json").write_text(json.dumps(state, indent=2))  # > 4,096 bytes with 60 rows
    (folder / "adapter_config.json").write_text(json.dumps(adapter_config))
    save_file({"lora_A": torch.zeros(4, 8), "lora_B": torch.ones(8, 4)}, folder / "adapter_model.safetensors")
    torch.save({"state": {0: {"exp_avg": torch.zeros(64)}}}, folder / "optimizer.pt")
    torch.save({"last_epoch": step}, folder / "scheduler.pt")
    torch.save({"cpu": torch.random.get_rng_state()}, folder / "rng_state.pth")
    torch.save({"learning_rate": 1e-5}, folder / "training_args.bin")
    return folder


def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_whole_checkpoint_is_intact(tmp_path):
    assert checkpoints.checkpoint_problem(write_checkpoint(tmp_path / "checkpoint-2", 2)) is None


# Each fault, and the reason checkpoint_problem() gives. The 4,096-byte cut: what a full disk left.
DAMAGE = {
    "state cut at 4096": (lambda f: cut(f / "trainer_state.json", 4096), "trainer_state.json does not parse"),
    "state missing": (lambda f: (f / "trainer_state.json").unlink(), "trainer_state.json is missing"),
    "state without step": (
        lambda f: (f / "trainer_state.json").write_text('{"epoch": 1.0}'),
        "trainer_state.json lacks global_step, max_steps, train_batch_size",
    ),
    "adapter config cut": (lambda f: cut(f / "adapter_config.json", 20), "adapter_config.json does not parse"),
    "safetensors cut in the data": (
        lambda f: cut(f / "adapter_model.safetensors", (f / "adapter_model.safetensors").stat().st_size - 10),
        "adapter_model.safetensors is cut short or damaged (",
    ),
    "safetensors cut in the header": (
        lambda f: cut(f / "adapter_model.safetensors", 20),
        "adapter_model.safetensors is cut short or damaged (",
    ),
    "safetensors empty": (lambda f: cut(f / "adapter_model.safetensors", 0), "adapter_model.safetensors is cut short"),
    "safetensors missing": (
        lambda f: (f / "adapter_model.safetensors").unlink(),
        "adapter_model.safetensors is missing",
    ),
    "optimizer missing": (lambda f: (f / "optimizer.pt").unlink(), "optimizer.pt is missing"),
    "optimizer cut": (lambda f: cut(f / "optimizer.pt", 500), "optimizer.pt is not a whole torch file"),
    "scheduler missing": (lambda f: (f / "scheduler.pt").unlink(), "scheduler.pt is missing"),
    "rng missing": (lambda f: (f / "rng_state.pth").unlink(), "rng_state.pth is missing"),
    "rng cut": (lambda f: cut(f / "rng_state.pth", 1000), "rng_state.pth is not a whole torch file"),
    "training args cut": (lambda f: cut(f / "training_args.bin", 100), "training_args.bin is not a whole torch file"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_intact_names_each_fault(tmp_path, damage):
    folder = write_checkpoint(tmp_path / "checkpoint-4", 4)
    harm, reason = DAMAGE[damage]
    harm(folder)
    assert checkpoints.checkpoint_problem(folder).startswith(reason)


def test_state_file_is_longer_than_the_cut():
    # the 4,096-byte cut must land inside the JSON, or the test above would test nothing
    assert (
        len(json.dumps({"log_history": [{"step": i, "loss": 0.5, "reward": 0.25} for i in range(60)]}, indent=2))
        > 4096
    )


# the settings resume_checkpoint reads: this run's model and LoRA shape, as the checkpoints below were trained
RESUMING = dict(RESUME=True, MODEL_NAME="Qwen/Qwen3-8B", LORA_R=16, LORA_ALPHA=32, LORA_TARGET_MODULES="q_proj")


def resume(output_dir, main_process=True, **changes):
    """resume_checkpoint with RESUMING's settings and `changes`, at the clock's 0 (1970-01-01 00:00:00 UTC)."""
    s = {**RESUMING, **changes}
    return checkpoints.resume_checkpoint(output_dir, s, main_process=main_process, now=lambda: 0.0)


@pytest.mark.parametrize("damage", ["state cut at 4096", "safetensors cut in the data", "optimizer missing"])
def test_cut_checkpoint_falls_back_to_older_intact_and_is_kept(tmp_path, damage, caplog):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    newest = write_checkpoint(tmp_path / "checkpoint-4", 4)
    DAMAGE[damage][0](newest)
    files = sorted(p.name for p in newest.iterdir())
    with caplog.at_level(logging.WARNING):
        assert resume(tmp_path) == tmp_path / "checkpoint-2"
    moved = tmp_path / "broken" / f"checkpoint-4-{time.strftime('%Y%m%d-%H%M%S', time.localtime(0))}"
    assert not newest.exists()  # out of Trainer's way (rotation, later saves into the same name)
    assert sorted(p.name for p in moved.iterdir()) == files  # moved whole, nothing deleted
    assert f"{newest} cannot be resumed ({DAMAGE[damage][1]}" in caplog.text  # named in the log


def test_only_the_main_process_moves(tmp_path):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    (tmp_path / "checkpoint-4").mkdir()  # a save killed before any file was written
    assert resume(tmp_path, main_process=False) == tmp_path / "checkpoint-2"
    assert (tmp_path / "checkpoint-4").is_dir() and not (tmp_path / "broken").exists()  # the other ranks leave it


def test_every_broken_one_is_moved_and_two_moves_in_one_second_get_two_names(tmp_path):
    for step in (2, 4):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert resume(tmp_path) is None  # nothing intact: a fresh start
    assert sorted(p.name for p in (tmp_path / "broken").iterdir()) == [
        "checkpoint-2-19700101-000000",
        "checkpoint-4-19700101-000000",
    ]
    (tmp_path / "checkpoint-2").mkdir()  # the same name again, moved in the same second
    resume(tmp_path)
    assert (tmp_path / "broken" / "checkpoint-2-19700101-000000-1").is_dir()


def test_broken_older_one_is_moved_newest_intact_is_chosen(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    write_checkpoint(tmp_path / "checkpoint-10", 10)  # sorted by number, not by name ("10" < "2")
    assert resume(tmp_path) == tmp_path / "checkpoint-10"
    assert [p.name for p in (tmp_path / "broken").iterdir()] == ["checkpoint-2-19700101-000000"]


def test_no_checkpoints_is_a_fresh_start(tmp_path):
    assert resume(tmp_path) is None
    assert resume(tmp_path / "not-yet-created") is None


@pytest.mark.parametrize("leftover", ["checkpoint", "marker"])
def test_resume_false_over_an_earlier_run_is_refused(tmp_path, leftover):
    if leftover == "checkpoint":
        (tmp_path / "checkpoint-4").mkdir()  # even a broken one: starting over would rotate the rest away
    else:
        (tmp_path / checkpoints.FINISHED_NAME).write_text("{}")
    held = "1 checkpoint(s)" if leftover == "checkpoint" else "a finished adapter"
    with pytest.raises(ConfigError) as err:
        resume(tmp_path, RESUME=False)
    assert f"RESUME=False, but OUTPUT_DIR {tmp_path} already holds {held} of an earlier run" in str(err.value)
    assert len(str(err.value).splitlines()) == 2  # the two-line promise
    assert (tmp_path / "checkpoint-4").is_dir() or leftover == "marker"  # refused before moving anything


# A change of setting against a checkpoint trained with LORA, and the message's key phrase.
MISMATCH = [
    (dict(MODEL_NAME="Qwen/Qwen3-1.7B"), "it is an adapter for /models/Qwen3-8B, and MODEL_NAME is Qwen/Qwen3-1.7B"),
    (dict(LORA_R=8), "it was trained with LORA_R=16, and LORA_R is 8: set LORA_R=16"),
    (dict(LORA_ALPHA=64), "it was trained with LORA_ALPHA=32, and LORA_ALPHA is 64: set LORA_ALPHA=32"),
    (dict(LORA_TARGET_MODULES="q_proj,v_proj"), "LORA_TARGET_MODULES=q_proj, and it is q_proj,v_proj"),
    (dict(LORA_TARGET_MODULES="all-linear"), "LORA_TARGET_MODULES=q_proj, and it is all-linear"),
]


@pytest.mark.parametrize("change, phrase", MISMATCH)
def test_other_model_or_lora_shape_is_refused_before_weights(tmp_path, change, phrase):
    write_checkpoint(tmp_path / "checkpoint-4", 4)
    with pytest.raises(ConfigError) as err:
        resume(tmp_path, **change)
    assert phrase in str(err.value)
    assert str(err.value).startswith(f"cannot resume {tmp_path / 'checkpoint-4'}: ")
    assert str(err.value).endswith(", or give this run a new OUTPUT_DIR.")


EXPANDED = {**LORA, "target_modules": ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.up_proj"]}


@pytest.mark.parametrize(
    "saved, given, same",
    [
        (EXPANDED, "all-linear", True),  # PEFT saves all-linear expanded to full module paths
        (EXPANDED, "q_proj,up_proj", True),  # the same modules named by hand resume fine
        (EXPANDED, "q_proj", False),
        (LORA, " q_proj ", True),  # spaces tolerated, as build_trainer (settings.lora_targets) reads them
        (LORA, ["q_proj"], True),  # a list works as well as the comma string
        ({**LORA, "base_model_name_or_path": "/local/copy/Qwen3-8B"}, "q_proj", True),  # a Hub id and its local copy
    ],
)
def test_target_modules_compare_by_module_name(tmp_path, saved, given, same):
    write_checkpoint(tmp_path / "checkpoint-4", 4, adapter_config=saved)
    if same:
        assert resume(tmp_path, LORA_TARGET_MODULES=given) == tmp_path / "checkpoint-4"
    else:
        with pytest.raises(ConfigError, match="LORA_TARGET_MODULES=all-linear, and it is q_proj"):
            resume(tmp_path, LORA_TARGET_MODULES=given)


def finish(output_dir, global_step=4, max_steps=4, num_train_epochs=3):
    save_file({"lora_A": torch.zeros(2, 2)}, output_dir / "adapter_model.safetensors")
    return checkpoints.mark_finished(
        output_dir, global_step=global_step, epoch=0.125, max_steps=max_steps, num_train_epochs=num_train_epochs
    )


@pytest.mark.parametrize(
    "done, asked, is_finished",
    [
        ((4, 4, 3), (4, 3), True),  # the same command again
        ((4, 4, 3), (2, 3), True),  # fewer steps than were trained
        ((4, 4, 3), (8, 3), False),  # MAX_STEPS raised: continue
        ((300, -1, 3), (-1, 3), True),  # an epoch-based run, rerun
        ((300, -1, 3), (-1, 5), False),  # NUM_TRAIN_EPOCHS raised: continue
        ((4, 4, 3), (-1, 3), False),  # a step-limited run says nothing about finishing the epochs
        ((300, -1, 3), (200, 3), True),  # a step limit below what the epoch run reached
    ],
)
def test_finished_run_rerun_is_detected(tmp_path, done, asked, is_finished):
    step, max_steps, epochs = done
    finish(tmp_path, global_step=step, max_steps=max_steps, num_train_epochs=epochs)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir())
    max_steps, epochs = asked
    message = checkpoints.finished({"OUTPUT_DIR": str(tmp_path), "MAX_STEPS": max_steps, "NUM_TRAIN_EPOCHS": epochs})
    assert (message is not None) == is_finished
    assert message is None or message.startswith(f"OUTPUT_DIR {tmp_path} holds a finished run ({step} steps")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir()) == before  # touched nothing


def test_marker_is_written_atomically(tmp_path):
    path = finish(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary file left
    assert json.loads(path.read_text())["global_step"] == 4


@pytest.mark.parametrize("fault", ["no marker", "marker cut", "adapter cut", "adapter missing"])
def test_unfinished_or_damaged_final_save_is_not_finished(tmp_path, fault):
    path = finish(tmp_path)
    if fault == "no marker":
        path.unlink()
    elif fault == "marker cut":
        cut(path, 10)
    elif fault == "adapter cut":
        cut(tmp_path / "adapter_model.safetensors", 30)
    else:
        (tmp_path / "adapter_model.safetensors").unlink()
    asked = {"OUTPUT_DIR": tmp_path, "MAX_STEPS": 4, "NUM_TRAIN_EPOCHS": 3}
    assert checkpoints.finished(asked) is None  # the rerun resumes and saves the final adapter again


def test_checkpoint_cut_by_a_full_disk_is_skipped(tmp_path):
    # a full disk mid-save: the optimizer write fails and trainer_state.json is never written (Trainer writes it last)
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    newest = write_checkpoint(tmp_path / "checkpoint-4", 4)
    cut(newest / "optimizer.pt", 4096)
    (newest / "trainer_state.json").unlink()
    assert resume(tmp_path) == tmp_path / "checkpoint-2"
    assert (tmp_path / "broken" / "checkpoint-4-19700101-000000" / "optimizer.pt").stat().st_size == 4096


# peft saves all-linear over 20+ modules (every real model) as short names: the run's record tells it apart
MINIMISED = {**LORA, "target_modules": ["o_proj", "q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]}


@pytest.mark.parametrize("recorded, same", [("all-linear", True), (None, False), ("q_proj", False)])
def test_all_linear_resumes_by_the_runs_recorded_target_modules(tmp_path, recorded, same):
    write_checkpoint(tmp_path / "checkpoint-4", 4, adapter_config=MINIMISED)
    if recorded:
        (tmp_path / "run_settings.json").write_text(json.dumps({"LORA_TARGET_MODULES": recorded}))
    if same:
        assert resume(tmp_path, LORA_TARGET_MODULES="all-linear") == tmp_path / "checkpoint-4"
    else:  # no record (or another one): short names could be a hand-written list, so the user is asked
        with pytest.raises(ConfigError, match="LORA_TARGET_MODULES=o_proj,q_proj,k_proj,v_proj,gate_proj"):
            resume(tmp_path, LORA_TARGET_MODULES="all-linear")


class Payload:
    """What a crafted pickle names: a class torch's weights_only loader refuses."""


def test_an_untrusted_pickle_in_a_checkpoint_names_the_file_and_is_set_aside(tmp_path):
    import torch

    from grpo import checkpoints

    safe, unsafe = tmp_path / "optimizer.pt", tmp_path / "scheduler.pt"
    torch.save({"state": {}, "param_groups": [{"lr": torch.tensor(1.0)}]}, safe)
    torch.save({"last_epoch": Payload()}, unsafe)
    assert checkpoints.unsafe_pickle_problem(safe) is None  # Trainer's own files pass
    assert checkpoints.unsafe_pickle_problem(unsafe) == (
        "scheduler.pt names code outside torch's safe list (test_checkpoints.Payload), so it is not loaded"
    )
    assert "weights_only=False" not in checkpoints.unsafe_pickle_problem(unsafe)  # no advice to turn safety off


@pytest.mark.parametrize("damage", [lambda b: b[:-10], lambda b: b + b"\0" * 10, lambda b: b[:5]])
def test_a_cut_or_padded_safetensors_file_is_named(tmp_path, damage):
    path = tmp_path / "adapter_model.safetensors"
    save_file({"lora_A": torch.zeros(100)}, path)
    assert checkpoints.safetensors_problem(path) is None  # whole
    path.write_bytes(damage(path.read_bytes()))
    assert checkpoints.safetensors_problem(path).startswith("adapter_model.safetensors is cut short or damaged (")


def test_a_missing_safetensors_file_is_named(tmp_path):
    assert checkpoints.safetensors_problem(tmp_path / "model.safetensors") == "model.safetensors is missing"


@pytest.mark.parametrize(
    ("layer", "targets", "named"),
    [
        (0, ["q_proj"], None),  # fits: peft applies it
        (7, ["q_proj"], "layers.7.self_attn.q_proj.lora_A.weight: no such layer"),  # peft would drop it silently
        (0, ["zz_proj"], "zz_proj"),  # peft raises: no such target module
    ],
)
def test_an_adapter_that_does_not_fit_its_base_is_refused_in_one_message(tmp_path, tiny_model, layer, targets, named):
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    config = {"base_model_name_or_path": "smoke-model", "peft_type": "LORA", "r": 2, "lora_alpha": 4}
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "target_modules": targets}))
    prefix = f"base_model.model.model.layers.{layer}.self_attn.q_proj"  # the tiny model has layers 0 and 1
    tensors = {f"{prefix}.lora_A.weight": torch.zeros(2, 32), f"{prefix}.lora_B.weight": torch.zeros(32, 2)}
    save_file(tensors, adapter / "adapter_model.safetensors")
    base = AutoModelForCausalLM.from_pretrained(tiny_model)
    if named is None:
        assert checkpoints.apply_adapter(base, str(adapter), tiny_model).peft_config  # a PeftModel
        return
    with pytest.raises(ConfigError) as err:
        checkpoints.apply_adapter(base, str(adapter), tiny_model)
    assert str(err.value).startswith(f"ADAPTER={adapter} does not fit MODEL_NAME={tiny_model} (")
    assert named in str(err.value) and len(str(err.value).splitlines()) == 2


def test_an_adapter_deleted_while_it_loads_is_named_as_deleted(tmp_path, tiny_model, monkeypatch):
    # a training run's SAVE_TOTAL_LIMIT removes the checkpoint between evaluate.py's checks and peft's load
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "checkpoint-2"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj"]})
    )
    load = PeftModel.from_pretrained

    def deleted_first(model, path, **kwargs):
        shutil.rmtree(path)
        return load(model, path, **kwargs)

    monkeypatch.setattr(PeftModel, "from_pretrained", deleted_first)
    with pytest.raises(ConfigError) as err:
        checkpoints.apply_adapter(AutoModelForCausalLM.from_pretrained(tiny_model), str(adapter), tiny_model)
    assert str(err.value).startswith(f"ADAPTER={adapter} was deleted or moved while it loaded.")
    assert "SAVE_TOTAL_LIMIT" in str(err.value)


@pytest.mark.parametrize("name", ["broken", "checkpoint-6"])
def test_a_users_file_under_a_checkpoint_name_is_refused_naming_it_and_left_alone(tmp_path, name):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    cut(write_checkpoint(tmp_path / "checkpoint-4", 4) / "adapter_model.safetensors", 20)  # would be moved aside
    (tmp_path / name).write_text("my notes")
    with pytest.raises(ConfigError, match=f"holds {name}: a file of yours"):
        resume(tmp_path, MODEL_NAME="/models/Qwen3-8B")
    assert (tmp_path / name).read_text() == "my notes"  # neither moved nor overwritten
    assert (tmp_path / "checkpoint-4").is_dir()  # nothing moved before the refusal


def test_other_files_named_like_checkpoints_are_not_taken(tmp_path):
    write_checkpoint(tmp_path / "checkpoint-2", 2)
    (tmp_path / "checkpoint-2.txt").write_text("notes")  # not a name Trainer writes
    chosen = resume(tmp_path, MODEL_NAME="/models/Qwen3-8B")
    assert chosen == tmp_path / "checkpoint-2"


class Saver:
    """A trainer whose save_model writes the adapter, or is killed (an exception) halfway through it."""

    def __init__(self, step, killed=False):
        self.state, self.killed = type("State", (), {"global_step": step})(), killed

    def save_model(self, folder):
        (folder / "adapter_model.safetensors").write_bytes(b"half" if self.killed else b"whole")
        if self.killed:
            raise KeyboardInterrupt


def test_save_adapter_labels_the_weights_with_their_step_and_a_cut_save_with_none(tmp_path):
    checkpoints.save_adapter(Saver(4), tmp_path, main_process=True)
    assert files.adapter_step(tmp_path) == 4
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_adapter(Saver(8, killed=True), tmp_path, main_process=True)
    assert files.adapter_step(tmp_path) is None  # never step 4 on the half-written step-8 weights
    checkpoints.save_adapter(Saver(8), tmp_path, main_process=True)
    assert files.adapter_step(tmp_path) == 8


def recorded_run(folder, settings, step=4):
    """A run folder as a run leaves it: its run_settings.json (the record grpotrainer.py writes) and checkpoint-N."""
    record = {**settings, "grpo_config": {"top_p": 0.9}, "profile": "smoke", "dataset_sizes": {"train": 32}}
    files.write_settings(folder, {**record, "processes": 1})
    return record, write_checkpoint(folder / f"checkpoint-{step}", step)


PROMPT = "You are a careful math tutor. " + "Solve it. " * 9


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"DATASET": "/data/other.jsonl"}, "DATASET '/data/gsm8k' -> '/data/other.jsonl'"),
        (
            {"REWARD_FUNCS": ["format_reward"]},
            'REWARD_FUNCS ["correctness_reward", "format_reward"] -> ["format_reward"]',
        ),
        ({"NUM_GENERATIONS": 16, "BETA": 0.04}, "NUM_GENERATIONS 8 -> 16, BETA 0.0 -> 0.04"),
        (
            {"SYSTEM_PROMPT": "Answer in French."},
            f"SYSTEM_PROMPT {PROMPT!r:.97}... -> 'Answer in French.'",  # over 100 characters: cut
        ),
        ({"LORA_DROPOUT": 0.1}, "LORA_DROPOUT 0.0 -> 0.1"),
        ({"GRADIENT_ACCUMULATION_STEPS": 4}, "GRADIENT_ACCUMULATION_STEPS 8 -> 4"),
        ({"processes": 2}, "processes 1 -> 2"),  # part of the batch: torchrun --nproc_per_node 2 doubles it
        (
            {"grpo_config": {"top_p": 1.0, "epsilon_high": 0.28}},
            "--top_p 0.9 -> 1.0, --epsilon_high '(unset)' -> 0.28",
        ),
    ],
)
def test_a_resume_that_changes_what_the_run_is_is_refused_naming_each_change(tmp_path, settings, change, named):
    settings = {**settings, "DATASET": "/data/gsm8k", "SYSTEM_PROMPT": PROMPT}
    record, last = recorded_run(tmp_path, settings)
    before = (tmp_path / files.SETTINGS_FILE).read_bytes()
    with pytest.raises(ConfigError, match="new OUTPUT_DIR") as err:
        checkpoints.resumed_record(tmp_path, {**record, **change}, last)
    assert f"cannot resume {last}: {named} differ from its run's" in str(err.value)
    assert (tmp_path / files.SETTINGS_FILE).read_bytes() == before  # the first run's record untouched


def test_a_resume_with_harmless_changes_says_so_and_keeps_the_first_runs_values(tmp_path, settings, caplog):
    record, last = recorded_run(tmp_path, settings)
    again = {**record, "MAX_STEPS": 500, "SAVE_STEPS": 10, "EVAL_STEPS": 0, "REPORT_TO": "none"}
    with caplog.at_level(logging.INFO):
        written = checkpoints.resumed_record(tmp_path, again, last)
    assert caplog.messages == [
        f"resuming {last} with changed settings: MAX_STEPS 250 -> 500, REPORT_TO 'tensorboard' -> 'none', "
        "SAVE_STEPS 50 -> 10, EVAL_STEPS 50 -> 0"
    ]
    assert written["MAX_STEPS"] == 500 and written["segments"] == [
        {
            "from_step": 4,
            "changed": {
                "MAX_STEPS": [250, 500],
                "REPORT_TO": ["tensorboard", "none"],
                "SAVE_STEPS": [50, 10],
                "EVAL_STEPS": [50, 0],
            },
        }
    ]
    files.write_settings(tmp_path, written)  # a second resume appends its own segment after the first
    later = checkpoints.resumed_record(
        tmp_path, {**again, "MAX_STEPS": 600}, write_checkpoint(tmp_path / "checkpoint-9", 9)
    )
    assert [s["from_step"] for s in later["segments"]] == [4, 9]


def test_the_same_model_and_dataset_named_another_way_are_no_change(tmp_path, settings):
    (tmp_path / "data.jsonl").write_text("{}\n")
    record, last = recorded_run(tmp_path / "run", {**settings, "DATASET": str(tmp_path / "data.jsonl")})
    again = {**record, "MODEL_NAME": "/models/Qwen3-8B", "DATASET": str(tmp_path / "run" / ".." / "data.jsonl")}
    assert checkpoints.resumed_record(tmp_path / "run", again, last) == again  # a local copy; the same file


def other_value(value):
    """Another value of the same type as `value`, as a command line could give it."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    return [*value, "other"]  # a list


def test_the_settings_table_decides_what_a_resume_may_change(tmp_path, settings):
    record, last = recorded_run(tmp_path, settings)
    allowed, refused = set(), set()
    for name, value in settings.items():
        try:
            checkpoints.resumed_record(tmp_path, {**record, name: other_value(value)}, last)
            allowed.add(name)
        except ConfigError as err:
            assert f"cannot resume {last}: {name} " in str(err)  # refused naming the one changed setting
            refused.add(name)
    # every constant of grpotrainer.py is one or the other, as grpo/settings.py's resume column says
    assert allowed == changeable() & set(settings) and refused == set(settings) - changeable()
    # the examples the resume policy names: each changes what the adapter is trained on or towards
    assert {
        "MODEL_NAME",
        "LOAD_IN_4BIT",
        "DATASET",
        "SYSTEM_PROMPT",
        "REWARD_FUNCS",
        "NUM_GENERATIONS",
        "BETA",
    } <= refused


def test_a_row_marked_changeable_is_accepted_on_resume(tmp_path, settings, monkeypatch):
    record, last = recorded_run(tmp_path, settings)
    with pytest.raises(ConfigError, match="BETA 0.0 -> 0.04"):
        checkpoints.resumed_record(tmp_path, {**record, "BETA": 0.04}, last)
    # the table's row, not a list kept in checkpoints.py: marked changeable, the same resume goes on
    monkeypatch.setitem(TABLE, "BETA", TABLE["BETA"]._replace(resume=True))
    written = checkpoints.resumed_record(tmp_path, {**record, "BETA": 0.04}, last)
    assert written["segments"] == [{"from_step": 4, "changed": {"BETA": [0.0, 0.04]}}]


def test_a_folder_that_does_not_exist_lacks_its_state():
    assert checkpoints.checkpoint_problem("/nonexistent/checkpoint-5") == "trainer_state.json is missing"


def test_a_hub_id_and_its_local_copy_are_the_same_base():
    assert checkpoints.other_base_model({"base_model_name_or_path": "Qwen/Qwen3-8B"}, "/models/Qwen3-8B") is None


def test_adapter_mismatch_names_the_setting_and_its_trained_value():
    config = {"base_model_name_or_path": "/m/Qwen3-8B", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]}
    assert (
        checkpoints.adapter_mismatch(config, "Qwen/Qwen3-8B", 8, 32, "q_proj")
        == "it was trained with LORA_R=16, and LORA_R is 8: set LORA_R=16"
    )


def test_an_output_folder_that_does_not_exist_holds_no_finished_run():
    assert checkpoints.finished({"OUTPUT_DIR": "/nonexistent", "MAX_STEPS": 100, "NUM_TRAIN_EPOCHS": 3}) is None
