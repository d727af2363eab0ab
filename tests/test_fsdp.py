"""FSDP2 on CPU (rlhf/models/sharding.py): a checkpoint written by a GRPO run sharded over 2 processes
(`accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2`) resumes in one process to the
weights of an uninterrupted run: checkpoints hold full tensors in the one-process layout, whatever wrote them.
(The sharded SFT, reward, DPO and GRPO stages against one process: tests/test_distributed.py.)"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_TEST_OVERRIDES
from safetensors.torch import load_file
from test_distributed import OVERRIDES as DDP_OVERRIDES
from test_distributed import assert_same_weights

pytestmark = pytest.mark.slow

FSDP = [
    sys.executable,
    "-m",
    "accelerate.commands.launch",
    "--config_file",
    str(REPO / "configs" / "accelerate" / "fsdp.yaml"),
    "--num_processes",
    "2",
    "--main_process_port",
    "29523",
]
GRPO = "part2_ppo_grpo/train_grpo.py"
# test_distributed.py's GRPO run (global batch 16, micro-batches of 4), with a checkpoint after every iteration
GRPO_OVERRIDES = [*DDP_OVERRIDES["grpo"], "grpo.save_every=1"]


def run(launcher: list[str], tiny_run: Path, out: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """GRPO on copies of its inputs from `tiny_run`, logging every step; the finished process."""
    if not (out / "summary.json").exists():
        for folder in ("data", "sft", "reward"):
            shutil.copytree(tiny_run / folder, out / folder)
        shutil.copy(tiny_run / "summary.json", out / "summary.json")
    command = [*launcher, str(REPO / GRPO), "--preset", "tiny", "--output-dir", str(out)]
    return subprocess.run(
        [*command, *TINY_TEST_OVERRIDES, *GRPO_OVERRIDES, "run.log_every=1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def weights(out: Path) -> dict:
    return load_file(str(out / "grpo" / "model" / "model.safetensors"))


def test_a_sharded_checkpoint_resumes_in_one_process(tiny_run, tmp_path):
    uninterrupted = run([sys.executable], tiny_run, tmp_path / "single")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    out = tmp_path / "resumed"
    # two optimizer steps per iteration (grpo.epochs=2): the third is in iteration 2 of 3, after the first checkpoint
    killed = run(FSDP, tiny_run, out, env={"RLHF_FAULT": "kill@optimizer_step:3"})
    assert killed.returncode != 0
    assert json.loads((out / "grpo" / "checkpoint" / "state.json").read_text())["iteration"] == 1
    resumed = run([sys.executable], tiny_run, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from iteration 1/3" in resumed.stdout
    assert_same_weights(weights(tmp_path / "single"), weights(out))
