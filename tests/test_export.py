"""export.py: a trained adapter merged into a standalone folder that plain transformers loads and that generates
exactly what base plus adapter generates, or the adapter alone; the card and record it writes (never a credential);
and the cases it refuses, before writing anything.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_export.py -q -m "not slow"   # the tiny model at most
    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_export.py -q -m slow         # one smoke run, exported

The slow tests export conftest's `trained_run`, a smoke run shared with test_evaluate.py whose reward differs between
completions (the smoke model's rewards are otherwise all 0, so GRPO's advantages, and the adapter, would stay exactly
zero and "merged equals base plus adapter" would hold trivially); the tests check that the adapter moved the logits.
"""

import json
import os
import re
import socket
import struct
import subprocess
from pathlib import Path

import pytest
from conftest import REPO, run_in_process, run_script

import export
from grpo import cli, files
from grpo.errors import ConfigError

TOKEN = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7"  # shaped like a Hugging Face access token; no real one


# ---------------------------------------------------------------------------------------------------------------
# fast: the decisions export.py makes from a run's records


def adapter_folder(path, base="/models/Qwen3-8B", run_settings=None, name="run"):
    """A fake run folder: adapter_config.json (and run_settings.json), and a whole safetensors file holding no
    tensors (8-byte header length, then the header {}): enough for resolve()."""
    folder = path / name
    folder.mkdir(parents=True)
    config = {"base_model_name_or_path": base, "r": 8, "lora_alpha": 16, "target_modules": ["v_proj", "q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    if run_settings is not None:
        (folder / "run_settings.json").write_text(json.dumps(run_settings))
    return folder


def settings_for(adapter, **overrides):
    return {**settings([]), "ADAPTER": str(adapter), **overrides}


@pytest.mark.parametrize(
    "run_settings, overrides, dtype, thinking",
    [
        ({"MODEL_NAME": "/models/Qwen3-8B", "BF16": True, "ENABLE_THINKING": False}, {}, "bfloat16", False),
        ({"MODEL_NAME": "/models/Qwen3-8B", "BF16": False, "ENABLE_THINKING": True}, {}, "float32", True),
        # an override wins over the run's record
        ({"BF16": True, "ENABLE_THINKING": False}, {"DTYPE": "float16", "ENABLE_THINKING": True}, "float16", True),
        # a thinking run exported with thinking off, given on the command line
        ({"BF16": True, "ENABLE_THINKING": True}, {"ENABLE_THINKING": False}, "bfloat16", False),
        # no run_settings.json (an older run) and no base config.json to read: fp32, thinking off
        (None, {}, "float32", False),
    ],
)
def test_resolve_reads_the_run(tmp_path, run_settings, overrides, dtype, thinking):
    folder = adapter_folder(tmp_path, run_settings=run_settings)
    c = settings_for(folder, **overrides)
    run = export.resolve(c, given=frozenset(overrides))
    # the base model comes from run_settings.json, else adapter_config.json: both say /models/Qwen3-8B here
    assert (c["MODEL_NAME"], c["DTYPE"], c["ENABLE_THINKING"]) == ("/models/Qwen3-8B", dtype, thinking)
    assert c["OUTPUT_DIR"] == str(folder.resolve()) + "-merged"
    assert run["ENABLE_THINKING"] is thinking  # the card shows the thinking default the folder really has


def test_resolve_without_run_settings_takes_lora_from_the_adapter(tmp_path):
    run = export.resolve(settings_for(adapter_folder(tmp_path)))
    # what adapter_config.json records, so the card of an older run still shows its LoRA settings
    assert {k: run[k] for k in ("LORA_R", "LORA_ALPHA", "LORA_TARGET_MODULES")} == {
        "LORA_R": 8,
        "LORA_ALPHA": 16,
        "LORA_TARGET_MODULES": "q_proj,v_proj",
    }


@pytest.mark.parametrize(
    "adapter, expected",
    [
        ("outputs/run", "outputs/run-merged"),
        ("outputs/run/", "outputs/run-merged"),  # a trailing slash does not give outputs/run/-merged
        ("outputs/run/checkpoint-100", "outputs/run-checkpoint-100-merged"),  # beside the run, not inside it
        ("outputs/run/checkpoint-best", "outputs/run/checkpoint-best-merged"),  # not a Trainer checkpoint name
    ],
)
def test_default_output_dir(tmp_path, adapter, expected):
    assert export.default_output_dir(tmp_path / adapter) == str((tmp_path / expected).resolve())


@pytest.mark.parametrize(
    "damage, message",
    [
        # the weights once failed inside the merge (SafetensorError) or made peft ask the Hub (HFValidationError)
        ({"adapter_model.safetensors": b"\x10"}, "ADAPTER={run}: adapter_model.safetensors is cut short or damaged ("),
        ({"adapter_model.safetensors": None}, "ADAPTER={run}: adapter_model.safetensors is missing"),
        # a JSON list where an object belongs once raised AttributeError
        ({"run_settings.json": b"[1, 2]"}, "{run}/run_settings.json holds a list, not a JSON object"),
        ({"adapter_config.json": b"[]"}, "{run}/adapter_config.json holds a list, not a JSON object"),
        # values of the wrong type, edited by hand: TypeError, AttributeError or ValueError once, in the card
        ({"run_settings.json": b'{"LORA_R": [16]}'}, "{run}/run_settings.json: LORA_R is [16], not int; correct"),
        ({"run_settings.json": b'{"dataset_sizes": "7473"}'}, '{run}/run_settings.json: dataset_sizes is "7473"'),
        ({"run_settings.json": b'{"REWARD_FUNCS": 5}'}, "{run}/run_settings.json: REWARD_FUNCS is 5, not list[str]"),
        ({"run_settings.json": b'{"BF16": "no"}'}, '{run}/run_settings.json: BF16 is "no", not bool'),
        (
            {"adapter_config.json": b'{"r": "8", "base_model_name_or_path": "/m/Qwen3-8B"}'},
            'ADAPTER={run}: adapter_config.json: r is "8", not int',
        ),
        (
            {"adapter_config.json": b'{"base_model_name_or_path": 5}'},
            "ADAPTER={run}: adapter_config.json: base_model_name_or_path is 5",
        ),
        ({"trainer_state.json": b'{"global_step": "4"}'}, '{run}/trainer_state.json: global_step is "4", not int'),
    ],
)
def test_resolve_refuses_a_damaged_run_before_any_work(tmp_path, damage, message):
    folder = adapter_folder(tmp_path, run_settings={"BF16": False})
    for name, data in damage.items():
        (folder / name).unlink() if data is None else (folder / name).write_bytes(data)
    with pytest.raises(ConfigError) as err:
        export.resolve(settings_for(folder))
    assert str(err.value).startswith(message.format(run=folder))


@pytest.mark.parametrize(
    "text, message",
    [
        ('{"strict_accuracy": "high"}', 'eval_test_after.json: strict_accuracy is "high", not float'),
        ('{"n": 1.5}', "eval_test_after.json: n is 1.5, not int"),
        ("[0.5]", "eval_test_after.json holds a list, not a JSON object"),
        ('{"n": ', "eval_test_after.json cannot be read (Expecting value"),
    ],
)
def test_an_eval_record_edited_by_hand_is_named_before_any_work(tmp_path, text, message, capsys):
    # the card's metrics once failed in format() (ValueError) or json.loads, after the whole merge
    folder = adapter_folder(tmp_path, run_settings={"BF16": False})
    (folder / "eval_test_after.json").write_text(text)
    code, err = run_in_process(export.main, f"--ADAPTER={folder}", capsys=capsys)
    assert code == 2 and f"error: {folder}/{message}" in err
    assert not os.path.exists(str(folder.resolve()) + "-merged")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"ADAPTER": ""}, "give the adapter to merge"),
        ({"MODEL_NAME": "/models/Llama-3-8B"}, "was trained on /models/Qwen3-8B, but MODEL_NAME is"),
        ({"DTYPE": "fp8"}, "DTYPE is 'fp8'"),
    ],
)
def test_resolve_refuses(tmp_path, overrides, message):
    c = {**settings_for(adapter_folder(tmp_path)), **overrides}
    with pytest.raises(ConfigError, match=message):
        export.resolve(c)


