"""FSDP2 on CPU (rlhf/models/sharding.py): the SFT, reward, DPO and GRPO stages launched as docs/scaling.md
documents it,
`accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2`, against one process accumulating
the same global batch in two micro-batches, as the DDP comparisons of test_distributed.py (whose tolerance, REL, this
shares): the same per-step metrics and the same published weights. And a checkpoint written by the sharded run
resumes in one process to the weights of an uninterrupted run: checkpoints hold full tensors in the one-process
layout, whatever wrote them."""

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
from test_distributed import REL, metric_rows

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
SCRIPTS = {
    "sft": "part1_reward/train_sft.py",
    "reward": "part1_reward/train_reward.py",
    "dpo": "part3_dpo/train_dpo.py",
    "grpo": "part2_ppo_grpo/train_grpo.py",
}
INPUTS = {
    "sft": ("data",),
    "reward": ("data", "sft"),
    "dpo": ("data", "sft", "reward"),
    "grpo": ("data", "sft", "reward"),
}
# Global batch 8, micro-batch 4: one process accumulates 2 micro-batches per step, each of 2 processes takes 1.
OVERRIDES = {
    "sft": ["sft.max_steps=3", "sft.batch_size=8", "sft.micro_batch_size=4", "sft.gold_eval_prompts=4"],
    "reward": ["reward.max_steps=3", "reward.batch_size=8", "reward.micro_batch_size=4"],
    "dpo": ["dpo.max_steps=3", "dpo.batch_size=8", "dpo.micro_batch_size=4", "dpo.eval_prompts=4"],
    # test_distributed.py's GRPO run (token-normalised, so its per-step means do not depend on how rows are grouped
    # into micro-batches), with a checkpoint after every iteration
    "grpo": [*DDP_OVERRIDES["grpo"], "grpo.save_every=1"],
}


def run(
    stage: str, launcher: list[str], tiny_run: Path, out: Path, env: dict | None = None
) -> subprocess.CompletedProcess:
    """`stage` on copies of its inputs from `tiny_run`, logging every step; the finished process."""
    if not (out / "summary.json").exists():
        for folder in INPUTS[stage]:
            shutil.copytree(tiny_run / folder, out / folder)
        shutil.copy(tiny_run / "summary.json", out / "summary.json")
    command = [*launcher, str(REPO / SCRIPTS[stage]), "--preset", "tiny", "--output-dir", str(out)]
    return subprocess.run(
        [*command, *TINY_TEST_OVERRIDES, *OVERRIDES[stage], "run.log_every=1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})},
    )


def weights(out: Path, stage: str) -> dict:
    return load_file(str(out / stage / "model" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        scale = float(a[name].abs().max()) or 1.0
        assert float((a[name] - b[name]).abs().max()) <= REL * scale, name


@pytest.mark.parametrize("stage", ["sft", "reward", "dpo", "grpo"])
def test_fsdp_on_two_processes_matches_one_process(tiny_run, tmp_path, stage):
    single = run(stage, [sys.executable], tiny_run, tmp_path / "single")
    assert single.returncode == 0, single.stderr[-3000:]
    sharded = run(stage, FSDP, tiny_run, tmp_path / "fsdp")
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert "sharded over 2 processes" in sharded.stdout  # FSDP2, not accelerate's DDP fallback on CPU
    rows = [metric_rows(tmp_path / name, stage) for name in ("single", "fsdp")]
    assert len(rows[0]) == len(rows[1]) > 2
    for one, two in zip(*rows):
        assert one.keys() == two.keys()
        assert one == pytest.approx(two, rel=REL, abs=1e-6), f"{stage} step {one.get('step')}"
    assert_same_weights(weights(tmp_path / "single", stage), weights(tmp_path / "fsdp", stage))
    if stage == "reward":  # a parameter with its own optimizer settings keeps them when sharding replaces it
        results = [
            json.loads((tmp_path / name / "summary.json").read_text())["reward_model"] for name in ("single", "fsdp")
        ]
        assert results[0]["length_heuristic_weight"] != pytest.approx(0.1, abs=1e-3)
        assert results[1]["length_heuristic_weight"] == pytest.approx(results[0]["length_heuristic_weight"], rel=REL)


def test_a_sharded_checkpoint_resumes_in_one_process(tiny_run, tmp_path):
    uninterrupted = run("grpo", [sys.executable], tiny_run, tmp_path / "single")
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    out = tmp_path / "resumed"
    # two optimizer steps per iteration (grpo.epochs=2): the third is in iteration 2 of 3, after the first checkpoint
    killed = run("grpo", FSDP, tiny_run, out, env={"RLHF_FAULT": "kill@optimizer_step:3"})
    assert killed.returncode != 0
    assert json.loads((out / "grpo" / "checkpoint" / "state.json").read_text())["iteration"] == 1
    resumed = run("grpo", [sys.executable], tiny_run, out)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from iteration 1/3" in resumed.stdout
    assert_same_weights(weights(tmp_path / "single", "grpo"), weights(out, "grpo"))
