"""The training passes' shared pieces: shifted log-probs, minibatches, loss units and accumulation."""

from __future__ import annotations

import torch
from torch import Tensor

from rlhf.config import PPOConfig
from rlhf.group_rows import pack_groups, packed_entropy, packed_logits, packed_token_logprobs
from rlhf.models import position_ids_from_mask
from rlhf.ops import entropy_from_logits, gather_logprobs
from rlhf.rollout import Rollout


def shifted_logprobs(logits: Tensor, input_ids: Tensor, temperature: float) -> Tensor:
    """Log-prob of each token under the distribution that produced it, at the sampling temperature.

    logits: (B, T, V) from a forward pass over input_ids (B, T) -> (B, T), aligned with the tokens:
    column t uses the logits at t - 1; column 0 is 0. The same as `rlhf.models.token_logprobs`.
    """
    return torch.nn.functional.pad(gather_logprobs(logits[:, :-1], input_ids[:, 1:], temperature), (1, 0))


def shifted_entropy(logits: Tensor, temperature: float) -> Tensor:
    """Entropy of the next-token distribution that produced each token, at the temperature;
    (B, T, V) -> (B, T), column 0 is 0."""
    return torch.nn.functional.pad(entropy_from_logits(logits[:, :-1], temperature), (1, 0))


def align_values(position_values: Tensor) -> Tensor:
    """Value of the state in which each token was chosen: column t gets the value head's output at
    position t - 1 (Huang et al. 2024 read values at context_length - 1 : -1). (B, T) -> (B, T)."""
    return torch.nn.functional.pad(position_values[:, :-1], (1, 0))


def minibatch_indices(n: int, num_minibatches: int, generator: torch.Generator, group_size: int = 1) -> list[Tensor]:
    """A fresh random split of n rollouts into num_minibatches equal parts (one epoch); with
    `group_size` > 1, a split of whole groups of consecutive rows, each group's rows in order."""
    order = torch.randperm(n // group_size, generator=generator)  # (n / G,)
    order = (order[:, None] * group_size + torch.arange(group_size)).reshape(-1)  # (n,)
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
    group_size: int = 1,
) -> list[tuple[Tensor, int, float]]:
    """Split one minibatch of rollout rows into micro-batches for gradient accumulation.

    minibatch: (n,) row indices; lengths: (B,) tokens per row; response_mask: (B, T) bool.
    Rows are sorted by length (stably), so similar lengths share a micro-batch; with `group_size`
    > 1 the minibatch is whole groups (`minibatch_indices`), kept whole and sorted by their packed
    width (`rlhf.group_rows`), and `micro_batch_size` must be a multiple of it. -> one
    (rows, t, weight) per micro-batch: its row indices, the columns it needs (past its longest
    row, all is padding) and its `accumulation_weights` weight (`units_per_process` as there).
    """
    if group_size > 1:
        groups = minibatch.view(-1, group_size)  # (n / G, G)
        response_tokens = response_mask[groups].sum(-1)  # (n / G, G)
        prompt_tokens = lengths[groups[:, 0]] - response_tokens[:, 0]  # (n / G,)
        widths = prompt_tokens + response_tokens.sum(-1)  # (n / G,) the packed rows' widths
        minibatch = groups[torch.argsort(widths, stable=True)].reshape(-1)
    else:
        minibatch = minibatch[torch.argsort(lengths[minibatch], stable=True)]
    weights = accumulation_weights(response_mask[minibatch], micro_batch_size, normalization, units_per_process)
    chunks = [minibatch[k * micro_batch_size : (k + 1) * micro_batch_size] for k in range(len(weights))]
    return [(rows, int(lengths[rows].max()), weight) for rows, weight in zip(chunks, weights)]


def policy_token_pass(
    policy: torch.nn.Module, rollout: Rollout, rows: Tensor, temperature: float, group_size: int = 1
) -> tuple[Tensor, Tensor]:
    """The policy's training forward pass over rollout rows -> (b, t) log-probs of their tokens at the
    sampling temperature (differentiable) and (b, t) entropy of the distributions that produced them
    (no grad), aligned with the tokens, t = the rows' longest. With `group_size` > 1, `rows` are whole
    groups of rows sharing a prompt and each group is one packed row (`rlhf.group_rows`)."""
    chunk = rollout.select(rows)
    if group_size > 1:
        packed = pack_groups(chunk, group_size)
        logits = packed_logits(policy, packed)  # (g, W, V)
        with torch.no_grad():
            entropy = packed_entropy(logits.detach(), packed, temperature)
        return packed_token_logprobs(logits, packed, chunk.input_ids, temperature), entropy
    logits = policy(
        input_ids=chunk.input_ids,
        attention_mask=chunk.attention_mask,
        position_ids=position_ids_from_mask(chunk.attention_mask),
        use_cache=False,
    ).logits  # (b, t, V)
    with torch.no_grad():
        entropy = shifted_entropy(logits.detach(), temperature)
    return shifted_logprobs(logits, chunk.input_ids, temperature), entropy


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
