"""Tests of grpo/callbacks.py: a signal stopping training at a step end (StopOnSignal) or a held-out evaluation
(HeldOutEval), the health advice and its NaN stop, the pace (PerfMonitor), the one path of numbers and texts to every
tracker (publish, alerts included; log_point) and the completions table. The smoke run whose TensorBoard events
hold them is in test_smoke.py, the NaN reward run in test_e2e_faults.py.

    .venv/bin/python -m pytest tests/test_callbacks.py -q
"""

import json
import math
import os
import signal
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import advice_thresholds, read_scalars, read_texts
from transformers import TrainerControl, TrainerState

from grpo import advice, callbacks, evaluation, process, stats

T = advice_thresholds()


class Run:
    """A tracker's run (W&B's wandb.run, trackio's current run): what was logged and alerted."""

    def __init__(self):
        self.logged, self.alerts = [], []

    def log(self, data, step=None):
        self.logged.append((data, step))

    def alert(self, *args, **kwargs):
        self.alerts.append((args, kwargs))


LEVELS = SimpleNamespace(WARN="warn", ERROR="error")


@pytest.fixture
def trackers(monkeypatch):
    """W&B and trackio as modules whose run records what it is sent: (wandb's run, trackio's run)."""
    wandb, trackio = Run(), Run()
    monkeypatch.setitem(
        sys.modules, "wandb", SimpleNamespace(run=wandb, Html=lambda html: ("html", html), AlertLevel=LEVELS)
    )
    current = SimpleNamespace(current_run=SimpleNamespace(get=lambda: trackio))
    stand_in = SimpleNamespace(context_vars=current, Markdown=lambda text: ("markdown", text), AlertLevel=LEVELS)
    monkeypatch.setitem(sys.modules, "trackio", stand_in)
    return wandb, trackio


def stand_in_trainer(report_to=(), main=True, callbacks_=(), rewards=None, output_dir="out", step=0, max_steps=6):
    """What the callbacks read of a GRPOTrainer: its arguments, process, callbacks, state and newest rewards."""
    return SimpleNamespace(
        args=SimpleNamespace(report_to=list(report_to), output_dir=str(output_dir), device=torch.device("cpu")),
        accelerator=SimpleNamespace(is_main_process=main),
        callback_handler=SimpleNamespace(callbacks=list(callbacks_)),
        state=TrainerState(global_step=step, max_steps=max_steps, is_world_process_zero=main),
        reward_func_names=list(rewards or {}),
        _logs={"rewards": rewards} if rewards else {},
    )


@pytest.fixture
def published(monkeypatch):
    """callbacks.publish, recording (step, scalars, texts, alerts) instead of sending."""
    calls = []

    def publish(trainer, step, scalars=None, texts=None, alerts=()):
        calls.append((step, scalars, texts, list(alerts)))

    monkeypatch.setattr(callbacks, "publish", publish)
    return calls


# ---------------------------------------------------------------------------------------------------------------
# StopOnSignal: a signal in training stops it after the step, with a checkpoint


def step_end(stopper, step):
    control = TrainerControl()
    stopper.on_step_end(SimpleNamespace(device=torch.device("cpu")), TrainerState(global_step=step), control)
    return control


def test_signal_stops_after_the_step_with_a_save(tmp_path):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stopper = callbacks.StopOnSignal()
    stopper.on_train_begin(None, None, None)
    try:
        control = step_end(stopper, 1)
        assert (control.should_save, control.should_training_stop) == (False, False)  # no signal: no change
        os.kill(os.getpid(), signal.SIGTERM)  # handled at once: the test process survives
        os.kill(os.getpid(), signal.SIGINT)  # a second one, e.g. an impatient Ctrl-C, is ignored
        control = step_end(stopper, 2)
        assert (control.should_save, control.should_training_stop) == (True, True)
        stopper.on_save(SimpleNamespace(output_dir=str(tmp_path)), TrainerState(global_step=2), control)
    finally:
        stopper.on_train_end(None, None, None)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # handlers restored
    saved = tmp_path / "checkpoint-2"
    assert (
        stopper.message()
        == f"stopped by SIGTERM at step 2; checkpoint saved to {saved}; rerun the same command to resume"
    )
    assert stopper.exit_code == 143  # 128 + 15, the shell's code for "ended by SIGTERM"


