"""Two processes on CPU: the --smoke pipeline under torchrun (gloo), the batch rule counting processes, and the
held-out evaluation's shards, of a DDP run and of a model FSDP2 shards. accelerate 1.15 enables FSDP and DeepSpeed
only on accelerators (AcceleratorState: MULTI_GPU-like types, DeepSpeed `not cpu`): on the CPU the FSDP2 test shards
the model with torch's fully_shard, as accelerate would, and ZeRO cannot run here.

    pytest tests/test_distributed.py -m "not slow"    # seconds: the accelerate configs, the batch rule in-process
    pytest tests/test_distributed.py                  # + the torchrun and accelerate launches, ~5 min on 2 cores

`torchrun` sets RANK/WORLD_SIZE/LOCAL_RANK; with `use_cpu` (as --smoke sets it) accelerate then picks MULTI_CPU and
the gloo backend, and the Trainer wraps the model in DistributedDataParallel. `accelerate launch --cpu
--num_processes 2` is not an alternative: without mpirun it silently starts one process (README, Launch recipes).
"""

import json

import pytest
from conftest import REPO, event_dirs, read_scalars, run_in_process, run_script, train

TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]  # = torchrun, in this venv


def torchrun(tmp_path, *overrides):
    """Run `torchrun --standalone --nproc_per_node 2 grpotrainer.py --smoke` into tmp_path; return the result.
    --standalone picks a free port, so parallel test runs do not collide on torchrun's default 29500."""
    return train(tmp_path, *overrides, launcher=TORCHRUN, timeout=600)


@pytest.mark.slow
def test_two_process_smoke_trains_on_both_ranks(tmp_path):
    result = torchrun(tmp_path, "--EVAL_STEPS=1", "--EVAL_SUBSET=8")
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = event_dirs(tmp_path)
    # the held-out score at every step, each rank generating its half of the 8 problems and rank 0 logging them
    assert [step for step, _ in read_scalars(run)["eval/gsm8k_strict_accuracy"]] == [1, 2, 3, 4]
    assert json.loads((tmp_path / "eval_test_during.json").read_text())["n"] == 8  # both halves gathered
    assert (tmp_path / "adapter_model.safetensors").is_file()  # rank 0 saved the LoRA adapter
    assert list((tmp_path / "runs").glob("*/events.out.tfevents.*"))  # and wrote TensorBoard events
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    # Each step generates PER_DEVICE_TRAIN_BATCH_SIZE (4) completions per process = one prompt's group of 4. With two
    # processes that is 2 of the fixture's 32 prompts per step, so 4 steps cover 8/32 = 0.25 epoch; one process
    # would reach 0.125. Exact in binary floating point, so == is safe.
    assert state["epoch"] == 0.25
    assert [h["epoch"] for h in state["log_history"] if "loss" in h] == [0.0625, 0.125, 0.1875, 0.25]


def test_batch_rule_counts_the_processes_torchrun_announces(tmp_path, monkeypatch, capsys):
    import grpotrainer

    # WORLD_SIZE as torchrun sets it for each worker; the rule reads nothing else, so this process can play one
    # (torchrun itself running the rule over two nodes: test_multinode.py's test_batch_rule_counts_both_nodes)
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = (
        "--smoke",
        f"--OUTPUT_DIR={tmp_path}",
        "--PER_DEVICE_TRAIN_BATCH_SIZE=1",
        "--GRADIENT_ACCUMULATION_STEPS=1",
    )
    code, stderr = run_in_process(grpotrainer.main, *args, capsys=capsys)
    assert code == 2 and "Traceback" not in stderr  # one message, before anything loads
    assert "= 1 x 2 x 1 = 2 completions" in stderr  # 1 completion x 2 processes x 1 step, not a multiple of 4
    assert "GRADIENT_ACCUMULATION_STEPS=2" in stderr  # the suggested fix counts both: 1 x 2 x 2 = 4
    assert not (tmp_path / "smoke-model").exists()


# Each shipped accelerate config: the distributed_type accelerate reads from it, and the fields that define it.
ACCELERATE_CONFIGS = {
    "ddp": ("MULTI_GPU", "deepspeed_config", {}),
    "zero2": ("DEEPSPEED", "deepspeed_config", {"zero_stage": 2, "zero3_init_flag": False}),
    "zero3": ("DEEPSPEED", "deepspeed_config", {"zero_stage": 3, "zero3_init_flag": True}),
    "fsdp2": ("FSDP", "fsdp_config", {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}),
}