def test_resolve_accepts_a_local_copy_of_the_hub_base(tmp_path):
    # the adapter says Qwen/Qwen3-8B; the same model in a local folder of that name is the same base
    c = settings_for(adapter_folder(tmp_path, base="Qwen/Qwen3-8B"), MODEL_NAME="/data/Qwen3-8B")
    export.resolve(c)
    assert c["MODEL_NAME"] == "/data/Qwen3-8B"


def test_missing_adapter_names_the_newest_checkpoint(tmp_path):
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "adapter_config.json").write_text("{}")
    # a run killed before its final save: the message points at what can be merged instead
    with pytest.raises(ConfigError, match="holds no LoRA adapter .* newest checkpoint there is .*checkpoint-4"):
        export.resolve(settings_for(tmp_path))


def test_an_adapter_older_than_a_checkpoint_beside_it_is_merged_with_a_warning(tmp_path, caplog):
    # a finished run (step 4) continued and SIGKILLed after checkpoint-6: the final adapter is still step 4's
    folder = adapter_folder(tmp_path)
    (folder / files.STEP_FILE).write_text(json.dumps({"global_step": 4}))
    (folder / "checkpoint-6").mkdir()
    (folder / "checkpoint-6" / "adapter_config.json").write_text("{}")
    with caplog.at_level("WARNING", logger="grpotrainer.export"):
        export.resolve(c := settings_for(folder))
    assert c["STEP"] == 4  # the step of what is merged, never the checkpoint's
    assert "holds the adapter of step 4, but checkpoint-6 there is newer" in caplog.text


