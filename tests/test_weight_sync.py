"""Tests of grpo/weight_sync.py: the out-of-place vLLM weight sync driven through TRL's own sync_weights() (no vllm
needed: the engine is a stand-in that records what it is sent), a vllm that cannot be imported (a stand-in package,
in subprocesses), and held-out generation on the run's engine (generation.trainer_vllm_generator, which syncs
through it; stand-ins that record the calls).

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_weight_sync.py -q
"""

import contextlib
import sys
import textwrap
import types
from types import SimpleNamespace as NS

import pytest
import torch
from conftest import REPO, run_script, train

from grpo import generation, weight_sync
from grpo.errors import ConfigError

# ---------------------------------------------------------------------------------------------------------------
# The out-of-place weight sync, through TRL's own sync_weights()

BF16_EPS = torch.finfo(torch.bfloat16).eps  # one bf16 rounding, relative: 2**-7
SYNCS = 60  # syncs per run, each after an optimiser-like update of the adapter


def lora_model(adapter_dtype=torch.float32, seed=0, **lora):
    """A tiny random Qwen3 in bf16 with LoRA on every linear layer, the adapter trained a little (B nonzero). The
    adapter is fp32 by peft's default; bf16 as TRL keeps it under ZeRO-3 (autocast_adapter_dtype=False)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    shape = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)
    config = Qwen3Config(**shape, head_dim=8, num_hidden_layers=2, initializer_range=0.02)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", **lora)
    model = get_peft_model(model, config, autocast_adapter_dtype=adapter_dtype == torch.float32)
    for name, param in model.named_parameters():
        if "lora_B" in name:  # peft starts B at zero, which would make every delta zero
            torch.nn.init.normal_(param, std=2e-3)
    return model


def train_a_little(model, lr=1e-4):
    """One optimiser-like update: every adapter weight moves by about the learning rate (Adam's step size)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.add_(lr * torch.randn_like(param).sign())


def base_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if "lora_" not in name}


class Engine:
    """vLLM's model as sync_weights() reaches it (llm.llm_engine...model.load_weights): keeps a copy of each tensor,
    as vLLM copies it into its own weights."""

    def __init__(self):
        self.received = {}
        self.llm_engine = NS(model_executor=NS(driver_worker=NS(model_runner=NS(model=self))))

    def load_weights(self, weights):
        self.received.update((name, tensor.clone()) for name, tensor in weights)

    def reset_prefix_cache(self):
        pass


def accelerator():
    return NS(state=NS(deepspeed_plugin=None, fsdp_plugin=None), is_main_process=True, device=torch.device("cpu"))


def vllm_generation(model, mode="colocate", **attributes):
    """TRL's VLLMGeneration without vllm: built bare, with the attributes its sync_weights() reads."""
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    generation = object.__new__(VLLMGeneration)
    acc = accelerator()
    defaults = dict(enable_sleep_mode=False, accelerator=acc, llm=Engine(), _dist=DistributedBackend(acc))
    generation.__dict__.update(defaults, mode=mode, model=model, _weight_metadata=None, **attributes)
    return generation


def reference_merge(model):
    """What vLLM should hold: each adapted weight as base + B @ A x scaling summed in fp32, cast once to bf16."""
    expected = {}
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            a, b = module.lora_A["default"].weight.float(), module.lora_B["default"].weight.float()
            base = module.get_base_layer().weight
            expected[name.removeprefix("base_model.model.") + ".weight"] = (
                base.float() + b @ a * module.scaling["default"]
            ).to(base.dtype)
    return expected


def changed(model, before):
    """(share of base elements that differ from `before`, the largest difference)."""
    now = base_weights(model)
    differ = sum((now[n] != before[n]).sum().item() for n in before)
    drift = max((now[n].float() - before[n].float()).abs().max().item() for n in before)
    return differ / sum(t.numel() for t in before.values()), drift


