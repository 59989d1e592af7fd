"""`--config recipe.yaml`: the script's constants (or TRL's and open-r1's keys) read as arguments before the command
line's, which win. Read safely: no aliases (a few lines could grow into billions of values), no key twice, no deep
nesting, UTF-8 only, and never trust_remote_code, which only the command line decides."""

import difflib
import json
from pathlib import Path

from grpo.errors import ConfigError, first_line
from grpo.settings import named

# Keys of TRL's and open-r1's recipes that change nothing trained here: ignored with a line each. The command line
# refuses those that are GRPOConfig fields; in a shared recipe they describe how its author published and evaluated.
PUBLISH = "publish with export.py --ADAPTER=OUTPUT_DIR --ADAPTER_ONLY=true --PUSH_TO_HUB=you/name"
HELD_OUT = "held-out accuracy comes from " + ", ".join(named(f"held_out.{w}") for w in ("every", "before", "after"))
IGNORED = {
    **dict.fromkeys(
        ("push_to_hub", "hub_strategy", "hub_model_id", "hub_model_revision", "hub_private_repo"), PUBLISH
    ),
    **dict.fromkeys(("overwrite_hub_revision", "push_to_hub_revision", "hub_token", "hub_always_push"), PUBLISH),
    **dict.fromkeys(("eval_strategy", "do_eval", "eval_steps", "per_device_eval_batch_size"), HELD_OUT),
    "save_strategy": "a checkpoint every SAVE_STEPS, which resuming relies on",
    "benchmarks": "score a run with evaluate.py --ADAPTER=OUTPUT_DIR",
    "callbacks": "open-r1's own callbacks",
    "chat_template": "the model's own chat template renders the prompts, as evaluate.py and export.py use it",
    "num_processes": "the launcher's setting (torchrun --nproc_per_node, docs/launch.md)",
    "vllm_device": "TRL 0.x's; TRL 1.16 places vLLM by VLLM_MODE",
    "overwrite_output_dir": "gone in transformers 5; a rerun resumes from OUTPUT_DIR (RESUME)",
    "max_prompt_length": "gone in TRL 1.x; GSM8K's prompts are short",
    "dataset_configs": "open-r1's list of dataset configs; DATASET_CONFIG names one",
    "dataset_mixture": "one DATASET per run here",
    **{key: f"set {key.upper()} in the environment" for key in ("wandb_entity", "wandb_project", "wandb_run_group")},
}
DEPTH = 8  # nesting levels a recipe may use (a dict field's value is one)
TRUST_KEY = "trust_remote_code"  # in any case and spelling of `_`/`-`


def read(argv):
    """`--config recipe.yaml` taken out of `argv`: (the rest, (path, its keys as `--key=value`)), or (argv, None); a
    recipe that cannot be read safely is refused in one message naming the file."""
    at = next((i for i, arg in enumerate(argv) if arg == "--config" or arg.startswith("--config=")), None)
    if at is None:
        return list(argv), None
    if argv[at] == "--config" and at + 1 >= len(argv):
        raise ConfigError("--config needs a recipe file: --config configs/recipe.yaml")
    path = argv[at].partition("=")[2] if "=" in argv[at] else argv[at + 1]
    rest = [*argv[:at], *argv[at + (1 if "=" in argv[at] else 2) :]]
    try:
        data = load(Path(path).expanduser().read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror or err}).") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"--config {path} is not UTF-8 text (byte {err.start}): save it as UTF-8.") from None
    except ConfigError as err:
        raise ConfigError(f"--config {path}: {err}") from None
    if trusted := next(_trust_keys(data), None):
        raise ConfigError(
            f"--config {path} sets {trusted}: running a model folder's own code is never taken from a file.\n"
            "Remove it from the recipe; to allow it, type --TRUST_REMOTE_CODE=true on the command line."
        )
    return rest, (path, [f"--{key}={_value(value)}" for key, value in data.items()])


def load(text):
    """The recipe's mapping, checked on YAML's node tree before any value is built."""
    import yaml

    try:
        _check_events(yaml.parse(text, Loader=yaml.SafeLoader))
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"not valid YAML: {first_line(err)}") from None
    data = yaml.SafeLoader("").construct_document(root) if isinstance(root, yaml.MappingNode) else None
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise ConfigError("a recipe is a mapping of KEY: value lines (UPPERCASE constants).")
    _check(root, text.splitlines())
    return data


def _check_events(events):
    """Refuse an alias, or nesting deeper than DEPTH, on its line: from the events, before the node tree recurses."""
    import yaml

    depth = 0
    for event in events:
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            raise ConfigError(f"line {line} uses a YAML alias (*name): write the value out.")
        if isinstance(event, yaml.NodeEvent) and depth >= DEPTH:
            raise ConfigError(f"line {line} nests deeper than {DEPTH} levels: a recipe is KEY: value lines.")
        depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)


def _check(node, lines):
    """Refuse a key twice, and a plain text value whose line goes on with `##` (YAML cuts it at ` #### N`)."""
    import yaml

    pairs = node.value if isinstance(node, yaml.MappingNode) else []
    keys = [key.value for key, _ in pairs]
    if twice := next((key for i, (key, _) in enumerate(pairs) if key.value in keys[:i]), None):
        raise ConfigError(f"{twice.value} is set twice (line {twice.start_mark.line + 1}): keep one.")
    for key, value in pairs:
        cut = isinstance(value, yaml.ScalarNode) and value.style is None and value.tag.endswith(":str")
        rest = lines[value.end_mark.line][value.end_mark.column :].strip() if cut and " " in value.value else ""
        if rest.startswith("##"):  # the answer format, a heading: text, not a note
            raise ConfigError(
                f"line {value.end_mark.line + 1}: YAML reads {rest!r} after {key.value}'s text as a comment, so the "
                f'value ends before it. Quote the whole value: {key.value}: "...".'
            )
    for child in [v for pair in pairs for v in pair] + (node.value if isinstance(node, yaml.SequenceNode) else []):
        _check(child, lines)


def keep(lines, accepted):
    """A recipe's `--key=value` lines without the keys IGNORED names (a line each says so), after refusing, all at
    once, the keys not in `accepted` (the constants, the config's fields, TRL's names)."""
    keys = [line.removeprefix("--").partition("=")[0] for line in lines]
    notes = [f"recipe key {key} ignored: {IGNORED[key]}" for key in keys if key in IGNORED]
    kept = [line for key, line in zip(keys, lines, strict=True) if key not in IGNORED and key in accepted]
    unknown = [key for key in keys if key not in IGNORED and key not in accepted]
    if unknown:
        hints = [difflib.get_close_matches(key, accepted, n=1, cutoff=0.6) for key in unknown]
        named = [f"{key} (did you mean {hint[0]}?)" if hint else key for key, hint in zip(unknown, hints, strict=True)]
        raise ConfigError(
            f"unknown setting{'s' * (len(named) > 1)} {', '.join(named)}: not a constant nor a config "
            "field nor a TRL name (see --help)."
        )
    return kept, notes


def _trust_keys(data):
    """The keys, at any depth of a recipe, that name trust_remote_code in any case or with `-`."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        if isinstance(data, dict) and str(key).lower().replace("-", "_") == TRUST_KEY:
            yield str(key)
        yield from _trust_keys(value)


def _value(value):
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, list):
        return ",".join(str(item) for item in value)
    return str(value).lower() if isinstance(value, bool) else "" if value is None else str(value)
