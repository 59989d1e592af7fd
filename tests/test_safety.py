"""Issue 23, security and data loss: a user's folder is never trained into, `~` means the home folder everywhere,
a run's files never switch on remote code, no pass-through field switches off checkpoints, a hung reward ends the
run, an export never loses its folder, an untrusted pickle is set aside, and a two-process CPU run resumes.

    python -m pytest tests/test_safety.py -q -m "not slow"     # in-process, seconds
    python -m pytest tests/test_safety.py -q -m slow           # the tilde and torchrun runs end to end
"""

import json
import logging
import os
import signal
import socket
import time

import pytest
from conftest import REPO, run_in_process, run_script

import evaluate
import export
import grpotrainer
import rewards
from grpo import cli, files, gsm8k, preflight, reward_guard
from grpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# 1. a folder holding files no run wrote


def run_into(folder, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return run_in_process(grpotrainer.main, "--smoke", f"--OUTPUT_DIR={folder}", capsys=capsys)


@pytest.mark.parametrize(
    "names", [["README.md", "tokenizer.json"], ["notes.txt"], ["checkpoint-2/"], [".git/"], ["smoke-model", "x.py"]]
)
def test_a_folder_with_the_users_files_is_refused_and_left_alone(tmp_path, capsys, monkeypatch, names):
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in names:  # a name ending in / is a folder
        (folder / name).mkdir() if name.endswith("/") else (folder / name).write_text("the user's")
    before = sorted(p.name for p in folder.iterdir())
    code, err = run_into(folder, capsys, monkeypatch)
    assert code == 2 and f"OUTPUT_DIR={folder} holds files no training run wrote" in err  # refused, naming it
    assert "Traceback" not in err
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing written, nothing replaced


@pytest.mark.parametrize("where", ["cwd", "checkout", "checkout parent", "home", "/"])
def test_the_current_folder_the_checkout_and_home_are_refused(tmp_path, capsys, monkeypatch, where):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    folder = {"cwd": ".", "checkout": REPO, "checkout parent": REPO.parent, "home": "~", "/": "/"}[where]
    code, err = run_into(folder, capsys, monkeypatch)
    assert code == 2 and "a run writes README.md, tokenizer and adapter files there" in err
    assert "OUTPUT_DIR=" in err


def test_a_runs_own_folder_is_accepted(tmp_path, smoke_settings):
    # missing, empty, the profile's model only, a run's settings, a killed run's lock: each is a run's own
    empty = tmp_path / "empty"
    empty.mkdir()
    profile = tmp_path / "profile"
    (profile / "smoke-model").mkdir(parents=True)
    (profile / "demo-sums-seed0").mkdir()
    (profile / "demo-sums-model-seed0.sft123").mkdir()
    ran = tmp_path / "ran"
    files.write_settings(ran, {**smoke_settings, "grpo_config": {}})
    (ran / "README.md").write_text("our card")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "run.lock").write_text("")  # filelock's file, and the holder beside it, as a killed run leaves them
    (locked / "run.lock.json").write_text(json.dumps({"pid": 1, "host": "h"}))
    for folder in (tmp_path / "missing", empty, profile, ran, locked):
        assert preflight.run_folder_problem(folder) is None, folder
    (empty / "run_settings.json").write_text('{"something": "else"}')  # a file of that name, not ours
    assert "holds files no training run wrote (run_settings.json)" in preflight.run_folder_problem(empty)


# ---------------------------------------------------------------------------------------------------------------
# 2. `~` in every path setting of every script


@pytest.mark.parametrize("script", [grpotrainer, evaluate, export])
def test_tilde_is_the_home_folder_in_every_path_setting(script, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    names = [n for n in files.PATH_SETTINGS if n in cli.constants(script)]
    args = cli.parse(cli.constants(script), [f"--{name}=~/{name.lower()}" for name in names])
    # the shell leaves ~ alone after "="; every script reads the same folder transformers would
    assert {n: args.settings[n] for n in names} == {n: str(tmp_path / n.lower()) for n in names}
    assert len(names) >= 3  # MODEL_NAME, DATASET/ADAPTER, OUTPUT_DIR at least


@pytest.mark.slow
def test_a_tilde_output_dir_resumes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    first = run_script("grpotrainer.py", "--smoke", "--OUTPUT_DIR=~/x", "--MAX_STEPS=2", env={"HOME": str(home)})
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_script("grpotrainer.py", "--smoke", "--OUTPUT_DIR=~/x", "--MAX_STEPS=4", env={"HOME": str(home)})
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from {home / 'x' / 'checkpoint-2'}" in again.stderr  # the rerun found the first part
    assert not (REPO / "~").exists() and sorted(p.name for p in home.iterdir()) == ["x"]  # one folder, not two
    assert json.loads((home / "x" / "run_finished.json").read_text())["global_step"] == 4


# ---------------------------------------------------------------------------------------------------------------
# 3. a run's files never switch on remote code


def evil_model(folder, marker):
    """The tiny model folder, whose config and tokenizer point (auto_map) at its own evil.py, which writes `marker`."""
    from grpo import profiles

    profiles.ensure_model_dir(folder)
    (folder / "evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import Qwen3Config, Qwen3ForCausalLM, PreTrainedTokenizerFast\n"
        # subclasses: transformers marks a remote class as such, which must not touch its own Qwen3 classes
        "class C(Qwen3Config):\n    pass\n"
        "class M(Qwen3ForCausalLM):\n    config_class = C\n"
        "class T(PreTrainedTokenizerFast):\n    pass\n"
    )
    for name, auto_map in (
        ("config.json", {"AutoConfig": "evil.C", "AutoModelForCausalLM": "evil.M"}),
        ("tokenizer_config.json", {"AutoTokenizer": [None, "evil.T"]}),
    ):
        data = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**data, "auto_map": auto_map}))
    return folder


