"""grpo/monitor.py: every health advisory on synthetic logs, the clean NaN stop, the completions table. The smoke
run whose TensorBoard events hold them is in test_smoke.py, the NaN reward run in test_e2e_faults.py.

    python -m pytest tests/test_monitor.py -q
"""

import json
import math
import sys
import time
from dataclasses import replace
from types import SimpleNamespace

import pytest
from conftest import REPO
from transformers import TrainerControl, TrainerState

from grpo import monitor

T = advice.Thresholds(
    kl_warn=10.0,
    kl_act=20.0,
    zero_std_frac=0.9,
    zero_std_logs=3,
    reward_flat_window=4,
    reward_flat_delta=0.02,
    clipped_ratio_max=0.2,
    grad_norm_max=50.0,
)


SETTINGS = {
    "beta": 0.05,
    "learning_rate": 1e-05,
    "num_generations": 4,
    "temperature": 0.7,
    "max_completion_length": 256,
}


HEALTHY = {"loss": 0.01, "grad_norm": 0.3, "kl": 0.02, "frac_reward_zero_std": 0.25}  # no reward: flat if constant


def advise(*logs, thresholds=T, **kwargs):
    """Feed logs to a fresh Advisor; return the advisories shown after each log, and the Advisor."""
    advisor = advice.Advisor(thresholds, SETTINGS, **kwargs)
    return [advisor.update({**HEALTHY, **log}, step) for step, log in enumerate(logs, start=1)], advisor


def test_a_healthy_run_gets_no_advice():
    shown, advisor = advise(*[{"reward": r} for r in (0.5, 0.6, 0.7, 0.8, 0.9)])
    # A rising reward is not flat: at log 4 the window's halves average 0.55 and 0.75.
    assert shown == [[]] * 5 and advisor.stop is None


@pytest.mark.parametrize(
    ("kl", "level", "quoted"),
    [
        (10.0, None, None),  # at the threshold is not above it
        (12.5, "warn", "kl is 12.5 (> KL_WARN=10)"),
        (25.0, "act", "kl is 25 (> KL_ACT=20)"),
    ],
)
def test_kl_advice(kl, level, quoted):
    (shown,), _ = advise({"kl": kl})
    assert [a.level for a in shown] == ([level] if level else [])
    if level:
        assert quoted in shown[0].message
        assert "BETA (now 0.05" in shown[0].message and "LEARNING_RATE (now 1e-05" in shown[0].message


def test_an_advisory_repeats_only_after_a_while_or_when_it_gets_worse():
    shown, _ = advise(*[{"kl": 12.0}] * 4, {"kl": 25.0}, {"kl": 26.0}, repeat_after=3)
    # warn at log 1, quiet at 2-3, repeated at 4 (3 logs later), act at 5 (more severe), quiet at 6 (just shown).
    assert [[a.level for a in s] for s in shown] == [["warn"], [], [], ["warn"], ["act"], []]


def test_zero_std_fires_after_zero_std_logs_in_a_row():
    logs = [{"frac_reward_zero_std": f} for f in (1.0, 1.0, 0.5, 0.95, 1.0, 0.9)]
    shown, _ = advise(*logs)
    # The 0.5 at log 3 resets the run; logs 4, 5, 6 make ZERO_STD_LOGS = 3 in a row (0.9 counts: at least).
    assert [[a.signal for a in s] for s in shown] == [[], [], [], [], [], ["zero_std"]]
    message = shown[5][0].message
    assert "ZERO_STD_FRAC=0.9" in message and "for 3 logs in a row" in message
    assert "NUM_GENERATIONS (now 4)" in message and "TEMPERATURE (now 0.7)" in message


def test_flat_reward_over_the_window():
    shown, _ = advise(*[{"reward": r} for r in (0.10, 0.11, 0.11, 0.10)])
    # Halves (0.10 + 0.11) / 2 and (0.11 + 0.10) / 2 are equal: flat once the 4-log window is full, not before.
    assert [[a.signal for a in s] for s in shown] == [[], [], [], ["flat_reward"]]
    assert "REWARD_FLAT_WINDOW=4" in shown[3][0].message and "0.105 -> 0.105" in shown[3][0].message


