"""Tests for grpo/reward_guard.py: loading REWARD_FUNCS entries, binding the run's settings, the guard around each
call (the note on a raise, the value check, the deadline), and preflight calling the same guard.

Run:
    python -m pytest tests/test_reward_guard.py -q
"""

import asyncio
import os
import pickle
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, load_rewards

import rewards
from grpo import gsm8k, preflight, reward_guard
from grpo.errors import ConfigError

FIXTURE = str(gsm8k.FIXTURE)


class State:
    global_step = 7


def timed_out_reward(completions, **kwargs):
    raise RuntimeError("request timed out")


def _torch_tensor():
    import torch

    return torch.tensor([0.5, 0.5, 0.5])


BAD_VALUES = {
    "None": (lambda: None, "returned None, not a list of numbers"),
    "float": (lambda: 0.5, "returned a float, not a list of numbers"),
    "generator": (lambda: (0.5 for _ in range(3)), "returned a generator, not a list of numbers"),
    "tensor": (_torch_tensor, "returned a Tensor, not a list of numbers"),
    "dict": (lambda: {"a": 1.0, "b": 0.0, "c": 0.0}, "returned a dict, not a list of numbers"),
    "str": (lambda: "1.0", "returned a str, not a list of numbers"),
    "bool": (lambda: [True, False, True], "returned True for completion 0: not a finite number"),
    "NaN": (lambda: [0.0, float("nan"), 0.0], "returned nan for completion 1: not a finite number"),
    "wrong length": (lambda: [1.0], "returned 1 values for 3 completions"),
}


def bad_reward(completions, kind, **kwargs):
    """A reward returning the bad value named by the `kind` column (one value for all its rows)."""
    return BAD_VALUES[kind[0]][0]()


@pytest.mark.parametrize("kind", list(BAD_VALUES))
def test_a_bad_value_is_one_message_naming_entry_and_step(kind):
    (guard,) = reward_guard.load(["test_reward_guard:bad_reward"], {}, max_completion_length=8)
    with pytest.raises(ConfigError) as err:
        guard(completions=["a", "b", "c"], kind=[kind] * 3, trainer_state=State())
    entry = "'test_reward_guard:bad_reward'"
    assert str(err.value).startswith(f"the reward REWARD_FUNCS entry {entry} at training step 7 {BAD_VALUES[kind][1]}")
    assert len(str(err.value).splitlines()) == 2  # the value and the fix: no traceback of our own code to read


@pytest.mark.parametrize("kind", list(BAD_VALUES))
def test_preflight_refuses_a_bad_value_with_the_same_message(kind):
    dataset = gsm8k.load(FIXTURE, limit=4)
    dataset = dataset.add_column("kind", [kind] * len(dataset))
    name = "test_reward_guard:bad_reward"
    with pytest.raises(ConfigError, match=f"entry '{name}' at training step 0 {BAD_VALUES[kind][1]}"):
        preflight.try_rewards(reward_guard.load([name], {}, max_completion_length=8), [name], dataset, 8)


def test_a_reward_raising_a_timeout_keeps_its_own_error_and_traceback_with_the_note():
    # its text says "timed out", but it is the reward's own error: not a stall, not a ConfigError
    (guard,) = reward_guard.load(["test_reward_guard:timed_out_reward"], {}, max_completion_length=8)
    with pytest.raises(RuntimeError) as err:
        guard(completions=["a"], trainer_state=State())
    assert type(err.value) is RuntimeError and err.value.args == ("request timed out",)
    assert err.value.__notes__ == [
        "raised by the reward REWARD_FUNCS entry 'test_reward_guard:timed_out_reward' at training step 7"
    ]
    assert err.traceback[-1].name == "timed_out_reward"  # the traceback ends in the reward's own line


def test_sys_exit_in_a_reward_becomes_a_runtime_error_from_it():
    def exits(completions, **kwargs):
        raise SystemExit(3)

    with pytest.raises(RuntimeError, match=r"the reward called sys.exit\(3\)") as err:
        reward_guard.Guard(exits, "m:exits")(completions=["a"], trainer_state=State())
    assert isinstance(err.value.__cause__, SystemExit)  # its traceback goes into the reward
    assert err.value.__notes__ == ["raised by the reward REWARD_FUNCS entry 'm:exits' at training step 7"]


