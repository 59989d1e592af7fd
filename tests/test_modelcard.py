"""grpo/modelcard.py: the card names what was trained and how well, loads on the Hub, and user text cannot break it.

.venv/bin/python -m pytest tests/test_modelcard.py -q      # no model, no network: about a second
"""

import json
import re
import time

import pytest
import yaml

from grpo import evaluation, gsm8k, modelcard
from grpo.settings import TABLE, Setting

TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7"  # shaped like a Hugging Face access token; no real one

SETTINGS = {  # a run's settings as run_settings.json holds them (the keys the card reads, plus others it ignores)
    "MODEL_NAME": "Qwen/Qwen3-8B",
    "DATASET": "openai/gsm8k",
    "DATASET_CONFIG": "main",
    "SYSTEM_PROMPT": "Solve it. End with '#### <number>'.",
    "REWARD_FUNCS": ["correctness_reward", "format_reward"],
    "REWARD_WEIGHTS": [1.0, 0.2],
    "LEARNING_RATE": 1e-05,
    "LORA_R": 16,
    "LORA_ALPHA": 32,
    "LORA_TARGET_MODULES": "all-linear",
    "NUM_GENERATIONS": 4,
    "MAX_COMPLETION_LENGTH": 256,
    "TEMPERATURE": 0.7,
    "BETA": 0.05,
    "LOSS_TYPE": "dapo",
    "ENABLE_THINKING": False,
    "BF16": True,
    "OUTPUT_DIR": "outputs/qwen3-gsm8k-grpo",
    "grpo_config": {"warmup_ratio": 0.1},
}


BEFORE = dict(n=200, strict_accuracy=0.415, lenient_accuracy=0.82, format_rate=0.5, mean_completion_tokens=180.25)


AFTER = dict(n=200, strict_accuracy=0.875, lenient_accuracy=0.9, format_rate=0.98, mean_completion_tokens=150.0)


def render(settings=SETTINGS, **kwargs):
    defaults = dict(name="qwen3-gsm8k-grpo", location="outputs/qwen3-gsm8k-grpo", library_name="peft")
    return modelcard.render_card(settings, **{**defaults, **kwargs})


def front_matter(card):
    match = re.match(r"---\n(.*?)\n---\n", card, re.S)
    return yaml.safe_load(match.group(1))


def code_blocks(card, lang):
    return re.findall(rf"^(`{{3,}}){lang}\n(.*?)\n\1$", card, re.S | re.M)


@pytest.mark.parametrize(
    "model, dataset, library, expected",
    [
        # a Hub base and the Hub dataset: both linked, and an adapter gets the Hub's base_model:adapter tag
        ("Qwen/Qwen3-8B", "openai/gsm8k", "peft", {
            "base_model": "Qwen/Qwen3-8B", "datasets": ["openai/gsm8k"], "library_name": "peft",
            "tags": [*modelcard.TAGS, "base_model:adapter:Qwen/Qwen3-8B"]}),
        # a local base and a local file: neither is a Hub id, so neither goes into the metadata
        ("/models/my-qwen", "data/train.jsonl", "transformers", {
            "library_name": "transformers", "tags": modelcard.TAGS}),
        # a folder of the Hub cache is the Hub model it holds
        ("/hf/hub/models--Qwen--Qwen3-1.7B/snapshots/0123abc", "openai/gsm8k", "transformers", {
            "base_model": "Qwen/Qwen3-1.7B", "datasets": ["openai/gsm8k"], "library_name": "transformers",
            "tags": modelcard.TAGS}),
    ],
)  # fmt: skip
def test_front_matter_is_what_the_hub_reads(model, dataset, library, expected):
    meta = front_matter(render({**SETTINGS, "MODEL_NAME": model, "DATASET": dataset}, library_name=library))
    # a base model whose licence is not known here (not cached, no card): the Hub's "other"
    assert meta == {**expected, "pipeline_tag": "text-generation", "license": "other"}


