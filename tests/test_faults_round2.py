"""Issue 22's categories, in-process: signals at any moment, arguments refused before torch, huge or odd data, a
Hub that cannot be reached, rewards that return no rewards mid-run, pass-through fields that collide with ours,
an export stopped between its renames. The end-to-end signal tests are in test_faults_e2e.py (slow)."""

import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

import grpotrainer
import rewards
from grpo import cli, files, gsm8k, hub, reward_guard
from grpo.errors import ConfigError

ROW = {"question": "What is 1 + 1?", "answer": "1 + 1 = 2\n#### 2"}


# ---------------------------------------------------------------------------------------------------------------
# SIGTERM and Ctrl-C at any moment


def run_main(main, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["script.py"])
    with pytest.raises(SystemExit) as stop:
        cli.run(main)
    return stop.value.code


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_in_any_phase_ends_with_one_line_naming_it_and_128_plus_the_signal(monkeypatch, capsys, signum, code):
    def main(argv):
        with cli.phase("loading the model", "the same command resumes from checkpoint-4"):
            os.kill(os.getpid(), signum)  # delivered here, between two bytecodes of the block
            raise AssertionError("the handler raises before this line")

    assert run_main(main, monkeypatch) == code  # 128 + the signal: the shell's "ended by this signal"
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    # the phase as it was when the signal came, though the block has unwound since
    assert err.strip().splitlines() == [
        f"stopped by {name} while loading the model: the same command resumes from checkpoint-4"
    ]


def test_a_signal_before_any_phase_says_nothing_was_written(monkeypatch, capsys):
    def main(argv):
        os.kill(os.getpid(), signal.SIGTERM)

    assert run_main(main, monkeypatch) == 143
    assert capsys.readouterr().err.strip() == f"stopped by SIGTERM while starting: {cli.NOTHING_WRITTEN}"


def test_a_keyboard_interrupt_raised_elsewhere_ends_the_same_way(monkeypatch, capsys):
    def main(argv):  # a library that put back Python's own SIGINT handler
        cli.set_phase("scoring 16 test problems")
        raise KeyboardInterrupt

    assert run_main(main, monkeypatch) == 130
    assert "stopped by SIGINT while scoring 16 test problems" in capsys.readouterr().err


def test_run_puts_back_the_callers_handlers_and_a_phase_block_its_phase(monkeypatch):
    mine = signal.getsignal(signal.SIGTERM)
    seen = {}

    def main(argv):
        seen["during"] = signal.getsignal(signal.SIGTERM)
        with cli.phase("outer", "o"), cli.phase("inner"):
            seen["inner"] = cli.stop_message(signal.SIGTERM)
        seen["after"] = cli.stop_message(signal.SIGTERM)

    monkeypatch.setattr(sys, "argv", ["script.py"])
    cli.run(main)
    assert seen["during"] is cli._interrupt  # installed from the first line of main
    assert seen["inner"] == "stopped by SIGTERM while inner: o"  # an inner phase keeps the outer outcome
    assert seen["after"] == f"stopped by SIGTERM while starting: {cli.NOTHING_WRITTEN}"
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_stop_between_the_renames_of_a_replacing_publish_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "export"
    target.mkdir()
    (target / "model.safetensors").write_text("the earlier export")
    real_rename = Path.rename
    calls = []

    def rename(self, to):
        calls.append(self)
        if len(calls) == 2:  # the new folder's rename into place: SIGTERM lands just before it
            raise cli.Interrupted(signal.SIGTERM, "stopped")
        return real_rename(self, to)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(cli.Interrupted), files.publish_dir(target, replace=True) as tmp:
        (tmp / "model.safetensors").write_text("the new export")
    monkeypatch.setattr(Path, "rename", real_rename)
    # the earlier export is whole where it was, and nothing half-written is left beside it
    assert (target / "model.safetensors").read_text() == "the earlier export"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]


