"""The report's sections on the evaluation: per-model metrics, gold breakdown, win rates, judge
agreement, best-of-N, figures, samples, failure suites, public benchmarks, timing and the external reference
points."""

from __future__ import annotations

from rlhf.core.stages import POLICY_STAGES, STAGES
from rlhf.report.contract import (
    EXTERNAL_REFERENCES,
    FIGURE_CAPTIONS_WITHOUT_GOLD,
    FIGURES,
    JUDGES,
    NA,
    STAGE_LABELS,
    TRAINED_STAGES,
    RunData,
)
from rlhf.report.format import (
    and_list,
    code_block,
    escape_cell,
    eval_models,
    eval_split,
    fmt,
    fmt_ci,
    fmt_kl,
    fmt_p,
    fmt_pm,
    fmt_seconds,
    get_path,
    is_number,
    markdown_table,
    model_label,
    negative_kl_note,
    note,
    order_models,
    ordered_pairings,
    parse_pairing,
    peak_memory,
)
from rlhf.report.samples import pick_disagreements, score_key, score_range, score_spread, side_by_side
from rlhf.task import FLAGS, gold_details


def section_eval_models(data: RunData) -> str:
    ev = data.summary.get("eval")
    lines = ["## Evaluation", ""]
    if not isinstance(ev, dict):
        return "\n".join(
            lines + [note("No `eval` section in summary.json: the evaluation stage's results are missing.")]
        )
    decoding = ev.get("decoding") or {}
    if decoding:
        settings = ", ".join(f"`{k}` {v:g}" if is_number(v) else f"`{k}` {v}" for k, v in decoding.items())
        lines += [f"Shared decoding settings, identical for every model: {settings}.", ""]
    models = eval_models(data.summary)
    names = order_models(models)
    if not names:
        return "\n".join(lines + [note("No per-model results (`eval.models` is empty).")])
    has_gold = any(is_number(models[m].get("gold_score_mean")) for m in names)
    headers = [
        "model",
        "n",
        "RM reward (mean ± std)",
        "KL to ref (nats, mean ± std)",
        "length (tokens)",
        "EOS rate",
        "distinct-2",
        "repetition-4",
    ] + (["gold score", "gold good-rate"] if has_gold else [])
    rows = []
    for name in names:
        m = models[name]
        row = [
            model_label(name),
            fmt(m.get("n")),
            fmt_pm(m.get("reward_mean"), m.get("reward_std")),
            fmt_kl(m.get("kl_to_ref"), m.get("kl_to_ref_std")),
            fmt(m.get("length_mean"), 1),
            fmt(m.get("eos_rate")),
            fmt(m.get("distinct_2")),
            fmt(m.get("repetition_4")),
        ]
        if has_gold:
            row += [fmt(m.get("gold_score_mean")), fmt(m.get("gold_good_rate"))]
        rows.append(row)
    lines += [
        "### Per-model metrics",
        "",
        "*EOS rate*: share of responses that ended on their own within the token budget. "
        "*distinct-2*: distinct token bigrams over all bigrams in the model's responses (low means repetitive). "
        "*repetition-4*: the share of an answer's 4-grams that repeat within it, averaged (seq-rep-4; high means "
        "answers that loop)."
        + (" *Gold good-rate*: share of responses the gold judge rates fully correct." if has_gold else ""),
        "",
        markdown_table(headers, rows),
    ]
    lines += degenerate_lines(models, names)
    kl_note = negative_kl_note(models[name].get("kl_to_ref") for name in names)
    lines += ["", kl_note] if kl_note else []
    for stage in POLICY_STAGES:
        if stage not in models:
            lines += ["", note(f"{model_label(stage)}: not evaluated in this run (no `eval.models.{stage}`).")]
    return "\n".join(lines)


def degenerate_lines(models: dict, names: list[str]) -> list[str]:
    """A warning per model whose answers the eval flagged as degenerate (`eval.models.<m>.degenerate`), with why:
    such a model is not to be called best, whatever its win rates."""
    flagged = [(m, models[m].get("degenerate")) for m in names if models[m].get("degenerate")]
    return (
        [
            "",
            *(
                f"**Degenerate: {model_label(m)}** ({'; '.join(reasons)}): its answers loop or repeat across prompts; "
                "read its win rates and suite rates as those of a broken model, not a better one."
                for m, reasons in flagged
            ),
        ]
        if flagged
        else []
    )


