"""Stage `data`: load HH-format preference pairs, count every edge case, split, and describe lengths.

    python part1_reward/analyze_data.py --preset tiny

Reads `data.path` (Hub id, local HH-format file or folder, or `embedded`) and writes
`<run>/data/`: train/val/test.jsonl (`{"prompt", "chosen", "rejected", ...}` with responses
only), the tokenizer every later stage uses, stats.json and lengths.png.
"""

from __future__ import annotations

import time

from rlhf import task
from rlhf.batching import encode_texts
from rlhf.checkpoint import fresh_tmp, publish_dir
from rlhf.cli import run_stage, start_stage
from rlhf.data import (
    DROP_HINTS,
    DROP_REASONS,
    ParsedPair,
    check_invalid_share,
    check_splits_not_empty,
    count_reasons,
    length_stats,
    load_raw_splits,
    parse_pair,
    prompt_split,
    token_filter_reason,
    write_jsonl,
)
from rlhf.errors import UserError
from rlhf.models import check_model_sources, load_pretrained_tokenizer, train_tokenizer
from rlhf.plots import plot_length_distributions
from rlhf.run import write_json_atomic


def embedded_raw_splits(cfg) -> dict[str, list[dict]]:
    """The embedded task's HH-format rows, generated deterministically from its seed."""
    spec = cfg.data.embedded
    return {
        split: task.generate_split(
            split, n, seed=spec.seed, annotator_noise=spec.annotator_noise, length_bias=spec.length_bias
        )
        for split, n in (("train", spec.n_train_pairs), ("test", spec.n_test_pairs))
    }


def to_row(pair: ParsedPair, raw: dict) -> dict:
    """The processed row: prompt and responses, plus any metadata the source carried (e.g. gold scores)."""
    meta = {key: value for key, value in raw.items() if key not in ("chosen", "rejected")}
    return {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected, **meta}


