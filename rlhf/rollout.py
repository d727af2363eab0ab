"""The rollout engine: sample responses from a policy, recompute their log-probs, score them.

Shared by PPO, GRPO and evaluation. Prompts are left-padded for generation (Huang et al. 2024,
detail 2), so every prompt ends at the same column and the KV cache serves them all. A finished
batch of rollouts is then stored *right-padded*, one block of aligned tensors,

    input_ids       (B, T)   [prompt][response ... EOS][padding]     T = longest prompt + response
    attention_mask  (B, T)   1 on prompt and response tokens (a prefix of each row)
    response_mask   (B, T)   True on response tokens, the EOS included

so a forward pass over a few rows needs only as many columns as their longest row
(`forward_in_chunks` sorts rows by length and trims each chunk). Per-token quantities (log-probs,
values, rewards) use the same (B, T) layout, aligned with the token they belong to
(`rlhf.models.token_logprobs`), and are masked by `response_mask`. Position ids come from the
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

import hashlib
import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields

import torch
from transformers import (
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlhf.batching import collate_sequences, encode_texts, left_pad
from rlhf.group_rows import PackedGroups, pack_groups, packed_logits, packed_reward_scores, packed_token_logprobs
from rlhf.models import inner_model, reward_scores, token_logprobs
from rlhf.ops import gather_logprobs


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

    @property
    def lengths(self) -> torch.Tensor:
        return self.attention_mask.sum(-1)  # (B,) prompt + response tokens

    @property
    def response_lengths(self) -> torch.Tensor:
        return self.response_mask.sum(-1)  # (B,) tokens, EOS included

    def select(self, rows: torch.Tensor | list[int]) -> Rollout:
        """The rollouts of `rows` (any order, repeats allowed), trimmed to their longest row."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.input_ids.device)
        width = int(self.lengths[rows].max()) if len(rows) else 0
        picked = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.Tensor):
                value = value[rows] if value.dim() == 1 else value[rows, :width]
            picked[f.name] = value
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


def truncate_after_eos(generated: torch.Tensor, eos_id: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keep tokens up to and including the first EOS of each row; pad the rest.

    generated: (B, R) new tokens only. Returns (ids (B, R), response_mask (B, R) bool).
    """
    is_eos = generated == eos_id  # (B, R)
    eos_seen_before = (is_eos.long().cumsum(-1) - is_eos.long()) > 0  # (B, R) an EOS strictly earlier
    response_mask = ~eos_seen_before
    return generated.masked_fill(~response_mask, pad_id), response_mask


def sampling_seeds(seed: int, stream: int, rows: Iterable[int]) -> list[int]:
    """One sampling seed per row of a global batch, a function of (seed, stream, row) alone; e.g.
    stream = the iteration, rows = this process's slice of the batch (`RowSeededSampling`)."""
    return [
        int.from_bytes(hashlib.sha256(f"{seed}/{stream}/{row}".encode()).digest()[:8], "little") >> 1 for row in rows
    ]


def local_sampling_seeds(seed: int, stream: int, rank: int, local_batch: int) -> list[int]:
    """The seeds of process `rank`'s rows of a global batch that each process fills with `local_batch`
    consecutive rows (process r: rows r * local_batch onwards), as the online stages' rollouts do: row i
    of the global batch samples from its own seed, so W processes draw what one would."""
    return sampling_seeds(seed, stream, range(rank * local_batch, (rank + 1) * local_batch))


class RowSeededSampling(LogitsProcessor):
    """Sampling with one random stream per row, for greedy `generate`: the scores are tempered and
    truncated (top-k, top-p) as `generate` would, then get Gumbel noise from the row's own
    generator; argmax(log p + Gumbel) is a sample of p (the Gumbel-max trick, Gumbel 1954; Maddison
    et al. 2014, arXiv 1411.0030). scores: (b, V) -> (b, V)."""

    def __init__(self, seeds: list[int], sampling: SamplingConfig, device):
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]
        self.warpers = LogitsProcessorList([TemperatureLogitsWarper(sampling.temperature)])
        if sampling.top_k > 0:
            self.warpers.append(TopKLogitsWarper(sampling.top_k))
        if sampling.top_p < 1:
            self.warpers.append(TopPLogitsWarper(sampling.top_p))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = self.warpers(input_ids, scores)  # (b, V)
        uniform = torch.stack(
            [torch.rand(scores.shape[1], generator=g, device=scores.device) for g in self.generators]
        )  # (b, V)
        return scores - torch.log(-torch.log(uniform)).to(scores.dtype)


