"""Command-line plumbing for the scripts (grpotrainer.py, evaluate.py, export.py): settings in, clean exits out.

A script's settings are its UPPERCASE constants: `parse` returns them as a dict with a profile (`--smoke`) and
`--KEY=value` (or `--KEY value`) overrides applied, each typed like its default. Lower-case `--field=value` arguments
are GRPOConfig fields, typed by transformers' own argument parser, except TRL's names for what a constant sets, read
as that constant (TRL_NAMES); `--config recipe.yaml` adds a recipe's keys before the command line's (README.md shows
the commands). Values are parsed as plain data, never evaluated as code.
"""

import ast
import contextlib
import dataclasses
import difflib
import importlib
import importlib.util
import json
import logging
import os
import re
import select
import signal
import sys
import textwrap
from pathlib import Path

from grpo import files
from grpo.errors import ConfigError, first_line

TRUE, FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Args:
    settings: dict  # UPPERCASE constant -> value, defaults < profile < command line
    given: frozenset  # the UPPERCASE names set on the command line
    profile: str | None  # "smoke", "demo", ... or None
    fields: dict  # lower-case config fields from the command line, typed
    notes: tuple = ()  # one line per TRL name read as a constant, per recipe key ignored: for the caller to log


def constants(namespace):
    """The settings of a module: its public UPPERCASE names (pass `globals()` or a module)."""
    items = namespace.items() if isinstance(namespace, dict) else vars(namespace).items()
    return {k: v for k, v in items if k.isupper() and not k.startswith("_")}


def _coerce(key, raw, default):
    want = type(default).__name__
    if raw is None:  # a bare --KEY: a boolean's true, as argparse reads a flag
        if isinstance(default, bool):
            return True
        raise ConfigError(f"--{key} needs a value: write --KEY=value, e.g. --{key}={_example(default)} (see --help).")
    try:
        if isinstance(default, bool):  # before int: bool is a subclass of int
            if raw.lower() not in TRUE | FALSE:
                raise ValueError
            return raw.lower() in TRUE
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        if isinstance(default, str):
            return raw
        if isinstance(default, list):
            items = [item.strip() for item in raw.split(",") if item.strip()]
            numeric = bool(default) and all(isinstance(x, (int, float)) for x in default)
            return [float(item) for item in items] if numeric else items
    except ValueError:
        raise ConfigError(f"--{key}={raw} is not a valid {want} (default {_example(default)}).") from None
    raise ConfigError(f"{key} (a {want}) cannot be set from the command line; edit it in the file instead.")


def _example(default):
    if isinstance(default, list):
        return ",".join(str(x) for x in default) or "a,b"
    return str(default).lower() if isinstance(default, bool) else str(default)


