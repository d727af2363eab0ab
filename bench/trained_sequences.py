"""What an offline stage trained on, recorded the same way on both sides of bench/vs_trl.py, so that the two can be
shown to read the same tokens: every sequence the model read (its non-pad token ids, in order) and how many of
them, from its start, are context that carries no loss (SFT and DPO: the prompt; the reward model: 0, it scores
the whole sequence). The summary does not depend on order or batching: the same sequences give the same digest
whichever side collated them and however it padded or shared their prompt.
"""

from __future__ import annotations

import hashlib

import torch


class TrainedSequences:
    def __init__(self):
        self.rows: list[tuple[tuple[int, ...], int]] = []

    def add(self, ids: torch.Tensor, context: int) -> None:
        """One sequence: its token ids (1-D, pads removed) and its context length."""
        self.rows.append((tuple(ids.tolist()), int(context)))

    def summary(self) -> dict:
        """sequences, tokens (all of them), loss_tokens (those after the context) and a digest of the sorted rows."""
        digest = hashlib.sha256(repr(sorted(self.rows)).encode()).hexdigest()[:16]
        return {
            "sequences": len(self.rows),
            "tokens": sum(len(ids) for ids, _ in self.rows),
            "loss_tokens": sum(len(ids) - context for ids, context in self.rows),
            "digest": digest,
        }