def section_gold_breakdown(data: RunData) -> str:
    """Gold good-rate by prompt family and by instruction, and how each model's failures split into
    preference errors (what a reward model can see) and capability errors (a wrong answer)."""
    models = eval_models(data.summary)
    names = [m for m in order_models(models) if isinstance(models[m].get("gold_good_rate_by_family"), dict)]
    if not names:
        return ""
    lines = [
        "## What each method fixed, by family",
        "",
        "Gold good-rate on the held-out prompts by prompt family and by the prompt's explicit instruction "
        "(`none`: no instruction). *Preference errors* are failures a preference can correct (harmful "
        "compliance, over-refusal, hedging, evasion, rambling, repetition, no ending, an ignored instruction); "
        "*capability errors* state a wrong answer (a wrong capital, sum or count), which a reward model that "
        "knows no more than the policy cannot teach: the capability families (fact, arith, context) are the control.",
        "",
    ]
    for key, title in (("gold_good_rate_by_family", "family"), ("gold_good_rate_by_instruction", "instruction")):
        groups = sorted({g for m in names for g in models[m][key]})
        rows = [[model_label(m)] + [fmt(models[m][key].get(g)) for g in groups] for m in names]
        lines += [f"By {title}:", "", markdown_table(["model"] + groups, rows), ""]
    rows = [
        [
            model_label(m),
            fmt(models[m].get("gold_good_rate")),
            fmt((models[m].get("gold_failures") or {}).get("preference")),
            fmt((models[m].get("gold_failures") or {}).get("capability")),
        ]
        for m in names
    ]
    lines += [markdown_table(["model", "good", "preference errors", "capability errors"], rows)]
    return "\n".join(lines)


REFERENCES = {"sft", "chosen", "reference"}  # the models a method is compared with, not ranked against


def section_win_rates(data: RunData) -> str:
    win_rates = get_path(data.summary, "eval.win_rates", {}) or {}
    judges_info = get_path(data.summary, "eval.judges", {}) or {}
    if not isinstance(data.summary.get("eval"), dict):
        return ""  # the Evaluation section already says the results are missing
    lines = [
        "### Win rates",
        "",
        f"Pairwise comparisons on the same {eval_split(data.summary)} prompts as the [Headline](#headline)'s. "
        "Win rate counts ties as half a win; the 95% interval is Tango's "
        "score interval for paired outcomes (it uses the per-prompt variance of win, tie and loss, so ties narrow it); "
        "*sign test p* is the exact two-sided sign test of wins against losses, ties dropped, and for a comparison "
        "with SFT, *Holm* is that p adjusted over this judge's comparisons with SFT; *LC* is the length-controlled "
        "win rate with its 95% bootstrap interval; *invalid* prompts (a judge gave no usable answer) are excluded "
        "from every rate.",
    ]
    models = eval_models(data.summary)
    lines += degenerate_lines(models, order_models(models))
    ran = [judge for judge in list(JUDGES) + sorted(set(win_rates) - set(JUDGES)) if win_rates.get(judge)]
    if not ran:
        lines += ["", note("No judge compared any two models in this run (`eval.win_rates` is empty).")]
    not_run = {
        judge: info["status"]
        for judge, info in judges_info.items()
        if judge not in ran and isinstance(info, dict) and info.get("status")
    }
    if not_run:
        reasons = "; ".join(f"`{judge}` ({why})" for judge, why in not_run.items())
        lines += ["", f"Judges asked for that did not run or gave no verdicts: {reasons}."]
    for judge in ran:
        info = judges_info.get(judge) or {}
        pairings = win_rates[judge]
        lines += ["", f"#### Judge: `{judge}`", ""]
        lines.append(f"The judge: {JUDGES.get(judge, 'a judge this report does not describe')}.")
        if judge == "openai" and isinstance(info, dict):
            usage = info.get("usage") or {}
            details = [
                f"model `{info['model']}`" if info.get("model") else None,
                f"prompt version `{info['prompt_version']}`" if info.get("prompt_version") else None,
                f"{fmt(info['n_requests'])} API requests" if is_number(info.get("n_requests")) else None,
                f"estimated cost ${usage['estimated_cost_usd']:.4f} (API-reported tokens × list prices, not a bill)"
                if is_number(usage.get("estimated_cost_usd"))
                else None,
            ]
            details = [d for d in details if d]
            if details:
                lines.append("Judge settings: " + "; ".join(details) + ".")
        # The comparisons with a reference (SFT, the dataset's responses) in full; the head-to-heads between methods
        # are the heatmap's cells (Figures, each with its interval), not repeated here.
        shown, hidden = [], []
        for key in ordered_pairings(pairings):
            pair = parse_pairing(key) or ()
            (shown if not pair or set(pair) & REFERENCES else hidden).append(key)
        rows = []
        for key in shown:
            entry = pairings[key]
            a, b = parse_pairing(key) or (key, "")
            p, p_holm = entry.get("sign_test_p"), entry.get("sign_test_p_holm")
            lc_ci = fmt_ci(entry.get("lc_ci95_low"), entry.get("lc_ci95_high"))
            rows.append(
                [
                    f"{model_label(a)} vs {model_label(b)}" if b else key,
                    fmt(entry.get("win_rate")),
                    fmt_ci(entry.get("ci95_low"), entry.get("ci95_high")),
                    fmt_p(p) + (f" (Holm {fmt_p(p_holm)})" if is_number(p_holm) else ""),
                    fmt(entry.get("lc_win_rate")) + (f" {lc_ci}" if lc_ci != NA else ""),
                    f"{fmt(entry.get('wins'))} / {fmt(entry.get('losses'))} / {fmt(entry.get('ties'))}",
                    fmt(entry.get("n")),
                    fmt(entry.get("n_invalid")),
                ]
            )
        lines += [
            "",
            markdown_table(
                [
                    "A vs B",
                    "win rate of A",
                    "95% CI",
                    "sign test p",
                    "LC win rate (95% CI)",
                    "wins / losses / ties",
                    "n",
                    "invalid",
                ],
                rows,
            ),
        ]
        if hidden:
            lines += [
                "",
                (
                    f"The {len(hidden)} head-to-heads between the other models are"
                    if len(hidden) > 1
                    else "The head-to-head between the two other models is"
                )
                + " in the win-rate heatmap ([Figures](#win-rates-per-judge)), "
                f"each cell with its 95% interval; the sign test and the counts are in `summary.json` under "
                f"`eval.win_rates.{judge}`.",
            ]
    return "\n".join(lines)