def apply_overrides(settings, args, types=None):
    """`settings` updated with `--KEY=value` arguments (a new dict), each typed like its default (in `types`, the
    constants, when `settings` holds a profile's values: --smoke's WARMUP_STEPS=0 takes 0.1).

    >>> apply_overrides({"STEPS": 10, "LR": 1e-5, "NAMES": ["a"]}, ["--STEPS=20", "--NAMES=x,y"])
    {'STEPS': 20, 'LR': 1e-05, 'NAMES': ['x', 'y']}
    """
    out = dict(settings)
    for arg in args:
        key, raw = _split(arg)
        if key not in settings:
            close = difflib.get_close_matches(key.upper(), settings, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else " See --help for the settings."
            raise ConfigError(f"unknown setting --{key}.{hint}")
        out[key] = _coerce(key, raw, (types or settings)[key])
    return out


def _split(arg):
    """(key, value) of `--key=value`; the value None for a bare `--key`."""
    key, sep, raw = arg.removeprefix("--").partition("=")
    if not arg.startswith("--") or not key:
        raise ConfigError(f"cannot read the argument {arg!r}: write --KEY=value, e.g. --MAX_STEPS=100 (see --help)")
    return key, raw if sep else None


def join_values(argv, flags=()):
    """`argv` with each `--key value` written `--key=value`, as argparse reads both. A key in `flags` (--smoke,
    --help) takes no value; any other takes the tokens up to the next --key, several joined as a comma list (TRL's
    `--lora_target_modules q_proj v_proj`); a bare `--key` stays bare (a boolean's true).

    >>> join_values(["--smoke", "--lr", "1e-5", "--names", "a", "b", "--flag"], flags={"smoke"})
    ['--smoke', '--lr=1e-5', '--names=a,b', '--flag']
    """
    out, values = [], None  # values: those of the last bare --key so far, or None when it takes none
    for arg in argv:
        if values is not None and not arg.startswith("--"):
            values.append(arg)
            continue
        if values:
            out[-1] += "=" + ",".join(values)
        out.append(arg)
        bare = arg.startswith("--") and "=" not in arg and arg.removeprefix("--") not in flags
        values = [] if bare else None
    if values:
        out[-1] += "=" + ",".join(values)
    return out


# TRL's own names (`trl grpo`'s ModelConfig and ScriptArguments, TRL 1.16; open-r1's recipes) for what a constant
# sets, for the scripts with a config class. Each maps to a constant (read as it, with a line saying so), to a key of
# a dict field ("model_init_kwargs.revision"), or to {value it may have: the argument that value means ("" none)}.
TRL_NAMES = {
    "model_name_or_path": "MODEL_NAME",
    "model_revision": "model_init_kwargs.revision",
    "dtype": {"bfloat16": "--BF16=true", "float32": "--BF16=false"},
    "torch_dtype": {"bfloat16": "--BF16=true", "float32": "--BF16=false"},  # dtype's name before TRL 1.x
    "attn_implementation": "ATTN_IMPLEMENTATION",
    "load_in_4bit": "LOAD_IN_4BIT",
    "use_peft": {"true": ""},  # LoRA is what this script trains
    "lora_r": "LORA_R",
    "lora_alpha": "LORA_ALPHA",
    "lora_dropout": "LORA_DROPOUT",
    "lora_target_modules": "LORA_TARGET_MODULES",
    "dataset_name": "DATASET",
    "dataset_config": "DATASET_CONFIG",
    "dataset_train_split": {"train": ""},  # DATASET's splits are train and test
    "dataset_test_split": {"test": ""},
    "reward_funcs": "REWARD_FUNCS",
    "system_prompt": "SYSTEM_PROMPT",  # open-r1
    "warmup_ratio": "WARMUP_STEPS",  # below 1, WARMUP_STEPS is a share of the run
}
# Recipe keys of TRL's and open-r1's scripts that change nothing this script trains: ignored with one line each.
# The command line refuses the GRPOConfig fields among them (push_to_hub, save_strategy, eval_strategy): typed
# there, they are a request; in a shared recipe, they describe how its author published and evaluated.
RECIPE_IGNORED = {
    "push_to_hub": "publish with export.py --ADAPTER=OUTPUT_DIR --ADAPTER_ONLY=true --PUSH_TO_HUB=you/name",
    "hub_strategy": "publish with export.py",
    "hub_model_revision": "publish with export.py",
    "overwrite_hub_revision": "publish with export.py",
    "push_to_hub_revision": "publish with export.py",
    "save_strategy": "a checkpoint every SAVE_STEPS, which resuming relies on",
    "eval_strategy": "held-out accuracy comes from EVAL_STEPS, EVAL_BEFORE and EVAL_AFTER",
    "do_eval": "held-out accuracy comes from EVAL_STEPS, EVAL_BEFORE and EVAL_AFTER",
    "benchmarks": "score a run with evaluate.py --ADAPTER=OUTPUT_DIR",
    "callbacks": "open-r1's own callbacks",
    "num_processes": "the launcher's setting (torchrun --nproc_per_node, docs/launch.md)",
    "vllm_device": "TRL 0.x's; TRL 1.16 places vLLM by VLLM_MODE",
    "overwrite_output_dir": "gone in transformers 5; a rerun resumes from OUTPUT_DIR (RESUME)",
    "max_prompt_length": "gone in TRL 1.x; GSM8K's prompts are short",
    "dataset_configs": "open-r1's list of dataset configs; DATASET_CONFIG names one",
    "wandb_entity": "set WANDB_ENTITY in the environment",
    "wandb_project": "set WANDB_PROJECT in the environment",
    "wandb_run_group": "set WANDB_RUN_GROUP in the environment",
}


def _known_fields(config_class):
    """The init field names of `config_class` ("module:Class" read from source without importing, or a class)."""
    if isinstance(config_class, str):
        known = source_fields(*config_class.partition(":")[::2])
        if known is not None:
            return known
    return {f.name for f in dataclasses.fields(_import(config_class)) if f.init}


def translate(arg, known, settings, owned):
    """A lower-case `arg` as this script reads it: (the argument, or None when it sets nothing here; a line saying
    so, or None). A name a constant sets (LEARNING_RATE sets learning_rate, TRL_NAMES and `owned` map the others)
    becomes `--CONSTANT=value`; an `owned` name given a sentence instead is refused with it."""
    key, raw = _split(arg)
    names = {**TRL_NAMES, **owned}
    owner = names.get(key) or (key.upper() if key in known and key.upper() in settings else None)
    value = "" if raw is None else f"={raw}"
    if isinstance(owner, dict):  # the values it may have here
        meant = owner.get("true" if raw is None else raw.lower())
        if meant is None:
            raise ConfigError(f"--{key}{value}: this script takes only {' or '.join(owner)} here.")
        return meant or None, f"--{key}{value} is {meant} here" if meant else f"--{key}{value}: what this script does"
    if owner in settings:
        return f"--{owner}{value}", f"--{key} is {owner} here"
    if isinstance(owner, str) and "." in owner and raw is not None:  # a key of a dict field
        field, _, inner = owner.partition(".")
        return f"--{field}={json.dumps({inner: raw})}", f"--{key} is --{field}'s {inner!r} here"
    if owner:
        raise ConfigError(f"--{key} is set by {owner}.")
    return arg, None


def config_fields(args, config_class, known=None, settings=()):
    """Lower-case `--field=value` arguments typed as `config_class` (a class or "module:Class") declares them, by
    transformers' own argument parser; a dict field given twice (model_revision and model_init_kwargs) merged."""
    known = _known_fields(config_class) if known is None else known
    given = {}
    for arg in args:
        key, raw = _split(arg)
        if key not in known:
            close = difflib.get_close_matches(key, known | set(TRL_NAMES), n=3, cutoff=0.6)
            close += difflib.get_close_matches(key.upper(), settings, n=1, cutoff=0.8)
            hint = f" Did you mean {', '.join(close)}?" if close else " See --help for the constants."
            name = config_class.rpartition(":")[2] if isinstance(config_class, str) else config_class.__name__
            raise ConfigError(f"unknown setting --{key}: not a constant nor a {name} field.{hint}")
        if key in given and _json_object(given[key]) and _json_object(raw):
            raw = json.dumps({**json.loads(given[key]), **json.loads(raw)})
        given[key] = raw
    if not given:
        return {}
    from transformers import HfArgumentParser  # types each value as the dataclass field declares it

    config_class = _import(config_class)
    parser = HfArgumentParser(config_class)

    def refuse(message):  # argparse would print its usage and exit; say it in one line instead
        raise ConfigError(f"{message.replace('argument ', '')} (a {config_class.__name__} field).")

    parser.error = refuse
    tokens = []
    for key, raw in given.items():
        action = parser._option_string_actions.get(f"--{key}")  # a list field takes its items as tokens
        many = raw is not None and getattr(action, "nargs", None) in ("+", "*")
        tokens += [f"--{key}", *raw.split(",")] if many else [f"--{key}" + ("" if raw is None else f"={raw}")]
    namespace, _ = parser.parse_known_args(tokens)
    return {key: getattr(namespace, key) for key in given}


def _json_object(text):
    try:
        return isinstance(json.loads(text or ""), dict)
    except ValueError:
        return False


def with_fields(make, given, owners):
    """`make` (a config class) to call with its keyword arguments merged with the command line's fields `given`."""
    return lambda **ours: make(**merge_fields(ours, given, owners))


def merge_fields(ours, given, owners):
    """The keyword arguments `ours` (build_config's) with the command line's fields `given`: a dict field merged key
    by key, a key that `ours` sets refused naming `owners[field]`; any other field the user's value."""
    out = dict(ours)
    for key, value in given.items():
        if isinstance(ours.get(key), dict):
            try:
                value = json.loads(value) if isinstance(value, str) else value
            except ValueError:
                value = None
            if not isinstance(value, dict):
                raise ConfigError(f'--{key} takes a JSON object, e.g. --{key}=\'{{"revision": "main"}}\'.')
            if clash := sorted(set(value) & set(ours[key])):
                who = owners.get(key, "this script")
                raise ConfigError(f"--{key} sets {', '.join(clash)}, which {who} set here: leave it out.")
            value = {**ours[key], **value}
        out[key] = value
    return out


def _import(config_class):
    if not isinstance(config_class, str):
        return config_class
    module, _, name = config_class.partition(":")
    return getattr(importlib.import_module(module), name)


def source_fields(module, class_name):
    """The init fields of the dataclass `module:class_name` and its bases, read from source with `ast` (importing
    trl costs seconds), or None where the source cannot be followed (bases through `from X import Base`)."""

    def source(dotted):
        top, _, rest = dotted.partition(".")
        spec = importlib.util.find_spec(top)  # a top-level name: finds its folder without running its __init__
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest.split("."))  # "" joins nothing
        return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")

    def fields(dotted, name, depth=0):
        path = source(dotted)
        if path is None or not path.is_file() or depth > 8:
            return None
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if node is None:  # a package's lazy re-export: the file in it that defines the class
            marker = re.compile(rf"^class {re.escape(name)}\b", re.M)
            found = [p for p in sorted(path.parent.glob("*.py")) if p != path and marker.search(p.read_text("utf-8"))]
            lazy = f"{dotted}.{found[0].stem}" if found else ""
            return fields(lazy, name, depth + 1) if path.name == "__init__.py" and found else None
        names = set()
        for base in node.bases:
            if not isinstance(base, ast.Name):
                return None
            origin = next(
                (i for i in tree.body if isinstance(i, ast.ImportFrom) and base.id in {a.name for a in i.names}), None
            )
            if origin is None:
                return None
            package = ".".join(dotted.split(".")[: -origin.level]) if origin.level else ""
            inherited = fields(".".join(p for p in (package, origin.module or "") if p), base.id, depth + 1)
            if inherited is None:
                return None
            names |= inherited
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                no_init = isinstance(item.value, ast.Call) and any(
                    k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in item.value.keywords
                )
                (names.discard if no_init else names.add)(item.target.id)
        return names

    try:
        return fields(module, class_name)

    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def parse(settings, argv, profiles=None, config_class=None, owned=None, source=None):
    """Resolve a script's settings from its constants (`constants(globals())`), profiles ({"smoke": {...}}) and
    command line; return `Args`. `source`: the script file, whose constants block `--help` prints. `owned`: the
    config fields the script sets itself (see `translate`)."""
    if "--help" in argv or "-h" in argv:
        print(help_text(source, settings, profiles, fields=config_class is not None), flush=True)
        sys.exit(0)
    profiles = profiles or {}
    argv, recipe = read_recipe(argv)
    argv = join_values(argv, flags={*profiles, "help"})
    known = _known_fields(config_class) if config_class is not None else set()
    notes = []
    if recipe:  # its mistakes named with the file; then applied before the command line, which wins
        path, lines = recipe
        try:
            lines, notes = _recipe_lines(lines, known, settings, owned or {})
            apply_overrides(settings, _resolve(lines, settings, config_class, owned or {}, known)[0])
        except ConfigError as err:
            raise ConfigError(f"--config {path}: {err}") from None
        argv = [*lines, *argv]
    profile = next((name for name in profiles if f"--{name}" in argv), None)
    if profile and any(f"--{other}" in argv for other in profiles if other != profile):
        raise ConfigError(f"choose one of {', '.join('--' + p for p in profiles)}.")
    rest = [arg for arg in argv if arg.removeprefix("--") not in profiles]
    upper, fields, mapped = _resolve(rest, settings, config_class, owned or {}, known)
    resolved = files.expand_paths(apply_overrides({**settings, **profiles.get(profile, {})}, upper, types=settings))
    given = frozenset(_split(arg)[0] for arg in upper)
    return Args(resolved, given, profile, fields, tuple(dict.fromkeys([*notes, *mapped])))


