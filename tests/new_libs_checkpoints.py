"""checkpoints.safetensors_problem: safetensors' own reader finds a cut or padded file, and the message names it.

pytest tests/new_libs_checkpoints.py
"""

import pytest
import torch
from safetensors.torch import save_file

from grpo import checkpoints


@pytest.mark.parametrize("damage", [lambda b: b[:-10], lambda b: b + b"\0" * 10, lambda b: b[:5]])
def test_a_cut_or_padded_safetensors_file_is_named(tmp_path, damage):
    path = tmp_path / "adapter_model.safetensors"
    save_file({"lora_A": torch.zeros(100)}, path)
    assert checkpoints.safetensors_problem(path) is None  # whole
    path.write_bytes(damage(path.read_bytes()))
    assert checkpoints.safetensors_problem(path).startswith("adapter_model.safetensors is cut short or damaged (")


def test_a_missing_safetensors_file_is_named(tmp_path):
    assert checkpoints.safetensors_problem(tmp_path / "model.safetensors") == "model.safetensors is missing"
