"""grpo/process.py's exits: `run` ends a ConfigError as one paragraph and exit 2, SIGTERM and Ctrl-C as one line
naming the phase (`phase`, `set_phase`, `Interrupted`) and 128 + the signal, a closed stdout quietly as SIGPIPE would,
and a bug with its traceback.

.venv/bin/python -m pytest tests/test_process_exits.py -q
"""

import os
import signal
import subprocess
import sys

import pytest
from conftest import REPO

from grpo import process
from grpo.errors import ConfigError


def run_main(main, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["script.py"])
    with pytest.raises(SystemExit) as stop:
        process.run(main)
    return stop.value.code


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_in_any_phase_ends_with_one_line_naming_it_and_128_plus_the_signal(monkeypatch, capsys, signum, code):
    def main(argv):
        with process.phase("loading the model", "the same command resumes from checkpoint-4"):
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
    assert capsys.readouterr().err.strip() == f"stopped by SIGTERM while starting: {process.NOTHING_WRITTEN}"


def test_a_keyboard_interrupt_raised_elsewhere_ends_the_same_way(monkeypatch, capsys):
    def main(argv):  # a library that put back Python's own SIGINT handler
        process.set_phase("scoring 16 test problems")
        raise KeyboardInterrupt

    assert run_main(main, monkeypatch) == 130
    # set_phase without an outcome keeps the current one: here, run's own
    assert capsys.readouterr().err.strip() == (
        f"stopped by SIGINT while scoring 16 test problems: {process.NOTHING_WRITTEN}"
    )


def test_the_stop_message_says_the_signal_the_phase_and_what_it_leaves():
    with process.phase("loading the model", "nothing was written"):
        assert (
            process.Interrupted(signal.SIGTERM).message
            == "stopped by SIGTERM while loading the model: nothing was written"
        )


def test_run_puts_back_the_callers_handlers_and_a_phase_block_its_phase(monkeypatch):
    mine = signal.getsignal(signal.SIGTERM)
    seen = {}

    def main(argv):
        seen["argv"] = argv
        seen["during"] = signal.getsignal(signal.SIGTERM)
        with process.phase("outer", "o"), process.phase("inner"):
            seen["inner"] = process.Interrupted(signal.SIGTERM).message
        seen["after"] = process.Interrupted(signal.SIGTERM).message
        return "done"

    monkeypatch.setattr(sys, "argv", ["script.py", "--smoke"])
    assert process.run(main) == "done"  # main's own value, for a caller that wants it
    assert seen["argv"] == ["--smoke"]  # the command line without the script
    assert seen["during"] is process._interrupt  # installed from the first line of main
    assert seen["inner"] == "stopped by SIGTERM while inner: o"  # an inner phase keeps the outer outcome
    assert seen["after"] == f"stopped by SIGTERM while starting: {process.NOTHING_WRITTEN}"
    assert signal.getsignal(signal.SIGTERM) is mine


def test_a_config_error_is_one_paragraph_and_exit_2(monkeypatch, capsys):
    def main(argv):
        raise ConfigError("LORA_R=0 is outside [1, inf].\nSet LORA_R to 8-64.")

    assert run_main(main, monkeypatch) == 2  # the user's mistake: not 1, which a crash would give
    assert capsys.readouterr().err == "\nerror: LORA_R=0 is outside [1, inf].\nSet LORA_R to 8-64.\n\n"


def test_a_bug_keeps_its_traceback_and_the_callers_handlers_are_back(monkeypatch):
    mine = signal.getsignal(signal.SIGINT)

    def main(argv):
        raise ValueError("a bug in our code")

    monkeypatch.setattr(sys, "argv", ["script.py"])
    with pytest.raises(ValueError, match="a bug in our code"):  # not reworded, not swallowed
        process.run(main)
    assert signal.getsignal(signal.SIGINT) is mine


def test_a_broken_pipe_that_is_not_stdouts_is_a_bug(monkeypatch):
    def main(argv):  # a socket or a child's pipe that closed: nothing to do with `| head`
        raise BrokenPipeError("[Errno 32] Broken pipe")

    monkeypatch.setattr(sys, "argv", ["script.py"])
    with pytest.raises(BrokenPipeError):
        process.run(main)


def test_interruptible_unwinds_through_run_whatever_handler_training_installed(monkeypatch, capsys):
    recorded = []

    def main(argv):
        signal.signal(signal.SIGTERM, lambda signum, frame: recorded.append(signum))  # training's: finish the step
        with process.phase("scoring 8 test problems before training", "no step was trained"), process.interruptible():
            os.kill(os.getpid(), signal.SIGTERM)
            raise AssertionError("interruptible's handler raises before this line")

    assert run_main(main, monkeypatch) == 143
    assert recorded == []  # the block's signal ended it: training's handler never saw it
    assert capsys.readouterr().err.strip() == (
        "stopped by SIGTERM while scoring 8 test problems before training: no step was trained"
    )


def test_require_names_what_is_missing_and_the_command_that_installs_it():
    with pytest.raises(ConfigError) as refused:
        process.require(["json", "no_such_package_xyz"], "grpotrainer.py")
    assert str(refused.value).startswith(f"this Python ({sys.executable}) lacks no_such_package_xyz.\n")
    assert "make install" in str(refused.value)
    process.require(["json"], "grpotrainer.py")  # all there: nothing to say


# ---------------------------------------------------------------------------------------------------------------
# a closed stdout: `python grpotrainer.py --help | head -1`

PRINTS_INTO_A_PIPE = "from grpo import process; process.run(lambda argv: print('x' * 65536, flush=True))"


@pytest.mark.parametrize(
    "args",
    [
        ["-c", PRINTS_INTO_A_PIPE],  # process.run itself, in a Python that imports nothing else
        ["export.py", "--help"],
        ["evaluate.py", "--help"],
        pytest.param(["grpotrainer.py", "--help"], marks=pytest.mark.slow),  # imports transformers: ~5 CPU-s
    ],
    ids=["run", "export", "evaluate", "grpotrainer"],
)
def test_output_into_a_closed_pipe_ends_quietly_as_sigpipe_would(args):
    # the reader is gone before the script writes
    read, write = os.pipe()
    os.close(read)
    try:
        result = subprocess.run(
            [sys.executable, *args], cwd=REPO, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120
        )
    finally:
        os.close(write)
    assert result.returncode == 128 + signal.SIGPIPE  # the shell's code for a command ended by SIGPIPE
    assert result.stderr == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
