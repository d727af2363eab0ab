"""Stage `dpo`: direct preference optimisation of the SFT policy (Rafailov et al. 2023, arXiv 2305.18290).

    python part3_dpo/train_dpo.py --preset tiny [dpo.loss_type=ipo] [dpo.precompute_ref=false]

Reads `<run>/data/` (and the collect stage's pairs of SFT samples when dpo.pairs is `collected` or
`both`: on-policy DPO) and `<run>/sft/model/`: the policy starts from the SFT model and the
reference IS the SFT model (Rafailov et al. 2023, section 4: pi_ref = pi_SFT). Writes
`<run>/dpo/model/` in Hugging Face format, plus samples, curves and `dpo.*` in summary.json.

The loss is `rlhf.core.losses.DPO_LOSSES[dpo.loss_type]` ("sigmoid" DPO, "ipo", "cdpo") on per-sequence
log-probs of the response tokens and EOS; IPO gets length-averaged log-probs
(`DPO_AVERAGES_LOGPS`). With `dpo.length_heuristic` = w > 0 (sigmoid only) the labels are read as a rater who
picks the longer response with probability w (`rlhf.core.losses.length_heuristic_dpo_loss`), so DPO does not learn
"longer is better" from them. With `dpo.rpo_alpha` > 0 the chosen responses' per-token NLL is added, times
rpo_alpha (RPO, Pang et al. 2024, arXiv 2404.19733; `rlhf.core.losses.chosen_nll_loss`). The implicit reward of a
response is beta * (log pi - log pi_ref). A pair is one `[prompt][chosen][rejected]` row
(`rlhf.core.batching.collate_shared_prompt_pairs`, as the reward model's): the prompt is computed once for both
responses, and each response token's log-prob is what its own `[prompt][response]` row gives.

With `dpo.precompute_ref=true` (default) the reference log-probs of every pair are computed once,
forward-only, and cached in `<run>/dpo/ref_logps.safetensors` under a fingerprint of the SFT
weights, the tokenized pairs and the averaging; the reference model is freed before training.
With `false` the reference model stays in memory and scores each batch on the fly (same numbers).

Held out: the implicit-reward preference accuracy on val and test (next to the reward model's on
the same pairs), and, on the embedded task, the gold judge on samples of `dpo.eval_prompts` val
prompts from the SFT and the DPO policy drawn with the same seed and settings: mean score,
good-rate and the head-to-head win rate (wins + ties/2) / n, under the keys of every policy stage's held-out
comparison (`rlhf.online.held_out.gold_against_sft`: `dpo.gold_win_rate_vs_sft`, `dpo/eval/gold_score_mean`).
`dpo.eval_every` > 0 adds these along training (`dpo/eval/gold_*`), the curve to read when DPO moves the implicit
reward but not the samples.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("dpo", STAGE_RULES["dpo"])  # --help and config errors at once, before torch loads below

import torch

from rlhf.analysis.plots import plot_training_curves
from rlhf.core.batching import encode_pairs, shared_prompt_pair_length
from rlhf.core.losses import DPO_AVERAGES_LOGPS
from rlhf.core.stages import STAGES
from rlhf.data import read_jsonl, write_jsonl
from rlhf.loop.fit import fit
from rlhf.methods.dpo import (
    DPOObjective,
    OnTheFlyReference,
    PrecomputedReference,
    PreferenceSplits,
    Throughput,
    make_loss_fn,
)
from rlhf.methods.reference_cache import load_ref_cache, ref_cache_fingerprints, save_ref_cache, weights_sha256
from rlhf.models.checkpoint import save_pretrained_atomic
from rlhf.models.lora import load_trainable_policy, reference_policy
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import load_tokenizer
from rlhf.models.training import make_accelerator
from rlhf.online.held_out import HeldOutSamples, eval_metrics
from rlhf.rollout.batch import eval_sampling
from rlhf.stage.run import stage_seed
from rlhf.stage.tracking import MetricLogger

REF_CACHE_FILE = "ref_logps.safetensors"
SPLITS = ("train", "val", "test")
CURVE_KEYS = STAGES["dpo"].curves


# ----------------------------------------------------------------------------- the stage


def main(argv: list[str] | None = None) -> None:
    started = start_stage("dpo", argv, requires=("data", "sft"), check=STAGE_RULES["dpo"])
    if started is None:
        return
    cfg, run = started
    seed = stage_seed(cfg, "dpo")  # run.method_seed when set (part4_eval/seeds.py)
    t_start = time.perf_counter()
    timing: dict[str, float] = {}
    dcfg = cfg.dpo
    average = DPO_AVERAGES_LOGPS[dcfg.loss_type]

    # 1. Pairs, tokenized once; a seeded subset of train when dpo.max_train_pairs is set.
    accelerator = make_accelerator(cfg, "dpo")
    tokenizer = load_tokenizer(run.model_dir("sft"))
    rows = {split: read_jsonl(run.stage("data") / f"{split}.jsonl") for split in SPLITS if split != "train"}
    rows = {"train": run.training_pairs(dcfg.pairs), **rows}  # dpo.pairs: dataset, collected or both
    if dcfg.max_train_pairs is not None and dcfg.max_train_pairs < len(rows["train"]):
        keep = torch.randperm(len(rows["train"]), generator=torch.Generator().manual_seed(seed))[: dcfg.max_train_pairs]
        rows["train"] = [rows["train"][i] for i in sorted(keep.tolist())]
    rows = {split: split_rows for split, split_rows in rows.items() if split_rows}
    truncation = (cfg.data.max_prompt_tokens, cfg.data.max_response_tokens + 1)  # +1: the EOS
    splits = PreferenceSplits(
        {split: encode_pairs(tokenizer, split_rows) for split, split_rows in rows.items()},
        rows,
        tokenizer.pad_token_id,
        truncation,
        dcfg.eval_batch_size,
        accelerator,
        average,
    )
    pairs = splits.pairs

    # 2. Reference = SFT. Precomputed: one forward-only pass, cached, then the model is freed. With LoRA the
    #    reference is the policy with its adapters disabled (no copy).
    t0 = time.perf_counter()
    policy = load_trainable_policy(run.model_dir("sft"), cfg.model.lora.for_stage("dpo"))
    ref_model = reference_policy(policy, run.model_dir("sft"), accelerator.device)
    cached_splits: list[str] = []
    if dcfg.precompute_ref:
        cache_path = run.stage("dpo") / REF_CACHE_FILE
        fingerprints = ref_cache_fingerprints(weights_sha256(run.model_dir("sft")), pairs, truncation, average)
        ref_logps = load_ref_cache(cache_path, fingerprints)
        cached_splits = sorted(ref_logps)
        missing = [split for split in pairs if split not in ref_logps]
        ref_logps.update({split: splits.logps(ref_model, split) for split in missing})
        if missing and accelerator.is_main_process:
            save_ref_cache(cache_path, fingerprints, ref_logps)
        reference = PrecomputedReference(ref_logps)
        parts = [f"{', '.join(cached_splits)} read from {cache_path}"] if cached_splits else []
        if missing:
            parts.append(f"{', '.join(missing)} computed, cached in {cache_path}")
        accelerator.print(f"[dpo] reference log-probs: {'; '.join(parts)}")
    else:
        reference = OnTheFlyReference(ref_model, average, splits.logps, accelerator)
    timing["ref_logps"] = time.perf_counter() - t0

    # 3. Held-out prompts, sampled from the SFT policy now and from the DPO policy later with the same
    #    seed and settings, so the gold judge compares two policies rather than two rolls of the dice.
    eval_prompts = list(dict.fromkeys(row["prompt"] for row in rows.get("val", [])))[: dcfg.eval_prompts]
    gold_judge = cfg.data.path == "embedded" and bool(eval_prompts)
    held_out = HeldOutSamples(  # decoded as the test decodes
        tokenizer, eval_prompts, eval_sampling(cfg), seed, dcfg.eval_batch_size, accelerator, gold_judge
    )
    t0 = time.perf_counter()
    held_out.sample_sft(ref_model)
    timing["sft_samples"] = time.perf_counter() - t0

    if dcfg.precompute_ref:
        del ref_model  # training never sees the reference model
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)

    # 4. Train the policy from the SFT weights with the loss chosen from the table.
    accelerator.print(
        f"[dpo] policy {sum(p.numel() for p in policy.parameters()) / 1e6:.2f}M parameters; loss "
        f"{dcfg.loss_type} beta={dcfg.beta}; {len(pairs['train'])} train pairs; reference "
        f"{'precomputed' if dcfg.precompute_ref else 'on the fly'}"
    )
    throughput = Throughput(accelerator)
    loss_fn = make_loss_fn(
        dcfg.loss_type, dcfg.beta, dcfg.label_smoothing, reference, throughput, dcfg.length_heuristic, dcfg.rpo_alpha
    )
    objective = DPOObjective(dcfg.loss_type, dcfg.beta, dcfg.label_smoothing, dcfg.length_heuristic, dcfg.rpo_alpha)

    def evaluate(model):  # every dpo.eval_every steps: the implicit-reward and gold curves
        metrics = splits.evaluate(model, "val", reference, objective) if "val" in pairs else {}
        if gold_judge:
            metrics.update(eval_metrics("dpo", held_out.against_sft(held_out.sample(model))[0]))
        return metrics

    logger = MetricLogger("dpo", run.stage("dpo"), run.tensorboard_dir("dpo"), cfg, enabled=accelerator.is_main_process)

    def log_step_zero() -> None:  # the policy IS the SFT model, so its samples are the SFT samples (all ties)
        if gold_judge:
            logger.log(0, eval_metrics("dpo", held_out.against_sft(held_out.sft_samples)[0]))

    t0 = time.perf_counter()
    policy, loop = fit(
        stage="dpo",
        tcfg=dcfg,
        cfg=cfg,
        run=run,
        accelerator=accelerator,
        model=policy,
        examples=list(range(len(pairs["train"]))),
        lengths=[shared_prompt_pair_length(p) for p in pairs["train"]],
        collate=splits.collate_train,
        loss_fn=loss_fn,
        evaluate=evaluate,
        logger=logger,
        loss_units=lambda batch: float(len(batch["input_ids"])),  # a mean over pairs, one row each
        on_fresh_start=log_step_zero,  # after fit knows it is not resuming: a resumed run keeps its first row
    )
    timing["train"] = time.perf_counter() - t0
    memory_mb, memory_source = peak_memory_mb(accelerator.device)
    last_train = next((row for row in reversed(logger.history) if "dpo/train/loss" in row), {})

    # 5. Held-out: implicit-reward accuracy vs the explicit reward model's, on the same pairs.
    t0 = time.perf_counter()
    held_out_metrics: dict[str, float] = {}
    for split in ("val", "test"):
        if split in pairs:
            held_out_metrics.update(splits.evaluate(policy, split, reference, objective))
    logger.log(loop["steps"], held_out_metrics)
    reward_model = run.read_summary().get("reward_model", {})
    results: dict = {
        "loss_type": dcfg.loss_type,
        "beta": dcfg.beta,
        "label_smoothing": dcfg.label_smoothing,
        "length_heuristic": dcfg.length_heuristic,
        "rpo_alpha": dcfg.rpo_alpha,
        "steps": loop["steps"],
        "pairs": dcfg.pairs,
        "train_pairs": len(pairs["train"]),
        "reference": "precomputed" if dcfg.precompute_ref else "on_the_fly",
        "ref_cached_splits": cached_splits,
        "train_loss": last_train.get("dpo/train/loss"),
        "train_accuracy": last_train.get("dpo/train/rewards/accuracies"),
        "tokens_per_s": last_train.get("dpo/train/tokens_per_s"),
        "timed_tokens": throughput.tokens,  # what tokens_per_s counts, in this process (after a resume: since it)
        "peak_memory_mb": memory_mb,
        "peak_memory_source": memory_source,
    }
    for split in ("val", "test"):
        if split not in pairs:
            continue
        results[f"{split}_accuracy"] = held_out_metrics[f"dpo/{split}/rewards/accuracies"]
        results[f"{split}_margin_mean"] = held_out_metrics[f"dpo/{split}/rewards/margins"]
        results[f"{split}_loss"] = held_out_metrics[f"dpo/{split}/loss"]
        if f"dpo/{split}/gold_accuracy" in held_out_metrics:
            results[f"{split}_gold_accuracy"] = held_out_metrics[f"dpo/{split}/gold_accuracy"]
        results[f"reward_model_{split}_accuracy"] = reward_model.get(f"{split}_accuracy")
        results[f"reward_model_{split}_gold_accuracy"] = reward_model.get(f"{split}_gold_accuracy")

    # 6. Samples on held-out prompts; on the embedded task the gold judge compares DPO with SFT head to head.
    dpo_samples, sft_samples = held_out.sample(policy), held_out.sft_samples
    samples = [
        {"prompt": p, "dpo_response": d, "dpo_finished": df, "sft_response": s, "sft_finished": sf}
        for p, (d, df), (s, sf) in zip(eval_prompts, dpo_samples, sft_samples)
    ]
    results["eval_prompts"] = len(eval_prompts)
    if eval_prompts:
        results["eos_rate"] = sum(df for _, df in dpo_samples) / len(dpo_samples)
        results["sft_eos_rate"] = sum(sf for _, sf in sft_samples) / len(sft_samples)
    if gold_judge:
        gold, dpo_scores = held_out.against_sft(dpo_samples)
        logger.log(loop["steps"], eval_metrics("dpo", gold))
        for sample, dpo_score, sft_score in zip(samples, dpo_scores, held_out.sft_scores):
            sample.update(dpo_gold_score=dpo_score, sft_gold_score=sft_score)
        results.update(gold)
    timing["eval"] = time.perf_counter() - t0
    results["time_s"] = {k: round(v, 2) for k, v in timing.items()}

    # 7. Publish: the HF policy, samples, curves, summary; then mark complete.
    if accelerator.is_main_process:
        save_pretrained_atomic(policy, tokenizer, run.model_dir("dpo"))
        write_jsonl(run.stage("dpo") / "samples.jsonl", samples)
        plot_training_curves(
            logger.history, CURVE_KEYS, run.stage("dpo") / "curves.png", f"DPO ({dcfg.loss_type}, beta={dcfg.beta})"
        )
        run.update_summary({"dpo": results, "timing_s": {"dpo": logger.elapsed(t_start)}})
        run.mark_complete("dpo", cfg, {"steps": loop["steps"]})
    logger.close()
    accelerator.wait_for_everyone()
    line = (
        f"[dpo] implicit-reward accuracy val {results.get('val_accuracy', float('nan')):.3f} "
        f"test {results.get('test_accuracy', float('nan')):.3f}"
    )
    if results.get("reward_model_test_accuracy") is not None:
        line += (
            f" (reward model: val {results['reward_model_val_accuracy']:.3f} "
            f"test {results['reward_model_test_accuracy']:.3f})"
        )
    if "gold_win_rate_vs_sft" in results:
        line += (
            f"; gold score {results['sft_gold_score_mean']:.3f} (SFT) -> {results['gold_score_mean']:.3f}, "
            f"win rate vs SFT {results['gold_win_rate_vs_sft']:.3f} "
            f"({results['gold_wins']}W/{results['gold_losses']}L/{results['gold_ties']}T)"
        )
    accelerator.print(line)


if __name__ == "__main__":
    run_stage(main)