async def async_reward(completions, **kwargs):
    return [float("nan")] * len(completions) if kwargs.get("bad") else [0.5] * len(completions)


async def async_raising_reward(completions, **kwargs):
    raise KeyError("difficulty")


def test_an_async_reward_is_guarded_the_same_way_and_awaited():
    from trl.trainer.utils import is_async_callable

    (guard,) = reward_guard.load(["test_reward_guard:async_reward"], {}, max_completion_length=8)
    assert is_async_callable(guard)  # TRL 1.16 awaits it on its event loop rather than iterating a coroutine
    assert asyncio.run(guard(completions=["a", "b"], trainer_state=State())) == [0.5, 0.5]
    with pytest.raises(ConfigError, match="at training step 7 returned nan for completion 0"):
        asyncio.run(guard(completions=["a"], bad=True, trainer_state=State()))
    (raising,) = reward_guard.load(["test_reward_guard:async_raising_reward"], {}, max_completion_length=8)
    with pytest.raises(KeyError) as err:
        asyncio.run(raising(completions=["a"], trainer_state=State()))
    assert "at training step 7" in err.value.__notes__[0]


@pytest.mark.parametrize("name", ["correctness_reward", "format_reward", "math_reward", "overlong_reward"])
def test_bound_rewards_keep_their_name_and_pickle(name):
    from trl.trainer.utils import get_callable_name

    (guard,) = reward_guard.load([name], rewards.REWARDS, max_completion_length=16, enable_thinking=True)
    assert guard.__name__ == get_callable_name(guard.func) == name  # TRL logs rewards/<name>/mean
    copy = pickle.loads(pickle.dumps(guard))
    assert copy.func.keywords == guard.func.keywords and copy.func.func is rewards.REWARDS[name]
    args = {"completions": ["#### 18"], "answer": ["18"], "completion_ids": [[1] * 14]}
    assert copy(**args) == guard(**args)


def test_a_function_without_the_settings_is_used_as_it_is():
    # brevity_reward takes neither max_completion_length nor enable_thinking: nothing to bind
    (guard,) = reward_guard.load(["test_reward_guard:brevity_reward"], rewards.REWARDS, max_completion_length=16)
    assert guard.func is brevity_reward


def test_overlong_matches_trls_formula():
    from trl.rewards import get_soft_overlong_punishment

    ids = [[1] * n for n in (0, 70, 75, 76, 90, 100, 101, 500)]
    trl = get_soft_overlong_punishment(max_completion_len=100, soft_punish_cache=25)(ids)
    assert rewards.overlong_reward(["x"] * len(ids), completion_ids=ids, max_completion_length=100) == trl


def test_preflight_skips_only_the_answer_blind_rewards_it_is_told_of(caplog):
    names = ["format_reward", "reasoning_reward"]
    funcs = reward_guard.load(names, rewards.REWARDS, max_completion_length=32)
    dataset = gsm8k.load(FIXTURE, limit=4)
    with caplog.at_level("WARNING", logger="grpotrainer.preflight"):
        preflight.try_rewards(funcs, names, dataset, 32, answer_blind=("format_reward",))
    assert [r.getMessage().split(" scores")[0] for r in caplog.records] == ["REWARD_FUNCS entry 'reasoning_reward'"]


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


def brevity_reward(completions, **kwargs):
    return [1.0 / (1 + len(str(c))) for c in completions]


def test_reward_funcs_by_name_and_import_path():

    funcs = load_rewards(["correctness_reward", "test_reward_guard:brevity_reward", "overlong_reward"], 10)
    assert funcs[0].__name__ == "correctness_reward"
    assert funcs[1].func is brevity_reward and funcs[1].__name__ == "brevity_reward"  # guarded, as TRL names it
    # parameterised rewards in the registry are functions, bound to the run's completion length
    assert funcs[2].__name__ == "overlong_reward"
    assert funcs[2]([[1] * 10], completion_ids=[[1] * 10]) == [-1.0]


