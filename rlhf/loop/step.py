"""One optimizer step, the same for every stage: micro-batches weighted by the units their losses average over,
gradients synchronised on the last, one finiteness check, then the optimizer and scheduler step."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from rlhf.core.errors import UserError
from rlhf.models.sharding import full_gradient_norm
from rlhf.models.training import budget_micro_rows
from rlhf.stage.fault_points import fault_point
from rlhf.stage.run import RunDir

# (model, micro-batch) -> (loss, its statistics): what `train_step` backpropagates and averages. A statistic is
# named as its metric key below the stage, group first (`train/nll`, `policy/clipfrac`, `val/loss`): the one key
# scheme of every metric is `<stage>/<group>/<name>`, and the stage prefix is added once, where the row is logged.
LossFn = Callable[[torch.nn.Module, Any], tuple[torch.Tensor, dict]]


def optimizer_step(
    accelerator: Accelerator, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler, max_grad_norm: float
) -> torch.Tensor | None:
    """One step on the accumulated gradients: clip them to `max_grad_norm` (when > 0), step the
    optimizer and the scheduler, clear the gradients. -> the gradient norm before clipping (None
    without clipping)."""
    fault_point("optimizer_step")
    grad_norm = None
    if max_grad_norm > 0:
        grad_norm = full_gradient_norm(accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)).detach().float()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


@dataclass
class MicroBatch:
    """One micro-batch of an optimizer step: what its loss function reads and what it weighs."""

    batch: Any  # a collated dict of tensors (SFT, reward, DPO) or a Rollout's selected rows (PPO, GRPO)
    loss_weight: float  # its loss's weight in the step's gradient (`accumulation_weights`)
    metric_weight: float  # its loss statistics' weight in the step's means (RL: its share of the step's tokens)


def accumulation_weights(units: list[float], units_per_process: float) -> list[float]:
    """The weight of each micro-batch's mean loss in one optimizer step, so that the weighted sum is the mean over
    the whole step's units: micro-batch k holds `units[k]` of them (its rows, pairs or response tokens, whatever
    its loss averages over) and weighs units[k] / units_per_process.

    On one process `units_per_process` is sum(units). Across W processes DDP averages the gradients, so pass the
    step's units summed over processes and divided by W: process r's weights then sum to its share of the units
    times W, and every unit of every process weighs the same. With no units at all every micro-batch weighs
    1 / len(units)."""
    if not units_per_process:
        return [1.0 / len(units)] * len(units)
    return [size / units_per_process for size in units]


def token_budget_rows(
    accelerator: Accelerator, rows: list[int], lengths: list[int], max_tokens: int
) -> list[list[int]]:
    """This process's `rows` of a step (`lengths`: positions per row, indexed by row) in micro-batches of at most
    `max_tokens` positions (`budget_micro_rows`), as many on every process: under FSDP every forward pass gathers
    the sharded weights from all of them."""
    micro_rows = budget_micro_rows(rows, lengths, max_tokens)
    if accelerator.num_processes == 1:
        return micro_rows
    counts = accelerator.gather(torch.tensor([len(micro_rows)], device=accelerator.device))  # (W,)
    return budget_micro_rows(rows, lengths, max_tokens, int(counts.max()))


def equal_micro_batches(batches: list[dict[str, torch.Tensor]], device: torch.device) -> list[MicroBatch]:
    """Collated micro-batches of equal weight (the mean of their mean losses), moved to `device`."""
    weights = accumulation_weights([1.0] * len(batches), float(len(batches)))
    return [
        MicroBatch({key: value.to(device) for key, value in batch.items()}, weight, weight)
        for batch, weight in zip(batches, weights)
    ]


def unit_weighted_micro_batches(
    batches: list[dict[str, torch.Tensor]], units: list[float], accelerator: Accelerator
) -> list[MicroBatch]:
    """Collated micro-batches holding `units` loss units each (response tokens, pairs: what each one's loss
    averages over), weighted by their share of the step's units on all processes (`accumulation_weights`), so the
    step's gradient is that of the mean over all its units however the rows were grouped; moved to the device."""
    per_process = float(sum(units))
    if accelerator.num_processes > 1:
        per_process = accelerator.reduce(torch.tensor(per_process, device=accelerator.device), reduction="mean").item()
    weights = accumulation_weights(units, per_process)
    return [
        MicroBatch({key: value.to(accelerator.device) for key, value in batch.items()}, weight, weight)
        for batch, weight in zip(batches, weights)
    ]


def train_step(
    stage: str,
    run: RunDir,
    where: str,
    accelerator: Accelerator,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    micro_batches: list[MicroBatch],
    loss_fn: LossFn,
    max_grad_norm: float,
) -> dict[str, torch.Tensor]:
    """One optimizer step of every stage on this process's share of a global batch: micro-batch k's `loss_fn`
    loss is backpropagated times its `loss_weight`, gradients are synchronised across processes on the last one
    only, then `optimizer_step`.

    -> the step's weighted loss (`train/loss`), the loss statistics weighted by each micro-batch's
    `metric_weight` (detached, by the names `loss_fn` gives them) and `train/grad_norm` when clipping. The
    losses stay on the device until every micro-batch has run: one finiteness check per step, before the
    optimizer steps, so a non-finite loss stops the stage in one line naming `where` (e.g. "step 4") and the last
    good checkpoint, with the weights untouched.
    """
    model.train()
    losses = []
    totals: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=accelerator.device))
    for k, micro in enumerate(micro_batches):
        syncing = k == len(micro_batches) - 1
        with nullcontext() if syncing else accelerator.no_sync(model):
            loss, stats = loss_fn(model, micro.batch)
            accelerator.backward(loss * micro.loss_weight)
        losses.append(loss.detach())
        totals["train/loss"] += loss.detach() * micro.loss_weight
        for key, value in stats.items():
            totals[key] += value.detach().float() * micro.metric_weight
    if losses and not bool(torch.isfinite(finite_check := torch.stack(losses)).all()):
        raise UserError(
            f"{stage}: non-finite loss ({finite_check[~torch.isfinite(finite_check)][0].item()}) at {where}; "
            f"the last good checkpoint is kept in {run.checkpoint_dir(stage)}; lower {stage}.lr or check the data"
        )
    grad_norm = optimizer_step(accelerator, model, optimizer, scheduler, max_grad_norm)
    if grad_norm is not None:
        totals["train/grad_norm"] = grad_norm
    return totals
