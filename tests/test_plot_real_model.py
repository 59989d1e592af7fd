"""bench/plot_real_model.py: it draws `--real` runs from their files and never replaces a picture unasked.

.venv/bin/python -m pytest tests/test_plot_real_model.py -q     # seconds
"""

import json

from conftest import run_script
from test_plot_demo import PNG, write_events

from bench import plot_real_model


def write_real_run(out, seed):
    """A finished --real OUTPUT_DIR as grpotrainer.py leaves it: settings, the evaluation points, the training run."""
    out.mkdir(parents=True)
    (out / "run_settings.json").write_text(json.dumps({"SEED": seed}))
    points = [(0, "before", 0.25, 0.125), (4, "after", 0.5, 0.375)]
    lines = [
        json.dumps({"step": step, "when": when, "metrics": {"n": 8, "lenient_accuracy": acc, "sampled_accuracy": s}})
        for step, when, acc, s in points
    ]
    (out / "eval_test.jsonl").write_text("\n".join(lines) + "\n")
    curve = {
        plot_real_model.REWARD: [(1, 0.3), (2, 0.4), (3, 0.6), (4, 0.7)],
        plot_real_model.CORRECTNESS: [(1, 0.2), (2, 0.3), (3, 0.5), (4, 0.6)],
        plot_real_model.KL: [(1, 0.0), (2, 0.01), (3, 0.02), (4, 0.03)],
        plot_real_model.LENGTH: [(1, 40.0), (2, 35.0), (3, 30.0), (4, 28.0)],
        plot_real_model.CLIPPED: [(1, 0.5), (2, 0.3), (3, 0.2), (4, 0.1)],
    }
    write_events(out / "runs" / "train", curve, mtime=1_000)


def test_eval_points_carry_the_wilson_interval_of_greedy_accuracy(tmp_path):
    write_real_run(tmp_path / "run", seed=0)
    (before, after) = plot_real_model.eval_points(tmp_path / "run")
    # 2 of 8 right: Wilson 95 % (0.0715, 0.5907); 4 of 8: (0.2152, 0.7848), by the formula in grpo/stats.py
    assert before[0] == 0 and before[1] == 0.25 and [round(b, 4) for b in before[2]] == [0.0715, 0.5907]
    assert after[0] == 4 and [round(b, 4) for b in after[2]] == [0.2152, 0.7848] and after[3] == 0.375


def test_the_plot_script_draws_several_seeds_and_keeps_an_existing_picture(tmp_path):
    for seed in (0, 1):
        write_real_run(tmp_path / f"s{seed}", seed)
    out = tmp_path / "real.png"
    proc = run_script("bench/plot_real_model.py", str(tmp_path / "s0"), str(tmp_path / "s1"), f"--out={out}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.read_bytes().startswith(PNG)
    again = run_script("bench/plot_real_model.py", str(tmp_path / "s0"), f"--out={out}")
    assert again.returncode != 0 and "--overwrite" in again.stderr  # the picture drawn above is not replaced


def test_the_table_reads_each_runs_before_and_after_files(tmp_path):
    write_real_run(tmp_path / "s0", seed=0)
    interval = {"lenient_accuracy_ci95": [0.0715, 0.5907], "strict_accuracy_ci95": [0.0, 0.3244]}
    before = {"n": 8, "strict_accuracy": 0.0, "lenient_accuracy": 0.25, "padded_rate": 0.5, **interval}
    after = {**before, "lenient_accuracy": 0.75, "lenient_accuracy_ci95": [0.4093, 0.9286], "padded_rate": 0.0}
    after["paired"] = {"lenient": {"up": 4, "down": 0, "p_value": 0.125}}
    for when, metrics in (("before", before), ("after", after)):
        (tmp_path / "s0" / f"eval_test_{when}.json").write_text(json.dumps(metrics))
    proc = run_script("bench/plot_real_model.py", str(tmp_path / "s0"), "--table")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = proc.stdout.splitlines()
    assert "| SEED 0 | lenient | 0.250 [0.071, 0.591] | 0.750 [0.409, 0.929] | 4 / 0 | 0.12 | 8 |" in rows
    assert "| SEED 0 | sampled | - | - | - | - | 8 |" in rows  # not scored: a dash, not a number
    assert "| SEED 0 | padded (share) | 0.5 | 0.0 | | | |" in rows
    assert not (tmp_path / "real-model.png").exists()


def test_the_third_panel_draws_entropy_where_no_run_logged_a_kl():
    with_kl = {"a": ({plot_real_model.KL: [(1, 0.0)], plot_real_model.ENTROPY: [(1, 0.5)]}, [])}
    without = {"a": ({plot_real_model.ENTROPY: [(1, 0.5)]}, [])}  # BETA 0: TRL logs no KL
    assert plot_real_model.third_panel(with_kl)[0] == plot_real_model.KL
    assert plot_real_model.third_panel(without)[0] == plot_real_model.ENTROPY