def main(argv: list[str] | None = None) -> None:
    started = start_stage("data", argv, check=lambda cfg: check_model_sources(cfg.tokenizer, cfg.model))
    if started is None:
        return
    cfg, run = started
    t_start = time.perf_counter()
    out_dir = run.stage("data")

    # 1. Raw rows. The embedded task is written out in HH format and read back like any source.
    if cfg.data.path == "embedded":
        raw_splits = embedded_raw_splits(cfg)
        for split, rows in raw_splits.items():
            (out_dir / "raw").mkdir(exist_ok=True)
            write_jsonl(out_dir / "raw" / f"{split}.jsonl", rows)
    else:
        raw_splits = load_raw_splits(cfg.data.path)

    # 2. Parse dialogues into (prompt, chosen, rejected) and drop text-level edge cases.
    kept: dict[str, list[dict]] = {}
    reasons: dict[str, list[str]] = {}
    for split, raw_rows in raw_splits.items():
        parsed = [(parse_pair(raw), raw) for raw in raw_rows]
        kept[split] = [to_row(p, raw) for p, raw in parsed if isinstance(p, ParsedPair)]
        reasons[split] = [p for p, _ in parsed if isinstance(p, str)]
    for split, raw_rows in raw_splits.items():
        check_invalid_share(cfg.data.path, split, reasons[split], len(raw_rows), cfg.data.max_invalid_fraction)
    if not kept["train"]:
        counts = count_reasons(reasons["train"])
        worst = max(counts, key=counts.get)
        raise UserError(
            f"data.path '{cfg.data.path}': no usable training pairs among {len(raw_splits['train'])} rows "
            f"({counts[worst]} dropped as {worst}); {DROP_HINTS[worst]}"
        )

    # 3. The tokenizer every later stage uses: trained on train text offline, else the model's own.
    if cfg.tokenizer.train_from_data:
        corpus = sorted({text for row in kept["train"] for text in (row["prompt"], row["chosen"], row["rejected"])})
        tokenizer = train_tokenizer(corpus, cfg.tokenizer.vocab_size)
    else:
        tokenizer = load_pretrained_tokenizer(cfg.tokenizer, cfg.model)

    # 4. Token-level filters, then the deterministic prompt-level validation split.
    splits: dict[str, list[dict]] = {"train": [], "val": [], "test": []}
    lengths = {name: {"prompt": [], "chosen": [], "rejected": []} for name in splits}
    for split, rows in kept.items():
        prompt_lens = [len(ids) for ids in encode_texts(tokenizer, [r["prompt"] for r in rows])]
        chosen_lens = [len(ids) for ids in encode_texts(tokenizer, [r["chosen"] for r in rows])]
        rejected_lens = [len(ids) for ids in encode_texts(tokenizer, [r["rejected"] for r in rows])]
        for row, p_len, c_len, r_len in zip(rows, prompt_lens, chosen_lens, rejected_lens):
            reason = token_filter_reason(p_len, c_len, r_len, cfg.data)
            if reason:
                reasons[split].append(reason)
                continue
            target = prompt_split(row["prompt"], cfg.data.val_fraction) if split == "train" else "test"
            splits[target].append(row)
            for key, value in (("prompt", p_len), ("chosen", c_len), ("rejected", r_len)):
                lengths[target][key].append(value)
    for name, cap in (
        ("train", cfg.data.max_train_pairs),
        ("val", cfg.data.max_eval_pairs),
        ("test", cfg.data.max_eval_pairs),
    ):
        if cap is not None:
            splits[name] = splits[name][:cap]
            lengths[name] = {key: values[:cap] for key, values in lengths[name].items()}
    check_splits_not_empty(len(splits["train"]), len(splits["val"]), reasons["train"], cfg.data.val_fraction)

    # 5. Statistics: the edge-case table, lengths and length bias, and the embedded task's ceiling.
    drops = {split: count_reasons(r) for split, r in reasons.items()}
    stats = {
        "source": cfg.data.path,
        "n_raw": {split: len(rows) for split, rows in raw_splits.items()},
        "n_pairs": {name: len(rows) for name, rows in splits.items()},
        "dropped": {reason: sum(drops[s][reason] for s in drops) for reason in DROP_REASONS},
        "dropped_by_split": drops,
        "lengths": {name: length_stats(lengths[name]) for name in splits},
        "tokenizer_vocab_size": len(tokenizer),
    }
    if cfg.data.path == "embedded":
        spec = cfg.data.embedded
        stats["embedded"] = {
            "annotator_noise": spec.annotator_noise,
            "length_bias": spec.length_bias,
            "noise_ceiling": {name: task.noise_ceiling(rows) for name, rows in splits.items() if rows},
            "gold_agreement": {name: task.gold_agreement(rows) for name, rows in splits.items() if rows},
        }

    # 6. Write the processed splits, the tokenizer (atomically), stats and the figure.
    for name, rows in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", rows)
    tokenizer_tmp = fresh_tmp(run.tokenizer_dir)
    tokenizer.save_pretrained(tokenizer_tmp)
    publish_dir(tokenizer_tmp, run.tokenizer_dir)
    plot_length_distributions(lengths, out_dir / "lengths.png")
    write_json_atomic(out_dir / "stats.json", stats)
    run.update_summary({"data": stats, "timing_s": {"data": round(time.perf_counter() - t_start, 2)}})
    run.mark_complete("data", cfg, {"n_pairs": stats["n_pairs"]})

    table = "  ".join(f"{reason}={stats['dropped'][reason]}" for reason in DROP_REASONS)
    print(
        f"[data] pairs train/val/test = "
        f"{stats['n_pairs']['train']}/{stats['n_pairs']['val']}/{stats['n_pairs']['test']}; dropped: {table}"
    )
    train_len = stats["lengths"]["train"]
    print(
        f"[data] train chosen {train_len['chosen_tokens_mean']:.1f}±{train_len['chosen_tokens_std']:.1f} tokens, "
        f"rejected {train_len['rejected_tokens_mean']:.1f}±{train_len['rejected_tokens_std']:.1f}; "
        f"chosen longer in {train_len['chosen_longer_fraction']:.1%}"
    )
    if "embedded" in stats:
        print(
            "[data] embedded task: noise ceiling (test) "
            f"{stats['embedded']['noise_ceiling'].get('test', float('nan')):.3f}"
        )


if __name__ == "__main__":
    run_stage(main)