def test_ctrl_c_exit_code_is_130():
    stopper = callbacks.StopOnSignal()
    stopper.on_train_begin(None, None, None)
    try:
        os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt without the handler
        step_end(stopper, 7)
    finally:
        stopper.restore()
    assert (stopper.signal_name, stopper.stopped_at, stopper.exit_code) == ("SIGINT", 7, 130)


def toy_trainer(output_dir, callbacks_, max_steps=10):
    """A transformers Trainer on a two-weight linear model: the real training loop and checkpoint code, on CPU."""
    from transformers import Trainer, TrainingArguments

    class Toy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 1)

        def forward(self, x, labels):
            return {"loss": ((self.linear(x).squeeze(-1) - labels) ** 2).mean()}

    data = [{"x": torch.tensor([1.0, float(i)]), "labels": torch.tensor(0.5)} for i in range(64)]
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        save_steps=100,  # only the signal makes a checkpoint
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to=[],
        logging_steps=100,
        disable_tqdm=True,
    )
    return Trainer(model=Toy(), args=args, train_dataset=data, callbacks=callbacks_)


def test_sigterm_in_a_real_training_loop_saves_and_stops(tmp_path):
    from transformers import TrainerCallback

    class SendDuringStep3(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 2:  # step 3 is starting
                os.kill(os.getpid(), signal.SIGTERM)

    stopper = callbacks.StopOnSignal()
    trainer = toy_trainer(tmp_path, [SendDuringStep3(), stopper])
    trainer.train()
    assert trainer.state.global_step == 3  # step 3 finished, step 4 never started (max_steps was 10)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3"]
    assert json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())["global_step"] == 3
    assert stopper.saved == tmp_path / "checkpoint-3"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored at train end


# ---------------------------------------------------------------------------------------------------------------
# HeldOutEval: the points at the trainer's step, and a signal while it scores


@pytest.fixture
def scoring(monkeypatch):
    """evaluation.evaluate_trainer and callbacks.log_point as records: `scoring.signal_in` names the evaluation
    ("before", "during" or "after") in which SIGTERM comes; `scoring.went_on` what ran after it."""
    record = SimpleNamespace(scored=[], logged=[], went_on=[], signal_in=None)

    def evaluate_trainer(trainer, when, limit, check, **kwargs):
        record.scored.append((when, trainer.state.global_step))
        if when == record.signal_in:
            os.kill(os.getpid(), signal.SIGTERM)  # recorded by the run's handler, as in the middle of a generate call
            check()  # between two generate calls: the scoring ends there
            record.went_on.append(when)  # never: the check ends the evaluation
        return {"n": limit}

    monkeypatch.setattr(evaluation, "evaluate_trainer", evaluate_trainer)
    monkeypatch.setattr(
        callbacks, "log_point", lambda trainer, metrics: record.logged.append(trainer.state.global_step)
    )
    return record


@pytest.fixture
def stopper():
    """The run's StopOnSignal with its handlers in place, as from the first step on; restored after."""
    stop = callbacks.StopOnSignal()
    stop.on_train_begin(None, None, None)
    yield stop
    stop.restore()


def held_out(trainer, stopper, **kwargs):
    """HeldOutEval as grpotrainer.py builds it: EVAL_STEPS=2 on 8 problems, EVAL_AFTER=16, unfinished once stopped."""
    options = dict(every=2, subset=8, scoring={}, after=16, finished=lambda: not stopper.signal_name) | kwargs
    return callbacks.HeldOutEval(trainer, stopper, **options)


def test_held_out_points_are_scored_at_their_steps(tmp_path, scoring, stopper):
    trainer = stand_in_trainer(output_dir=tmp_path, max_steps=6)
    held = held_out(trainer, stopper, before=4)
    args, state = trainer.args, trainer.state
    for step in range(6):
        state.global_step = step
        held.on_step_begin(args, state, TrainerControl())
        state.global_step = step + 1
        held.on_step_end(args, state, TrainerControl())
    held.on_train_end(args, state, TrainerControl())
    # before at step 0; EVAL_STEPS=2 at 2 and 4; the last step is EVAL_AFTER's, which scores the same model
    assert scoring.scored == [("before", 0), ("during", 2), ("during", 4), ("after", 6)]
    assert scoring.logged == [0, 2, 4, 6] and sorted(held.metrics, key=str) == [2, 4, "after", "before"]
    assert held.interrupted is None