def _resolve(args, settings, config_class, owned, known):
    """(the `--KEY=value` arguments in order, TRL names read as constants among them; the typed config fields; the
    lines saying which names were read as what)."""
    if config_class is None:  # no config behind this script: lower-case names are unknown settings
        return list(args), {}, []
    upper, lower, notes = [], [], []
    for arg in args:
        if _is_field(arg):
            arg, note = translate(arg, known, settings, owned)
            notes += [note] if note else []
        if arg is not None:
            (lower if _is_field(arg) else upper).append(arg)
    return upper, config_fields(lower, config_class, known, settings) if lower else {}, notes


def _recipe_lines(lines, known, settings, owned):
    """A recipe's `--key=value` lines without the keys RECIPE_IGNORED names (a line each says so), after refusing,
    all at once, the keys that are neither a constant, a config field nor a TRL name."""
    kept, notes, unknown = [], [], []
    for line in lines:
        key = _split(line)[0]
        if key in RECIPE_IGNORED:
            notes.append(f"recipe key {key} ignored: {RECIPE_IGNORED[key]}")
        elif key in settings or key in known or key in TRL_NAMES or key in owned:
            kept.append(line)
        else:
            unknown.append(key)
    if unknown:
        hints = [difflib.get_close_matches(key, [*settings, *known, *TRL_NAMES], n=1, cutoff=0.6) for key in unknown]
        named = [f"{key} (did you mean {hint[0]}?)" if hint else key for key, hint in zip(unknown, hints, strict=True)]
        raise ConfigError(
            f"unknown setting{'s' * (len(named) > 1)} {', '.join(named)}: not a constant nor a config "
            "field nor a TRL name (see --help)."
        )
    return kept, notes


