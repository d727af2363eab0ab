"""The pieces the fault suite relies on, in-process: the RLHF_FAULT hook, the graceful-stop state
machine, and the samples.jsonl clean-up a resumed RL stage does."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from rlhf.online.checkpoints import drop_samples_after
from rlhf.stage import fault_points, signals


class OneProcess:
    """What `checkpoint_due` needs of an Accelerator, for a single process."""

    device = torch.device("cpu")

    @staticmethod
    def reduce(tensor, reduction):
        return tensor


def test_fault_point_does_nothing_unless_named(monkeypatch):
    monkeypatch.setattr(fault_points, "_reached", {})
    monkeypatch.delenv(fault_points.FAULT_ENV, raising=False)
    fault_points.fault_point("optimizer_step")
    monkeypatch.setenv(fault_points.FAULT_ENV, "oom@checkpoint")
    fault_points.fault_point("optimizer_step")
    assert fault_points._reached == {}


def test_fault_point_acts_the_nth_time(monkeypatch):
    monkeypatch.setattr(fault_points, "_reached", {})
    monkeypatch.setenv(fault_points.FAULT_ENV, "oom@optimizer_step:3")
    fault_points.fault_point("optimizer_step")
    fault_points.fault_point("optimizer_step")
    with pytest.raises(torch.cuda.OutOfMemoryError, match="injected by RLHF_FAULT"):
        fault_points.fault_point("optimizer_step")
    fault_points.fault_point("optimizer_step")  # once only


def test_a_signal_outside_a_training_loop_interrupts_at_once():
    with signals.graceful_stops(), pytest.raises(signals.Interrupted) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.value.exit_code == 143 and stop.value.checkpoint is None


def test_a_signal_in_a_training_loop_waits_for_the_checkpoint(tmp_path, capsys):
    before = signal.getsignal(signal.SIGINT)  # pytest's handler; ignored when the suite runs in a background job
    with signals.graceful_stops():
        signals.defer_stops()
        assert not signals.checkpoint_due(OneProcess, save_every=0, step=1, total=10)
        os.kill(os.getpid(), signal.SIGINT)  # deferred: the step goes on
        assert "SIGINT received: saving a checkpoint at the end of this step" in capsys.readouterr().err
        assert signals.checkpoint_due(OneProcess, save_every=0, step=2, total=10)
        with pytest.raises(signals.Interrupted) as stop:
            signals.stop_if_requested(tmp_path)
    assert stop.value.exit_code == 130 and stop.value.checkpoint == tmp_path
    assert signal.getsignal(signal.SIGINT) is before  # the handler it replaced is back


def test_a_second_signal_interrupts_at_once(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: now[0])
    with signals.graceful_stops():
        signals.defer_stops()
        os.kill(os.getpid(), signal.SIGTERM)
        now[0] += signals.ECHO_S
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)


def test_the_same_signal_again_at_once_is_one_stop_delivered_twice(tmp_path, monkeypatch, capsys):
    """A SIGTERM sent to a whole process group reaches a stage directly and, a moment later, from the pipeline that
    passes it on: the step still ends with its checkpoint. Another signal, or the same one after ECHO_S, is a user
    who will not wait."""
    now = [100.0]
    monkeypatch.setattr(signals.time, "monotonic", lambda: now[0])
    with signals.graceful_stops():
        signals.defer_stops()
        os.kill(os.getpid(), signal.SIGTERM)
        now[0] += 0.1
        os.kill(os.getpid(), signal.SIGTERM)  # ignored
        assert capsys.readouterr().err.count("SIGTERM received") == 1
        assert signals.checkpoint_due(OneProcess, save_every=0, step=2, total=10)
        with pytest.raises(signals.Interrupted) as stop:
            signals.stop_if_requested(tmp_path)
        assert stop.value.exit_code == 143 and stop.value.checkpoint == tmp_path
    with signals.graceful_stops():
        signals.defer_stops()
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)  # another signal: at once, however soon


def test_after_the_last_step_a_signal_interrupts_at_once():
    with signals.graceful_stops():
        signals.defer_stops()
        assert signals.checkpoint_due(OneProcess, save_every=2, step=4, total=10)
        assert not signals.checkpoint_due(OneProcess, save_every=2, step=10, total=10)  # no checkpoint at the end
        with pytest.raises(signals.Interrupted):
            os.kill(os.getpid(), signal.SIGTERM)


def test_resumed_rl_stage_drops_samples_after_its_checkpoint(tmp_path):
    path = tmp_path / "samples.jsonl"
    rows = [{"iteration": i, "response": f"r{i}"} for i in (1, 2, 3, 4)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"iteration": 5, "resp')  # cut by a crash
    drop_samples_after(path, 2)
    assert [json.loads(line)["iteration"] for line in path.read_text().splitlines()] == [1, 2]
