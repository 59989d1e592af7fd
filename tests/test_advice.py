"""Tests of grpo/advice.py: every health advisory on synthetic logs, the NaN stop, a note for what a profile fixes on
purpose, the tie count TRL's zero-std test misses, and the pace and generation lines. The callbacks that feed the
Advisor and publish what it says are in test_callbacks.py.

    .venv/bin/python -m pytest tests/test_advice.py -q
"""

import math
from dataclasses import replace

import pytest
from conftest import advice_thresholds

from grpo import advice

T = advice_thresholds()


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


@pytest.mark.parametrize(("solved", "lever"), [(0.95, "harder subset"), (0.3, "tells the responses apart")])
def test_tied_groups_advice_names_the_levers_for_a_model_that_already_solves_most(solved, lever):
    thresholds = advice.Thresholds(10.0, 20.0, 0.9, 2, 0, 0.02, 0.2, 50.0)
    advisor = advice.Advisor(thresholds, {"num_generations": 8, "temperature": 0.7})
    logs = {"frac_tied_groups": 0.95, "rewards/correctness_reward/mean": solved}
    (shown,) = [advisor.update(logs, step) for step in (1, 2)][-1]
    # mostly solved: the groups are all right, so the levers are a larger group, TEMPERATURE and harder data
    assert shown.signal == "zero_std" and lever in shown.message and "NUM_GENERATIONS (now 8)" in shown.message


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


def test_flat_reward_is_off_with_a_zero_window():
    shown, _ = advise(*[{"reward": 0.1}] * 6, thresholds=replace(T, reward_flat_window=0))
    assert shown == [[]] * 6


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
    fired = [i for i, said in enumerate(shown, start=1) if any(a.signal == "padded" for a in said)]
    assert fired[:1] == ([fires_at] if fires_at else [])


def test_padded_advice_names_the_share_and_what_to_change():
    settings = {**SETTINGS, "mask_truncated_completions": True}
    advisor = advice.Advisor(replace(T, reward_flat_window=0), settings)
    shown = [advisor.update({**HEALTHY, **log}) for log in padded(0.0, 0.5, 0.6, 0.7)]
    (said,) = shown[-1]
    assert said.level == "warn"
    assert "70% of completions repeat or pad past their final answer" in said.message
    assert "up from 0%" in said.message  # the run's lowest share, the baseline it rose from
    assert "MASK_TRUNCATED_COMPLETIONS=True" in said.message  # it hides the cost of padding to the limit
    unmasked = advice.Advisor(replace(T, reward_flat_window=0), SETTINGS)
    (said,) = [unmasked.update({**HEALTHY, **log}) for log in padded(0.0, 0.5, 0.6, 0.7)][-1]
    assert "MASK_TRUNCATED_COMPLETIONS" not in said.message  # not the cause here: the rewards, or tied groups
    assert "REWARD_FUNCS" in said.message and "NUM_GENERATIONS (now 4)" in said.message


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


def test_a_quiet_run_says_it_is_healthy_every_n_logs():
    advisor = advice.Advisor(T, SETTINGS, healthy_every=3)
    shown = [advisor.update({**HEALTHY, "reward": 0.5 + step / 10}, step) for step in range(1, 7)]
    # logs 3 and 6: an explicit line, so silence between them is not a monitor that stopped
    assert [[a.level for a in s] for s in shown] == [[], [], ["ok"], [], [], ["ok"]]
    assert str(shown[2][0]).startswith("OK healthy: at step 3 no advice for 3 logs (reward 0.8, kl 0.02")


def test_thresholds_are_read_from_the_settings(settings):
    # every field from the constant of its name in capitals (grpotrainer.py has one for each field without a
    # default); an override on the command line arrives the same way
    t = advice.Thresholds.from_settings({**settings, "KL_WARN": 3.0, "GRAD_NORM_MAX": 7.0})
    assert (t.kl_warn, t.kl_act, t.grad_norm_max) == (3.0, settings["KL_ACT"], 7.0)
    assert t.clipped_ratio_max == settings["CLIPPED_RATIO_MAX"]


