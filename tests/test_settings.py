"""grpo/settings.py: one row per setting, and a new setting is its constant line plus that row. A throwaway setting
added by a test reaches --help, the command line, a recipe, the range check, the resume rule and the card.

.venv/bin/python -m pytest tests/test_settings.py -q
"""

import ast
import dataclasses
import importlib.util
import inspect
import json
import re

import pytest
from conftest import REPO, run_in_process

from grpo import checkpoints, cli, files, modelcard, settings
from grpo.errors import ConfigError
from grpo.settings import TABLE, Setting

SCRIPTS = ["grpotrainer.py", "evaluate.py", "export.py"]
CONFIG_CLASS = "trl.trainer.grpo_config:GRPOConfig"  # grpotrainer's: the config whose fields lower-case names set


def block_constants(path):
    """The UPPERCASE names assigned between a script's two `# ----` rulers, read with ast (not with cli)."""
    text = path.read_text(encoding="utf-8")
    rulers = [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith("# ----")][:2]
    tree = ast.parse(text)
    targets = [(t, node.lineno) for node in tree.body if isinstance(node, ast.Assign) for t in node.targets]
    return [t.id for t, line in targets if isinstance(t, ast.Name) and t.id.isupper() and rulers[0] < line < rulers[1]]


# ---------------------------------------------------------------------------------------------------------------
# a throwaway setting, end to end

THROWAWAY = '''"""Throwaway: a script with one setting, written by a test.

    python throwaway.py --THROWAWAY_LIMIT=5
"""

# ----
# limits
THROWAWAY_LIMIT = 3  # a test setting
# ----
'''