def test_a_signal_while_scoring_eval_steps_saves_the_step_and_stops(tmp_path, scoring, stopper):
    trainer = stand_in_trainer(output_dir=tmp_path, step=4)
    held = held_out(trainer, stopper)
    scoring.signal_in = "during"
    control = TrainerControl()
    held.on_step_end(trainer.args, trainer.state, control)
    stopper.on_step_end(SimpleNamespace(device=torch.device("cpu")), trainer.state, control)  # next in the list
    stopper.on_save(trainer.args, trainer.state, control)  # the Trainer saves the step the control asks for
    held.on_train_end(trainer.args, trainer.state, control)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert (scoring.scored, scoring.went_on, scoring.logged) == ([("during", 4)], [], [])  # cut where it was
    assert held.interrupted == "during" and "after" not in held.metrics  # a stopped run is not scored after
    saved = tmp_path / "checkpoint-4"
    assert stopper.message() == (
        f"stopped by SIGTERM while scoring EVAL_STEPS at step 4; checkpoint saved to {saved}; rerun the same "
        "command to resume"
    )


def test_a_signal_while_scoring_eval_after_leaves_the_run_unfinished(tmp_path, scoring, stopper):
    trainer = stand_in_trainer(output_dir=tmp_path, step=6)
    held = held_out(trainer, stopper)
    scoring.signal_in = "after"
    held.on_train_end(trainer.args, trainer.state, TrainerControl())
    assert (scoring.scored, scoring.went_on, scoring.logged) == ([("after", 6)], [], [])
    # grpotrainer.py saves the adapter for "after", marks nothing finished and exits 143; the rerun scores it
    assert held.interrupted == "after" and "after" not in held.metrics
    assert (stopper.signal_name, stopper.stopped_at, stopper.exit_code) == ("SIGTERM", 6, 143)


def test_a_signal_while_scoring_eval_before_unwinds_the_script(tmp_path, scoring, stopper):
    trainer = stand_in_trainer(output_dir=tmp_path)
    held = held_out(trainer, stopper, before=4)
    scoring.signal_in = "before"
    with pytest.raises(process.Interrupted) as err:  # process.run turns it into one line and exit 143
        held.on_step_begin(trainer.args, trainer.state, TrainerControl())
    assert err.value.signum == signal.SIGTERM and scoring.went_on == []
    assert signal.getsignal(signal.SIGTERM) == stopper.handle  # training's handler, for the run's unwinding


@pytest.mark.parametrize(
    ("resumed_at", "scored"),
    [
        (4, [("during", 4)]),  # the point a stop cut short at step 4: the rerun scores it before training on
        (2, []),  # scored before the stop: not again
        (3, []),  # not an EVAL_STEPS step
    ],
)
def test_a_resumed_run_scores_a_missing_point_at_its_resumed_step(tmp_path, scoring, stopper, resumed_at, scored):
    evaluation.append_eval_point(tmp_path, "during", 2, {"n": 8})  # the first run's points: step 2 only
    trainer = stand_in_trainer(output_dir=tmp_path, step=resumed_at)
    held = held_out(trainer, stopper)  # before=0: a resumed run scores no EVAL_BEFORE
    control = TrainerControl()
    held.on_step_begin(trainer.args, trainer.state, control)
    assert scoring.scored == scored and scoring.logged == [step for _, step in scored]
    assert not control.should_training_stop


def test_a_signal_while_scoring_the_resumed_point_stops_before_the_step(tmp_path, scoring, stopper):
    trainer = stand_in_trainer(output_dir=tmp_path, step=4)
    held = held_out(trainer, stopper)
    scoring.signal_in = "during"
    control = TrainerControl()
    held.on_step_begin(trainer.args, trainer.state, control)
    # the run stops at the checkpoint it resumed from, which the rerun resumes from again to score step 4
    assert control.should_training_stop and held.interrupted == "during" and stopper.stopped_at == 4


