"""What a training micro-batch of SmolLM2-135M-Instruct costs in memory on the CPU: the peak RSS of one forward and
backward pass through the LoRA-wrapped model (fp32, all-linear r 16, no activation checkpointing, as `--real`
trains it) at growing micro-batches, the activations kept for the backward pass being what grows.

    python bench/real_memory.py                  # micro-batches 1, 4, 8 of 124 tokens; ~30 CPU-seconds
    python bench/real_memory.py --tokens 164 --batches 1,16

The peak (ru_maxrss) only rises, so each micro-batch is larger than the one before: the rise between two of them
is what the extra sequences hold. The loss is a stand-in (the mean square of the last hidden states), so the LM
head's logits are left out, as TRL's tiled log-prob head keeps them small.
"""

import argparse
import json
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=124, help="tokens per sequence (prompt + completion)")
    parser.add_argument("--batches", default="1,4,8", help="micro-batch sizes, rising")
    args = parser.parse_args(argv)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, str(ROOT))
    from demo import real

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(ROOT / real.MODEL, dtype=torch.float32)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    model = get_peft_model(model, lora).train()
    backbone = model.base_model.model.model
    previous = None
    for batch in map(int, args.batches.split(",")):
        ids = torch.randint(0, model.config.vocab_size, (batch, args.tokens))
        start = time.process_time()
        backbone(input_ids=ids).last_hidden_state.pow(2).mean().backward()
        model.zero_grad(set_to_none=True)
        row = {"batch": batch, "tokens": args.tokens, "peak_mib": round(peak_mib())}
        row["cpu_s"] = round(time.process_time() - start, 1)
        if previous:  # the activations of the extra sequences, per token
            extra = (batch - previous[0]) * args.tokens
            row["mib_per_token"] = round((row["peak_mib"] - previous[1]) / extra, 2)
        previous = (batch, row["peak_mib"])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