@pytest.mark.parametrize("adapter_dtype", [torch.float32, torch.bfloat16])
def test_out_of_place_syncs_leave_the_base_bit_identical_and_send_the_fp32_merge(adapter_dtype):
    model = lora_model(adapter_dtype)
    before = base_weights(model)
    generation = vllm_generation(model)
    weight_sync.replace_weight_walk(generation)
    for _ in range(SYNCS):
        train_a_little(model)
        generation.sync_weights()  # TRL's own, through our walk
        expected = reference_merge(model)
        for name, tensor in expected.items():  # within one bf16 rounding of the reference
            torch.testing.assert_close(generation.llm.received[name], tensor, rtol=BF16_EPS, atol=0)
    assert all(torch.equal(p, before[n]) for n, p in base_weights(model).items())  # not one bit moved
    assert changed(model, before) == (0.0, 0.0)


def test_trls_own_in_place_merge_drifts_the_base():
    # the control: the same syncs through TRL's merge_adapter / unmerge_adapter move the frozen bf16 base
    model = lora_model()
    before = base_weights(model)
    generation = vllm_generation(model)
    for _ in range(SYNCS):
        train_a_little(model)
        generation.sync_weights()
    share, drift = changed(model, before)
    assert share > 0.01 and drift > 0


def test_the_names_shapes_and_unadapted_tensors_are_trls():
    # both walks over the same model: the same names in the same order, the norms and embeddings as they are
    model = lora_model()
    ours = vllm_generation(model)
    weight_sync.replace_weight_walk(ours)
    ours_sent = [(name, t.clone()) for name, t in ours._iter_named_params()]
    trl_sent = [(name, t.clone()) for name, t in vllm_generation(model)._iter_named_params()]
    assert [(n, t.shape, t.dtype) for n, t in ours_sent] == [(n, t.shape, t.dtype) for n, t in trl_sent]
    adapted = reference_merge(model)
    assert len(adapted) == 14  # q k v o gate up down in each of the 2 layers
    for name, tensor in ours_sent:
        if name not in adapted:  # untouched by LoRA: sent exactly as the model holds it
            assert torch.equal(tensor, dict(trl_sent)[name]), name
    assert not any("lora_" in n or "base_layer" in n or n.startswith("base_model") for n, _ in ours_sent)
    # no autograd history from the adapter: vLLM copies each tensor into its weights, which would join the graph
    assert not any(t.requires_grad for _, t in ours._iter_named_params())


def test_the_delta_is_peft_get_delta_weight_in_fp32():
    model = lora_model()
    layer = model.base_model.model.model.layers[0].mlp.down_proj
    assert torch.equal(weight_sync.lora_delta(layer, "default"), layer.get_delta_weight("default"))


def test_two_active_adapters_are_both_sent_as_trls_merge_adds_both():
    from peft import LoraConfig

    model = lora_model()
    model.add_adapter("other", LoraConfig(r=4, lora_alpha=8, target_modules=["down_proj"]))
    model.base_model.set_adapter(["default", "other"])  # "other" only on down_proj: the rest get "default" alone
    for name, param in model.named_parameters():
        if "lora_B.other" in name:
            torch.nn.init.normal_(param, std=2e-3)
    generation = vllm_generation(model)
    weight_sync.replace_weight_walk(generation)
    sent = dict(generation._iter_named_params())
    layer = model.base_model.model.model.layers[1].mlp.down_proj
    deltas = [layer.lora_B[a].weight.float() @ layer.lora_A[a].weight.float() * layer.scaling[a] for a in layer.lora_A]
    base = layer.get_base_layer().weight
    expected = (base.float() + deltas[0] + deltas[1]).to(base.dtype)
    torch.testing.assert_close(sent["model.layers.1.mlp.down_proj.weight"], expected, rtol=BF16_EPS, atol=0)
    assert torch.equal(
        sent["model.layers.1.mlp.up_proj.weight"], reference_merge(model)["model.layers.1.mlp.up_proj.weight"]
    )


