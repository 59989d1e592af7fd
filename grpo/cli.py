"""The command line of the three scripts: their constants with a profile (`--smoke`), a recipe (`--config`) and
`--KEY=value` overrides, typed like each default, never evaluated; TRL's names for a constant read as it, any other
GRPOConfig field typed by transformers' parser; `--plan`, `--help`."""

import ast
import dataclasses
import difflib
import importlib.util
import json
import pkgutil
import re
import sys
import textwrap
from pathlib import Path

from grpo import files, recipes
from grpo.errors import ConfigError
from grpo.settings import TABLE, Setting, trl_names

TRUE, FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
BOOLEAN = {**dict.fromkeys(TRUE, True), **dict.fromkeys(FALSE, False)}


@dataclasses.dataclass(frozen=True)
class Args:
    settings: dict  # UPPERCASE constant -> value, defaults < profile < recipe < command line
    given: frozenset  # the UPPERCASE names set by a recipe or the command line
    profile: str | None  # "smoke", "demo", ... or None
    fields: dict  # lower-case GRPOConfig fields, typed
    notes: tuple = ()  # one line per name read as a constant, per recipe key ignored: for the caller to log
    plan: str | None = None  # --plan: "text", --plan=json: "json"


def constants(namespace):
    """The settings of a module (its `globals()` or itself): its UPPERCASE names that grpo/settings.py describes, and
    no other (its profiles): a module's repr in run_settings.json would refuse a resume from another checkout."""
    items = namespace.items() if isinstance(namespace, dict) else vars(namespace).items()
    return {k: v for k, v in items if k in TABLE}


def _coerce(key, raw, default):
    want = type(default).__name__
    if raw is None and not isinstance(default, bool):  # a bare --KEY is a boolean's true, as argparse reads a flag
        raise ConfigError(f"--{key} needs a value: write --KEY=value, e.g. --{key}={_example(default)} (see --help).")
    raw = "true" if raw is None else raw
    try:
        if isinstance(default, bool):  # before int: bool is a subclass of int
            return BOOLEAN[raw.lower()]
        if isinstance(default, int | float | str):
            return type(default)(raw)
        if isinstance(default, list):
            items = [item.strip() for item in raw.split(",") if item.strip()]
            numeric = bool(default) and all(isinstance(x, int | float) for x in default)
            return [float(item) for item in items] if numeric else items
    except (KeyError, ValueError):
        raise ConfigError(f"--{key}={raw} is not a valid {want} (default {_example(default)}).") from None
    raise ConfigError(f"{key} (a {want}) cannot be set from the command line; edit it in the file instead.")


def _example(default):
    if isinstance(default, list):
        return ",".join(str(x) for x in default) or "a,b"
    return str(default).lower() if isinstance(default, bool) else str(default)


