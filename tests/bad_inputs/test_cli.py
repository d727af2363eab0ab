"""The stage scripts as a user runs them, in their own process: a bad input at start-up exits with
code 2 within seconds, and the terminal shows exactly one line, "error: <what>; <fix>", never a
traceback. The in-process tests of this package cover the cases; these prove the terminal side.
"Within seconds" is measured in CPU time of the stage's process, so a busy shared machine does not
make it flaky."""

from __future__ import annotations

import resource

import pytest
from conftest import run_script

from rlhf.stage.run import RunDir

from .helpers import assert_nothing_lost, assert_problem_and_fix, prepare_run


def fails_in_one_line(script: str, out_dir, *overrides: str, started_loading: bool = False) -> str:
    """Run `script` with the tiny preset: exit code 2, no traceback, and the error as the last line of
    stderr; the only line unless the stage had `started_loading` models (their progress bars come first)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = run_script(script, out_dir, *overrides, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_seconds = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # load on a shared CPU aside
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and (started_loading or len(lines) == 1), result.stderr
    assert sum(line.startswith("error: ") for line in lines) == 1, result.stderr
    assert cpu_seconds < 30, f"{script} took {cpu_seconds:.0f} CPU seconds to fail"
    return lines[-1].removeprefix("error: ")


@pytest.mark.slow  # a stage process (seconds, the first one also its worker's forkserver): out of the unit run
@pytest.mark.parametrize(
    "script, stage, override, problem, fix",
    [
        (
            "part1_reward/train_sft.py",
            "sft",
            "sft.batch_size=0",
            "sft.batch_size=0 must be at least 1",
            "set sft.batch_size to a positive number",
        ),
        (
            "part2_ppo_grpo/train_grpo.py",
            "grpo",
            "grpo.batch_size=30",
            "grpo.batch_size=30 must be divisible by grpo.group_size=4",
            "multiple of 4",
        ),
    ],
)
def test_config_error_at_start_up(tmp_path, script, stage, override, problem, fix):
    out = prepare_run(tmp_path / "run")
    message = fails_in_one_line(script, out, override)
    assert_problem_and_fix(message, problem, fix)
    assert_nothing_lost(out, stage)


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_unreadable_dataset(tmp_path):
    out = prepare_run(tmp_path / "run")
    data = tmp_path / "pairs.parquet"
    data.write_bytes(b"PAR1 not really parquet")
    message = fails_in_one_line("part1_reward/analyze_data.py", out, f"data.path={data}")
    assert_problem_and_fix(message, f"cannot read {data} as Parquet", "complete Parquet file")
    assert_nothing_lost(out, "data")


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_damaged_upstream_model(rl_run):
    run = RunDir(rl_run)
    weights = run.model_dir("sft") / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    message = fails_in_one_line("part2_ppo_grpo/train_ppo.py", rl_run, started_loading=True)
    assert_problem_and_fix(message, f"cannot load {run.model_dir('sft')}", "re-run the stage that wrote it")
    assert_nothing_lost(rl_run, "ppo")