def test_a_run_folder_cannot_switch_on_remote_code(tmp_path):
    from test_evaluate import save_adapter

    marker = tmp_path / "ran.txt"
    base = evil_model(tmp_path / "models" / "smoke-model", marker)
    run = save_adapter(tmp_path / "run")
    sent = {"MODEL_NAME": str(base), "TRUST_REMOTE_CODE": True, "ATTN_IMPLEMENTATION": "someone/kernel"}
    (run / "run_settings.json").write_text(json.dumps(sent))
    s, _ = evaluate.resolve(["--smoke", f"--ADAPTER={run}"])
    assert (s["MODEL_NAME"], s["TRUST_REMOTE_CODE"], s["ATTN_IMPLEMENTATION"]) == (str(base), False, "auto")
    evaluate.load_model(s, cpu_only=True)
    assert not marker.exists()  # the folder's Python never ran
    export.main([f"--ADAPTER={run}", f"--OUTPUT_DIR={tmp_path / 'merged'}"])
    assert not marker.exists()  # nor when exported
    evaluate.load_model({**s, "TRUST_REMOTE_CODE": True}, cpu_only=True)
    assert marker.read_text() == "ran"  # the user's own switch does run it: the test above could fail


# ---------------------------------------------------------------------------------------------------------------
# 4. pass-through fields that would switch off checkpoints or override a constant


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"save_strategy": "no"}, "--save_strategy=no: this script saves a checkpoint every SAVE_STEPS"),
        ({"save_strategy": "epoch"}, "--save_strategy=epoch: this script saves a checkpoint every SAVE_STEPS"),
        ({"save_only_model": True}, "--save_only_model=true: a checkpoint without the optimizer"),
        ({"generation_kwargs": {"max_new_tokens": 9}}, "sets max_new_tokens, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"max_length": 9}}, "sets max_length, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"min_new_tokens": 9}}, "sets min_new_tokens, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"max_tokens": 9}}, "sets max_tokens, which is set by MAX_COMPLETION_LENGTH"),
        ({"generation_kwargs": {"temperature": 0.1}}, "sets temperature, which is set by TEMPERATURE"),
        ({"generation_kwargs": {"do_sample": False}}, "sets do_sample, which is set by GRPO itself"),
        (
            {"generation_kwargs": {"num_return_sequences": 2}},
            "sets num_return_sequences, which is set by NUM_GENERATIONS",
        ),
    ],
)
def test_fields_that_switch_off_saving_or_override_a_constant_are_refused(smoke_settings, fields, message):
    config = grpotrainer.build_config(smoke_settings, fields, cpu_only=True)
    with pytest.raises(ConfigError) as err:
        preflight.check_config(config, smoke_settings, 32)
    assert message in str(err.value)  # refused before the first step, naming the owner and why


def test_generation_kwargs_a_constant_does_not_own_pass(smoke_settings):
    config = grpotrainer.build_config(smoke_settings, {"generation_kwargs": {"no_repeat_ngram_size": 3}}, True)
    preflight.check_config(config, smoke_settings, 32)  # no exception: TRL passes it to generate()


# ---------------------------------------------------------------------------------------------------------------
# 5. a hung reward, signals during it, exports cut short, untrusted pickles


def hung_reward(completions, **kwargs):
    try:
        while True:
            time.sleep(0.01)
    except Exception:  # a reward that swallows errors must not swallow the timeout
        return [0.0] * len(completions)


