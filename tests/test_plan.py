"""Tests of grpo/plan.py: the step count against a real GRPOTrainer, and the plan's arithmetic by hand.

OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q tests/test_plan.py --doctest-modules grpo/plan.py
"""

import json

import pytest

import grpotrainer
from grpo import cli, gsm8k, plan
from grpo.settings import config_kwargs

# the issue's old defaults, and the smallest settings make_plan reads
BASE = dict(
    MODEL_NAME="Qwen/Qwen3-8B",
    NUM_GENERATIONS=4,
    PER_DEVICE_TRAIN_BATCH_SIZE=1,
    GRADIENT_ACCUMULATION_STEPS=8,
    STEPS_PER_GENERATION=0,
    NUM_ITERATIONS=1,
    MAX_STEPS=-1,
    NUM_TRAIN_EPOCHS=3,
    MAX_SAMPLES=0,
    SAVE_STEPS=50,
    EVAL_BEFORE=0,
    EVAL_AFTER=0,
    EVAL_STEPS=-1,
    EVAL_SUBSET=64,
    EVAL_SAMPLES=4,
    EVAL_BATCH_SIZE=128,
    MAX_COMPLETION_LENGTH=256,
    BETA=0.05,
    USE_VLLM=False,
    LORA_R=16,
)
QWEN3_8B = dict(
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=151936,
    head_dim=128,
    tie_word_embeddings=False,
)

# (settings over BASE) for the comparison with TRL: epochs, group, batch, accumulation, rounds, reuse, a cap
CASES = [
    dict(NUM_TRAIN_EPOCHS=1),
    dict(NUM_TRAIN_EPOCHS=2),
    dict(NUM_TRAIN_EPOCHS=1.5, NUM_GENERATIONS=2, GRADIENT_ACCUMULATION_STEPS=3, STEPS_PER_GENERATION=2),
    dict(NUM_TRAIN_EPOCHS=1, PER_DEVICE_TRAIN_BATCH_SIZE=4, GRADIENT_ACCUMULATION_STEPS=2, STEPS_PER_GENERATION=4),
    dict(NUM_TRAIN_EPOCHS=1, NUM_GENERATIONS=8, PER_DEVICE_TRAIN_BATCH_SIZE=2, GRADIENT_ACCUMULATION_STEPS=4),
    dict(NUM_TRAIN_EPOCHS=2, NUM_ITERATIONS=2, NUM_GENERATIONS=2, GRADIENT_ACCUMULATION_STEPS=2),
    dict(
        NUM_TRAIN_EPOCHS=1,
        MAX_SAMPLES=10,
        PER_DEVICE_TRAIN_BATCH_SIZE=2,
        GRADIENT_ACCUMULATION_STEPS=4,
        STEPS_PER_GENERATION=6,
    ),
    dict(MAX_STEPS=5),
]


def config_of(s):
    """The GRPOConfig of the settings `s`, each constant in its field as build_config sets it (TRL fills
    steps_per_generation); the plan reads it."""
    from trl import GRPOConfig

    return GRPOConfig(**{"output_dir": "unused", **config_kwargs(s), "use_cpu": True, "report_to": []})


def make_plan(s, *args, **kwargs):
    return plan.make_plan(config_of(s), s, *args, **kwargs)


def for_run(s, datasets):
    return plan.for_run(s, config_of(s), datasets, world_size=1)


@pytest.fixture(scope="module")
def tiny(tiny_model):
    """The tiny random Qwen3 folder (conftest's, one thread) and the 32 fixture problems."""
    return tiny_model, gsm8k.load(str(gsm8k.FIXTURE), "train")


def zero_reward(completions, **kwargs):
    return [0.0] * len(completions)


