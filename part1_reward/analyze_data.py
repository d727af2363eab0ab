"""Stage `data`: load preference pairs (and demonstrations), count every edge case, split, and describe lengths.

    python part1_reward/analyze_data.py --preset tiny

Reads `data.path` (Hub id, local file or folder in `data.format`, or `embedded`) and, when set,
`data.sft_path` (demonstrations: one reference response per prompt), and writes `<run>/data/`:
train/val/test.jsonl (`{"prompt", "chosen", "rejected", ...}` with responses only),
sft_{train,val,test}.jsonl (`{"prompt", "response", ...}`, with data.sft_path), the tokenizer every later
stage uses, stats.json and lengths.png. Both sources go through the same edge-case table and filters.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("data", STAGE_RULES["data"])  # --help and config errors at once, before torch loads below

from rlhf import task
from rlhf.analysis.plots import plot_length_distributions
from rlhf.benchmarks import locate
from rlhf.benchmarks.ifeval import load_ifeval
from rlhf.benchmarks.instruction_prompts import all_base_requests, build_instruction_prompts, ifeval_overlap
from rlhf.chat import check_chat_template, fit_turns, render_prompt
from rlhf.core.batching import encode_texts
from rlhf.core.errors import UserError
from rlhf.data import (
    DEMONSTRATION_FORMATS,
    DROP_REASONS,
    INVALID_REASONS,
    PAIR_FORMATS,
    RowFormat,
    check_invalid_share,
    check_splits_not_empty,
    count_reasons,
    invalid_row_lines,
    is_local_source,
    length_stats,
    load_raw_splits,
    prompt_split,
    token_filter_reason,
    write_jsonl,
)
from rlhf.models.checkpoint import fresh_tmp, publish_dir
from rlhf.models.modeling import (
    check_context_from_config,
    load_pretrained_tokenizer,
    train_tokenizer,
)
from rlhf.models.sources import cache_root, dequantized_into, locate_gguf
from rlhf.rollout.benchmarks import render_user_prompt
from rlhf.stage.config import is_gguf
from rlhf.stage.run import write_json_atomic


class Source(NamedTuple):
    """One data source: "pairs" (data.path) or "demonstrations" (data.sft_path), and its raw rows per split."""

    what: str
    key: str
    path: str
    fmt: RowFormat
    raw: dict[str, list[object]]


def embedded_raw_splits(cfg) -> dict[str, list[dict]]:
    """The embedded task's HH-format rows, generated deterministically from its seed."""
    spec = cfg.data.embedded
    seeds = {"train": spec.seed, "test": spec.seed if spec.test_seed is None else spec.test_seed}
    return {
        split: task.generate_split(
            split, n, seed=seeds[split], annotator_noise=spec.annotator_noise, length_bias=spec.length_bias
        )
        for split, n in (("train", spec.n_train_pairs), ("test", spec.n_test_pairs))
    }


def parse_source(source: Source, max_invalid_fraction: float) -> tuple[dict[str, list[dict]], dict[str, list[str]]]:
    """Processed rows and drop reasons per split, after the text-level edge cases; a one-line error when a split
    has too many invalid rows or no training row survives."""
    kept: dict[str, list[dict]] = {}
    reasons: dict[str, list[str]] = {}
    for split, raw_rows in source.raw.items():
        read = [source.fmt.read(raw) for raw in raw_rows]
        kept[split] = [row for row in read if isinstance(row, dict)]
        reasons[split] = [row for row in read if isinstance(row, str)]
        invalid = {reason: reasons[split].count(reason) for reason in INVALID_REASONS if reason in reasons[split]}
        where = invalid_row_lines(source.path, split, source.fmt.read) if invalid else []
        check_invalid_share(
            source.path,
            split,
            reasons[split],
            len(raw_rows),
            max_invalid_fraction,
            source.fmt.hints(),
            source.key,
            where,
        )
        if invalid:
            counts = ", ".join(f"{n} {reason}" for reason, n in invalid.items())
            print(
                f"[data] warning: {source.key} '{source.path}': skipped {sum(invalid.values())} invalid {split} rows "
                f"of {len(raw_rows)} ({counts}){'; the first at ' + ', '.join(where) if where else ''}",
                file=sys.stderr,
            )
    if not kept["train"]:
        counts = count_reasons(reasons["train"])
        worst = max(counts, key=counts.get)
        raise UserError(
            f"{source.key} '{source.path}': no usable training {source.what} among {len(source.raw['train'])} rows "
            f"({counts[worst]} dropped as {worst}); {source.fmt.hint(worst)}"
        )
    return kept, reasons