def chunks(n: int, size: int) -> list[slice]:
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def shared_prompt_cache(model, prompt_ids: list[list[int]], input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Prompts repeated in a generation batch (a GRPO group, RAFT's N samples of a prompt) prefilled once:
    -> `generate` keyword arguments holding a KV cache of every prompt but its last column, computed over the
    distinct prompts and repeated to each row, so `generate` runs only the last column before decoding; {} when
    no prompt repeats. input_ids, attention_mask: (b, P) left-padded, every prompt ending at column P - 1.
    """
    first_row: dict[tuple[int, ...], int] = {}  # each distinct prompt -> its first row
    for row, prompt in enumerate(prompt_ids):
        first_row.setdefault(tuple(prompt), row)
    if len(first_row) == len(prompt_ids) or input_ids.shape[1] < 2:
        return {}
    distinct = {prompt: k for k, prompt in enumerate(first_row)}
    source = torch.tensor([distinct[tuple(prompt)] for prompt in prompt_ids], device=input_ids.device)  # (b,)
    firsts = torch.tensor(list(first_row.values()), device=input_ids.device)  # (u,)
    context, context_mask = input_ids[firsts, :-1], attention_mask[firsts, :-1]  # (u, P - 1)
    cache = DynamicCache(config=model.config)
    name = cache_argument(model)
    model(
        input_ids=context,
        attention_mask=context_mask,
        position_ids=(context_mask.cumsum(-1) - 1).clamp(min=0),
        **{name: cache},
        use_cache=True,
    )
    cache.batch_select_indices(source)  # each layer's (u, ...) keys and values -> (b, ...)
    return {name: cache}


def cache_argument(model) -> str:
    """The KV cache's keyword in this transformers version: `cache` (5.2x on), `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(inner_model(model).forward).parameters else "past_key_values"


@torch.no_grad()
def generate_rollout(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    sampling: SamplingConfig,
    batch_size: int | None = None,
    return_generation_logprobs: bool = False,
    row_seeds: list[int] | None = None,
) -> Rollout:
    """Sample one response per prompt with the KV cache, `batch_size` prompts per generate() call.

    `model` is a causal LM (unwrapped). Rows keep the order of `prompt_ids`; repeat a prompt to
    get several samples of it (GRPO groups). With `row_seeds` (one per prompt, `sampling_seeds`)
    each row samples from its own seed (`RowSeededSampling`); otherwise from torch's global RNG.
    """
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    device = next(model.parameters()).device
    prompts = left_pad(prompt_ids, pad_id)  # (B, P) each
    width = prompts["input_ids"].shape[1]
    greedy = sampling.temperature == 0
    pieces, logprob_pieces = [], []
    seeded = row_seeds is not None and not greedy
    for rows in chunks(len(prompt_ids), batch_size or len(prompt_ids)):
        # Row-seeded sampling is greedy decoding over noised scores: generate() itself draws nothing.
        processors = [RowSeededSampling(row_seeds[rows], sampling, device)] if seeded else []
        input_ids, attention_mask = prompts["input_ids"][rows].to(device), prompts["attention_mask"][rows].to(device)
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            **shared_prompt_cache(model, prompt_ids[rows], input_ids, attention_mask),
            do_sample=not (greedy or seeded),
            temperature=None if greedy or seeded else sampling.temperature,
            top_p=None if greedy or seeded else sampling.top_p,
            top_k=None if greedy or seeded else sampling.top_k,
            logits_processor=LogitsProcessorList(processors),
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=eos_id,
            pad_token_id=pad_id,
            suppress_tokens=[pad_id],
            return_dict_in_generate=True,
            output_logits=return_generation_logprobs,
        )
        generated = out.sequences[:, width:]  # (b, R_chunk)
        pieces.append(generated)
        if return_generation_logprobs:
            raw_logits = torch.stack(out.logits, dim=1)  # (b, R_chunk, V), before any logits processor
            logprob_pieces.append(gather_logprobs(raw_logits, generated, max(sampling.temperature, 1e-8)))

    # Chunks stop at different lengths: pad every chunk to the longest, marking the padding.
    longest = max(piece.shape[1] for piece in pieces)
    generated = torch.cat(
        [torch.nn.functional.pad(p, (0, longest - p.shape[1]), value=pad_id) for p in pieces]
    )  # (B, R)
    produced = torch.cat(
        [torch.arange(longest, device=device).expand(p.shape[0], -1) < p.shape[1] for p in pieces]
    )  # (B, R)
    ids, keep = truncate_after_eos(generated, eos_id, pad_id)
    keep &= produced  # (B, R)
    finished = ((ids == eos_id) & keep).any(-1)  # (B,)

    # Re-pack right-padded: row i = its p_i prompt tokens, then its r_i response tokens.
    left = torch.cat([prompts["input_ids"].to(device), ids], dim=1)  # (B, P + R) [pad][prompt][response][pad]
    prompt_lengths = prompts["attention_mask"].sum(-1).to(device)  # (B,)
    response_lengths = keep.sum(-1)  # (B,)
    total = prompt_lengths + response_lengths  # (B,)
    T = int(total.max())
    columns = torch.arange(T, device=device)  # (T,)
    source = (width - prompt_lengths)[:, None] + columns  # (B, T) column in `left`
    real = columns < total[:, None]  # (B, T)
    input_ids = torch.where(real, left.gather(1, source.clamp(max=left.shape[1] - 1)), pad_id)  # (B, T)
    response_mask = real & (columns >= prompt_lengths[:, None])  # (B, T)
    generation_logprobs = None
    if return_generation_logprobs:
        logprobs = torch.cat(
            [torch.nn.functional.pad(lp, (0, longest - lp.shape[1])) for lp in logprob_pieces]
        )  # (B, R)
        logprobs = torch.nn.functional.pad(logprobs, (width, 0))  # (B, P + R)
        generation_logprobs = torch.where(
            response_mask, logprobs.gather(1, source.clamp(max=left.shape[1] - 1)), 0.0
        )  # (B, T)
    return Rollout(input_ids, real.long(), response_mask, finished, generation_logprobs)


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


@torch.no_grad()
def sample_responses(
    model, tokenizer, prompt_ids: list[list[int]], sampling: SamplingConfig, row_seeds: list[int] | None = None
) -> Responses:
    """Sample one response per prompt with the KV cache (one seed per row: `generate_rollout`).
    The pad token is never sampled."""
    rollout = generate_rollout(model, tokenizer, prompt_ids, sampling, row_seeds=row_seeds)
    return Responses(rollout.response_ids(), rollout.texts(tokenizer), rollout.finished.tolist())


# ----------------------------------------------------------------------------- forward-only passes


@torch.no_grad()
def forward_in_chunks(fn: Callable[..., torch.Tensor | tuple], rollout: Rollout, batch_size: int):
    """fn(input_ids, attention_mask) over chunks of at most `batch_size` rows, with no autograd.

    Rows are sorted by length so each chunk is trimmed to its own longest row. fn returns a tensor
    or a tuple of tensors, per token (b, t) or per row (b,); each comes back in the original row
    order, per-token ones padded with 0 to (B, T).
    """
    order = torch.argsort(rollout.lengths, stable=True)
    return _in_row_order(lambda chunk: fn(chunk.input_ids, chunk.attention_mask), rollout, order, batch_size)


@torch.no_grad()
def forward_groups_in_chunks(
    fn: Callable[[PackedGroups, Rollout], torch.Tensor], rollout: Rollout, group_size: int, batch_size: int
):
    """fn(packed, chunk) over chunks of whole groups (`rlhf.group_rows`), at most `batch_size` rows
    each (at least one group), with no autograd: `chunk` is the chunk's rows as a `Rollout`, `packed`
    the same rows one group per row. Consecutive `group_size` rows of `rollout` must share a prompt.

    Groups are sorted by packed width (the prompt plus its G responses), so each chunk's packed rows
    carry little padding. fn returns per-token (n, t) or per-row (n,) values of the chunk's rows;
    they come back in the original row order, per-token ones padded with 0 to (B, T).
    """
    groups = rollout.input_ids.shape[0] // group_size
    response_tokens = rollout.response_lengths.view(groups, group_size).sum(-1)  # (groups,)
    prompt_tokens = (rollout.lengths - rollout.response_lengths)[::group_size]  # (groups,)
    group_order = torch.argsort(prompt_tokens + response_tokens, stable=True)  # (groups,)
    members = torch.arange(group_size, device=group_order.device)
    order = (group_order[:, None] * group_size + members).reshape(-1)  # (B,) whole groups, narrowest first
    step = max(batch_size // group_size, 1) * group_size
    return _in_row_order(lambda chunk: fn(pack_groups(chunk, group_size), chunk), rollout, order, step)


def _in_row_order(call: Callable[[Rollout], torch.Tensor | tuple], rollout: Rollout, order: torch.Tensor, step: int):
    """call(chunk) on consecutive `step` rows of `order` (each chunk trimmed to its longest row), its
    outputs put back in the rollout's row order; per-token (b, t) ones padded with 0 to (B, T)."""
    B, T = rollout.input_ids.shape
    pieces: list[tuple] = []
    for rows in chunks(B, step):
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


def rollout_logprobs(model, rollout: Rollout, temperature: float, batch_size: int, group_size: int = 1) -> torch.Tensor:
    """(B, T) log-probs of the rollout's tokens at the sampling temperature, 0 outside the response.

    The same computation as the training loss (`token_logprobs`), so a policy scored here and
    trained on at once has ratio exactly 1; used for the policy (old log-probs) and the reference.
    With `group_size` > 1 each group of consecutive rows sharing a prompt is one packed row
    (`rlhf.group_rows`): the same log-probs for one pass over the prompt.
    """
    if group_size > 1:
        logprobs = forward_groups_in_chunks(
            lambda packed, chunk: packed_token_logprobs(
                packed_logits(model, packed), packed, chunk.input_ids, temperature
            ),
            rollout,
            group_size,
            batch_size,
        )
    else:
        logprobs = forward_in_chunks(
            lambda ids, mask: token_logprobs(model, ids, mask, temperature), rollout, batch_size
        )
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
    group_size: int = 1,
) -> torch.Tensor:
    """(B,) reward-model scores, read at each response's last real token.

    With the policy's tokenizer (or none given) the rollout's own ids are scored, a group of
    `group_size` consecutive rows sharing a prompt as one packed row when > 1 (`rlhf.group_rows`);
    otherwise prompt and response are decoded and re-tokenized with `reward_tokenizer` (`retokenize`).
    """
    if reward_tokenizer is None or same_tokenizer(policy_tokenizer, reward_tokenizer):
        if group_size > 1:
            return forward_groups_in_chunks(
                lambda packed, chunk: packed_reward_scores(reward_model, packed), rollout, group_size, batch_size
            )
        return forward_in_chunks(lambda ids, mask: reward_scores(reward_model, ids, mask), rollout, batch_size)
    device = rollout.input_ids.device
    batch = retokenize(rollout, policy_tokenizer, reward_tokenizer, max_tokens)
    return torch.cat(
        [
            reward_scores(reward_model, batch["input_ids"][rows].to(device), batch["attention_mask"][rows].to(device))
            for rows in chunks(batch["input_ids"].shape[0], batch_size)
        ]
    )
