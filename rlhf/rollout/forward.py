"""No-grad passes over a rollout: log-probs of its tokens and reward-model scores, in chunks of rows sorted
narrowest first (`RowLayout` says what a forward row holds), returned in the rollout's row order."""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlhf.core.batching import collate_sequences, encode_texts
from rlhf.models.modeling import reward_scores
from rlhf.rollout.batch import Rollout, chunks
from rlhf.rollout.layout import ROWS, RowLayout


@torch.no_grad()
def forward_in_chunks(fn: Callable[..., torch.Tensor | tuple], rollout: Rollout, batch_size: int):
    """fn(input_ids, attention_mask) over chunks of at most `batch_size` rows, with no autograd.

    Rows are sorted by length so each chunk is trimmed to its own longest row. fn returns a tensor
    or a tuple of tensors, per token (b, t) or per row (b,); each comes back in the original row
    order, per-token ones padded with 0 to (B, T).
    """
    return forward_rows(lambda chunk: fn(chunk.input_ids, chunk.attention_mask), rollout, batch_size, ROWS)


@torch.no_grad()
def forward_rows(call: Callable[[Rollout], torch.Tensor | tuple], rollout: Rollout, batch_size: int, layout: RowLayout):
    """call(chunk) over chunks of at most `batch_size` rows (at least one forward row of `layout`), narrowest forward
    rows first, each chunk a `Rollout` trimmed to its longest row, with no autograd; its outputs, per token (b, t) or
    per row (b,), put back in the rollout's row order, per-token ones padded with 0 to (B, T)."""
    B, T = rollout.input_ids.shape
    order = layout.narrowest_first(
        torch.arange(B, device=rollout.lengths.device), rollout.lengths, rollout.response_lengths
    )
    pieces: list[tuple] = []
    for rows in chunks(B, layout.chunk_rows(batch_size)):
        chunk = rollout.select(order[rows])
        out = call(chunk)
        out = out if isinstance(out, tuple) else (out,)
        width = chunk.input_ids.shape[1]
        pieces.append(tuple(torch.nn.functional.pad(o, (0, T - width)) if o.dim() == 2 else o for o in out))
    results = []
    for parts in zip(*pieces):
        stacked = torch.cat(parts)
        result = torch.empty_like(stacked)
        result[order] = stacked
        results.append(result)
    return results[0] if len(results) == 1 else tuple(results)


def rollout_logprobs(
    model, rollout: Rollout, temperature: float, batch_size: int, layout: RowLayout = ROWS
) -> torch.Tensor:
    """(B, T) log-probs of the rollout's tokens at the sampling temperature, 0 outside the response.

    The same computation as the training loss (`token_logprobs`), so a policy scored here and
    trained on at once has ratio exactly 1; used for the policy (old log-probs) and the reference.
    A packed `layout` reads each group of rows sharing a prompt as one forward row (`rlhf.rollout.layout`):
    the same log-probs for one pass over the prompt.
    """
    logprobs = forward_rows(lambda chunk: layout.token_logprobs(model, chunk, temperature), rollout, batch_size, layout)
    return torch.where(rollout.response_mask, logprobs, 0.0)


def same_tokenizer(a, b) -> bool:
    """True when token ids mean the same thing to both tokenizers (same vocabulary and special ids)."""
    if a is b:
        return True
    return a.get_vocab() == b.get_vocab() and a.eos_token_id == b.eos_token_id and a.pad_token_id == b.pad_token_id


def retokenize(
    rollout: Rollout, policy_tokenizer, reward_tokenizer, max_tokens: int | None = None
) -> dict[str, torch.Tensor]:
    """The rollout's prompts and responses as text, re-tokenized for a reward model with another
    tokenizer: `[prompt][response][EOS if finished]`, right-padded. `max_tokens` keeps the newest
    tokens of an over-long prompt (the reward is read at the end, so the response is kept whole)."""
    prompts = policy_tokenizer.batch_decode(rollout.prompt_ids(), skip_special_tokens=False)
    responses = encode_texts(reward_tokenizer, rollout.texts(policy_tokenizer))
    responses = [
        ids + [reward_tokenizer.eos_token_id] if done else ids
        for ids, done in zip(responses, rollout.finished.tolist())
    ]
    prompt_ids = encode_texts(reward_tokenizer, prompts)
    if max_tokens is not None:
        prompt_ids = [p[-max(max_tokens - len(r), 1) :] for p, r in zip(prompt_ids, responses)]
    batch = collate_sequences(prompt_ids, responses, reward_tokenizer.pad_token_id)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


@torch.no_grad()
def score_rollout(
    reward_model,
    rollout: Rollout,
    batch_size: int,
    policy_tokenizer=None,
    reward_tokenizer=None,
    max_tokens: int | None = None,
    layout: RowLayout = ROWS,
) -> torch.Tensor:
    """(B,) reward-model scores, read at each response's last real token.

    With the policy's tokenizer (or none given) the rollout's own ids are scored, in `layout`'s forward rows
    (`rlhf.rollout.layout`); otherwise prompt and response are decoded and re-tokenized with `reward_tokenizer`
    (`retokenize`).
    """
    if reward_tokenizer is None or same_tokenizer(policy_tokenizer, reward_tokenizer):
        return forward_rows(lambda chunk: layout.reward_scores(reward_model, chunk), rollout, batch_size, layout)
    device = rollout.input_ids.device
    batch = retokenize(rollout, policy_tokenizer, reward_tokenizer, max_tokens)
    return torch.cat(
        [
            reward_scores(reward_model, batch["input_ids"][rows].to(device), batch["attention_mask"][rows].to(device))
            for rows in chunks(batch["input_ids"].shape[0], batch_size)
        ]
    )