def test_unimportable_reward():

    # a module that is not on the path is the user's to fix: the message says where it must live
    with pytest.raises(ConfigError, match="there is no module 'no_such_module' on the Python path") as err:
        load_rewards(["no_such_module:f"], 10)
    assert "repository root (beside grpotrainer.py) or in a folder on PYTHONPATH" in str(err.value)
    with pytest.raises(ConfigError, match="has no 'no_such_reward'"):
        load_rewards(["test_reward_guard:no_such_reward"], 10)


def test_trls_dotted_reward_path_is_accepted_beside_the_colon_form():

    (dotted,) = load_rewards(["test_reward_guard.brevity_reward"], 10)
    (colon,) = load_rewards(["test_reward_guard:brevity_reward"], 10)
    assert dotted.func is colon.func is brevity_reward


def no_kwargs_reward(completions):
    return [0.0 for _ in completions]


def later_reward(completions, trainer_state=None, **kwargs):
    if trainer_state.global_step >= 1:
        raise ZeroDivisionError("division by zero")
    return [0.0] * len(completions)


class NeedsArgReward:
    def __init__(self, scale):
        self.scale = scale


def _raised_here(excinfo):
    """The file and function of the frame that raised: a bug's traceback must end in the reward itself."""
    frame = excinfo.traceback[-1]
    return Path(str(frame.path)).name, frame.name


def test_a_reward_without_kwargs_is_refused_when_loaded():

    # TRL calls it with prompts=, completion_ids=, trainer_state= and the columns: it could never run
    with pytest.raises(
        ConfigError, match=r"'test_reward_guard:no_kwargs_reward' is not a reward function: it takes \(completions\)"
    ):
        load_rewards(["test_reward_guard:no_kwargs_reward"], 32)


def test_a_reward_class_that_cannot_be_built_keeps_its_traceback():

    with pytest.raises(TypeError) as excinfo:
        load_rewards(["test_reward_guard:NeedsArgReward"], 32)
    assert "REWARD_FUNCS entry 'test_reward_guard:NeedsArgReward'" in excinfo.value.__notes__[0]


def test_a_reward_that_raises_during_training_keeps_its_traceback_and_names_its_entry():
    from transformers import TrainerState

    (func,) = load_rewards(["test_reward_guard:later_reward"], 32)
    assert func(["x"], trainer_state=TrainerState(global_step=0)) == [0.0]
    with pytest.raises(ZeroDivisionError) as excinfo:
        func(["x"], trainer_state=TrainerState(global_step=3))
    assert excinfo.value.__notes__ == [
        "raised by the reward REWARD_FUNCS entry 'test_reward_guard:later_reward' at training step 3"
    ]
    assert _raised_here(excinfo) == ("test_reward_guard.py", "later_reward")  # the user's own file and line


