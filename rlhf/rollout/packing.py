"""A GRPO group as one row: its prompt computed once for its G responses.

A GRPO batch holds each prompt G times, as consecutive rows of a `rlhf.rollout.batch.Rollout`. Packed,
a group is one row

    [prompt][response 1][response 2] ... [response G][padding]

with a 4-D attention mask (`rlhf.core.batching.shared_prompt_attention`): causal, and each response
sees the prompt and itself only, its position ids restarting after the prompt. Every response token
then computes exactly what it does in its own `[prompt][response]` row, so its log-prob, its entropy
and the reward read at its response's end are unchanged (tested to 1e-5), for one pass over the
prompt instead of G. This is the shared-prompt pair row of the reward model and DPO
(`rlhf.core.batching.collate_shared_prompt_pairs`) with G responses instead of two.

Outputs come back in the rollout's right-padded (n, T) layout, aligned with the tokens as
`rlhf.models.modeling.token_logprobs` aligns them, so the losses are the same code in both layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from rlhf.core.batching import shared_prompt_attention
from rlhf.core.ops import entropy_from_logits, upcast
from rlhf.models.modeling import read_rewards, shared_prompt_attention_mask, shared_prompt_hidden_states

if TYPE_CHECKING:
    from rlhf.rollout.batch import Rollout


@dataclass
class PackedGroups:
    """n rollout rows (n / G groups) packed one group per row; g = n / G rows of W columns."""

    input_ids: Tensor  # (g, W) long; padding holds id 0, which no real token attends
    position_ids: Tensor  # (g, W) long: a token's position in its own [prompt][response] sequence
    attention_mask: Tensor  # (g, 1, W, W) bool, True where a query may attend a key
    row_group: Tensor  # (n,) the packed row holding each rollout row
    token_column: Tensor  # (n, T) the packed column of each rollout token; 0 on padding
    real: Tensor  # (n, T) bool: the rollout row's prompt and response tokens
    last_column: Tensor  # (n,) the packed column of each row's last token (where a reward is read)
    sequence_mask: Tensor  # (n, W) bool: the packed columns of each row's own sequence (prompt included)

    @property
    def predecessor(self) -> Tensor:
        """(n, T) the packed column whose logits predict each rollout token (column 0: 0): the
        previous token of the same sequence, which for a response's first token is the prompt's last."""
        return torch.nn.functional.pad(self.token_column[:, :-1], (1, 0))


def pack_groups(rollout: Rollout, group_size: int) -> PackedGroups:
    """Pack a rollout whose consecutive `group_size` rows share a prompt (a GRPO batch, or
    `Rollout.select` of whole groups of one) into one row per group.

    Raises ValueError when the rows of a group do not hold the same prompt tokens.
    """
    n, T = rollout.input_ids.shape
    if n % group_size:
        raise ValueError(f"{n} rows are not whole groups of {group_size}")
    g, device = n // group_size, rollout.input_ids.device
    lengths, response_lengths = rollout.lengths, rollout.response_lengths  # (n,) each
    prompt_lengths = lengths - response_lengths  # (n,)
    by_group = prompt_lengths.view(g, group_size)
    columns = torch.arange(T, device=device)  # (T,)
    is_prompt = columns < prompt_lengths[:, None]  # (n, T)
    first_rows = rollout.input_ids.view(g, group_size, T)[:, :1].expand(-1, group_size, -1).reshape(n, T)
    if (by_group != by_group[:, :1]).any() or ((rollout.input_ids != first_rows) & is_prompt).any():
        raise ValueError(f"consecutive groups of {group_size} rows must share their prompt")

    # Response k of a group starts after the prompt and the k responses before it.
    earlier = response_lengths.view(g, group_size).cumsum(-1) - response_lengths.view(g, group_size)  # (g, G)
    start = prompt_lengths + earlier.reshape(n)  # (n,)
    real = columns < lengths[:, None]  # (n, T)
    token_column = torch.where(is_prompt, columns, start[:, None] + columns - prompt_lengths[:, None])
    token_column = torch.where(real, token_column, 0)  # (n, T)
    width = int((by_group[:, 0] + response_lengths.view(g, group_size).sum(-1)).max())

    row_group = torch.arange(n, device=device) // group_size  # (n,)
    member = torch.arange(n, device=device) % group_size + 1  # (n,) response k of its group, from 1
    rows = row_group[:, None].expand(-1, T)[real]
    targets = token_column[real]
    input_ids = torch.zeros((g, width), dtype=torch.long, device=device)
    position_ids = torch.zeros((g, width), dtype=torch.long, device=device)
    segment = torch.full((g, width), -1, dtype=torch.long, device=device)  # 0 prompt, k response k, -1 pad
    input_ids[rows, targets] = rollout.input_ids[real]  # a prompt token is written G times, the same id
    position_ids[rows, targets] = columns.expand(n, -1)[real]
    segment[rows, targets] = torch.where(is_prompt, 0, member[:, None])[real]
    own = segment[row_group]  # (n, W)
    return PackedGroups(
        input_ids=input_ids,
        position_ids=position_ids,
        attention_mask=shared_prompt_attention(segment),
        row_group=row_group,
        token_column=token_column,
        real=real,
        last_column=token_column.gather(1, (lengths - 1)[:, None]).squeeze(1),
        sequence_mask=(own == 0) | (own == member[:, None]),
    )


def check_packable(config, stage: str) -> None:
    """Fail at start-up, naming the setting, when the model cannot take a packed group's 4-D mask."""
    from rlhf.models.modeling import check_4d_mask_support

    check_4d_mask_support(config, fix=f"or set {stage}.pack_groups=false")