def test_every_accelerate_config_is_checked():
    # a new YAML must be added to ACCELERATE_CONFIGS (and get its README line)
    assert sorted(p.stem for p in (REPO / "configs" / "accelerate").glob("*.yaml")) == sorted(ACCELERATE_CONFIGS)


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_accelerate_config_loads(name):
    from accelerate.commands.config.config_args import load_config_from_file

    distributed_type, section, fields = ACCELERATE_CONFIGS[name]
    config = load_config_from_file(str(REPO / "configs" / "accelerate" / f"{name}.yaml"))
    assert config.distributed_type == distributed_type  # accelerate's parser accepted the file and read its kind
    assert (config.num_processes, config.num_machines) == (8, 1)  # one 8-GPU node; --num_processes N overrides
    assert config.mixed_precision == "bf16"  # matches BF16=True in grpotrainer.py
    assert config.use_cpu is False
    assert {k: getattr(config, section)[k] for k in fields} == fields


# What every node passes besides the config: 2 nodes of 8 GPUs, this one rank 1, the first node at 10.0.0.1:29500.
MULTINODE = ["--num_machines", "2", "--num_processes", "16", "--machine_rank", "1"]
MULTINODE += ["--main_process_ip", "10.0.0.1", "--main_process_port", "29500"]


@pytest.mark.parametrize("name", ACCELERATE_CONFIGS)
def test_accelerate_config_spans_nodes(name):
    # accelerate's own launch path, from its parser to the torchrun arguments it hands each node; nothing starts.
    # _validate_launch_command and the prepare_* functions are accelerate internals: launch_command has no dry run.
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    config = f"configs/accelerate/{name}.yaml"
    args = launch_command_parser().parse_args(["--config_file", str(REPO / config), *MULTINODE, "grpotrainer.py"])
    args, defaults, _ = _validate_launch_command(args)
    if args.use_deepspeed:
        args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)  # as launch_command does
        cmd, _ = prepare_deepspeed_cmd_env(args)
        assert cmd is None  # multinode launcher "standard": torchrun on each node, not deepspeed's pdsh over ssh
    else:
        prepare_multi_gpu_env(args)
    torchrun = (args.nnodes, args.node_rank, args.nproc_per_node, args.rdzv_endpoint, args.rdzv_backend)
    # 16 processes over 2 nodes = 8 per node; static rendezvous at the first node, whose rank is given per node
    assert torchrun == ("2", 1, "8", "10.0.0.1:29500", "static")


