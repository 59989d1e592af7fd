"""End to end, fast: `grpotrainer.py` in a subprocess for --help, mistakes, logging and import weight; slow: the
held-out points and the advice in W&B (offline) and trackio (local), read back from their own files (skipped
without requirements-trackers.txt).

.venv/bin/python -m pytest tests/test_e2e_train.py -q -m "not slow"
.venv/bin/python -m pytest tests/test_e2e_train.py -q -m slow -k tracker    # ~2 min per tracker on 2 busy cores
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, event_dirs, read_scalars, read_texts, run_script, stand_in_nvidia_smi, train

import grpotrainer
from grpo import cli, gsm8k, stats

# ---------------------------------------------------------------------------------------------------------------
# arguments read and checked before torch, transformers or TRL


@pytest.mark.parametrize(
    ("script", "args", "message"),
    [
        ("evaluate.py", ["--ADAPTER=/nonexistent"], "ADAPTER=/nonexistent holds no LoRA adapter"),
        ("export.py", ["--ADAPTER=/nonexistent"], "ADAPTER='/nonexistent' holds no LoRA adapter"),
        ("evaluate.py", ["--LIMIT=-1"], "LIMIT=-1 must be at least 0"),
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
    assert f"MAX_STEPS={smoke.SMOKE['MAX_STEPS']}" in out.stdout.split("--smoke sets")[1]  # the profile's


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
    out = run_script(
        "-c", "from grpo import cli; process.run(lambda argv: process.require(['no_such_package_xyz'], 'grpotrainer.py'))"
    )
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "lacks no_such_package_xyz" in out.stderr and "make install" in out.stderr


def test_logging_prints_each_library_message_once():
    # huggingface_hub attaches its own handler; configuring the root logger as well printed each Hub retry twice
    code = (
        "import logging, huggingface_hub.utils.logging as h; from grpo import cli; process.setup_logging('grpotrainer'); "
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
def test_a_run_carries_the_paired_test_in_its_files_curve_text_card_and_last_line(tmp_path):
    args = ["--MAX_STEPS=2", "--EVAL_BEFORE=8", "--EVAL_AFTER=8", "--EVAL_STEPS=1", "--EVAL_SUBSET=4"]
    out = train(tmp_path, *args, "--EVAL_SAMPLES=2")
    assert out.returncode == 0, out.stderr[-3000:]
    before, after = (json.loads((tmp_path / f"eval_test_{when}.json").read_text()) for when in ("before", "after"))
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
    # the held-out point (step 1, the first 4 problems) pairs with the first 4 of EVAL_BEFORE's 8; before does not
    points = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    paired = [
        (p["when"], p["metrics"]["paired"]["lenient"]["n"] if "paired" in p["metrics"] else None) for p in points
    ]
    assert paired == [("before", None), ("during", 4), ("after", 8)]
    last = out.stderr.strip().splitlines()[-1]
    assert f"sampled {evaluation.pair_text(sampled)}" in last
    assert "paired exact test (8 test problems)" in last and f"{after['paired']['lenient']['down']} down, p = " in last
    card = (tmp_path / "README.md").read_text()
    assert "model-index:" in card and "- lenient: " in card
    (run,) = event_dirs(tmp_path)
    assert [step for step, _ in read_texts(run)["eval/paired"]] == [1, 2]  # TensorBoard's Text tab, each point


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


def wandb_points_and_alerts(tmp_path):
    """{train/global_step: {eval/... tag: value}} and [(title, text)] of the one offline run under tmp_path."""
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    points, alerts = {}, []
    for record in wandb_records(run_file):
        if record.HasField("history"):
            # a key with a slash is stored split in nested_key
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            scores = {key: value for key, value in items.items() if key.startswith("eval/")}
            if scores:
                points.setdefault(items["train/global_step"], []).append(scores)
        elif record.HasField("alert"):
            alerts.append((record.alert.title, record.alert.text))
    return points, alerts


def trackio_points_and_alerts(tmp_path):
    """The same from trackio's local database, through its own reader, in a Python that reads TRACKIO_DIR (trackio
    reads it once, at import). Project "huggingface": TrainingArguments.project's default."""
    code = (
        "import json; from trackio.sqlite_storage import SQLiteStorage as S; (run,) = S.get_runs('huggingface'); "
        "print(json.dumps([S.get_logs('huggingface', run), S.get_alerts('huggingface', run)], default=str))"
    )
    read = run_script("-c", code, env={"TRACKIO_DIR": str(tmp_path)})
    assert read.returncode == 0, read.stderr[-2000:]
    rows, alerts = json.loads(read.stdout)
    points = {}
    for row in rows:
        scores = {key: value for key, value in row.items() if key.startswith("eval/")}
        if scores:  # trackio's own step counts its log calls; the trainer's step is logged beside
            points.setdefault(row["train/global_step"], []).append(scores)
    return points, [(alert["title"], alert["text"]) for alert in alerts]


@pytest.mark.slow
@pytest.mark.parametrize("tracker", ["wandb", "trackio"])
def test_held_out_accuracy_and_advice_reach_the_tracker(tmp_path, tracker):
    pytest.importorskip(tracker, reason=f"{tracker} is optional: pip install -r requirements-trackers.txt")
    folders = ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR", "TRACKIO_DIR")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", **{name: str(tmp_path) for name in folders}}
    args = ["--MAX_STEPS=6", "--EVAL_STEPS=2", "--EVAL_BEFORE=8", "--EVAL_AFTER=8", "--EVAL_SUBSET=8"]
    out = train(tmp_path / "out", f"--REPORT_TO={tracker}", *args, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    points, alerts = {"wandb": wandb_points_and_alerts, "trackio": trackio_points_and_alerts}[tracker](tmp_path)
    # before at step 0, EVAL_STEPS at 2 and 4, after at the last step (6): each once, as eval_test.jsonl keeps them
    kept = [json.loads(line) for line in (tmp_path / "out" / "eval_test.jsonl").read_text().splitlines()]
    assert [(row["step"], row["when"]) for row in kept] == [(0, "before"), (2, "during"), (4, "during"), (6, "after")]
    assert sorted(points) == [0, 2, 4, 6] and all(len(scores) == 1 for scores in points.values())
    for row in kept:
        (scores,) = points[row["step"]]
        assert scores["eval/gsm8k_lenient_accuracy"] == row["metrics"]["lenient_accuracy"]
        assert set(scores) == set(gsm8k.SCALARS.values())  # strict, lenient, sampled, sampled strict, format
    # --smoke's 32-token limit cuts most completions of the random model: the clipped advice, as an alert
    assert any(title == "warn clipped" and "MAX_COMPLETION_LENGTH" in text for title, text in alerts), alerts


@pytest.mark.slow
def test_a_run_cut_after_its_last_checkpoint_logs_eval_after_into_its_own_folder(tmp_path):
    first = train(tmp_path, "--MAX_STEPS=2")
    assert first.returncode == 0, first.stderr[-3000:]
    (tmp_path / "run_finished.json").unlink()  # as if killed after the last checkpoint, before the end
    again = train(tmp_path, "--MAX_STEPS=2", "--EVAL_AFTER=4")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already holds the last step" in again.stderr  # finished from the checkpoint, outside train()
    kept = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [(row["step"], row["when"]) for row in kept] == [(2, "after")]
    # TensorBoard's folder is fixed in OUTPUT_DIR/runs even though no training began (not ./runs in the cwd)
    newest = event_dirs(tmp_path)[-1]
    assert [step for step, _ in read_scalars(newest)["eval/gsm8k_strict_accuracy"]] == [2]
