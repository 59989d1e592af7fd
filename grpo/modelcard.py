"""The model card (README.md) of a trained adapter or merged model: what was trained, on what, how well, how to load
it (TRL's and PEFT's name no dataset and no accuracy). User text goes into code spans or fences it cannot leave, and
huggingface_hub writes the front matter: no value can change the card's structure."""

import contextlib
import json
import os
import re
import shlex
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from grpo import checkpoints, evaluation, files, gsm8k, hardware, hub
from grpo.settings import card_rows, named

TAGS = ["trl", "grpo", "transformers", "gsm8k", "lora"]  # front-matter tags; the Hub lists the model under each
LICENCE_ID = r"[a-z0-9][a-z0-9.+_-]{0,63}"  # a Hub licence id (apache-2.0, mit, llama3.1, other)
CITATIONS = """```bibtex
@article{shao2024deepseekmath,
  title   = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
  author  = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Mingchuan Zhang and
             Y. K. Li and Y. Wu and Daya Guo},
  year    = 2024,
  eprint  = {arXiv:2402.03300},
}
@misc{vonwerra2022trl,
  title        = {{TRL: Transformer Reinforcement Learning}},
  author       = {Leandro von Werra and Younes Belkada and Lewis Tunstall and Edward Beeching and Tristan Thrush
                  and Nathan Lambert and Shengyi Huang and Kashif Rasul and Quentin Gallou{\'e}dec},
  year         = 2020,
  journal      = {GitHub repository},
  publisher    = {GitHub},
  howpublished = {\\url{https://github.com/huggingface/trl}},
}
```"""
METRICS = (  # (key in eval_test_*.json, label, format); an accuracy's 95 % interval is shown beside it
    ("strict_accuracy", "strict accuracy (`#### N` equals the gold answer)", "{:.1%}"),
    ("lenient_accuracy", "lenient accuracy (any final-answer form equals the gold)", "{:.1%}"),
    ("lm_eval_strict_match", "lm-evaluation-harness strict-match (the first `#### N`)", "{:.1%}"),
    ("lm_eval_flexible_extract", "lm-evaluation-harness flexible-extract (the last number)", "{:.1%}"),
    ("sampled_accuracy", "sampled accuracy (mean over the samples, at the training temperature)", "{:.1%}"),
    ("format_rate", "format rate (a readable `#### N`)", "{:.1%}"),
    ("mean_completion_tokens", "mean completion tokens", "{:.1f}"),
    ("n", "test problems scored", "{}"),
)
CORE = ("strict_accuracy", "lenient_accuracy", "format_rate", "mean_completion_tokens", "n")  # rows always shown
SETTING_TYPES = {  # of the run_settings.json values the card reads: a record edited by hand is refused
    **dict.fromkeys(("MODEL_NAME", "DATASET", "DATASET_CONFIG", "SYSTEM_PROMPT"), str),
    **dict.fromkeys(("MAX_COMPLETION_LENGTH", "LORA_R"), int),
    **{"ENABLE_THINKING": bool, "REWARD_FUNCS": list[str], "REWARD_WEIGHTS": list[float]},
    **{"grpo_config": dict, "dataset_sizes": dict[str, int]},
}
METRIC_TYPES = {key: int if key == "n" else float for key, _, _ in METRICS}  # in eval_test_*.json
EXAMPLE_QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)


def write_card(output_dir, settings, *, library_name="peft", repo_id="", adapter_dir=None, **shown):
    """Write output_dir/README.md (after the last save_model, which rewrites it) from a run's settings; return its
    path. `library_name`: peft or transformers (merged); `repo_id`: the Hub repo the snippets load from."""
    output_dir = Path(output_dir)
    text = render_card(
        files.redact(settings),
        name=repo_id.split("/")[-1] if repo_id else output_dir.resolve().name,
        location=repo_id or str(output_dir),
        library_name=library_name,
        adapter_dir=str(adapter_dir or (output_dir if library_name == "peft" else "")),
        **shown,
    )
    versions = []
    for package in ("trl", "transformers", "peft", "torch"):  # the packages that trained it
        with contextlib.suppress(PackageNotFoundError):
            versions.append(f"- {package} {version(package)}")
    text += "\n## Framework versions\n\n" + "\n".join(versions) + "\n" if versions else ""
    (output_dir / "README.md").write_text(text, encoding="utf-8")
    return output_dir / "README.md"