MARKED = {export.marker: json.dumps({"files": [export.marker, "model.safetensors"]}), "model.safetensors": ""}


@pytest.mark.parametrize(
    "files, refused",
    [
        ({}, None),  # an empty folder
        (MARKED, None),  # an earlier export holding only what it wrote: replaced
        ({"notes.txt": "mine"}, "already holds files that export.py did not write; it will not overwrite them"),
        # a file added to an earlier export was deleted with it when the folder was replaced
        ({**MARKED, "notes.txt": "mine"}, "holds notes.txt, which the earlier export there did not write"),
        # an export whose marker lists no files (before the list existed): what was added cannot be told apart
        ({export.marker: "{}", "model.safetensors": ""}, "does not list its files"),
    ],
)
def test_check_output_dir(tmp_path, files, refused):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    if refused:
        with pytest.raises(ConfigError, match=refused):
            export.refuse_foreign_output_dir(tmp_path)
    else:
        export.refuse_foreign_output_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)  # checking touches nothing


@pytest.mark.parametrize(
    "where, message",
    [
        ("file", "OUTPUT_DIR={tmp}/file is a file; give a folder path."),
        ("file/sub", "OUTPUT_DIR={tmp}/file/sub: {tmp}/file is a file, not a folder"),
        ("/proc/grpotrainer-export", "OUTPUT_DIR=/proc/grpotrainer-export cannot be created or written"),  # even root
    ],
)
def test_an_output_dir_that_cannot_be_written_is_refused(tmp_path, where, message):
    # these once failed after the merge, with a traceback
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=re.escape(message.format(tmp=tmp_path))):
        export.refuse_foreign_output_dir(tmp_path / where)