def format_prompts(rows: list[dict], fields: tuple[str, ...], tokenizer, data_cfg) -> list[dict | str]:
    """Each HH row as the model reads it: with data.truncate_prompts, a prompt over data.max_prompt_tokens loses
    its earliest turns (or the row is "prompt_too_long" when its last human turn alone is over); with
    data.chat_template, the prompt in the tokenizer's chat template and the responses without the whitespace
    the template puts itself. The original prompt is kept as `dialogue`."""
    render = (lambda text: render_prompt(tokenizer, text)) if data_cfg.chat_template else (lambda text: text)

    def fits(text: str) -> bool:
        return len(encode_texts(tokenizer, [render(text)])[0]) <= data_cfg.max_prompt_tokens

    formatted: list[dict | str] = []
    for row in rows:
        prompt = fit_turns(row["prompt"], fits) if data_cfg.truncate_prompts else row["prompt"]
        if prompt is None:
            formatted.append("prompt_too_long")
            continue
        if data_cfg.chat_template:
            row = {
                **row,
                "prompt": render(prompt),
                **{key: row[key].strip() for key in fields},
                "dialogue": row["prompt"],
            }
        elif prompt != row["prompt"]:
            row = {**row, "prompt": prompt, "dialogue": row["prompt"]}
        formatted.append(row)
    return formatted


def filter_and_split(
    kept: dict[str, list[dict]], reasons: dict[str, list[str]], fields: tuple[str, ...], tokenizer, data_cfg
) -> tuple[dict[str, list[dict]], dict[str, dict[str, list[int]]]]:
    """Prompt formatting (`format_prompts`), token-level filters (drops appended to `reasons`), the deterministic
    prompt-level split of train into train, val and, when set, test (a source without one) and the independent
    judge's pairs, and the caps; returns the rows and the token lengths ({"prompt", *fields}) of each split."""
    carve_test = data_cfg.test_fraction if not kept.get("test") else 0.0
    names = ("train", "val", "test", *(("judge",) if data_cfg.judge_fraction else ()))
    splits: dict[str, list[dict]] = {name: [] for name in names}
    lengths = {name: {key: [] for key in ("prompt", *fields)} for name in splits}
    for split, rows in kept.items():
        if data_cfg.chat_template or data_cfg.truncate_prompts:
            formatted = format_prompts(rows, fields, tokenizer, data_cfg)
            reasons[split] += [row for row in formatted if isinstance(row, str)]
            rows = [row for row in formatted if isinstance(row, dict)]
        counts = {
            key: [len(ids) for ids in encode_texts(tokenizer, [r[key] for r in rows])] for key in ("prompt", *fields)
        }
        for i, row in enumerate(rows):
            reason = token_filter_reason(counts["prompt"][i], [counts[key][i] for key in fields], data_cfg)
            if reason:
                reasons[split].append(reason)
                continue
            target = (
                prompt_split(row["prompt"], data_cfg.val_fraction, carve_test, data_cfg.judge_fraction)
                if split == "train"
                else "test"
            )
            splits[target].append(row)
            for key, values in counts.items():
                lengths[target][key].append(values[i])
    for name, cap in (
        ("train", data_cfg.max_train_pairs),
        ("val", data_cfg.max_eval_pairs),
        ("test", data_cfg.max_eval_pairs),
        ("judge", data_cfg.max_train_pairs),
    ):
        if cap is not None and name in splits:
            splits[name] = splits[name][:cap]
            lengths[name] = {key: values[:cap] for key, values in lengths[name].items()}
    return splits, lengths