# ---------------------------------------------------------------------------------------------------------------
# arguments read and checked before torch, transformers or TRL


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("evaluate.py", ["--ADAPTER=/nonexistent"], "ADAPTER=/nonexistent holds no LoRA adapter"),
        ("export.py", ["--ADAPTER=/nonexistent"], "ADAPTER='/nonexistent' holds no LoRA adapter"),
        ("evaluate.py", ["--LIMIT=-1"], "LIMIT=-1 must be at least 0"),
        ("grpotrainer.py", ["--top_pp=0.9"], "unknown setting --top_pp: not a constant nor a GRPOConfig field"),
        ("grpotrainer.py", ["--output_dir=x"], "--output_dir is set by the constant OUTPUT_DIR"),
        ("grpotrainer.py", ["--MAX_STEPS=1e3"], "--MAX_STEPS=1e3 is not a valid int"),
        ("grpotrainer.py", ["MAX_STEPS=3"], "cannot read the argument 'MAX_STEPS=3'"),
    ],
)
def test_a_mistake_is_refused_before_torch_transformers_or_trl_is_imported(script, args, message):
    # a child that never imports torch (so this stays cheap): it reports the heavy modules it loaded and its exit
    probe = (
        "import runpy, sys\n"
        f"sys.argv = [{script!r}, *{args!r}]\n"
        "try:\n"
        f"    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    code = stop.code\n"
        "print(sorted(m for m in ('torch', 'transformers', 'trl', 'peft', 'datasets') if m in sys.modules), code)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[] 2", done.stderr  # nothing heavy imported; exit 2 for the user's mistake
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_grpoconfig_field_names_are_read_from_trls_source_exactly():
    from trl import GRPOConfig

    # the ast reading follows GRPOConfig -> trl's _BaseConfig -> transformers' TrainingArguments, init fields only
    expected = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    assert cli.source_fields("trl.trainer.grpo_config", "GRPOConfig") == expected


def test_a_class_whose_source_cannot_be_followed_falls_back_to_importing_it():
    assert cli.source_fields("no_such_package_here.mod", "Config") is None
    assert cli.source_fields("json", "JSONDecoder") is None  # a plain module, not a package: not followed


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


def test_a_hub_dataset_that_cannot_be_reached_stops_before_datasets_tries(monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("datasets must not be asked"))
    with pytest.raises(
        ConfigError, match="DATASET=nobody-here/no-such-data is a Hub id that is not in the local cache"
    ):
        gsm8k.load("nobody-here/no-such-data", "train")


# ---------------------------------------------------------------------------------------------------------------
# huge or odd data


def write_lines(path, lines, newline="\n"):
    path.write_bytes(newline.join(lines).encode("utf-8") + newline.encode())
    return str(path)


def test_a_row_far_larger_than_any_gsm8k_problem_is_refused_with_its_line(tmp_path):
    huge = {"question": "x" * (gsm8k.MAX_ROW_CHARS + 1), "answer": "#### 1"}
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW), json.dumps(huge), json.dumps(ROW)])
    # the line's own length: its question plus 36 characters of keys, quotes and answer
    with pytest.raises(ConfigError, match=f"line 2: {gsm8k.MAX_ROW_CHARS + 37} characters, above the bound of 65536"):
        gsm8k.load(path)


def test_every_real_gsm8k_row_is_within_the_bound():
    for split in ("train", "test"):
        lines = Path(f"/work/shared/data/gsm8k/{split}.jsonl").read_text(encoding="utf-8").splitlines()
        assert max(map(len, lines)) < gsm8k.MAX_ROW_CHARS / 30  # GSM8K's longest row is 1,744 characters


def test_a_file_that_is_not_utf8_names_dataset(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_bytes(json.dumps(ROW).encode() + b"\n" + '{"question": "caf\xe9"}'.encode("latin-1") + b"\n")
    with pytest.raises(
        ConfigError, match=rf"^DATASET={path} \(train split\): {path} is not UTF-8 text \(line 2, byte"
    ):
        gsm8k.load(str(path))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([json.dumps([ROW, ROW])], "line 1: a list, not an object"),  # a JSON array instead of lines
        (["[", json.dumps(ROW) + ",", "]"], "line 1: not JSON"),  # the same array, pretty-printed
        ([json.dumps({"question": "q", "answer": ["#### 1"]})], "line 1: 'answer' is a list, not text"),
    ],
)
def test_dataset_forms_that_are_not_gsm8k_lines_are_refused_with_the_line(tmp_path, lines, message):
    with pytest.raises(ConfigError, match=message):
        gsm8k.load(write_lines(tmp_path / "train.jsonl", lines))