@pytest.mark.slow  # repeats the torchrun test's training through `accelerate launch` (~25 s); run when configs change
def test_ddp_config_launches_two_processes_on_cpu(tmp_path):
    launcher = (
        "-m", "accelerate.commands.launch", "--config_file", "configs/accelerate/ddp.yaml",
        "--num_processes", "2", "--mixed_precision", "no",  # 2 CPU processes (gloo); fp32 as --smoke runs
    )  # fmt: skip
    result = train(tmp_path, launcher=launcher, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["epoch"] == 0.25  # two processes, as in test_two_process_smoke_trains_on_both_ranks


@pytest.mark.slow
def test_a_two_process_cpu_run_resumes(tmp_path):
    # accelerate named the device cpu:0, which torch.load's map_location for the optimizer state refused
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    first = train(tmp_path, "--MAX_STEPS=2", launcher=torchrun)
    assert first.returncode == 0, first.stderr[-3000:]
    again = train(tmp_path, "--MAX_STEPS=4", launcher=torchrun)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming from {tmp_path / 'checkpoint-2'}" in again.stderr
    assert json.loads((tmp_path / "run_finished.json").read_text())["global_step"] == 4


@pytest.mark.slow  # ~1.5 min on 2 busy cores
def test_two_processes_score_an_odd_number_of_held_out_problems_before_during_and_after(tmp_path):
    # 5 problems over 2 ranks: 3 each (the same generate calls on both, as ZeRO-3 and FSDP need), the repeat of the
    # last dropped after the gather; before, during and after each logged once, by rank 0, inside train()
    evals = ["--EVAL_BEFORE=5", "--EVAL_STEPS=1", "--EVAL_SUBSET=5", "--EVAL_AFTER=5", "--EVAL_SAMPLES=2"]
    result = torchrun(tmp_path, "--MAX_STEPS=2", *evals)
    assert result.returncode == 0, result.stderr[-3000:]
    kept = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [(r["step"], r["when"], r["metrics"]["n"]) for r in kept] == [
        (0, "before", 5),
        (1, "during", 5),
        (2, "after", 5),
    ]
    (run,) = event_dirs(tmp_path)
    assert [step for step, _ in read_scalars(run)["eval/gsm8k_sampled_accuracy"]] == [0, 1, 2]
    # every problem once, in order: rank 0's three, then rank 1's two
    fixture = [json.loads(line)["question"] for line in (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()]
    predictions = (tmp_path / "eval_test_after_predictions.jsonl").read_text().splitlines()
    assert [json.loads(p)["question"] for p in predictions] == fixture[:5]


# evaluate_trainer on a model FSDP2 (fully_shard, as accelerate's fsdp2.yaml applies it) shards over two CPU
# processes; accelerate 1.15 enables FSDP and DeepSpeed only on accelerators, so the trainer around it is a stand-in
FSDP2_CHILD = """
import json
import sys
from types import SimpleNamespace

from accelerate import Accelerator
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerControl, TrainerState
from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

from grpo import evaluation, gsm8k

model_dir, out = sys.argv[1:3]
accelerator = Accelerator(cpu=True)  # the gloo process group torchrun's environment describes
model = AutoModelForCausalLM.from_pretrained(model_dir)
for layer in model.model.layers:  # accelerate's TRANSFORMER_BASED_WRAP: one shard group per decoder layer
    fully_shard(layer)
fully_shard(model)
register_fsdp_forward_method(model, "generate")  # as transformers' Trainer does under FSDP2
forwards = []
model.register_forward_pre_hook(lambda module, inputs: forwards.append(1))
tokenizer = AutoTokenizer.from_pretrained(model_dir)
args = SimpleNamespace(
    output_dir=out,
    chat_template_kwargs={},
    num_generations=2,
    max_completion_length=32,
    cache_implementation="dynamic",
    temperature=1.0,
    seed=0,
    ds3_gather_for_generation=True,
    gradient_checkpointing_kwargs=None,
    include_num_input_tokens_seen="no",
    use_vllm=False,
)
trainer = SimpleNamespace(  # what evaluate_trainer reads of a GRPOTrainer inside train() under FSDP
    accelerator=accelerator,
    args=args,
    model=model,
    model_wrapped=model,
    processing_class=tokenizer,
    eos_token_ids=list(range(0, model.config.vocab_size, 2)),  # half the tokens end a completion: ranks finish apart
    is_deepspeed_enabled=False,
    is_fsdp_enabled=True,
    is_in_train=True,
    state=TrainerState(global_step=3, is_world_process_zero=accelerator.is_main_process),
    control=TrainerControl(),
    callback_handler=CallbackHandler([DefaultFlowCallback()], None, None, None, None),
)
dataset = gsm8k.load(str(gsm8k.FIXTURE), "test", limit=5)
metrics = evaluation.evaluate_trainer(trainer, "during", limit=5, dataset=dataset, batch_size=2, samples=2)
sharded = all(isinstance(p, DTensor) for p in model.parameters())
report = {"rank": accelerator.process_index, "sharded": sharded, "n": metrics["n"], "forwards": len(forwards)}
with open(f"{out}/rank{accelerator.process_index}.json", "w") as f:  # not stdout, where rank 0 prints its table
    f.write(json.dumps(report))
accelerator.wait_for_everyone()  # rank 0 writes the files; both leave the process group together
accelerator.end_training()
"""


@pytest.mark.slow  # ~1 min on 2 busy cores
def test_held_out_evaluation_of_an_fsdp2_sharded_model_on_two_cpu_processes(tmp_path, tiny_model):
    (tmp_path / "child.py").write_text(FSDP2_CHILD)
    script = [*TORCHRUN, str(tmp_path / "child.py"), tiny_model, str(tmp_path)]
    result = run_script(*script, env={"PYTHONPATH": str(REPO)}, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["sharded"] and r["n"] == 5 for r in ranks)
    predictions = [json.loads(p) for p in (tmp_path / "eval_test_during_predictions.jsonl").read_text().splitlines()]
    fixture = [json.loads(line)["question"] for line in (REPO / "data" / "smoke_gsm8k.jsonl").read_text().splitlines()]
    assert [p["question"] for p in predictions] == fixture[:5]  # rank 0's three, rank 1's two, the padding dropped
    # completions of different lengths, yet the same forward passes on both ranks: each one all-gathers the shards
    assert len({p["completion_tokens"] for p in predictions}) > 1
    assert ranks[0]["forwards"] == ranks[1]["forwards"]
