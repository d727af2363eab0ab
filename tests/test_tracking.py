import json

import pytest

from rlhf.config import Config
from rlhf.tracking import MetricLogger


def logged_steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def first_attempt(tmp_path, steps):
    logger = MetricLogger("sft", tmp_path / "sft", tmp_path / "tb", Config())
    logger.resume(0)
    for step in steps:
        logger.log(step, {"sft/train/loss": 1.0 / step})
    logger.close()


def test_resume_keeps_rows_up_to_the_checkpoint_and_drops_the_rest(tmp_path):
    first_attempt(tmp_path, [1, 2, 3, 4])  # killed after step 4, last checkpoint at step 2
    logger = MetricLogger("sft", tmp_path / "sft", tmp_path / "tb", Config())
    logger.resume(2)
    assert [row["step"] for row in logger.history] == [1, 2]
    logger.log(3, {"sft/train/loss": 0.1})
    logger.close()
    assert logged_steps(tmp_path / "sft" / "metrics.jsonl") == [1, 2, 3]
    assert [row["step"] for row in logger.history] == [1, 2, 3]


def test_a_fresh_start_replaces_an_earlier_runs_rows(tmp_path):
    first_attempt(tmp_path, [1, 2, 3])  # a complete earlier run, now re-run with --force
    logger = MetricLogger("sft", tmp_path / "sft", tmp_path / "tb", Config())
    logger.resume(0)
    assert logger.history == []
    logger.log(1, {"sft/train/loss": 0.5})
    logger.close()
    assert logged_steps(tmp_path / "sft" / "metrics.jsonl") == [1]


def test_keys_must_follow_the_scheme(tmp_path):
    logger = MetricLogger("sft", tmp_path / "sft", tmp_path / "tb", Config())
    with pytest.raises(ValueError, match=r"does not follow .sft/group/name."):
        logger.log(1, {"loss": 1.0})
    logger.close()
