"""The report's seed-spread section: each method over K seeds (`part4_eval/seeds.py`): the methods alone on this
run's data, SFT and reward model (seeds/summary.json), and the whole pipeline redrawn per seed
(pipeline_seeds/summary.json), with intervals over seeds × prompts and Holm-adjusted p-values
(`rlhf/analysis/seeds.py`).
Absent until seeds.py has run."""

from __future__ import annotations

from rlhf.analysis.seeds import FEW_SEEDS
from rlhf.report.contract import JUDGES, NA, RunData
from rlhf.report.format import (
    eval_split,
    fmt,
    fmt_ci,
    fmt_p,
    is_number,
    markdown_table,
    model_label,
    note,
    parse_pairing,
)

HEADLINE_PAIR = "online_dpo_vs_dpo"  # the comparison the spread was built for, said in words when present


def with_ci(block) -> str:
    """`mean [low, high]` of a seed block, or n/a."""
    if not isinstance(block, dict) or not is_number(block.get("mean")):
        return NA
    return f"{fmt(block['mean'])} {fmt_ci(block.get('ci95_low'), block.get('ci95_high'))}"


def per_seed(block) -> str:
    values = block.get("per_seed") if isinstance(block, dict) else None
    return ", ".join(fmt(v) for v in values) if isinstance(values, list) and values else NA


def verdict(block, a: str, b: str, family_size: int) -> str:
    """What the family-wise tests say about A against B (win rate of A): which is better at Holm-adjusted p < 0.05
    within its pre-specified family (`p_holm`) and, where the summary has it, with every comparison as one family
    of `family_size` (`p_holm_all`, the sensitivity check); "better" needs both. The interval beside it is the
    unadjusted 95% one."""
    if not isinstance(block, dict) or not is_number(block.get("mean")):
        return NA
    p = block.get("p_holm")
    if not is_number(p):  # a summary written before seeds.py computed p-values: the unadjusted interval alone
        low, high = block.get("ci95_low"), block.get("ci95_high")
        if not (is_number(low) and is_number(high)):
            return NA
        return (
            f"{a} better (uncorrected)" if low > 0.5 else f"{b} better (uncorrected)" if high < 0.5 else "not separated"
        )
    if p >= 0.05:
        return f"not separated (Holm p {fmt_p(p)})"
    winner = a if block["mean"] > 0.5 else b
    p_all = block.get("p_holm_all")
    if not is_number(p_all):
        return f"{winner} better (Holm p {fmt_p(p)})"
    if p_all >= 0.05:
        return f"{winner} better in its family (Holm p {fmt_p(p)}), not in one of all {family_size} ({fmt_p(p_all)})"
    return f"{winner} better (Holm p {fmt_p(p)}; all {family_size}: {fmt_p(p_all)})"


SCOPE_TEXT = {
    "methods": (
        "Seed spread: the methods, on this run's data, SFT and reward model",
        "Every method trained with {n} method seeds ({seeds}; `run.method_seed`) on this run's data, SFT policy and "
        "reward model, each evaluated with its own sampling seed on the same {prompts} prompts (`part4_eval/seeds.py`, "
        "`seeds/summary.json`). The interval is conditional on this run's data, SFT and reward model: an effect they "
        "share is not in it.",
    ),
    "pipeline": (
        "Seed spread: the whole pipeline redrawn",
        "Every seed ({seeds}) redrew the pipeline: `run.seed` (the SFT's and reward model's initialisation and data "
        "order, and the methods), and on the embedded task the training and validation pairs and the tokenizer, "
        "with the test split held fixed, so all answered the same {prompts} prompts (`part4_eval/seeds.py --scope "
        "pipeline`, `pipeline_seeds/summary.json`). The interval covers the data, SFT and reward model as well as "
        "the method.",
    ),
}


