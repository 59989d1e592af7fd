"""Command-line plumbing for the scripts (grpotrainer.py, evaluate.py, export.py): settings in, clean exits out.

A script's settings are its UPPERCASE constants: `parse` returns them as a dict with a profile (`--smoke`) and
`--KEY=value` overrides applied, each typed like its default. Lower-case `--field=value` arguments are GRPOConfig
fields, typed by transformers' own argument parser; `--config recipe.yaml` adds a recipe's keys before the command
line's (README.md shows the commands). Values are parsed as plain data, never evaluated as code.
"""

import ast
import contextlib
import dataclasses
import difflib
import importlib
import importlib.util
import json
import logging
import re
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


def constants(namespace):
    """The settings of a module: its public UPPERCASE names (pass `globals()` or a module)."""
    items = namespace.items() if isinstance(namespace, dict) else vars(namespace).items()
    return {k: v for k, v in items if k.isupper() and not k.startswith("_")}


def _coerce(key, raw, default):
    want = type(default).__name__
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


def apply_overrides(settings, args):
    """`settings` updated with `--KEY=value` arguments (a new dict), each typed like its default.

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
        out[key] = _coerce(key, raw, settings[key])
    return out


def _split(arg):
    key, sep, raw = arg.removeprefix("--").partition("=")
    if not arg.startswith("--") or not sep or not key:
        raise ConfigError(f"cannot read the argument {arg!r}: write --KEY=value, e.g. --MAX_STEPS=100 (see --help)")
    return key, raw


def config_fields(args, config_class, owned, settings):
    """Lower-case `--field=value` arguments typed for `config_class`. A field that a constant sets (LEARNING_RATE
    sets learning_rate; `owned` maps the others) is refused with the constant's name: one setting, one value."""
    if isinstance(config_class, str):  # "module:Class": its field names read from the source, without importing it
        module, _, class_name = config_class.partition(":")
        known = source_fields(module, class_name)
    if not isinstance(config_class, str) or known is None:
        config_class = _import(config_class)
        known = {f.name for f in dataclasses.fields(config_class) if f.init}
    class_name = config_class.__name__ if isinstance(config_class, type) else class_name
    given = {}
    for arg in args:
        key, raw = _split(arg)
        if (constant := owned.get(key) or (key.upper() if key.upper() in settings else None)) and key in known:
            raise ConfigError(f"--{key} is set by the constant {constant}: use --{constant}=... instead.")
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
            close += difflib.get_close_matches(key.upper(), settings, n=1, cutoff=0.8)
            hint = f" Did you mean {', '.join(close)}?" if close else " See --help for the constants."
            raise ConfigError(f"unknown setting --{key}: not a constant nor a {class_name} field.{hint}")
        given[key] = raw
    if not given:
        return {}
    from transformers import HfArgumentParser  # types each value as the dataclass field declares it

    config_class = _import(config_class)
    parser = HfArgumentParser(config_class)

    def refuse(message):  # argparse would print its usage and exit; say it in one line instead
        raise ConfigError(f"{message.replace('argument ', '')} (a {config_class.__name__} field).")

    parser.error = refuse
    namespace, _ = parser.parse_known_args([f"--{key}={raw}" for key, raw in given.items()])
    return {key: getattr(namespace, key) for key in given}


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
    command line; return `Args`. `source`: the script file, whose constants block `--help` prints."""
    if "--help" in argv or "-h" in argv:
        print(help_text(source, settings, profiles, fields=config_class is not None), flush=True)
        sys.exit(0)
    argv, recipe = read_recipe(argv)
    if recipe:  # its mistakes named with the file; then applied before the command line, which wins
        try:
            apply_overrides(settings, [arg for arg in recipe[1] if not _is_field(arg)])
            lower = [arg for arg in recipe[1] if _is_field(arg)]
            if lower and config_class is not None:
                config_fields(lower, config_class, owned or {}, settings)
        except ConfigError as err:
            raise ConfigError(f"--config {recipe[0]}: {err}") from None
        argv = [*recipe[1], *argv]
    profiles = profiles or {}
    profile = next((name for name in profiles if f"--{name}" in argv), None)
    if profile and any(f"--{other}" in argv for other in profiles if other != profile):
        raise ConfigError(f"choose one of {', '.join('--' + p for p in profiles)}.")
    rest = [arg for arg in argv if arg.removeprefix("--") not in profiles]
    upper = [arg for arg in rest if not _is_field(arg)]
    lower = [arg for arg in rest if _is_field(arg)]
    if lower and config_class is None:
        upper += lower  # no config behind this script: report them as unknown settings
        lower = []
    resolved = files.expand_paths(apply_overrides({**settings, **profiles.get(profile, {})}, upper))
    fields = config_fields(lower, config_class, owned or {}, settings) if lower else {}
    given = frozenset(_split(arg)[0] for arg in upper)
    return Args(resolved, given, profile, fields)


def read_recipe(argv):
    """`--config recipe.yaml` taken out of `argv`: (the rest, (path, its keys as `--key=value`)), or (argv, None)."""
    at = next((i for i, arg in enumerate(argv) if arg == "--config" or arg.startswith("--config=")), None)
    if at is None:
        return list(argv), None
    if argv[at] == "--config" and at + 1 >= len(argv):
        raise ConfigError("--config needs a recipe file: --config configs/recipe.yaml")
    path = argv[at].partition("=")[2] if "=" in argv[at] else argv[at + 1]
    rest = [*argv[:at], *argv[at + (1 if "=" in argv[at] else 2) :]]
    import yaml

    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror or err}).") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path} is not valid YAML: {first_line(err)}") from None
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise ConfigError(f"--config {path}: a recipe is a mapping of KEY: value lines (UPPERCASE constants).")
    return rest, (path, [f"--{key}={_yaml_value(value)}" for key, value in data.items()])


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