def apply_overrides(settings, args, types=None):
    """`settings` updated with `--KEY=value` arguments (a new dict), each typed like its default (in `types`, the
    constants, when `settings` holds a profile's values, whose int may stand for a float)."""
    out, repeated = dict(settings), set()
    for arg in args:
        key, raw = _split(arg)
        if key not in settings:
            close = difflib.get_close_matches(key.upper(), settings, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else " See --help for the settings."
            raise ConfigError(f"unknown setting --{key}.{hint}")
        if TABLE.get(key, Setting()).repeat and raw is not None:  # one item per argument, commas and all
            out[key] = [*(out[key] if key in repeated else []), raw]
            repeated.add(key)
        else:
            out[key] = _coerce(key, raw, (types or settings)[key])
    return out


def _split(arg):
    """(key, value) of `--key=value`; the value None for a bare `--key`."""
    key, sep, raw = arg.removeprefix("--").partition("=")
    if not arg.startswith("--") or not key:
        raise ConfigError(f"cannot read the argument {arg!r}: write --KEY=value, e.g. --MAX_STEPS=100 (see --help)")
    return key, raw if sep else None


def join_values(argv):
    """`argv` with each `--key value` (`--key a b`: a comma list) as `--key=value`."""
    out, joining = [], False
    for arg in argv:
        if joining and not arg.startswith("--"):
            out[-1] += ("," if "=" in out[-1] else "=") + arg
            continue
        out.append(arg)
        joining = arg.startswith("--") and "=" not in arg
    return out


# TRL's names (`trl grpo`'s ModelConfig and ScriptArguments; open-r1's recipes) that mean a value of a constant
# ({value: the argument it means, "" for none}), a key of a dict field, or a field this script sets (what to do).
TRL_VALUES = {
    "model_revision": "model_init_kwargs.revision",
    "dtype": {"bfloat16": "--BF16=true", "float32": "--BF16=false", "auto": ""},
    "torch_dtype": {"bfloat16": "--BF16=true", "float32": "--BF16=false", "auto": ""},  # dtype's name before 1.x
    "use_peft": {"true": ""},  # LoRA is what this script trains
    "dataset_train_split": {"train": ""},  # the dataset's splits are train and test
    "dataset_test_split": {"test": ""},
    "log_completions": {"true": "--LOG_COMPLETIONS_STEPS=1", "false": "--LOG_COMPLETIONS_STEPS=0"},
    "use_cpu": "the CPU profiles: run --smoke or --demo, or on a GPU without either",
    "resume_from_checkpoint": "RESUME, from the newest checkpoint-N in OUTPUT_DIR: --RESUME=false starts afresh",
}


def translate(arg, known, names):
    """A lower-case (or old) `arg` as read here: (the argument, or None when it sets nothing; a line saying so, or
    None). `names`: {name: constant}; `known`: the config's fields. `--no_X` is `--X=false`, as in HfArgumentParser."""
    key, raw = _split(arg)
    if raw is None and key.startswith("no_") and (key[3:] in names or key[3:] in known or key[3:] in TRL_VALUES):
        key, raw, arg = key[3:], "false", f"--{key[3:]}=false"
    owner = TRL_VALUES.get(key) or names.get(key)
    value = "" if raw is None else f"={raw}"
    if isinstance(owner, dict):  # the values it may have here
        meant = owner.get("true" if raw is None else raw.lower())
        if meant is None:
            raise ConfigError(f"--{key}{value}: this script takes only {' or '.join(owner)} here.")
        return meant or None, f"--{key}{value} is {meant} here" if meant else f"--{key}{value}: what this script does"
    if owner and owner.isupper():
        return f"--{owner}{value}", f"--{key} is {owner} here"
    if owner and "." in owner and raw is not None:  # a key of a dict field
        field, _, inner = owner.partition(".")
        return f"--{field}={json.dumps({inner: raw})}", f"--{key} is --{field}'s {inner!r} here"
    if owner:
        raise ConfigError(f"--{key} is set by {owner}.")
    return arg, None


def config_fields(args, config_class, known, settings=()):
    """Lower-case `--field=value` arguments typed by transformers' parser as `config_class` ("module:Class") declares
    them; a dict field given twice (model_revision and model_init_kwargs) merged."""
    given = {}
    for arg in args:
        key, raw = _split(arg)
        if key not in known:
            close = difflib.get_close_matches(key, known | set(TRL_VALUES), n=3, cutoff=0.6)
            close += difflib.get_close_matches(key.upper(), settings, n=1, cutoff=0.8)
            hint = f" Did you mean {', '.join(close)}?" if close else " See --help for the constants."
            raise ConfigError(f"unknown setting --{key}: not a constant nor a GRPOConfig field.{hint}")
        if key in given and _json_object(given[key]) and _json_object(raw):
            raw = json.dumps({**json.loads(given[key]), **json.loads(raw)})
        given[key] = raw
    from transformers import HfArgumentParser  # types each value as the dataclass field declares it

    parser = HfArgumentParser(pkgutil.resolve_name(config_class))

    def refuse(message):  # argparse would print its usage and exit; say it in one line instead
        raise ConfigError(f"{message.replace('argument ', '')} (a GRPOConfig field).")

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
    except (TypeError, ValueError):  # not text, or not JSON
        return False


def merge_fields(ours, given, owners):
    """The keyword arguments `ours` (build_config's) with the command line's fields `given`: a dict field merged key
    by key, a key that `ours` sets refused naming `owners[field]`; any other field the user's value."""
    out = dict(ours)
    for key, value in given.items():
        if isinstance(ours.get(key), dict):
            value = json.loads(value) if _json_object(value) else value
            if not isinstance(value, dict):
                raise ConfigError(f'--{key} takes a JSON object, e.g. --{key}=\'{{"revision": "main"}}\'.')
            if clash := sorted(set(value) & set(ours[key])):
                raise ConfigError(f"--{key} sets {', '.join(clash)}, which {owners.get(key)} set here: leave it out.")
            value = {**ours[key], **value}
        out[key] = value
    return out


# GRPOConfig's file and its base's, read with `ast`: importing trl costs seconds that a typo's refusal should not
CONFIG_SOURCES = {"trl/trainer/grpo_config.py": "GRPOConfig", "transformers/training_args.py": "TrainingArguments"}


def source_fields(sources=CONFIG_SOURCES):
    """The init fields of the config classes in `sources` ({package-relative file: class}), read from source."""
    names = set()
    for relative, class_name in sources.items():
        top, _, rest = relative.partition("/")
        spec = importlib.util.find_spec(top)  # finds the package's folder without running its __init__
        if spec is None:  # not installed: process.require says so
            return names
        tree = ast.parse(Path(next(iter(spec.submodule_search_locations)), rest).read_text(encoding="utf-8"))
        node = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                keywords = item.value.keywords if isinstance(item.value, ast.Call) else []
                no_init = any(k.arg == "init" and getattr(k.value, "value", 1) is False for k in keywords)
                (names.discard if no_init else names.add)(item.target.id)
    return names


def take_flags(argv, profiles):
    """(`argv` without --plan/--plan=json and the profile's flag, the plan mode or None, the profile or None)."""
    plans = [arg for arg in argv if arg == "--plan" or arg.startswith("--plan=")]
    mode = (plans[-1].partition("=")[2] or "text") if plans else None
    if mode not in (None, "text", "json"):
        raise ConfigError(f"{plans[-1]}: write --plan (the block) or --plan=json (one JSON object).")
    chosen = [name for name in profiles if f"--{name}" in argv]
    if len(chosen) > 1:
        raise ConfigError(f"choose one of {', '.join('--' + p for p in profiles)}.")
    rest = [arg for arg in argv if arg not in plans and arg.removeprefix("--") not in profiles]
    return rest, mode, chosen[0] if chosen else None


def parse(settings, argv, profiles=None, config_class=None, source=None):
    """`Args` from a script's `constants(globals())`, profiles ({"smoke": {...}}), a recipe and the command line.
    `source`: the script, whose constants --help prints; `config_class`: "module:Class" whose fields pass through."""
    profiles = profiles or {}
    if "--help" in argv or "-h" in argv:
        print(help_text(source, settings, profiles, fields=config_class is not None), flush=True)
        sys.exit(0)
    argv, plan, profile = take_flags(argv, profiles)
    argv, recipe = recipes.read(argv)
    known = source_fields() if config_class else set()
    names = {alias: name for alias, name in trl_names(settings).items() if config_class or alias.isupper()}
    notes = []
    if recipe:  # its mistakes named with the file; then applied before the command line, which wins
        path, lines = recipe
        try:
            lines, notes = recipes.keep(lines, {*settings, *known, *TRL_VALUES, *names})
            apply_overrides(settings, _resolve(lines, settings, config_class, known, names)[0])
        except ConfigError as err:
            raise ConfigError(f"--config {path}: {err}") from None
        argv = [*lines, *argv]
    upper, fields, mapped = _resolve(join_values(argv), settings, config_class, known, names)
    resolved = files.expand_paths(apply_overrides({**settings, **profiles.get(profile, {})}, upper, types=settings))
    given = frozenset(_split(arg)[0] for arg in upper)
    return Args(resolved, given, profile, fields, tuple(dict.fromkeys([*notes, *mapped])), plan)


def _resolve(args, script_settings, config_class, known, names):
    """(the `--KEY=value` arguments, other names read as constants among them; the config's fields; the notes)."""
    upper, lower, notes = [], [], []
    for arg in args:
        key = _split(arg)[0]
        if key not in script_settings and (config_class or key in names or key.removeprefix("no_") in names):
            arg, note = translate(arg, known, names)
            notes += [note] if note else []
        if arg is not None:  # an unknown UPPERCASE name, or any without a config, is refused by apply_overrides
            key = _split(arg)[0]
            (upper if key in script_settings or key[:1].isupper() or not config_class else lower).append(arg)
    return upper, config_fields(lower, config_class, known, script_settings) if lower else {}, notes


_CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = (.*?)(?:  # (.*))?$")


def comments(source):
    """{CONSTANT: its one-line comment} of a script's constants block, for --help and the messages refusing a value."""
    return {m[1]: m[3] or "" for line in _block(source) if (m := _CONSTANT.match(line))}


def _block(source):
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    ruler = [i for i, line in enumerate(lines) if line.startswith("# ----")]
    return lines[ruler[0] + 1 : ruler[1]] if len(ruler) >= 2 else lines


def _shown(value, limit=60):
    """A value as it is written on the command line: `a,b` for a list, `true` for a bool, a string unquoted."""
    text = (_example(value) if not isinstance(value, list) or value else "").replace("\n", "\\n")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def help_text(source, settings=None, profiles=None, fields=False):
    """`--help`: summary, run commands, each constant as `--KEY=value` with its comment and row, what profiles set."""
    lines = Path(source).read_text(encoding="utf-8").splitlines()
    doc_end = next((i for i, line in enumerate(lines) if i and line.strip().endswith('"""')), 0)
    commands = [line for line in lines[1:doc_end] if line.startswith("    ")]
    usage = f"usage: python {Path(source).name}" + "".join(f" [--{p}]" for p in profiles or {}) + " [--KEY=value ...]"
    out = [lines[0].strip().strip('"'), "", usage + (" [--field=value ...]" if fields else ""), *commands, ""]
    out.append("settings (--KEY=value; a list as a,b; a boolean as true or false)")
    if fields:
        out.append("and lower-case --field=value for any other GRPOConfig field (--top_p=0.9):")
    for line in _block(source):
        if match := _CONSTANT.match(line):
            key, value, comment = match.groups()
            shown = _shown(settings[key]) if settings and key in settings else value
            row = TABLE.get(key, Setting())
            check = row.check if isinstance(row.check, str) else "|".join(str(c) for c in row.check)
            extra = [check and f"in {check}", row.names and f"TRL: {', '.join(row.names)}"]
            extra = ", ".join(filter(None, [*extra, row.plan and f"plan: {', '.join(row.plan)}"]))
            entry = f"  --{key}={shown}" + (f"\n        {comment}" if comment else "")
            out.append(entry + (f" ({extra})" if extra else ""))
        elif line.startswith("# "):
            out.append(f"\n {line[2:]}")
    for profile, overrides in (profiles or {}).items():
        sets = ", ".join(f"{key}={_shown(value, 40)}" for key, value in overrides.items())
        out.append(f"\n--{profile} sets, before the command line's own --KEY=value:")
        out += textwrap.wrap(sets, 110, initial_indent="  ", subsequent_indent="  ")
    return "\n".join(out)