def test_a_plateau_without_signal_is_not_called_flat():
    # A learning run's prelude: most groups score all alike (frac_reward_zero_std near 1) and the reward sits near
    # 0 until GRPO finds its first signal; "flat, raise LEARNING_RATE" there was advice given just before the jump.
    plateau = [{"reward": r, "frac_reward_zero_std": z} for r, z in [(0.0, 1.0), (0.25, 0.0), (0.0, 1.0), (0.0, 1.0)]]
    shown, _ = advise(*plateau)
    assert "flat_reward" not in [a.signal for s in shown for a in s]


def test_exploding_gradients_advise_a_lower_learning_rate():
    (quiet, loud), _ = advise({"grad_norm": 50.0}, {"grad_norm": 3e4})
    assert quiet == [] and [a.signal for a in loud] == ["diverging"]
    assert "GRAD_NORM_MAX=50" in loud[0].message and "Lower LEARNING_RATE (now 1e-05" in loud[0].message


def test_entropy_pinned_at_noise_advises_a_lower_learning_rate():
    # vocab 512: log(512) = 6.24 nats is uniform noise; a model that began at 1.0 and sits at 6.1 has diverged ...
    advisor = advice.Advisor(T, {**SETTINGS, "vocab_size": 512})
    shown = [advisor.update({**HEALTHY, "entropy": e}) for e in (1.0, 6.1, 6.1, 6.1)]
    assert [[a.signal for a in s] for s in shown] == [[], [], [], ["diverging"]]
    assert "uniform noise" in shown[3][0].message and "LEARNING_RATE" in shown[3][0].message
    # ... but a random model that starts as noise (the smoke model) has not
    advisor = advice.Advisor(T, {**SETTINGS, "vocab_size": 512})
    assert [advisor.update({**HEALTHY, "entropy": 6.1}) for _ in range(5)] == [[]] * 5