def no_test_warning(source: Source, n_test: int, eval_reads_it: bool, test_fraction: float) -> str | None:
    """The warning when a source gives no test rows: the reward stage's test accuracy (pairs) and eval (the
    source it reads, `eval_reads_it`) then fall back to validation rows, which they would do without a word.
    `test_fraction`: data.test_fraction, the share a source without test files holds out."""
    effects = ["the reward model's test accuracy will be nan"] if source.what == "pairs" else []
    effects += ["eval will answer validation prompts, not held-out test ones"] if eval_reads_it else []
    if n_test or not effects:
        return None
    one_file = is_local_source(source.path) and Path(source.path).is_file()
    if source.raw["test"]:
        why = f"all {len(source.raw['test'])} of its test rows were dropped (see dropped)"
    elif test_fraction > 0:
        why = f"no prompt fell in its test split (data.test_fraction={test_fraction:g}; too few prompts)"
    elif one_file:
        why = "it has no test split (a single file is split by data.test_fraction, which is 0)"
    elif is_local_source(source.path):
        why = "it has no test split (no file whose name contains 'test', and data.test_fraction is 0)"
    else:
        why = "the Hub dataset has no test or validation split"
    folder = is_local_source(source.path) and not one_file
    fix = "set data.test_fraction (e.g. 0.1)" + (", or add a file whose name contains 'test'," if folder else "")
    return f"[data] warning: {source.key} '{source.path}': {why}, so {' and '.join(effects)}; {fix} to hold one out"


def source_stats(source: Source, splits, lengths, reasons) -> dict:
    """The edge-case table (drops per reason, overall and per split), counts and length statistics of a source."""
    drops = {split: count_reasons(r) for split, r in reasons.items()}
    return {
        "source": source.path,
        "n_raw": {split: len(rows) for split, rows in source.raw.items()},
        f"n_{source.what}": {name: len(rows) for name, rows in splits.items()},
        "dropped": {reason: sum(drops[s][reason] for s in drops) for reason in DROP_REASONS},
        "dropped_by_split": drops,
        "lengths": {name: length_stats(lengths[name]) for name in splits},
    }


def verifiable_prompts(cfg, tokenizer) -> tuple[dict[str, list[dict]], dict]:
    """data.instructions' train and val prompts as rows {prompt (as the policy reads it), user_prompt, key,
    instruction_id_list, kwargs}, and their statistics: instruction types, prompt lengths, and the leak check of
    the base requests against IFEval's prompts (when eval.ifeval_path is readable)."""
    spec = cfg.data.instructions
    built = {
        split: build_instruction_prompts(n, split, spec.val_fraction, spec.seed)
        for split, n in (("train", spec.n_train), ("val", spec.n_val))
    }
    splits = {
        split: [
            {
                "prompt": render_user_prompt(tokenizer, row.prompt, cfg.data.chat_template),
                "user_prompt": row.prompt,
                "key": row.key,
                **row.fields(),
            }
            for row in rows
        ]
        for split, rows in built.items()
    }
    lengths = {
        split: [len(ids) for ids in encode_texts(tokenizer, [r["prompt"] for r in rows])]
        for split, rows in splits.items()
    }
    if too_long := sum(n > cfg.data.max_prompt_tokens for n in lengths["train"] + lengths["val"]):
        raise UserError(
            f"{too_long} instruction prompts are longer than data.max_prompt_tokens={cfg.data.max_prompt_tokens} "
            f"(longest {max(lengths['train'] + lengths['val'])}); raise data.max_prompt_tokens"
        )
    types: dict[str, int] = {}
    for row in built["train"]:
        for instruction_id in row.instruction_id_list:
            types[instruction_id] = types.get(instruction_id, 0) + 1
    stats = {
        "n_train": len(splits["train"]),
        "n_val": len(splits["val"]),
        "prompt_tokens_max": max(lengths["train"] + lengths["val"]),
        "train_instruction_types": dict(sorted(types.items())),
    }
    ifeval_file = locate(cfg.eval.ifeval_path)
    if ifeval_file.is_file():  # the leak check reads IFEval's prompt text only, never its answers or scores
        stats["ifeval_overlap"] = ifeval_overlap(all_base_requests(), [row.prompt for row in load_ifeval(ifeval_file)])
    return splits, stats


