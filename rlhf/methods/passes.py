"""The RL training passes' shared pieces: value alignment, minibatches, and micro-batches of rollouts weighted by
their loss units."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.loop.step import MicroBatch, accumulation_weights, token_budget_rows
from rlhf.rollout.batch import Rollout
from rlhf.rollout.layout import ROWS, RowLayout
from rlhf.stage.schema import PPOConfig


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


def micro_batch_rows(
    minibatch: Tensor, lengths: Tensor, response_lengths: Tensor, micro_batch_size: int, layout: RowLayout = ROWS
) -> list[Tensor]:
    """One minibatch's rows (minibatch: (n,) row indices) in micro-batches for gradient accumulation, sorted by the
    width of their forward row (stably, `RowLayout.narrowest_first`; lengths, response_lengths: (B,) tokens per
    row) so that similar widths share a micro-batch. A packed layout keeps each group whole, and
    `micro_batch_size` must be a multiple of its size."""
    minibatch = layout.narrowest_first(minibatch, lengths, response_lengths)
    return [minibatch[start : start + micro_batch_size] for start in range(0, len(minibatch), micro_batch_size)]


def budget_micro_batch_rows(
    accelerator, minibatch: Tensor, lengths: Tensor, response_lengths: Tensor, max_tokens: int, layout: RowLayout = ROWS
) -> list[Tensor]:
    """One minibatch's rows (minibatch: (n,) row indices) in micro-batches of at most `max_tokens` positions each:
    forward rows x the widest forward row, padding included (a row's length, or a packed group's prompt plus its G
    responses; lengths, response_lengths: (B,) per rollout row), the widest first, each filled while the next forward
    row fits, one wider than the budget alone (`token_budget_rows`, as many on every process). A packed group stays
    whole and in order."""
    groups = minibatch.view(-1, layout.rows_per_pass)  # (n / G, G): one forward row each
    response_tokens = response_lengths[groups]  # (n / G, G)
    widths = lengths[groups[:, 0]] - response_tokens[:, 0] + response_tokens.sum(-1)  # (n / G,): prompt + responses
    micro = token_budget_rows(accelerator, list(range(len(groups))), widths.tolist(), max_tokens)
    return [groups[members].reshape(-1) for members in micro]


def rollout_micro_batches(
    accelerator,
    minibatch: Tensor,
    rollout: Rollout,
    micro_batch_size: int,
    normalization: str,
    layout: RowLayout = ROWS,
    micro_batch_tokens: int | None = None,
) -> list[MicroBatch]:
    """One minibatch of `rollout`'s rows (minibatch: (n,) row indices) as micro-batches of `micro_batch_size` rows
    (`micro_batch_rows`), or of at most `micro_batch_tokens` positions when that is set (`budget_micro_batch_rows`),
    each its rows selected with every tensor the rollout carries. Its loss weighs its share of the minibatch's
    `loss_units` over all processes (`accumulation_weights`), so the weighted losses are the loss of the whole
    minibatch at once under `normalization`; its metrics weigh its share of the minibatch's response tokens on all
    processes (times their number, as the loss weights), so that a token-mean metric of the micro-batches is the
    minibatch's token mean whatever the loss normalisation and whichever rows share a micro-batch. The counts
    reach the host once per minibatch: one reduction over processes, one read of every micro-batch's counts."""
    row_units = torch.stack(
        [loss_units(rollout.response_mask, normalization), loss_units(rollout.response_mask, "token")]
    )
    units, token_units = accelerator.reduce(row_units[:, minibatch].sum(-1), reduction="mean").tolist()  # per process
    if micro_batch_tokens is None:
        chunks = micro_batch_rows(minibatch, rollout.lengths, rollout.response_lengths, micro_batch_size, layout)
    else:
        chunks = budget_micro_batch_rows(
            accelerator, minibatch, rollout.lengths, rollout.response_lengths, micro_batch_tokens, layout
        )
    chunk_units, chunk_tokens = torch.stack([row_units[:, rows].sum(-1) for rows in chunks], dim=1).tolist()  # (2, K)
    weights = accumulation_weights(chunk_units, units)
    return [
        MicroBatch(rollout.select(rows), weight, tokens / token_units if token_units else 0.0)
        for rows, weight, tokens in zip(chunks, weights, chunk_tokens)
    ]


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
