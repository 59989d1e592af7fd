"""Shared test helpers: the repo root on sys.path, settings fixtures, the one tiny model, the one way to launch
training (`train`), subprocess runs of any other script, and TensorBoard readers."""

import contextlib
import errno
import math
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parents[1]
GSM8K_DIR = REPO.parent / "shared" / "data" / "gsm8k"  # real GSM8K beside the checkout, never copied in
sys.path.insert(0, str(REPO))
# offline; one thread per process: the tiny model gains nothing from more, and on 2 shared cores they thrash
BASE_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
# TRL's trainer sends the Hub a usage ping from a thread kept for the process's life, unless offline or told not to:
# tests reach no Hub, and a test training in-process would otherwise leave that thread behind
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


# the handlers the scripts and their guards install (process.run, StopOnSignal, reward_guard's clock)
# set by pytest for each test, and by torch's compiler once per process for its cache: not a test's doing
OWN_VARIABLES = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
# started by tqdm at its first progress bar (even a disabled one) and kept for the process's life: not a test's doing
OWN_THREADS = ("tqdm_monitor",)
WATCHED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGPROF, signal.SIGALRM, signal.SIGCONT, signal.SIGTSTP)


@pytest.fixture(autouse=True)
def leaves_nothing_behind():
    """Every test leaves the process as it found it: no thread, child process, signal handler, environment variable
    or working directory of its own behind, so the tests hold in any order. What is left is put back, and the test
    errors naming it."""
    import psutil

    handlers = {signum: signal.getsignal(signum) for signum in WATCHED_SIGNALS}
    threads, environ, cwd = set(threading.enumerate()), dict(os.environ), os.getcwd()
    yield
    left = []
    for thread in {t for t in threading.enumerate() if t.name not in OWN_THREADS} - threads:
        thread.join(timeout=5)  # a watchdog being cancelled, a writer flushing: they end within moments
        left += [f"thread {thread.name}"] if thread.is_alive() else []
    for child in psutil.Process().children(recursive=True):
        try:
            what = " ".join(child.cmdline()[:3]) if child.status() != psutil.STATUS_ZOMBIE else "never waited for"
            child.kill()
        except psutil.Error:  # it ended meanwhile
            what = "ended"
        left.append(f"child process {child.pid} ({what})")
        with contextlib.suppress(ChildProcessError):
            os.waitpid(child.pid, 0)
    for signum, handler in handlers.items():
        if signal.getsignal(signum) != handler:
            left.append(f"a {signal.Signals(signum).name} handler")
            signal.signal(signum, handler)
    now = {key: value for key, value in os.environ.items() if key not in OWN_VARIABLES}
    then = {key: value for key, value in environ.items() if key not in OWN_VARIABLES}
    if now != then:
        left.append(f"environment variables {sorted({key for key, _ in set(now.items()) ^ set(then.items())})}")
        for key in set(now) - set(environ):
            del os.environ[key]
        os.environ.update({key: value for key, value in environ.items() if key not in OWN_VARIABLES})
    if os.getcwd() != cwd:
        left.append(f"working directory {os.getcwd()}")
        os.chdir(cwd)
    if left:
        pytest.fail(f"the test left behind: {'; '.join(left)}", pytrace=False)


@pytest.fixture
def settings():
    """A fresh dict of grpotrainer.py's constants, as `cli.parse` resolves them with no arguments."""
    import grpotrainer
    from grpo import cli

    return dict(cli.constants(grpotrainer))


@pytest.fixture
def smoke_settings(settings):
    """The --smoke settings, which pass preflight on this CPU machine."""
    from demo import smoke

    return {**settings, **smoke.SETTINGS}