def render_card(
    settings, *, name, location, library_name, metrics_before=None, metrics_after=None, steps=None, adapter_dir=""
):
    """The card's text (front matter and markdown) from values alone: no files, no network."""
    base = str(settings.get("MODEL_NAME", ""))
    licence = base_licence(base)  # read once from the base's card, for the metadata and the section
    results = eval_results(name, settings, metrics_after)
    sections = [
        front_matter(base, settings.get("DATASET", ""), library_name, results, licence),
        f"# {escape(name)}\n\n{summary(base, library_name)}",
        data_section(settings),
        rewards_section(settings),
        settings_section(settings, steps),
        metrics_section(metrics_before, metrics_after, settings),
        usage_section(settings, library_name, location, adapter_dir),
        licence_section(base, licence),
        "## Citations\n\nGRPO (DeepSeekMath) and TRL, which trained this model:\n\n" + CITATIONS,
    ]
    return "\n\n".join(sections) + "\n"


def front_matter(base, dataset, library_name, results=None, licence=None):
    """YAML front matter the Hub reads: base_model (a Hub id only), library, datasets, tags, model-index."""
    from huggingface_hub import ModelCardData

    base_id = hub_model_id(base)
    data = ModelCardData(
        license=licence or "other",
        model_name=results[0] if results else None,
        eval_results=results[1] if results else None,
        base_model=base_id,
        library_name=library_name,
        datasets=[dataset] if dataset and not hub.is_local(dataset) else None,  # a local path is no Hub dataset
        tags=[*TAGS, *([f"base_model:adapter:{base_id}"] if base_id and library_name == "peft" else [])],
        pipeline_tag="text-generation",
    )
    return f"---\n{data.to_yaml()}\n---"


def eval_results(name, settings, metrics):
    """(name, [EvalResult]) of the accuracies after training, or None: with Wilson intervals and paired tests."""
    from huggingface_hub import EvalResult

    metrics = metrics or {}
    dataset = str(settings.get("DATASET", ""))
    local = not dataset or hub.is_local(dataset)
    paired = metrics.get("paired") or {}
    results = []
    accuracies = [m for m in METRICS if m[0] in metrics and m[0] + gsm8k.INTERVAL in metrics]  # with an interval
    for key, label, _ in accuracies:
        low, high = metrics[key + gsm8k.INTERVAL]
        args = {"ci95": [low, high], "n": metrics["n"]}
        if test := paired.get(key.removesuffix("_accuracy")):  # strict, lenient, sampled: the paired tests' names
            args["before"] = round(evaluation.accuracies(test)[0], 4)
            args |= {k: test[k] for k in ("up", "down", "p_value")}
        results.append(
            EvalResult(
                task_type="text-generation",
                dataset_type="json" if local else dataset,  # a local file loads with datasets' json builder
                dataset_name="GSM8K" if dataset == "openai/gsm8k" else (Path(dataset).name if local else dataset),
                dataset_config=None if local else settings.get("DATASET_CONFIG"),
                dataset_split="test",
                metric_type="exact_match" if key.startswith("lm_eval") else "accuracy",  # the Hub's metric names
                metric_name=f"{label.split(' (')[0]}, 95% CI [{low:.3f}, {high:.3f}]",
                metric_value=metrics[key],
                metric_args=args,
            )
        )
    return (name, results) if results else None


def summary(base, library_name):
    what = "A LoRA adapter for" if library_name == "peft" else "A standalone model: a LoRA adapter merged into"
    link = f"the local model {code(base)}" if base else "a base model (not recorded)"
    if base_id := hub_model_id(base):
        link = f"[{escape(base_id)}](https://huggingface.co/{base_id})"
    return (
        f"{what} {link}, trained with GRPO (TRL's `GRPOTrainer`) to solve grade-school math word "
        "problems (GSM8K) step by step and end with the answer on its own line as `#### <number>`, by grpotrainer."
    )