def test_crlf_lines_read_as_lines(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", [json.dumps(ROW)] * 3, newline="\r\n")
    assert gsm8k.load(path)["answer"] == ["2", "2", "2"]  # Windows line ends are only line ends


def test_dev_null_holds_no_problems():
    with pytest.raises(ConfigError, match="DATASET=/dev/null points at /dev/null, which is not a regular file"):
        gsm8k.load("/dev/null")  # not a regular file: refused as no dataset, never read forever


# ---------------------------------------------------------------------------------------------------------------
# rewards that return no rewards mid-run: one message naming the entry and the step


class State:
    global_step = 7


def guarded(values):
    return reward_guard.Guard(lambda completions, **kwargs: values, "myrewards:score")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, float("nan")], "returned nan for completion 1: not a finite number"),
        ([float("inf"), 1.0], "returned inf for completion 0: not a finite number"),
        ([1.0], "returned 1 values for 2 completions"),
        (["1.0", "0.0"], "returned '1.0' for completion 0: not a finite number"),
        ([True, False], "returned True for completion 0: not a finite number"),
        ({"a": 1.0, "b": 0.0}, "returned a dict, not a list of numbers"),
        (None, "returned None, not a list of numbers"),
        (0.5, "returned a float, not a list of numbers"),
    ],
)
def test_a_reward_returning_what_is_not_a_reward_is_one_message_naming_entry_and_step(values, message):
    with pytest.raises(ConfigError) as err:
        guarded(values)(completions=["a", "b"], trainer_state=State())
    assert str(err.value).startswith(f"the reward REWARD_FUNCS entry 'myrewards:score' at training step 7 {message}")


def test_numbers_none_and_arrays_are_rewards():
    import numpy as np

    assert guarded([1, None])(completions=["a", "b"], trainer_state=State()) == [1, None]  # None: TRL's "no reward"
    out = guarded(np.array([0.5, 1.0], dtype=np.float32))(completions=["a", "b"], trainer_state=State())
    assert out.tolist() == [0.5, 1.0]


def test_an_async_reward_is_awaited_by_trl_and_checked_the_same_way():
    from trl.trainer.utils import is_async_callable

    async def score(completions, **kwargs):
        return [float("nan")] * len(completions)

    func = reward_guard.AsyncGuard(score, "m:score")
    assert is_async_callable(func)  # so TRL runs it on its event loop instead of calling it and getting a coroutine
    with pytest.raises(ConfigError, match="entry 'm:score' at training step 7 returned nan for completion 0"):
        asyncio.run(func(completions=["a"], trainer_state=State()))