def test_rewards_load_wraps_an_async_reward_in_async_guard(tmp_path, monkeypatch):
    (tmp_path / "asyncrewards.py").write_text(
        "async def score(completions, **kwargs):\n    return [1.0] * len(completions)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (func,) = reward_guard.load(["asyncrewards:score"], rewards.REWARDS, max_completion_length=64)
    assert type(func) is reward_guard.AsyncGuard
    assert asyncio.run(func(completions=["a", "b"], trainer_state=State())) == [1.0, 1.0]


def none_reward(completions, **kwargs):
    return None


def generator_reward(completions, **kwargs):
    return (0.0 for _ in completions)


def huge_reward(completions, **kwargs):
    return [10**400 for _ in completions]  # an int too large for a float: not a finite number


def float32_overflow_reward(completions, **kwargs):
    return [1e308 for _ in completions]  # finite, but inf in TRL's float32 rewards


@pytest.mark.parametrize(
    "name, message",
    [
        ("none_reward", "returned None, not a list of numbers"),
        ("generator_reward", "returned a generator, not a list of numbers"),
        ("huge_reward", "for completion 0: not a finite number"),
        ("float32_overflow_reward", "returned 1e+308 for completion 0: beyond +-1e+15"),
    ],
)
def test_the_command_line_answers_a_bad_value_in_one_message_exit_2(name, message, tmp_path, capsys, monkeypatch):
    import tqdm
    from conftest import run_in_process

    import grpotrainer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # datasets' progress bars would start tqdm's monitor thread, which lives as long as this process
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    entry = f"--REWARD_FUNCS=correctness_reward,test_reward_guard:{name}"
    code, stderr = run_in_process(grpotrainer.main, "--smoke", entry, f"--OUTPUT_DIR={tmp_path}", capsys=capsys)
    assert code == 2 and message in stderr and "Traceback" not in stderr
    assert f"entry 'test_reward_guard:{name}' at training step 0" in stderr


# Each shape of a reward that never returns, as a module of the user's: REWARD_TIMEOUT must end every one.
HUNG_REWARDS = {
    "sleeps": "def myreward(completions, **kwargs):\n    time.sleep(3600)\n",
    "swallows": (  # a reward that catches every error must not catch its way past the deadline
        "def myreward(completions, **kwargs):\n    while True:\n        try:\n            time.sleep(3600)\n"
        "        except Exception:\n            pass\n"
    ),
    "alarm": (  # math-verify's own timeout on every parse: sets and clears signal.alarm, replacing a SIGALRM timer
        "def myreward(completions, **kwargs):\n    signal.signal(signal.SIGALRM, lambda *a: None)\n"
        "    while True:\n        signal.alarm(3600)\n        time.sleep(0.01)\n        signal.alarm(0)\n"
    ),
    "thread": (  # an LLM judge on a thread pool: the main thread waits in a C-level lock for a worker that hangs
        "def myreward(completions, **kwargs):\n    with ThreadPoolExecutor(2) as pool:\n"
        "        return list(pool.map(lambda c: threading.Event().wait(), completions))\n"
    ),
    "regex": (  # backtracking for ever in C, holding the GIL: the watchdog thread never runs
        'def myreward(completions, **kwargs):\n    re.match(r"(a+)+$", "a" * 64 + "b")\n'
    ),
    "async": "async def myreward(completions, **kwargs):\n    await asyncio.Event().wait()\n",
    "async-blocking": "async def myreward(completions, **kwargs):\n    time.sleep(3600)\n",  # blocks its event loop
}
IMPORTS = "import asyncio, re, signal, threading, time\nfrom concurrent.futures import ThreadPoolExecutor\n\n"
CALL_GUARDED = """\
import asyncio, inspect, sys
from grpo import reward_guard
(guard,) = reward_guard.load(["mymod:myreward"], {}, max_completion_length=8, timeout=float(sys.argv[1]))
state = type("State", (), {"global_step": 7})()
out = guard(completions=["a", "b"], trainer_state=state)
print(asyncio.run(out) if inspect.isawaitable(out) else out)  # reached only when the deadline failed
"""


def run_hung(tmp_path, source, code, timeout):
    """Run `code` (with the REWARD_TIMEOUT `timeout` as argv[1]) in a fresh Python where mymod.py holds `source`:
    the deadline ends that process, not pytest's. subprocess's own timeout only keeps a failing test from hanging."""
    (tmp_path / "mymod.py").write_text(IMPORTS + source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]), "OMP_NUM_THREADS": "1"}
    args = [sys.executable, "-c", code, str(timeout)]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("shape", list(HUNG_REWARDS))
def test_reward_timeout_ends_a_reward_that_never_returns_naming_it(tmp_path, shape):
    out = run_hung(tmp_path, HUNG_REWARDS[shape], CALL_GUARDED, timeout=0.5)
    assert out.returncode == 1, out.stderr[-3000:]  # ended by the deadline: not killed by subprocess's timeout
    assert out.stdout == ""  # the reward never returned
    last = out.stderr.strip().splitlines()
    assert (
        "REWARD_FUNCS entry 'mymod:myreward' did not return within REWARD_TIMEOUT=0.5 s (at training step 7)"
        in (last[-2])
    )  # the message is the end of the output, after the stack that shows the hung line
    assert str(tmp_path / "mymod.py") in out.stderr  # the user's file is in the traceback


async def async_timing_out_reward(completions, **kwargs):
    await asyncio.wait_for(asyncio.Event().wait(), 0.01)  # the reward's own request timing out: its error


