"""Tests of grpo/evaluation.py's held-out points during training: every point kept in eval_test.jsonl, which of them
a rerun finds scored, and the shards each rank scores. (Moved from test_monitor.py; the scoring and the report are
tested beside them by the owner of this file.)

    .venv/bin/python -m pytest tests/test_evaluation.py -q
"""

import json

import pytest

from grpo import evaluation


def test_every_eval_point_is_kept(tmp_path):
    for step in (2, 4, 6):
        evaluation.append_eval_point(tmp_path, "during", step, {"n": 8, "lenient_accuracy": step / 10})
    evaluation.append_eval_point(tmp_path, "after", 6, {"n": 32})
    rows = [json.loads(line) for line in (tmp_path / "eval_test.jsonl").read_text().splitlines()]
    assert [(r["step"], r["when"]) for r in rows] == [(2, "during"), (4, "during"), (6, "during"), (6, "after")]
    assert rows[1]["metrics"]["lenient_accuracy"] == 0.4


def test_a_rerun_finds_the_points_already_scored(tmp_path):
    assert not evaluation.scored(tmp_path, 2)  # no file yet: a fresh run
    evaluation.append_eval_point(tmp_path, "before", 0, {"n": 8})
    evaluation.append_eval_point(tmp_path, "during", 2, {"n": 8})
    with open(tmp_path / "eval_test.jsonl", "a") as f:
        f.write("\n")  # a blank line (an editor's, a cut write's) is no point
    assert [step for step in range(5) if evaluation.scored(tmp_path, step)] == [0, 2]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [1, 5, 8, 9])
def test_every_rank_scores_a_shard_of_the_same_length(n, world):
    shards = [evaluation.shard_indices(n, rank, world) for rank in range(world)]
    assert len({len(shard) for shard in shards}) == 1  # the same generate calls on every rank (ZeRO-3, FSDP)
    gathered = [i for shard in shards for i in shard]  # gather_object's order: rank 0's first
    assert gathered[:n] == list(range(n)) and set(gathered[n:]) <= {n - 1}  # each problem once, then padding