def test_card_names_base_data_rewards_settings_and_steps():
    card = render({**SETTINGS, "dataset_sizes": {"train": 7473, "test": 200}}, steps=120)  # as the run records them
    # TRL's card says "fine-tuned version of [None]"; ours links the base model
    assert "A LoRA adapter for [Qwen/Qwen3-8B](https://huggingface.co/Qwen/Qwen3-8B)" in card
    assert "- Dataset: [openai/gsm8k](https://huggingface.co/datasets/openai/gsm8k) (config `main`)" in card
    assert "- Problems used: train 7,473, test 200" in card
    for line in (
        "| `correctness_reward` | `1.0` |",
        "| `format_reward` | `0.2` |",
        "| learning rate | `1e-05` |",
        "| LoRA rank r | `16` |",
        "| LoRA alpha | `32` |",
        "| LoRA target modules | `all-linear` |",
        "| completions per prompt (num_generations) | `4` |",
        "| max completion length (tokens) | `256` |",
        "| KL coefficient beta | `0.05` |",
        "| loss type | `dapo` |",
        "| sampling temperature | `0.7` |",
        "| LoRA dropout | not recorded |",  # a key the settings lack is said to be missing, not guessed
        "| steps trained | `120` |",
    ):
        assert line in card.splitlines(), line
    assert "Other GRPOConfig fields given on the command line: `warmup_ratio=0.1`." in card


def settings_table(card):
    return card.split("| setting | value |\n| --- | --- |\n")[1].split("\n\n")[0].splitlines()


def test_the_settings_table_has_a_row_for_each_card_label_of_the_settings_table():
    # grpo/settings.py's TABLE, in its order: every setting with a card label, "not recorded" where the run's
    # record lacks it (an older run), then the steps
    assert settings_table(render({**SETTINGS, "USE_DORA": True}, steps=120)) == [
        "| 4-bit base weights (QLoRA) | not recorded |",
        "| thinking mode (enable_thinking) | `False` |",
        "| LoRA rank r | `16` |",
        "| LoRA alpha | `32` |",
        "| LoRA dropout | not recorded |",
        "| LoRA target modules | `all-linear` |",
        "| rank-stabilised LoRA | not recorded |",
        "| DoRA | `True` |",
        "| completions per prompt (num_generations) | `4` |",
        "| max completion length (tokens) | `256` |",
        "| sampling temperature | `0.7` |",
        "| KL coefficient beta | `0.05` |",
        "| loss type | `dapo` |",
        "| reward scaling | not recorded |",
        "| learning rate | `1e-05` |",
        "| per-device batch size | not recorded |",
        "| gradient accumulation steps | not recorded |",
        "| epochs | not recorded |",
        "| max steps (-1 = by epochs) | not recorded |",
        "| bf16 | `True` |",
        "| seed | not recorded |",
        "| steps trained | `120` |",
    ]


def test_a_setting_given_a_card_label_in_the_table_gets_its_row(monkeypatch):
    monkeypatch.setitem(TABLE, "TOP_P", Setting("(0, 1]", "top_p", card="nucleus sampling top_p"))
    rows = settings_table(render({**SETTINGS, "TOP_P": 0.9}))
    assert rows[-2:] == ["| nucleus sampling top_p | `0.9` |", "| steps trained | not recorded |"]


def test_the_card_never_holds_a_credential(tmp_path):
    # a record written before runs redacted theirs (or edited by hand): a token in the command line's GRPOConfig
    # fields, in the prompt, and a URL with a login
    record = {
        **SETTINGS,
        "SYSTEM_PROMPT": f"Solve it. {TOKEN}",
        "grpo_config": {"hub_token": TOKEN, "model_init_kwargs": {"token": "secret-text"}, "warmup_ratio": 0.1},
        "VLLM_SERVER_BASE_URL": "http://me:secret-pass@host:8000",
    }
    card = modelcard.write_card(tmp_path, record, steps=4).read_text()
    assert not [secret for secret in (TOKEN, "secret-text", "secret-pass") if secret in card]
    # what is redacted is said so; the rest of the record is on the card as before
    assert "```text\nSolve it. <redacted>\n```" in card
    assert "`hub_token=<redacted>`" in card and "`warmup_ratio=0.1`" in card


def scored_pair():
    """(before, after) metrics as a run writes them: 8 problems, 6 flips up and none down in lenient."""
    questions = [f"q{i}" for i in range(8)]
    before = [{"question": q, "correct": i < 2, "strict_correct": i < 1} for i, q in enumerate(questions)]
    after = [{"question": q, "correct": True, "strict_correct": i < 2} for i, q in enumerate(questions)]
    metrics = [gsm8k.summarize(p, [10] * 8) for p in (before, after)]
    metrics[1] |= gsm8k.sampled_summary([{"correct": c, "strict_correct": 0} for c in (0, 1, 2, 2) * 2], 2, 0.7)
    metrics[1]["paired"] = evaluation.compare(before, after, "eval_test_before.json")
    return metrics