def test_held_out_points_reach_the_trackers_through_the_trainers_log_once(tmp_path):
    from transformers import TrainingArguments
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    tensorboard = TensorBoardCallback()
    tensorboard.logging_dir = str(tmp_path)
    seen = []
    recorder = SimpleNamespace(on_log=lambda args, state, control, logs=None, **kw: seen.append(dict(logs)))
    trainer = SimpleNamespace(
        args=TrainingArguments(output_dir=str(tmp_path), report_to=[]),
        accelerator=SimpleNamespace(is_main_process=True),
        state=TrainerState(global_step=4, is_world_process_zero=True),
        control=TrainerControl(),
        callback_handler=CallbackHandler([DefaultFlowCallback(), tensorboard], None, None, None, None),
        _metrics={"train": {"reward": [0.5]}},  # GRPOTrainer's buffer of training metrics, averaged at its next log
    )
    trainer.callback_handler.callbacks.append(recorder)
    paired = {"baseline": "eval_test_before.json", "strict": stats.paired([0, 0, 1, 1], [1, 1, 1, 0])}
    metrics = {"n": 8, "strict_accuracy": 0.25, "lenient_accuracy": 0.5, "format_rate": 0.75, "paired": paired}
    callbacks.log_point(trainer, metrics | {"strict_accuracy_ci95": [0.07, 0.59]})
    # every callback gets the eval_ keys, which the trackers write as eval/...; nothing of TRL's buffer is taken
    (logs,) = seen
    expected = {"eval_gsm8k_strict_accuracy": 0.25, "eval_gsm8k_lenient_accuracy": 0.5, "eval_gsm8k_format_rate": 0.75}
    expected |= {"eval_gsm8k_strict_accuracy_ci95_low": 0.07, "eval_gsm8k_strict_accuracy_ci95_high": 0.59}
    assert {key: value for key, value in logs.items() if key.startswith("eval_")} == expected
    assert trainer._metrics == {"train": {"reward": [0.5]}}
    assert trainer.state.log_history[-1]["step"] == 4  # kept in trainer_state.json with the checkpoints
    tensorboard.tb_writer.close()
    scalars = read_scalars(tmp_path)
    assert scalars["eval/gsm8k_strict_accuracy"] == [(4, 0.25)]  # one point, at the trainer's step
    assert scalars["eval/gsm8k_strict_accuracy_ci95_high"] == [(4, pytest.approx(0.59))]  # float32 in the event
    assert "eval/gsm8k_n" not in scalars  # only the accuracies and the format rate are curves
    # the paired test against EVAL_BEFORE as a text at the same step, its lines kept apart (markdown's "  \n")
    ((step, text),) = read_texts(tmp_path)["eval/paired"]
    assert step == 4 and text == "  \n".join(evaluation.paired_lines(paired))


# ---------------------------------------------------------------------------------------------------------------
# publish: one path to TensorBoard, W&B and trackio, alerts included


@pytest.mark.parametrize("report_to", [["tensorboard", "wandb", "trackio"], ["tensorboard"], ["wandb", "trackio"]])
def test_publish_sends_the_same_tags_to_every_tracker_of_report_to(tmp_path, trackers, report_to):
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    wandb, trackio = trackers
    # transformers' TensorBoardCallback holds a writer only where REPORT_TO names tensorboard
    tensorboard = TensorBoardCallback(SummaryWriter(str(tmp_path))) if "tensorboard" in report_to else None
    trainer = stand_in_trainer(report_to, callbacks_=[tensorboard] if tensorboard else [])
    scalars, texts = {"perf/seconds_per_step": 2.5}, {"health/advice": "**WARN** kl"}
    try:
        callbacks.publish(trainer, 5, scalars, texts)
    finally:
        if tensorboard:
            tensorboard.tb_writer.close()
    if tensorboard:
        assert read_scalars(tmp_path) == {"perf/seconds_per_step": [(5, 2.5)]}
        assert read_texts(tmp_path) == {"health/advice": [(5, "**WARN** kl")]}
    # W&B at train/global_step, as transformers logs it, the markdown as HTML; trackio at the step, as Markdown
    html = ("html", "<p><strong>WARN</strong> kl</p>")
    expect_wandb = [({"perf/seconds_per_step": 2.5, "health/advice": html, "train/global_step": 5}, None)]
    expect_trackio = [({"perf/seconds_per_step": 2.5, "health/advice": ("markdown", "**WARN** kl")}, 5)]
    assert wandb.logged == (expect_wandb if "wandb" in report_to else [])
    assert trackio.logged == (expect_trackio if "trackio" in report_to else [])