def test_modules_to_save_are_sent_under_their_own_name_and_their_original_left_out():
    model = lora_model(modules_to_save=["lm_head"])
    generation = vllm_generation(model)
    weight_sync.replace_weight_walk(generation)
    names = [name for name, _ in generation._iter_named_params()]
    assert names == [name for name, _ in vllm_generation(model)._iter_named_params()]
    assert "lm_head.weight" in names and not any("original_module" in n or "modules_to_save" in n for n in names)


class Client:
    """TRL's VLLMClient as sync_weights() uses it in server mode: the metadata, then the tensors streamed."""

    def __init__(self):
        self.updates = []

    def update_named_params(self, metadata, params):
        self.updates.append((metadata, [(name, t.clone()) for name, t in params]))

    def reset_prefix_cache(self):
        pass


def test_server_mode_walks_once_for_the_metadata_then_streams_the_same_tensors():
    model = lora_model()
    before = base_weights(model)
    generation = vllm_generation(model, mode="server", vllm_client=Client())
    weight_sync.replace_weight_walk(generation)
    for _ in range(3):
        train_a_little(model)
        generation.sync_weights()
    assert len(generation.vllm_client.updates) == 3  # the first sync walked twice: metadata, then the stream
    metadata, streamed = generation.vllm_client.updates[-1]
    assert metadata == [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in streamed]
    expected = reference_merge(model)
    for name, tensor in streamed:
        if name in expected:
            torch.testing.assert_close(tensor, expected[name], rtol=BF16_EPS, atol=0)
    assert all(torch.equal(p, before[n]) for n, p in base_weights(model).items())


def test_every_tensor_is_read_while_the_whole_model_is_gathered():
    # ZeRO-3: TRL gathers every parameter around the walk (collective: every process walks); ours does the same
    model = lora_model()
    calls = []

    class Zero3:
        @contextlib.contextmanager
        def gather_params(self, params):
            calls.append(("gather", len(params)))
            yield
            calls.append(("release",))

    generation = vllm_generation(model, _dist=Zero3())
    weight_sync.replace_weight_walk(generation)
    for name, _ in generation._iter_named_params():
        calls.append(("read", name))
    assert calls[0] == ("gather", len(list(model.parameters()))) and calls[-1] == ("release",)
    assert [c for c in calls if c[0] != "read"] == [calls[0], calls[-1]]  # one gather, all reads inside it


def trainer(model, use_vllm=True, fsdp_version=None):
    fsdp = NS(fsdp_version=fsdp_version) if fsdp_version else None
    generation = vllm_generation(model) if use_vllm else None
    return NS(args=NS(use_vllm=use_vllm), vllm_generation=generation, accelerator=NS(state=NS(fsdp_plugin=fsdp)))


def test_install_binds_the_walk_only_for_vllm_with_lora():
    model = lora_model()
    assert weight_sync.install(trainer(model, use_vllm=False)) is False
    plain = trainer(model.get_base_model())  # no PEFT: nothing to merge, TRL's walk is already exact
    assert weight_sync.install(plain) is False and "_iter_named_params" not in vars(plain.vllm_generation)
    run = trainer(model)
    assert weight_sync.install(run) is True
    before = base_weights(model)
    train_a_little(model)
    run.vllm_generation.sync_weights()
    assert all(torch.equal(p, before[n]) for n, p in base_weights(model).items())


def test_install_refuses_fsdp_and_a_lora_that_is_not_b_times_a():
    with pytest.raises(ConfigError, match="(?s)FSDP2.*zero3.yaml"):
        weight_sync.install(trainer(lora_model(), fsdp_version=2))
    with pytest.raises(NotImplementedError, match="plain LoRA"):
        weight_sync.install(trainer(lora_model(use_dora=True)))


