"""The report's seed-spread section: each method over K method seeds (`part4_eval/seeds.py`, seeds/summary.json),
with intervals over seeds × prompts (`rlhf/seeds.py`). Absent until seeds.py has run."""

from __future__ import annotations

from rlhf.report.contract import JUDGES, NA, RunData
from rlhf.report.format import (
    escape_cell,
    eval_split,
    fmt,
    fmt_ci,
    is_number,
    markdown_table,
    model_label,
    note,
    parse_pairing,
)
from rlhf.seeds import FEW_SEEDS

HEADLINE_PAIR = "online_dpo_vs_dpo"  # the comparison the spread was built for, said in words when present


def label(name: str) -> str:
    return "online DPO" if name == "online_dpo" else model_label(name)


def with_ci(block) -> str:
    """`mean [low, high]` of a seed block, or n/a."""
    if not isinstance(block, dict) or not is_number(block.get("mean")):
        return NA
    return f"{fmt(block['mean'])} {fmt_ci(block.get('ci95_low'), block.get('ci95_high'))}"


def per_seed(block) -> str:
    values = block.get("per_seed") if isinstance(block, dict) else None
    return ", ".join(fmt(v) for v in values) if isinstance(values, list) and values else NA


def verdict(block, a: str, b: str) -> str:
    """What the interval says about A against B (win rate of A): which is better, or neither shown."""
    low, high = (block.get("ci95_low"), block.get("ci95_high")) if isinstance(block, dict) else (None, None)
    if not (is_number(low) and is_number(high)):
        return NA
    return f"{a} better" if low > 0.5 else f"{b} better" if high < 0.5 else "not separated"


def section_seeds(data: RunData) -> str:
    seeds = data.seeds
    if not isinstance(seeds, dict) or not seeds:
        return ""
    judge = seeds.get("judge", NA)
    win_rates = seeds.get("win_rate_vs_sft") or {}
    gold_scores, good_rates = seeds.get("gold_score") or {}, seeds.get("gold_good_rate") or {}
    runs = seeds.get("seeds") or []
    method_seeds = ", ".join(str(run.get("method_seed")) for run in runs if isinstance(run, dict)) or NA
    lines = [
        "### Seed spread",
        "",
        f"Every method trained with {fmt(seeds.get('n_seeds'))} method seeds ({method_seeds}; `run.method_seed`) on "
        f"this run's data, SFT policy and reward model, each evaluated with its own sampling seed on the same "
        f"{fmt(seeds.get('n_prompts'))} prompts (`part4_eval/seeds.py`, `seeds/summary.json`). Judge: `{judge}`, "
        f"{JUDGES.get(judge, 'a judge this report does not describe')}. Each method is compared with the SFT answers "
        "of its own seed run. *mean* is over seeds × prompts; its 95% interval counts both the seeds and the "
        "prompts (two-way random-effects ANOVA with Satterthwaite's degrees of freedom, `rlhf/seeds.py`), so it is "
        "wider than one run's interval, which counts the prompts alone; *sd* is the spread of the per-seed values.",
        "",
    ]
    rows = []
    for name in ["sft", *(seeds.get("methods") or list(win_rates))]:
        block = win_rates.get(name)
        rows.append(
            [
                label(name),
                "(reference)" if name == "sft" else with_ci(block),
                NA if name == "sft" else fmt(block.get("sd") if isinstance(block, dict) else None),
                NA if name == "sft" else per_seed(block),
                with_ci(gold_scores.get(name)),
                with_ci(good_rates.get(name)),
            ]
        )
    if is_number(seeds.get("n_seeds")) and seeds["n_seeds"] < FEW_SEEDS:
        lines += [
            note(
                f"Only {seeds['n_seeds']} seeds: where the seeds matter, an interval from fewer than {FEW_SEEDS} "
                "covers less than 95% (about 85% with 2 seeds in the simulations of `rlhf/seeds.py`)."
            ),
            "",
        ]
    headers = [
        "model",
        f"win rate vs SFT over seeds, {eval_split(data.summary)} prompts [95% CI]",
        "sd",
        "per seed",
        "gold score [95% CI]",
        "good-rate [95% CI]",
    ]
    lines.append(markdown_table(headers, rows))
    if not gold_scores:
        lines += ["", note("No gold scores on this data: the gold score and good-rate columns are n/a.")]

    pairs = seeds.get("head_to_head") or {}
    if pairs:
        keys = sorted(pairs, key=lambda key: key != HEADLINE_PAIR)  # the headline first, then as seeds.py wrote them
        rows = []
        for key in keys:
            a, b = parse_pairing(key) or (key, "")
            block = pairs[key]
            rows.append(
                [
                    f"{label(a)} vs {label(b)}",
                    with_ci(block),
                    fmt(block.get("sd") if isinstance(block, dict) else None),
                    per_seed(block),
                    fmt(block.get("tie_rate") if isinstance(block, dict) else None),
                    verdict(block, label(a), label(b)),
                ]
            )
        lines += [
            "",
            "Head to head, each pair on the same prompts within a seed run, pooled over seeds:",
            "",
            markdown_table(["A vs B", "win rate of A [95% CI]", "sd", "per seed", "ties", "interval says"], rows),
        ]
        if HEADLINE_PAIR in pairs:
            block = pairs[HEADLINE_PAIR]
            lines += [
                "",
                f"Online DPO against DPO: {escape_cell(with_ci(block))} over {fmt(seeds.get('n_seeds'))} seeds; "
                + {
                    "online DPO better": "the interval lies above 0.5: online DPO wins more often.",
                    "DPO better": "the interval lies below 0.5: DPO wins more often.",
                    "not separated": "the interval contains 0.5: these seeds do not separate the two.",
                }.get(verdict(block, "online DPO", "DPO"), "no interval."),
            ]
    return "\n".join(lines)
