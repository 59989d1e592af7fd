"""End to end: `python grpotrainer.py --smoke` runs that succeed, in subprocesses (conftest.train): TensorBoard
events, adapter files, resume (OUTPUT_DIR=~ too), recipes, the model card.

.venv/bin/python -m pytest tests/test_smoke.py -q -m slow
"""

import json
import re

import pytest
from conftest import (
    REPO,
    all_finite,
    event_dirs,
    read_scalars,
    read_texts,
    run_script,
    train,
)


@pytest.mark.slow
def test_smoke_run_logs_completions_advice_and_accuracy_to_one_tensorboard_run(tmp_path):
    result = train(tmp_path, "--EVAL_BEFORE=4", "--EVAL_AFTER=4")
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "runs").iterdir()  # baseline, training and final accuracy share one run folder

    texts = read_texts(run)
    assert [step for step, _ in texts["completions/samples"]] == [1, 2, 3, 4]  # one table per logged step
    rows = [json.loads(line) for line in (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()]
    golds = {r["question"]: r["answer"].split("#### ")[-1] for r in rows}
    header, rule, first, *_ = texts["completions/samples"][0][1].splitlines()
    assert (
        header == "| question | completion | extracted | gold | correctness\\_reward | format\\_reward | advantage |"
    )
    cells = [re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", first)[1:-1]]  # unescaped
    assert cells[3] == golds[cells[0]]  # the gold shown is the fixture's answer to the question shown
    # --smoke's 32-token limit cuts most completions of the random model: the clipped advisory fires at step 1.
    assert texts["health/advice"][0][0] == 1 and "MAX\\_COMPLETION\\_LENGTH" in texts["health/advice"][0][1]

    scalars = read_scalars(run)
    assert [s for s, _ in scalars["train/frac_tied_groups"]] == [1, 2, 3, 4]  # ours, beside TRL's, at every log
    assert [s for s, _ in scalars["train/completions/padded_ratio"]] == [1, 2, 3, 4]  # from the rewards' log_metric
    layout = _custom_scalars(run)  # the Custom Scalars tab opens on README's charts
    assert "train/frac_tied_groups$" in layout and "train/kl$" in layout and r"eval/gsm8k_.*accuracy$" in layout
    assert [s for s, _ in scalars["eval/gsm8k_strict_accuracy"]] == [0, 4]  # before at step 0, after at the last
    assert [s for s, _ in scalars["eval/gsm8k_lenient_accuracy"]] == [0, 4]
    for when, (_, value) in zip(("before", "after"), scalars["eval/gsm8k_strict_accuracy"], strict=True):
        metrics = json.loads((tmp_path / f"eval_test_{when}.json").read_text())
        assert metrics["n"] == 4 and value == pytest.approx(metrics["strict_accuracy"], abs=1e-4)
    assert (tmp_path / "adapter_model.safetensors").is_file()


def _custom_scalars(run):
    """The tags of the custom_scalars layout written into a run folder, as one string."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    return " ".join(tag for c in layout.category for chart in c.chart for tag in chart.multiline.tag)


@pytest.mark.slow
def test_a_tilde_output_dir_resumes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    first = train("~/x", "--MAX_STEPS=2", env={"HOME": str(home)})
    assert first.returncode == 0, first.stderr[-2000:]
    again = train("~/x", "--MAX_STEPS=4", env={"HOME": str(home)})
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming from {home / 'x' / 'checkpoint-2'}" in again.stderr  # the rerun found the first part
    assert not (REPO / "~").exists() and sorted(p.name for p in home.iterdir()) == ["x"]  # one folder, not two
    assert json.loads((home / "x" / "run_finished.json").read_text())["global_step"] == 4


@pytest.mark.slow
def test_smoke_run_logs_and_saves_an_adapter(tmp_path):
    out = train(tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = event_dirs(tmp_path)  # one TensorBoard run folder under OUTPUT_DIR/runs/
    scalars = read_scalars(run)
    for tag in ("train/reward", "train/kl", "train/loss", "train/rewards/correctness_reward/mean"):
        assert all_finite(scalars[tag]), tag
    assert [step for step, _ in scalars["train/reward"]] == [1, 2, 3, 4]  # LOGGING_STEPS=1 over MAX_STEPS=4
    # the final LoRA adapter and tokenizer, loadable with peft/transformers from OUTPUT_DIR
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / name).is_file(), name
    adapter = json.loads((tmp_path / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["peft_type"] == "LORA"
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]  # SAVE_STEPS=2


@pytest.mark.slow
def test_resume_continues_from_the_last_checkpoint(tmp_path):
    first = train(tmp_path, "--MAX_STEPS=2")
    assert first.returncode == 0, first.stderr[-3000:]
    second = train(tmp_path, "--MAX_STEPS=4")
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming from {tmp_path}/checkpoint-2" in second.stderr
    runs = event_dirs(tmp_path)
    first_steps = [s for s, _ in read_scalars(runs[0])["train/loss"]]
    second_steps = [s for s, _ in read_scalars(runs[-1])["train/loss"]]
    assert first_steps == [1, 2]
    assert second_steps == [3, 4]  # the second run starts after step 2 instead of redoing it
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4


@pytest.mark.slow
def test_starting_over_in_a_used_output_dir_is_refused_and_loses_nothing(tmp_path):
    assert train(tmp_path, "--MAX_STEPS=2").returncode == 0
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    again = train(tmp_path, "--RESUME=false")
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert "already holds 1 checkpoint(s)" in again.stderr
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == before  # nothing touched


@pytest.mark.slow
def test_evaluation_follows_the_run_it_scores(tmp_path):
    # a run's prompt, length and a GRPOConfig field given on its command line travel with it: into training_args.bin
    # and run_settings.json, and from there into evaluate.py's scoring of its adapter
    prompt = "Solve it. End with #### <number>."
    trained = train(tmp_path, f"--SYSTEM_PROMPT={prompt}", "--MAX_COMPLETION_LENGTH=24", "--top_p=0.9")
    assert trained.returncode == 0, trained.stderr[-3000:]
    import torch

    training_args = torch.load(tmp_path / "training_args.bin", weights_only=False)
    assert (training_args.top_p, training_args.max_completion_length) == (0.9, 24)
    recorded = json.loads((tmp_path / "run_settings.json").read_text())
    assert (recorded["SYSTEM_PROMPT"], recorded["grpo_config"]) == (prompt, {"top_p": 0.9})

    scored = run_script("evaluate.py", "--smoke", f"--ADAPTER={tmp_path}", "--LIMIT=2")
    assert scored.returncode == 0, scored.stderr[-3000:]
    settings = json.loads((tmp_path / "eval_test.json").read_text())["settings"]
    assert (settings["SYSTEM_PROMPT"], settings["MAX_COMPLETION_LENGTH"]) == (prompt, 24)
    predictions = [json.loads(line) for line in (tmp_path / "eval_test_predictions.jsonl").read_text().splitlines()]
    assert all(p["completion_tokens"] <= 24 for p in predictions)  # generated with the run's limit, not 32
    # this command line still wins over the run's settings
    again = run_script("evaluate.py", "--smoke", f"--ADAPTER={tmp_path}", "--LIMIT=2", "--SYSTEM_PROMPT=Be brief.")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((tmp_path / "eval_test.json").read_text())["settings"]["SYSTEM_PROMPT"] == "Be brief."


@pytest.mark.slow
def test_a_run_leaves_a_model_card_with_its_accuracies(tmp_path):
    # our card replaces TRL's "fine-tuned version of [None]": base model, data, rewards and before/after accuracy
    out = train(tmp_path, "--EVAL_BEFORE=4", "--EVAL_AFTER=4")
    assert out.returncode == 0, out.stderr[-3000:]
    card = (tmp_path / "README.md").read_text()
    assert str(tmp_path / "smoke-model") in card and "[None]" not in card
    assert "GSM8K" in card and "correctness_reward" in card and "format_reward" in card
    before, after = (json.loads((tmp_path / f"eval_test_{when}.json").read_text()) for when in ("before", "after"))
    row = next(line for line in card.splitlines() if line.startswith("| strict accuracy"))
    cells = [cell.strip() for cell in row.strip("|").split("|")][1:]  # before, after: "25.0% (4.6%-69.9%)"
    assert [cell.split()[0] for cell in cells] == [f"{m['strict_accuracy']:.1%}" for m in (before, after)]


@pytest.mark.slow
def test_report_to_none_trains_without_tensorboard(tmp_path):
    out = train(tmp_path, "--REPORT_TO=none")
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "adapter_model.safetensors").is_file() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_trls_own_accuracy_reward_runs_beside_ours(tmp_path):
    # rows carry the gold as `solution` too, which TRL's and open-r1's rewards read
    args = ["--REWARD_FUNCS=correctness_reward,trl.rewards:accuracy_reward", "--REWARD_WEIGHTS=1,0.5"]
    out = train(tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    scalars = read_scalars(event_dirs(tmp_path)[0])
    assert all_finite(scalars["train/rewards/accuracy_reward/mean"])
    assert all_finite(scalars["train/rewards/correctness_reward/mean"])


@pytest.mark.slow
def test_a_recipe_trains_its_steps_the_command_line_wins_and_a_finished_run_is_known_at_once(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("MAX_STEPS: 2\nEVAL_AFTER: 4\nEVAL_BEFORE: 4\n")
    first = train(tmp_path / "a", "--config", str(recipe))
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((tmp_path / "a" / "run_finished.json").read_text())["global_step"] == 2  # the file's MAX_STEPS
    # the run's last line: steps, wall time, accuracy before -> after (EVAL_BEFORE/EVAL_AFTER from the recipe)
    last = first.stderr.strip().splitlines()[-1]
    assert last.startswith("[grpotrainer] finished: 2 steps in ") and "-> " in last and "(4 test problems)" in last
    second = train(tmp_path / "b", "--config", str(recipe), "--MAX_STEPS=3")
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads((tmp_path / "b" / "run_finished.json").read_text())["global_step"] == 3  # the command line wins
    # run again: recognised before TRL or torch is imported (-X importtime lists every module the child imports)
    again = train(tmp_path / "a", "--config", str(recipe), launcher=("-X", "importtime"))
    assert again.returncode == 0 and "holds a finished run (2 steps, adapter saved); nothing to do" in again.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time")
    ]
    assert "grpo.checkpoints" in imported and not {"trl", "torch", "transformers"} & set(imported)


@pytest.mark.slow
def test_eval_steps_draw_a_held_out_curve(tmp_path):
    out = train(tmp_path, "--MAX_STEPS=6", "--EVAL_STEPS=2", "--EVAL_SUBSET=8")
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = event_dirs(tmp_path)
    scalars = read_scalars(run)
    # every 2 steps, the last included (EVAL_AFTER is 0 under --smoke): three points besides a baseline
    for tag in ("eval/gsm8k_strict_accuracy", "eval/gsm8k_lenient_accuracy", "eval/gsm8k_sampled_accuracy"):
        assert [step for step, _ in scalars[tag]] == [2, 4, 6], tag
    assert json.loads((tmp_path / "eval_test_during.json").read_text())["n"] == 8  # EVAL_SUBSET problems


@pytest.mark.slow
def test_a_smoke_run_logs_its_plan_and_pace(tmp_path):
    args = ["--smoke", "--MAX_STEPS=6", "--EVAL_STEPS=2", "--EVAL_SUBSET=8", f"--OUTPUT_DIR={tmp_path}"]
    out = run_script("grpotrainer.py", *args)
    assert out.returncode == 0, out.stderr[-3000:]
    # the plan comes before the weights load, and the measured pace after the first steps
    err = out.stderr
    assert "optimiser steps" in err and "] model " in err and "s/step, ETA" in err, err[-3000:]
    assert err.index("optimiser steps") < err.index("] model ")  # logged just before the trainer loads the weights
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    scalars = read_scalars(run)
    for tag in ("perf/seconds_per_step", "perf/generation_share", "perf/eta_hours"):
        assert scalars[tag], tag
    assert all(0 <= share <= 1 for _, share in scalars["perf/generation_share"])
    # every held-out point kept, where eval_test_during.json holds the last
    rows = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 4, 6]