def test_every_line_break_stays_inside_its_cell():
    # a lone \r (and the other breaks Python knows) once shifted a row's cells in 12 of 60 tables
    from tensorboard.plugin_util import markdown_to_safe_html

    for br in ("\r", "\r\n", "\n", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"):
        row = {"question": "Q", "completion": f"a{br}| b", "extracted": "6", "gold": "6", "rewards": {"r": 1.0}}
        rendered = markdown_to_safe_html(callbacks.render_table([{**row, "advantage": 0.5}]))
        assert rendered.count("<td>") == 6, repr(br)


def test_flat_reward_is_off_with_a_zero_window():
    shown, _ = advise(*[{"reward": 0.1}] * 6, thresholds=replace(T, reward_flat_window=0))
    assert shown == [[]] * 6


def test_clipped_completions_advice():
    (quiet, loud), _ = advise({"completions/clipped_ratio": 0.2}, {"completions/clipped_ratio": 0.75})
    assert quiet == []  # at the threshold is not above it
    assert [a.signal for a in loud] == ["clipped"]
    assert "75% of completions hit MAX_COMPLETION_LENGTH (now 256 tokens)" in loud[0].message
    assert "CLIPPED_RATIO_MAX=0.2" in loud[0].message and "MASK_TRUNCATED_COMPLETIONS=True" in loud[0].message


def test_clipped_advice_does_not_lengthen_or_mask_completions_that_pad():
    # cut off because they repeat their answer to the limit: more room or a mask would only hide the padding
    (shown,), _ = advise({"completions/clipped_ratio": 0.5, "completions/padded_ratio": 0.45})
    assert [a.signal for a in shown] == ["clipped"]
    assert "MASK_TRUNCATED_COMPLETIONS=True" not in shown[0].message and "padded_ratio 45%" in shown[0].message


def padded(*shares):
    return [{"completions/padded_ratio": share} for share in shares]


@pytest.mark.parametrize(
    ("shares", "fires_at"),
    [
        ((0.05, 0.1, 0.3, 0.4, 0.5, 0.6), 5),  # 0.3, 0.4, 0.5: three logs in a row 0.2 above the lowest, 0.05
        ((0.0, 0.5, 0.0, 0.5, 0.0, 0.5), None),  # noise: never three in a row
        ((0.6, 0.6, 0.65, 0.6, 0.7, 0.6), None),  # a base model that pads from the start: high, but not rising
        ((0.1,) * 6, None),
    ],
)
def test_padded_advice_fires_when_the_share_of_padded_completions_rises(shares, fires_at):
    shown, _ = advise(*padded(*shares), thresholds=replace(T, reward_flat_window=0))
    fired = [i for i, advice in enumerate(shown, start=1) if any(a.signal == "padded" for a in advice)]
    assert fired[:1] == ([fires_at] if fires_at else [])


def test_padded_advice_names_the_share_and_what_to_change():
    settings = {**SETTINGS, "mask_truncated_completions": True}
    advisor = advice.Advisor(replace(T, reward_flat_window=0), settings)
    shown = [advisor.update({**HEALTHY, **log}) for log in padded(0.0, 0.5, 0.6, 0.7)]
    (advice,) = shown[-1]
    assert advice.level == "warn"
    assert "70% of completions repeat or pad past their final answer" in advice.message
    assert "up from 0%" in advice.message  # the run's lowest share, the baseline it rose from
    assert "MASK_TRUNCATED_COMPLETIONS=True" in advice.message  # it hides the cost of padding to the limit
    unmasked = advice.Advisor(replace(T, reward_flat_window=0), SETTINGS)
    (advice,) = [unmasked.update({**HEALTHY, **log}) for log in padded(0.0, 0.5, 0.6, 0.7)][-1]
    assert "MASK_TRUNCATED_COMPLETIONS" not in advice.message  # not the cause here: the rewards, or tied groups
    assert "REWARD_FUNCS" in advice.message and "NUM_GENERATIONS (now 4)" in advice.message


@pytest.mark.parametrize(
    ("key", "value", "names"),
    [
        ("loss", math.nan, "LEARNING_RATE (now 1e-05)"),
        ("grad_norm", math.inf, "LEARNING_RATE (now 1e-05)"),  # what a NaN step leaves when Trainer hides its loss
        ("kl", math.nan, "BETA (now 0.05)"),
        ("reward", None, "REWARD_FUNCS"),  # TRL logs None when every reward was None or NaN
        ("reward", math.nan, "REWARD_FUNCS"),
    ],
)
def test_nan_stops(key, value, names):
    (healthy, shown), advisor = advise({}, {key: value})
    assert healthy == [] and [a.level for a in shown] == ["stop"]
    assert advisor.stop is shown[0]
    assert shown[0].message.startswith(f"{key} is {value} at step 2")
    assert names in shown[0].message and "checkpoint-N in OUTPUT_DIR is kept" in shown[0].message


def test_thresholds_are_read_from_the_settings(settings):
    t = advice.Thresholds.from_settings({**settings, "KL_WARN": 3.0, "GRAD_NORM_MAX": 7.0})
    assert (t.kl_warn, t.kl_act, t.clipped_ratio_max, t.grad_norm_max) == (3.0, settings["KL_ACT"], 0.2, 7.0)


def callback_event(callback, method, logs=None, world_zero=True, step=7):
    state = TrainerState(global_step=step, is_world_process_zero=world_zero)
    control = TrainerControl()
    control.should_save = True  # as DefaultFlowCallback sets it on a SAVE_STEPS step
    getattr(callback, method)(None, state, control, logs=logs)
    return control


@pytest.mark.parametrize("world_zero", [True, False])
def test_health_monitor_stops_without_saving_on_every_rank(world_zero):
    health = callbacks.HealthMonitor(T)
    control = callback_event(health, "on_log", {"loss": 0.1, "grad_norm": 0.2}, world_zero)
    assert not control.should_training_stop and control.should_save  # a healthy log changes nothing
    control = callback_event(health, "on_log", {"loss": 0.1, "grad_norm": math.nan}, world_zero)
    # Every rank stops at the same log (the logs are the same on all ranks), and no rank saves the NaN weights.
    assert control.should_training_stop and not control.should_save
    assert health.stopped.signal == "nan"
    assert not callback_event(health, "on_step_end").should_save  # nor later in the run
    assert not callback_event(health, "on_epoch_end").should_save
    assert len(health.advice) == (1 if world_zero else 0)  # only the main process reports


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


def test_only_latest_rewards_reads_trls_private_logs():
    # TRL has no public hook for a batch's rewards: one named function reads them (patches.latest_rewards)
    for path in [*REPO.glob("*.py"), *REPO.glob("grpo/*.py")]:
        text = path.read_text(encoding="utf-8")
        uses = text.count('_logs"') + text.count("._logs")
        assert uses == (1 if path.name == "monitor.py" else 0), path.name
    source = (REPO / "grpo" / "monitor.py").read_text(encoding="utf-8")
    assert 'getattr(trainer, "_logs", None)' in source.split("def latest_rewards")[1].split("\ndef ")[0]


# --- ties at any group size, the "healthy" line ----------------------------------------------------------------


@pytest.mark.parametrize("group", [8, 16])
@pytest.mark.parametrize("weights", [[1.0, 0.2], [0.7, 0.35]])
def test_tied_groups_are_counted_at_any_group_size(group, weights):

    # every completion of the first half of the groups right and formatted (1 x w0 + 1 x w1), the rest varied
    tied, varied = 3, 1
    correct = [1.0] * group * tied + [float(i % 2) for i in range(group * varied)]
    formatted = [1.0] * group * (tied + varied)
    assert advice.tied_fraction([correct, formatted], weights, group) == tied / (tied + varied)


def test_trls_zero_std_test_misses_a_tie_of_eight_rewards_of_1_2():
    import torch

    # TRL 1.16: is_std_zero = torch.isclose(std, 0), atol 1e-8; eight equal float32 rewards of 1.2 have std ~1.3e-7
    std = torch.tensor([1.2] * 8, dtype=torch.float32).std()
    assert not torch.isclose(std, torch.zeros_like(std))
    assert advice.tied_fraction([[1.2] * 8], [1.0], 8) == 1.0  # our count sees the tie


class _FakeTrainer:
    """What HealthMonitor reads of a GRPOTrainer: the reward names and TRL's latest generation batch."""

    def __init__(self, rewards):
        self.reward_func_names = list(rewards)
        self._logs = {"rewards": rewards}
        self.callback_handler = SimpleNamespace(callbacks=[])  # no TensorBoard: advice is printed only


def test_a_reward_that_ties_every_group_reads_one_and_brings_the_zero_std_advice():
    # one reward giving every completion 1.2, 8 generations, 4 prompts a batch
    trainer = _FakeTrainer({"constant_reward": [1.2] * 32})
    health = callbacks.HealthMonitor(T, trainer)
    args = SimpleNamespace(reward_weights=[1.0], num_generations=8)
    for step in range(1, T.zero_std_logs + 1):
        logs = {"reward": 1.2, "frac_reward_zero_std": 0.0}  # what TRL logs for such groups
        health.on_log(args, TrainerState(global_step=step, is_world_process_zero=True), TrainerControl(), logs=logs)
        assert logs["frac_tied_groups"] == 1.0  # every group tied, written into the log the trackers record
    # after ZERO_STD_LOGS logs in a row, the advice reads our tie fraction, not TRL's 0.0
    assert [a.signal for a in health.advice] == ["zero_std"]
    assert "in 100% of groups all" in health.advice[0].message


def test_a_quiet_run_says_it_is_healthy_every_n_logs():
    advisor = advice.Advisor(T, SETTINGS, healthy_every=3)
    shown = [advisor.update({**HEALTHY, "reward": 0.5 + step / 10}, step) for step in range(1, 7)]
    # logs 3 and 6: an explicit line, so silence between them is not a monitor that stopped
    assert [[a.level for a in s] for s in shown] == [[], [], ["ok"], [], [], ["ok"]]
    assert str(shown[2][0]).startswith("OK healthy: at step 3 no advice for 3 logs (reward 0.8, kl 0.02")


def test_time_generation_counts_the_generation_calls():
    calls = []

    def generate(prompts):
        calls.append(prompts)
        time.sleep(0.01)
        return ["done"] * len(prompts)

    trainer = SimpleNamespace(_generate=generate)
    clock = patches.time_generation(trainer)
    assert trainer._generate(["a", "b"]) == ["done", "done"]  # what the trainer's own call returns, unchanged
    assert clock["calls"] == 1 and clock["seconds"] >= 0.01 and calls == [["a", "b"]]


def test_time_generation_wraps_trls_own_method():
    from trl import GRPOTrainer

    # the private method time_generation wraps must still be the one generation goes through
    assert callable(GRPOTrainer._generate)


def test_every_eval_point_is_kept(tmp_path):
    for step in (2, 4, 6):
        evaluation.append_eval_point(tmp_path, "during", step, {"n": 8, "lenient_accuracy": step / 10})
    evaluation.append_eval_point(tmp_path, "after", 6, {"n": 32})
    rows = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [(r["step"], r["when"]) for r in rows] == [(2, "during"), (4, "during"), (6, "during"), (6, "after")]
    assert rows[1]["metrics"]["lenient_accuracy"] == 0.4


@pytest.mark.parametrize(("solved", "lever"), [(0.95, "harder subset"), (0.3, "tells the responses apart")])
def test_tied_groups_advice_names_the_levers_for_a_model_that_already_solves_most(solved, lever):
    thresholds = advice.Thresholds(10.0, 20.0, 0.9, 2, 0, 0.02, 0.2, 50.0)
    advisor = advice.Advisor(thresholds, {"num_generations": 8, "temperature": 0.7})
    logs = {"frac_tied_groups": 0.95, "rewards/correctness_reward/mean": solved}
    (shown,) = [advisor.update(logs, step) for step in (1, 2)][-1]
    # mostly solved: the groups are all right, so the levers are a larger group, TEMPERATURE and harder data
    assert shown.signal == "zero_std" and lever in shown.message and "NUM_GENERATIONS (now 8)" in shown.message


def test_perf_monitor_logs_the_pace_and_names_the_lever(caplog):
    trainer = SimpleNamespace(_generate=lambda prompts: prompts, callback_handler=SimpleNamespace(callbacks=[]))
    perf = callbacks.PerfMonitor(trainer)
    args = SimpleNamespace(per_device_train_batch_size=8, steps_per_generation=8, use_vllm=False)
    state = SimpleNamespace(global_step=1, max_steps=100, is_world_process_zero=True)
    with caplog.at_level("INFO", logger="grpotrainer.monitor"):
        for step in (1, 2, 3):
            state.global_step = step
            perf.clock["seconds"] += 5.0  # a step that is nearly all generation, as HF generate makes it
            perf.on_step_end(args, state, None)
    # the first step is left out; two steps later the pace, then the lever: vLLM and a call's 64 sequences
    assert "step 3/100:" in caplog.text and "generation 100 % of the step" in caplog.text
    assert "USE_VLLM" in caplog.text and "(now 64)" in caplog.text


def test_held_out_points_reach_the_trackers_through_the_trainers_log_once(tmp_path):
    from conftest import read_scalars
    from transformers import TrainingArguments
    from transformers.integrations import TensorBoardCallback
    from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

    tensorboard = TensorBoardCallback()
    tensorboard.logging_dir = str(tmp_path)
    seen = []
    recorder = SimpleNamespace(on_log=lambda args, state, control, logs=None, **kw: seen.append(dict(logs)))
    trainer = SimpleNamespace(
        args=TrainingArguments(output_dir=str(tmp_path), report_to=[]),
        state=TrainerState(global_step=4, is_world_process_zero=True),
        control=TrainerControl(),
        callback_handler=CallbackHandler([DefaultFlowCallback(), tensorboard], None, None, None, None),
        _metrics={"train": {"reward": [0.5]}},  # GRPOTrainer's buffer of training metrics, averaged at its next log
    )
    trainer.callback_handler.callbacks.append(recorder)
    callbacks.log_metrics(trainer, {"n": 8, "strict_accuracy": 0.25, "lenient_accuracy": 0.5, "format_rate": 0.75})
    # every callback gets the eval_ keys, which the trackers write as eval/...; nothing of TRL's buffer is taken
    (logs,) = seen
    expected = {"eval_gsm8k_strict_accuracy": 0.25, "eval_gsm8k_lenient_accuracy": 0.5, "eval_gsm8k_format_rate": 0.75}
    assert {key: value for key, value in logs.items() if key.startswith("eval_")} == expected
    assert trainer._metrics == {"train": {"reward": [0.5]}}
    assert trainer.state.log_history[-1]["step"] == 4  # kept in trainer_state.json with the checkpoints
    tensorboard.tb_writer.close()
    scalars = read_scalars(tmp_path)
    assert scalars["eval/gsm8k_strict_accuracy"] == [(4, 0.25)]  # one point, at the trainer's step
    assert "eval/gsm8k_n" not in scalars  # only the accuracies and the format rate are curves


def test_health_monitor_leaves_held_out_points_out_of_its_advice():
    health = callbacks.HealthMonitor(T)
    callback_event(health, "on_log", {"eval_gsm8k_strict_accuracy": math.nan})
    # a held-out point is not a training log: no NaN stop, and the quiet-log count is untouched
    assert health.advisor.logs_seen == 0 and health.stopped is None


@pytest.mark.parametrize(("every", "due"), [(3, [3, 6]), (1, [1, 2, 3, 4, 5, 6]), (0, [])])
def test_completions_are_logged_every_n_steps(every, due):
    trainer = SimpleNamespace(log_completions=True)
    samples = callbacks.CompletionSamples(trainer, every)
    logged = []
    for step in range(1, 7):
        samples.on_step_end(None, TrainerState(global_step=step), TrainerControl())
        if trainer.log_completions:  # what GRPOTrainer.log reads at this step's log
            logged.append(step)
    assert logged == due


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 8, 9])
def test_every_rank_scores_a_shard_of_the_same_length(n, world):
    shards = [evaluation.shard_indices(n, rank, world) for rank in range(world)]
    assert len({len(shard) for shard in shards}) == 1  # the same generate calls on every rank (ZeRO-3, FSDP)
    gathered = [i for shard in shards for i in shard]  # gather_object's order: rank 0's first
    assert gathered[:n] == list(range(n)) and set(gathered[n:]) <= {n - 1}  # each problem once, then padding


