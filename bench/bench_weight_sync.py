"""The vLLM weight sync with LoRA: how far TRL's in-place merge moves the frozen bf16 base, against ours (out of place,
grpo/weight_sync.py), and what each costs per sync. A CPU benchmark, in one process, no vllm needed.

    OMP_NUM_THREADS=1 python bench/bench_weight_sync.py                 # 100 syncs, ~1 min on 2 cores
    OMP_NUM_THREADS=1 python bench/bench_weight_sync.py --syncs 300 --json outputs/bench/weight_sync.json

Two copies of one random Qwen3 in bf16 (the shape below, a Qwen3-0.6B layer's width at 4 layers), each wrapped with
grpotrainer.py's own LoRA config; the adapter starts part-trained (B ~ N(0, --b-std), as after some steps; peft
starts B at zero, where nothing would move) and, between syncs, every adapter weight moves by --lr, as Adam's step
does. Each sync is TRL's real VLLMGeneration.sync_weights() in colocate mode into a stand-in engine that copies every
tensor into a buffer of its own, as vLLM's load_weights does: one copy through TRL's own walk (merge_adapter, read,
unmerge_adapter), the other through ours. The syncs alternate TRL/ours, so drift in the machine's speed hits both.

Reported: the base weights' drift after the syncs (the share of elements no longer equal to the start, the largest
change), what the engine holds at the end against the exact merge of the untouched base (base + delta in fp32, cast
once), and each walk's CPU time per sync (the median), split into user time (the arithmetic) and system time (page
faults: memory newly touched, so memory that grows from sync to sync shows there first), with the ratios ours / TRL.
"""

import argparse
import json
import resource
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent  # the checkout: grpotrainer.py, grpo/
sys.path.insert(0, str(ROOT))
SHAPE = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, vocab_size=4096, initializer_range=0.02)  # fmt: skip


def lora_model(seed):
    """The bf16 model, LoRA-wrapped as training wraps it (gpu_check.with_lora: grpotrainer.py's LORA_* defaults)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from bench.gpu_check import with_lora

    torch.manual_seed(seed)
    return with_lora(Qwen3ForCausalLM(Qwen3Config(**SHAPE)).to(torch.bfloat16))


def adapter(model):
    """The adapter's weights, (name, parameter)."""
    return [(name, p) for name, p in model.named_parameters() if "lora_" in name]


def base(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


def exact_merge(model, start):
    """What vLLM should hold, by name: the untouched base `start` + the current delta, in fp32, cast once."""
    expected = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            a, b = module.lora_A["default"].weight.float(), module.lora_B["default"].weight.float()
            weight = start[name + ".base_layer.weight"]
            delta = b @ a * module.scaling["default"]
            expected[name.removeprefix("base_model.model.") + ".weight"] = (weight.float() + delta).to(weight.dtype)
    return expected


def measure(args):
    import torch

    from bench.gpu_check import colocated  # TRL's colocated VLLMGeneration, its engine a stand-in, as the GPU check's
    from grpo import weight_sync

    torch.set_num_threads(args.threads)
    trl_model, our_model = lora_model(0), lora_model(0)
    torch.manual_seed(1)
    with torch.no_grad():
        for (name, a), (_, b) in zip(adapter(trl_model), adapter(our_model), strict=True):
            if "lora_B" in name:  # part-trained
                a.normal_(std=args.b_std)
            b.copy_(a)
    start = base(our_model)
    trl_sync, our_sync = colocated(trl_model), colocated(our_model)
    weight_sync.replace_weight_walk(our_sync)
    seconds = {"trl": [], "ours": []}  # (user, system) CPU seconds per sync
    shares = {}
    for i in range(args.syncs):
        with torch.no_grad():  # the same optimiser-like step on both adapters
            for (_, a), (_, b) in zip(adapter(trl_model), adapter(our_model), strict=True):
                step = args.lr * torch.randn_like(a).sign()
                a.add_(step)
                b.add_(step)
        order = (("trl", trl_sync), ("ours", our_sync)) if i % 2 == 0 else (("ours", our_sync), ("trl", trl_sync))
        for side, generation in order:
            before = resource.getrusage(resource.RUSAGE_SELF)
            generation.sync_weights()
            after = resource.getrusage(resource.RUSAGE_SELF)
            seconds[side].append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime))
        if i + 1 in (1, 10, args.syncs):
            shares[i + 1] = {side: drift(m, start)[0] for side, m in (("trl", trl_model), ("ours", our_model))}
    result = {"syncs": args.syncs, "lr": args.lr, "b_std": args.b_std, "threads": args.threads, "shape": SHAPE}
    for side, model, generation in (("trl", trl_model, trl_sync), ("ours", our_model, our_sync)):
        share, largest = drift(model, start)
        expected = exact_merge(model, start)
        held = generation.llm.weights
        off = sum((held[n] != t).sum().item() for n, t in expected.items()) / sum(t.numel() for t in expected.values())
        worst = max((held[n].float() - t.float()).abs().max().item() for n, t in expected.items())
        result[side] = {
            "base_changed_share": share,
            "base_max_abs_drift": largest,
            "changed_share_after": {str(k): v[side] for k, v in shares.items()},
            "engine_off_exact_merge_share": off,  # adapted weights vLLM holds that differ from the exact merge
            "engine_max_abs_off": worst,
            "cpu_seconds_per_sync": statistics.median(user + system for user, system in seconds[side]),
            "user_seconds_per_sync": statistics.median(user for user, _ in seconds[side]),
            "system_seconds_per_sync": statistics.median(system for _, system in seconds[side]),
        }
    for kind in ("cpu", "user"):
        result[f"{kind}_ratio_ours_over_trl"] = (
            result["ours"][f"{kind}_seconds_per_sync"] / result["trl"][f"{kind}_seconds_per_sync"]
        )
    result["params"] = sum(p.numel() for p in start.values())
    return result


def drift(model, start):
    """(share of base elements no longer equal to `start`, the largest absolute change)."""
    now = base(model)
    changed = sum((now[n] != start[n]).sum().item() for n in start)
    largest = max((now[n].float() - start[n].float()).abs().max().item() for n in start)
    return changed / sum(t.numel() for t in start.values()), largest


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--syncs", type=int, default=100, help="syncs per walk (default 100)")
    p.add_argument("--lr", type=float, default=5e-6, help="each adapter weight's move between syncs (LEARNING_RATE)")
    p.add_argument("--b-std", type=float, default=1e-3, help="std of the part-trained lora_B (default 1e-3)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier on a shared box)")
    p.add_argument("--json", type=Path, help="also write the results here")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    result = measure(args)
    for side in ("trl", "ours"):
        r = result[side]
        print(
            f"{side:>4}: base changed {r['base_changed_share']:.2%} (max |drift| {r['base_max_abs_drift']:.3g}); "
            f"engine off the exact merge {r['engine_off_exact_merge_share']:.2%} (max {r['engine_max_abs_off']:.3g}); "
            f"{r['cpu_seconds_per_sync'] * 1e3:.0f} CPU ms per sync ({r['user_seconds_per_sync'] * 1e3:.0f} user, "
            f"{r['system_seconds_per_sync'] * 1e3:.0f} system)"
        )
    ratios = f"{result['cpu_ratio_ours_over_trl']:.2f} (user time alone {result['user_ratio_ours_over_trl']:.2f})"
    print(f"ours / TRL CPU time per sync: {ratios}; {result['params']:,} base parameters")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