def startup_checks(cfg) -> None:
    """Before any data loads (the config's own rules, split shares included, were checked as it loaded): the
    model folders exist, and the data limits fit the model's positions (the SFT stage would otherwise find out only
    after this stage ran)."""
    STAGE_RULES["data"](cfg)
    check_context_from_config(cfg.model, cfg.data)


def main(argv: list[str] | None = None) -> None:
    started = start_stage("data", argv, check=startup_checks)
    if started is None:
        return
    cfg, run = started
    t_start = time.perf_counter()
    out_dir = run.stage("data")

    # 1. Raw rows: the pairs and, with data.sft_path, the demonstrations. The embedded task is written out in
    #    HH format and read back like any source.
    pair_format = PAIR_FORMATS[cfg.data.format]
    if cfg.data.path == "embedded":
        raw_splits = embedded_raw_splits(cfg)
        for split, rows in raw_splits.items():
            (out_dir / "raw").mkdir(exist_ok=True)
            write_jsonl(out_dir / "raw" / f"{split}.jsonl", rows)
    else:
        raw_splits = load_raw_splits(cfg.data.path, "data.path", pair_format.kind)
    sources = [Source("pairs", "data.path", cfg.data.path, pair_format, raw_splits)]
    if cfg.data.sft_path is not None:
        demo_format = DEMONSTRATION_FORMATS[cfg.data.format]
        demo_raw = load_raw_splits(cfg.data.sft_path, "data.sft_path", demo_format.kind)
        sources.append(Source("demonstrations", "data.sft_path", cfg.data.sft_path, demo_format, demo_raw))

    # 2. Parse rows into prompt and responses and drop text-level edge cases.
    parsed = {source.what: parse_source(source, cfg.data.max_invalid_fraction) for source in sources}

    # 3. The tokenizer every later stage uses: trained on train text offline, else the model's own.
    if cfg.tokenizer.train_from_data:
        corpus = sorted(
            {
                row[key]
                for source in sources
                for row in parsed[source.what][0]["train"]
                for key in ("prompt", *source.fmt.responses)
            }
        )
        tokenizer = train_tokenizer(corpus, cfg.tokenizer.vocab_size)
    else:
        if is_gguf(cfg.model.name_or_path):  # dequantized once per run folder; later stages load the copy
            gguf = locate_gguf(cfg.model.name_or_path)
            if done := dequantized_into(gguf, run.base_model_dir):
                print(f"[data] {gguf.path} {done} into {run.base_model_dir} (cache: {cache_root()})")
        tokenizer = load_pretrained_tokenizer(cfg.tokenizer, cfg.model, run.pretrained_source(cfg))
        if cfg.data.chat_template:
            check_chat_template(tokenizer, run.pretrained_source(cfg))

    # 4. Token-level filters, then the deterministic prompt-level validation split.
    outputs = {}
    for source in sources:
        kept, reasons = parsed[source.what]
        splits, lengths = filter_and_split(kept, reasons, source.fmt.responses, tokenizer, cfg.data)
        check_splits_not_empty(
            len(splits["train"]),
            len(splits["val"]),
            reasons["train"],
            cfg.data.val_fraction,
            source.fmt.hints(),
            source.what,
        )
        outputs[source.what] = splits, lengths, reasons
        eval_reads_demonstrations = cfg.eval.baseline == "reference" and cfg.data.sft_path is not None
        eval_reads_it = (source.what == "demonstrations") == eval_reads_demonstrations  # rlhf.data.heldout_references
        if warning := no_test_warning(source, len(splits["test"]), eval_reads_it, cfg.data.test_fraction):
            print(warning, file=sys.stderr)
    splits, lengths, reasons = outputs["pairs"]

    # 5. Statistics: the edge-case table, lengths and length bias, and the embedded task's ceiling.
    stats = {**source_stats(sources[0], splits, lengths, reasons), "tokenizer_vocab_size": len(tokenizer)}
    if "demonstrations" in outputs:
        stats["demonstrations"] = source_stats(sources[1], *outputs["demonstrations"])
    if cfg.data.path == "embedded":
        spec = cfg.data.embedded
        stats["embedded"] = {
            "annotator_noise": spec.annotator_noise,
            "length_bias": spec.length_bias,
            "noise_ceiling": {name: task.noise_ceiling(rows) for name, rows in splits.items() if rows},
            # over the pairs gold does not tie; the tied ones are labelled by length or a coin flip
            "gold_agreement": {name: task.gold_agreement(rows) for name, rows in splits.items() if rows},
            "gold_tie_rate": {name: task.gold_tie_rate(rows) for name, rows in splits.items() if rows},
        }

    # 5b. Verifiable instruction prompts for the RL stages (data.instructions), rendered as the pairs' prompts are.
    instruction_splits = {}
    if cfg.data.instructions.n_train:
        instruction_splits, stats["instructions"] = verifiable_prompts(cfg, tokenizer)

    # 6. Write the processed splits, the tokenizer (atomically), stats and the figure.
    for name, rows in splits.items():
        write_jsonl(out_dir / f"{name}.jsonl", rows)
    for name, rows in instruction_splits.items():
        write_jsonl(out_dir / f"instructions_{name}.jsonl", rows)
    if "demonstrations" in outputs:
        for name, rows in outputs["demonstrations"][0].items():
            write_jsonl(out_dir / f"sft_{name}.jsonl", rows)
    tokenizer_tmp = fresh_tmp(run.tokenizer_dir)
    tokenizer.save_pretrained(tokenizer_tmp)
    publish_dir(tokenizer_tmp, run.tokenizer_dir)
    plot_length_distributions(lengths, out_dir / "lengths.png")
    write_json_atomic(out_dir / "stats.json", stats)
    run.update_summary({"data": stats, "timing_s": {"data": round(time.perf_counter() - t_start, 2)}})
    run.mark_complete("data", cfg, {"n_pairs": stats["n_pairs"]})

    for what, entry in (("pairs", stats), ("demonstrations", stats.get("demonstrations"))):
        if entry is not None:
            table = "  ".join(f"{reason}={entry['dropped'][reason]}" for reason in DROP_REASONS)
            counts = "/".join(str(n) for n in entry[f"n_{what}"].values())
            names = "/".join(entry[f"n_{what}"])
            print(f"[data] {what} {names} = {counts}; dropped: {table}")
    train_len = stats["lengths"]["train"]
    print(
        f"[data] train chosen {train_len['chosen_tokens_mean']:.1f}±{train_len['chosen_tokens_std']:.1f} tokens, "
        f"rejected {train_len['rejected_tokens_mean']:.1f}±{train_len['rejected_tokens_std']:.1f}; "
        f"chosen longer in {train_len['chosen_longer_fraction']:.1%}"
    )
    if "embedded" in stats:
        print(
            "[data] embedded task: noise ceiling (test) "
            f"{stats['embedded']['noise_ceiling'].get('test', float('nan')):.3f}; gold ties "
            f"{stats['embedded']['gold_tie_rate'].get('train', float('nan')):.1%} of train pairs"
        )


if __name__ == "__main__":
    run_stage(main)
