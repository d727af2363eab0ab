"""Resumable RL checkpoints, the samples log they cut back to, and the stage's metric logger."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from rlhf.data import write_jsonl
from rlhf.models.checkpoint import check_checkpoint_config, load_training_state, save_training_state
from rlhf.stage.run import RunDir
from rlhf.stage.schema import Config
from rlhf.stage.signals import defer_stops, stop_if_requested
from rlhf.stage.tracking import MetricLogger


def load_rl_checkpoint(
    stage: str, run: RunDir, cfg: Config, accelerator, model: torch.nn.Module, optimizer, scheduler, iterations: int
) -> dict | None:
    """Restore the stage's last checkpoint (`save_rl_checkpoint`) into the unwrapped model, the
    optimizer, the scheduler and the RNG; -> its state ({"iteration": ..., ...}), or None when
    there is none. One written for another config is an error, not a silent restart."""
    check_checkpoint_config(run.checkpoint_dir(stage), run.fingerprint(stage, cfg))
    state = load_training_state(run.checkpoint_dir(stage), accelerator.unwrap_model(model), optimizer, scheduler)
    if state is not None:
        accelerator.print(f"[{stage}] resumed from iteration {state['iteration']}/{iterations}")
    if accelerator.is_main_process:
        drop_samples_after(run.stage(stage) / "samples.jsonl", state["iteration"] if state else 0)
    defer_stops()  # the loop starts here: a signal now waits for the next checkpoint
    return state


def drop_samples_after(path: Path, iteration: int) -> None:
    """Keep only the samples.jsonl rows of iterations up to `iteration` (the checkpoint resumed
    from): an earlier attempt's later rows are sampled again, and would otherwise appear twice."""
    if not path.is_file():
        return
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # the last line, cut short by a crash mid-append
        if row["iteration"] <= iteration:
            rows.append(row)
    write_jsonl(path, rows)


def save_rl_checkpoint(
    stage: str,
    run: RunDir,
    cfg: Config,
    accelerator,
    model: torch.nn.Module,
    optimizer,
    scheduler,
    iteration: int,
    **extra,
) -> None:
    """Write the resumable checkpoint after `iteration` (plus the stage's `extra` state), tagged with the config
    fingerprint: every process gathers its part, the main one writes, and all wait until it is written."""
    save_training_state(
        run.checkpoint_dir(stage),
        accelerator.unwrap_model(model),
        optimizer,
        scheduler,
        {"iteration": iteration, "fingerprint": run.fingerprint(stage, cfg), **extra},
    )
    accelerator.wait_for_everyone()
    stop_if_requested(run.checkpoint_dir(stage))


def open_rl_logger(stage: str, run: RunDir, cfg: Config, accelerator, iteration: int, iterations: int) -> MetricLogger:
    """The stage's metric logger (active on the main process), continuing after `iteration` (rows
    an earlier attempt logged after it are dropped), with a progress bar over all `iterations`."""
    logger = MetricLogger(stage, run.stage(stage), run.tensorboard_dir(stage), cfg, enabled=accelerator.is_main_process)
    logger.resume(iteration)
    logger.progress(iterations, initial=iteration, desc=stage)
    return logger
