"""A policy sampled for evaluation: one response per prompt from the prompt's own seed, scored by the reward model,
with its KL to a reference. The held-out checks of every stage and the evaluation stage sample through it."""

from __future__ import annotations

import torch

from rlhf.analysis.evaluation import sequence_kl
from rlhf.models.training import forward_map
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.forward import rollout_logprobs, score_rollout
from rlhf.rollout.generate import sampling_seeds

EVAL_STREAM = -1  # the `sampling_seeds` stream of held-out evaluations (training iterations use 0, 1, ...)


@torch.no_grad()
def sample_for_eval(
    engine,
    policy,
    tokenizer,
    prompt_ids: list[list[int]],
    sampling: SamplingConfig,
    seed: int,
    batch_size: int,
    reward_model,
    accelerator,
    reference=None,
    stream: int = EVAL_STREAM,
    sampler_logprobs: bool = False,
    desc: str | None = None,
) -> dict[str, list]:
    """Sample one response per prompt from `policy` through `engine` (`rlhf.rollout.engines`) and score it with the
    reward model (None: rewards of 0); with `reference`, also the sequence KL of each response to it. The prompts are
    sharded over processes and gathered; prompt i samples from its own seed (`sampling_seeds(seed, stream, ...)`),
    so two policies see the same random numbers and the results do not depend on the number of processes.
    `sampler_logprobs`: the policy's log-probs for the KL from the sampler's own logits where they are the policy's
    (below), not a forward pass; then a policy identical to the reference gets a KL within ~1e-4 of 0 rather than
    exactly 0. `desc` names a progress bar over the batches (None: none).
    -> per-prompt lists: responses, response_ids (EOS included), rewards, lengths, finished, kl."""
    policy.eval()
    engine.load(policy)
    # hf in float32 samples from the policy itself: generate's own logits give the policy's log-probs (within 3e-5
    # per token of a forward pass's on SmolLM2-135M) and save that pass. Under autocast the cached decode drifts
    # further from a full pass, and vLLM's are another kernel's: then the policy is scored by a forward pass.
    own_logprobs = (
        sampler_logprobs
        and reference is not None
        and engine.name == "hf"
        and accelerator.mixed_precision == "no"
        and sampling.temperature > 0
    )

    def one_batch(batch: list[tuple[int, list[int]]]) -> list[dict]:
        rollout = engine.sample([ids for _, ids in batch], sampling, [s for s, _ in batch], with_logprobs=own_logprobs)
        # Under the stage's autocast, as its training-time passes: a prepared policy autocasts by itself, but the
        # SFT policy, the reference and the reward model would otherwise run in float32 under bf16.
        with accelerator.autocast():
            rewards = (  # (b,); no reward model (a benchmark scores by its own rules): zeros
                score_rollout(reward_model, rollout, batch_size)
                if reward_model is not None
                else torch.zeros(len(batch))
            )
            kl = torch.zeros_like(rewards)
            if reference is not None:
                policy_logprobs = (
                    rollout.generation_logprobs
                    if own_logprobs
                    else rollout_logprobs(policy, rollout, sampling.temperature, batch_size)
                )
                kl = sequence_kl(
                    policy_logprobs,
                    rollout_logprobs(reference, rollout, sampling.temperature, batch_size),
                    rollout.response_mask,
                )
        return [
            {"response": text, "response_ids": ids, "reward": r, "length": n, "finished": f, "kl": k}
            for text, ids, r, n, f, k in zip(
                rollout.texts(tokenizer),
                rollout.response_ids(),
                rewards.tolist(),
                rollout.response_lengths.tolist(),
                rollout.finished.tolist(),
                kl.tolist(),
            )
        ]

    seeds = sampling_seeds(seed, stream, range(len(prompt_ids)))
    items = forward_map(one_batch, list(zip(seeds, prompt_ids)), batch_size, accelerator, desc=desc)
    return {
        "responses": [i["response"] for i in items],
        "response_ids": [i["response_ids"] for i in items],
        "rewards": [i["reward"] for i in items],
        "lengths": [i["length"] for i in items],
        "finished": [i["finished"] for i in items],
        "kl": [i["kl"] for i in items],
    }
