"""End to end, fast: `grpotrainer.py` in a subprocess for --help, mistakes, logging and import weight; slow: the
paired test, and the held-out points, pace, texts and alerts in W&B (offline) and trackio (local), read back from
their own files (skipped without requirements-trackers.txt), all from the one shared smoke run (conftest.smoke_run).

.venv/bin/python -m pytest tests/test_e2e_train.py -q -m "not slow"
.venv/bin/python -m pytest tests/test_e2e_train.py -q -m slow -k tracker
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, event_dirs, read_texts, run_script, stand_in_nvidia_smi, train

import grpotrainer
from demo import smoke
from grpo import cli, evaluation, gsm8k, stats

# ---------------------------------------------------------------------------------------------------------------
# arguments read and checked before torch, transformers or TRL


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("evaluate.py", ["--ADAPTER=/nonexistent"], "ADAPTER=/nonexistent holds no LoRA adapter"),
        ("export.py", ["--ADAPTER=/nonexistent"], "ADAPTER='/nonexistent' holds no LoRA adapter"),
        ("evaluate.py", ["--LIMIT=-1"], "LIMIT=-1 is outside [0, inf]"),  # the settings table's range
        ("grpotrainer.py", ["--top_pp=0.9"], "unknown setting --top_pp: not a constant nor a GRPOConfig field"),
        ("grpotrainer.py", ["--use_cpu=true"], "--use_cpu is set by the CPU profiles: run --smoke or --demo"),
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


def test_help_lists_every_constant_with_its_comment():
    out = run_script("grpotrainer.py", "--help")
    assert out.returncode == 0 and not out.stderr
    for name in cli.constants(grpotrainer):
        assert f"--{name}=" in out.stdout
    # each constant's own comment, read from the source, is printed right under it
    source = (REPO / "grpotrainer.py").read_text()
    for name in ("LORA_R", "LORA_DROPOUT"):
        comment = re.search(rf"^{name} = .*?  # (.*)$", source, re.M).group(1)
        printed = out.stdout.split(f"--{name}=")[1].split("\n--")[0]
        assert " ".join(comment.split()) in " ".join(printed.split()[1:])
    assert out.stdout.startswith(grpotrainer.__doc__.strip().splitlines()[0])  # the summary line first
    # command-line syntax, not Python literals: what a user can paste back
    assert f"--REWARD_FUNCS={','.join(grpotrainer.REWARD_FUNCS)}\n" in out.stdout
    assert f"--MODEL_NAME={grpotrainer.MODEL_NAME}\n" in out.stdout
    assert f"--BF16={str(grpotrainer.BF16).lower()}\n" in out.stdout
    assert "--smoke sets, before the command line's own --KEY=value:" in out.stdout
    assert f"MAX_STEPS={smoke.SETTINGS['MAX_STEPS']}" in out.stdout.split("--smoke sets")[1]  # the profile's


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        # offline, a Hub id not in the cache is refused before any load is tried (issue 22), with the way out
        (
            ["--smoke", "--MODEL_NAME=nobody/no-such-model"],
            "MODEL_NAME=nobody/no-such-model is a Hub id that is not in",
        ),
        (["--smoke", "--LORA_TARGET_MODULES=no_such_proj"], "no_such_proj matches no layer"),
    ],
)
def test_cli_errors_found_by_loading_exit_2_without_traceback(args, message, tmp_path):
    # these need the model's config or the process group: a fresh Python, as a user runs it
    out = train(tmp_path, *args, profile=None)
    assert out.returncode == 2
    assert message in out.stderr and "Traceback" not in out.stderr
    # nothing written: the LoRA targets are checked on the smoke model's config before it is built
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_trl_users_command_line_trains(tmp_path, tiny_model):
    # what `trl grpo` users type: their flag names, `--key value`, and fields the script also sets, all at once
    args = ["--model_name_or_path", tiny_model, "--learning_rate", "1e-5", "--max_steps", "2", "--use_peft"]
    args += ["--log_completions=false", "--num_completions_to_print=2", "--ddp_find_unused_parameters=true"]
    args += ['--model_init_kwargs={"revision": "main"}']
    out = train(tmp_path / "run", "--smoke", *args, profile=None)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in ("--model_name_or_path is MODEL_NAME here", "--learning_rate is LEARNING_RATE here"):
        assert line in out.stderr
    assert (tmp_path / "run" / "checkpoint-2").is_dir() and not (tmp_path / "run" / "smoke-model").exists()
    assert not (tmp_path / "run" / "completions").exists()  # --log_completions=false was honoured


def test_missing_test_split_fails_before_training(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text((REPO / "data" / "smoke_gsm8k.jsonl").read_text())
    out_dir = tmp_path / "out"
    out = train(out_dir, f"--DATASET={data}", "--EVAL_AFTER=2")
    # EVAL_AFTER needs test.jsonl: found missing before any weights load, not after the whole training
    assert out.returncode == 2 and "test.jsonl, which does not exist" in out.stderr
    assert not out_dir.exists()


def test_a_python_without_the_packages_gets_the_command_that_fixes_it(tmp_path):
    # the system python of a fresh machine has no trl: a clear message and exit 2, not a ModuleNotFoundError
    code = "from grpo import process; process.run(lambda argv: process.require(['no_such_package_xyz'], 'x.py'))"
    out = run_script("-c", code)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "lacks no_such_package_xyz" in out.stderr and "make install" in out.stderr


def test_logging_prints_each_library_message_once():
    # huggingface_hub attaches its own handler; configuring the root logger as well printed each Hub retry twice
    code = (
        "import logging, huggingface_hub.utils.logging as h; from grpo import process; "
        "process.setup_logging('grpotrainer'); "
        "h.get_logger('huggingface_hub.test').warning('retrying in 1s'); logging.getLogger('grpotrainer.x').info('hi')"
    )
    out = run_script("-c", code)
    assert out.stderr.count("retrying in 1s") == 1
    assert "[grpotrainer] hi" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a real GPU would start a real run")
def test_a_real_run_on_a_host_with_driver_550_exits_2_naming_it(tmp_path):
    bin_dir = stand_in_nvidia_smi(tmp_path, "550.54.15")
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    out = run_script("grpotrainer.py", f"--OUTPUT_DIR={tmp_path / 'run'}", env={"PATH": path}, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "driver 550.54.15" in out.stderr and "torch 2" in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_run_carries_the_paired_test_in_its_files_curve_text_card_and_last_line(smoke_run):
    out = smoke_run.out  # EVAL_BEFORE=8, EVAL_AFTER=8, EVAL_STEPS=2 on EVAL_SUBSET=4, EVAL_SAMPLES=2
    before, after = (json.loads((out / f"eval_test_{when}.json").read_text()) for when in ("before", "after"))
    for label in ("strict", "lenient"):
        test, accuracy = after["paired"][label], f"{label}_accuracy"
        # on the same 8 problems the flips are the change in accuracy, and the p-value is their exact test
        assert test["n"] == 8 and test["up"] - test["down"] == round((after[accuracy] - before[accuracy]) * 8)
        assert test["p_value"] == stats.mcnemar_exact(test["up"], test["down"])
    sampled = after["paired"]["sampled"]  # 2 samples per problem in both: the sign test on each problem's count
    assert (sampled["samples"], sampled["n"]) == (2, 8) and sampled["p_value"] == stats.mcnemar_exact(
        sampled["up"], sampled["down"]
    )
    assert sampled["difference"] == pytest.approx(after["sampled_accuracy"] - before["sampled_accuracy"], abs=1e-3)
    # every evaluation carries its intervals, pass@k for k = 1..EVAL_SAMPLES and lm-eval's figures
    for metrics in (before, after):
        assert metrics["pass_at_k"]["1"] == pytest.approx(metrics["sampled_accuracy"], abs=1e-4)
        assert set(metrics["pass_at_k"]) == {"1", "2"}
        assert {"lm_eval_strict_match_ci95", "lenient_accuracy_ci95", "sampled_accuracy_ci95"} <= set(metrics)
    # the held-out points (steps 2 and 4, the first 4 problems) pair with the first 4 of EVAL_BEFORE's 8; before not
    points = [json.loads(line) for line in (out / "eval_test.jsonl").read_text().splitlines()]
    paired = [
        (p["when"], p["metrics"]["paired"]["lenient"]["n"] if "paired" in p["metrics"] else None) for p in points
    ]
    assert paired == [("before", None), ("during", 4), ("during", 4), ("after", 8)]
    summary = smoke_run.result.stderr.strip().splitlines()[-2]  # the last line is --smoke's own
    assert f"sampled {evaluation.pair_text(sampled)}" in summary
    assert "paired exact test (8 test problems)" in summary
    assert f"{after['paired']['lenient']['down']} down, p = " in summary
    card = (out / "README.md").read_text()
    assert "model-index:" in card and "- lenient: " in card
    (run,) = event_dirs(out)
    assert [step for step, _ in read_texts(run)["eval/paired"]] == [2, 4, 6]  # TensorBoard's Text tab, each point


# ---------------------------------------------------------------------------------------------------------------
# every signal in every tracker: W&B offline and trackio local, read back from their own files


def wandb_records(path):
    """The records of an offline W&B run file (run-<id>.wandb): LevelDB's log format (32 KiB blocks of chunks, each
    with a 7-byte header: CRC, length, type FULL/FIRST/MIDDLE/LAST) after a 7-byte file header, each record one
    wandb_internal_pb2.Record. wandb 0.31 has no Python reader: its Go core writes and syncs these files."""
    import struct

    from wandb.proto import wandb_internal_pb2

    data, block = Path(path).read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, record = 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        record = data[pos + 7 : pos + 7 + length] if kind in (1, 2) else record + data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a whole record
            yield wandb_internal_pb2.Record.FromString(record)


def wandb_logged(folder):
    """([(train/global_step, {key: value})] of each history record, [(title, text)] of each alert) of the one offline
    W&B run under `folder`. A text (wandb.Html) is logged as a dict naming its file."""
    (run_file,) = folder.glob("wandb/offline-run-*/run-*.wandb")
    rows, alerts = [], []
    for record in wandb_records(run_file):
        if record.HasField("history"):
            # a key with a slash is stored split in nested_key; an Html's fields as "<tag>/<field>"
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            texts = {key.removesuffix("/_type") for key in items if key.endswith("/_type")}
            items = {key: value for key, value in items.items() if not key.startswith(tuple(texts))}
            rows.append((items.get("train/global_step"), {**items, **dict.fromkeys(texts, "text")}))
        elif record.HasField("alert"):
            alerts.append((record.alert.title, record.alert.text))
    return rows, alerts


def trackio_logged(folder):
    """The same from trackio's local database, through its own reader, in a Python that reads TRACKIO_DIR (trackio
    reads it once, at import), each row at trackio's own step; each alert with its step. Project "huggingface":
    TrainingArguments.project's default."""
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; (run,) = S.get_runs('huggingface'); "
        "print(json.dumps([S.get_logs('huggingface', run), S.get_alerts('huggingface', run)], default=str))"
    )
    read = run_script("-c", code, env={"TRACKIO_DIR": str(folder)})
    assert read.returncode == 0, read.stderr[-2000:]
    rows, alerts = json.loads(read.stdout)
    return [(row["step"], row) for row in rows], [(alert["title"], alert["text"], alert["step"]) for alert in alerts]


