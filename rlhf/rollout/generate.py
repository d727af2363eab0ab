"""Sampling a `Rollout` with transformers' `generate`: one random stream per prompt row, the KV cache
prefilled once for prompts a batch repeats, responses cut after their first EOS (rlhf.rollout.batch has the layout)."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Iterable

import torch
from transformers import (
    DynamicCache,
    LogitsProcessor,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rlhf.core.batching import left_pad
from rlhf.core.ops import gather_logprobs
from rlhf.models.modeling import inner_model
from rlhf.rollout.batch import Responses, Rollout, SamplingConfig, chunks


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


@torch.no_grad()
def sample_responses(
    model, tokenizer, prompt_ids: list[list[int]], sampling: SamplingConfig, row_seeds: list[int] | None = None
) -> Responses:
    """Sample one response per prompt with the KV cache (one seed per row: `generate_rollout`).
    The pad token is never sampled."""
    rollout = generate_rollout(model, tokenizer, prompt_ids, sampling, row_seeds=row_seeds)
    return Responses(rollout.response_ids(), rollout.texts(tokenizer), rollout.finished.tolist())
