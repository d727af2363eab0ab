"""The offline stages' loop (SFT, the reward models, DPO): one `train_step` per global batch in a data order fixed
by (seed, epoch), resumable at any checkpoint, with metrics, evaluation and checkpoints on their own clocks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
from accelerate import Accelerator

from rlhf.loop.step import (
    LossFn,
    MicroBatch,
    equal_micro_batches,
    token_budget_rows,
    train_step,
    unit_weighted_micro_batches,
)
from rlhf.models.checkpoint import check_checkpoint_config, load_training_state, save_training_state
from rlhf.models.sharding import prepare_trained_model
from rlhf.models.training import build_optimizer, build_scheduler, epoch_order, plan_steps
from rlhf.stage.run import RunDir, stage_seed
from rlhf.stage.schema import Config, TrainConfig
from rlhf.stage.signals import checkpoint_due, defer_stops, stop_if_requested
from rlhf.stage.tracking import MetricLogger


def step_micro_batches(
    accelerator: Accelerator,
    micro_rows: list[list[int]],
    lengths: list[int],
    tcfg: TrainConfig,
    collate: Callable[[list[int]], dict],
    loss_units: Callable[[dict], float],
) -> list[MicroBatch]:
    """One step's micro-batches on this process from its `micro_rows` (`micro_batch_size` rows each): so, weighed
    equally, when `tcfg.micro_batch_tokens` is None; else those rows re-cut by that token budget
    (`token_budget_rows`), each weighed by its share of the step's `loss_units` on all processes (response
    tokens, pairs: what its loss averages over). `collate` makes a batch of example indices."""
    if tcfg.micro_batch_tokens is None:
        return equal_micro_batches([collate(rows) for rows in micro_rows], accelerator.device)
    step_rows = [i for chunk in micro_rows for i in chunk]
    micro_rows = token_budget_rows(accelerator, step_rows, lengths, tcfg.micro_batch_tokens)
    batches = [collate(rows) for rows in micro_rows]
    return unit_weighted_micro_batches(batches, [loss_units(batch) for batch in batches], accelerator)


def fit(
    *,
    stage: str,
    tcfg: TrainConfig,
    cfg: Config,
    run: RunDir,
    accelerator: Accelerator,
    model: torch.nn.Module,
    examples: list,
    lengths: list[int],
    collate: Callable[[list], dict],
    loss_fn: LossFn,
    evaluate: Callable[[torch.nn.Module], dict[str, float]],
    logger: MetricLogger,
    loss_units: Callable[[dict], float],
    on_fresh_start: Callable[[], None] | None = None,
) -> tuple[torch.nn.Module, dict]:
    """Train `model` on `examples` (with token `lengths`, for grouping) with `loss_fn`, whose loss of a collated
    batch averages over `loss_units(batch)` units (response tokens, pairs): what a micro-batch formed by a token
    budget (`<stage>.micro_batch_tokens`) weighs. Returns the unwrapped model and loop facts. `on_fresh_start` runs
    once the logger knows the run starts at step 0 (not resumed), e.g. to log a step-0 row that a resumed run
    already has."""
    plan = plan_steps(stage, tcfg, len(examples), accelerator.num_processes)
    model, optimizer, whole = prepare_trained_model(accelerator, model, lambda m: build_optimizer(m, tcfg))
    scheduler = build_scheduler(optimizer, tcfg, plan.total_steps)
    fingerprint = run.fingerprint(stage, cfg)

    # 1. Resume from the last complete checkpoint written for this same config, if any, with the
    #    metric sums since the last log (a checkpoint between two logs then changes no logged mean).
    step = 0
    window: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=accelerator.device))
    window_steps = 0
    check_checkpoint_config(run.checkpoint_dir(stage), fingerprint)
    state = load_training_state(run.checkpoint_dir(stage), accelerator.unwrap_model(model), optimizer, scheduler)
    if state is not None:
        step = state["step"]
        # (checkpoints of earlier versions hold none, or one by other names: their next logged row covers fewer steps)
        saved_window = state.get("metric_window", {})
        window.update({k: torch.tensor(v, device=accelerator.device) for k, v in saved_window.items()})
        window_steps = state.get("metric_window_steps", 0) if saved_window else 0
        accelerator.print(f"[{stage}] resumed from step {step}/{plan.total_steps}")
    resumed_from = step
    logger.resume(step)
    if step == 0 and on_fresh_start is not None:
        on_fresh_start()
    defer_stops()

    # 2. One optimizer step per global batch, micro-batches accumulated locally.
    logger.progress(plan.total_steps, initial=step, desc=stage)
    rank = accelerator.process_index
    while step < plan.total_steps:
        epoch, position = divmod(step, plan.steps_per_epoch)
        order = epoch_order(lengths, stage_seed(cfg, stage), epoch, tcfg.batch_size, tcfg.group_by_length)
        micro_rows = plan.micro_rows(order, position, rank)
        micro_batches = step_micro_batches(
            accelerator, micro_rows, lengths, tcfg, lambda rows: collate([examples[i] for i in rows]), loss_units
        )
        totals = train_step(
            stage,
            run,
            f"step {step + 1}",
            accelerator,
            model,
            optimizer,
            scheduler,
            micro_batches,
            loss_fn,
            tcfg.max_grad_norm,
        )
        step += 1
        logger.advance()
        for key, value in totals.items():
            window[key] += value
        window_steps += 1

        # 3. Metrics (means over the steps since the last log), evaluation and checkpoints on their own clocks.
        if step % cfg.run.log_every == 0 or step == plan.total_steps:
            reduced = {
                f"{stage}/{k}": accelerator.reduce(v / window_steps, reduction="mean").item() for k, v in window.items()
            }
            window.clear()
            window_steps = 0
            reduced[f"{stage}/train/lr"] = scheduler.get_last_lr()[0]
            reduced[f"{stage}/train/epoch"] = step / plan.steps_per_epoch
            logger.log(step, reduced, postfix=(f"{stage}/train/loss",))
        if tcfg.eval_every and step % tcfg.eval_every == 0 and step < plan.total_steps:
            logger.log(step, evaluate(whole.of(model)))
        if checkpoint_due(accelerator, tcfg.save_every, step, plan.total_steps):
            metric_window = {k: accelerator.reduce(v, reduction="mean").item() for k, v in window.items()}
            save_training_state(  # every process gathers; the main one writes
                run.checkpoint_dir(stage),
                accelerator.unwrap_model(model),
                optimizer,
                scheduler,
                {
                    "step": step,
                    "fingerprint": fingerprint,
                    "epoch": epoch,
                    "metric_window": metric_window,
                    "metric_window_steps": window_steps,
                },
            )
            accelerator.wait_for_everyone()
            stop_if_requested(run.checkpoint_dir(stage))

    return whole.of(model), {
        "steps": step,
        "resumed_from_step": resumed_from,
        "steps_per_epoch": plan.steps_per_epoch,
    }