# A recipe is flat KEY: value lines: deeper nesting is a mistake, and a YAML alias, which can grow a few lines into
# billions of values, has no use in one.
RECIPE_DEPTH = 8
TRUST_KEY = "trust_remote_code"  # in any case and spelling of `_`/`-`: taken from the command line only


def read_recipe(argv):
    """`--config recipe.yaml` taken out of `argv`: (the rest, (path, its keys as `--key=value`)), or (argv, None).
    Refused with one message naming the file: unreadable or non-UTF-8 bytes, invalid YAML, a key twice, an alias,
    nesting deeper than RECIPE_DEPTH, and TRUST_REMOTE_CODE under any name (running a model's code is decided on
    the command line, never by a shared file)."""
    at = next((i for i, arg in enumerate(argv) if arg == "--config" or arg.startswith("--config=")), None)
    if at is None:
        return list(argv), None
    if argv[at] == "--config" and at + 1 >= len(argv):
        raise ConfigError("--config needs a recipe file: --config configs/recipe.yaml")
    path = argv[at].partition("=")[2] if "=" in argv[at] else argv[at + 1]
    rest = [*argv[:at], *argv[at + (1 if "=" in argv[at] else 2) :]]
    import yaml

    try:
        data = yaml.load(Path(path).expanduser().read_text(encoding="utf-8"), Loader=_recipe_loader(yaml))
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror or err}).") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte {err.start}): save it as UTF-8.") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path} is not valid YAML: {first_line(err)}") from None
    except _RecipeShape as err:
        raise ConfigError(f"--config {path}: {err}") from None
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise ConfigError(f"--config {path}: a recipe is a mapping of KEY: value lines (UPPERCASE constants).")
    if trusted := _trust_keys(data):
        raise ConfigError(
            f"--config {path} sets {trusted[0]}: running a model folder's own code is never taken from a file.\n"
            "Remove it from the recipe; to allow it, type --TRUST_REMOTE_CODE=true on the command line."
        )
    return rest, (path, [f"--{key}={_yaml_value(value)}" for key, value in data.items()])


