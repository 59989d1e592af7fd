"""bench/real_step.py: its CPU-time split attributes each second once, and its ratios are per completion.

.venv/bin/python -m pytest tests/test_real_step.py -q     # seconds; the benchmark itself: docs/real-model.md
"""

import pytest

from bench import real_step


class FakeClock:
    """time.process_time that moves only when told: each method below spends exact seconds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_split_counts_each_second_once_in_the_innermost_method(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(real_step.time, "process_time", clock)

    class Trainer:
        def score(self):  # 1 s of its own around a 3 s generation and a 2 s forward
            clock.now += 1
            self.generate()
            self.forward()

        def generate(self):
            clock.now += 3

        def forward(self):
            clock.now += 2

    split = real_step.Split()
    split.wrap(Trainer, "score", "rest")
    split.wrap(Trainer, "generate", "generation")
    split.wrap(Trainer, "forward", lambda s: "reference forward" if s.scoring else "policy forward")
    split.scoring = True
    Trainer().score()
    split.scoring = False
    Trainer().forward()  # outside scoring: the policy's forward
    assert dict(split.seconds) == {"rest": 1, "generation": 3, "reference forward": 2, "policy forward": 2}
    assert split.stack == []


def test_summarize_gives_ratios_per_completion_against_the_mean_baseline():
    def run(train_cpu, completions, split):
        return {"train_cpu_s": train_cpu, "steps": 2, "completions_per_step": completions, "split_s": split}

    runs = [
        ("baseline", run(100.0, 8, {"generation": 60.0, "backward": 40.0})),
        ("beta0", run(80.0, 8, {"generation": 60.0, "backward": 20.0})),
        ("real", run(240.0, 32, {"generation": 200.0, "backward": 40.0})),  # 4x the completions
        ("baseline", run(120.0, 8, {"generation": 60.0, "backward": 60.0})),
    ]
    rows, shares = real_step.summarize(runs)
    # baseline per completion: (100 + 120) / 2 / 16 = 6.875 s; beta0 80 / 16 = 5; real 240 / 64 = 3.75
    assert [(r["lever"], r["ratio"]) for r in rows] == [
        ("baseline", pytest.approx(0.91, abs=0.005)),
        ("beta0", pytest.approx(0.73, abs=0.005)),
        ("real", pytest.approx(0.55, abs=0.005)),
        ("baseline", pytest.approx(1.09, abs=0.005)),
    ]
    assert shares == {
        "generation": pytest.approx(120 / 220, abs=0.001),
        "backward": pytest.approx(100 / 220, abs=0.001),
    }


def test_each_run_of_a_pass_has_its_own_folder(monkeypatch, tmp_path):
    # the closing baseline once reused the first one's OUTPUT_DIR, found its run finished, and measured nothing
    from demo import real

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    monkeypatch.setattr(real, "MODEL", str(tmp_path / "model"))
    monkeypatch.setattr(real_step.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "work"))
    labels = []

    def fake_run(name, model, task, work, python, label=None):
        labels.append(label)
        split = {"generation": 8.0}
        return {
            "train_cpu_s": 8.0,
            "cpu_s": 9,
            "max_rss_mib": 1,
            "wall_s": 9,
            "steps": 2,
            "completions_per_step": 4,
            "split_s": split,
        }

    monkeypatch.setattr(real_step, "run_lever", fake_run)
    monkeypatch.setattr(real_step, "print", lambda *a, **k: None, raising=False)
    assert real_step.main(["--levers", "baseline,bf16"]) == 0
    assert labels == ["0-baseline", "1-bf16", "2-baseline"] and len(set(labels)) == 3
