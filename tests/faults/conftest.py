"""Fixtures of the fault suite: one small data folder, one uninterrupted SFT run to compare against,
and a way to run a command with a size-limited or read-only folder without root."""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_script

from rlhf.pipeline.faults import FAULT_OVERRIDES

# SFT on the runner's budgets, smaller still: 12 steps of 16 examples, a checkpoint every 4 (~15 s on one core).
SFT_ARGS = [
    *FAULT_OVERRIDES,
    "sft.max_steps=12",
    "sft.batch_size=16",
    "sft.micro_batch_size=16",
    "sft.save_every=4",
    "sft.gold_eval_prompts=4",
]


def sft_folder(data_run: Path, folder: Path) -> Path:
    """A run folder ready for SFT: a copy of `data_run`'s data stage and summary."""
    shutil.copytree(data_run / "data", folder / "data")
    shutil.copy(data_run / "summary.json", folder / "summary.json")
    return folder


@pytest.fixture(scope="session")
def data_run(tmp_path_factory) -> Path:
    """The data stage on the runner's budgets (1,200 embedded pairs)."""
    folder = tmp_path_factory.mktemp("fault_data")
    run_script("part1_reward/analyze_data.py", folder, *FAULT_OVERRIDES)
    return folder


@pytest.fixture(scope="session")
def sft_reference(data_run, tmp_path_factory) -> Path:
    """SFT on `SFT_ARGS`, never interrupted: what every interrupted run must end with."""
    folder = sft_folder(data_run, tmp_path_factory.mktemp("sft_reference"))
    run_script("part1_reward/train_sft.py", folder, *SFT_ARGS, env={"OMP_NUM_THREADS": "1"})  # as run_command
    return folder


def in_private_mounts(script: str) -> list[str]:
    """A command running the shell `script` as root of new user and mount namespaces: it may mount a
    size-limited tmpfs or a read-only bind that no other process sees, with no root needed outside."""
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]


@functools.cache
def private_mounts_available() -> bool:
    """Whether this machine lets an unprivileged user create those namespaces (unshare installed, user
    namespaces enabled)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(in_private_mounts("mount -t tmpfs -o size=1m tmpfs /mnt"), capture_output=True)
    return probe.returncode == 0


def shell(command: list[str]) -> str:
    return " ".join(shlex.quote(str(part)) for part in command)