class _RecipeShape(Exception):
    """A recipe that YAML reads but this script refuses: a key twice, an alias, too deep."""


def _recipe_loader(yaml):
    class Loader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.AliasEvent):
                line = self.peek_event().start_mark.line + 1
                raise _RecipeShape(f"line {line} uses a YAML alias (*name): write the value out.")
            self.depth += 1
            if self.depth > RECIPE_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise _RecipeShape(
                    f"line {line} nests deeper than {RECIPE_DEPTH} levels: a recipe is KEY: value lines."
                )
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, str) and key in seen:
                    raise _RecipeShape(f"{key} is set twice (line {key_node.start_mark.line + 1}): keep one.")
                seen.add(key if isinstance(key, str) else id(key_node))
            return super().construct_mapping(node, deep)

    return Loader


def _trust_keys(data):
    """The keys, at any depth of a recipe, that name trust_remote_code in any case or with `-`."""
    found = []
    for key, value in data.items() if isinstance(data, dict) else ():
        if str(key).lower().replace("-", "_") == TRUST_KEY:
            found.append(str(key))
        found += _trust_keys(value)
    for item in data if isinstance(data, list) else ():
        found += _trust_keys(item)
    return found


def _yaml_value(value):
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value).lower() if isinstance(value, bool) else "" if value is None else str(value)