def packed_logits(model: nn.Module, packed: PackedGroups) -> Tensor:
    """(g, W, V) logits of a causal LM over packed rows; `model` may be wrapped (DDP, FSDP, LoRA)."""
    from accelerate.utils import extract_model_from_parallel

    config, dtype = extract_model_from_parallel(model).config, extract_model_from_parallel(model).dtype
    return model(
        input_ids=packed.input_ids,
        attention_mask=shared_prompt_attention_mask(config, packed.attention_mask, dtype),
        position_ids=packed.position_ids,
        use_cache=False,
    ).logits


def packed_token_logprobs(logits: Tensor, packed: PackedGroups, input_ids: Tensor, temperature: float) -> Tensor:
    """(n, T) log-prob of each rollout token at the sampling temperature, from the packed logits
    (g, W, V); float32, aligned with the tokens (column 0 and padding: 0). input_ids: the rollout's (n, T).

    log softmax(l / temperature)[token] = l[token] / temperature − logsumexp(l / temperature), the
    logsumexp taken once per packed column (a prompt column predicts G responses' first tokens),
    one packed row at a time, as `rlhf.core.ops.gather_logprobs` does for unpacked rows.
    """
    log_normalizer = torch.stack([torch.logsumexp(upcast(row) / temperature, dim=-1) for row in logits])  # (g, W)
    group, predecessor = packed.row_group[:, None], packed.predecessor  # (n, 1), (n, T)
    chosen = upcast(logits[group, predecessor, input_ids]) / temperature  # (n, T)
    logprobs = chosen - log_normalizer[group, predecessor]  # (n, T)
    keep = packed.real.clone()
    keep[:, 0] = False
    return torch.where(keep, logprobs, 0.0)


def packed_entropy(logits: Tensor, packed: PackedGroups, temperature: float) -> Tensor:
    """(n, T) entropy of the distribution that produced each rollout token (column 0 and padding: 0)."""
    entropy = entropy_from_logits(logits, temperature)  # (g, W)
    values = entropy[packed.row_group[:, None], packed.predecessor]  # (n, T)
    keep = packed.real.clone()
    keep[:, 0] = False
    return torch.where(keep, values, 0.0)


def packed_reward_scores(reward_model: nn.Module, packed: PackedGroups) -> Tensor:
    """(n,) reward-model scores, pooled as `rlhf.models.modeling.reward_scores` pools each row on its own."""
    hidden = shared_prompt_hidden_states(
        reward_model,
        {"input_ids": packed.input_ids, "attention_mask": packed.attention_mask, "position_ids": packed.position_ids},
    )  # (g, W, H)
    return read_rewards(reward_model, hidden, packed.row_group, packed.last_column, packed.sequence_mask)