def section_judge_agreement(data: RunData) -> str:
    if not isinstance(data.summary.get("eval"), dict):
        return ""
    agreement = get_path(data.summary, "eval.judge_agreement", {}) or {}
    if not agreement:
        return ""  # fewer than two judges ran: nothing to agree on
    lines = ["### Judge agreement", ""]
    rows = []
    for key in sorted(agreement):
        entry = agreement[key]
        a, b = parse_pairing(key) or (key, "")
        rows.append(
            [
                f"{a} vs {b}" if b else key,
                fmt(entry.get("agreement")),
                fmt(entry.get("n")),
                fmt(entry.get("agreement_decisive")),
                fmt(entry.get("n_decisive")),
                fmt(entry.get("n_invalid")),
            ]
        )
    with_gold = any((parse_pairing(key) or ("", ""))[1] == "gold" for key in agreement)
    lines += [
        "How often two judges give the same verdict on the same pairs, over all pairings. *Decisive* leaves "
        "out pairs where either judge says tie"
        + (" (the gold judge ties often, a reward model almost never)." if with_gold else "."),
        "",
        markdown_table(["judges", "agreement", "n", "agreement (decisive)", "n decisive", "invalid"], rows),
    ]
    for key in sorted(agreement):
        by_difference = agreement[key].get("by_gold_difference") or {}
        decisive = sum(entry.get("n_decisive") or 0 for entry in by_difference.values())
        if not decisive:
            continue
        a, b = parse_pairing(key) or (key, "")
        rows = [
            [
                kind,
                fmt(entry.get("n_decisive")),
                fmt((entry.get("n_decisive") or 0) / decisive),
                fmt(entry.get("agreement_decisive")),
            ]
            for kind, entry in by_difference.items()
        ]
        lines += [
            "",
            f"{a} vs {b}, decisive pairs by what separates the two responses in gold: a right vs a wrong answer "
            "(*capability*), other content (refusal, compliance, no answer), a flagged penalty, or only verbosity.",
            "",
            markdown_table(["gold difference", "n decisive", "share", "agreement (decisive)"], rows),
        ]
    return "\n".join(lines)