@pytest.fixture
def throwaway(tmp_path):
    """The throwaway script's file and module; its row is each test's to add."""
    path = tmp_path / "throwaway.py"
    path.write_text(THROWAWAY)
    spec = importlib.util.spec_from_file_location("throwaway", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return path, module


def throwaway_row(monkeypatch, resume):
    row = Setting("[1, 10]", names=("throwaway_limit",), resume=resume, card="throwaway limit", plan=("per step",))
    monkeypatch.setitem(TABLE, "THROWAWAY_LIMIT", row)


def test_a_constant_without_its_row_is_no_setting(throwaway):
    path, module = throwaway
    # the constant line alone: nothing reads it from the command line (the row is the other half of a setting)
    assert cli.constants(module) == {}
    with pytest.raises(ConfigError, match="unknown setting --THROWAWAY_LIMIT"):
        cli.parse(cli.constants(module), ["--THROWAWAY_LIMIT=5"], source=path)


def test_a_throwaway_setting_reaches_help_the_command_line_a_recipe_and_the_range_check(
    throwaway, monkeypatch, tmp_path
):
    path, module = throwaway
    throwaway_row(monkeypatch, resume=False)
    constants = cli.constants(module)
    assert constants == {"THROWAWAY_LIMIT": 3}  # the row makes the constant a setting
    # --help: the constant with its comment, then its check and TRL's name from the row
    lines = cli.help_text(path, constants).splitlines()
    at = lines.index("  --THROWAWAY_LIMIT=3")
    assert lines[at + 1].strip() == "a test setting (in [1, 10], TRL: throwaway_limit, plan: per step)"
    # the command line: its own name, and TRL's lower-case one (a space before the value, as TrlParser reads it)
    args = cli.parse(constants, ["--THROWAWAY_LIMIT=5"], source=path)
    assert (args.settings, args.given, args.notes) == ({"THROWAWAY_LIMIT": 5}, {"THROWAWAY_LIMIT"}, ())
    args = cli.parse(constants, ["--throwaway_limit", "5"], config_class=CONFIG_CLASS, source=path)
    assert (args.settings, args.given, args.fields) == ({"THROWAWAY_LIMIT": 5}, {"THROWAWAY_LIMIT"}, {})
    assert args.notes == ("--throwaway_limit is THROWAWAY_LIMIT here",)  # one line saying what it was read as
    # a recipe (grpo/recipes.py) by either name, and the command line still wins over it
    recipe = tmp_path / "r.yaml"
    for key in ("THROWAWAY_LIMIT", "throwaway_limit"):
        recipe.write_text(f"{key}: 7\n")
        args = cli.parse(constants, ["--config", str(recipe)], config_class=CONFIG_CLASS, source=path)
        assert args.settings == {"THROWAWAY_LIMIT": 7}
        args = cli.parse(constants, ["--config", str(recipe), "--THROWAWAY_LIMIT=2"], config_class=CONFIG_CLASS)
        assert args.settings == {"THROWAWAY_LIMIT": 2}
    # the range check: [1, 10] from the row, and the constant's own comment saying what it is
    comments = cli.comments(path)
    assert settings.problems({"THROWAWAY_LIMIT": 10}, comments) == []  # a closed end is inside
    assert settings.problems({"THROWAWAY_LIMIT": 11}, comments) == [
        "THROWAWAY_LIMIT=11 is outside [1, 10]: a test setting."
    ]
    assert "THROWAWAY_LIMIT" in settings.levers("per step")  # the plan line it shapes


@pytest.mark.parametrize("resume", [True, False])
def test_a_throwaway_setting_reaches_the_resume_rule_and_the_card(throwaway, monkeypatch, tmp_path, resume):
    path, module = throwaway
    throwaway_row(monkeypatch, resume=resume)
    out = tmp_path / "run"
    files.write_settings(out, {**cli.constants(module), "grpo_config": {}})  # the run that saved checkpoint-2
    record = {**cli.parse(cli.constants(module), ["--THROWAWAY_LIMIT=5"], source=path).settings, "grpo_config": {}}
    if resume:  # a setting a resumed run may change: resumed, the change kept beside the run's record
        resumed = checkpoints.resumed_record(out, record, out / "checkpoint-2")
        assert resumed["segments"] == [{"from_step": 2, "changed": {"THROWAWAY_LIMIT": [3, 5]}}]
    else:  # one that changes what the run is: refused, naming it with its old and new value
        with pytest.raises(
            ConfigError, match=re.escape(f"cannot resume {out / 'checkpoint-2'}: THROWAWAY_LIMIT 3 -> 5")
        ):
            checkpoints.resumed_record(out, record, out / "checkpoint-2")
    card = modelcard.render_card(record, name="t", location="t", library_name="peft")
    # the model card's settings table: the row's label and the run's value (a cell shows a value as code)
    assert "| throwaway limit | `5` |" in card.split("## Training settings", 1)[1].split("\n## ", 1)[0]


# ---------------------------------------------------------------------------------------------------------------
# the table against the three scripts and the libraries


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_constant_of_every_script_has_a_row(script):
    constants = block_constants(REPO / script)
    assert len(constants) >= 5  # the block was found: each script has more settings than that
    assert [name for name in constants if name not in TABLE] == []
    # and cli reads the same block: what --help shows and what a refusal quotes
    assert sorted(cli.comments(REPO / script)) == sorted(constants)


def test_every_row_belongs_to_a_script():
    # a row whose constant was deleted would keep a TRL name that no script reads
    constants = {name for script in SCRIPTS for name in block_constants(REPO / script)}
    assert sorted(set(TABLE) - constants) == []


@pytest.mark.parametrize("name", sorted(TABLE))
def test_every_rows_check_parses(name):
    check = TABLE[name].check
    if isinstance(check, tuple):  # some allowed values, none twice; the first allowed, anything else refused
        assert check and len(set(check)) == len(check)
        assert settings.problem(name, check[0]) is None and settings.problem(name, "no-such-value") is not None
        return
    if not check:
        return
    opening, low, high, closing = settings.INTERVAL.fullmatch(check).groups()
    low, high = float(low), float(high)
    assert low < high  # an interval something is inside
    # each finite end as written: a closed end is inside, an open one outside, and one beyond it outside
    if low != float("-inf"):
        assert (settings.problem(name, low) is None) == (opening == "[")
        assert settings.problem(name, low - 1) is not None
    if high != float("inf"):
        assert (settings.problem(name, high) is None) == (closing == "]")
        assert settings.problem(name, high + 1) is not None


def test_every_field_is_a_field_of_grpoconfig_or_loraconfig_or_the_held_out_evaluation():
    from peft import LoraConfig
    from trl import GRPOConfig

    from grpo import callbacks, evaluation

    grpo_fields = {f.name for f in dataclasses.fields(GRPOConfig) if f.init}
    lora_fields = {f.name for f in dataclasses.fields(LoraConfig) if f.init}
    # HeldOutEval's schedule, evaluate_trainer's scoring arguments
    held_out = {
        *inspect.signature(callbacks.HeldOutEval).parameters,
        *inspect.signature(evaluation.evaluate_trainer).parameters,
    }
    owners = {"lora_config.": lora_fields, "held_out.": held_out}
    fields = {name: row.field for name, row in TABLE.items() if row.field}
    wrong = {
        name: field
        for name, field in fields.items()
        if "." in field and field.partition(".")[2] not in owners[field.partition(".")[0] + "."]
    } | {name: field for name, field in fields.items() if "." not in field and field not in grpo_fields}
    assert wrong == {}
    assert len(fields) >= 30  # most of grpotrainer's settings set a field: the check above is not vacuous


def test_every_name_means_one_constant():
    # a TRL name, an open-r1 name or an old name read as two constants would depend on the table's order
    meanings = {}
    for name, row in TABLE.items():
        for alias in [*row.names, *([row.field] if row.field and "." not in row.field else [])]:
            meanings.setdefault(alias, set()).add(name)
    assert {alias: names for alias, names in meanings.items() if len(names) > 1} == {}
    assert sorted(set(meanings) & set(TABLE)) == []  # an old name is never another setting's own name


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_default_passes_its_own_check(script):
    module = importlib.import_module(script.removesuffix(".py"))
    assert settings.problems(cli.constants(module), cli.comments(REPO / script)) == []


@pytest.mark.parametrize("name", sorted(TABLE))
def test_the_resume_check_follows_each_rows_resume_rule(name, tmp_path):
    # every setting is classified by its row: changeable on resume (recorded) or not (refused)
    files.write_settings(tmp_path, {name: "before", "grpo_config": {}})
    record = {name: "after", "grpo_config": {}}
    if TABLE[name].resume:
        resumed = checkpoints.resumed_record(tmp_path, record, tmp_path / "checkpoint-4")
        assert resumed["segments"][-1]["changed"] == {name: ["before", "after"]}
    else:
        with pytest.raises(ConfigError, match=re.escape(f"{name} 'before' -> 'after'")):
            checkpoints.resumed_record(tmp_path, record, tmp_path / "checkpoint-4")


def test_both_resume_rules_are_in_use():
    # the parametrised test above checks both branches only while the table has rows of each kind
    assert {row.resume for row in TABLE.values()} == {True, False}


# ---------------------------------------------------------------------------------------------------------------
# the rest of the module's contract


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("LORA_DROPOUT", 1.0, "LORA_DROPOUT=1.0 is outside [0, 1): what it is."),  # an open end excludes it
        ("LORA_DROPOUT", 0.0, None),  # a closed end includes it
        ("TEMPERATURE", float("inf"), "TEMPERATURE=inf: a number here must be finite."),
        ("MAX_STEPS", float("nan"), "MAX_STEPS=nan: a number here must be finite."),  # nan compares as inside
        # a choice as written: TRL would refuse 'DAPO' only after the weights load
        (
            "LOSS_TYPE",
            "DAPO",
            "LOSS_TYPE='DAPO' is not one of grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo: what it is.",
        ),
        ("SCALE_REWARDS", "all", "SCALE_REWARDS='all' is not one of group, batch, none: what it is."),
        ("USE_VLLM", "true", None),  # --USE_VLLM=true types a text (its default is "auto"); True is allowed
        ("NO_SUCH_SETTING", -5, None),  # no row, no check
    ],
)
def test_problem(name, value, expected):
    assert settings.problem(name, value, "what it is") == expected


