"""DPO's shared machinery, used by the offline stage (part3_dpo/train_dpo.py) and online DPO
(part3_dpo/train_online_dpo.py): per-pair log-probs from one `[prompt][chosen][rejected]` row, the reference
log-probs (precomputed or on the fly), the loss function chosen from `rlhf.core.losses.DPO_LOSSES`, and the
throughput meter."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlhf.core.batching import (
    EncodedPair,
    chosen_longer,
    collate_shared_prompt_pairs,
    length_order,
    shared_prompt_pair_length,
)
from rlhf.core.losses import DPO_AVERAGES_LOGPS, DPO_LOSSES, chosen_nll_loss, length_heuristic_dpo_loss
from rlhf.core.ops import sequence_logps
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import shared_prompt_response_logprobs
from rlhf.models.training import forward_map


def pair_logps(model, batch: dict, average: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Chosen and rejected log-probs from ONE forward pass over the B rows of `collate_shared_prompt_pairs`,
    `[prompt][chosen][rejected]` with the prompt computed once for both: sums over each response's own
    columns (response + EOS, never prompt or pad), or means when `average` (IPO)."""
    logprobs = shared_prompt_response_logprobs(model, batch)  # (B, T)
    chosen_columns, rejected_columns = response_columns(batch)  # (B, T) each
    return sequence_logps(logprobs, chosen_columns, average), sequence_logps(logprobs, rejected_columns, average)


def response_columns(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, T) masks of the chosen response's own columns and the rejected one's (response + EOS, no prompt, no pad)."""
    return batch["chosen_mask"] & ~batch["rejected_mask"], batch["rejected_mask"] & ~batch["chosen_mask"]


def add_chosen_nll(loss, stats, policy_chosen_logps, chosen_tokens, rpo_alpha: float, average: bool):
    """RPO: the DPO-family loss plus rpo_alpha x the chosen responses' per-token NLL
    (`rlhf.core.losses.chosen_nll_loss`), logged as `nll/chosen`; rpo_alpha = 0 returns the loss unchanged.
    Length-averaged logps (IPO) are per token already."""
    if not rpo_alpha:
        return loss, stats
    nll = chosen_nll_loss(policy_chosen_logps, torch.ones_like(chosen_tokens) if average else chosen_tokens)
    return loss + rpo_alpha * nll, {**stats, "nll/chosen": nll.detach()}


def split_logps(model, pairs: list[EncodedPair], collate, batch_size: int, accelerator, average: bool) -> torch.Tensor:
    """(N, 2) [chosen, rejected] log-probs of every pair, in their original order; forward-only,
    batched by length and sharded over processes."""

    def score(batch_pairs):
        batch = {k: v.to(accelerator.device) for k, v in collate(batch_pairs).items()}
        with accelerator.autocast():
            chosen, rejected = pair_logps(model, batch, average)
        return torch.stack([chosen, rejected], dim=1).float().cpu().tolist()  # (B, 2)

    model.eval()
    return torch.tensor(
        forward_map(score, pairs, batch_size, accelerator, lengths=[shared_prompt_pair_length(p) for p in pairs])
    )  # (N, 2)


def indexed_pairs(collate: Callable[[list], dict], pairs: list[EncodedPair], indices: list[int]) -> dict:
    """The collated batch of `pairs[i] for i in indices`, with `index` (B,): each row's position in `pairs`, by
    which `PrecomputedReference.batch` finds its reference log-probs."""
    return {**collate([pairs[i] for i in indices]), "index": torch.tensor(indices)}


@dataclass
class PreferenceSplits:
    """The offline DPO stage's pairs, tokenized once, by split (train, val, test), with the rows they came from:
    each pair collated as one `[prompt][chosen][rejected]` row cut to `truncation` (prompt tokens, response tokens
    with the EOS), scored forward-only in batches of `batch_size`, sharded over the accelerator's processes, as
    sums of the responses' log-probs or their means when `average` (IPO)."""

    pairs: dict[str, list[EncodedPair]]
    rows: dict[str, list[dict]]
    pad_token_id: int
    truncation: tuple[int, int]
    batch_size: int
    accelerator: object
    average: bool

    def collate(self, batch_pairs: list[EncodedPair]) -> dict:
        return collate_shared_prompt_pairs(batch_pairs, self.pad_token_id, *self.truncation)

    def collate_train(self, indices: list[int]) -> dict:
        """A training batch by train indices, with their `index` (the loop's examples are indices, so a batch
        finds its precomputed reference log-probs)."""
        return indexed_pairs(self.collate, self.pairs["train"], indices)

    def logps(self, model, split: str) -> torch.Tensor:
        """(N, 2) [chosen, rejected] log-probs of `split`'s pairs under `model` (`split_logps`)."""
        return split_logps(model, self.pairs[split], self.collate, self.batch_size, self.accelerator, self.average)

    def evaluate(self, model, split: str, reference, objective: DPOObjective) -> dict[str, float]:
        """`objective` on `split` against `reference` as `dpo/<split>/*` metrics: the loss, its stats (the
        implicit-reward accuracy `rewards/accuracies`, margins, ...) and, where the rows carry gold scores, how often
        the implicit reward prefers the response the gold judge prefers (`gold_accuracy`)."""
        policy_logps, ref = self.logps(model, split), reference.split(split)  # (N, 2) each
        cap = self.truncation[1]  # lengths as collated
        chosen_lengths = torch.tensor([min(len(pair.chosen_ids), cap) for pair in self.pairs[split]])  # (N,)
        rejected_lengths = torch.tensor([min(len(pair.rejected_ids), cap) for pair in self.pairs[split]])  # (N,)
        loss, stats = objective(
            policy_logps[:, 0],
            policy_logps[:, 1],
            ref[:, 0],
            ref[:, 1],
            length_order(chosen_lengths, rejected_lengths),
            chosen_lengths,
        )
        metrics = {f"dpo/{split}/loss": loss.item(), **{f"dpo/{split}/{k}": v.item() for k, v in stats.items()}}
        rows = self.rows[split]
        if "gold_chosen" in rows[0]:
            implicit_prefers_chosen = ((policy_logps[:, 0] - ref[:, 0]) > (policy_logps[:, 1] - ref[:, 1])).tolist()
            gold_prefers_chosen = [row["gold_chosen"] > row["gold_rejected"] for row in rows]
            metrics[f"dpo/{split}/gold_accuracy"] = sum(
                a == g for a, g in zip(implicit_prefers_chosen, gold_prefers_chosen)
            ) / len(rows)
        return metrics