def test_publish_sends_nothing_from_other_processes(trackers):
    wandb, trackio = trackers
    trainer = stand_in_trainer(["wandb", "trackio"], main=False)
    callbacks.publish(trainer, 5, {"perf/eta_hours": 1.0}, {"perf/advice": "x"})
    assert wandb.logged == trackio.logged == []  # one copy per run: the main process's


def health_log(health, logs, step=3, main=True):
    state = TrainerState(global_step=step, is_world_process_zero=main)
    control = TrainerControl()
    control.should_save = True  # as DefaultFlowCallback sets it on a SAVE_STEPS step
    args = SimpleNamespace(reward_weights=None, num_generations=4)
    health.on_log(args, state, control, logs=logs)
    return control


def test_advice_becomes_an_alert_in_wandb_and_trackio(trackers):
    wandb, trackio = trackers
    health = callbacks.HealthMonitor(T, stand_in_trainer(["trackio", "wandb"]))
    health_log(health, {"kl": 25.0})
    health_log(health, {"loss": math.nan})
    # each advisory once per tracker, its level kept: a NaN stop is an error
    assert [(kw["title"], kw["level"]) for _, kw in wandb.alerts] == [("act kl", "warn"), ("stop nan", "error")]
    assert [(args[0], args[2], kw["step"]) for args, kw in trackio.alerts] == [
        ("act kl", "warn", 3),
        ("stop nan", "error", 3),
    ]
    assert all("BETA" in kw["text"] for _, kw in wandb.alerts) and all("BETA" in a[1] for a, _ in trackio.alerts)
    # and the text of each in health/advice, in both
    assert ["health/advice" in data for data, _ in wandb.logged] == [True, True]
    assert ["health/advice" in data for data, _ in trackio.logged] == [True, True]


# ---------------------------------------------------------------------------------------------------------------
# HealthMonitor


@pytest.mark.parametrize("world_zero", [True, False])
def test_health_monitor_stops_without_saving_on_every_rank(published, world_zero):
    health = callbacks.HealthMonitor(T, stand_in_trainer(main=world_zero))
    control = health_log(health, {"loss": 0.1, "grad_norm": 0.2}, main=world_zero)
    assert not control.should_training_stop and control.should_save  # a healthy log changes nothing
    control = health_log(health, {"loss": 0.1, "grad_norm": math.nan}, main=world_zero)
    # Every rank stops at the same log (the logs are the same on all ranks), and no rank saves the NaN weights.
    assert control.should_training_stop and not control.should_save
    assert health.stopped.signal == "nan"
    for event in ("on_step_end", "on_epoch_end"):  # nor later in the run
        control = TrainerControl(should_save=True)
        getattr(health, event)(None, TrainerState(global_step=4), control)
        assert not control.should_save
    assert len(published) == (1 if world_zero else 0)  # only the main process reports


def test_health_monitor_leaves_held_out_points_out_of_its_advice(published):
    health = callbacks.HealthMonitor(T, stand_in_trainer())
    health_log(health, {"eval_gsm8k_strict_accuracy": math.nan})
    # a held-out point is not a training log: no NaN stop, and the quiet-log count is untouched
    assert health.advisor.logs_seen == 0 and health.stopped is None and published == []