@pytest.fixture
def no_telemetry(monkeypatch):
    """TRL's trainers send telemetry from a thread of their own unless huggingface_hub, which read the environment
    at import, is told not to: no network, and no thread left behind."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)


def trainer_for(s, model, data, output_dir):
    from trl import GRPOConfig, GRPOTrainer

    if s["MAX_SAMPLES"]:
        data = data.select(range(s["MAX_SAMPLES"]))
    config = GRPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        report_to="none",
        num_generations=s["NUM_GENERATIONS"],
        per_device_train_batch_size=s["PER_DEVICE_TRAIN_BATCH_SIZE"],
        gradient_accumulation_steps=s["GRADIENT_ACCUMULATION_STEPS"],
        steps_per_generation=s["STEPS_PER_GENERATION"] or None,
        num_iterations=s["NUM_ITERATIONS"],
        max_steps=s["MAX_STEPS"],
        num_train_epochs=s["NUM_TRAIN_EPOCHS"],
        max_completion_length=8,
        save_strategy="no",
        beta=0.0,
    )
    return GRPOTrainer(model=model, reward_funcs=zero_reward, args=config, train_dataset=data)


@pytest.mark.parametrize("case", CASES)
def test_optimizer_steps_match_trainers_own_computation(case, tiny, tmp_path, no_telemetry):
    model, data = tiny
    s = {**BASE, **case}
    trainer = trainer_for(s, model, data, tmp_path)
    # transformers' Trainer.train derives state.max_steps through this public method from TRL's dataloader
    max_steps = trainer.set_initial_training_values(trainer.args, trainer.get_train_dataloader())[-1]
    assert make_plan(s, train_size=len(data), test_size=0)["optimizer_steps"] == max_steps


def test_optimizer_steps_match_a_real_run(tiny, tmp_path, no_telemetry):
    from transformers import TrainerCallback

    class StopAtFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = True

    model, data = tiny
    s = {
        **BASE,
        "NUM_TRAIN_EPOCHS": 2,
        "NUM_GENERATIONS": 2,
        "GRADIENT_ACCUMULATION_STEPS": 3,
        "STEPS_PER_GENERATION": 2,
    }
    trainer = trainer_for(s, model, data, tmp_path)
    trainer.add_callback(StopAtFirstStep())
    trainer.train()
    # the run stopped after one step, yet state.max_steps holds the whole run's length
    assert trainer.state.global_step == 1
    assert make_plan(s, train_size=len(data), test_size=0)["optimizer_steps"] == trainer.state.max_steps


def test_the_issues_old_defaults():
    p = make_plan(BASE, train_size=7473, test_size=1319)
    # 7,473 // 2 prompts per round = 3,736 rounds of 8 micro-batches, one optimiser step each, x 3 epochs
    assert p["optimizer_steps"] == 11208
    assert (p["completions_per_step"], p["prompts_per_step"], p["group_size"]) == (8, 2, 4)
    assert p["generation_calls"] == 11208 and p["sequences_per_generation_call"] == 8
    # the odd problem of 7,473 never makes a full chunk
    assert p["epochs_covered"] == pytest.approx(3 * 7472 / 7473, abs=1e-3)
    # EVAL_AFTER=0: nothing scores the final adapter, and the last held-out point is 10,089
    assert p["final_eval_problems"] == 0 and p["final_eval_stderr"] is None
    assert p["eval_points"][-1] == {"step": 10089, "problems": 64, "kind": "held-out"}


def test_max_steps_and_group_change_the_plan():
    p = make_plan({**BASE, "MAX_STEPS": 10, "NUM_GENERATIONS": 8, "PER_DEVICE_TRAIN_BATCH_SIZE": 2}, 7473, 1319)
    assert (p["optimizer_steps"], p["group_size"], p["completions_per_step"], p["prompts_per_step"]) == (10, 8, 16, 2)
    # 10 steps x 2 prompts of 7,473
    assert p["epochs_covered"] == pytest.approx(20 / 7473, abs=1e-3)


def test_world_size_and_reuse():
    s = {**BASE, "NUM_ITERATIONS": 2, "STEPS_PER_GENERATION": 4, "GRADIENT_ACCUMULATION_STEPS": 4, "MAX_STEPS": 100}
    p = make_plan(s, 7473, 1319, world_size=2)
    # 2 processes x 1 x 4 micro-batches; a round of 4 micro-batches serves 2 optimiser steps
    assert p["completions_per_step"] == 8 and p["generation_calls"] == 50
    assert p["new_prompts_per_step"] == 1


def test_duration():
    assert (plan.duration(3661), plan.duration(725), plan.duration(42.4)) == ("1h01m", "12m05s", "42s")


@pytest.mark.parametrize(("n", "p", "expected"), [(1319, 0.5, 1.38), (64, 0.5, 6.25), (100, 0.9, 3.0)])
def test_stderr_in_points(n, p, expected):
    assert plan.stderr_points(n, p) == pytest.approx(expected, abs=0.005)


def test_eval_points_each_tenth_and_final_capped_at_the_test_split():
    s = {**BASE, "MAX_STEPS": 95, "EVAL_BEFORE": 50, "EVAL_AFTER": 5000, "EVAL_SUBSET": 200}
    p = make_plan(s, 7473, test_size=1319)
    # round(95 / 10) = 10: steps 10..90; step 95 is left to EVAL_AFTER; EVAL_AFTER capped at 1,319
    assert [(e["step"], e["problems"], e["kind"]) for e in p["eval_points"]] == (
        [(0, 50, "before")] + [(k, 200, "held-out") for k in range(10, 100, 10)] + [(95, 1319, "after")]
    )
    assert p["final_eval_problems"] == 1319 and p["final_eval_stderr"] == pytest.approx(1.377, abs=1e-3)
    assert p["eval_subset_stderr"] == pytest.approx(3.536, abs=1e-3)


@pytest.mark.parametrize(
    ("every", "steps", "final", "expected"),
    [(-1, 100, True, list(range(10, 100, 10))), (-1, 100, False, list(range(10, 101, 10))),
     (-1, 4, False, [1, 2, 3, 4]), (30, 100, False, [30, 60, 90]), (0, 100, False, [])],
)  # fmt: skip
def test_eval_steps(every, steps, final, expected):
    assert plan.eval_steps(every, steps, final) == expected


@pytest.mark.parametrize(
    ("save", "steps", "expected"),
    [(50, 120, [50, 100, 120]), (50, 100, [50, 100]), (500, 120, [120]), (0, 7, [7]), (0.25, 10, [3, 6, 9, 10])],
)
def test_checkpoints_each_save_steps_and_the_last(save, steps, expected):
    assert plan.checkpoint_steps(save, steps) == expected


def test_qwen3_8b_shape():
    # Qwen3-8B's model card: 8.2 B parameters, 36 layers
    shape = plan.model_shape(QWEN3_8B)
    assert (shape["params"], shape["layers"]) == (pytest.approx(8.19e9, rel=0.01), 36)
    # q, k, v, o, gate, up, down: 2 x (4096 + 4096) + 2 x (4096 + 1024) + 3 x (4096 + 12288) in + out per block
    assert shape["linear_sides"] == 75776 and plan.lora_params(shape, 16) == 16 * 36 * 75776  # 43.6 M at r = 16


def test_estimates_follow_the_arithmetic():
    p = make_plan(BASE, 7473, 1319, model_config=QWEN3_8B)
    h100, h200 = p["estimates"]["H100"], p["estimates"]["H200"]
    # HF generate is bound by the host: 4,100 launches x 10 us = 41 ms/token on every card, above the bandwidth
    # floor of 16.4 GB / 3.35 TB/s = 4.9 ms (H100)
    assert h100["decode_ms_per_token"] == h200["decode_ms_per_token"] == pytest.approx(41.0, abs=0.1)
    assert h100["bandwidth_floor_ms_per_token"] == pytest.approx(4.9, abs=0.1)
    # 256 tokens x 41 ms = 10.5 s of decoding per call, one call per step
    assert 10.4 < h100["generation_seconds_per_step"] < 11.5
    assert h100["training_hours"] == pytest.approx(h100["seconds_per_step"] * 11208 / 3600, rel=0.01)
    # the whole run: training, evaluation (each 10 % of it here), start-up and checkpoint saves, each counted
    phases = sum(h100[f"{phase}_hours"] for phase in plan.PHASES)
    assert h100["hours_per_run"] == pytest.approx(phases, abs=0.002) and h100["startup_hours"] > 0
    # vLLM lifts the host floor, so the faster memory of the H200 shows
    v = make_plan({**BASE, "USE_VLLM": True}, 7473, 1319, model_config=QWEN3_8B)["estimates"]
    assert v["H200"]["decode_ms_per_token"] < v["H100"]["decode_ms_per_token"] < 41.0
    # a reference forward costs time when BETA > 0
    no_ref = make_plan({**BASE, "BETA": 0.0}, 7473, 1319, model_config=QWEN3_8B)["estimates"]["A100-80GB"]
    assert no_ref["training_seconds_per_step"] < p["estimates"]["A100-80GB"]["training_seconds_per_step"]


def test_without_a_model_config_the_estimates_say_why():
    p = make_plan(BASE, 7473, 1319)
    assert p["estimates"] is None and p["estimates_omitted"]
    assert "omitted" in plan.format_plan(p)


def test_format_and_json():
    p = make_plan({**BASE, "EVAL_AFTER": 1319}, 7473, 1319, model_config=QWEN3_8B)
    text = plan.format_plan(p)
    assert "11,208" in text and "1,319 problems" in text
    assert 15 <= len(text.splitlines()) <= 25
    # every time figure is labelled an estimate
    assert all("estimate" in line for line in text.splitlines() if " s/step" in line)
    assert json.loads(plan.plan_json(p))["optimizer_steps"] == 11208


def test_read_model_config_from_a_local_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_8B))
    assert plan.read_model_config(str(tmp_path)) == (QWEN3_8B, f"{tmp_path}/config.json")
    config, why = plan.read_model_config(str(tmp_path / "missing"))
    assert config is None and "config.json" in why


def test_read_model_config_offline_without_the_cache(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config, why = plan.read_model_config("nobody-has/this-model")
    assert config is None and "cache" in why


def test_read_model_config_offline_falls_back_to_the_known_qwen3_configs(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config, why = plan.read_model_config("Qwen/Qwen3-1.7B")
    # not in this machine's cache, the Hub unreachable: the copy of its config.json kept in grpo/plan.py
    assert config == plan.known_configs["Qwen/Qwen3-1.7B"] and "grpo/plan.py" in why
    assert plan.model_shape(config)["layers"] == 28  # Qwen3-1.7B's model card: 28 layers


# --- for_run: the plan of a run's settings, and which settings move each of its lines --------------------------


def lines_of(p):
    """{label: its text} of format_plan's block; the per-GPU estimates under "time (estimate)"."""
    rows = {}
    for line in plan.format_plan(p).splitlines()[1:]:
        label = line[2:].split("  ")[0].strip()
        key = "time (estimate)" if line.startswith("    ") else label
        rows[key] = rows.get(key, "") + line
    return rows