class FakeSaver:
    """Stands in for a model or tokenizer: save_pretrained writes the named files."""

    def __init__(self, *names):
        self.names = names

    def save_pretrained(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        for name in self.names:
            (folder / name).write_text(name)


def test_an_export_lists_its_files_and_a_reexport_keeps_what_a_user_added(tmp_path):
    out = tmp_path / "merged"
    model, tokenizer = FakeSaver("model.safetensors", "config.json"), FakeSaver("tokenizer.json")
    export.write_folder(out, model, tokenizer, {"step": 4}, later=[export.card])
    (out / export.card).write_text("card")  # main() writes the card after the folder is in place
    # every name in the folder, the card included, and nothing else
    record = json.loads((out / export.marker).read_text())
    assert record == {"step": 4, "files": sorted([*(p.name for p in out.iterdir())])}
    assert record["files"] == ["README.md", "config.json", export.marker, "model.safetensors", "tokenizer.json"]
    export.refuse_foreign_output_dir(out)  # its own export may be replaced
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds notes.txt, which the earlier export there did not write"):
        export.refuse_foreign_output_dir(out)


def test_an_unwritable_output_dir_exits_2_before_the_merge(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    adapter = adapter_folder(tmp_path)  # no base model anywhere: a merge attempt would fail differently
    args = [f"--ADAPTER={adapter}", f"--OUTPUT_DIR={tmp_path / 'file' / 'sub'}"]
    code, err = run_in_process(export.main, *args, capsys=capsys)
    assert code == 2 and f"error: OUTPUT_DIR={tmp_path / 'file' / 'sub'}: {tmp_path / 'file'} is a file" in err


@pytest.mark.parametrize("thinking", [False, True])
@pytest.mark.parametrize("kwarg", [None, False, True])
def test_template_default_is_the_runs_and_an_explicit_value_wins(thinking, kwarg):
    from jinja2 import Template

    template = export.with_thinking_default("{{ 'off' if enable_thinking is false else 'on' }}", thinking)
    rendered = Template(template).render(**({} if kwarg is None else {"enable_thinking": kwarg}))
    expected = thinking if kwarg is None else kwarg
    assert rendered == ("on" if expected else "off")


def test_template_default_replaces_an_earlier_one_and_leaves_a_template_without_thinking():
    from jinja2 import Template

    template = export.with_thinking_default("{{ enable_thinking }}", False)
    assert template == export.with_thinking_default(export.with_thinking_default("{{ enable_thinking }}", True), False)
    assert (Template(template).render(), Template(template).render(enable_thinking=True)) == ("False", "True")
    assert export.with_thinking_default("{{ messages }}", False) == "{{ messages }}"


@pytest.mark.parametrize(
    "offline, token, message",
    [
        (False, "", "needs a Hugging Face token with write access"),
        (True, "hf_not_a_real_token", "needs the Hub, but HF_HUB_OFFLINE is set"),
    ],
)
def test_push_is_refused_before_any_work(tmp_path, monkeypatch, offline, token, message, capsys):
    # no adapter at all: the push check must come first, so the message is about the push, and nothing is written
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", offline)
    monkeypatch.setenv("HF_HUB_OFFLINE", str(int(offline)))
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))  # no stored login of this machine
    args = [f"--ADAPTER={tmp_path / 'missing'}", f"--OUTPUT_DIR={tmp_path / 'out'}", "--PUSH_TO_HUB=someone/gsm8k"]
    code, err = run_in_process(export.main, *args, capsys=capsys)
    assert code == 2 and f"error: PUSH_TO_HUB=someone/gsm8k {message}" in err
    assert not (tmp_path / "out").exists()


def test_push_refuses_a_malformed_repo_id():
    with pytest.raises(ConfigError, match="is not a Hub repo id"):
        export.refuse_bad_push("a/b/c")


# ---------------------------------------------------------------------------------------------------------------
# ADAPTER_ONLY: the adapter itself, as TRL users share one


