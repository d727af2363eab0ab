"""CUDA out of memory in a training step (raised by RLHF_FAULT=oom@optimizer_step, as the GPU would):
one line naming the stage's micro-batch key to lower, exit 2, nothing marked complete."""

from __future__ import annotations

import pytest
from bad_inputs.helpers import fail_in_process

from rlhf.stage import fault_points
from rlhf.stage.cli import out_of_memory_advice

from .conftest import SFT_ARGS, sft_folder


@pytest.mark.slow  # its data stage is a stage process, and SFT runs to its first optimizer step: out of the unit run
def test_out_of_memory_in_a_training_step_names_the_micro_batch_key(data_run, tmp_path, capsys, monkeypatch):
    run = sft_folder(data_run, tmp_path / "run")
    monkeypatch.setenv(fault_points.FAULT_ENV, "oom@optimizer_step")
    monkeypatch.setattr(fault_points, "_reached", {})
    message = fail_in_process(capsys, "part1_reward/train_sft.py", run, *SFT_ARGS)
    assert message.startswith("sft: CUDA out of memory; halve sft.micro_batch_size (")
    assert "or sft.eval_batch_size if it ran out while sampling or evaluating" in message
    assert not (run / "sft" / "complete.json").exists()


@pytest.mark.parametrize(
    "stage, keys",
    [
        ("ppo", ("ppo.micro_batch_size", "ppo.forward_batch_size")),
        ("grpo", ("grpo.micro_batch_size", "grpo.forward_batch_size")),
        ("raft", ("raft.micro_batch_size", "raft.eval_batch_size")),
        ("dpo", ("dpo.micro_batch_size", "dpo.eval_batch_size")),
        ("eval", ("eval.batch_size",)),
    ],
)
def test_every_stage_names_its_own_keys(stage, keys):
    assert all(key in out_of_memory_advice(stage) for key in keys)
