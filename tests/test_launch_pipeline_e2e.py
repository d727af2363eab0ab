"""The documented multi-process command for a CPU (docs/scaling.md), run as written: the whole tiny pipeline from
the data stage on 2 processes through `accelerate launch`, against one process accumulating the same two halves
of every batch. Its own file, so that the test runner can place it beside test_distributed.py's stage-by-stage
comparisons (whose helpers and tolerance it shares) rather than after them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO
from safetensors.torch import load_file
from test_distributed import REL, same_rows, same_tree

pytestmark = pytest.mark.slow

# The whole tiny pipeline at small budgets, its batch sizes as the preset has them.
PIPELINE_BUDGETS = [
    "data.embedded.n_train_pairs=1200",
    "data.embedded.n_test_pairs=200",
    "sft.max_steps=4",
    "sft.gold_eval_prompts=8",
    "sft.num_samples=2",
    "reward.max_steps=4",
    "ppo.total_episodes=64",
    "ppo.eval_prompts=8",
    "grpo.total_episodes=64",
    "grpo.eval_prompts=8",
    "raft.rounds=1",
    "raft.prompts_per_round=64",
    "raft.eval_prompts=8",
    "dpo.max_steps=2",
    "dpo.max_train_pairs=64",
    "dpo.eval_prompts=8",
    "online_dpo.total_episodes=64",
    "online_dpo.eval_prompts=8",
    "eval.num_prompts=8",
    "eval.best_of_n=2",
    "eval.best_of_n_prompts=2",
    "eval.judges=gold,reward",
    "run.log_every=1",
]
# Where the tiny preset's micro-batch is its whole batch, 2 processes take half of it each
# (`rlhf.models.training.micro_batch_size`): the 1-process run accumulates the same two halves.
HALF_BATCH_MICRO_BATCHES = [
    "sft.micro_batch_size=16",
    "reward.micro_batch_size=8",
    "raft.micro_batch_size=16",
    "dpo.micro_batch_size=16",
]
DOCUMENTED_LAUNCH = "accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2"  # docs/scaling.md


def test_the_documented_launch_runs_the_tiny_pipeline_as_one_process_does(tmp_path):
    """The CPU command of docs/scaling.md, as written (accelerate not on PATH), from the data stage on: every
    stage's results and weights as one process's, which accumulates what the 2 processes split."""
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    runs = {}
    for name, launch, overrides in (("single", "", HALF_BATCH_MICRO_BATCHES), ("ddp", DOCUMENTED_LAUNCH, [])):
        command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", "--output-dir", str(tmp_path / name)]
        runs[name] = subprocess.run(
            [*command, *PIPELINE_BUDGETS, *overrides],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=600,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PATH": path, "RLHF_LAUNCH": launch},
        )
        assert runs[name].returncode == 0, runs[name].stderr[-3000:]

    # One process prints, draws progress bars and writes files.
    assert runs["ddp"].stdout.count("[report] wrote") == runs["ddp"].stdout.count("[data] pairs") == 1
    assert "Loading weights" not in runs["ddp"].stderr
    folders = [tmp_path / name for name in runs]
    files = [
        sorted(str(p.relative_to(f)) for p in f.rglob("*") if p.is_file() and "tensorboard" not in p.parts)
        for f in folders
    ]
    assert files[0] == files[1]
    events = [sorted(p.parent for p in (f / "tensorboard").rglob("events.*")) for f in folders]
    assert events[0] == [tmp_path / "single" / p.relative_to(tmp_path / "ddp") for p in events[1]]

    # The same results, samples and weights.
    summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
    for summary in summaries:  # SFT's gold check samples from run.seed on each process, not from a seed per row;
        summary["sft"] = {k: v for k, v in summary["sft"].items() if not k.startswith("gold_")}
        del summary["dpo"][
            "timed_tokens"
        ]  # and DPO counts rank 0's tokens x processes (rlhf/methods/dpo.py): an estimate
    same_tree([{k: v for k, v in s.items() if k != "timing_s"} for s in summaries])
    for name in files[0]:
        if name.startswith("eval/responses/"):
            same_rows([f / name for f in folders])
        if name.endswith("model.safetensors"):
            weights = [load_file(f / name) for f in folders]
            assert weights[0].keys() == weights[1].keys()
            for key in weights[0]:
                torch.testing.assert_close(weights[1][key], weights[0][key], rtol=REL, atol=1e-6, msg=name)