def _is_field(arg):
    key = arg.removeprefix("--").partition("=")[0]
    return arg.startswith("--") and key[:1].islower() and key not in ("help",)


_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = (.*?)(?:  # (.*))?$")


def _shown(value, limit=60):
    """A value as it is written on the command line: `a,b` for a list, `true` for a bool, a string unquoted."""
    text = _example(value) if not isinstance(value, list) or value else ""
    text = text.replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def help_text(source, settings=None, profiles=None, fields=False):
    """`--help`: the script's summary and run commands, its constants block as `--KEY=value` with each comment,
    and what each profile sets."""
    if source is None:
        return "usage: --KEY=value overrides"
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    doc_end = next((i for i, line in enumerate(lines) if i and line.strip().endswith('"""')), 0)
    summary = lines[0].strip().strip('"')
    commands = [line for line in lines[1:doc_end] if line.startswith("    ")]
    name = Path(source).name
    usage = f"usage: python {name}" + "".join(f" [--{p}]" for p in profiles or {}) + " [--KEY=value ...]"
    out = [summary, "", usage + (" [--field=value ...]" if fields else ""), *commands, ""]
    out.append("settings (--KEY=value; a list as a,b; a boolean as true or false)")
    if fields:
        out.append("and lower-case --field=value for any other GRPOConfig field (--top_p=0.9):")
    ruler = [i for i, line in enumerate(lines) if line.startswith("# ----")]
    block = lines[ruler[0] + 1 : ruler[1]] if len(ruler) >= 2 else lines
    for line in block:
        if match := _CONSTANT.match(line):
            key, value, comment = match.groups()
            shown = _shown(settings[key]) if settings and key in settings else value
            out.append(f"  --{key}={shown}" + (f"\n        {comment}" if comment else ""))
        elif line.startswith("# "):
            out.append(f"\n {line[2:]}")
    for profile, overrides in (profiles or {}).items():
        sets = ", ".join(f"{key}={_shown(value, 40)}" for key, value in overrides.items())
        out.append(f"\n--{profile} sets, before the command line's own --KEY=value:")
        out += textwrap.wrap(sets, 110, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(out)


class Interrupted(BaseException):
    """SIGTERM or Ctrl-C outside training: unwinds the script through every `finally` (the lock, a publish_dir).
    A BaseException, like KeyboardInterrupt, so that no `except Exception` swallows it."""

    def __init__(self, signum, message):
        super().__init__(signum, message)
        self.signum, self.message = signum, message  # the phase as it was when the signal came


# What the script is doing now and what an interruption there leaves, set with `phase`; read by `run`'s message.
NOTHING_WRITTEN = "nothing was written; the same command starts again"
_phase = ["starting", NOTHING_WRITTEN]


def set_phase(doing, outcome=None):
    """What the script does now and what a stop leaves (None keeps the current outcome), for `run`'s message."""
    _phase[:] = [doing, _phase[1] if outcome is None else outcome]


@contextlib.contextmanager
def phase(doing, outcome=None):
    """`set_phase` for the block only."""
    before = list(_phase)
    set_phase(doing, outcome)
    try:
        yield
    finally:
        _phase[:] = before


def stop_message(signum):
    """The one line for a signal `signum` in the current phase.
    >>> with phase("loading the model", "nothing was written"):
    ...     stop_message(signal.SIGTERM)
    'stopped by SIGTERM while loading the model: nothing was written'
    """
    return f"stopped by {signal.Signals(signum).name} while {_phase[0]}: {_phase[1]}"


def _interrupt(signum, frame):
    raise Interrupted(signum, stop_message(signum))


@contextlib.contextmanager
def interruptible():
    """SIGTERM and Ctrl-C unwind the block through `run`, with its one line for the phase, whatever handlers training
    installed: for work inside train() that trains nothing (EVAL_BEFORE), where finishing "the step" would save it."""
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(main):
    """Call `main(argv)`: a ConfigError ends as one paragraph and exit 2; SIGTERM and Ctrl-C as one line saying
    where it stopped (`phase`), exit 128 + the signal. Training installs its own handlers meanwhile."""
    set_phase("starting", NOTHING_WRITTEN)
    previous = {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        return main(sys.argv[1:])
    except ConfigError as err:
        print(f"\nerror: {err}\n", file=sys.stderr, flush=True)
        sys.exit(2)
    except BrokenPipeError:
        if not _stdout_broken():  # another pipe's: a bug, with its traceback
            raise
        # stdout's reader went away (`--help | head -1`): end quietly, as SIGPIPE ends a command-line tool, with
        # stdout pointed at /dev/null so that Python's own flush at exit finds nothing to complain about
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(128 + signal.SIGPIPE)
    except (Interrupted, KeyboardInterrupt) as err:
        signum = err.signum if isinstance(err, Interrupted) else signal.SIGINT
        for other in (signal.SIGTERM, signal.SIGINT):  # a second signal must not cut this line into a traceback
            signal.signal(other, signal.SIG_IGN)
        message = err.message if isinstance(err, Interrupted) else stop_message(signum)
        print(f"\n{message}", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        for signum, handler in previous.items():  # a caller's own (pytest's), once main is done
            signal.signal(signum, handler)


def _stdout_broken():
    """Whether stdout is a pipe or socket whose reader has gone (poll says POLLERR or POLLHUP)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError, AttributeError):  # no file descriptor behind stdout (a test's capture)
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))


def setup_logging(prefix, rank0=True):
    """Log the "grpotrainer" loggers to stderr as "[prefix] message". The root logger stays unconfigured: a
    library with its own handler (huggingface_hub) would otherwise print every message twice."""

    logger = logging.getLogger("grpotrainer")
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler())
    logger.handlers[0].stream = sys.stderr  # today's (setStream would flush a closed one: a test's capture)
    logger.handlers[0].setFormatter(logging.Formatter(f"[{prefix}] %(message)s"))
    logger.setLevel(logging.INFO if rank0 else logging.WARNING)
    logger.propagate = False
    return logger


def require(packages, script):
    """Refuse to start, with the command that fixes it, when this Python lacks a package the script needs."""
    if missing := [p for p in packages if importlib.util.find_spec(p) is None]:
        raise ConfigError(
            f"this Python ({sys.executable}) lacks {', '.join(missing)}.\n"
            f"Run `make install` once, then `.venv/bin/python {script} ...` (or `make smoke`, `make train`)."
        )