def test_advice_becomes_an_alert_in_wandb_and_trackio(monkeypatch):
    alerts = []
    levels = SimpleNamespace(WARN="warn", ERROR="error")
    run = SimpleNamespace(alert=lambda **alert: alerts.append(("wandb", alert)))
    monkeypatch.setitem(sys.modules, "wandb", SimpleNamespace(run=run, AlertLevel=levels))
    trackio = SimpleNamespace(alert=lambda **alert: alerts.append(("trackio", alert)), AlertLevel=levels)
    monkeypatch.setitem(sys.modules, "trackio", trackio)
    health = callbacks.HealthMonitor(T)
    args = SimpleNamespace(report_to=["trackio", "wandb"], reward_weights=None, num_generations=4)
    state = TrainerState(global_step=3, is_world_process_zero=True)
    health.on_log(args, state, TrainerControl(), logs={"kl": 25.0})
    health.on_log(args, state, TrainerControl(), logs={"loss": math.nan})
    # each advisory once per tracker, its level kept: a NaN stop is an error
    sent = [(tracker, a["title"], a["level"]) for tracker, a in alerts]
    expected = [(t, "act kl", "warn") for t in ("wandb", "trackio")] + [
        (t, "stop nan", "error") for t in ("wandb", "trackio")
    ]
    assert sorted(sent) == sorted(expected)
    assert all("BETA" in a["text"] for _, a in alerts)
