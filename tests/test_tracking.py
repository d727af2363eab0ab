import json

import pytest

from rlhf.stage.schema import Config
from rlhf.stage.tracking import MetricLogger


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


def tensorboard_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_runs_are_stages_and_tags_are_shared_while_jsonl_keeps_full_keys(tmp_path):
    """PPO's and GRPO's KL on one TensorBoard chart: the stage is the run (a folder), the tag is the rest."""
    for stage, kl in (("ppo", 0.25), ("grpo", 0.5)):
        logger = MetricLogger(stage, tmp_path / stage, tmp_path / "tensorboard" / stage, Config())
        logger.resume(0)
        logger.log(1, {f"{stage}/objective/kl": kl, f"{stage}/policy/clipfrac": 0.125})
        logger.close()
        assert json.loads((tmp_path / stage / "metrics.jsonl").read_text()).keys() == {
            "step",
            "time_s",
            f"{stage}/objective/kl",
            f"{stage}/policy/clipfrac",
        }
    assert tensorboard_scalars(tmp_path / "tensorboard" / "ppo") == {
        "objective/kl": [(1, 0.25)],
        "policy/clipfrac": [(1, 0.125)],
    }
    assert tensorboard_scalars(tmp_path / "tensorboard" / "grpo")["objective/kl"] == [(1, 0.5)]


def test_a_resumed_stage_counts_the_time_before_its_checkpoint(tmp_path):
    """The timing table counted only the part of a resumed stage after the resume."""
    import time

    path = tmp_path / "sft" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text(
        "".join(json.dumps({"step": s, "time_s": 10.0 * s, "sft/train/loss": 1.0}) + "\n" for s in (1, 2, 3))
    )
    since = time.perf_counter()
    logger = MetricLogger("sft", tmp_path / "sft", tmp_path / "tb", Config())
    logger.resume(2)  # the earlier attempt reached its step-2 checkpoint at 20 s
    assert logger.resumed_s == 20.0 and 20.0 <= logger.elapsed(since) < 25.0
    logger.log(3, {"sft/train/loss": 0.5})
    logger.close()
    assert 20.0 <= json.loads(path.read_text().splitlines()[-1])["time_s"] < 25.0  # the curve's clock goes on
    fresh = MetricLogger("sft", tmp_path / "sft", tmp_path / "tb", Config())
    fresh.resume(0)
    assert fresh.resumed_s == 0.0 and fresh.elapsed(time.perf_counter()) < 1.0
    fresh.close()
