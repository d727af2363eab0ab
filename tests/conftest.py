"""Shared fixtures: run stage scripts through their real command line, and one small tiny-preset run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_openai import server  # noqa: F401  (the fake OpenAI-compatible judge server, for every test module)

REPO = Path(__file__).resolve().parent.parent

# A smaller, faster version of the tiny preset for end-to-end tests: same code paths, fewer pairs and steps.
TINY_TEST_OVERRIDES = [
    "data.embedded.n_train_pairs=2400",
    "data.embedded.n_test_pairs=300",
    "sft.epochs=2",
    "sft.gold_eval_prompts=60",
    "reward.epochs=2",
    "run.log_every=5",
]


def run_script(
    script: str,
    output_dir: Path,
    *overrides: str,
    preset: str = "tiny",
    env: dict | None = None,
    check: bool = True,
    timeout: int = 900,
) -> subprocess.CompletedProcess:
    """Run a stage script as a user would; fail the test with its output when it fails."""
    command = [sys.executable, str(REPO / script), "--preset", preset, "--output-dir", str(output_dir), *overrides]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def read_summary(output_dir: Path) -> dict:
    return json.loads((output_dir / "summary.json").read_text())


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """data -> sft -> reward on a reduced tiny preset, shared by every end-to-end test of the session.

    Tests that train further stages should copy it (shutil.copytree) rather than write into it.
    """
    output_dir = tmp_path_factory.mktemp("tiny_run")
    for script in ("part1_reward/analyze_data.py", "part1_reward/train_sft.py", "part1_reward/train_reward.py"):
        run_script(script, output_dir, *TINY_TEST_OVERRIDES)
    return output_dir