def test_a_reward_that_ties_every_group_reads_one_and_brings_the_zero_std_advice(published):
    # one reward giving every completion 1.2, 8 generations, 4 prompts a batch
    health = callbacks.HealthMonitor(T, stand_in_trainer(rewards={"constant_reward": [1.2] * 32}))
    args = SimpleNamespace(reward_weights=[1.0], num_generations=8)
    for step in range(1, T.zero_std_logs + 1):
        logs = {"reward": 1.2, "frac_reward_zero_std": 0.0}  # what TRL logs for such groups
        health.on_log(args, TrainerState(global_step=step, is_world_process_zero=True), TrainerControl(), logs=logs)
        assert logs["frac_tied_groups"] == 1.0  # every group tied, written into the log the trackers record
    # after ZERO_STD_LOGS logs in a row, the advice reads our tie fraction, not TRL's 0.0
    ((step, _, texts, _),) = published
    assert step == T.zero_std_logs and texts["health/advice"].startswith("**WARN** in 100% of groups all")


def test_advice_on_a_setting_the_profile_fixes_is_an_ok_note_and_no_alert(trackers):
    # --smoke sets MAX_COMPLETION_LENGTH short on purpose: its clipped completions are expected there
    wandb, trackio = trackers
    health = callbacks.HealthMonitor(T, stand_in_trainer(["wandb", "trackio"]), fixed=("MAX_COMPLETION_LENGTH",))
    control = health_log(health, {"completions/clipped_ratio": 0.9})
    ((logged, _),) = trackio.logged
    note = "90% of completions hit MAX_COMPLETION_LENGTH"  # said, as a note that asks for no change
    assert logged["health/advice"][1].startswith(f"**OK** {callbacks.md(note)}")
    assert wandb.alerts == trackio.alerts == [] and not control.should_training_stop


# ---------------------------------------------------------------------------------------------------------------
# PerfMonitor