def data_section(settings):
    dataset = str(settings.get("DATASET", ""))
    if not dataset:
        source = "not recorded"
    elif hub.is_local(dataset):
        source = f"the local GSM8K-format file {code(dataset)}"
    else:
        config = settings.get("DATASET_CONFIG")
        link = f"[{escape(dataset)}](https://huggingface.co/datasets/{dataset})"
        source = link if valid_repo_id(dataset) else code(dataset)
        source += f" (config {code(config)})" if config else ""
    counts = (settings.get("dataset_sizes") or {}).items()
    sizes = ", ".join(f"{escape(str(split))} {n:,}" for split, n in counts) or "not recorded"
    prompt = "the system prompt below, then the question as the user turn, rendered with the model's chat template"
    lines = ["## Training data", "", f"- Dataset: {source}", f"- Problems used: {sizes}"]
    lines.append(f"- Prompt: {prompt} and `enable_thinking={bool(settings.get('ENABLE_THINKING', False))}`.")
    if settings.get("SYSTEM_PROMPT"):
        lines += ["", fence(str(settings["SYSTEM_PROMPT"]), "text")]
    return "\n".join(lines)


def rewards_section(settings):
    funcs = list(settings.get("REWARD_FUNCS") or [])
    weights = list(settings.get("REWARD_WEIGHTS") or [])
    if len(weights) != len(funcs):  # TRL weighs every reward 1.0 when no weights are given
        weights = [1.0] * len(funcs)
    names = [f if isinstance(f, str) else getattr(f, "__name__", type(f).__name__) for f in funcs]  # or callables
    rows = [f"| {cell(name)} | {cell(w)} |" for name, w in zip(names, weights, strict=True)]
    table = "\n".join(["| reward function | weight |", "| --- | ---: |", *rows]) if rows else "Not recorded."
    return (
        "## Rewards\n\nEach completion's reward is the weighted sum of these functions (grpotrainer's `rewards.py`; "
        f"answers are compared by value, model output is never executed):\n\n{table}"
    )


def settings_section(settings, steps):
    rows = [*card_rows(settings), ("steps trained", steps)]
    lines = ["## Training settings", "", "| setting | value |", "| --- | --- |"]
    lines += [f"| {label} | {'not recorded' if value is None else cell(value)} |" for label, value in rows]
    if extra := settings.get("grpo_config"):
        given = ", ".join(code(f"{k}={v}") for k, v in extra.items())
        lines += ["", f"Other GRPOConfig fields given on the command line: {given}."]
    return "\n".join(lines)


def metrics_section(before, after, settings):
    if not before and not after:
        return (
            f"## GSM8K test accuracy\n\nNot measured during training ({named('held_out.before')} and "
            f"{named('held_out.after')} were 0). Measure it with `python evaluate.py --ADAPTER=<this adapter>`."
        )

    def value(metrics, key, fmt):
        if not metrics or key not in metrics:
            return "not measured"
        low_high = metrics.get(key + gsm8k.INTERVAL)
        return fmt.format(metrics[key]) + (f" ({low_high[0]:.1%}-{low_high[1]:.1%})" if low_high else "")

    shown = [m for m in METRICS if (before and m[0] in before) or (after and m[0] in after) or m[0] in CORE]
    rows = [f"| {label} | {value(before, k, f)} | {value(after, k, f)} |" for k, label, f in shown]
    thinking = bool(settings.get("ENABLE_THINKING", False))
    lines = ["## GSM8K test accuracy", "", "| | before training | after training |", "| --- | ---: | ---: |", *rows]
    lines += [
        "",
        "Greedy decoding (the sampled row: sampling) on the first problems of the test split, with the training "
        f"prompt and `enable_thinking={thinking}`, scored by grpotrainer's `evaluate.py`; in parentheses the 95 % "
        "Wilson interval. A lenient accuracy far above the strict one means the model solves problems but ignores "
        "the asked format. The lm-evaluation-harness rows grade the same completions as its `gsm8k` task does; its "
        "prompt differs (5-shot plain text where this is the chat template with the system prompt above).",
    ]
    if paired := (after or {}).get("paired"):
        n = paired["strict"]["n"]
        lines += ["", f"Before -> after on the same {n} problems, with the exact McNemar test on the greedy flips:"]
        lines += ["", *(f"- {line}" for line in evaluation.paired_lines(paired)[1:])]
    if pass_at := (after or {}).get("pass_at_k"):
        at = ", ".join(f"pass@{k} {v:.1%}" for k, v in pass_at.items())
        lines += ["", f"After training, of {after.get('samples')} samples per problem (unbiased estimator): {at}."]
    return "\n".join(lines)