def vs_sft_table(data: RunData, seeds: dict) -> str:
    """One seeds summary's table of every method against SFT: win rate with its interval, both Holm p-values,
    sd and per-seed values, gold score, good-rate and KL to SFT (README's Results and ANALYSIS's headline print
    it as rendered here: part4_eval/seed_tables.py)."""
    win_rates = seeds.get("win_rate_vs_sft") or {}
    gold_scores, good_rates = seeds.get("gold_score") or {}, seeds.get("gold_good_rate") or {}
    kls = seeds.get("kl_to_ref") or {}
    rows = []
    for name in ["sft", *(seeds.get("methods") or list(win_rates))]:
        block = win_rates.get(name) if name != "sft" else None
        rows.append(
            [
                model_label(name),
                "(reference)" if name == "sft" else with_ci(block),
                NA if name == "sft" else fmt_p(block.get("p_holm") if isinstance(block, dict) else None),
                NA if name == "sft" else fmt_p(block.get("p_holm_all") if isinstance(block, dict) else None),
                NA if name == "sft" else fmt(block.get("sd") if isinstance(block, dict) else None),
                NA if name == "sft" else per_seed(block),
                with_ci(gold_scores.get(name)),
                with_ci(good_rates.get(name)),
                "0" if name == "sft" else fmt(kls[name]["mean"], 2) if name in kls else NA,
            ]
        )
    headers = [
        "model",
        f"win rate vs SFT over seeds, {eval_split(data.summary)} prompts [95% CI]",
        "Holm p",
        "Holm p, all",
        "sd",
        "per seed",
        "gold score [95% CI]",
        "good-rate [95% CI]",
        "KL to SFT (nats)",
    ]
    return markdown_table(headers, rows)


def head_to_head_table(seeds: dict) -> str | None:
    """One seeds summary's head-to-heads (the headline pair first), each with its verdict; None without any."""
    pairs = seeds.get("head_to_head") or {}
    if not pairs:
        return None
    family_size = len(seeds.get("win_rate_vs_sft") or {}) + len(pairs)
    rows = []
    for key in sorted(pairs, key=lambda key: key != HEADLINE_PAIR):  # the headline first, then as seeds.py wrote them
        a, b = parse_pairing(key) or (key, "")
        block = pairs[key]
        rows.append(
            [
                f"{model_label(a)} vs {model_label(b)}",
                with_ci(block),
                fmt_p(block.get("p_value") if isinstance(block, dict) else None),
                fmt(block.get("sd") if isinstance(block, dict) else None),
                per_seed(block),
                fmt(block.get("tie_rate") if isinstance(block, dict) else None),
                verdict(block, model_label(a), model_label(b), family_size),
            ]
        )
    return markdown_table(["A vs B", "win rate of A [95% CI]", "p", "sd", "per seed", "ties", "Holm says"], rows)


def spread_lines(data: RunData, seeds: dict, scope: str) -> list[str]:
    """One seeds summary: the win rates against SFT, gold scores and good-rates, then the head-to-heads."""
    judge = seeds.get("judge", NA)
    runs = seeds.get("seeds") or []
    seed_list = ", ".join(str(run.get("method_seed")) for run in runs if isinstance(run, dict)) or NA
    title, text = SCOPE_TEXT[scope]
    lines = [
        f"### {title}",
        "",
        text.format(n=fmt(seeds.get("n_seeds")), seeds=seed_list, prompts=fmt(seeds.get("n_prompts")))
        + f" Judge: `{judge}`, {JUDGES.get(judge, 'a judge this report does not describe')}. Each method is "
        "compared with the SFT answers of its own seed run. *mean* is over seeds × prompts; its 95% interval counts "
        "both the seeds and the prompts (two-way random-effects ANOVA with Satterthwaite's degrees of freedom, "
        "`rlhf/analysis/seeds.py`), so it is wider than one run's interval, which counts the prompts alone; *sd* "
        "is the spread of the per-seed values. *Holm p* tests a win rate of 0.5 with the same standard error, adjusted "
        "over its family (the comparisons with SFT; the head-to-heads), on at most K − 1 degrees of freedom when the "
        "seeds' variance is estimated at zero; *Holm p, all* adjusts over every comparison as one family, a "
        "sensitivity check: a verdict needs both below 0.05.",
        "",
    ]

    if is_number(seeds.get("n_seeds")) and seeds["n_seeds"] < FEW_SEEDS:
        lines += [
            note(
                f"Only {seeds['n_seeds']} seeds: where the seeds matter, an interval from fewer than {FEW_SEEDS} "
                "covers less than 95% (about 85% with 2 seeds in the simulations of `rlhf/analysis/seeds.py`)."
            ),
            "",
        ]
    lines.append(vs_sft_table(data, seeds))
    if not seeds.get("gold_score"):
        lines += ["", note("No gold scores on this data: the gold score and good-rate columns are n/a.")]
    pairs = head_to_head_table(seeds)
    if pairs is not None:
        lines += ["", "Head to head, each pair on the same prompts within a seed run, pooled over seeds:", "", pairs]
    return lines


def section_seeds(data: RunData) -> str:
    lines: list[str] = []
    for seeds, scope in ((data.pipeline_seeds, "pipeline"), (data.seeds, "methods")):
        if isinstance(seeds, dict) and seeds:
            lines += [*(["", ""] if lines else []), *spread_lines(data, seeds, scope)]
    return "\n".join(lines)