@pytest.fixture
def lora_run(tmp_path, tiny_model):
    """A run folder as training leaves it, on the tiny model kept where the Hub cache would keep someone/tiny (so
    the card can name its Hub id): a LoRA adapter with random B weights (peft's init_lora_weights=False; zero B
    would leave the model unchanged), the run's tokenizer and its run_settings.json."""
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = tmp_path / "hub" / "models--someone--tiny" / "snapshots" / "abc123"
    shutil.copytree(tiny_model, base)
    torch.manual_seed(0)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), lora)
    run = tmp_path / "run"
    model.save_pretrained(run)
    AutoTokenizer.from_pretrained(base).save_pretrained(run)
    files.write_settings(run, {"MODEL_NAME": str(base), "BF16": False, "ENABLE_THINKING": False})
    return run


def greedy_tokens(model, tokenizer):
    import torch

    prompts = [[{"role": "user", "content": q}] for q in ("Mia has 12 pencils and buys 7 more.", "What is 6 * 8?")]
    inputs = tokenizer.apply_chat_template(
        prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=16, do_sample=False).tolist()


def test_adapter_only_writes_what_peft_loads_and_it_generates_as_the_runs_adapter(lora_run):
    from huggingface_hub import metadata_load
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = export.main([f"--ADAPTER={lora_run}", "--ADAPTER_ONLY=true"])
    assert str(out) == str(lora_run.resolve()) + "-adapter"  # beside the run, like the merged folder
    names = {p.name for p in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md", "chat_template.jinja"} <= names
    assert "model.safetensors" not in names  # nothing merged
    meta = metadata_load(out / "README.md")
    assert (meta["library_name"], meta["base_model"]) == ("peft", "someone/tiny")
    base_path = json.loads((lora_run / "run_settings.json").read_text())["MODEL_NAME"]
    tokenizer = AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(base_path).eval()
    base_tokens = greedy_tokens(base, tokenizer)
    shared = greedy_tokens(PeftModel.from_pretrained(base, out).eval(), tokenizer)
    again = AutoModelForCausalLM.from_pretrained(base_path)
    runs = greedy_tokens(PeftModel.from_pretrained(again, lora_run).eval(), tokenizer)
    assert shared == runs  # the shared folder is the run's adapter
    assert shared != base_tokens  # and the adapter changes what the model writes: the comparison above could fail
    # the template defaults to the run's thinking mode, as the run's own tokenizer rendered it for training
    prompt = [{"role": "user", "content": "hi"}]
    run_tokenizer = AutoTokenizer.from_pretrained(lora_run)
    rendered = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert rendered == run_tokenizer.apply_chat_template(
        prompt, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    # the record lists every file, so a re-export may replace the folder
    assert json.loads((out / export.marker).read_text())["files"] == sorted(names)


def test_adapter_only_pushes_the_adapter_folder(lora_run, tmp_path, monkeypatch):
    # stand-ins for the Hub: the push must create the repo and upload the folder as written, card included
    import huggingface_hub

    calls = []
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "create_repo", lambda repo_id, **kw: calls.append(("create", repo_id, kw)))

    def upload_folder(repo_id, folder_path, commit_message):
        calls.append(("upload", repo_id, sorted(p.name for p in Path(folder_path).iterdir())))

    monkeypatch.setattr(huggingface_hub, "upload_folder", upload_folder)
    out = tmp_path / "shared"
    export.main([f"--ADAPTER={lora_run}", "--ADAPTER_ONLY=true", f"--OUTPUT_DIR={out}", "--PUSH_TO_HUB=you/tiny"])
    assert calls[0] == ("create", "you/tiny", {"private": True, "exist_ok": True})
    assert calls[1] == ("upload", "you/tiny", sorted(p.name for p in out.iterdir()))
    assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(calls[1][2])
    assert "PeftModel.from_pretrained" in (out / "README.md").read_text()  # the card loads it from the repo
    assert '"you/tiny"' in (out / "README.md").read_text()


@pytest.mark.parametrize("only", [True, False])
def test_an_export_holds_no_credential_of_the_runs_record(lora_run, tmp_path, only):
    # a run_settings.json from before runs redacted theirs: a token in the command line's GRPOConfig fields and in
    # the prompt; the export's card and its record (export_settings.json, which a push uploads too) hold neither
    record = json.loads((lora_run / "run_settings.json").read_text())
    record |= {"SYSTEM_PROMPT": f"Solve it. {TOKEN}", "grpo_config": {"model_init_kwargs": {"token": TOKEN}}}
    (lora_run / "run_settings.json").write_text(json.dumps(record))
    out = export.main([f"--ADAPTER={lora_run}", f"--ADAPTER_ONLY={only}", f"--OUTPUT_DIR={tmp_path / 'out'}"])
    assert not [p.name for p in out.iterdir() if TOKEN.encode() in p.read_bytes()]
    kept = json.loads((out / export.marker).read_text())["run_settings"]  # the record, redacted, not dropped
    assert (kept["SYSTEM_PROMPT"], kept["grpo_config"]) == (
        "Solve it. <redacted>",
        {"model_init_kwargs": {"token": "<redacted>"}},
    )
    assert "Solve it. <redacted>" in (out / "README.md").read_text()


@pytest.mark.parametrize("only", [True, False])
def test_a_full_disk_is_one_message_and_leaves_no_partial_folder(lora_run, full_disk, only, capsys):
    # a real full filesystem (tmpfs): the adapter's copy or the merged weights' save once ended in a traceback
    out = full_disk / "export"
    args = [f"--ADAPTER={lora_run}", f"--ADAPTER_ONLY={only}", f"--OUTPUT_DIR={out}"]
    code, err = run_in_process(export.main, *args, capsys=capsys)
    assert code == 2
    assert f"error: No space left on device while writing to OUTPUT_DIR {out} (" in err
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]  # publish_dir removed its partial folder