@pytest.mark.parametrize("use_cpu", [False, True])
def test_perf_monitor_publishes_the_pace_and_names_the_lever_off_the_cpu(monkeypatch, caplog, published, use_cpu):
    clock = iter(range(0, 100, 5))  # perf_counter: 5 s per step
    monkeypatch.setattr(callbacks, "time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    perf = callbacks.PerfMonitor(SimpleNamespace(_generate=lambda prompts: prompts))
    args = SimpleNamespace(per_device_train_batch_size=8, steps_per_generation=8, use_vllm=False, use_cpu=use_cpu)
    state = SimpleNamespace(global_step=1, max_steps=100, is_world_process_zero=True)
    with caplog.at_level("INFO", logger="grpotrainer.monitor"):
        for step in (1, 2, 3):
            state.global_step = step
            perf.clock["seconds"] += 4.0  # 4 s of each 5 s step in generation, as HF generate makes it
            perf.on_step_end(args, state, None)
    # the first step is left out; two steps later: 5 s a step, 80 % of it generation, 97 steps to go
    assert "step 3/100: 5.0 s/step, ETA 8m05s, generation 80 % of the step" in caplog.text
    lever = advice.generation_advice(0.8, False, 64)  # vLLM, or more of a call's 64 sequences
    scalars = {"perf/seconds_per_step": 5.0, "perf/generation_share": 0.8, "perf/eta_hours": 97 * 5 / 3600}
    assert published == [(3, scalars, {} if use_cpu else {"perf/advice": callbacks.md(lever)}, [])]
    assert ("USE_VLLM" in caplog.text) == (not use_cpu)  # the CPU profiles have no generation lever to pull


# ---------------------------------------------------------------------------------------------------------------
# the completions table


def test_every_line_break_stays_inside_its_cell():
    # a lone \r (and the other breaks Python knows) once shifted a row's cells in 12 of 60 tables
    from tensorboard.plugin_util import markdown_to_safe_html

    for br in ("\r", "\r\n", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"):
        row = {"question": "Q", "completion": f"a{br}| b", "extracted": "6", "gold": "6", "rewards": {"r": 1.0}}
        rendered = markdown_to_safe_html(callbacks.render_table([{**row, "advantage": 0.5}]))
        assert rendered.count("<td>") == 6, repr(br)


def test_markdown_cells_cannot_format_break_the_table_or_inject_html():
    from tensorboard.plugin_util import markdown_to_safe_html

    nasty = "<think>**2 | 3**</think> [x](http://e.x) <script>alert(1)</script>\n#### 6 _a_ `b`"
    row = {
        "question": "Q | 1",
        "completion": nasty,
        "extracted": "6",
        "gold": "6",
        "rewards": {"r": 1.0},
        "advantage": 0.5,
    }
    rendered = markdown_to_safe_html(callbacks.render_table([row]))  # what TensorBoard's Text tab shows
    assert rendered.count("<td>") == 6  # question, completion, extracted, gold, r, advantage: no extra cell
    assert "&lt;think&gt;**2 | 3**&lt;/think&gt;" in rendered  # shown literally: no bold, no cell break
    assert "<script" not in rendered and "<a " not in rendered and "<em>" not in rendered and "<code>" not in rendered
    assert "<br />#### 6 _a_ `b`" in rendered or "<br>#### 6 _a_ `b`" in rendered  # the newline kept, as a break


def test_md_escapes_punctuation_and_html_and_keeps_line_breaks():
    # moved from md's docstring
    assert (
        callbacks.md("<think>2*3</think>\n#### 6 | ok") == "&lt;think&gt;2\\*3&lt;/think&gt;<br>\\#\\#\\#\\# 6 \\| ok"
    )


def test_sample_rows_spread_over_prompts_with_gold_and_rewards():
    # records as TRL's completions_NNNNN.parquet holds them: prompt, completion, one column per reward function,
    # the log_extra columns (extracted, gold) and the advantage
    prompt = lambda q: [{"role": "system", "content": "S"}, {"role": "user", "content": q}]  # noqa: E731
    correctness, advantages = [0.0, 1.0, 0.0, 0.0, 0.0, 1.0], [-0.5, 1.0, -0.5, -0.5, -0.5, 1.0]
    records = [
        {
            "step": 3,
            "prompt": prompt("A?" if i < 3 else "B?"),
            "completion": [{"role": "assistant", "content": f"#### {i}"}],
            "correctness_reward": correctness[i],
            "format_reward": 1.0,
            "extracted": str(i),
            "gold": "1" if i < 3 else "5",
            "advantage": advantages[i],
        }
        for i in range(6)
    ]
    rows = callbacks.sample_rows(records, ["correctness_reward", "format_reward"], n=4)
    # Round robin: first completions of A and B (0, 3), then second ones (1, 4); shown in batch order.
    assert [(r["question"], r["completion"], r["gold"], r["extracted"]) for r in rows] == [
        ("A?", "#### 0", "1", "0"),
        ("A?", "#### 1", "1", "1"),
        ("B?", "#### 3", "5", "3"),
        ("B?", "#### 4", "5", "4"),
    ]
    assert [r["rewards"]["correctness_reward"] for r in rows] == [0.0, 1.0, 0.0, 0.0]
    assert [r["advantage"] for r in rows] == [-0.5, 1.0, -0.5, -0.5]
    # without the log_extra columns (a run without correctness_reward): extracted here, gold unknown
    bare = [{k: v for k, v in r.items() if k not in ("extracted", "gold")} for r in records]
    assert [(r["extracted"], r["gold"]) for r in callbacks.sample_rows(bare, [], n=1)] == [("0", None)]


@pytest.mark.parametrize(("every", "due"), [(3, [3, 6]), (1, [1, 2, 3, 4, 5, 6]), (0, [])])
def test_completions_are_logged_every_n_steps(every, due):
    trainer = SimpleNamespace(log_completions=True)
    samples = callbacks.CompletionSamples(trainer, every)
    logged = []
    for step in range(1, 7):
        samples.on_step_end(None, TrainerState(global_step=step), TrainerControl())
        samples.on_log(None, TrainerState(global_step=step), TrainerControl(), logs={"reward": 0.5})
        if trainer.log_completions:  # what GRPOTrainer.log reads at this step's log, after the callbacks
            logged.append(step)
    summary = {"train_runtime": 1.0, "train_loss": 0.0}  # the train-end log: no new completions, so no table
    samples.on_log(None, TrainerState(global_step=6), TrainerControl(), logs=summary)
    assert logged == due and not trainer.log_completions
