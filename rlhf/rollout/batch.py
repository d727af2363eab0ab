"""The rollout batch: prompts and their sampled responses, and how a stage samples them.

Shared by PPO, GRPO, RAFT, online DPO and evaluation (generation: rlhf.rollout.generate; no-grad passes:
rlhf.rollout.forward). Prompts are left-padded for generation (Huang et al. 2024,
detail 2), so every prompt ends at the same column and the KV cache serves them all. A finished
batch of rollouts is then stored *right-padded*, one block of aligned tensors,

    input_ids       (B, T)   [prompt][response ... EOS][padding]     T = longest prompt + response
    attention_mask  (B, T)   1 on prompt and response tokens (a prefix of each row)
    response_mask   (B, T)   True on response tokens, the EOS included

so a forward pass over a few rows needs only as many columns as their longest row
(`forward_in_chunks` sorts rows by length and trims each chunk). Per-token quantities (log-probs,
values, rewards) use the same (B, T) layout, aligned with the token they belong to
(`rlhf.models.modeling.token_logprobs`), and are masked by `response_mask`. Position ids come from the
attention mask, so a row scores the same in either padding layout.

Contracts:
- Sampling uses the KV cache (`generate`); the pad token is never sampled. Given one seed per
  row (`row_seeds`, `sampling_seeds`), row i's response depends on its prompt, the policy and its
  seed alone, not on which process or batch generates it: a run on W processes samples what a run
  on one does (Gumbel-max with a generator per row, `RowSeededSampling`).
- A response is cut after its first EOS; everything after it is padding, outside
  `response_mask`. A response that never produced EOS is *unfinished* (`Rollout.finished`).
- Log-probs of the sampled tokens are recomputed by a plain forward pass with the logits divided
  by the sampling temperature (Huang et al. 2024, detail 11) -- the same function the training
  loss uses, so at the start of an update the PPO ratio is exactly 1. The test suite checks they
  match the log-probs of `generate`'s own logits. With top_p < 1 or top_k > 0 the tokens come
  from a truncated distribution that these log-probs do not model (keep both off for RL).
- The reward is read at the response's last real token (the EOS of a finished response). A
  reward model with a different tokenizer gets the decoded prompt and response re-tokenized.
- Forward-only passes run under no_grad in chunks of `batch_size` rows, larger than training
  micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class SamplingConfig:
    max_new_tokens: int
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0


def eval_sampling(cfg) -> SamplingConfig:
    """The test evaluation's decoding (`eval.max_new_tokens`, `eval.temperature`, `eval.top_p`). part4_eval samples
    every model with it, and every stage's held-out validation does too, so that a setting chosen on validation
    is chosen at the decoding it is tested at."""
    return SamplingConfig(cfg.eval.max_new_tokens, temperature=cfg.eval.temperature, top_p=cfg.eval.top_p)


@dataclass
class Responses:
    """A batch of sampled responses. Lists are per row; ids exclude padding and include EOS if any."""

    response_ids: list[list[int]]
    texts: list[str]  # decoded without the EOS token
    finished: list[bool]  # True when the response ended with EOS


@dataclass
class Rollout:
    """Prompts and their sampled responses as aligned, right-padded (B, T) tensors (module docstring)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long, 1 on a prefix of each row
    response_mask: torch.Tensor  # (B, T) bool
    finished: torch.Tensor  # (B,) bool: the response ended with EOS
    # Log-probs at the sampling temperature from generate()'s own logits (B, T), 0 outside the
    # response; only when asked for (tests and diagnostics).
    generation_logprobs: torch.Tensor | None = None
    # What a training stage derives from the rollouts, attached once computed (`dataclasses.replace`) so that
    # `select` slices it with the tokens; each 0 outside the response where per token, None until computed.
    old_logprobs: torch.Tensor | None = None  # (B, T) the trainer's log-probs before the update (PPO's pi_old)
    ref_logprobs: torch.Tensor | None = None  # (B, T) the reference policy's
    values: torch.Tensor | None = None  # (B, T) V_old: the critic's value of each token's state
    returns: torch.Tensor | None = None  # (B, T) GAE's value targets
    advantages: torch.Tensor | None = None  # (B, T) per token (PPO), or (B,) one per response (GRPO)
    scores: torch.Tensor | None = None  # (B,) each response's training score
    rows: torch.Tensor | None = None  # (B,) after `select`: each row's index in the batch it was selected from

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(-1)  # (B,) prompt + response tokens

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)  # (B,) tokens, EOS included

    def select(self, rows: torch.Tensor | list[int]) -> Rollout:
        """The rollouts of `rows` (any order, repeats allowed), every tensor with them, trimmed to their longest
        row: (B, T) -> (b, t), (B,) -> (b,)."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)
        width = int(self.lengths[rows].max()) if len(rows) else 0
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value[rows] if value.dim() == 1 else value[rows, :width]
            picked[f.name] = value
        picked["rows"] = picked["rows"] if self.rows is not None else rows  # a selection of a selection: the first
        return Rollout(**picked)

    def to(self, device) -> Rollout:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return Rollout(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in moved.items()})

    def prompt_ids(self) -> list[list[int]]:
        prompt_mask = self.attention_mask.bool() & ~self.response_mask
        return [row[mask].tolist() for row, mask in zip(self.input_ids, prompt_mask)]

    def response_ids(self) -> list[list[int]]:
        """Each row's response ids, EOS included when it has one."""
        return [row[mask].tolist() for row, mask in zip(self.input_ids, self.response_mask)]

    def texts(self, tokenizer) -> list[str]:
        """Responses decoded without their EOS."""
        rows = [ids[:-1] if done else ids for ids, done in zip(self.response_ids(), self.finished.tolist())]
        return tokenizer.batch_decode(rows, skip_special_tokens=False)


def chunks(n: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def pack_rollout(
    prompt_ids: list[list[int]],
    response_ids: list[list[int]],
    finished: list[bool],
    pad_id: int,
    response_logprobs: list[list[float]] | None = None,
) -> Rollout:
    """A `Rollout` from per-row token lists, as an engine that samples outside `generate` returns them:
    row i = prompt_ids[i] then response_ids[i] (EOS included when finished[i]), right-padded to the
    longest row; response_logprobs[i] (one per response token) become `generation_logprobs`."""
    lengths = [len(p) + len(r) for p, r in zip(prompt_ids, response_ids)]
    T = max(lengths)
    input_ids = torch.full((len(prompt_ids), T), pad_id, dtype=torch.long)  # (B, T)
    response_mask = torch.zeros((len(prompt_ids), T), dtype=torch.bool)  # (B, T)
    logprobs = None if response_logprobs is None else torch.zeros((len(prompt_ids), T))  # (B, T)
    for i, (prompt, response) in enumerate(zip(prompt_ids, response_ids)):
        start, end = len(prompt), len(prompt) + len(response)
        input_ids[i, :end] = torch.tensor(prompt + response, dtype=torch.long)
        response_mask[i, start:end] = True
        if logprobs is not None:
            logprobs[i, start:end] = torch.tensor(response_logprobs[i], dtype=torch.float32)
    attention_mask = (torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    return Rollout(input_ids, attention_mask, response_mask, torch.tensor(finished, dtype=torch.bool), logprobs)
