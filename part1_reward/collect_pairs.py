"""Stage `collect`: preference pairs on the SFT policy's own samples, labelled by an annotator.

    python part1_reward/collect_pairs.py --preset tiny [collect.annotator=simulated|openai|reward]

The dataset's pairs were written by a demonstrator; InstructGPT (Ouyang et al. 2022), Anthropic's HH
collection (Bai et al. 2022) and Stiennon et al. 2020 labelled samples of their own policies instead.
This stage does that:
1. take `collect.prompts` distinct training prompts (a seeded subset; all by default);
2. sample `collect.samples_per_prompt` = K responses to each from the SFT policy at `collect.temperature`;
3. pair them: all K(K-1)/2 pairs of a prompt, or a seeded `collect.pairs_per_prompt` of them; a pair of
   identical responses is dropped (reason `tie`, as in the data stage);
4. have the annotator compare each pair through the pairwise judges of rlhf/judges/:
   `simulated` (the embedded task's noisy, length-biased annotator over gold, with data.embedded's noise
   and bias; it labels every pair, a gold tie by length or a coin flip, as a real rater would), `openai`
   (the LLM judge of the `judge` section: both orders, cached, retried, tokens and estimated cost counted)
   or `reward` (the reward model in `collect.reward_model`). Ties and failed judgments are dropped and counted;
5. apply the data stage's token limits and write the labelled pairs in its processed format.

Reads `<run>/data/` and `<run>/sft/model/`. Writes `<run>/collect/`: train.jsonl (`{"prompt", "chosen",
"rejected", "annotator"}`, plus `gold_chosen`, `gold_rejected`, `family` on the embedded task and
`p_label` from the simulated annotator), samples.jsonl (every sampled response), stats.json,
lengths.png, and `collect.*` / `timing_s.collect` in summary.json. `reward.pairs` and `dpo.pairs`
(`dataset`, `collected` or `both`) choose what the reward model and DPO train on; `run_all.sh` runs this
stage only when one of them reads it.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("collect", STAGE_RULES["collect"])  # --help and config errors at once, before torch loads below

from rlhf import task
from rlhf.analysis.plots import plot_length_distributions
from rlhf.core.batching import encode_texts
from rlhf.core.errors import UserError
from rlhf.core.winrates import agreement, agreement_by_group
from rlhf.data import DROP_REASONS, length_stats, token_filter_reason, unique_prompts, write_jsonl
from rlhf.judges import Judge, OpenAIJudge, RewardJudge, SimulatedAnnotatorJudge
from rlhf.models.modeling import check_context, context_size, load_policy, load_reward_model, load_tokenizer
from rlhf.models.training import forward_map, make_accelerator
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.engines import build_engine, check_engine
from rlhf.rollout.generate import sampling_seeds
from rlhf.rollout.rewards import text_scorer
from rlhf.stage.run import RunDir, write_json_atomic
from rlhf.stage.schema import Config

# Why a sampled pair is not written: the data stage's reasons, and the annotator's two.
COLLECT_DROP_REASONS = (*DROP_REASONS, "annotator_tie", "annotator_invalid")


def build_annotator(cfg: Config, run: RunDir, accelerator) -> Judge:
    """The pairwise judge that labels the pairs (collect.annotator); a reward model scores under the autocast."""
    c = cfg.collect
    if c.annotator == "simulated":
        spec = cfg.data.embedded
        return SimulatedAnnotatorJudge(spec.annotator_noise, spec.length_bias, seed=cfg.run.seed)
    if c.annotator == "openai":
        return OpenAIJudge(cfg.judge, cache_path=run.stage("collect") / "openai_cache.jsonl")
    folder = Path(c.reward_model)
    device = accelerator.device
    model = load_reward_model(folder).to(device).eval()
    scorer = text_scorer(model, load_tokenizer(folder), device, c.batch_size, autocast=accelerator.autocast)
    return RewardJudge(scorer, tie_tolerance=cfg.judge.reward_tie_tolerance)


def pair_indices(samples: list[str], pairs_per_prompt: int | None, rng: random.Random) -> tuple[list, int]:
    """The (i, j) sample pairs of one prompt to compare, and how many pairs of identical responses were left out."""
    distinct = [(i, j) for i, j in combinations(range(len(samples)), 2) if samples[i] != samples[j]]
    identical = len(samples) * (len(samples) - 1) // 2 - len(distinct)
    if pairs_per_prompt is not None and pairs_per_prompt < len(distinct):
        distinct = sorted(rng.sample(distinct, pairs_per_prompt))
    return distinct, identical


def main(argv: list[str] | None = None) -> None:
    started = start_stage("collect", argv, requires=("data", "sft"), check=STAGE_RULES["collect"])
    if started is None:
        return
    cfg, run = started
    c = cfg.collect
    t_start = time.perf_counter()
    out_dir = run.stage("collect")
    embedded = cfg.data.path == "embedded"

    # 1. Prompts: distinct training prompts, a seeded subset of collect.prompts.
    accelerator = make_accelerator(cfg)
    check_engine(cfg.rollout, "collect")
    device = accelerator.device
    tokenizer = load_tokenizer(run.model_dir("sft"))
    prompts = unique_prompts(run.training_pairs("dataset"))
    if c.prompts is not None and c.prompts < len(prompts):
        keep = random.Random(f"collect/{cfg.run.seed}").sample(range(len(prompts)), c.prompts)
        prompts = [prompts[i] for i in sorted(keep)]
    prompt_ids = encode_texts(tokenizer, prompts)
    check_context("collect", max(map(len, prompt_ids)), c.max_new_tokens, context_size(run.model_dir("sft")))
    K = c.samples_per_prompt
    accelerator.print(
        f"[collect] {len(prompts)} prompts x K={K} samples from the SFT policy, labelled by the {c.annotator} annotator"
    )

    # 2. K samples per prompt from the SFT policy, sharded over processes (prompt p's in rows p*K .. p*K + K-1).
    t0 = time.perf_counter()
    policy = load_policy(run.model_dir("sft")).to(device).eval()
    sampling = SamplingConfig(c.max_new_tokens, temperature=c.temperature)
    engine = build_engine(cfg.rollout, "collect", run.model_dir("sft"), tokenizer, accelerator, c.batch_size)
    engine.load(policy)

    def sample(rows: list[int]) -> list[tuple[str, bool]]:
        # row r samples from its own seed: the pairs do not depend on the process count or the batching
        rollout = engine.sample([prompt_ids[row // K] for row in rows], sampling, sampling_seeds(cfg.run.seed, 0, rows))
        return list(zip(rollout.texts(tokenizer), rollout.finished.tolist()))

    sample_rows = list(range(len(prompts) * K))
    prompt_lengths = [len(prompt_ids[row // K]) for row in sample_rows]  # batches of similar length: little padding
    samples = forward_map(sample, sample_rows, c.batch_size, accelerator, prompt_lengths, desc="sample")
    sample_s = time.perf_counter() - t0
    if not accelerator.is_main_process:
        return  # the main process labels, writes and marks the stage complete

    # 3. Pairs of distinct samples per prompt.
    drops: Counter = Counter()
    rng = random.Random(f"collect-pairs/{cfg.run.seed}")
    items: list[tuple[str, str, str]] = []  # (prompt, first, second)
    for p, prompt in enumerate(prompts):
        texts = [text for text, _ in samples[p * K : (p + 1) * K]]
        compared, identical = pair_indices(texts, c.pairs_per_prompt, rng)
        drops["tie"] += identical
        for i, j in compared:
            if not texts[i].strip() or not texts[j].strip():
                drops["empty_response"] += 1
            else:
                items.append((prompt, texts[i], texts[j]))

    # 4. The annotator's labels: "A" keeps the first response as chosen, "B" the second.
    t0 = time.perf_counter()
    annotator = build_annotator(cfg, run, accelerator)
    comparison = annotator.compare(
        [p for p, _, _ in items], [a for _, a, _ in items], [b for _, _, b in items], progress=True
    )
    for line in comparison.problems():
        print(f"[collect] {line}")
    annotate_s = time.perf_counter() - t0
    labelled = []
    for (prompt, first, second), outcome in zip(items, comparison.outcomes):
        if outcome in ("tie", "invalid"):
            drops[f"annotator_{outcome}"] += 1
            continue
        chosen, rejected = (first, second) if outcome == "A" else (second, first)
        labelled.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "annotator": annotator.name})

    # 5. The data stage's token limits, then gold and the annotator's label probability on the embedded task.
    lengths = {"prompt": [], "chosen": [], "rejected": []}
    rows = []
    if labelled:
        counts = {
            key: [len(ids) for ids in encode_texts(tokenizer, [row[key] for row in labelled])]
            for key in ("prompt", "chosen", "rejected")
        }
        for n, row in enumerate(labelled):
            p_len, c_len, r_len = (counts[key][n] for key in ("prompt", "chosen", "rejected"))
            reason = token_filter_reason(p_len, (c_len, r_len), cfg.data)
            if reason:
                drops[reason] += 1
                continue
            rows.append(row)
            for key, value in (("prompt", p_len), ("chosen", c_len), ("rejected", r_len)):
                lengths[key].append(value)
    gold_stats = {}
    if embedded:
        gold_stats = add_gold(rows, items, comparison.outcomes, cfg)
        gold_stats["sample_gold_good_rate"] = statistics.fmean(
            task.is_good(prompts[n // K], text) for n, (text, _) in enumerate(samples)
        )
    if not rows:
        worst = max(drops, key=drops.get) if drops else "tie"
        raise UserError(
            f"collect: no labelled pairs among {len(prompts)} prompts x K={K} ({drops[worst]} dropped as {worst}); "
            "raise collect.samples_per_prompt or collect.temperature"
        )

    # 6. Write the pairs, the samples, statistics and the length figure; then mark complete.
    write_jsonl(out_dir / "train.jsonl", rows)
    write_jsonl(
        out_dir / "samples.jsonl",
        [
            {"prompt": prompts[p], "response": text, "finished": finished}
            for p in range(len(prompts))
            for text, finished in samples[p * K : (p + 1) * K]
        ],
    )
    finished = [done for _, done in samples]
    stats = {
        "annotator": comparison.info,
        "prompts": len(prompts),
        "samples_per_prompt": K,
        "samples": len(samples),
        "unfinished_rate": 1 - sum(finished) / len(finished),
        "pairs_compared": len(items),
        "n_pairs": len(rows),
        "dropped": {reason: drops[reason] for reason in COLLECT_DROP_REASONS},
        "lengths": length_stats(lengths),
        **gold_stats,
        "time_s": {"sample": round(sample_s, 2), "annotate": round(annotate_s, 2)},
    }
    plot_length_distributions({"collected": lengths}, out_dir / "lengths.png")
    write_json_atomic(out_dir / "stats.json", stats)
    run.update_summary({"collect": stats, "timing_s": {"collect": round(time.perf_counter() - t_start, 2)}})
    run.mark_complete("collect", cfg, {"n_pairs": len(rows)})

    table = "  ".join(f"{reason}={count}" for reason, count in stats["dropped"].items() if count)
    line = f"[collect] {len(rows)} pairs from {len(items)} compared; dropped: {table or 'none'}"
    if embedded and stats["gold_agreement"] is not None:
        line += f"; labels agree with gold on {stats['gold_agreement']:.3f} of the pairs gold does not tie"
    print(line + f" ({time.perf_counter() - t_start:.0f}s)")


def add_gold(rows: list[dict], items: list[tuple[str, str, str]], outcomes: list[str], cfg: Config) -> dict:
    """Gold fields on each written row (and `p_label` from the simulated annotator), and what gold says
    of the collection: how often the labels agree with it, overall and by what separates the two
    responses (`task.gold_difference`), and the share of compared pairs that gold ties."""
    spec = cfg.data.embedded
    for row in rows:
        prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
        gold_chosen, gold_rejected = task.gold_score(prompt, chosen), task.gold_score(prompt, rejected)
        row.update(gold_chosen=gold_chosen, gold_rejected=gold_rejected, family=task.parse_prompt(prompt).family)
        if row["annotator"] == "simulated":
            row["p_label"] = task.p_first(
                chosen, rejected, gold_chosen, gold_rejected, spec.annotator_noise, spec.length_bias
            )
    details = [(task.gold_details(p, a), task.gold_details(p, b)) for p, a, b in items]
    gold_outcomes = [
        "A" if da["score"] > db["score"] else "B" if db["score"] > da["score"] else "tie" for da, db in details
    ]
    kinds = [task.gold_difference(da, db) for da, db in details]
    stats = {
        "gold_agreement": task.gold_agreement(rows) if rows else None,  # over the written pairs gold does not tie
        "gold_tie_rate": sum(kind is None for kind in kinds) / len(kinds) if kinds else None,  # of the compared pairs
        "labels_vs_gold": agreement(outcomes, gold_outcomes),
        "labels_vs_gold_by_gold_difference": agreement_by_group(outcomes, gold_outcomes, kinds),
    }
    if rows and all("p_label" in row for row in rows):
        stats["noise_ceiling"] = task.noise_ceiling(rows)
    return stats


if __name__ == "__main__":
    run_stage(main)