def test_the_model_index_carries_the_results_with_their_intervals_and_the_paired_test():
    before, after = scored_pair()
    meta = front_matter(render(metrics_before=before, metrics_after=after))
    (index,) = meta["model-index"]
    (result,) = index["results"]
    assert index["name"] == "qwen3-gsm8k-grpo" and result["task"] == {"type": "text-generation"}
    assert result["dataset"] == {"name": "GSM8K", "type": "openai/gsm8k", "config": "main", "split": "test"}
    metrics = {m["name"].split(",")[0]: m for m in result["metrics"]}
    assert list(metrics) == [
        "strict accuracy",
        "lenient accuracy",
        "lm-evaluation-harness strict-match",
        "lm-evaluation-harness flexible-extract",
        "sampled accuracy",
    ]
    # the Hub's metric types: accuracy, and exact_match as lm-evaluation-harness names its gsm8k metrics
    assert [m["type"] for m in metrics.values()] == ["accuracy", "accuracy", "exact_match", "exact_match", "accuracy"]
    metrics = dict(zip(["strict_accuracy", "lenient_accuracy", "lm_eval", "lm_eval_flexible", "sampled_accuracy"],
                       metrics.values(), strict=True))  # fmt: skip
    # lenient: 8 of 8 after (Wilson [0.6756, 1]), 2 of 8 before, 6 up and 0 down: p = 2 / 2^6
    assert metrics["lenient_accuracy"]["value"] == 1.0
    assert metrics["lenient_accuracy"]["name"] == "lenient accuracy, 95% CI [0.676, 1.000]"
    assert metrics["lenient_accuracy"]["args"] == {
        "ci95": [0.6756, 1.0],
        "n": 8,
        "before": 0.25,
        "up": 6,
        "down": 0,
        "p_value": 0.03125,
    }
    assert "p_value" not in metrics["sampled_accuracy"]["args"]  # the paired test is the greedy verdicts'
    # read back by huggingface_hub as the Hub does
    from huggingface_hub import ModelCard

    card = ModelCard(render(metrics_before=before, metrics_after=after))
    assert [r.metric_value for r in card.data.eval_results][:2] == [0.25, 1.0]


def test_the_card_shows_intervals_the_paired_test_and_pass_at_k():
    before, after = scored_pair()
    lines = render(metrics_before=before, metrics_after=after).splitlines()
    for line in (
        # strict 1 of 8 -> 2 of 8; Wilson of 1/8 is [0.0224, 0.4709], of 2/8 [0.0709, 0.5907]
        "| strict accuracy (`#### N` equals the gold answer) | 12.5% (2.2%-47.1%) | 25.0% (7.1%-59.1%) |",
        "| sampled accuracy (mean over the samples, at the training temperature) | not measured "
        "| 62.5% (30.6%-86.3%) |",
        "- strict: 0.125 -> 0.250 (+0.125; 1 up / 0 down, p = 1)",
        "- lenient: 0.250 -> 1.000 (+0.750; 6 up / 0 down, p = 0.031)",
        # per problem c = 0, 1, 2, 2 of 2: pass@1 = (0 + 1/2 + 1 + 1) / 4, pass@2 = (0 + 1 + 1 + 1) / 4
        "After training, of 2 samples per problem (unbiased estimator): pass@1 62.5%, pass@2 75.0%.",
    ):
        assert line in lines, line


def test_a_card_without_results_has_no_model_index():
    assert "model-index" not in front_matter(render(metrics_before=BEFORE))


@pytest.mark.parametrize(
    "funcs, weights, rows",
    [
        (["correctness_reward"], [], ["| `correctness_reward` | `1.0` |"]),  # no weights: TRL weighs each 1.0
        (["mymod:my_reward", len], [0.5, 2], ["| `mymod:my_reward` | `0.5` |", "| `len` | `2` |"]),  # callables
    ],
)
def test_reward_rows(funcs, weights, rows):
    card = render({**SETTINGS, "REWARD_FUNCS": funcs, "REWARD_WEIGHTS": weights})
    table = card.split("| reward function | weight |\n| --- | ---: |\n")[1].split("\n\n")[0]
    assert table.splitlines() == rows


@pytest.mark.parametrize(
    "before, after, expected",
    [
        (BEFORE, AFTER, [
            "| strict accuracy (`#### N` equals the gold answer) | 41.5% | 87.5% |",
            "| lenient accuracy (any final-answer form equals the gold) | 82.0% | 90.0% |",
            "| format rate (a readable `#### N`) | 50.0% | 98.0% |",
            "| mean completion tokens | 180.2 | 150.0 |",
            "| test problems scored | 200 | 200 |"]),
        (None, AFTER, ["| strict accuracy (`#### N` equals the gold answer) | not measured | 87.5% |"]),
        (None, None, ["Not measured during training (EVAL_BEFORE and EVAL_AFTER were 0). Measure it with "
                      "`python evaluate.py --ADAPTER=<this adapter>`."]),
    ],
)  # fmt: skip
def test_accuracy_before_and_after(before, after, expected):
    lines = render(metrics_before=before, metrics_after=after).splitlines()
    for line in expected:
        assert line in lines, line


