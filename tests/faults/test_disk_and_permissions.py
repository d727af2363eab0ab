"""A full disk during a checkpoint write, and an output folder the stage cannot write.

Both use a real filesystem where the machine allows it: a size-limited tmpfs, and a read-only bind
mount, each made in private user and mount namespaces (`unshare`, no root needed; skipped where
user namespaces are disabled). The in-process test of the checkpoint writer always runs.
"""

from __future__ import annotations

import errno

import pytest
import torch

from rlhf.core.errors import UserError
from rlhf.models.checkpoint import load_training_state, save_training_state
from rlhf.pipeline.faults import loadable_checkpoint_step, run_command, stage_command

from .conftest import SFT_ARGS, in_private_mounts, private_mounts_available, sft_folder, shell

needs_namespaces = pytest.mark.skipif(
    not private_mounts_available(), reason="unshare cannot create user and mount namespaces on this machine"
)
# A tiny-preset SFT checkpoint is ~24.5 MB (weights 8 MB, AdamW moments 16 MB): this tmpfs holds the
# first checkpoint and the stage's small files, and fills up halfway through writing the second.
STAGE_FOLDER_MB = 36


def one_line_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


@pytest.mark.slow  # a stage run of its own; the in-process test below covers the writer in the CI subset
@needs_namespaces
def test_disk_full_mid_checkpoint_is_one_line_and_keeps_the_previous_checkpoint(data_run, tmp_path):
    run = sft_folder(data_run, tmp_path / "run")
    (run / "sft").mkdir()
    kept = tmp_path / "sft_after"  # the tmpfs vanishes with its namespace: its contents are copied out first
    command = [*stage_command("sft", run, "tiny", []), *SFT_ARGS]
    script = (
        f"mount -t tmpfs -o size={STAGE_FOLDER_MB}m tmpfs {run / 'sft'} && {shell(command)}; "
        f"code=$?; cp -a {run / 'sft'} {kept}; exit $code"
    )
    code, output, _ = run_command(in_private_mounts(script))
    assert code == 2, output
    message = one_line_error(output)
    assert f"cannot write {run / 'sft' / 'checkpoint'} (no space left on device); the previous version is kept" in (
        message
    )
    assert not (kept / "checkpoint.tmp").exists()  # removed, freeing what it took
    assert loadable_checkpoint_step(kept / "checkpoint") == 4
    assert not (kept / "complete.json").exists()


def test_checkpoint_writer_turns_a_full_disk_into_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    save_training_state(tmp_path / "checkpoint", model, optimizer, None, {"step": 4})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(UserError, match=r"\(no space left on device\); the previous version is kept; free space"):
        save_training_state(tmp_path / "checkpoint", model, optimizer, None, {"step": 8})
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint.tmp").exists()
    assert load_training_state(tmp_path / "checkpoint", model, optimizer, None) == {"step": 4}


@pytest.mark.slow  # a stage process (seconds): out of the unit run
@needs_namespaces
def test_read_only_output_folder_is_one_line_at_start_up(data_run, tmp_path):
    """As root, permissions do not stop a write; a read-only mount does, for root too."""
    run = sft_folder(data_run, tmp_path / "run")
    command = [*stage_command("sft", run, "tiny", []), *SFT_ARGS]
    code, output, _ = run_command(
        in_private_mounts(f"mount --bind {run} {run} && mount -o remount,bind,ro {run} && {shell(command)}")
    )
    assert code == 2, output
    message = one_line_error(output)
    assert message == (
        f"error: cannot write to the output folder {run / 'sft'} (Read-only file system); "
        "pass a writable --output-dir, or make that folder writable"
    )
    assert "[sft] policy" not in output  # stopped before any model was built
