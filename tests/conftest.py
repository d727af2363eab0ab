"""Shared fixtures: run stage scripts through their real command line, and one small tiny-preset run."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked
import pytest
from fake_openai import server  # noqa: F401  (the fake OpenAI-compatible judge server, for every test module)
from filelock import FileLock

from rlhf.models.sources import CACHE_ENV

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
    """Run a stage script as a user would (in its own process, `forked`); fail the test with its output when it
    fails."""
    command = [sys.executable, str(REPO / script), "--preset", preset, "--output-dir", str(output_dir), *overrides]
    result = forked.run(command, REPO, {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(command)} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def kill_at_first_checkpoint(script: str, output_dir: Path, stage: str, *overrides: str) -> None:
    """Run a stage script as a user would and SIGKILL it once its first resumable checkpoint is on disk: a crash in
    the middle of a run. Fails the test if the stage ends or stalls before one; the stage is then not complete."""
    command = [sys.executable, str(REPO / script), "--preset", "tiny", "--output-dir", str(output_dir), *overrides]
    process = forked.start(command, REPO, dict(os.environ))
    deadline = time.time() + 300
    while not (output_dir / stage / "checkpoint" / "state.json").is_file():
        assert process.poll() is None and time.time() < deadline, (
            f"{stage} ended or stalled before its first checkpoint"
        )
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    process.output()
    assert not (output_dir / stage / "complete.json").exists()


def read_summary(output_dir: Path) -> dict:
    return json.loads((output_dir / "summary.json").read_text())


def shared_folder(tmp_path_factory) -> Path:
    """A folder every worker of this test run shares: RLHF_TEST_SHARED (run_tests.sh sets it for both of its pytest
    sessions), else the folder all workers' temporary folders share."""
    if os.environ.get("RLHF_TEST_SHARED"):
        return Path(os.environ["RLHF_TEST_SHARED"])
    shared = tmp_path_factory.getbasetemp()
    return shared.parent if os.environ.get("PYTEST_XDIST_WORKER") else shared  # a worker's is a subfolder


@pytest.fixture(scope="session", autouse=True)
def dequantization_cache(tmp_path_factory) -> None:
    """A test run never reads (nor fills) the user's cache of dequantized GGUF models (`rlhf.models.sources`): the
    first test to need SmolLM2's weights dequantizes the file for real, into a cache of this run's, and the later
    ones link to that."""
    os.environ[CACHE_ENV] = str(shared_folder(tmp_path_factory) / "cache")


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """data -> sft -> reward on a reduced tiny preset, built once per test run and shared by every end-to-end test:
    the first worker to need it builds it under a file lock in `shared_folder`, the others wait for it and reuse it.

    Tests that train further stages should copy it (shutil.copytree) rather than write into it.
    """
    shared = shared_folder(tmp_path_factory)
    output_dir, built = shared / "tiny_run", shared / "tiny_run.built"
    with FileLock(str(shared / "tiny_run.lock")):
        if not built.exists():
            shutil.rmtree(output_dir, ignore_errors=True)  # a build that failed half-way
            for script in (
                "part1_reward/analyze_data.py",
                "part1_reward/train_sft.py",
                "part1_reward/train_reward.py",
            ):
                run_script(script, output_dir, *TINY_TEST_OVERRIDES)
            built.touch()
    return output_dir


# The slowest test files (minutes each, docs/performance.md), collected first, the slowest first: `--dist loadfile
# --no-loadscope-reorder` (run_tests.sh) hands files to the workers in collection order, so the long ones start
# early instead of leaving one worker busy at the end. The second builds the shared tiny run at once, while the
# first, which does not use it, keeps the other worker busy: no file (nor the vLLM job) then waits for it. (Built
# later, by the fourth file, it kept two of the suite's three processes waiting 86 s, measured 2026-12-08.)
SLOW_FILES_FIRST = (
    "test_smollm2_e2e.py",
    "test_part1_e2e.py",
    "test_distributed.py",
    "test_ppo_grpo_e2e.py",
    "test_seeds.py",
    "test_bf16_e2e.py",
    "test_lora_e2e.py",
    "test_bench.py",
    "test_bf16_lora_ddp_e2e.py",
    "test_ifeval_e2e.py",
    "test_fsdp.py",
    "test_overoptimization.py",
    "test_online_dpo.py",
    "test_collect_e2e.py",
    "test_dpo_e2e.py",
    "test_tldr_e2e.py",
    "test_launch.py",
    "test_hh_e2e.py",
    "test_raft_e2e.py",
)


def pytest_collection_modifyitems(items) -> None:
    for item in items:  # a test that reads the shared tiny run may have to build it (minutes): never a unit test
        if "tiny_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    rank = {name: i for i, name in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