@pytest.mark.parametrize(
    "library, repo_id, adapter_dir, lora_r, expected",
    [
        # an adapter card: peft on its base, and vLLM serving the base with the adapter as a LoRA module
        ("peft", "you/qwen3-gsm8k", "", 16, [
            'model = PeftModel.from_pretrained(base, "you/qwen3-gsm8k")',
            "vllm serve Qwen/Qwen3-8B --enable-lora --lora-modules gsm8k=you/qwen3-gsm8k --max-lora-rank 16"]),
        # vLLM's --max-lora-rank takes only some values: rank 24 needs 32
        ("peft", "", "", 24, ["--lora-modules gsm8k=outputs/qwen3-gsm8k-grpo --max-lora-rank 32"]),
        # a merged card: plain transformers and vLLM on the folder itself, and the adapter it came from
        ("transformers", "you/qwen3-gsm8k", "outputs/run", 16, [
            'model = AutoModelForCausalLM.from_pretrained("you/qwen3-gsm8k", dtype="auto", device_map="auto")',
            "vllm serve you/qwen3-gsm8k",
            "vllm serve Qwen/Qwen3-8B --enable-lora --lora-modules gsm8k=outputs/run --max-lora-rank 16"]),
    ],
)  # fmt: skip
def test_how_to_load(library, repo_id, adapter_dir, lora_r, expected):
    location = repo_id or "outputs/qwen3-gsm8k-grpo"
    adapter_dir = adapter_dir or (location if library == "peft" else "")
    card = render({**SETTINGS, "LORA_R": lora_r}, library_name=library, location=location, adapter_dir=adapter_dir)
    for snippet in expected:
        assert snippet in card, snippet
    assert '"chat_template_kwargs": {"enable_thinking": false}' in card  # vLLM users keep the training prompt


HOSTILE = {  # user text that would break a naive card: fences, table pipes, headings, links, quotes, newlines
    **SETTINGS,
    "MODEL_NAME": "/models/my `model` | x",
    "SYSTEM_PROMPT": 'Answer.\n```\n# Injected heading\n""" \' \\ end',
    "REWARD_FUNCS": ["a|b_reward", "[click](http://evil)"],
    "REWARD_WEIGHTS": [1.0, 1.0],
    "LORA_TARGET_MODULES": "q_proj|v_proj",
}


def test_user_text_cannot_break_the_card():
    card = render(HOSTILE, library_name="transformers", adapter_dir="/runs/it's here")
    # the system prompt sits inside a fence longer than the ``` it contains, so its heading stays text
    assert "````text\nAnswer.\n```\n# Injected heading" in card
    outside = re.sub(r"^(`{3,})\w*\n.*?\n\1$", "", card, flags=re.S | re.M)
    assert "# Injected heading" not in outside
    # every table row keeps its cell count: pipes in values are escaped
    assert "| `a\\|b_reward` | `1.0` |" in card and "| LoRA target modules | `q_proj\\|v_proj` |" in card
    assert "[click](http://evil)" not in outside.replace("`[click](http://evil)`", "")
    # every Python snippet still compiles, whatever quotes and backslashes the paths and prompt hold
    blocks = code_blocks(card, "python")
    assert len(blocks) == 2
    for _, source in blocks:
        compile(source, "<card>", "exec")


@pytest.mark.parametrize(
    "func, text, expected",
    [
        (modelcard.code, "all-linear", "`all-linear`"),
        (modelcard.code, "a`b", "``a`b``"),  # a longer backtick run than the text holds
        (modelcard.code, "`x`", "`` `x` ``"),  # padded so the text's own backticks are not part of the delimiter
        (modelcard.code, "two\nlines", "`two lines`"),  # one line: a newline would end a table row
        (modelcard.cell, "a|b", "`a\\|b`"),
        (modelcard.cell, ["q_proj", "v_proj"], "`q_proj, v_proj`"),
        (modelcard.escape, "my_run *v2*", "my\\_run \\*v2\\*"),
        (modelcard.escape, "<b>[x]</b>", "\\<b\\>\\[x\\]\\</b\\>"),
        (modelcard.escape, "my_run *v2* [x]|<b>", "my\\_run \\*v2\\* \\[x\\]\\|\\<b\\>"),
        (modelcard.code, "q_proj,v_proj", "`q_proj,v_proj`"),
        (modelcard.fence, "plain", "```\nplain\n```"),
        (modelcard.fence, "has ```` four", "`````\nhas ```` four\n`````"),
    ],
)
def test_markdown_helpers(func, text, expected):
    assert func(text) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Qwen/Qwen3-8B", "Qwen/Qwen3-8B"),
        ("/data/hub/models--Qwen--Qwen3-8B/snapshots/abc123", "Qwen/Qwen3-8B"),  # a folder of the Hub cache
        ("outputs/smoke/smoke-model", None),
    ],
)
def test_hub_model_id(name, expected):
    assert modelcard.hub_model_id(name) == expected


