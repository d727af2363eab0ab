"""The training passes' shared pieces: value alignment, minibatches, micro-batches, loss units and accumulation."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.core.errors import UserError
from rlhf.rollout.batch import Rollout
from rlhf.rollout.layout import ROWS, RowLayout
from rlhf.stage.config import PPOConfig


def align_values(position_values: Tensor) -> Tensor:
    """Value of the state in which each token was chosen: column t gets the value head's output at
    position t - 1 (Huang et al. 2024 read values at context_length - 1 : -1). (B, T) -> (B, T)."""
    return torch.nn.functional.pad(position_values[:, :-1], (1, 0))


def minibatch_indices(
    n: int, num_minibatches: int, generator: torch.Generator, layout: RowLayout = ROWS
) -> list[Tensor]:
    """A fresh random split of n rollouts into num_minibatches equal parts (one epoch), of whole forward rows of
    `layout` (a packed group's rows consecutive and in order)."""
    G = layout.rows_per_pass
    order = torch.randperm(n // G, generator=generator)  # (n / G,)
    order = (order[:, None] * G + torch.arange(G)).reshape(-1)  # (n,)
    size = n // num_minibatches
    return [order[k * size : (k + 1) * size] for k in range(num_minibatches)]


def loss_units(response_mask: Tensor, normalization: str) -> Tensor:
    """(n,) what each row weighs in a loss normalised by `normalization`: its response tokens
    ("token") or 1 ("sequence"). response_mask: (n, T) bool."""
    if normalization == "token":
        return response_mask.sum(-1).float()
    if normalization == "sequence":
        return torch.ones(response_mask.shape[0], device=response_mask.device)
    raise ValueError(f"normalization must be 'token' or 'sequence', got {normalization!r}")


def accumulation_weights(
    response_mask: Tensor, micro_batch_size: int, normalization: str, units_per_process: float | None = None
) -> list[float]:
    """Weights for the losses of consecutive micro-batches of one minibatch so that their weighted
    sum equals the loss of the whole minibatch at once.

    "token": a loss averaged over a micro-batch's response tokens weighs its share of the minibatch's
    tokens; "sequence": a loss averaged over rows weighs its share of the rows.
    response_mask: (n, T) bool for the minibatch -> one weight per micro-batch, summing to 1.

    Across W processes DDP averages the gradients, so each process's weights must sum to its share
    of the minibatch's units over all processes, times W: pass `units_per_process`, the
    `loss_units` of the whole minibatch summed over processes and divided by W (default: this
    process's own, for one process). Process r's weights then sum to units_r / units_per_process.
    """
    units = loss_units(response_mask, normalization)
    sizes = [float(units[start : start + micro_batch_size].sum()) for start in range(0, len(units), micro_batch_size)]
    total = sum(sizes) if units_per_process is None else units_per_process
    return [size / total if total else 1.0 / len(sizes) for size in sizes]


def mean_process_units(accelerator, response_mask: Tensor, normalization: str) -> float:
    """The `loss_units` of a minibatch whose rows `response_mask` (n, T) holds on this process,
    summed over processes and divided by their number (`accumulation_weights`)."""
    return accelerator.reduce(loss_units(response_mask, normalization).sum(), reduction="mean").item()


def micro_batches(
    minibatch: Tensor,
    lengths: Tensor,
    response_mask: Tensor,
    micro_batch_size: int,
    normalization: str,
    units_per_process: float | None = None,
    layout: RowLayout = ROWS,
) -> list[tuple[Tensor, int, float]]:
    """Split one minibatch of rollout rows into micro-batches for gradient accumulation.

    minibatch: (n,) row indices; lengths: (B,) tokens per row; response_mask: (B, T) bool.
    Rows are sorted by the width of their forward row (stably, `RowLayout.narrowest_first`), so similar widths
    share a micro-batch; a packed layout keeps each group whole, and `micro_batch_size` must be a multiple of its
    size. -> one (rows, t, weight) per micro-batch: its row indices, the columns it needs (past its longest
    row, all is padding) and its `accumulation_weights` weight (`units_per_process` as there).
    """
    minibatch = layout.narrowest_first(minibatch, lengths, response_mask.sum(-1))
    weights = accumulation_weights(response_mask[minibatch], micro_batch_size, normalization, units_per_process)
    chunks = [minibatch[k * micro_batch_size : (k + 1) * micro_batch_size] for k in range(len(weights))]
    return [(rows, int(lengths[rows].max()), weight) for rows, weight in zip(chunks, weights)]


def weighted_micro_batches(
    accelerator,
    minibatch: Tensor,
    rollout: Rollout,
    micro_batch_size: int,
    normalization: str,
    layout: RowLayout = ROWS,
) -> list[tuple[Tensor, int, float, float]]:
    """`micro_batches` of one minibatch, each with its loss weight (`accumulation_weights` over all processes) and
    its token share: its response tokens over the minibatch's on all processes (times their number, as the loss
    weights), the weight that makes a token-mean metric of the micro-batches the minibatch's token mean, whatever
    the loss normalisation and whichever rows share a micro-batch. -> (rows, t, weight, token share) each."""
    mask = rollout.response_mask
    units = mean_process_units(accelerator, mask[minibatch], normalization)
    token_units = units if normalization == "token" else mean_process_units(accelerator, mask[minibatch], "token")
    micro = micro_batches(minibatch, rollout.lengths, mask, micro_batch_size, normalization, units, layout)
    return [
        (rows, t, weight, float(mask[rows, :t].sum()) / token_units if token_units else 0.0)
        for rows, t, weight in micro
    ]


def accumulate(totals: dict[str, Tensor], values: dict[str, Tensor], weight: float) -> None:
    """totals[key] += weight * value, detached, for each of `values`: a minibatch's metric over its micro-batches."""
    for key, value in values.items():
        totals[key] = totals.get(key, 0.0) + weight * value.detach().float()


def check_finite_loss(stage: str, loss: Tensor, iteration: int, run) -> None:
    """A non-finite loss stops the stage in one line, naming the last good checkpoint (`iteration` counts from 0)."""
    if not torch.isfinite(loss):
        raise UserError(
            f"{stage}: non-finite loss at iteration {iteration + 1}; lower {stage}.lr "
            f"(last good checkpoint: {run.checkpoint_dir(stage)})"
        )


def build_ppo_optimizer(model: torch.nn.Module, pcfg: PPOConfig) -> torch.optim.Optimizer:
    """AdamW over a PolicyAndValue module: weight decay on matrices only; the critic's own
    parameters (the separate value model, or the shared value head) at `value_lr` when set."""
    critic_ids = {
        id(p) for part in (model.value_model, model.value_head) if part is not None for p in part.parameters()
    }
    groups = []
    for is_critic in (False, True):
        params = [p for p in model.parameters() if p.requires_grad and (id(p) in critic_ids) == is_critic]
        lr = pcfg.value_lr if is_critic and pcfg.value_lr is not None else pcfg.lr
        groups += [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": pcfg.weight_decay, "lr": lr},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0, "lr": lr},
        ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=pcfg.lr, eps=pcfg.adam_eps)
