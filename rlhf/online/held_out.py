"""Held-out evaluation of an RL policy against SFT: sampling, gold and reward scores, the final comparison."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from rlhf import task
from rlhf.benchmarks.ifeval import instruction_reward
from rlhf.core.batching import encode_texts
from rlhf.core.winrates import head_to_head
from rlhf.models.training import forward_map
from rlhf.online.prompts import RLPrompts
from rlhf.online.stats import gold_scores
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.evaluation import sample_for_eval
from rlhf.rollout.generate import sample_responses, sampling_seeds


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
        if "instruction_reward" in policy:
            row.update(
                instruction_reward=policy["instruction_reward"][i], sft_instruction_reward=sft["instruction_reward"][i]
            )
        rows.append(row)
    return rows


def summarize_samples(prompts: list[str], samples: dict, gold: bool, fields: list[dict] | None = None) -> dict:
    """Means over one policy's held-out samples (`sample_for_eval`): reward_mean, kl_to_ref,
    length_mean, eos_rate; with gold=True (embedded task) also gold_score_mean and gold_good_rate,
    and the per-prompt gold scores are stored in samples["gold"]. With verifiable instruction prompts (`fields`
    holding their instruction ids, data.instructions) also instruction_reward_mean (the share of instructions the
    strict checker passes) and instruction_prompt_pass_rate (prompts whose every instruction passes), per prompt
    in samples["instruction_reward"]."""

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
    if fields and "instruction_id_list" in fields[0]:
        samples["instruction_reward"] = instruction_reward(fields, prompts, [r.strip() for r in samples["responses"]])
        summary.update(
            instruction_reward_mean=mean(samples["instruction_reward"]),
            instruction_prompt_pass_rate=mean([float(r == 1.0) for r in samples["instruction_reward"]]),
        )
    return summary


def gold_against_sft(policy_scores: list[float], sft_scores: list[float]) -> dict:
    """The gold judge's verdict on a policy's held-out answers against SFT's to the same prompts (the same seeds),
    under the keys every policy stage publishes: both means and good rates, the head-to-head (`head_to_head`:
    gold_win_rate_vs_sft = (wins + ties/2) / n, gold_win_rate_ci95 its 95% paired score interval,
    gold_sign_test_p the exact sign test of wins vs losses) and gold_delta, the change in mean score."""
    match = head_to_head(policy_scores, sft_scores)
    results = {
        "gold_score_mean": sum(policy_scores) / len(policy_scores),
        "sft_gold_score_mean": sum(sft_scores) / len(sft_scores),
        "gold_good_rate": sum(float(task.is_good_score(s)) for s in policy_scores) / len(policy_scores),
        "sft_gold_good_rate": sum(float(task.is_good_score(s)) for s in sft_scores) / len(sft_scores),
        "gold_win_rate_vs_sft": match["win_rate"],
        "gold_wins": match["wins"],
        "gold_losses": match["losses"],
        "gold_ties": match["ties"],
        "gold_win_rate_ci95": [match["ci95_low"], match["ci95_high"]],
        "gold_sign_test_p": match["sign_test_p"],
    }
    results["gold_delta"] = results["gold_score_mean"] - results["sft_gold_score_mean"]
    return results


def compare_with_sft(prompts: list[str], policy: dict, sft: dict, gold: bool, fields: list[dict] | None = None) -> dict:
    """Summary of the final policy against the SFT policy on the same held-out prompts.

    policy, sft: per-prompt lists {"responses", "rewards", "lengths", "finished", "kl"}, sampled with the same
    settings and seed. With gold=True (embedded task) the gold judge scores both and decides the head-to-head
    (`gold_against_sft`); the reward model's head-to-head is reported too. With verifiable instruction prompts
    (`fields`), the checkers' scores of both too.
    """
    ours, theirs = summarize_samples(prompts, policy, gold, fields), summarize_samples(prompts, sft, gold, fields)
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
        results.update(gold_against_sft(policy["gold"], sft["gold"]))
    if "instruction_reward_mean" in ours:
        for key in ("instruction_reward_mean", "instruction_prompt_pass_rate"):
            results[key], results[f"sft_{key}"] = ours[key], theirs[key]
        results["instruction_reward_delta"] = ours["instruction_reward_mean"] - theirs["instruction_reward_mean"]
    return results


def eval_due(iteration: int, eval_every: int, iterations: int) -> bool:
    """Whether the policy after `iteration` iterations gets a held-out evaluation: at 0 (before
    training) and every `eval_every`, but not after the last, which the final evaluation covers
    with the same prompts, settings and seed (and logs under the same keys)."""
    return eval_every > 0 and iteration % eval_every == 0 and iteration < iterations


@dataclass
class HeldOut:
    """An online stage's held-out check: its held-out prompts, each sampled through `engine` from its own seed at the
    test's decoding (`rlhf.rollout.batch.eval_sampling`), scored by the frozen reward model (and the gold judge on the
    embedded task), with the policy's KL measured to the SFT policy. The seeds draw nothing from torch's RNG:
    training's random stream is the same with or without the checks. With no held-out prompts
    (`<stage>.eval_prompts=0`, the way to skip it) nothing is sampled."""

    engine: object
    reward_model: object
    tokenizer: object
    prompts: RLPrompts
    sampling: SamplingConfig
    seed: int
    batch_size: int
    accelerator: object
    gold: bool

    def _sample(self, policy, reference=None, desc: str | None = None) -> dict[str, list]:
        return sample_for_eval(
            self.engine,
            policy,
            self.tokenizer,
            self.prompts.eval_ids,
            self.sampling,
            self.seed,
            self.batch_size,
            self.reward_model,
            self.accelerator,
            reference=reference,
            desc=desc,
        )

    def metrics(self, stage: str, policy, sft_policy) -> dict[str, float]:
        """The policy now: `summarize_samples` as `<stage>/eval/*` metrics; {} without held-out prompts."""
        if not self.prompts.eval_ids:
            return {}
        samples = self._sample(policy, sft_policy)
        return eval_metrics(
            stage, summarize_samples(self.prompts.eval_texts, samples, self.gold, self.prompts.eval_fields)
        )

    def against_sft(self, policy, sft_policy, stage: str | None = None) -> tuple[dict, list[dict]]:
        """The final policy against the SFT policy, both with the same seeds -> (the `compare_with_sft` summary,
        per-prompt `eval_rows` for eval_samples.jsonl); ({"eval_prompts": 0}, []) without held-out prompts.
        `stage` names the two progress bars (None: no bars)."""
        if not self.prompts.eval_ids:
            return {"eval_prompts": 0}, []
        policy_eval = self._sample(policy, sft_policy, desc=stage and f"[{stage}] held-out: the policy")
        sft_eval = self._sample(sft_policy, desc=stage and f"[{stage}] held-out: SFT")
        results = compare_with_sft(
            self.prompts.eval_texts, policy_eval, sft_eval, gold=self.gold, fields=self.prompts.eval_fields
        )
        return results, eval_rows(self.prompts.eval_texts, policy_eval, sft_eval)


@dataclass
class HeldOutSamples:
    """The offline DPO stage's held-out check, which loads no reward model and samples without an engine: each of
    `prompts` sampled by `generate` from its own seed (`sampling_seeds(seed, 0, ...)`, whichever process it is
    sharded to; torch's RNG is left alone) at `sampling`, in batches of `batch_size`; with `gold` (the embedded
    task) the gold judge compares a policy's answers with the SFT policy's (`sample_sft` first), under the keys of
    every policy stage's held-out comparison (`gold_against_sft`)."""

    tokenizer: object
    prompts: list[str]
    sampling: SamplingConfig
    seed: int
    batch_size: int
    accelerator: object
    gold: bool
    sft_samples: list[tuple[str, bool]] = field(default_factory=list)  # (response, finished) per prompt
    sft_scores: list[float] = field(default_factory=list)  # their gold scores (with `gold`)

    def sample(self, model) -> list[tuple[str, bool]]:
        """(response, finished) of `model` for every prompt."""
        model = self.accelerator.unwrap_model(model).eval()  # generate() lives on the unwrapped module

        def one_batch(batch: list[tuple[int, str]]) -> list[tuple[str, bool]]:
            ids = encode_texts(self.tokenizer, [prompt for _, prompt in batch])
            with self.accelerator.autocast():
                out = sample_responses(model, self.tokenizer, ids, self.sampling, row_seeds=[s for s, _ in batch])
            return list(zip(out.texts, out.finished))

        seeds = sampling_seeds(self.seed, 0, range(len(self.prompts)))
        return forward_map(one_batch, list(zip(seeds, self.prompts)), self.batch_size, self.accelerator)

    def sample_sft(self, sft_model) -> None:
        """The SFT policy's samples (and their gold scores), which every later comparison is against."""
        self.sft_samples = self.sample(sft_model)
        if self.gold:
            self.sft_scores = [task.gold_score(p, text) for p, (text, _) in zip(self.prompts, self.sft_samples)]

    def against_sft(self, samples: list[tuple[str, bool]]) -> tuple[dict, list[float]]:
        """The gold judge on a policy's `samples` against SFT's -> (`gold_against_sft`, the policy's scores)."""
        scores = [task.gold_score(p, text) for p, (text, _) in zip(self.prompts, samples)]
        return gold_against_sft(scores, self.sft_scores), scores


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
    if results["kl_to_ref"] < 0:  # the report's footnote, where the console reader sees the number
        line += " (a sampled estimate: below 0 means no measurable move from SFT)"
    if "gold_score_mean" in results:
        line += (
            f"; gold {results['gold_score_mean']:.3f} (SFT {results['sft_gold_score_mean']:.3f}), "
            f"gold win rate vs SFT {results['gold_win_rate_vs_sft']:.3f}"
        )
    if "instruction_reward_mean" in results:
        line += (
            f"; instructions followed {results['instruction_reward_mean']:.3f} "
            f"(SFT {results['sft_instruction_reward_mean']:.3f}), all followed "
            f"{results['instruction_prompt_pass_rate']:.3f} (SFT {results['sft_instruction_prompt_pass_rate']:.3f})"
        )
    return line