def test_a_hung_reward_ends_the_run_naming_it():
    [guarded] = reward_guard.load(["test_safety:hung_reward"], rewards.REWARDS, max_completion_length=32, timeout=0.2)
    start = time.monotonic()
    with pytest.raises(reward_guard.RewardTimeout) as err:
        guarded(completions=["x"], trainer_state=type("S", (), {"global_step": 7})())
    message = str(err.value)
    assert "REWARD_FUNCS entry 'test_safety:hung_reward' did not return within REWARD_TIMEOUT=0.2 s" in message
    assert "at training step 7" in message
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # the timer is off again
    assert time.monotonic() - start < 60  # (a bound, not a timing claim: it did not hang)


def test_preflight_bounds_a_hung_reward_too(smoke_settings):
    funcs = reward_guard.load(["test_safety:hung_reward"], rewards.REWARDS, max_completion_length=32, timeout=0.2)
    dataset = gsm8k.load(smoke_settings["DATASET"], "train", limit=3)
    with pytest.raises(reward_guard.RewardTimeout, match="at training step 0"):
        preflight.check_rewards(funcs, ["test_safety:hung_reward"], dataset, 32)


def test_a_second_signal_says_what_the_run_is_doing(caplog, tmp_path):
    from grpo import guards

    stopper = guards.StopOnSignal()
    with caplog.at_level(logging.WARNING, logger="grpotrainer"):
        stopper.handle(signal.SIGTERM, None)
        stopper.handle(signal.SIGINT, None)  # still in the step (a hung reward): no save is running yet
        stopper.signal_name = "SIGTERM"  # the processes agreed: Trainer saves now
        stopper.handle(signal.SIGINT, None)
        stopper.saved = tmp_path / "checkpoint-3"
        stopper.handle(signal.SIGINT, None)
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "SIGTERM received: finishing this step, then saving a checkpoint"
    assert said[1].startswith("SIGINT ignored: the current step has not finished yet (a checkpoint is saved after")
    assert said[2].startswith("SIGINT ignored: a checkpoint is being saved;")
    assert said[3].startswith("SIGINT ignored: the checkpoint is saved and the run is ending;")


class Interrupt:
    """A saver that is Ctrl-C'd while writing (KeyboardInterrupt)."""

    def save_pretrained(self, folder):
        (folder / "model.safetensors").write_text("half")
        raise KeyboardInterrupt


def test_an_interrupted_export_keeps_the_earlier_one_and_leaves_nothing(tmp_path):
    from test_export import FakeSaver

    out = tmp_path / "merged"
    export.write_folder(out, FakeSaver("model.safetensors"), FakeSaver("tokenizer.json"), {"step": 2})
    with pytest.raises(KeyboardInterrupt):
        export.write_folder(out, Interrupt(), FakeSaver("tokenizer.json"), {"step": 4})
    assert json.loads((out / export.marker).read_text())["step"] == 2  # the earlier export, whole
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no .partial or .old left


def test_what_a_killed_export_left_is_cleaned_up_and_its_folder_put_back(tmp_path):
    from test_export import FakeSaver

    out = tmp_path / "merged"
    dead = 2**22 + 12345  # above the default pid_max of 4194304: no such process
    assert not files.pid_alive(dead)
    host = socket.gethostname()
    old = tmp_path / f".merged.old-{host}-{dead}"  # killed between its two renames: OUTPUT_DIR was missing
    old.mkdir()
    (old / "model.safetensors").write_text("earlier export")
    partial = tmp_path / f".merged.partial-{host}-{dead}"
    partial.mkdir()
    (partial / "model.safetensors").write_text("half a model")
    with files.publish_dir(out, replace=True):
        assert (out / "model.safetensors").read_text() == "earlier export"  # put back before anything else
        assert not partial.exists()
    live = tmp_path / f".merged.partial-{host}-{os.getpid()}-other"  # not ours to judge: not of this pattern
    live.mkdir()
    export.write_folder(out, FakeSaver("model.safetensors"), FakeSaver("tokenizer.json"), {"step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["merged", live.name])


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
        "scheduler.pt names code outside torch's safe list (test_safety.Payload), so it is not loaded"
    )
    assert "weights_only=False" not in checkpoints.unsafe_pickle_problem(unsafe)  # no advice to turn safety off


@pytest.mark.slow
def test_a_two_process_cpu_run_resumes(tmp_path):
    # accelerate named the device cpu:0, which torch.load's map_location for the optimizer state refused
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "grpotrainer.py", "--smoke"]
    first = run_script(*torchrun, f"--OUTPUT_DIR={tmp_path}", "--MAX_STEPS=2")
    assert first.returncode == 0, first.stderr[-3000:]
    again = run_script(*torchrun, f"--OUTPUT_DIR={tmp_path}", "--MAX_STEPS=4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {tmp_path / 'checkpoint-2'}" in again.stderr
    assert json.loads((tmp_path / "run_finished.json").read_text())["global_step"] == 4