TRACKERS = {"wandb": wandb_logged, "trackio": trackio_logged}


def at_steps(rows, tag):
    return [step for step, row in rows if tag in row]


@pytest.mark.slow
@pytest.mark.parametrize("tracker", sorted(TRACKERS))
def test_held_out_points_pace_texts_and_advice_reach_the_tracker_at_the_trainers_step(smoke_run, tracker):
    pytest.importorskip(tracker, reason=f"{tracker} is optional: pip install -r requirements-trackers.txt")
    rows, alerts = TRACKERS[tracker](smoke_run.trackers)
    # before at step 0, EVAL_STEPS at 2 and 4, after at the last step (6): each once, as eval_test.jsonl keeps them
    kept = [json.loads(line) for line in (smoke_run.out / "eval_test.jsonl").read_text().splitlines()]
    assert at_steps(rows, "eval/gsm8k_lenient_accuracy") == [row["step"] for row in kept] == [0, 2, 4, 6]
    points = {step: row for step, row in rows if "eval/gsm8k_lenient_accuracy" in row}
    for row in kept:
        scores = {key: value for key, value in points[row["step"]].items() if key.startswith("eval/gsm8k_")}
        assert scores["eval/gsm8k_lenient_accuracy"] == row["metrics"]["lenient_accuracy"]
        # strict, lenient, sampled, sampled strict and format, each accuracy with its interval's ends
        tags = list(gsm8k.SCALARS.values())
        tags += [tag + end for key, tag in gsm8k.SCALARS.items() if key + gsm8k.INTERVAL in row["metrics"]
                 for end in ("_ci95_low", "_ci95_high")]  # fmt: skip
        assert set(scores) == set(tags)
    # the paired test beside each point after the baseline; the pace once two steps after the first (its warm-up)
    # are measured, then each tenth of the run: here each step
    assert at_steps(rows, "eval/paired") == [2, 4, 6]
    for tag in ("perf/seconds_per_step", "perf/generation_share"):
        assert at_steps(rows, tag) == [3, 4, 5, 6], tag
    # the texts TensorBoard shows in its Text tab, at the same steps: a completions table each step, advice at 1
    (run,) = event_dirs(smoke_run.out)
    texts = read_texts(run)
    for tag in ("completions/samples", "health/advice"):
        assert at_steps(rows, tag) == [step for step, _ in texts[tag]], tag
    # every group of the random model ties: zero_std's warning is an alert; the clipped note (--smoke sets the
    # length on purpose) asks for nothing, so it is none
    assert [alert[0] for alert in alerts] == ["warn zero_std"] and "ZERO_STD_LOGS=1" in alerts[0][1]
    if tracker == "trackio":  # trackio keeps the step an alert came at: the trainer's, as TensorBoard's advice
        assert [alert[2] for alert in alerts] == [texts["health/advice"][0][0]] == [1]