@pytest.fixture
def smoke_ok(smoke_settings):
    """The --smoke settings, checked clean by preflight, so that a test changing one of them isolates one mistake."""
    from grpo import preflight

    preflight.refuse_bad_settings(smoke_settings, cpu_only=True)
    return smoke_settings


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """The path (str) of one whole tiny model folder (demo/smoke.py's, as --smoke builds it), shared by every test
    of the session: copy it before damaging it."""
    from demo import smoke

    return smoke.cpu_model(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def bare_python():
    """A Python without torch, as on a fresh machine: the interpreter this venv was made from, run with -s -E (no
    user site-packages, no PYTHONPATH). Skipped where that one has torch."""
    cmd = [getattr(sys, "_base_executable", sys.executable), "-s", "-E"]
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"
    if subprocess.run([*cmd, "-c", probe]).returncode != 0:
        pytest.skip(f"{cmd[0]} has torch")
    return cmd


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 KiB tmpfs: a real full disk. Needs root (mount); skipped elsewhere, e.g. on CI runners."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", disk]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    yield disk
    subprocess.run(["umount", "--lazy", disk], check=True)  # lazy: a failed writer may still hold a file open


@pytest.fixture
def full_disk(tiny_disk):
    """`tiny_disk` filled to its last byte: the next file written there fails with ENOSPC."""
    fd = os.open(tiny_disk / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError as err:
        assert err.errno == errno.ENOSPC
    finally:
        os.close(fd)
    return tiny_disk


# A model folder with its own code (auto_map), as a custom architecture on the Hub ships it: the tiny Qwen3 under a
# model_type transformers does not know. Importing its code writes the file named by $CUSTOM_CODE_RAN, so that a test
# can tell whether anything ran it.
CUSTOM_CONFIG = """import os
from pathlib import Path

from transformers import Qwen3Config

if os.environ.get("CUSTOM_CODE_RAN"):
    Path(os.environ["CUSTOM_CODE_RAN"]).write_text("ran")


class TinyCustomConfig(Qwen3Config):
    model_type = "tiny_custom"
"""
CUSTOM_MODEL = """from transformers import Qwen3ForCausalLM

from .configuration_tiny import TinyCustomConfig


class TinyCustomForCausalLM(Qwen3ForCausalLM):
    config_class = TinyCustomConfig
"""


def custom_code_model(folder, tiny_model):
    """A copy of `tiny_model` in `folder` whose config.json names its own code (auto_map): loads only with
    trust_remote_code."""
    import json
    import shutil

    shutil.copytree(tiny_model, folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "tiny_custom", "architectures": ["TinyCustomForCausalLM"]}
    auto = {
        "AutoConfig": "configuration_tiny.TinyCustomConfig",
        "AutoModelForCausalLM": "modeling_tiny.TinyCustomForCausalLM",
    }
    config["auto_map"] = auto
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_tiny.py").write_text(CUSTOM_CONFIG)
    (folder / "modeling_tiny.py").write_text(CUSTOM_MODEL)
    return str(folder)


def parse(argv):
    """grpotrainer.py's command line `argv`, read as its main() reads it: a cli.Args (settings, fields, ...)."""
    import grpotrainer
    from grpo import cli

    profiles = {name: profile.SETTINGS for name, profile in grpotrainer.PROFILES.items()}
    return cli.parse(cli.constants(grpotrainer), argv, profiles, grpotrainer.CONFIG_CLASS, source=grpotrainer.__file__)


@pytest.fixture
def gpu(monkeypatch):
    """Answer hardware's questions as a machine with GPUs would: `gpu(count=1, bf16=True, packages=("vllm",))`."""
    from grpo import hardware, weight_sync

    def fake(count=1, bf16=True, packages=None):
        monkeypatch.setattr(hardware, "cuda_available", lambda: count > 0)
        monkeypatch.setattr(hardware, "gpu_count", lambda: count)
        monkeypatch.setattr(hardware, "bf16_gpu", lambda: bf16)
        if packages is not None:  # which optional packages are importable; None = as installed here
            monkeypatch.setattr(hardware, "importable", lambda package: package in packages)
            monkeypatch.setattr(weight_sync, "vllm_status", lambda: ("vllm" in packages, None))

    return fake


def advice_thresholds():
    """The health thresholds the advice and callback tests share: windows of a few logs, a tied-group streak of 3."""
    from grpo import advice

    return advice.Thresholds(
        kl_warn=10.0,
        kl_act=20.0,
        zero_std_frac=0.9,
        zero_std_logs=3,
        reward_flat_window=4,
        reward_flat_delta=0.02,
        clipped_ratio_max=0.2,
        grad_norm_max=50.0,
    )


def run_script(*args, timeout=300, env=None):
    """Run `python <args>` from the repo root, offline, and return the CompletedProcess (text output). For any
    script but a training run, which goes through `train`."""
    full_env = {**os.environ, **BASE_ENV, **(env or {})}
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def train(
    output_dir,
    *args,
    profile="--smoke",
    launcher=(),
    env=None,
    reward_module=None,
    timeout=300,
    background=False,
    **popen,
):
    """Launch `python [launcher] grpotrainer.py [profile] --OUTPUT_DIR=output_dir [args]`, offline, one thread.

    Every test that launches training goes through here. `launcher` goes before the script (torchrun's `-m
    torch.distributed.run ...`, or `-X importtime`); `profile=None` runs without --smoke/--demo and `output_dir=None`
    without --OUTPUT_DIR. `reward_module` is the source of a user's reward module, written as mymod.py beside
    output_dir and importable as `mymod`. Returns the CompletedProcess (text output), or with `background=True` the
    Popen at once, its stdout and stderr in `<output_dir>.log` unless `popen` says otherwise (Popen's arguments:
    stdout, stderr, start_new_session, ...)."""
    cmd = [*launcher, "grpotrainer.py"]
    cmd += [profile] if profile else []
    cmd += [f"--OUTPUT_DIR={output_dir}"] if output_dir is not None else []
    cmd += list(args)
    env = dict(env or {})
    if reward_module is not None:
        folder = Path(output_dir).parent
        (folder / "mymod.py").write_text(reward_module)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    if not background:
        return run_script(*cmd, timeout=timeout, env=env)
    full_env = {**os.environ, **BASE_ENV, **env}
    if "stdout" not in popen:
        popen |= {"stdout": Path(f"{output_dir}.log").open("w"), "stderr": subprocess.STDOUT}  # noqa: SIM115
    return subprocess.Popen([sys.executable, *cmd], cwd=REPO, env=full_env, **popen)


LENGTH_REWARD = """def length_reward(completions, **kwargs):
    return [len(c if isinstance(c, str) else c[-1]["content"]) / 100 for c in completions]
"""


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    """The OUTPUT_DIR (a Path) of one smoke run whose adapter really moved, shared by the slow tests of evaluate.py
    and export.py: 4 GRPO steps at LEARNING_RATE=0.05, EVAL_BEFORE and EVAL_AFTER on 4 problems, rewarded by
    correctness and by completion length (mymod:length_reward), which differs within a group where the random
    model's correctness is all 0 and would leave the adapter exactly zero. Read it; write elsewhere."""
    path = tmp_path_factory.mktemp("trained") / "run"
    args = ["--REWARD_FUNCS=correctness_reward,mymod:length_reward", "--REWARD_WEIGHTS=1,1", "--LEARNING_RATE=0.05"]
    out = train(path, *args, "--EVAL_BEFORE=4", "--EVAL_AFTER=4", reward_module=LENGTH_REWARD)
    assert out.returncode == 0, out.stderr[-3000:]
    return path


# The one trained --smoke run that the end-to-end tests reading only its outputs share (`smoke_run`): 6 steps, the
# held-out curve at 2 and 4, EVAL_BEFORE and EVAL_AFTER with 2 samples each, a prompt, completion length and
# GRPOConfig field of its own (which evaluate.py must follow), the session's tiny model (so that a copy of the folder
# resumes: --smoke would name OUTPUT_DIR/smoke-model, another model in each copy), and ZERO_STD_LOGS=1: the random
# model's groups all tie, so the zero_std advice fires at the first log, an alert in W&B and trackio.
SMOKE_RUN_PROMPT = "Solve it. End with #### <number>."
SMOKE_RUN_TRACKERS = ("wandb", "trackio")  # beside TensorBoard, each where installed (requirements-trackers.txt)


def smoke_run_args(model, report_to):
    """The shared run's command line after --smoke --OUTPUT_DIR: the same command resumes a copy of it."""
    evals = ["--EVAL_BEFORE=8", "--EVAL_AFTER=8", "--EVAL_STEPS=2", "--EVAL_SUBSET=4", "--EVAL_SAMPLES=2"]
    length = ["--MAX_COMPLETION_LENGTH=24", "--top_p=0.9", "--ZERO_STD_LOGS=1"]
    return [f"--MODEL_NAME={model}", "--MAX_STEPS=6", *evals, f"--SYSTEM_PROMPT={SMOKE_RUN_PROMPT}", *length,
            f"--REPORT_TO={','.join(report_to)}"]  # fmt: skip


def tracker_env(folder):
    """W&B offline and trackio's local database, every file of theirs in `folder`."""
    names = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "TRACKIO_DIR")
    return {"WANDB_MODE": "offline", "WANDB_SILENT": "true", **dict.fromkeys(names, str(folder))}


