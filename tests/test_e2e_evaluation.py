"""End to end: a training run's own held-out evaluation (grpo/evaluation.py's evaluate_trainer) under torchrun, two
processes on the CPU: each rank scores its shard and rank 0 writes all of it.

    OMP_NUM_THREADS=1 .venv/bin/python -m pytest tests/test_e2e_evaluation.py -q   # slow: ~1 min
"""

import json

import pytest
from conftest import read_scalars, train

from grpo import gsm8k


@pytest.mark.slow
def test_two_processes_share_the_evaluation_and_rank_0_writes_all_of_it(tmp_path):
    # Under torchrun each rank generates a contiguous shard (5 problems -> 3 + 2) and rank 0 gathers them in order.
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = train(tmp_path, "--EVAL_BEFORE=5", "--EVAL_AFTER=5", launcher=torchrun, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    fixture = [json.loads(line)["question"] for line in gsm8k.FIXTURE.read_text().splitlines()]
    for when in ("before", "after"):
        rows = (tmp_path / f"eval_test_{when}_predictions.jsonl").read_text().splitlines()
        assert [json.loads(line)["question"] for line in rows] == fixture[:5]
    (run,) = (tmp_path / "runs").iterdir()  # only rank 0 wrote TensorBoard events
    assert [s for s, _ in read_scalars(run)["eval/gsm8k_strict_accuracy"]] == [0, 4]
