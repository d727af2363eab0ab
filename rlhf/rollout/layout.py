"""What one forward row holds: a rollout row on its own, or a group of rows packed over one copy of their prompt.

A GRPO group's G responses share their prompt. Packed (`grpo.pack_groups`), the G rows are read as one forward row,
`[prompt][response 1]...[response G]`, each response attending to the prompt and to itself alone
(rlhf.rollout.packing): the same log-probs and scores as G separate rows, for one pass over the prompt. Every pass
that reads a rollout (no-grad log-probs and scores, the training pass, the order of minibatches and micro-batches)
asks the layout, so the branch between the two lives here alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlhf.core.ops import shifted_entropy, shifted_logprobs
from rlhf.models.modeling import position_ids_from_mask, reward_scores, token_logprobs
from rlhf.rollout.batch import Rollout
from rlhf.rollout.packing import pack_groups, packed_entropy, packed_logits, packed_reward_scores, packed_token_logprobs


@dataclass(frozen=True)
class RowLayout:
    """`rows_per_pass` consecutive rollout rows (sharing a prompt) per forward row: 1, each row on its own; G > 1, a
    packed group. Shuffles, chunks and micro-batches keep a forward row's rollout rows together and in order."""

    rows_per_pass: int = 1

    @property
    def packed(self) -> bool:
        return self.rows_per_pass > 1

    def narrowest_first(self, rows: Tensor, lengths: Tensor, response_lengths: Tensor) -> Tensor:
        """`rows` (n,) reordered by the width of the forward row they are read in, narrowest first (stably): a row's
        length, or a packed group's prompt plus its G responses. lengths, response_lengths: (B,) per rollout row."""
        if not self.packed:
            return rows[torch.argsort(lengths[rows], stable=True)]
        groups = rows.view(-1, self.rows_per_pass)  # (n / G, G)
        response_tokens = response_lengths[groups]  # (n / G, G)
        prompt_tokens = lengths[groups[:, 0]] - response_tokens[:, 0]  # (n / G,)
        return groups[torch.argsort(prompt_tokens + response_tokens.sum(-1), stable=True)].reshape(-1)

    def chunk_rows(self, batch_size: int) -> int:
        """Rollout rows per no-grad chunk: `batch_size`, rounded down to whole groups (at least one)."""
        return max(batch_size // self.rows_per_pass, 1) * self.rows_per_pass

    def token_logprobs(self, model: torch.nn.Module, chunk: Rollout, temperature: float) -> Tensor:
        """(n, t) log-probs of the chunk's tokens at the sampling temperature, aligned with the tokens."""
        if self.packed:
            packed = pack_groups(chunk, self.rows_per_pass)
            return packed_token_logprobs(packed_logits(model, packed), packed, chunk.input_ids, temperature)
        return token_logprobs(model, chunk.input_ids, chunk.attention_mask, temperature)

    def training_pass(self, policy: torch.nn.Module, chunk: Rollout, temperature: float) -> tuple[Tensor, Tensor]:
        """The policy's training forward pass -> (n, t) log-probs at the sampling temperature (differentiable) and
        (n, t) entropy of the distributions that produced the tokens (no grad), aligned with the tokens."""
        if self.packed:
            packed = pack_groups(chunk, self.rows_per_pass)
            logits = packed_logits(policy, packed)  # (g, W, V)
            with torch.no_grad():
                entropy = packed_entropy(logits.detach(), packed, temperature)
            return packed_token_logprobs(logits, packed, chunk.input_ids, temperature), entropy
        logits = policy(
            input_ids=chunk.input_ids,
            attention_mask=chunk.attention_mask,
            position_ids=position_ids_from_mask(chunk.attention_mask),
            use_cache=False,
        ).logits  # (n, t, V)
        with torch.no_grad():
            entropy = shifted_entropy(logits.detach(), temperature)
        return shifted_logprobs(logits, chunk.input_ids, temperature), entropy

    def reward_scores(self, reward_model: torch.nn.Module, chunk: Rollout) -> Tensor:
        """(n,) reward-model scores of the chunk's rows, read at each response's last token."""
        if self.packed:
            return packed_reward_scores(reward_model, pack_groups(chunk, self.rows_per_pass))
        return reward_scores(reward_model, chunk.input_ids, chunk.attention_mask)


ROWS = RowLayout()  # each rollout row its own forward row