# ---------------------------------------------------------------------------------------------------------------
# slow: a real smoke run, exported


@pytest.fixture(scope="module")
def exported(trained_run, tmp_path_factory):
    """export.py run as a user runs it, on the smoke run: (its output folder, the finished process)."""
    out_dir = tmp_path_factory.mktemp("export") / "merged"
    out = run_script("export.py", f"--ADAPTER={trained_run}", f"--OUTPUT_DIR={out_dir}")
    assert out.returncode == 0, out.stderr[-3000:]
    return out_dir, out


def load_pair(trained_run, out_dir):
    """(the exported model through plain transformers, the base model with the adapter through peft), fp32."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32).eval()
    base = AutoModelForCausalLM.from_pretrained(trained_run / "smoke-model", dtype=torch.float32)
    return merged, PeftModel.from_pretrained(base, trained_run).eval()


@pytest.mark.slow
def test_export_writes_a_standalone_folder(exported):
    out_dir, _ = exported
    names = {p.name for p in out_dir.iterdir()}
    # weights, config, generation config, tokenizer with its template, card, and the record of what was merged
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                 "chat_template.jinja", "README.md", export.marker):  # fmt: skip
        assert name in names
    assert not {n for n in names if n.startswith("adapter_")}  # no adapter_config.json, adapter_model.*
    assert json.loads((out_dir / "config.json").read_text())["dtype"] == "float32"  # the smoke run's BF16=False
    record = json.loads((out_dir / export.marker).read_text())
    assert (record["step"], record["DTYPE"], record["ENABLE_THINKING"]) == (4, "float32", False)


@pytest.mark.slow
def test_plain_transformers_generates_exactly_what_base_plus_adapter_generates(trained_run, exported):
    import torch
    from transformers import AutoTokenizer

    merged, peft_model = load_pair(trained_run, exported[0])
    assert type(merged).__name__ == "Qwen3ForCausalLM"
    assert not [name for name, _ in merged.named_modules() if "lora" in name]  # no peft layers left
    tokenizer = AutoTokenizer.from_pretrained(exported[0])
    prompts = [[{"role": "user", "content": q}] for q in ("Mia has 12 pencils and buys 7 more.", "What is 6 * 8?")]
    inputs = tokenizer.apply_chat_template(
        prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        logits, peft_logits = merged(**inputs).logits, peft_model(**inputs).logits
        with peft_model.disable_adapter():
            base_logits = peft_model(**inputs).logits
        greedy = {"max_new_tokens": 24, "do_sample": False}
        tokens, peft_tokens = merged.generate(**inputs, **greedy), peft_model.generate(**inputs, **greedy)
        with peft_model.disable_adapter():
            base_tokens = peft_model.generate(**inputs, **greedy)
    # the adapter changed the model (else the comparison below would prove nothing) ...
    assert (logits - base_logits).abs().max() > 1e-2  # measured ~6 nats after 4 steps at LEARNING_RATE=0.05
    assert tokens.tolist() != base_tokens.tolist()
    # ... and the merged weights compute what base + adapter computes, to fp32 rounding, token for token
    assert torch.allclose(logits, peft_logits, atol=1e-4)
    assert tokens.tolist() == peft_tokens.tolist()


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs, suffix",
    [
        ({}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),  # the run's default (thinking off), no kwarg needed
        ({"enable_thinking": False}, "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        ({"enable_thinking": True}, "<|im_start|>assistant\n"),  # an explicit choice still wins
    ],
)
def test_exported_template_defaults_to_the_runs_thinking(exported, kwargs, suffix):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(exported[0])
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True, **kwargs
    )
    assert text.endswith("hi<|im_end|>\n" + suffix)


@pytest.mark.slow
def test_exported_card(trained_run, exported):
    from huggingface_hub import metadata_load

    card = (exported[0] / "README.md").read_text()
    meta = metadata_load(exported[0] / "README.md")
    after = json.loads((trained_run / "eval_test_after.json").read_text())
    assert meta["library_name"] == "transformers"
    assert "correctness_reward" in card and "length_reward" in card and "GSM8K" in card
    assert str(trained_run / "smoke-model") in card  # the base model, by the path the run used
    assert f"| test problems scored | {after['n']} | {after['n']} |" in card
    assert "| steps trained | `4` |" in card
    assert "| learning rate | `0.05` |" in card  # the run's own setting (given on its command line), from its record


@pytest.mark.slow
def test_reexport_replaces_an_earlier_export_whole(trained_run, exported, tmp_path):
    import shutil

    out_dir = tmp_path / "again"
    shutil.copytree(exported[0], out_dir)
    (out_dir / "model-00002-of-00002.safetensors").write_text("stale shard of an earlier export")
    record = json.loads((out_dir / export.marker).read_text())  # as if the earlier export had written the shard
    record["files"].append("model-00002-of-00002.safetensors")
    (out_dir / export.marker).write_text(json.dumps(record))
    export.main([f"--ADAPTER={trained_run}", f"--OUTPUT_DIR={out_dir}", "--DTYPE=bfloat16"])
    assert "model-00002-of-00002.safetensors" not in os.listdir(out_dir)  # replaced whole, not file by file
    assert json.loads((out_dir / "config.json").read_text())["dtype"] == "bfloat16"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no partial or old folder left behind


@pytest.mark.slow
def test_a_base_model_of_other_shapes_is_refused(trained_run, tmp_path, capsys):
    from transformers import AutoTokenizer

    from demo import smoke

    # same folder name as the run's base (so the name check passes), but wider layers: only the shapes differ
    other = tmp_path / "smoke-model"
    tokenizer = AutoTokenizer.from_pretrained(trained_run / "smoke-model")
    smoke.build_model(tokenizer, hidden_size=48).save_pretrained(other)
    tokenizer.save_pretrained(other)
    args = [f"--ADAPTER={trained_run}", f"--MODEL_NAME={other}", f"--OUTPUT_DIR={tmp_path / 'o'}"]
    code, err = run_in_process(export.main, *args, capsys=capsys)
    assert code == 2 and "does not fit MODEL_NAME" in err and ", 48])" in err  # peft names the base's hidden size 48
    assert not (tmp_path / "o").exists()


def test_missing_adapter_exits_2_and_writes_nothing(tmp_path, capsys):
    code, err = run_in_process(export.main, f"--ADAPTER={tmp_path}", capsys=capsys)
    assert code == 2 and f"error: ADAPTER={str(tmp_path)!r} holds no LoRA adapter" in err
    assert not os.path.exists(str(tmp_path) + "-merged")


def test_a_python_without_torch_gets_the_command_that_fixes_it(bare_python, tmp_path):
    adapter = adapter_folder(tmp_path)  # an adapter that passes every check, so only torch is missing
    for args in ([], [f"--ADAPTER={adapter}"]):
        out = subprocess.run([*bare_python, "export.py", *args], cwd=REPO, capture_output=True, text=True)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"this Python ({bare_python[0]}) lacks torch" in out.stderr and "make install" in out.stderr
    assert not os.path.exists(str(adapter) + "-merged")


def test_enable_thinking_is_a_boolean_on_the_command_line():
    # a real boolean: "given or not" is what the command line says, as in evaluate.py; a word that is none is refused
    assert settings(["--ENABLE_THINKING=true"])["ENABLE_THINKING"] is True
    with pytest.raises(ConfigError, match="--ENABLE_THINKING=maybe is not a valid bool"):
        settings(["--ENABLE_THINKING=maybe"])


class Interrupt:
    """A saver that is Ctrl-C'd while writing (KeyboardInterrupt)."""

    def save_pretrained(self, folder):
        (folder / "model.safetensors").write_text("half")
        raise KeyboardInterrupt