@pytest.fixture
def offline_settings(settings, monkeypatch):
    """grpotrainer.py's constants with USE_VLLM decided, offline: Qwen3-8B's shape from plan.known_configs."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return {**settings, "USE_VLLM": True}


def test_a_run_plan_takes_the_datasets_or_their_sizes(offline_settings):
    train = gsm8k.load(str(gsm8k.FIXTURE), "train")
    by_data = for_run(offline_settings, (train, None))
    by_size = for_run(offline_settings, (32, 0))
    assert by_data == by_size and by_data["train_problems"] == 32  # the fixture's 32 problems, no test set
    assert by_data["test_problems"] == 0 and by_data["final_eval_problems"] == 0


def test_the_plan_names_the_settings_that_move_each_line(offline_settings):
    p = for_run(offline_settings, (7473, 1319))
    # one entry per line of the printed block, each naming settings a user can give grpotrainer.py
    assert list(p["levers"]) == list(lines_of(p))
    assert all(p["levers"][line] for line in p["levers"])
    assert set().union(*p["levers"].values()) <= set(cli.constants(grpotrainer))
    assert json.loads(plan.plan_json(p))["levers"] == p["levers"]  # in --plan=json as well


@pytest.mark.parametrize(
    ("line", "lever", "value", "beside"),
    [
        ("model", "MODEL_NAME", "Qwen/Qwen3-1.7B", {}),
        ("optimiser steps", "MAX_STEPS", 100, {}),
        ("optimiser steps", "NUM_TRAIN_EPOCHS", 2, {"MAX_STEPS": -1}),  # epochs count when MAX_STEPS is -1
        ("per step", "NUM_GENERATIONS", 16, {}),
        ("per step", "PER_DEVICE_TRAIN_BATCH_SIZE", 16, {}),
        ("data", "MAX_SAMPLES", 100, {}),
        ("generation", "STEPS_PER_GENERATION", 16, {}),
        ("generation", "USE_VLLM", False, {}),
        ("held-out eval", "EVAL_SUBSET", 100, {}),
        ("eval before", "EVAL_BEFORE", 100, {}),
        ("final eval", "EVAL_AFTER", 100, {}),
        ("checkpoints", "SAVE_STEPS", 20, {}),
        ("time (estimate)", "BETA", 0.04, {}),  # a reference forward per step
        ("time (estimate)", "LOAD_IN_4BIT", True, {}),  # a quarter of the weight bytes read per token (vLLM)
    ],
)
def test_a_lever_moves_its_line_and_is_named_for_it(offline_settings, line, lever, value, beside):
    base = {**offline_settings, **beside}
    before = for_run(base, (7473, 1319))
    after = for_run({**base, lever: value}, (7473, 1319))
    assert lines_of(after)[line] != lines_of(before)[line]
    assert lever in before["levers"][line]