def test_problems_leaves_auto_to_the_machine():
    # VLLM_GPU_MEMORY_UTILIZATION=auto is decided later, for this GPU; a number is checked now
    assert settings.problems({"VLLM_GPU_MEMORY_UTILIZATION": "auto", "USE_VLLM": "auto"}) == []
    assert settings.problems({"VLLM_GPU_MEMORY_UTILIZATION": 1.5}) == [
        "VLLM_GPU_MEMORY_UTILIZATION=1.5 is outside (0, 1]."
    ]


def test_trl_names_only_for_the_settings_a_script_has():
    names = settings.trl_names({"LEARNING_RATE": 1e-5, "EVAL_BATCH_SIZE": 8})
    # a field and an open-r1/old name each lead to their constant; no other script's constant is reachable
    assert names == {"learning_rate": "LEARNING_RATE", "BATCH_SIZE": "EVAL_BATCH_SIZE"}


def test_card_rows_follow_the_table_and_say_what_was_not_recorded():
    rows = settings.card_rows({"LORA_R": 8})
    assert [label for label, _ in rows] == [row.card for row in TABLE.values() if row.card]
    assert dict(rows)[TABLE["LORA_R"].card] == 8 and dict(rows)[TABLE["SEED"].card] is None


@pytest.mark.parametrize(
    ("s", "expected"),
    [
        # each value converted where the field wants another form: 0 = TRL's default, "" = none, trackers a list
        ({"STEPS_PER_GENERATION": 0, "SEED": 7}, {"steps_per_generation": None, "seed": 7}),
        ({"LOG_COMPLETIONS_STEPS": 10}, {"log_completions": True}),
        ({"LOG_COMPLETIONS_STEPS": 0}, {"log_completions": False}),
        ({"REPORT_TO": "none", "USE_VLLM": "auto"}, {"report_to": [], "use_vllm": False}),
        ({"REPORT_TO": "tensorboard,wandb"}, {"report_to": ["tensorboard", "wandb"]}),
        ({"VLLM_SERVER_BASE_URL": "", "BF16": True}, {"vllm_server_base_url": None, "bf16": True}),
        # LoRA's rows and the settings without a field are not GRPOConfig's
        ({"LORA_R": 8, "MODEL_NAME": "m", "SEED": 1}, {"seed": 1}),
    ],
)  # fmt: skip
def test_config_kwargs(s, expected):
    assert settings.config_kwargs(s) == expected