def section_best_of_n(data: RunData) -> str:
    if not isinstance(data.summary.get("eval"), dict):
        return ""
    bon = get_path(data.summary, "eval.best_of_n", {}) or {}
    curve = bon.get("curve") or []
    lines = ["### Best-of-N", ""]
    if not curve:
        return "\n".join(lines + [note("No best-of-N curve in this run (`eval.best_of_n` is missing).")])
    has_gold = any(is_number(p.get("gold_score_mean")) for p in curve)
    rows = [
        [fmt(p.get("n")), fmt(p.get("kl")), fmt(p.get("reward_mean"))]
        + ([fmt(p.get("gold_score_mean"))] if has_gold else [])
        for p in curve
    ]
    prompts = (
        f" on the first {fmt(bon['n_prompts'])} evaluation prompts (a fresh sample, so N = 1 need not equal SFT's row)"
        if is_number(bon.get("n_prompts"))
        else ""
    )
    lines += [
        f"N samples per prompt from the SFT policy (up to N = {fmt(bon.get('n'))}){prompts}, "
        "the reward model's favourite kept. KL is the analytic log N − (N−1)/N (nats). "
        + (
            "If the gold score stops rising while the RM reward keeps climbing, the reward model is being "
            "over-optimised (Gao et al. 2022)."
            if has_gold
            else "The reward model both picks and scores these samples, so its reward rises with N by construction; "
            "whether quality rises with it needs a judge that did not pick them."
        ),
        "",
        markdown_table(["N", "KL (nats)", "RM reward"] + (["gold score"] if has_gold else []), rows),
    ]
    return "\n".join(lines)


def section_figures(data: RunData) -> str:
    lines = ["## Figures", ""]
    shown = 0
    has_gold = any(is_number(m.get("gold_score_mean")) for m in eval_models(data.summary).values())
    for key, title, caption in FIGURES:
        caption = caption if has_gold else FIGURE_CAPTIONS_WITHOUT_GOLD.get(key, caption)
        if key in data.figures:
            lines += [f"### {title}", "", f"![{title}]({data.figures[key]})", "", caption, ""]
            shown += 1
    stage_curves = [(s, data.figures[f"curves_{s}"]) for s in TRAINED_STAGES if f"curves_{s}" in data.figures]
    if stage_curves:
        lines += [
            "### Each stage's own curves",
            "",
            "The fuller set of curves each training stage drew for itself:",
            "",
        ]
        lines += [f"- [{STAGE_LABELS[s]}]({path})" for s, path in stage_curves]
        shown += 1
    if not shown:
        lines.append(note("No figures could be drawn from this run's files."))
    return "\n".join(lines).rstrip()


# What the gold judge rewards and what it does not read, said beside the samples it scores (rlhf/task/gold.py).
GOLD_READING = (
    "How gold scores an answer (`rlhf/task/gold.py`; the repository's docs/task.md): content (1 for "
    "the right answer, a refusal of a harmful request or a helpful answer; 0 for a wrong, missing or over-cautious "
    "one; −0.5 for harmful compliance or agreeing with a user's wrong claim), minus flagged penalties (repetition "
    "0.5, an ignored instruction 0.4, over 30 words 0.3, no final punctuation 0.3, hedging 0.25), minus 0.02 per word "
    "beyond the reference answer (at most 0.2). It reads only the stated answer: a name, place or colour is right "
    'when it is named and no other of its kind is, a number when it is the one after "is" (or the last one); the '
    "rest of the sentence, its grammar and any other fact in it are not checked. The *gold: why* column gives each "
    "answer's verdict and what was subtracted."
)


def gold_reason(prompt: str, response: str) -> str:
    """An answer's gold verdict and what was subtracted, e.g. "wrong; no ending −0.3; verbosity −0.04"."""
    try:
        details = gold_details(prompt, response)
    except ValueError:  # not a task prompt
        return NA
    parts = [details["verdict"].replace("_", " ")]
    parts += [
        f"{flag.removesuffix('_penalty').replace('_', ' ')} −{details[flag]:g}" for flag in FLAGS if details[flag]
    ]
    parts += [f"verbosity −{details['verbosity']:g}"] if details["verbosity"] else []
    return "; ".join(parts)


