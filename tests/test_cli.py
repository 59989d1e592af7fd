"""grpo/cli.py: the command line of the three scripts, read in one place: --KEY=value typed by its default, TRL's and
old names read as constants, GRPOConfig's other fields passed through, profiles, --plan, --help and `~`.

.venv/bin/python -m pytest tests/test_cli.py -q
"""

import dataclasses
import re

import pytest
from conftest import parse

import evaluate
import export
import grpotrainer
from grpo import cli, files
from grpo.errors import ConfigError

SCRIPTS = [grpotrainer, evaluate, export]


def test_grpoconfig_field_names_are_read_from_trls_source_exactly():
    from trl import GRPOConfig

    # the ast reading follows GRPOConfig's file and TrainingArguments', init fields only, without importing trl
    assert cli.source_fields() == {f.name for f in dataclasses.fields(GRPOConfig) if f.init}


# ---------------------------------------------------------------------------------------------------------------
# TRL's names: read as the constant they mean, or refused with what to type


@pytest.mark.parametrize(
    ("args", "constant", "value"),
    [
        (["--output_dir=runs/a"], "OUTPUT_DIR", "runs/a"),  # a GRPOConfig field a constant of its name sets
        (["--learning_rate", "1e-5"], "LEARNING_RATE", 1e-5),  # with a space, as TrlParser reads it
        (["--gradient_checkpointing=false"], "ACTIVATION_CHECKPOINTING", False),  # a field under another name
        (["--no_gradient_checkpointing"], "ACTIVATION_CHECKPOINTING", False),  # HfArgumentParser's --no_X
        (["--model_name_or_path", "models/m"], "MODEL_NAME", "models/m"),  # trl grpo's ModelConfig names
        (["--attn_implementation=sdpa"], "ATTN_IMPLEMENTATION", "sdpa"),
        (["--lora_r", "8"], "LORA_R", 8),
        (["--lora_target_modules", "q_proj", "v_proj"], "LORA_TARGET_MODULES", "q_proj,v_proj"),  # nargs="+"
        (["--dataset_name=data/gsm8k.jsonl"], "DATASET", "data/gsm8k.jsonl"),
        (["--torch_dtype=float32"], "BF16", False),  # open-r1's recipes' name for the dtype
        (["--dtype=bfloat16"], "BF16", True),  # TRL 1.x's
        (["--log_completions"], "LOG_COMPLETIONS_STEPS", 1),  # TRL's switch: a table every step
        (["--load_in_4bit"], "LOAD_IN_4BIT", True),  # a bare boolean is true, as argparse reads it
        (["--warmup_ratio=0.05"], "WARMUP_STEPS", 0.05),  # below 1, WARMUP_STEPS is a share of the run
    ],
)
def test_a_trl_name_is_read_as_the_constant_it_means_with_a_line_saying_so(args, constant, value):
    parsed = parse(args)
    assert parsed.settings[constant] == value and parsed.given == {constant}
    assert parsed.fields == {}  # never passed on as well: one setting, one value
    name = args[0].partition("=")[0].replace("--no_", "--")
    assert len(parsed.notes) == 1 and name in parsed.notes[0] and constant in parsed.notes[0]


@pytest.mark.parametrize("args", [["--use_peft"], ["--dtype=auto"], ["--dataset_train_split=train"]])
def test_a_trl_name_for_what_this_script_does_anyway_sets_nothing_with_a_line(args):
    parsed = parse(args)
    assert (parsed.given, parsed.fields) == (frozenset(), {})
    assert parsed.notes == (f"{args[0]}: what this script does",)


def test_model_revision_is_a_key_of_model_init_kwargs():
    parsed = parse(["--model_revision=main"])
    assert parsed.fields == {"model_init_kwargs": '{"revision": "main"}'}  # merged by build_config with its own keys
    assert parsed.notes == ("--model_revision is --model_init_kwargs's 'revision' here",)