@pytest.mark.parametrize(
    ("use_vllm", "fsdp", "refused"), [(True, 2, True), (True, 1, True), (True, 0, False), (False, 2, False)]
)
def test_fsdp_is_refused_before_loading_only_with_vllm(use_vllm, fsdp, refused):
    problem = weight_sync.fsdp_problem(use_vllm, fsdp)
    assert (problem is not None) == refused
    if refused:
        assert problem.startswith(f"USE_VLLM=True under FSDP{fsdp}") and "zero3.yaml or ddp.yaml" in problem


# ---------------------------------------------------------------------------------------------------------------
# A vllm that cannot be imported

BROKEN = 'import vllm.half_done\nraise ImportError("libcudart.so.13: cannot open shared object file")\n'


def stand_in_vllm(root, init=BROKEN):
    """A vllm 0.30.0 installed under `root` (its package and its metadata, which TRL reads for the version): by
    default one whose import fails as a CUDA 13 wheel does on a CUDA 12 driver, after importing a submodule of its
    own (which must not be left behind half-imported)."""
    package, metadata = root / "vllm", root / "vllm-0.30.0.dist-info"
    (package / "utils").mkdir(parents=True)
    metadata.mkdir()
    (metadata / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.30.0\n")
    (metadata / "top_level.txt").write_text("vllm\n")
    (package / "__init__.py").write_text(init)
    for module in ("half_done", "sampling_params", "utils/__init__", "utils/network_utils"):
        (package / f"{module}.py").write_text("StructuredOutputsParams = get_ip = None\n")
    return root


def run_python(code, path):
    """Run `code` in a fresh Python with `path` (a stand-in vllm's folder) first on its path."""
    return run_script("-c", textwrap.dedent(code), env={"PYTHONPATH": f"{path}:{REPO}"})


@pytest.mark.slow  # a second import of trl in a fresh Python (~7 s), for the control alone
def test_a_broken_vllm_without_the_check_crashes_the_trl_import(tmp_path):
    # the failure this guards against: TRL imports vllm at module level whenever it is installed
    result = run_python("from trl import GRPOTrainer", stand_in_vllm(tmp_path))
    assert result.returncode == 1 and "libcudart.so.13" in result.stderr


def test_after_the_check_trl_imports_and_sees_no_vllm(tmp_path):
    code = """
        import sys
        from grpo import generation, weight_sync
        usable, reason = weight_sync.vllm_status()
        print(usable, [n for n in sys.modules if n.startswith("vllm")], sys.modules["vllm"])
        print(reason)
        from trl import GRPOTrainer
        from trl.import_utils import is_vllm_available
        print("trl", is_vllm_available())
    """
    result = run_python(code, stand_in_vllm(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    status, reason, trl = result.stdout.splitlines()
    assert status == "False ['vllm'] None"  # vllm.half_done dropped; vllm itself mapped to None
    assert reason.startswith("vllm cannot be imported (ImportError: libcudart.so.13: cannot open shared object file)")
    assert f"; pip install a vllm build matching torch {torch.__version__} (CUDA " in reason
    assert reason.endswith(", or pip uninstall vllm")
    assert trl == "trl False"


@pytest.mark.slow
def test_a_smoke_run_with_a_broken_vllm_on_the_path_trains_on_hf_generate(tmp_path):
    # the whole script as a user runs it on a machine whose vllm cannot import: one line, then the run as usual
    path = {"PYTHONPATH": str(stand_in_vllm(tmp_path))}
    out = train(tmp_path / "run", "--USE_VLLM=auto", "--MAX_STEPS=1", "--EVAL_AFTER=2", env=path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert (
        out.stderr.count("USE_VLLM=auto: HF generate, as vllm cannot be imported (ImportError: libcudart.so.13") == 1
    )
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file()


def test_a_vllm_that_imports_is_usable_and_an_absent_one_says_nothing(tmp_path):
    code = "from grpo import weight_sync; print(weight_sync.vllm_status())"
    healthy = stand_in_vllm(tmp_path, init="LLM = RequestOutput = SamplingParams = None\n")
    assert run_python(code, healthy).stdout.strip() == "(True, None)"
    assert run_python(code, tmp_path / "empty").stdout.strip() == "(False, None)"  # this machine has no vllm


REASON = "vllm cannot be imported (ImportError: x); pip install a vllm build matching torch 2, or pip uninstall vllm"


@pytest.mark.parametrize(
    ("use_vllm", "expected"), [("auto", f"USE_VLLM=auto: HF generate, as {REASON}"), (False, None), ("false", None)]
)
def test_a_broken_vllm_under_auto_is_one_line_and_hf_generate(use_vllm, expected):
    assert weight_sync.vllm_choice(use_vllm, REASON) == expected
    assert weight_sync.vllm_choice(use_vllm, None) is None  # imported, or not installed: nothing to say here


@pytest.mark.parametrize("use_vllm", [True, "true", "True"])
def test_a_broken_vllm_under_use_vllm_true_is_a_config_error(use_vllm):
    with pytest.raises(ConfigError) as refused:
        weight_sync.vllm_choice(use_vllm, REASON)
    assert str(refused.value) == f"USE_VLLM={use_vllm}, but {REASON} and set USE_VLLM=auto."
    assert weight_sync.vllm_choice(use_vllm, None) is None


# ---------------------------------------------------------------------------------------------------------------
# Held-out generation on the run's own engine


class SamplingParams:
    """vllm.SamplingParams: keeps its keyword arguments."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


@pytest.fixture
def fake_vllm(monkeypatch):
    """A vllm module holding SamplingParams, in sys.modules for the test only (monkeypatch puts it back)."""
    module = types.ModuleType("vllm")
    module.SamplingParams = SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    return module


class LLM:
    """vLLM's LLM as the generator uses it: chat() answers each prompt with its index, the second cut off."""

    def __init__(self):
        self.calls, self.events = [], []

    def chat(self, prompts, params, chat_template_kwargs, use_tqdm):
        self.calls.append((prompts, params.kwargs, chat_template_kwargs))
        self.events.append("chat")
        finish = ["stop", "length", "stop"]
        return [
            NS(outputs=[NS(text=f"#### {i}", token_ids=[7] * (i + 2), finish_reason=finish[i % 3])])
            for i in range(len(prompts))
        ]

    def wake_up(self, tags):
        self.events.append(("wake_up", tags))

    def sleep(self, level):
        self.events.append(("sleep", level))


def run_on_engine(mode="colocate", step=0, sleep_mode=False, **attributes):
    """A GRPOTrainer as trainer_vllm_generator reads it, its sync_weights counting the syncs."""
    generation = NS(mode=mode, enable_sleep_mode=sleep_mode, tensor_parallel_size=1, llm=LLM(), syncs=[])
    generation.__dict__.update(attributes)
    generation.sync_weights = lambda: generation.syncs.append(run.state.global_step)
    run = NS(vllm_generation=generation, state=NS(global_step=step), _last_loaded_step=-1)
    return run


PROMPTS = [[{"role": "user", "content": q}] for q in ("1+1?", "2+2?", "3+3?")]


def test_colocated_generation_syncs_stale_weights_once_and_keeps_the_contract(fake_vllm):
    run = run_on_engine(step=5)
    generate = generation.trainer_vllm_generator(run, max_new_tokens=64, enable_thinking=False)
    outputs = generate(PROMPTS)
    assert outputs == [("#### 0", 2, False), ("#### 1", 3, True), ("#### 2", 4, False)]  # "length": cut off
    generate(PROMPTS, temperature=0.7)  # the same step: the engine's weights are fresh
    assert run.vllm_generation.syncs == [5] and run._last_loaded_step == 5
    run.state.global_step = 6  # an optimiser step later: stale again
    generate(PROMPTS)
    assert run.vllm_generation.syncs == [5, 6]
    (prompts, greedy, kwargs), (_, sampled, _), _ = run.vllm_generation.llm.calls
    assert prompts == PROMPTS and kwargs == {"enable_thinking": False}
    assert greedy == dict(n=1, temperature=0.0, top_k=0, top_p=1.0, max_tokens=64)  # greedy at 0
    assert sampled == {**greedy, "temperature": 0.7}  # sampled from the full distribution


def test_a_tensor_parallel_colocated_engine_is_refused_rather_than_left_to_hang(fake_vllm):
    # the ranks of a tensor-parallel group drive one engine and must all send it the same prompts; ours differ
    with pytest.raises(NotImplementedError, match="tensor-parallel"):
        generation.trainer_vllm_generator(run_on_engine(tensor_parallel_size=2), 8, False)


def test_a_sync_made_by_training_in_this_step_is_not_repeated(fake_vllm):
    run = run_on_engine(step=3)
    run._last_loaded_step = 3  # GRPOTrainer synced before this step's generation
    generation.trainer_vllm_generator(run, 8, True)(PROMPTS)
    assert run.vllm_generation.syncs == [] and run.vllm_generation.llm.calls[0][2] == {"enable_thinking": True}


def test_sleep_mode_resends_the_discarded_weights_and_sleeps_again(fake_vllm):
    run = run_on_engine(step=2, sleep_mode=True, _llm_weights_sleeping=True)
    run._last_loaded_step = 2  # fresh by the step, but level 2 sleep discarded the engine's weights
    generation.trainer_vllm_generator(run, 8, False)(PROMPTS)
    assert run.vllm_generation.syncs == [2]
    assert run.vllm_generation.llm.events == [("wake_up", ["kv_cache"]), "chat", ("sleep", 2)]
    assert run.vllm_generation._llm_weights_sleeping is True  # training's next generate re-sends them


class Tokenizer:
    def decode(self, ids, skip_special_tokens):
        return " ".join(str(i) for i in ids if not (skip_special_tokens and i == 0))


def test_server_generation_asks_the_server_once_and_counts_as_hf_generator(fake_vllm):
    calls = []

    def chat(prompts, **kwargs):
        calls.append((prompts, kwargs))
        return {"completion_ids": [[5, 6, 0, 9], [5, 6, 7], [0]]}  # ended, cut off, ended at once

    run = run_on_engine(mode="server", step=1, vllm_client=NS(chat=chat))
    run.__dict__.update(accelerator=NS(is_main_process=True, process_index=0), processing_class=Tokenizer())
    run.eos_token_ids = [0]
    outputs = generation.trainer_vllm_generator(run, 3, False)(PROMPTS)
    assert outputs == [("5 6", 3, False), ("5 6 7", 3, True), ("", 1, False)]  # up to and including the end of turn
    assert run.vllm_generation.syncs == [1]
    ((prompts, kwargs),) = calls
    assert prompts == PROMPTS
    assert kwargs == dict(
        n=1, temperature=0.0, top_k=0, top_p=1.0, max_tokens=3, chat_template_kwargs={"enable_thinking": False}
    )


def test_the_generator_drives_generation_generate_all(fake_vllm):
    from datasets import Dataset

    data = Dataset.from_dict({"prompt": PROMPTS, "question": ["a", "b", "c"], "answer": ["0", "1", "2"]})
    run = run_on_engine()
    rows = generation.generate_all(
        data, generation.trainer_vllm_generator(run, 8, False), batch_size=2, progress=False
    )
    assert [(r["completion"], r["truncated"]) for r in rows] == [
        ("#### 0", False),
        ("#### 1", True),
        ("#### 0", False),
    ]
    assert run.vllm_generation.syncs == [0]  # two batches, one sync