class PrecomputedReference:
    """Reference log-probs from the one forward-only pass, looked up by each batch row's `index` (`indexed_pairs`)."""

    def __init__(self, logps: dict[str, torch.Tensor]):
        self.logps = logps  # split -> (N, 2)

    def batch(self, batch: dict, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.logps[split][batch["index"].cpu()].to(batch["input_ids"].device)  # (B, 2)
        return rows[:, 0], rows[:, 1]

    def split(self, split: str) -> torch.Tensor:
        return self.logps[split]


class OnTheFlyReference:
    """The reference model kept in memory, scoring each batch as it comes (no autograd)."""

    def __init__(self, model, average: bool, score_split: Callable[[object, str], torch.Tensor], accelerator):
        self.model, self.average, self.score_split, self.accelerator = model.eval(), average, score_split, accelerator

    @torch.no_grad()
    def batch(self, batch: dict, split: str) -> tuple[torch.Tensor, torch.Tensor]:
        with self.accelerator.autocast():
            return pair_logps(self.model, batch, self.average)

    def split(self, split: str) -> torch.Tensor:
        return self.score_split(self.model, split)


@torch.no_grad()
def local_pair_logps(
    model, pairs: list[EncodedPair], collate, batch_size: int, accelerator, average: bool
) -> torch.Tensor:
    """(N, 2) [chosen, rejected] log-probs of this process's own pairs, in order, forward-only, in batches of
    `batch_size`; means when `average` (IPO). No sharding: online DPO's pairs are already one process's share."""
    model.eval()
    rows = []
    for start in range(0, len(pairs), batch_size):
        batch = {k: v.to(accelerator.device) for k, v in collate(pairs[start : start + batch_size]).items()}
        with accelerator.autocast():
            chosen, rejected = pair_logps(model, batch, average)
        rows.append(torch.stack([chosen, rejected], dim=1).float().cpu())  # (b, 2)
    return torch.cat(rows) if rows else torch.zeros(0, 2)


@dataclass(frozen=True)
class DPOObjective:
    """The DPO family's objective on per-pair sequence log-probs, the same for training and for held-out
    evaluation: the loss chosen from `DPO_LOSSES` by `loss_type`, or with `length_heuristic` > 0 (sigmoid only)
    the length-heuristic rater's (`length_heuristic_dpo_loss`), plus `rpo_alpha` x the chosen responses' per-token
    NLL (RPO; 0: none). -> (loss, stats: rewards/*, logps/*, nll/chosen)."""

    loss_type: str
    beta: float
    label_smoothing: float = 0.0
    length_heuristic: float = 0.0
    rpo_alpha: float = 0.0

    @property
    def average(self) -> bool:
        """Whether the loss reads per-token averages of the log-probs rather than their sums (IPO)."""
        return DPO_AVERAGES_LOGPS[self.loss_type]

    def __call__(self, policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_is_longer, chosen_tokens):
        """All (N,): log-probs of each pair's responses, whether its chosen response is the longer, and its
        chosen response's tokens."""
        if self.length_heuristic:
            loss, stats = length_heuristic_dpo_loss(
                policy_chosen,
                policy_rejected,
                ref_chosen,
                ref_rejected,
                self.beta,
                chosen_is_longer,
                self.length_heuristic,
            )
        else:
            loss, stats = DPO_LOSSES[self.loss_type](
                policy_chosen, policy_rejected, ref_chosen, ref_rejected, self.beta, self.label_smoothing
            )
        return add_chosen_nll(loss, stats, policy_chosen, chosen_tokens, self.rpo_alpha, self.average)


def make_loss_fn(
    loss_type: str,
    beta: float,
    label_smoothing: float,
    reference,
    extra_stats=lambda batch: {},
    length_heuristic: float = 0.0,
    rpo_alpha: float = 0.0,
):
    """The training step's loss (`rlhf.loop.step.LossFn`): policy log-probs (one concatenated forward) vs
    reference log-probs, through `DPOObjective`; the stats are the objective's plus `extra_stats`, in the `train/`
    group (`train/rewards/margins`)."""
    objective = DPOObjective(loss_type, beta, label_smoothing, length_heuristic, rpo_alpha)

    def loss_fn(model, batch):
        policy_chosen, policy_rejected = pair_logps(model, batch, objective.average)  # (B,), (B,)
        ref_chosen, ref_rejected = reference.batch(batch, "train")  # (B,), (B,)
        chosen_tokens = response_columns(batch)[0].sum(-1)  # (B,)
        loss, stats = objective(
            policy_chosen, policy_rejected, ref_chosen, ref_rejected, chosen_longer(batch), chosen_tokens
        )
        return loss, {f"train/{name}": value for name, value in {**stats, **extra_stats(batch)}.items()}

    return loss_fn


def pair_tokens(batch: dict) -> int:
    """Non-pad tokens of a `collate_shared_prompt_pairs` batch: each row's prompt once, then both responses."""
    return int((batch["chosen_mask"] | batch["rejected_mask"]).sum())


class Throughput:
    """Tokens the policy computes per second since training began (all processes), and peak memory. A pair's row
    is `[prompt][chosen][rejected]`: its tokens are the positions of either sequence, the prompt counted once, pads
    never. (Summing its (B, 1, T, T) attention mask would count query-key entries, about T times too many.)"""

    def __init__(self, accelerator):
        self.accelerator, self.tokens, self.start = accelerator, 0, time.perf_counter()
        self.source = peak_memory_mb(accelerator.device)[1]

    def __call__(self, batch: dict) -> dict[str, torch.Tensor]:
        self.tokens += pair_tokens(batch) * self.accelerator.num_processes
        rate = self.tokens / max(time.perf_counter() - self.start, 1e-9)
        device = self.accelerator.device
        return {
            "tokens_per_s": torch.tensor(rate, device=device),
            f"peak_memory_mb_{self.source}": torch.tensor(peak_memory_mb(device)[0], device=device),
        }
