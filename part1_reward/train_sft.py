"""Stage `sft`: supervised fine-tuning of the policy on demonstrations.

    python part1_reward/train_sft.py --preset tiny

Reads `<run>/data/` (the demonstrations of data.sft_path, else the pairs' chosen responses, and the
tokenizer); writes `<run>/sft/model/` in Hugging Face format. The loss is the token-level negative
log-likelihood of response tokens (and the EOS that ends them) given the prompt; prompt tokens carry
no loss. With data.sft_path, greedy responses to validation prompts are scored by ROUGE-L against
the reference responses.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("sft", STAGE_RULES["sft"])  # --help and config errors at once, before torch loads below

import torch

from rlhf import task
from rlhf.analysis.evaluation import rouge_l
from rlhf.analysis.plots import plot_training_curves
from rlhf.core.batching import collate_sequences, encode_demonstrations, encode_texts
from rlhf.core.ops import masked_sum
from rlhf.core.stages import STAGES
from rlhf.data import read_demonstrations, write_jsonl
from rlhf.loop.fit import fit
from rlhf.models.checkpoint import save_pretrained_atomic
from rlhf.models.lora import with_lora
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import build_policy, check_fits_context, load_tokenizer, token_logprobs
from rlhf.models.training import forward_map, make_accelerator, response_tokens, sft_batch_loss
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.generate import sample_responses
from rlhf.stage.tracking import MetricLogger


def validation_nll(model, examples, collate, batch_size, accelerator) -> float:
    """Token-weighted mean NLL over all validation response tokens."""

    def nll_and_count(batch_examples):
        batch = {k: v.to(accelerator.device) for k, v in collate(batch_examples).items()}
        logprobs = token_logprobs(model, batch["input_ids"], batch["attention_mask"])
        nll = -masked_sum(logprobs, batch["response_mask"], dim=1)  # (B,)
        return list(zip(nll.tolist(), batch["response_mask"].sum(1).tolist()))

    model.eval()
    results = forward_map(
        nll_and_count, examples, batch_size, accelerator, lengths=[len(p) + len(r) for p, r in examples]
    )
    return sum(n for n, _ in results) / sum(c for _, c in results)


def main(argv: list[str] | None = None) -> None:
    started = start_stage("sft", argv, requires=("data",), check=STAGE_RULES["sft"])
    if started is None:
        return
    cfg, run = started
    t_start = time.perf_counter()

    # 1. Data: prompt ids + demonstration response ids (EOS appended).
    accelerator = make_accelerator(cfg)
    tokenizer = load_tokenizer(run.tokenizer_dir)
    references = cfg.data.sft_path is not None  # separate demonstrations: reference responses for ROUGE-L
    train_rows = read_demonstrations(run.stage("data"), "train", references)
    val_rows = read_demonstrations(run.stage("data"), "val", references)
    train_examples = encode_demonstrations(tokenizer, train_rows)
    val_examples = encode_demonstrations(tokenizer, val_rows)

    def collate(batch_examples):
        prompts, responses = zip(*batch_examples)
        return collate_sequences(
            list(prompts),
            list(responses),
            tokenizer.pad_token_id,
            cfg.data.max_prompt_tokens,
            cfg.data.max_response_tokens + 1,
        )

    # 2. Policy: pretrained, or the architecture with random weights; dropout off; LoRA adapters when enabled.
    model = with_lora(build_policy(cfg.model, tokenizer, run.pretrained_source(cfg)), cfg.model.lora.for_stage("sft"))
    check_fits_context(model.config, cfg.data, random_init=cfg.model.init == "random")
    accelerator.print(
        f"[sft] policy: {type(model).__name__}, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters"
    )

    # 3. Train on response tokens only.
    def evaluate(model):
        nll = validation_nll(model, val_examples, collate, cfg.sft.eval_batch_size, accelerator)
        return {"sft/val/loss": nll, "sft/val/perplexity": math.exp(nll)}

    logger = MetricLogger("sft", run.stage("sft"), run.tensorboard_dir("sft"), cfg, enabled=accelerator.is_main_process)
    model, loop = fit(
        stage="sft",
        tcfg=cfg.sft,
        cfg=cfg,
        run=run,
        accelerator=accelerator,
        model=model,
        examples=train_examples,
        lengths=[len(p) + len(r) for p, r in train_examples],
        collate=collate,
        loss_fn=sft_batch_loss,
        evaluate=evaluate,
        logger=logger,
        loss_units=response_tokens,
    )

    # 4. Final validation loss, and what the policy now says.
    final = evaluate(model)
    logger.log(loop["steps"], final)
    model.eval()
    prompts = list(dict.fromkeys(row["prompt"] for row in val_rows))
    greedy = sample_responses(
        model,
        tokenizer,
        encode_texts(tokenizer, prompts[: cfg.sft.num_samples]),
        SamplingConfig(cfg.data.max_response_tokens, temperature=0),
    )
    samples = [{"prompt": p, "response": r, "finished": f} for p, r, f in zip(prompts, greedy.texts, greedy.finished)]
    results = {"val_loss": final["sft/val/loss"], "val_perplexity": final["sft/val/perplexity"], "steps": loop["steps"]}

    # 5. With reference responses, ROUGE-L of greedy responses against them (Huang et al. 2024's SFT metric).
    if references:
        reference_by_prompt = {row["prompt"]: row["response"] for row in reversed(val_rows)}  # the first per prompt
        rouge_prompts = prompts[: cfg.sft.rouge_prompts]
        greedy_texts = forward_map(
            lambda batch: (
                sample_responses(
                    model,
                    tokenizer,
                    encode_texts(tokenizer, batch),
                    SamplingConfig(cfg.data.max_response_tokens, temperature=0),
                ).texts
            ),
            rouge_prompts,
            cfg.sft.eval_batch_size,
            accelerator,
        )
        results["val_rougeL"] = rouge_l(greedy_texts, [reference_by_prompt[p] for p in rouge_prompts])
        logger.log(loop["steps"], {"sft/val/rougeL": results["val_rougeL"]})

    # 6. On the embedded task, the gold judge says how good the SFT policy's samples are (sft.gold_eval_prompts=0: not).
    if cfg.data.path == "embedded" and cfg.sft.gold_eval_prompts > 0:
        eval_prompts = prompts[: cfg.sft.gold_eval_prompts]
        sampling = SamplingConfig(cfg.data.max_response_tokens, temperature=cfg.sft.temperature)
        torch.manual_seed(cfg.run.seed)
        sampled = forward_map(
            lambda batch: sample_responses(model, tokenizer, encode_texts(tokenizer, batch), sampling).texts,
            eval_prompts,
            cfg.sft.eval_batch_size,
            accelerator,
        )
        results.update(task.gold_summary(eval_prompts, sampled))
        for sample in samples:
            sample["gold_score"] = task.gold_score(sample["prompt"], sample["response"])

    # 7. Publish: the HF model, samples, curves, summary; then mark complete.
    if accelerator.is_main_process:
        save_pretrained_atomic(model, tokenizer, run.model_dir("sft"))
        write_jsonl(run.stage("sft") / "samples.jsonl", samples)
        plot_training_curves(logger.history, STAGES["sft"].curves, run.stage("sft") / "curves.png", "SFT")
        results["peak_memory_mb"], results["peak_memory_source"] = peak_memory_mb(accelerator.device)
        run.update_summary({"sft": results, "timing_s": {"sft": logger.elapsed(t_start)}})
        run.mark_complete("sft", cfg, {"steps": loop["steps"]})
    logger.close()
    accelerator.wait_for_everyone()
    accelerator.print(
        f"[sft] val loss {results['val_loss']:.4f} (ppl {results['val_perplexity']:.2f})"
        + (f"; ROUGE-L {results['val_rougeL']:.3f}" if "val_rougeL" in results else "")
        + (f"; gold good-rate {results['gold_good_rate']:.1%}" if "gold_good_rate" in results else "")
    )


if __name__ == "__main__":
    run_stage(main)