def test_config_kwargs_of_peft_take_loras_rows_only():
    s = {"LORA_R": 8, "USE_DORA": True, "SEED": 1, "LORA_TARGET_MODULES": "all-linear"}
    # the target modules as peft takes them: "all-linear" as it is, else a list of names
    assert settings.config_kwargs(s, "lora_config.") == {"r": 8, "use_dora": True, "target_modules": "all-linear"}
    s["LORA_TARGET_MODULES"] = " q_proj, v_proj"
    assert settings.config_kwargs(s, "lora_config.")["target_modules"] == ["q_proj", "v_proj"]


def test_a_scripts_range_refusal_quotes_its_constants_comment(capsys, tmp_path):
    import grpotrainer

    comment = cli.comments(REPO / "grpotrainer.py")["LORA_DROPOUT"]
    out = tmp_path / "out"
    code, stderr = run_in_process(
        grpotrainer.main, "--smoke", "--LORA_DROPOUT=1.0", f"--OUTPUT_DIR={out}", capsys=capsys
    )
    # exit 2, one message: the value, the row's interval, and what the setting is, in the constant's own words
    assert code == 2 and f"LORA_DROPOUT=1.0 is outside [0, 1): {comment}." in stderr
    assert not out.exists()  # refused before anything was written


def test_what_a_run_records_is_its_settings_only(tmp_path):
    import grpotrainer

    # the scripts' other UPPERCASE names (the profiles' modules, the config class) are no settings: recorded, a
    # module's repr would name this checkout, and a resume from another copy would be refused
    s = cli.parse(cli.constants(grpotrainer), [], source=grpotrainer.__file__).settings
    assert sorted(set(s) - set(TABLE)) == []
    assert sorted(set(block_constants(REPO / "grpotrainer.py")) - set(s)) == []
    files.write_settings(tmp_path, s)
    assert json.loads((tmp_path / files.SETTINGS_FILE).read_text())["LORA_R"] == grpotrainer.LORA_R


def test_problem_quotes_the_comment_and_passes_an_allowed_choice():
    assert settings.problem("LORA_DROPOUT", 1.0, "0-0.1") == "LORA_DROPOUT=1.0 is outside [0, 1): 0-0.1."
    assert settings.problem("LOSS_TYPE", "dapo") is None


def test_trackers():
    assert settings.trackers("tensorboard, trackio") == ["tensorboard", "trackio"]
    assert settings.trackers("none") == []


def test_config_kwargs_of_lora():
    s = {"LORA_R": 8, "LORA_ALPHA": 16, "LORA_DROPOUT": 0.0}
    assert settings.config_kwargs(s, "lora_config.") == {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0}