def usage_section(settings, library_name, location, adapter_dir):
    """How to load it: transformers (merged), peft (adapter) and vLLM (merged, or base with --enable-lora)."""
    base = str(settings.get("MODEL_NAME", "")) or "<base model>"
    thinking = bool(settings.get("ENABLE_THINKING", False))
    system = str(settings.get("SYSTEM_PROMPT") or "")
    messages = ([("system", system)] if system else []) + [("user", EXAMPLE_QUESTION)]
    shown = "".join(f'    {{"role": {q(role)}, "content": {q(text)}}},\n' for role, text in messages)
    max_tokens = int(settings.get("MAX_COMPLETION_LENGTH") or 256)
    generate = (
        f"messages = [\n{shown}]\n"
        f"inputs = tokenizer.apply_chat_template(\n    messages, add_generation_prompt=True, "
        f'enable_thinking={thinking}, return_tensors="pt", return_dict=True\n).to(model.device)\n'
        f"output = model.generate(**inputs, max_new_tokens={max_tokens}, do_sample=False)\n"
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))'
    )
    blocks = ["## How to use", "Prompt it as it was trained: the same system prompt and thinking setting."]
    if library_name == "transformers":
        blocks += ["### transformers", fence(load_snippet(location, None, generate), "python")]
        blocks += ["### vLLM", fence(f"vllm serve {shlex.quote(location)}", "bash")]
    if adapter_dir:
        lora_rank = hardware.vllm_lora_rank(int(settings.get("LORA_R") or 16))
        adapter = location if library_name == "peft" else adapter_dir
        if library_name == "transformers":
            blocks.append(f"The LoRA adapter it was merged from is {code(adapter_dir)}; it can be served on its own:")
        blocks += ["### peft (the adapter on its base model)", fence(load_snippet(base, adapter, generate), "python")]
        serve = f"vllm serve {shlex.quote(base)} --enable-lora --lora-modules gsm8k={shlex.quote(adapter)}"
        blocks += [
            "### vLLM with the adapter (`--enable-lora`)",
            fence(f"{serve} --max-lora-rank {lora_rank}", "bash"),
        ]
        template = f'`"chat_template_kwargs": {json.dumps({"enable_thinking": thinking})}`'
        blocks.append(
            f"Then ask for the model `gsm8k` and pass the thinking setting to the chat template: {template}."
        )
    if library_name == "peft":
        blocks.append("To merge it into a standalone model: `python export.py --ADAPTER=<this folder>`.")
    return "\n\n".join(blocks)


def load_snippet(source, adapter, generate):
    """Python that loads `source` (with the LoRA `adapter` on it, if any), then runs `generate`."""
    load = f'AutoModelForCausalLM.from_pretrained({q(source)}, dtype="auto", device_map="auto")'
    head = "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
    head += f"tokenizer = AutoTokenizer.from_pretrained({q(source)})"
    if not adapter:
        return f"{head}\nmodel = {load}\n{generate}"
    peft = f"model = PeftModel.from_pretrained(base, {q(adapter)})  # .merge_and_unload() for faster generation"
    return f"from peft import PeftModel\n{head}\nbase = {load}\n{peft}\n{generate}"


