"""Command-line plumbing shared by grpotrainer.py and evaluate.py: `--KEY=value` overrides and clean exits.

Every UPPERCASE module-level constant of a script can be overridden from the command line, checked against the
type of its default, so sweeps and `torchrun`/`accelerate launch` need no file edits:

    python grpotrainer.py --LEARNING_RATE=2e-5 --REWARD_FUNCS=correctness_reward,format_reward

Values are parsed as plain data (numbers, booleans, comma-separated lists), never evaluated as code.
"""

import difflib
import os
import sys

TRUE, FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


class ConfigError(Exception):
    """A problem the user can fix by changing a constant, an override or a file. Printed without a traceback."""


def constants(namespace):
    """The overridable settings of a module: its public UPPERCASE names."""
    return {k: v for k, v in vars(namespace).items() if k.isupper() and not k.startswith("_")}


def _coerce(key, raw, default):
    """Turn the text `raw` into a value of the same type as `default`, or raise ConfigError naming `key`."""
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
        raise ConfigError(
            f"--{key}={raw} is not a valid {want}; its default is {default!r}. Example: --{key}={_example(default)}"
        ) from None
    raise ConfigError(f"{key} (a {want}) cannot be set from the command line; edit it in the file instead.")


def _example(default):
    if isinstance(default, list):
        return ",".join(str(x) for x in default) or "a,b"
    return str(default).lower() if isinstance(default, bool) else str(default)


def apply_overrides(namespace, args):
    """Apply `--KEY=value` arguments to the module `namespace`; return the dict of what was set.

    >>> import types
    >>> ns = types.SimpleNamespace(STEPS=10, LR=1e-5, NAMES=["a"])
    >>> apply_overrides(ns, ["--STEPS=20", "--NAMES=x,y"])
    {'STEPS': 20, 'NAMES': ['x', 'y']}
    """
    known = constants(namespace)
    done = {}
    for arg in args:
        key, sep, raw = arg.removeprefix("--").partition("=")
        if not arg.startswith("--") or not sep:
            raise ConfigError(
                f"cannot read the argument {arg!r}: overrides are written --KEY=value, e.g. --MAX_STEPS=100"
            )
        if key not in known:
            close = difflib.get_close_matches(key.upper(), known, n=3, cutoff=0.5)
            hint = f" Did you mean {', '.join(close)}?" if close else " Constants are UPPERCASE, as in the file."
            raise ConfigError(f"unknown setting --{key}.{hint}")
        done[key] = _coerce(key, raw, known[key])
        setattr(namespace, key, done[key])
    return done


def parse(namespace, argv):
    """Apply `--smoke` (the module's SMOKE settings, and no network) then the `--KEY=value` overrides to the module
    `namespace`, so that overrides win. Return (smoke, the dict of overrides)."""
    smoke = "--smoke" in argv
    if smoke:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the smoke run must never wait on the network
        for key, value in namespace.SMOKE.items():
            setattr(namespace, key, value)
    return smoke, apply_overrides(namespace, [arg for arg in argv if arg != "--smoke"])


def run(main):
    """Call `main(argv)`; print a ConfigError as one paragraph and exit 2 instead of showing a traceback."""
    try:
        main(sys.argv[1:])
    except ConfigError as err:
        print(f"\nerror: {err}\n", file=sys.stderr, flush=True)
        sys.exit(2)