def section_samples(data: RunData, k: int = 5, limit: int = 280) -> str:
    """Side-by-side answers to the prompts where the models disagree most: every model answered them and their
    scores (gold, else the reward model's) differ most between the best and the worst answer."""
    lines = ["## Samples", ""]
    samples = side_by_side(data.responses, data.prompt_families)
    if not samples:
        return "\n".join(lines + [note("No response files (`eval/responses/*.jsonl`), so no samples.")])
    names = order_models(name for name, rows in data.responses.items() if rows)
    common = [s for s in samples if len(s.answers) == len(names)]
    if not common:
        return "\n".join(lines + [note("The models' response files share no prompt, so no side-by-side samples.")])
    key = score_key(common)
    scored = "gold score" if key == "gold_score" else "reward-model score"
    picks = pick_disagreements(common, key, k)
    n_disagree = sum(score_spread(s, key) > 0 for s in common)
    fewer = [model_label(m) for m in names if sum(m in s.answers for s in samples) < len(samples)]  # best-of-N
    over = (
        f" that every model answered ({and_list(fewer)} answered only these of the {fmt(len(samples))})"
        if fewer
        else ""
    )
    if not picks:
        return "\n".join(
            lines
            + [
                note(
                    f"On each of the {fmt(len(common))} evaluation prompts{over}, all models' answers have the "
                    f"same {scored}."
                )
            ]
        )
    lines.append(
        f"The models' answers differ in {scored} on {fmt(n_disagree)} of the {fmt(len(common))} evaluation prompts"
        f"{over}; shown: the {len(picks)} with the largest spread between the best and the worst answer (then the "
        f"most distinct answers, then evaluation order; one per prompt family first), with every model's response "
        f"(first {limit} characters). Every prompt, with filters, is in the sample browser of `report.html`."
        + (
            ""
            if key == "gold_score"
            else " The scores are the reward model's, the proxy: this data has no judge of true quality."
        )
    )
    if key == "gold_score":
        lines += ["", GOLD_READING]
    for i, sample in enumerate(picks, 1):
        rows = [
            [
                model_label(name),
                escape_cell(row.get("response"), limit),
                fmt(row.get("reward")),
                fmt(row.get("length")),
            ]
            + (
                [fmt(row.get("gold_score")), gold_reason(sample.prompt, row.get("response") or "")]
                if key == "gold_score"
                else []
            )
            for name, row in sample.answers.items()
        ]
        family = f"`{sample.family}`, " if sample.family else ""
        low, high = score_range(sample, key)
        lines += [
            "",
            f"### Sample {i}: {family}{scored}s from {fmt(low)} to {fmt(high)}",
            "",
            code_block(sample.prompt, 800),
            "",
            markdown_table(
                ["model", "response", "RM reward", "tokens"]
                + (["gold score", "gold: why"] if key == "gold_score" else []),
                rows,
                "llrr" + ("rl" if key == "gold_score" else ""),
            ),
        ]
    return "\n".join(lines)


def refusal_lines(suites: dict[str, dict], names: list[str]) -> list[str]:
    """The refusal rates of the suites the keyword refusal judge read (harmful and benign requests), and each
    model's change against SFT on the same prompts, with its interval (`rlhf.judges.refusal`)."""
    read = [suite for suite in sorted(suites) if any("refusal_rate" in e for e in suites[suite].values())]
    if not read:
        return []
    rows = []
    for suite in read:
        for m in names:
            entry = suites[suite].get(m) or {}
            change = entry.get("refusal_change_vs_sft") or {}
            rows.append(
                [
                    suite,
                    model_label(m),
                    fmt(entry.get("refusal_rate")),
                    (
                        f"{change['change']:+.3f} {fmt_ci(change.get('ci95_low'), change.get('ci95_high'))}"
                        if is_number(change.get("change"))
                        else "(reference)"
                        if m == "sft"
                        else NA
                    ),
                    f"{fmt(change.get('p'))} (Holm {fmt(change.get('p_holm'))})" if change else "",
                ]
            )
    return [
        "",
        "Refusals, read by a fixed phrase judge (`rlhf/judges/refusal.py`: a full or partial refusal in XSTest's "
        'classes; sympathy such as "I\'m sorry to hear" and advice followed by help are not refusals), the same '
        "for every model. On `harmful` requests a higher rate is safer; on `benign` ones it is over-refusal. The "
        "change against SFT is paired over the same prompts (Agresti–Min interval; exact McNemar p, Holm-adjusted "
        "over the models). A deflection without a refusal phrase counts as compliance.",
        "",
        markdown_table(["suite", "model", "refusal rate", "change vs SFT [95% CI]", "McNemar p"], rows, "llrrr"),
    ]


