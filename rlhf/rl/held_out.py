"""Held-out evaluation of an RL policy against SFT: sampling, gold and reward scores, the final comparison."""

from __future__ import annotations

import json
import math

import torch

from rlhf import task
from rlhf.evaluation import sequence_kl
from rlhf.rl.prompts import RLPrompts
from rlhf.rl.stats import gold_scores, head_to_head
from rlhf.rollout import SamplingConfig, rollout_logprobs, sampling_seeds, score_rollout
from rlhf.training import forward_map

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
) -> dict[str, list]:
    """Sample one response per prompt from `policy` through `engine` (`rlhf.engines`) and score it with the reward
    model; with `reference`, also the sequence KL of each response to it. The prompts are sharded over processes
    and gathered; prompt i samples from its own seed (`sampling_seeds(seed, stream, ...)`), so two policies see
    the same random numbers and the results do not depend on the number of processes. `sampler_logprobs`: the
    policy's log-probs for the KL from the sampler's own logits where they are the policy's (below), not a forward
    pass; then a policy identical to the reference gets a KL within ~1e-4 of 0 rather than exactly 0.
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
            rewards = score_rollout(reward_model, rollout, batch_size)  # (b,)
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
    items = forward_map(one_batch, list(zip(seeds, prompt_ids)), batch_size, accelerator)
    return {
        "responses": [i["response"] for i in items],
        "response_ids": [i["response_ids"] for i in items],
        "rewards": [i["reward"] for i in items],
        "lengths": [i["length"] for i in items],
        "finished": [i["finished"] for i in items],
        "kl": [i["kl"] for i in items],
    }


def append_samples(
    path,
    iteration: int,
    prompts: list[str],
    responses: list[str],
    scores: list[float],
    finished: list[bool],
    gold: bool,
) -> None:
    """Append training samples (prompt, response, score; gold score on the embedded task) to a JSONL file."""
    with open(path, "a", encoding="utf-8") as handle:
        for prompt, response, score, done in zip(prompts, responses, scores, finished):
            row = {"iteration": iteration, "prompt": prompt, "response": response, "score": score, "finished": done}
            if gold:
                row["gold_score"] = task.gold_score(prompt, response)
            handle.write(json.dumps(row) + "\n")


def eval_rows(prompts: list[str], policy: dict, sft: dict) -> list[dict]:
    """Per-prompt rows of the final comparison (after `compare_with_sft`, which adds gold scores)."""
    rows = []
    for i, prompt in enumerate(prompts):
        row = {
            "prompt": prompt,
            "response": policy["responses"][i],
            "reward": policy["rewards"][i],
            "kl": policy["kl"][i],
            "sft_response": sft["responses"][i],
            "sft_reward": sft["rewards"][i],
        }
        if "gold" in policy:
            row.update(gold_score=policy["gold"][i], sft_gold_score=sft["gold"][i])
        rows.append(row)
    return rows


def summarize_samples(prompts: list[str], samples: dict, gold: bool) -> dict:
    """Means over one policy's held-out samples (`sample_for_eval`): reward_mean, kl_to_ref,
    length_mean, eos_rate; with gold=True (embedded task) also gold_score_mean and gold_good_rate,
    and the per-prompt gold scores are stored in samples["gold"]."""

    def mean(values):
        return sum(values) / len(values) if values else math.nan

    summary = {
        "reward_mean": mean(samples["rewards"]),
        "kl_to_ref": mean(samples["kl"]),
        "length_mean": mean(samples["lengths"]),
        "eos_rate": mean([float(f) for f in samples["finished"]]),
    }
    if gold:
        samples["gold"] = gold_scores(prompts, samples["responses"])
        summary.update(
            gold_score_mean=mean(samples["gold"]),
            gold_good_rate=mean([float(task.is_good_score(s)) for s in samples["gold"]]),
        )
    return summary


def compare_with_sft(prompts: list[str], policy: dict, sft: dict, gold: bool) -> dict:
    """Summary of the final policy against the SFT policy on the same held-out prompts.

    policy, sft: per-prompt lists {"responses", "rewards", "lengths", "finished", "kl"}, sampled
    with the same settings and seed. With gold=True (embedded task) the gold judge scores both and
    decides the head-to-head (`head_to_head`: gold_win_rate_ci95 is its 95% paired score interval,
    gold_sign_test_p the exact sign test of wins vs losses); the reward model's head-to-head is
    reported too.
    """
    ours, theirs = summarize_samples(prompts, policy, gold), summarize_samples(prompts, sft, gold)
    results = {
        "eval_prompts": len(prompts),
        "reward_mean": ours["reward_mean"],
        "sft_reward_mean": theirs["reward_mean"],
        "length_mean": ours["length_mean"],
        "sft_length_mean": theirs["length_mean"],
        "eos_rate": ours["eos_rate"],
        "sft_eos_rate": theirs["eos_rate"],
        "kl_to_ref": ours["kl_to_ref"],
    }
    results["reward_delta"] = results["reward_mean"] - results["sft_reward_mean"]
    reward_h2h = head_to_head(policy["rewards"], sft["rewards"])
    results["reward_win_rate_vs_sft"] = reward_h2h["win_rate"]
    if gold:
        gold_h2h = head_to_head(policy["gold"], sft["gold"])
        results.update(
            {
                "gold_score_mean": ours["gold_score_mean"],
                "sft_gold_score_mean": theirs["gold_score_mean"],
                "gold_good_rate": ours["gold_good_rate"],
                "sft_gold_good_rate": theirs["gold_good_rate"],
                "gold_win_rate_vs_sft": gold_h2h["win_rate"],
                "gold_wins": gold_h2h["wins"],
                "gold_losses": gold_h2h["losses"],
                "gold_ties": gold_h2h["ties"],
                "gold_win_rate_ci95": [gold_h2h["ci95_low"], gold_h2h["ci95_high"]],
                "gold_sign_test_p": gold_h2h["sign_test_p"],
            }
        )
        results["gold_delta"] = results["gold_score_mean"] - results["sft_gold_score_mean"]
    return results


def evaluate_against_sft(
    engine,
    policy,
    sft_policy,
    reward_model,
    tokenizer,
    prompts: RLPrompts,
    sampling: SamplingConfig,
    seed: int,
    batch_size: int,
    accelerator,
    gold: bool,
) -> tuple[dict, list[dict]]:
    """The final policy against the SFT policy on the held-out prompts, both sampled through `engine` with the
    test's decoding (`rlhf.rollout.eval_sampling`) and the same seed; the policy's KL is measured to the SFT policy.
    -> (the `compare_with_sft` summary, per-prompt `eval_rows` for eval_samples.jsonl); with no
    held-out prompts (`<stage>.eval_prompts=0`, the way to skip it) nothing is sampled: ({"eval_prompts": 0}, [])."""
    if not prompts.eval_ids:
        return {"eval_prompts": 0}, []
    policy_eval = sample_for_eval(
        engine,
        policy,
        tokenizer,
        prompts.eval_ids,
        sampling,
        seed,
        batch_size,
        reward_model,
        accelerator,
        reference=sft_policy,
    )
    sft_eval = sample_for_eval(
        engine, sft_policy, tokenizer, prompts.eval_ids, sampling, seed, batch_size, reward_model, accelerator
    )
    results = compare_with_sft(prompts.eval_texts, policy_eval, sft_eval, gold=gold)
    return results, eval_rows(prompts.eval_texts, policy_eval, sft_eval)


def eval_due(iteration: int, eval_every: int, iterations: int) -> bool:
    """Whether the policy after `iteration` iterations gets a held-out evaluation: at 0 (before
    training) and every `eval_every`, but not after the last, which the final evaluation covers
    with the same prompts, settings and seed (and logs under the same keys)."""
    return eval_every > 0 and iteration % eval_every == 0 and iteration < iterations


def held_out_eval(
    stage: str,
    engine,
    policy,
    sft_policy,
    reward_model,
    tokenizer,
    prompts: RLPrompts,
    sampling: SamplingConfig,
    seed: int,
    batch_size: int,
    accelerator,
    gold: bool,
) -> dict[str, float]:
    """The policy now, on the held-out prompts: `summarize_samples` as `<stage>/eval/*` metrics, with
    the KL measured to the SFT policy. Sampled with the final evaluation's per-prompt seeds, which
    draw nothing from torch's RNG: training's random stream is the same with or without eval_every.
    No metrics when there are no held-out prompts (`<stage>.eval_prompts=0`)."""
    if not prompts.eval_ids:
        return {}
    samples = sample_for_eval(
        engine,
        policy,
        tokenizer,
        prompts.eval_ids,
        sampling,
        seed,
        batch_size,
        reward_model,
        accelerator,
        reference=sft_policy,
    )
    return eval_metrics(stage, summarize_samples(prompts.eval_texts, samples, gold))


def eval_metrics(stage: str, results: dict) -> dict[str, float]:
    """The numbers of a results dict as `<stage>/eval/<key>` metrics (flags, None, lists and strings left out)."""
    return {
        f"{stage}/eval/{key}": value
        for key, value in results.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def final_line(stage: str, results: dict) -> str:
    """The stage's last console line: reward-model score and KL of the final policy against SFT,
    and on the embedded task the gold scores and gold win rate; or that there was no evaluation."""
    if "reward_mean" not in results:
        return f"[{stage}] no held-out evaluation ({stage}.eval_prompts=0)"
    line = (
        f"[{stage}] RM score {results['reward_mean']:+.3f} (SFT {results['sft_reward_mean']:+.3f}), "
        f"KL to ref {results['kl_to_ref']:.2f} nats"
    )
    if "gold_score_mean" in results:
        line += (
            f"; gold {results['gold_score_mean']:.3f} (SFT {results['sft_gold_score_mean']:.3f}), "
            f"gold win rate vs SFT {results['gold_win_rate_vs_sft']:.3f}"
        )
    return line