def test_rewards_load_wraps_an_async_reward_in_async_guard(tmp_path, monkeypatch):
    (tmp_path / "asyncrewards.py").write_text(
        "async def score(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (func,) = reward_guard.load(["asyncrewards:score"], rewards.REWARDS, max_completion_length=64)
    assert type(func) is reward_guard.AsyncGuard
    assert asyncio.run(func(completions=["a", "b"], trainer_state=State())) == [1.0, 1.0]


# ---------------------------------------------------------------------------------------------------------------
# pass-through fields that collide with the project's own job


@pytest.mark.parametrize(
    ("field", "constant"),
    [
        ("output_dir", "OUTPUT_DIR"),
        ("resume_from_checkpoint", "RESUME"),
        ("learning_rate", "LEARNING_RATE"),
    ],
)
def test_a_field_the_script_owns_is_refused_naming_its_constant(field, constant):
    settings = cli.constants(grpotrainer)
    with pytest.raises(ConfigError, match=f"^--{field} is set by the constant {constant}: use --{constant}="):
        cli.parse(
            settings, [f"--{field}=1"], config_class="trl.trainer.grpo_config:GRPOConfig", owned=grpotrainer.owned
        )


# ---------------------------------------------------------------------------------------------------------------
# reward paths that are not rewards


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("os:system", "'os:system' is not a reward function: it takes (command) without **kwargs"),  # never run
        ("./myrewards.py:score", "'./myrewards.py' is not a module name. Name the module as Python imports it"),
        ("rewards:REWARDS", "'rewards:REWARDS' is a dict, not a function"),
        ("emptyrewards:score", "emptyrewards.py has no 'score'; give module:function"),
    ],
)
def test_a_reward_path_that_is_not_a_reward_is_one_message(tmp_path, monkeypatch, entry, message):
    (tmp_path / "emptyrewards.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=re.escape(message)):
        reward_guard.load([entry], rewards.REWARDS, max_completion_length=64)


# ---------------------------------------------------------------------------------------------------------------
# a damaged model folder, refused before its weights load


def model_folder(tmp_path):
    """A small, whole model folder in Qwen3's layout: config, tokenizer with a chat template, one weights file."""
    from safetensors.torch import save_file

    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    (folder / "tokenizer.json").write_text("{}")
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    import torch

    save_file({"w": torch.zeros(4, 4)}, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda f: (f / "tokenizer_config.json").write_text("{not json"),
            "tokenizer_config.json is not JSON (JSONDecodeError: Expecting",
        ),
        (lambda f: (f / "generation_config.json").write_bytes(b"\xff\xfe"), "generation_config.json is not JSON"),
        (
            lambda f: (f / "model.safetensors.index.json").write_text(
                json.dumps({"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}})
            ),
            "the weight shards model-00002-of-00002.safetensors that model.safetensors.index.json lists are missing",
        ),
    ],
)
def test_a_damaged_model_folder_names_the_file(tmp_path, damage, message):
    from grpo import preflight

    folder = model_folder(tmp_path)
    preflight.check_model_folder(str(folder))  # whole: passes
    damage(folder)
    with pytest.raises(ConfigError, match=re.escape(message)):
        preflight.check_model_folder(str(folder))


def test_nan_probabilities_in_sampling_are_one_message_naming_weights_and_learning_rate():
    import torch
    import transformers.generation.utils

    from grpo import guards

    # torch.multinomial refusing NaN probabilities, raised from a frame of transformers' generation, as in _sample
    code = compile("torch.multinomial(probs, 1)", transformers.generation.utils.__file__, "exec")
    nonfinite = "(?s)NaN or inf.*MODEL_NAME's weights hold NaN or inf.*lower LEARNING_RATE"
    with pytest.raises(ConfigError, match=nonfinite), guards.faults("/tmp", 600):
        exec(code, {"torch": torch, "probs": torch.tensor([[float("nan"), 1.0]])})
    # any other error keeps its traceback
    with pytest.raises(RuntimeError, match="another error"), guards.faults("/tmp", 600):
        raise RuntimeError("another error")


# ---------------------------------------------------------------------------------------------------------------
# OUTPUT_DIR forms


def test_an_output_dir_through_a_dangling_link_is_refused_naming_the_link(tmp_path):
    from grpo import preflight

    (tmp_path / "link").symlink_to(tmp_path / "gone")
    for out in (tmp_path / "link", tmp_path / "link" / "run"):  # the link itself, or a folder below it
        problem = preflight.output_dir_problem(str(out))
        assert problem == (
            f"OUTPUT_DIR={out}: {tmp_path / 'link'} is a symbolic link to {tmp_path / 'gone'}, which does not exist; "
            "create that folder, or remove the link."
        )


@pytest.mark.parametrize("name", ["with space 🙂", "a,b=c", "-leading-dash"])
def test_an_output_dir_with_spaces_emoji_or_symbols_is_a_folder_like_any(tmp_path, name):
    from grpo import preflight

    assert preflight.output_dir_problem(str(tmp_path / name)) is None  # nothing in the name is special


def test_an_output_dir_name_too_long_for_the_file_system_is_refused():
    from grpo import preflight

    problem = preflight.output_dir_problem("/tmp/" + "y" * 300)
    assert problem.endswith("cannot be created or written (File name too long); choose a folder you can write to.")