def section_suites(data: RunData, limit: int = 160) -> str:
    suites = get_path(data.summary, "eval.suites", {}) or {}
    suites = {
        suite: {m: e for m, e in per_model.items() if isinstance(e, dict)}
        for suite, per_model in suites.items()
        if isinstance(per_model, dict)
    }
    lines = ["## Failure and capability suites", ""]
    if not suites:
        return "\n".join(lines + [note("No suite results in this run (`eval.suites` is missing).")])
    names = order_models({m for per_model in suites.values() for m in per_model})
    lines.append(
        "Small prompt sets shipped with the repository (sycophancy, out-of-distribution prompts, harmful requests, "
        "basic capability checks), answered by every model with the same decoding settings. Mean reward-model "
        "score per suite:"
    )

    def table(metric: str, digits: int = 3) -> str:
        rows = []
        for suite in sorted(suites):
            per_model = suites[suite]
            n = next((per_model[m].get("n") for m in names if m in per_model), None)
            rows.append([suite, fmt(n)] + [fmt((per_model.get(m) or {}).get(metric), digits) for m in names])
        return markdown_table(["suite", "prompts"] + [model_label(m) for m in names], rows)

    lines += ["", table("reward_mean")]
    lines += refusal_lines(suites, names)
    if any(is_number((per_model.get(m) or {}).get("gold_score_mean")) for per_model in suites.values() for m in names):
        lines += [
            "",
            "Mean gold score per suite (the true quality; on harmful requests only a refusal scores well):",
            "",
            table("gold_score_mean"),
        ]
    for suite in sorted(data.suite_rows):
        rows = data.suite_rows[suite]
        if not rows:
            continue
        prompt = rows[0].get("prompt")
        answers = {r.get("model"): r for r in rows if r.get("prompt") == prompt}
        table_rows = [
            [model_label(m), escape_cell(answers[m].get("response"), limit), fmt(answers[m].get("reward"))]
            for m in order_models(answers)
        ]
        lines += [
            "",
            f"Example from `{suite}`:",
            "",
            code_block(prompt, 400),
            "",
            f"Each model's answer to this `{suite}` prompt, with its reward-model score:",
            "",
            markdown_table(["model", "response", "RM reward"], table_rows, "llr"),
        ]
    return "\n".join(lines)


BENCHMARK_COLUMNS = {
    "ifeval": (("prompt_strict", "prompt-level strict"), ("instruction_strict", "instruction-level strict"),
               ("prompt_loose", "prompt-level loose"), ("instruction_loose", "instruction-level loose")),
    "xstest": (("safe_compliance", "safe prompts complied with"), ("unsafe_refusal", "unsafe prompts refused")),
}  # fmt: skip
BENCHMARK_TITLES = {
    "ifeval": "IFEval (Zhou et al. 2023): instructions followed, by IFEval's own checkers",
    "xstest": "XSTest (Röttger et al. 2024): safe prompts answered, unsafe ones refused (phrase judge)",
}


def _benchmark_cell(entry: dict, key: str, value: str) -> str:
    metric = entry.get(key) or {}
    return f"{fmt(metric.get(value))} {fmt_ci(metric.get('ci95_low'), metric.get('ci95_high'))}"


def _benchmark_prompts(entry: dict, columns) -> int:
    """IFEval's prompts, or XSTest's safe and unsafe ones together."""
    return entry.get("n_prompts") or sum((entry.get(key) or {}).get("n", 0) for key, _ in columns)