def base_licence(base):
    """The base model's licence id from its own card (a local folder or the Hub cache), or None: a plain id only."""
    import yaml
    from huggingface_hub import try_to_load_from_cache

    cached = (base_id := hub_model_id(base)) and try_to_load_from_cache(base_id, "README.md")
    path = Path(base) / "README.md" if Path(base).is_dir() else cached
    try:
        text = Path(path).read_text(encoding="utf-8")[:65536] if isinstance(path, str | Path) else ""
        head = yaml.safe_load(text.split("---")[1]) if text.startswith("---") and text.count("---") >= 2 else None
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None
    licence = head.get("license") if isinstance(head, dict) else None
    return licence if isinstance(licence, str) and re.fullmatch(LICENCE_ID, licence) else None


def licence_section(base, licence):
    """The base model's licence, named where its card states it; no licence text is copied."""
    where = "the base model was not recorded"
    if base_id := hub_model_id(base):
        where = f"its page, https://huggingface.co/{base_id}, states them"
    elif base:
        where = f"the base model is the local folder {code(base)}, so this card cannot link to them"
    terms = f"the base model's licence terms: {where}. Check them"
    if licence and licence != "other":
        terms = f"its licence, `{licence}` (the base model's card). Check its terms"
    return f"## Licence\n\nThis model is derived from its base model and falls under {terms} before redistributing."


def hub_model_id(model_name):
    """The Hub id of a base model: itself for a Hub id, `org/name` for a folder in the Hub cache, else None."""
    parts = Path(model_name).parts
    for i, part in enumerate(parts[:-1]):  # <cache>/models--org--name/snapshots/<revision>
        if part.startswith("models--") and parts[i + 1] == "snapshots":
            return part.removeprefix("models--").replace("--", "/", 1)
    return model_name if valid_repo_id(model_name) and not os.path.isdir(model_name) else None


def finish_run(state, output_dir, record, metrics, started, resumed=None):
    """After the final save, on rank 0: the card (the first part's baseline when `resumed`), run_finished.json, and
    the run's last lines. `metrics`: the held-out points ("before", "after", ...)."""
    before, after = metrics.get("before"), metrics.get("after")
    before = read_metrics(output_dir)[0] if resumed else before
    write_card(output_dir, record, metrics_before=before, metrics_after=after, steps=state.global_step)
    checkpoints.mark_finished(
        output_dir,
        global_step=state.global_step,
        epoch=state.epoch,
        max_steps=record["MAX_STEPS"],
        num_train_epochs=record["NUM_TRAIN_EPOCHS"],
    )
    return [evaluation.summary_line(state.global_step, started, (before, after), record.get("DATASET"))]


def read_metrics(run_dir):
    """(before, after): the metrics dicts a run's evaluations before and after training wrote, None where none."""
    paths = [Path(run_dir) / f"eval_test_{when}.json" for when in ("before", "after")]
    return tuple(files.read_json_object(path, METRIC_TYPES) or None for path in paths)  # {}: none written


def valid_repo_id(name):
    return bool(re.fullmatch(r"(?:[\w.-]+/)?[\w.-]+", name)) and ".." not in name and not name.startswith(("-", "."))


def escape(text):
    """Plain text on one line, with the markdown characters that could start markup backslash-escaped."""
    return re.sub(r"([\\`*_\[\]<>|#~!])", r"\\\1", " ".join(str(text).split()))


def code(text):
    """An inline code span holding `text` on one line, whatever backticks it contains."""
    text = " ".join(str(text).split())
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def cell(value):
    """A value as a table cell: an inline code span with `|` escaped (GFM splits cells on it even in code)."""
    text = ", ".join(str(v) for v in value) if isinstance(value, list) else value
    return code(text).replace("|", "\\|")


def q(text):
    """A Python string literal (JSON's escaping is valid Python)."""
    return json.dumps(str(text), ensure_ascii=False)


def fence(text, lang=""):
    """A fenced code block longer than any backtick run in `text`, so the text cannot close it."""
    ticks = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return f"{ticks}{lang}\n{text}\n{ticks}"