@pytest.mark.parametrize("field", [k for k, v in cli.TRL_VALUES.items() if isinstance(v, str) and "." not in v])
def test_a_field_the_script_sets_itself_is_refused_with_what_to_type(field):
    with pytest.raises(ConfigError) as refused:
        parse([f"--{field}=true"])
    message = str(refused.value)
    assert message.startswith(f"--{field} is set by ") and "----" not in message
    # every --NAME it suggests exists: a profile or a constant (the use_cpu message once said ----smoke=...)
    suggested = re.findall(r"--([A-Za-z_]+)", message.removeprefix(f"--{field}"))
    assert suggested and all(n in grpotrainer.PROFILES or n in cli.constants(grpotrainer) for n in suggested)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--use_peft=false"], "--use_peft=false: this script takes only true here"),
        (["--torch_dtype=float16"], "--torch_dtype=float16: this script takes only bfloat16 or float32 or auto here"),
        (["--dataset_train_split=validation"], "takes only train here"),
        (["--log_completions=sometimes"], "takes only true or false here"),
    ],
)
def test_a_trl_name_with_a_value_this_script_cannot_honour_is_refused(args, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(args)


def test_other_grpoconfig_fields_pass_through_typed_by_transformers():
    parsed = parse(["--top_p=0.9", "--no_use_liger_kernel", "--max_grad_norm", "0.5"])
    assert parsed.fields == {"top_p": 0.9, "use_liger_kernel": False, "max_grad_norm": 0.5}
    assert (parsed.given, parsed.notes) == (frozenset(), ())  # no constant set, nothing to say
    with pytest.raises(
        ConfigError, match=re.escape("unknown setting --top_pp: not a constant nor a GRPOConfig field")
    ):
        parse(["--top_pp=0.9"])


def test_key_space_value_is_key_equals_value_and_flags_take_none():
    spaced = parse(["--smoke", "--MAX_STEPS", "2", "--top_p", "0.9", "--RESUME", "--MAX_COMPLETION_LENGTH", "-1"])
    joined = parse(["--smoke", "--MAX_STEPS=2", "--top_p=0.9", "--RESUME=true", "--MAX_COMPLETION_LENGTH=-1"])
    assert (spaced.profile, spaced.settings, spaced.fields) == (joined.profile, joined.settings, joined.fields)
    assert parse(["--use_liger_kernel"]).fields == {"use_liger_kernel": True}  # a bare boolean field: true
    with pytest.raises(ConfigError, match="cannot read the argument 'x'"):
        parse(["--smoke", "x"])  # a profile takes no value


def test_old_names_are_read_by_every_script_and_trls_only_where_there_is_a_grpoconfig():
    args = cli.parse(cli.constants(evaluate), ["--BATCH_SIZE=8", "--SAMPLES=2", "--SAMPLE_TEMPERATURE=0.5"])
    assert {k: args.settings[k] for k in args.given} == {"EVAL_BATCH_SIZE": 8, "EVAL_SAMPLES": 2, "TEMPERATURE": 0.5}
    assert len(args.notes) == 3  # a line for each old name
    # evaluate.py has no GRPOConfig: a lower-case name is nothing it knows, and never another script's constant
    with pytest.raises(ConfigError, match="unknown setting --learning_rate"):
        cli.parse(cli.constants(evaluate), ["--learning_rate=1e-5"])
    with pytest.raises(ConfigError, match="unknown setting --BATCH_SIZE"):
        cli.parse(cli.constants(export), ["--BATCH_SIZE=8"])  # export.py has no EVAL_BATCH_SIZE to read it as


def test_a_repeated_setting_takes_each_argument_whole():
    args = cli.parse(cli.constants(evaluate), ["--ASK=Tom has 3 pens, 4 cups. How many?", "--ASK=2+2?"])
    # one question per --ASK, commas and all; a second --ASK adds to the first instead of replacing it
    assert args.settings["ASK"] == ["Tom has 3 pens, 4 cups. How many?", "2+2?"]


# ---------------------------------------------------------------------------------------------------------------
# `~` in every path setting of every script


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda m: m.__name__)
def test_tilde_is_the_home_folder_in_every_path_setting(script, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    names = [n for n in files.PATH_SETTINGS if n in cli.constants(script)]
    args = cli.parse(cli.constants(script), [f"--{name}=~/{name.lower()}" for name in names])
    # the shell leaves ~ alone after "="; every script reads the same folder transformers would
    assert {n: args.settings[n] for n in names} == {n: str(tmp_path / n.lower()) for n in names}
    assert len(names) >= 3  # MODEL_NAME, DATASET/ADAPTER, OUTPUT_DIR at least


# ---------------------------------------------------------------------------------------------------------------
# --KEY=value overrides, profiles, --plan


def test_overrides_are_typed_by_the_default():
    args = parse(
        [
            "--NUM_GENERATIONS=16",
            "--LEARNING_RATE=2e-5",
            "--BETA=0",  # an int literal for a float constant stays a float
            "--LOAD_IN_4BIT=true",
            "--RESUME=no",
            "--OUTPUT_DIR=runs/x",
            "--REWARD_FUNCS=correctness_reward, math_reward",
            "--REWARD_WEIGHTS=1,0.5",
        ]
    )
    s = args.settings
    assert s["NUM_GENERATIONS"] == 16 and s["LEARNING_RATE"] == 2e-5
    assert s["BETA"] == 0.0 and isinstance(s["BETA"], float)
    assert s["LOAD_IN_4BIT"] is True and s["RESUME"] is False
    assert s["OUTPUT_DIR"] == "runs/x"
    assert s["REWARD_FUNCS"] == ["correctness_reward", "math_reward"]
    assert s["REWARD_WEIGHTS"] == [1.0, 0.5]
    assert args.given == {"NUM_GENERATIONS", "LEARNING_RATE", "BETA", "LOAD_IN_4BIT", "RESUME", "OUTPUT_DIR"} | {
        "REWARD_FUNCS",
        "REWARD_WEIGHTS",
    }
    assert grpotrainer.NUM_GENERATIONS != 16  # parsing never writes the module's constants


def test_profile_then_command_line():
    args = parse(["--smoke", "--MAX_STEPS=7", "--WARMUP_STEPS=0.1"])
    assert args.profile == "smoke"
    assert args.settings["MAX_STEPS"] == 7  # the command line wins over the profile ...
    assert args.settings["MAX_COMPLETION_LENGTH"] == 32  # ... which wins over the constant
    # typed by the constant, not by the profile's value: --smoke's WARMUP_STEPS=0 is an int, the constant a float
    assert args.settings["WARMUP_STEPS"] == 0.1
    assert args.given == {"MAX_STEPS", "WARMUP_STEPS"}  # a profile's values are not "given"


@pytest.mark.parametrize(
    ("argv", "plan", "profile"),
    [([], None, None), (["--plan"], "text", None), (["--smoke", "--plan=json"], "json", "smoke")],
)
def test_plan_and_the_profile_are_read_from_anywhere_on_the_line(argv, plan, profile):
    args = parse([*argv, "--MAX_STEPS=3"])
    assert (args.plan, args.profile, args.settings["MAX_STEPS"]) == (plan, profile, 3)


@pytest.mark.parametrize(
    "arg, message",
    [
        ("--NUM_GENERATION=8", "Did you mean NUM_GENERATIONS"),
        ("--NUM_GENERATIONS=four", "--NUM_GENERATIONS=four is not a valid int (default"),
        ("--BF16=maybe", "not a valid bool"),
        ("--REWARD_WEIGHTS=1,x", "not a valid list"),
        ("NUM_GENERATIONS=8", "write --KEY=value"),
        ("--MAX_STEPS", "write --KEY=value"),
        ("--plan=yaml", "--plan=yaml: write --plan (the block) or --plan=json"),
        ("--demo --smoke", "choose one of --smoke, --demo, --real"),
    ],
)
def test_bad_overrides_are_clear(arg, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse(arg.split())


# ---------------------------------------------------------------------------------------------------------------
# merging the command line's dict fields with build_config's


def test_a_dict_field_is_merged_key_by_key_and_a_key_set_twice_is_refused_naming_its_owner():
    ours = {"model_init_kwargs": {"dtype": "float32"}, "seed": 1}
    owners = {"model_init_kwargs": "ATTN_IMPLEMENTATION and BF16"}
    merged = cli.merge_fields(ours, {"model_init_kwargs": '{"revision": "main"}', "top_p": 0.9}, owners)
    assert merged == {"model_init_kwargs": {"dtype": "float32", "revision": "main"}, "seed": 1, "top_p": 0.9}
    with pytest.raises(ConfigError, match=re.escape("sets dtype, which ATTN_IMPLEMENTATION and BF16 set here")):
        cli.merge_fields(ours, {"model_init_kwargs": '{"dtype": "bfloat16"}'}, owners)
    with pytest.raises(ConfigError, match="takes a JSON object"):
        cli.merge_fields(ours, {"model_init_kwargs": "revision=main"}, owners)
    assert ours == {"model_init_kwargs": {"dtype": "float32"}, "seed": 1}  # build_config's own dict untouched


# ---------------------------------------------------------------------------------------------------------------
# --help


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda m: m.__name__)
def test_help_prints_each_constant_under_a_section_and_no_stray_header(script):
    profiles = {name: getattr(p, "SETTINGS", p) for name, p in getattr(script, "PROFILES", {}).items()}
    text = cli.help_text(script.__file__, cli.constants(script), profiles, fields=script is grpotrainer)
    settings = text.split("settings (--KEY=value", 1)[1].split("\n--", 1)[0]
    blocks = [block for block in settings.split("\n\n") if block.strip()][1:]  # after the settings line itself
    # every section is a header followed by its constants: a wrapped comment would make a header with none
    for block in blocks:
        header, *body = block.splitlines()
        assert not header.startswith("  --") and body, f"stray header {header!r}"
        assert all(re.match(r"  --[A-Z][A-Z0-9_]*=|        \S", line) for line in body), block
    # every setting shown once, with the value this command line would start from
    shown = re.findall(r"^  --([A-Z][A-Z0-9_]*)=", text, re.M)
    assert sorted(shown) == sorted(cli.comments(script.__file__))


def test_help_is_printed_by_parse_before_anything_else_is_read(capsys):
    profiles = {name: p.SETTINGS for name, p in grpotrainer.PROFILES.items()}
    with pytest.raises(SystemExit) as end:  # even beside a mistake: --help answers first
        cli.parse(cli.constants(grpotrainer), ["--NO_SUCH=1", "--help"], profiles, source=grpotrainer.__file__)
    assert end.value.code == 0
    out = capsys.readouterr().out
    assert out == cli.help_text(grpotrainer.__file__, cli.constants(grpotrainer), profiles) + "\n"
    assert "--smoke sets, before the command line's own --KEY=value:" in out  # and what each profile sets


def test_a_full_line_comment_after_a_constant_is_a_header(tmp_path):
    # the reason OUTPUT_DIR's comment must fit on its line: help_text cannot tell a wrapped comment from a header
    source = tmp_path / "s.py"
    source.write_text('"""S."""\n# ----\n# one\nA = 1  # a\n# two\nB = 2  # b\n# ----\n')
    text = cli.help_text(source)
    assert "\n one\n  --A=1\n        a\n\n two\n  --B=2\n        b" in text


def test_apply_overrides_types_each_value_like_its_default():
    settings = {"STEPS": 10, "LR": 1e-5, "NAMES": ["a"]}
    assert cli.apply_overrides(settings, ["--STEPS=20", "--NAMES=x,y"]) == {
        "STEPS": 20,
        "LR": 1e-05,
        "NAMES": ["x", "y"],
    }


def test_join_values_joins_a_keys_tokens_and_leaves_flags_and_bare_booleans():
    argv = ["--smoke", "--lr", "1e-5", "--names", "a", "b", "--flag"]
    assert cli.join_values(argv) == ["--smoke", "--lr=1e-5", "--names=a,b", "--flag"]
    # a value of its own after "=" is not joined: the next token is an argument of its own (refused later)
    assert cli.join_values(["--k=a", "b", "--n", "x=y", "z"]) == ["--k=a", "b", "--n=x=y,z"]


def test_take_flags():
    assert cli.take_flags(["--smoke", "--plan=json", "--LR=1"], {"smoke": {}}) == (["--LR=1"], "json", "smoke")


def test_comments_reads_each_constants_comment():
    comment = "create the Hub repo private; it is never made public by this script once it exists"
    assert cli.comments(export.__file__)["PRIVATE"] == comment