class SmokeRun(NamedTuple):
    out: Path  # its OUTPUT_DIR
    result: subprocess.CompletedProcess  # its exit status and output
    trackers: Path  # the folder of W&B's and trackio's files
    report_to: tuple  # its REPORT_TO
    args: list  # smoke_run_args: with these, a copy of `out` resumes as the same run


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory, tiny_model):
    """The shared --smoke run (`smoke_run_args`), trained once per session: read its files, or copy the folder
    (`copy_run`) before running anything in it."""
    import importlib.util

    folder = tmp_path_factory.mktemp("smoke-run")
    report_to = ("tensorboard", *(t for t in SMOKE_RUN_TRACKERS if importlib.util.find_spec(t) is not None))
    args = smoke_run_args(tiny_model, report_to)
    result = train(folder / "out", *args, env=tracker_env(folder), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return SmokeRun(folder / "out", result, folder, report_to, args)


def copy_run(run, folder):
    """A copy of the shared run's OUTPUT_DIR at `folder`, to resume, cut or damage."""
    import shutil

    shutil.copytree(run.out, folder)
    return folder


def run_in_process(main, *args, capsys):
    """`process.run(main)` with `args` as the command line, in this process: (exit code, stderr). For mistakes that
    stop before any model or process group exists; it costs no new Python importing torch, as run_script does."""
    import sys as _sys

    from grpo import process

    argv = _sys.argv
    _sys.argv = ["script", *args]
    try:
        process.run(main)
        code = 0
    except SystemExit as end:
        code = end.code
    finally:
        _sys.argv = argv
    return code, capsys.readouterr().err


def event_dirs(output_dir):
    """TensorBoard run folders under OUTPUT_DIR/runs, oldest first."""
    return sorted((Path(output_dir) / "runs").iterdir(), key=lambda p: p.stat().st_mtime)


def read_scalars(logdir):
    """{tag: [(step, value), ...]} from the event files in one run folder, via tensorboard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def read_texts(logdir):
    """{tag: [(step, text), ...]} of the text summaries in a run folder (TensorBoard stores them as tensors)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"tensors": 0})
    acc.Reload()
    return {
        tag.removesuffix("/text_summary"): [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)]
        for tag in acc.Tags()["tensors"]
        if tag.endswith("/text_summary")  # not the custom_scalars layout, a serialised proto
    }


def all_finite(points):
    return bool(points) and all(math.isfinite(value) for _, value in points)


def load_rewards(names, max_completion_length):
    """REWARD_FUNCS entries loaded and guarded as grpotrainer.py does it."""
    import rewards
    from grpo import reward_guard

    return reward_guard.load(names, rewards.REWARDS, max_completion_length=max_completion_length)


def stand_in_nvidia_smi(folder, driver):
    """An nvidia-smi on PATH that reports `driver`, as the real one answers --query-gpu=driver_version."""
    exe = folder / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho '{driver}'\n")
    exe.chmod(0o755)
    return folder