@pytest.mark.parametrize("group", [8, 16])
@pytest.mark.parametrize("weights", [[1.0, 0.2], [0.7, 0.35]])
def test_tied_groups_are_counted_at_any_group_size(group, weights):

    # every completion of the first half of the groups right and formatted (1 x w0 + 1 x w1), the rest varied
    tied, varied = 3, 1
    correct = [1.0] * group * tied + [float(i % 2) for i in range(group * varied)]
    formatted = [1.0] * group * (tied + varied)
    assert advice.tied_fraction([correct, formatted], weights, group) == tied / (tied + varied)


def test_a_group_of_weighted_rewards_is_tied_or_not():
    # moved from tied_fraction's docstring: two groups of 8, the first all 1.0, the second seven 0.0 and a 1.0
    assert advice.tied_fraction([[1.0] * 8 + [0.0] * 7 + [1.0]], [1.2], 8) == 0.5


def test_trls_zero_std_test_misses_a_tie_of_eight_rewards_of_1_2():
    import torch

    # TRL 1.16: is_std_zero = torch.isclose(std, 0), atol 1e-8; eight equal float32 rewards of 1.2 have std ~1.3e-7
    std = torch.tensor([1.2] * 8, dtype=torch.float32).std()
    assert not torch.isclose(std, torch.zeros_like(std))
    assert advice.tied_fraction([[1.2] * 8], [1.0], 8) == 1.0  # our count sees the tie


@pytest.mark.parametrize("fixed", [(), ("MAX_COMPLETION_LENGTH",)])
def test_advice_on_a_setting_the_profile_fixes_is_an_ok_note(fixed):
    # --smoke sets MAX_COMPLETION_LENGTH short on purpose: clipped completions are expected, not to be fixed there
    advisor = advice.Advisor(T, SETTINGS, fixed=fixed)
    (said,) = advisor.update({**HEALTHY, "completions/clipped_ratio": 0.75}, 1)
    assert said.signal == "clipped"
    assert said.message.startswith("75% of completions hit MAX_COMPLETION_LENGTH (now 256 tokens) unfinished")
    if fixed:
        assert said.level == "ok" and said.message.endswith(
            "expected here, as this profile sets MAX_COMPLETION_LENGTH."
        )
        assert "Raise MAX_COMPLETION_LENGTH" not in said.message  # asks for nothing
    else:
        assert said.level == "warn" and "Raise MAX_COMPLETION_LENGTH" in said.message
    assert advisor.stop is None


def test_a_fixed_setting_leaves_the_other_advice_as_it_is():
    advisor = advice.Advisor(T, SETTINGS, fixed=("MAX_COMPLETION_LENGTH",))
    shown = advisor.update({**HEALTHY, "kl": 25.0, "completions/clipped_ratio": 0.75}, 1)
    assert [(a.signal, a.level) for a in shown] == [("kl", "act"), ("clipped", "ok")]


def test_the_pace_line():
    # moved from progress_line's docstring
    assert (
        advice.progress_line(5, 300, 12.3, 0.78) == "step 5/300: 12.3 s/step, ETA 1h00m, generation 78 % of the step"
    )


@pytest.mark.parametrize(
    ("share", "use_vllm", "lever"),
    [
        (0.6, False, None),  # at the threshold is not above it
        (0.9, False, "set USE_VLLM=True"),  # HF generate: vLLM first, or more sequences per call
        (0.9, True, "raise STEPS_PER_GENERATION"),  # vLLM already: more sequences per call
    ],
)
def test_generation_advice_names_the_lever_when_generation_dominates(share, use_vllm, lever):
    assert advice.generation_advice(0.4) is None  # moved from generation_advice's docstring
    said = advice.generation_advice(share, use_vllm, sequences_per_call=64)
    if lever is None:
        assert said is None
    else:
        assert said.startswith(f"generation takes {share * 100:.0f} % of each step") and lever in said
        assert ("USE_VLLM" in said) == (not use_vllm) and "(now 64)" in said
