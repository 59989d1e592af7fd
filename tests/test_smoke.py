"""End to end: `python grpotrainer.py --smoke` runs that succeed, in subprocesses (conftest.train): TensorBoard
events, adapter files, the plan and pace, the held-out curve, the model card and last lines (all read from the one
shared run, conftest.smoke_run), resume (OUTPUT_DIR=~ too), recipes, evaluation of the run's adapter.

.venv/bin/python -m pytest tests/test_smoke.py -q -m slow
"""

import json
import re

import pytest
from conftest import (
    REPO,
    SMOKE_RUN_PROMPT,
    all_finite,
    copy_run,
    event_dirs,
    read_scalars,
    read_texts,
    run_script,
    train,
)

STEPS = [1, 2, 3, 4, 5, 6]  # the shared run's MAX_STEPS=6, LOGGING_STEPS=1
POINTS = [0, 2, 4, 6]  # its held-out points: EVAL_BEFORE at 0, EVAL_STEPS=2 at 2 and 4, EVAL_AFTER at the last


def scored(out):
    """The rows of OUTPUT_DIR/eval_test.jsonl: every held-out point of the run, in order."""
    return [json.loads(line) for line in (out / "eval_test.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_smoke_run_logs_completions_advice_and_accuracy_to_one_tensorboard_run(smoke_run):
    (run,) = event_dirs(smoke_run.out)  # baseline, training, held-out points and final accuracy share one folder
    texts = read_texts(run)
    assert [step for step, _ in texts["completions/samples"]] == STEPS  # one table per logged step
    rows = [json.loads(line) for line in (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()]
    golds = {r["question"]: r["answer"].split("#### ")[-1] for r in rows}
    header, rule, first, *_ = texts["completions/samples"][0][1].splitlines()
    assert (
        header == "| question | completion | extracted | gold | correctness\\_reward | format\\_reward | advantage |"
    )
    cells = [re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", first)[1:-1]]  # unescaped
    assert cells[3] == golds[cells[0]]  # the gold shown is the fixture's answer to the question shown
    # the 24-token limit cuts most completions of the random model: the clipped advisory fires at step 1, as a note,
    # since --smoke sets MAX_COMPLETION_LENGTH short on purpose (demo/smoke.py's FIXED)
    step, advice = texts["health/advice"][0]
    advice = re.sub(r"\\(.)", r"\1", advice)  # unescaped markdown
    clipped = next(line for line in advice.split("\n\n") if "MAX_COMPLETION_LENGTH (now 24 tokens)" in line)
    assert step == 1 and clipped.startswith("**OK**") and "expected here, as this profile sets MAX_COMP" in clipped

    scalars = read_scalars(run)
    assert [s for s, _ in scalars["train/frac_tied_groups"]] == STEPS  # ours, beside TRL's, at every log
    assert [s for s, _ in scalars["train/completions/padded_ratio"]] == STEPS  # from the rewards' log_metric
    multiline, margins = _custom_scalars(run)  # the Custom Scalars tab opens on README's charts
    assert "train/frac_tied_groups$" in multiline and "train/kl$" in multiline
    # each held-out metric on a margin chart of its own (TensorBoard draws them in reverse order, so the layout
    # lists them so): an accuracy with its 95 % interval, a rate as itself; tags the run logged, at every point
    accuracies = [f"eval/gsm8k_{kind}_accuracy" for kind in ("strict", "lenient", "sampled")]
    rates = [f"eval/gsm8k_{kind}_rate" for kind in ("format", "padded")]
    expected = [(tag, f"{tag}_ci95_low", f"{tag}_ci95_high") for tag in accuracies] + [(t, t, t) for t in rates]
    assert margins == expected[::-1]
    assert all([s for s, _ in scalars[tag]] == POINTS for series in margins for tag in series)
    for row in scored(smoke_run.out):  # each point's value is its evaluation's, its interval drawn beside it
        metrics, at = row["metrics"], POINTS.index(row["step"])
        assert scalars["eval/gsm8k_strict_accuracy"][at][1] == pytest.approx(metrics["strict_accuracy"], abs=1e-4)
        low, high = metrics["lenient_accuracy_ci95"]
        assert scalars["eval/gsm8k_lenient_accuracy_ci95_low"][at][1] == pytest.approx(low, abs=1e-4)
        assert scalars["eval/gsm8k_lenient_accuracy_ci95_high"][at][1] == pytest.approx(high, abs=1e-4)


def _custom_scalars(run):
    """The custom_scalars layout written into a run folder: (the multiline charts' tags, which are regular
    expressions; the margin charts' series as (value, lower, upper) tags)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    acc = EventAccumulator(str(run), size_guidance={"tensors": 0})
    acc.Reload()
    (event,) = acc.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(event.tensor_proto.string_val[0])
    charts = [chart for category in layout.category for chart in category.chart]
    margins = [(s.value, s.lower, s.upper) for chart in charts for s in chart.margin.series]
    return [tag for chart in charts for tag in chart.multiline.tag], margins


@pytest.mark.slow
def test_smoke_run_logs_and_saves_an_adapter(smoke_run):
    (run,) = event_dirs(smoke_run.out)  # one TensorBoard run folder under OUTPUT_DIR/runs/
    scalars = read_scalars(run)
    for tag in ("train/reward", "train/kl", "train/loss", "train/rewards/correctness_reward/mean"):
        assert all_finite(scalars[tag]), tag
    assert [step for step, _ in scalars["train/reward"]] == STEPS
    # the final LoRA adapter and tokenizer, loadable with peft/transformers from OUTPUT_DIR
    for name in ("adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (smoke_run.out / name).is_file(), name
    adapter = json.loads((smoke_run.out / "adapter_config.json").read_text())
    assert adapter["r"] == 16 and adapter["peft_type"] == "LORA"  # LORA_R's default
    checkpoints = sorted(p.name for p in smoke_run.out.glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]  # --smoke's SAVE_STEPS=2, none rotated


@pytest.mark.slow
def test_a_tilde_output_dir_resumes_and_starting_over_there_is_refused_and_loses_nothing(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    first = train("~/x", "--MAX_STEPS=2", env={"HOME": str(home)})
    assert first.returncode == 0, first.stderr[-2000:]
    again = train("~/x", "--MAX_STEPS=4", env={"HOME": str(home)})
    assert again.returncode == 0, again.stderr[-2000:]
    out = home / "x"
    assert f"resuming from {out / 'checkpoint-2'}" in again.stderr  # the rerun found the first part
    assert not (REPO / "~").exists() and sorted(p.name for p in home.iterdir()) == ["x"]  # one folder, not two
    runs = event_dirs(out)
    # the second run starts after step 2 instead of redoing it
    assert [[s for s, _ in read_scalars(run)["train/loss"]] for run in runs] == [[1, 2], [3, 4]]
    assert json.loads((out / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4
    assert json.loads((out / "run_finished.json").read_text())["global_step"] == 4

    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    refused = train(out, "--MAX_STEPS=6", "--RESUME=false", env={"HOME": str(home)})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "already holds 2 checkpoint(s)" in refused.stderr  # checkpoint-2 and checkpoint-4
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before  # nothing touched


@pytest.mark.slow
def test_evaluation_follows_the_run_it_scores(smoke_run, tmp_path):
    # a run's prompt, length and a GRPOConfig field given on its command line travel with it: into training_args.bin
    # and run_settings.json, and from there into evaluate.py's scoring of its adapter
    import torch

    training_args = torch.load(smoke_run.out / "training_args.bin", weights_only=False)
    assert (training_args.top_p, training_args.max_completion_length) == (0.9, 24)
    recorded = json.loads((smoke_run.out / "run_settings.json").read_text())
    assert (recorded["SYSTEM_PROMPT"], recorded["grpo_config"]) == (SMOKE_RUN_PROMPT, {"top_p": 0.9})

    out = copy_run(smoke_run, tmp_path / "run")  # evaluate.py writes its results into the adapter's folder
    scored_run = run_script("evaluate.py", "--smoke", f"--ADAPTER={out}", "--LIMIT=2")
    assert scored_run.returncode == 0, scored_run.stderr[-3000:]
    settings = json.loads((out / "eval_test.json").read_text())["settings"]
    assert (settings["SYSTEM_PROMPT"], settings["MAX_COMPLETION_LENGTH"]) == (SMOKE_RUN_PROMPT, 24)
    predictions = [json.loads(line) for line in (out / "eval_test_predictions.jsonl").read_text().splitlines()]
    assert all(p["completion_tokens"] <= 24 for p in predictions)  # generated with the run's limit, not 32
    # this command line still wins over the run's settings
    again = run_script("evaluate.py", "--smoke", f"--ADAPTER={out}", "--LIMIT=2", "--SYSTEM_PROMPT=Be brief.")
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((out / "eval_test.json").read_text())["settings"]["SYSTEM_PROMPT"] == "Be brief."


@pytest.mark.slow
def test_a_run_leaves_a_model_card_with_its_accuracies(smoke_run):
    # our card replaces TRL's "fine-tuned version of [None]": base model, data, rewards and before/after accuracy
    card = (smoke_run.out / "README.md").read_text()
    model = json.loads((smoke_run.out / "run_settings.json").read_text())["MODEL_NAME"]
    assert model in card and "[None]" not in card
    assert "GSM8K" in card and "correctness_reward" in card and "format_reward" in card
    before, after = (json.loads((smoke_run.out / f"eval_test_{w}.json").read_text()) for w in ("before", "after"))
    row = next(line for line in card.splitlines() if line.startswith("| strict accuracy"))
    cells = [cell.strip() for cell in row.strip("|").split("|")][1:]  # before, after: "25.0% (4.6%-69.9%)"
    assert [cell.split()[0] for cell in cells[:2]] == [f"{m['strict_accuracy']:.1%}" for m in (before, after)]


@pytest.mark.slow
def test_a_run_ends_with_its_summary_then_says_the_smoke_model_is_random(smoke_run):
    *_, summary, last = smoke_run.result.stderr.strip().splitlines()
    # the fixture's file, not "GSM8K", names the data scored; 6 steps, and the 8 problems scored before and after
    assert summary.startswith("[grpotrainer] finished: 6 steps in ") and "smoke_gsm8k.jsonl test strict" in summary
    assert "GSM8K" not in summary and summary.endswith("paired exact test (8 test problems)")
    # --smoke's own last word: its near-zero rewards and accuracy are the random model's, not a broken pipeline
    assert last.startswith("[grpotrainer] smoke: the whole pipeline ran offline") and "the model is random" in last


@pytest.mark.slow
def test_report_to_none_trains_without_tensorboard_on_trls_own_reward_by_its_name_alone(tmp_path):
    # `--REWARD_FUNCS=accuracy_reward` as a TRL user writes it: TRL's reward (math-verify), its weight 1 with a line;
    # rows carry the gold as `solution` too, which TRL's and open-r1's rewards read
    out = train(tmp_path, "--REPORT_TO=none", "--REWARD_FUNCS=accuracy_reward", "--MAX_STEPS=2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REWARD_WEIGHTS=" in out.stderr  # the default weights no longer fit: one each, said once
    assert (tmp_path / "adapter_model.safetensors").is_file() and not (tmp_path / "runs").exists()
    logged = json.loads((tmp_path / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    points = [
        (row["step"], row["rewards/accuracy_reward/mean"]) for row in logged if "rewards/accuracy_reward/mean" in row
    ]
    assert [step for step, _ in points] == [1, 2] and all_finite(points)


@pytest.mark.slow
def test_a_recipe_trains_its_steps_the_command_line_wins_and_a_finished_run_is_known_at_once(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("MAX_STEPS: 2\nEVAL_AFTER: 4\nEVAL_BEFORE: 4\n")
    first = train(tmp_path / "a", "--config", str(recipe))
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((tmp_path / "a" / "run_finished.json").read_text())["global_step"] == 2  # the file's MAX_STEPS
    # the run's summary: steps, wall time, accuracy before -> after (EVAL_BEFORE/EVAL_AFTER from the recipe)
    summary = first.stderr.strip().splitlines()[-2]
    assert summary.startswith("[grpotrainer] finished: 2 steps in ") and "(4 test problems)" in summary
    plan = train(tmp_path / "b", "--config", str(recipe), "--MAX_STEPS=3", "--plan=json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    assert json.loads(plan.stdout)["optimizer_steps"] == 3  # the command line wins over the recipe
    # run again: recognised before TRL or torch is imported (-X importtime lists every module the child imports)
    again = train(tmp_path / "a", "--config", str(recipe), launcher=("-X", "importtime"))
    assert again.returncode == 0 and "holds a finished run (2 steps, adapter saved); nothing to do" in again.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in again.stderr.splitlines() if line.startswith("import time")
    ]
    assert "grpo.checkpoints" in imported and not {"trl", "torch", "transformers"} & set(imported)


@pytest.mark.slow
def test_a_smoke_run_logs_its_plan_pace_and_held_out_curve(smoke_run):
    # the plan comes before the weights load, and the measured pace after the first steps
    err = smoke_run.result.stderr
    assert "optimiser steps" in err and "] model " in err and "s/step, ETA" in err, err[-3000:]
    assert err.index("optimiser steps") < err.index("] model ")  # logged just before the trainer loads the weights
    (run,) = event_dirs(smoke_run.out)
    scalars = read_scalars(run)
    for tag in ("perf/seconds_per_step", "perf/generation_share", "perf/eta_hours"):
        assert scalars[tag], tag
    assert all(0 <= share <= 1 for _, share in scalars["perf/generation_share"])
    # every 2 steps, the last left to EVAL_AFTER, which scores the same model: besides the baseline at 0
    for tag in ("eval/gsm8k_strict_accuracy", "eval/gsm8k_lenient_accuracy", "eval/gsm8k_sampled_accuracy"):
        assert [step for step, _ in scalars[tag]] == POINTS, tag
    # every held-out point kept, where eval_test_<when>.json holds the newest of each kind
    rows = scored(smoke_run.out)
    assert [(r["step"], r["when"], r["metrics"]["n"]) for r in rows] == [
        (0, "before", 8),  # EVAL_BEFORE problems
        (2, "during", 4),  # EVAL_SUBSET problems
        (4, "during", 4),
        (6, "after", 8),  # EVAL_AFTER problems
    ]
    assert json.loads((smoke_run.out / "eval_test_during.json").read_text())["step"] == 4