@pytest.mark.parametrize(
    "base_card",
    [
        "---\nlicense: {evil: 1}\ntags: [evil]\n---\n",  # not a licence id
        "---\nlicense: 'apache-2.0\n\ntags: [evil]'\n---\n",  # a licence with a line break: markup, refused
        "---\na: &x [1, 2]\nb: [*x, *x, *x]\nlicense: ../../etc\n---\n",  # an alias and a path
        "---\n" + "[" * 5000 + "\n---\n",  # nesting past YAML's reader
        "no front matter at all",
    ],
)
def test_a_hostile_base_card_changes_nothing_in_ours(tmp_path, base_card):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text(base_card)
    card = render({**SETTINGS, "MODEL_NAME": str(base)})
    meta = front_matter(card)
    assert meta["license"] == "other" and meta["tags"] == modelcard.TAGS  # ours, whatever the base's card says


def test_write_card_replaces_trls_card_and_reads_the_runs_metrics(tmp_path):
    (tmp_path / "README.md").write_text("This model is a fine-tuned version of [None](https://huggingface.co/None).")
    (tmp_path / "eval_test_after.json").write_text(json.dumps(AFTER))
    before, after = modelcard.read_metrics(tmp_path)
    assert (before, after) == (None, AFTER)  # EVAL_BEFORE was 0 in this run
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: mit\n---\n")
    path = modelcard.write_card(tmp_path, {**SETTINGS, "MODEL_NAME": str(base)}, metrics_after=after, steps=7)
    card = path.read_text()
    assert path == tmp_path / "README.md" and "[None]" not in card
    # the base model's licence, read from its own card (a plain licence id, nothing else of it)
    assert front_matter(card)["license"] == "mit" and "`mit`" in card
    assert card.startswith("---\n") and f"# {modelcard.escape(tmp_path.name)}\n" in card
    assert "| strict accuracy (`#### N` equals the gold answer) | not measured | 87.5% |" in card


@pytest.mark.parametrize(
    "model, expected",
    [
        ("Qwen/Qwen3-8B", "https://huggingface.co/Qwen/Qwen3-8B, states them"),  # a Hub base: its own page
        ("outputs/smoke/smoke-model", "the local folder `outputs/smoke/smoke-model`, so this card cannot link"),
    ],
)
def test_licence_section_points_at_the_base_models_page(model, expected):
    assert expected in render({**SETTINGS, "MODEL_NAME": model})


NINE = ", ".join(["*{}"] * 9)  # each level refers to the one before nine times
ALIAS_BOMB = "---\na: &a [x, x, x, x, x, x, x, x, x]\n"
ALIAS_BOMB += "".join(f"{c}: &{c} [{NINE.format(*[p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True))
ALIAS_BOMB += "---\n# a base model whose card would expand to 9**9 items\n"


def test_a_base_model_in_a_hub_cache_layout_with_a_hostile_card_is_named_by_its_hub_id(tmp_path):
    """A local MODEL_NAME laid out as the Hub cache (models--org--name/snapshots/<hash>) whose README.md front matter
    is an alias bomb: the card step names the Hub id and never parses the base model's card, so it cannot hang."""
    base = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    base.mkdir(parents=True)
    (base / "README.md").write_text(ALIAS_BOMB, encoding="utf-8")
    (base / "config.json").write_text('{"model_type": "qwen3"}', encoding="utf-8")
    out = tmp_path / "run"
    out.mkdir()
    start = time.process_time()  # CPU time: expanding the bomb costs seconds of it (4.9 s in huggingface_hub)
    path = modelcard.write_card(out, {**SETTINGS, "MODEL_NAME": str(base)}, steps=4)
    assert time.process_time() - start < 2
    meta = front_matter(path.read_text(encoding="utf-8"))
    assert meta["base_model"] == "org/tiny"
    assert (base / "README.md").read_text(encoding="utf-8") == ALIAS_BOMB  # the base's files untouched
