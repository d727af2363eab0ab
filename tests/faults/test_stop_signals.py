"""SIGTERM and Ctrl-C (SIGINT) during training: the stage saves a checkpoint at the end of its current
step, exits 143 or 130 with one line, and the same command resumes from that step to the result an
uninterrupted run reaches (checked after SIGTERM; a resume does not depend on what stopped the run).
`sft.save_every=0`, so the only checkpoint is the one the signal asked for, and it falls between two
metric logs (`run.log_every=2`) as often as not: the metric rows must still match."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
from conftest import REPO

from rlhf.pipeline.faults import differences, loadable_checkpoint_step, outcome, run_command, stage_command

from .conftest import SFT_ARGS, sft_folder


def signal_mid_training(command: list[str], metrics, signum: int) -> tuple[int, str]:
    """Start `command`, send `signum` once its `metrics` file shows a training row, wait; -> exit code, stderr."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
    }  # as rlhf.pipeline.faults.run_command: the reference ran with one thread
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not (metrics.is_file() and '"sft/train/loss"' in metrics.read_text()):
        assert process.poll() is None and time.time() < deadline, "SFT ended or stalled before its first logged step"
        time.sleep(0.05)
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=300)
    return process.returncode, stderr


@pytest.mark.parametrize(
    "signum, exit_code",
    [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)],  # the CI subset: SIGTERM
)
@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_a_signal_saves_a_checkpoint_and_exits_and_the_rerun_resumes_identical(
    data_run, sft_reference, tmp_path, signum, exit_code
):
    run = sft_folder(data_run, tmp_path / "run")
    command = [*stage_command("sft", run, "tiny", []), *SFT_ARGS, "sft.save_every=0"]

    code, stderr = signal_mid_training(command, run / "sft" / "metrics.jsonl", signum)
    name = signal.Signals(signum).name
    assert code == exit_code, stderr
    (line,) = re.findall(r"stopped by .*", stderr)  # may follow the progress bar on its line
    assert line.startswith(f"stopped by {name} after ")
    assert f"; checkpoint saved in {run / 'sft' / 'checkpoint'}; re-run the same command to resume" in line
    assert "Traceback" not in stderr
    saved_step = loadable_checkpoint_step(run / "sft" / "checkpoint")
    assert saved_step is not None and 2 <= saved_step <= 12
    assert not (run / "sft" / "complete.json").exists()
    if signum != signal.SIGTERM:
        return

    code, output, _ = run_command(command)
    assert code == 0, output
    assert f"resumed from step {saved_step}/12" in output
    assert json.loads((run / "sft" / "complete.json").read_text())["steps"] == 12
    assert differences(outcome(sft_reference, "sft"), outcome(run, "sft")) == []