def test_an_interrupted_export_keeps_the_earlier_one_and_leaves_nothing(tmp_path):

    out = tmp_path / "merged"
    export.write_folder(out, FakeSaver("model.safetensors"), FakeSaver("tokenizer.json"), {"step": 2})
    with pytest.raises(KeyboardInterrupt):
        export.write_folder(out, Interrupt(), FakeSaver("tokenizer.json"), {"step": 4})
    assert json.loads((out / export.marker).read_text())["step"] == 2  # the earlier export, whole
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no .partial or .old left


def test_what_a_killed_export_left_is_cleaned_up_and_its_folder_put_back(tmp_path):

    out = tmp_path / "merged"
    dead = 2**22 + 12345  # above the default pid_max of 4194304: no such process
    assert not files.pid_alive(dead)
    host = socket.gethostname()
    old = tmp_path / f".merged.old-{host}-{dead}"  # killed between its two renames: OUTPUT_DIR was missing
    old.mkdir()
    (old / "model.safetensors").write_text("earlier export")
    partial = tmp_path / f".merged.partial-{host}-{dead}"
    partial.mkdir()
    (partial / "model.safetensors").write_text("half a model")
    with files.publish_dir(out, replace=True):
        assert (out / "model.safetensors").read_text() == "earlier export"  # put back before anything else
        assert not partial.exists()
    live = tmp_path / f".merged.partial-{host}-{os.getpid()}-other"  # not ours to judge: not of this pattern
    live.mkdir()
    export.write_folder(out, FakeSaver("model.safetensors"), FakeSaver("tokenizer.json"), {"step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["merged", live.name])


def settings(argv):
    """export.py's constants with `argv`'s overrides, as main() reads them."""
    return dict(cli.parse(cli.constants(export), list(argv)).settings)


def test_export_refuses_its_internal_table_names_as_settings(capsys):
    code, err = run_in_process(export.main, "--MARKER=notes.txt", capsys=capsys)
    assert code == 2
    assert err.strip().startswith("error: unknown setting --MARKER.") and len(err.strip().splitlines()) == 1
