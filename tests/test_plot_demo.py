"""bench/plot_demo.py: it reads the demo runs' files, picks each training run's own TensorBoard folder, and never
replaces a picture it was not asked to.

    .venv/bin/python -m pytest tests/test_plot_demo.py -q     # seconds
"""

import json
import os
import sys

import pytest

from bench import plot_demo

PNG = b"\x89PNG\r\n\x1a\n"


def write_events(folder, scalars, mtime):
    """A TensorBoard run folder holding `scalars` ({tag: [(step, value)]}), its modification time set to `mtime`."""
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(log_dir=str(folder)) as writer:
        for tag, points in scalars.items():
            for step, value in points:
                writer.add_scalar(tag, value, step)
    os.utime(folder, (mtime, mtime))


def write_demo_run(out, seed):
    """A finished demo OUTPUT_DIR: the two evaluations with predictions, the training run and a later evaluate.py
    run (newer, eval/* only), as grpotrainer.py --demo and then evaluate.py leave it."""
    predictions = {"before": ["#### 1", "#### 2"], "after": ["1+1\n#### 2", "1+1\n#### 2"]}
    for when, completions in predictions.items():
        metrics = {"lenient_accuracy": 0.5, "sampled_accuracy": 0.4, "mean_completion_tokens": 6.0}
        record = {**metrics, "step": 0 if when == "before" else 3, "settings": {"SEED": seed}}
        (out / f"eval_test_{when}.json").write_text(json.dumps(record))
        lines = [json.dumps({"completion": c, "correct": c.endswith("2")}) for c in completions]
        (out / f"eval_test_{when}_predictions.jsonl").write_text("\n".join(lines) + "\n")
    reward = [(1, 0.2), (2, 0.5), (3, 0.9)]
    write_events(out / "runs" / "train", {plot_demo.REWARD: reward, plot_demo.CORRECTNESS: reward}, mtime=1_000)
    write_events(out / "runs" / "eval", {"eval/gsm8k_lenient_accuracy": [(3, 0.5)]}, mtime=2_000)


def test_the_training_run_folder_is_picked_not_a_newer_evaluation(tmp_path):
    write_demo_run(tmp_path, seed=0)
    # runs/eval is newer but holds no train/reward: an evaluate.py run after training
    assert plot_demo.run_folder(tmp_path) == tmp_path / "runs" / "train"
    assert plot_demo.run_folder(tmp_path / "runs" / "eval") == tmp_path / "runs" / "eval"  # a folder given: itself


def test_a_folder_without_a_training_run_is_named(tmp_path):
    (tmp_path / "runs").mkdir()
    with pytest.raises(SystemExit, match="no TensorBoard run with train/reward"):
        plot_demo.run_folder(tmp_path)


def test_before_after_reads_the_styles_from_the_predictions(tmp_path):
    write_demo_run(tmp_path, seed=0)
    # before: both answers one-shot (one right), after: both worked (both right)
    assert plot_demo.before_after(tmp_path) == {
        "lenient_accuracy": (0.5, 0.5),
        "sampled_accuracy": (0.4, 0.4),
        "worked_share": (0.0, 1.0),
        "mean_completion_tokens": (6.0, 6.0),
    }


def test_plot_writes_a_png_for_several_seeds(tmp_path):
    runs = []
    for seed in (0, 1):
        runs.append(tmp_path / f"s{seed}")
        runs[-1].mkdir()
        write_demo_run(runs[-1], seed)
    out = tmp_path / "demo.png"
    plot_demo.main([*map(str, runs), "--out", str(out)])
    assert out.read_bytes().startswith(PNG)


def test_an_existing_picture_is_kept_unless_overwrite_is_asked(tmp_path):
    write_demo_run(tmp_path, seed=0)
    out = tmp_path / "demo.png"
    out.write_bytes(b"tracked")
    with pytest.raises(SystemExit, match="pass --overwrite to replace it"):
        plot_demo.main([str(tmp_path), "--out", str(out)])
    assert out.read_bytes() == b"tracked"  # untouched
    plot_demo.main([str(tmp_path), "--out", str(out), "--overwrite"])
    assert out.read_bytes().startswith(PNG)  # asked: replaced


def test_a_missing_matplotlib_is_named_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(SystemExit, match="needs matplotlib: pip install -r requirements-dev.txt"):
        plot_demo.plot({}, tmp_path / "demo.png")
    assert not (tmp_path / "demo.png").exists()


def test_a_run_without_its_evaluations_is_named(tmp_path):
    with pytest.raises(SystemExit, match="has no eval_test_before.json"):
        plot_demo.main([str(tmp_path), "--out", str(tmp_path / "x.png")])
