"""Stage `reward`: a Bradley-Terry reward model initialised from the SFT policy.

    python part1_reward/train_reward.py --preset tiny

Reads `<run>/data/` and `<run>/sft/model/`, and the collect stage's pairs of SFT samples when
reward.pairs is `collected` or `both`; writes `<run>/reward/model/`, which
`AutoModelForSequenceClassification.from_pretrained(path)` loads and scores with no code of
ours (last-token pooling, the default), plus accuracy, reward distributions and an error
analysis of the misclassified pairs.

The same training makes the independent judge's reward model (stage `judge_rm`,
part4_eval/train_judge_rm.py) from data/judge.jsonl into `<run>/judge_rm/model/`.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("reward", STAGE_RULES["reward"])  # --help and config errors at once, before torch loads below

import torch

from rlhf.analysis.plots import plot_reward_distributions, plot_training_curves
from rlhf.analysis.reward_analysis import accuracy_by_group, error_analysis, pearson
from rlhf.core.batching import chosen_longer, collate_shared_prompt_pairs, encode_pairs, shared_prompt_pair_length
from rlhf.core.losses import bradley_terry_loss, length_heuristic_bt_loss, logprob_distillation_loss
from rlhf.core.stages import STAGES
from rlhf.data import read_jsonl
from rlhf.loop.fit import fit
from rlhf.models.checkpoint import save_pretrained_atomic
from rlhf.models.lora import with_lora
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import (
    REWARD_CONFIG_FILE,
    SharedPromptPairRewards,
    build_reward_model,
    fold_reward_offset,
    load_policy,
    load_tokenizer,
    shared_prompt_response_logprobs,
)
from rlhf.models.training import forward_map, make_accelerator
from rlhf.stage.run import write_json_atomic
from rlhf.stage.tracking import MetricLogger


def main(argv: list[str] | None = None, stage: str = "reward") -> None:
    started = start_stage(stage, argv, requires=("sft",), check=STAGE_RULES[stage])
    if started is None:
        return
    cfg, run = started
    t_start = time.perf_counter()

    # 1. Pairs, tokenized once. A pair is one row, [prompt][chosen][rejected], whose mask keeps the two
    #    responses apart: the prompt is encoded once for both (~30% fewer tokens than two rows).
    accelerator = make_accelerator(cfg)
    tokenizer = load_tokenizer(run.model_dir("sft"))
    rows = {split: read_jsonl(run.stage("data") / f"{split}.jsonl") for split in ("val", "test")}
    if stage == "reward":
        rows = {"train": run.training_pairs(cfg.reward.pairs), **rows}  # reward.pairs: dataset, collected or both
    else:
        rows = {"train": read_jsonl(run.stage("data") / "judge.jsonl"), **rows}
    pairs = {split: encode_pairs(tokenizer, split_rows) for split, split_rows in rows.items()}

    def collate(batch_pairs, response_values=None):
        return collate_shared_prompt_pairs(
            batch_pairs,
            tokenizer.pad_token_id,
            cfg.data.max_prompt_tokens,
            cfg.data.max_response_tokens + 1,
            response_values,
        )

    def score_pairs(pairwise, split_pairs) -> list[tuple[float, float]]:
        def score(batch_pairs):
            chosen, rejected = pairwise({k: v.to(accelerator.device) for k, v in collate(batch_pairs).items()})[:2]
            return list(zip(chosen.tolist(), rejected.tolist()))

        pairwise.eval()
        return forward_map(
            score,
            split_pairs,
            cfg.reward.eval_batch_size,
            accelerator,
            lengths=[shared_prompt_pair_length(p) for p in split_pairs],
        )

    # 2. Optional distillation targets: the SFT policy's log-prob of every training response token,
    #    standardised over the training set (one forward-only pass before training).
    distilling = cfg.reward.logprob_distill_coef > 0
    train_examples = [(pair, None) for pair in pairs["train"]]
    if distilling:
        policy = load_policy(run.model_dir("sft")).to(accelerator.device).eval()

        def response_logprobs(batch_pairs):
            batch = {k: v.to(accelerator.device) for k, v in collate(batch_pairs).items()}
            with accelerator.autocast():
                logprobs = shared_prompt_response_logprobs(policy, batch)  # (B, T)
            return [
                (row[c & ~r].cpu(), row[r & ~c].cpu())
                for row, c, r in zip(logprobs, batch["chosen_mask"], batch["rejected_mask"])
            ]

        targets = forward_map(
            response_logprobs,
            pairs["train"],
            cfg.reward.eval_batch_size,
            accelerator,
            lengths=[shared_prompt_pair_length(p) for p in pairs["train"]],
        )
        every_logprob = torch.cat([values for pair_targets in targets for values in pair_targets])
        mean, std = every_logprob.mean(), every_logprob.std().clamp(min=1e-6)
        train_examples = [
            (pair, ((chosen - mean) / std, (rejected - mean) / std))
            for pair, (chosen, rejected) in zip(pairs["train"], targets)
        ]
        del policy

    def collate_train(batch):
        batch_pairs, batch_targets = zip(*batch)
        return collate(list(batch_pairs), list(batch_targets) if distilling else None)

    # 3. Model: the SFT backbone plus a fresh scalar head, N(0, 1/sqrt(d+1)) (Huang et al. 2024); with LoRA,
    #    adapters on the frozen backbone and the head trained in full.
    model = with_lora(build_reward_model(run.model_dir("sft"), cfg.reward), cfg.model.lora.for_stage("reward"))
    heuristic_lr = cfg.reward.length_heuristic_lr if cfg.reward.length_heuristic else None
    # what is trained: one forward per batch of pairs, plus the rater's w with reward.length_heuristic
    pairwise = SharedPromptPairRewards(model, distilling, heuristic_lr)
    margin = torch.tensor(cfg.reward.margin) if cfg.reward.margin else None

    def loss_fn(pairwise, batch):
        chosen, rejected, token_values, heuristic_weight = pairwise(batch)
        if heuristic_weight is not None:  # reward.length_heuristic: a rater who sometimes picks the longer one
            loss, stats = length_heuristic_bt_loss(chosen, rejected, chosen_longer(batch), heuristic_weight)
        else:
            loss, stats = bradley_terry_loss(chosen, rejected, margin, cfg.reward.label_smoothing)
        if distilling:
            distill = logprob_distillation_loss(token_values, batch["response_values"], batch["response_values_mask"])
            loss = loss + cfg.reward.logprob_distill_coef * distill
            stats["logprob_mse"] = distill.detach()
        return loss, {f"train/{name}": value for name, value in stats.items()}  # the train/ group of its metrics

    def evaluate(pairwise):
        scores = score_pairs(pairwise, pairs["val"])
        return {f"{stage}/val/accuracy": sum(c > r for c, r in scores) / len(scores)}

    logger = MetricLogger(stage, run.stage(stage), run.tensorboard_dir(stage), cfg, enabled=accelerator.is_main_process)
    pairwise, loop = fit(
        stage=stage,
        tcfg=cfg.reward,
        cfg=cfg,
        run=run,
        accelerator=accelerator,
        model=pairwise,
        examples=train_examples,
        lengths=[shared_prompt_pair_length(p) for p in pairs["train"]],
        collate=collate_train,
        loss_fn=loss_fn,
        evaluate=evaluate,
        logger=logger,
        loss_units=lambda batch: float(len(batch["input_ids"])),  # a mean over pairs, one row each
    )
    model = pairwise.reward_model

    # 4. Score the held-out pairs, then normalise (Huang et al. 2024): the reference responses, SFT
    #    demonstrations (chosen responses; held-out ones, whose scores we need anyway), score mean 0.
    held_out = {split: score_pairs(pairwise, pairs[split]) for split in ("val", "test") if pairs[split]}
    offset, not_folded = 0.0, 0.0
    if cfg.reward.normalize:
        reference = held_out.get("val") or score_pairs(pairwise, pairs["train"][:2000])
        offset = statistics.fmean(c for c, _ in reference)
        not_folded = fold_reward_offset(model, offset)  # 0.0 when the saved weights absorb it
        held_out = {split: [(c - offset, r - offset) for c, r in scores] for split, scores in held_out.items()}

    # 5. Held-out accuracy against the labels (and, on the embedded task, against gold).
    results: dict = {
        "steps": loop["steps"],
        "offset": offset,
        "pairs": cfg.reward.pairs,
        "train_pairs": len(rows["train"]),
    }
    if pairwise.length_heuristic_logit is not None:
        results["length_heuristic_weight"] = pairwise.length_heuristic_logit.sigmoid().item()
    analysis: dict = {}
    by_family: dict[str, dict[str, float]] = {}  # embedded task: agreement with gold per prompt family
    for split, scores in held_out.items():
        correct = [c > r for c, r in scores]
        results[f"{split}_accuracy"] = sum(correct) / len(correct)
        decisive = [i for i, row in enumerate(rows[split]) if row.get("gold_chosen", 0) != row.get("gold_rejected", 0)]
        if "gold_chosen" in rows[split][0] and decisive:  # gold accuracy: over the pairs gold does not tie
            agrees_with_gold = [
                correct[i] == (rows[split][i]["gold_chosen"] > rows[split][i]["gold_rejected"]) for i in decisive
            ]
            results[f"{split}_gold_accuracy"] = sum(agrees_with_gold) / len(decisive)
            by_family[split] = accuracy_by_group([rows[split][i]["family"] for i in decisive], agrees_with_gold)
        lengths = [len(p.chosen_ids) for p in pairs[split]] + [len(p.rejected_ids) for p in pairs[split]]
        rewards = [c for c, _ in scores] + [r for _, r in scores]
        results[f"{split}_length_reward_correlation"] = pearson(lengths, rewards)
        results[f"{split}_chosen_reward_mean"] = statistics.fmean(c for c, _ in scores)
        results[f"{split}_rejected_reward_mean"] = statistics.fmean(r for _, r in scores)
        analysis[split] = error_analysis(rows[split], pairs[split], scores, cfg.reward.error_examples)
        if accelerator.is_main_process:
            plot_reward_distributions(
                [c for c, _ in scores],
                [r for _, r in scores],
                run.stage(stage) / f"rewards_{split}.png",
                f"reward model on {split}: accuracy {results[f'{split}_accuracy']:.3f}",
            )
    logger.log(
        loop["steps"],
        {
            f"{stage}/{k.split('_', 1)[0]}/{k.split('_', 1)[1]}": v
            for k, v in results.items()
            if k.startswith(("val_", "test_"))
        },
    )

    # 6. Publish the model (AutoModelForSequenceClassification-loadable), analysis, summary.
    if accelerator.is_main_process:
        reward_info = {
            "pooling": cfg.reward.pooling,
            "head_hidden": cfg.reward.head_hidden,
            "offset": offset,
            "offset_not_folded": not_folded,
        }
        save_pretrained_atomic(model, tokenizer, run.model_dir(stage), extra_json={REWARD_CONFIG_FILE: reward_info})
        write_json_atomic(run.stage(stage) / "error_analysis.json", analysis)
        plot_training_curves(
            logger.history,
            STAGES[stage].curves,
            run.stage(stage) / "curves.png",
            "Reward model" if stage == "reward" else "Independent judge's reward model",
        )
        results["error_counts"] = {split: a["counts"] for split, a in analysis.items()}
        if by_family:
            results["gold_accuracy_by_family"] = by_family
        results["peak_memory_mb"], results["peak_memory_source"] = peak_memory_mb(accelerator.device)
        run.update_summary({STAGES[stage].summary_section: results, "timing_s": {stage: logger.elapsed(t_start)}})
        run.mark_complete(stage, cfg, {"steps": loop["steps"]})
    logger.close()
    accelerator.wait_for_everyone()
    accelerator.print(
        f"[{stage}] accuracy val {results['val_accuracy']:.3f} test {results.get('test_accuracy', float('nan')):.3f}"
        + (f" (vs gold {results['test_gold_accuracy']:.3f})" if "test_gold_accuracy" in results else "")
        + (
            f"; length-heuristic rater w {results['length_heuristic_weight']:.3f}"
            if pairwise.length_heuristic_logit is not None
            else ""
        )
    )


if __name__ == "__main__":
    run_stage(main)