def test_an_async_rewards_own_timeout_keeps_its_error_under_reward_timeout():
    guard = reward_guard.AsyncGuard(async_timing_out_reward, "m:own", timeout=60)
    with pytest.raises(TimeoutError) as err:
        asyncio.run(guard(completions=["a"], trainer_state=State()))
    assert err.value.__notes__ == ["raised by the reward REWARD_FUNCS entry 'm:own' at training step 7"]


def test_a_reward_that_returns_in_time_leaves_no_watchdog_behind():
    guard = reward_guard.Guard(brevity_reward, "m:brevity", timeout=60)
    before = set(threading.enumerate())
    assert guard(completions=["ab"], trainer_state=State()) == [1 / 3]
    assert asyncio.run(reward_guard.AsyncGuard(async_reward, "m:a", timeout=60)(completions=["a"])) == [0.5]
    for thread in set(threading.enumerate()) - before:
        thread.join(10)  # a cancelled watchdog ends once it sees the cancel; a live one would wait its 60 s
    assert set(threading.enumerate()) == before


def mutating_reward(completions, prompts, answer, completion_ids, **kwargs):
    for completion in completions:
        completion[0]["content"] = "#### 0"  # grades its own normalised copy, in place
    prompts.clear()
    answer[0] = "0"
    completion_ids[0].append(1)
    return [0.0] * len(completions)


def test_a_reward_that_edits_its_inputs_does_not_change_what_the_next_one_grades():
    completions = [[{"role": "assistant", "content": "#### 18"}], [{"role": "assistant", "content": "#### 7"}]]
    batch = {"prompts": [["p"], ["q"]], "answer": ["18", "7"], "completion_ids": [[1, 2], [3]]}
    seen = []
    first = reward_guard.Guard(mutating_reward, "m:mutating")
    second = reward_guard.Guard(lambda **kwargs: seen.append(pickle.dumps(kwargs)) or [1.0, 1.0], "m:reads")
    before = pickle.dumps({"completions": completions, **batch})
    first(completions=completions, **batch)
    second(completions=completions, **batch)
    assert seen == [before]  # what TRL passed, unchanged
    assert pickle.dumps({"completions": completions, **batch}) == before  # and TRL's own lists, which it logs


@pytest.mark.parametrize("value", [1e308, -1e308, 3e38, -1e16])
def test_a_finite_reward_beyond_float32s_reach_is_one_true_message(value):
    with pytest.raises(ConfigError) as err:
        guarded([0.0, value])(completions=["a", "b"], trainer_state=State())
    assert f"returned {value!r} for completion 1: beyond +-1e+15" in str(err.value)
    assert "not a finite number" not in str(err.value)  # it is finite: the message says what is wrong with it


def test_large_rewards_within_the_limit_are_accepted_and_stay_finite_in_float32():
    import torch

    values = [1e15, -1e15] * 512  # a group of 1024 at the limit: TRL's group mean and std stay finite
    assert guarded(values)(completions=["a"] * len(values), trainer_state=State()) == values
    group = torch.tensor(values, dtype=torch.float32)
    assert torch.isfinite(group.mean()) and torch.isfinite(group.std())


def test_the_cpu_clock_calls_the_end_once_and_raises_nothing_into_the_reward(monkeypatch):
    # the CPU clock (SIGPROF) can see the deadline pass before the watchdog thread does, as on a loaded machine;
    # the end it calls exits the process, but were it to return, nothing may be raised inside the reward
    class Asleep:
        def __init__(self, *args):
            pass

        def cancel(self):
            pass

    ended = []
    monkeypatch.setattr(reward_guard, "Watchdog", Asleep)
    monkeypatch.setattr(reward_guard, "_expire", lambda message, frame=None, source=None: ended.append(message))
    with reward_guard.deadline(0.05, "too slow"):
        spins = 0
        while not ended and spins < 50_000_000:  # CPU time, so that the process timer runs
            spins += 1
        for _ in range(2_000_000):  # and on, past where a re-armed timer would fire again
            spins += 1
    assert ended == ["too slow"]