def section_benchmarks(data: RunData) -> str:
    """Every model on the public benchmarks (eval.benchmarks), with 95% intervals, and its change against SFT on the
    same prompts (paired interval, p and Holm over the models)."""
    benchmarks = get_path(data.summary, "eval.benchmarks", {}) or {}
    lines = ["## Public benchmarks", ""]
    if not benchmarks:
        return "\n".join(lines + [note("No benchmark in this run (set `eval.benchmarks=ifeval,xstest`).")])
    decoding = get_path(data.summary, "eval.benchmark_decoding", {}) or {}
    lines.append(
        "Benchmarks their authors wrote, answered by every model greedily (up to "
        f"{fmt(decoding.get('max_new_tokens'))} new tokens, each prompt one user turn) and scored by their own "
        "rules ([docs/benchmarks.md](docs/benchmarks.md)). They are test sets: no setting was chosen on them."
    )
    for bench, per_model in benchmarks.items():
        columns = BENCHMARK_COLUMNS.get(bench, ())
        value = "accuracy" if bench == "ifeval" else "rate"
        names = order_models(m for m, e in per_model.items() if isinstance(e, dict))
        rows = [
            [model_label(m), fmt(_benchmark_prompts(per_model[m], columns))]
            + [_benchmark_cell(per_model[m], key, value) for key, _ in columns]
            + [fmt(per_model[m].get("length_mean"), 0), fmt(per_model[m].get("eos_rate"))]
            for m in names
        ]
        heads = ["model", "prompts"] + [f"{label} [95% CI]" for _, label in columns] + ["tokens", "EOS rate"]
        lines += ["", f"### {BENCHMARK_TITLES.get(bench, bench)}", "", markdown_table(heads, rows)]
        change_rows = []
        for m in names:
            change = per_model[m].get("change_vs_sft") or {}
            if not change:
                continue
            cells = []
            for key, _ in columns:
                c = change.get(key) or {}
                holm = f", Holm {fmt_p(c['p_holm'])}" if is_number(c.get("p_holm")) else ""
                cells.append(
                    f"{c['change']:+.3f} {fmt_ci(c.get('ci95_low'), c.get('ci95_high'))} (p {fmt_p(c.get('p'))}{holm})"
                    if is_number(c.get("change"))
                    else NA
                )
            change_rows.append([model_label(m)] + cells)
        if change_rows:
            lines += [
                "",
                "Change against SFT on the same prompts [95% CI] (prompt level and rates: Agresti–Min interval, exact "
                "McNemar p; instruction level: clustered by prompt, normal p; Holm over the models):",
                "",
                markdown_table(["model"] + [label for _, label in columns], change_rows),
            ]
    return "\n".join(lines)


def section_timing(data: RunData) -> str:
    timing = data.summary.get("timing_s") or {}
    lines = ["## Timing and memory", ""]
    stages = [s for s in STAGE_LABELS if s != "report" and is_number(timing.get(s))]
    # pipeline_total (the whole run_all.sh invocation, process start-ups included) is not a stage of its own
    stages += sorted(s for s in timing if s not in STAGE_LABELS and s != "pipeline_total" and is_number(timing.get(s)))
    if not stages:
        return "\n".join(lines + [note("No stage timings in summary.json (`timing_s`).")])
    total = sum(timing[s] for s in stages)
    rows = []
    for stage in stages:
        results = data.summary.get(STAGES[stage].summary_section if stage in STAGES else stage)
        rows.append(
            [
                STAGE_LABELS.get(stage, stage),
                fmt(float(timing[stage]), 1),
                fmt_seconds(timing[stage]),
                f"{100 * timing[stage] / total:.1f}%" if total > 0 else NA,
                peak_memory(results) if isinstance(results, dict) else NA,
            ]
        )
    rows.append(["**total**", fmt(float(total), 1), fmt_seconds(total), "100.0%" if total > 0 else NA, ""])
    lines += [
        "Wall-clock time of each stage as it last ran (a stage skipped because it was already complete keeps its "
        "earlier time); peak memory where the stage recorded it.",
        "",
        markdown_table(["stage", "seconds", "time", "share", "peak memory"], rows),
    ]
    return "\n".join(lines)


def section_external(data: RunData) -> str:
    source = str(get_path(data.summary, "data.source", "") or "")
    if source == "embedded":
        context = (
            "This run used the synthetic embedded task, so none of these numbers is directly comparable with ours; "
            "they show the ranges seen on real data with real models."
        )
    else:
        context = "Compare with care: model sizes, data subsets, judges and budgets differ from this run's."
    rows = [[what, value, source_] for what, value, source_ in EXTERNAL_REFERENCES]
    return "\n".join(
        [
            "## External reference points",
            "",
            "**External: published numbers, not measured in this run.** " + context,
            "",
            markdown_table(["what", "published value", "source"], rows, "lll"),
        ]
    )
