"""The report's sections on the data and the training stages: intro, headline, data, collected pairs,
reward model and each stage's training run."""

from __future__ import annotations

from rlhf.core.stages import ONLINE_STAGES, PAIR_READERS, STAGES
from rlhf.report.contract import (
    ERROR_CATEGORY_ORDER,
    JUDGES,
    NA,
    STAGE_LABELS,
    SUMMARY_SECTION,
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
    fmt_params,
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


def section_intro(data: RunData) -> str:
    summary = data.summary
    source = get_path(summary, "data.source")
    if source == "embedded":
        source_text = (
            "the **embedded task** (`rlhf/task/`): synthetic dialogues in Anthropic HH-RLHF's text format "
            "whose preference labels come from a noisy, length-biased simulated annotator, and whose "
            "*gold judge* scores any response exactly, so real quality gains can be measured"
        )
    elif source:
        source_text = f"`{source}`" + (
            " (Anthropic's helpful/harmless human preference pairs)" if "hh-rlhf" in str(source).lower() else ""
        )
    else:
        source_text = "an unrecorded data source"
    model = data.model
    if model.get("name_or_path"):
        model_text = f"`{model['name_or_path']}`" + (
            " (architecture only, random initial weights)" if model.get("init") == "random" else ""
        )
    elif model.get("model_type"):
        overrides = model.get("config_overrides") or {}
        shape = ", ".join(
            f"{k}={v}"
            for k, v in overrides.items()
            if k in ("n_layer", "n_embd", "n_head", "num_hidden_layers", "hidden_size")
        )
        model_text = f"a {model['model_type']}-architecture model built from its config with random weights" + (
            f" ({shape})" if shape else ""
        )
    else:
        model_text = "an unrecorded model"
    if is_number(model.get("n_params")):
        model_text += f", {fmt_params(model['n_params'])} parameters"
    stages_run = [s for s in TRAINED_STAGES if SUMMARY_SECTION.get(s, s) in summary]
    stages_missing = [s for s in TRAINED_STAGES if s not in stages_run]
    lines = [
        "# RLHF run report" + (f": preset `{data.preset}`" if data.preset else ""),
        "",
        "This report compares the ways this pipeline aligns a language model to preferences: supervised fine-tuning "
        "(SFT) on the preferred responses, then a reward model and three online methods that optimise it (PPO, GRPO, "
        "and RAFT, which fine-tunes on its own best-of-N samples), DPO, which learns from the preference pairs "
        "directly, and online DPO, which learns from pairs of its own samples that the reward model labels as it "
        "trains. Every number below is read from the run folder"
        + (f" `{data.run_dir}`" if data.run_dir else "")
        + " by `part4_eval/make_report.py`; nothing is retrained.",
        "",
        f"- **Data:** {source_text}.",
        f"- **Policy model:** {model_text}.",
        f"- **Stages in this run:** {', '.join(STAGE_LABELS[s] for s in stages_run) or 'none'}"
        + (f"; not run: {', '.join(STAGE_LABELS[s] for s in stages_missing)}" if stages_missing else "")
        + ".",
        *(f"- **Warning:** {warning}" for warning in data.warnings),
        "",
        "How to read the numbers:",
        "",
        "- **RM reward**: the trained reward model's score, normalised so the reference (SFT-data) responses "
        "score 0 on average. It is the proxy that PPO, GRPO and best-of-N optimise, so it can be gamed.",
        "- **KL to ref**: how far a policy has moved from the SFT policy, in nats per response (a Monte Carlo estimate "
        "of Σ log π − log π_ref over the sampled tokens). Higher reward at lower KL is the better trade-off.",
    ]
    if source == "embedded" or any(is_number(m.get("gold_score_mean")) for m in eval_models(summary).values()):
        lines.append(
            "- **Gold score** (embedded task only): the exact quality of a response, which no method ever trains on."
        )
    lines += [
        "- **Win rate** of A vs B: the share of prompts where a judge prefers A's response, ties counted half, with a "
        "95% interval built from the per-prompt outcomes (Tango's score interval for paired outcomes, which uses the "
        "real, smaller variance of tie-heavy comparisons) and the exact sign test of wins against losses, ties "
        "dropped. A method *beats SFT* (or loses to it) when that interval excludes 0.5 and its sign test, "
        "Holm-adjusted over the judge's family of comparisons with SFT (Holm 1979), gives p < 0.05: the family of "
        '"beats SFT" claims is Holm-controlled, so under each judge the chance of any false one is at most 5%. '
        "The **LC** (length-controlled) win rate is the same, predicted at equal response length "
        "(Dubois et al. 2024), because judges tend to prefer longer answers; its interval is a bootstrap over prompts.",
        "- **best-of-N**: N samples from the SFT policy, the one the reward model likes best kept; a training-free "
        "baseline at a known KL of log N − (N−1)/N.",
    ]
    return "\n".join(lines)


def headline_judge(summary: dict) -> str | None:
    """The judge whose comparisons with SFT the headline shows: gold, else openai, else the independent reward model,
    else reward; None if none ran."""
    win_rates = get_path(summary, "eval.win_rates", {}) or {}
    return next(
        (
            j
            for j in ("gold", "openai", "independent", "reward")
            if any(k.endswith("_vs_sft") for k in win_rates.get(j) or {})
        ),
        None,
    )


def headline_rows(summary: dict) -> tuple[list[str], list[list]]:
    """The compact per-model table: reward, KL, gold, win rate vs SFT with its wins,
    losses, ties and tie share."""
    models = eval_models(summary)
    names = order_models(models)
    has_gold = any(is_number(models[m].get("gold_score_mean")) for m in names)
    has_independent = any(is_number(models[m].get("independent_reward_mean")) for m in names)
    judge = headline_judge(summary)
    vs_sft = (get_path(summary, "eval.win_rates", {}) or {}).get(judge) or {}
    headers = (
        ["model", "RM reward", "KL to ref (nats)"]
        + (["gold score", "gold good-rate"] if has_gold else [])
        + (["independent RM score"] if has_independent else [])
        + (["length"])
        + (
            [f"win rate vs SFT, {eval_split(summary)} prompts ({judge} judge)", "wins / losses / ties", "tie share"]
            if judge
            else []
        )
    )
    rows = []
    for name in names:
        m = models[name]
        row = [model_label(name), fmt(m.get("reward_mean")), fmt_kl(m.get("kl_to_ref"))]
        if has_gold:
            row += [fmt(m.get("gold_score_mean")), fmt(m.get("gold_good_rate"))]
        if has_independent:
            row.append(fmt(m.get("independent_reward_mean")))
        row.append(fmt(m.get("length_mean"), 1))
        if judge:
            entry = vs_sft.get(f"{name}_vs_sft")
            if name == "sft" or not isinstance(entry, dict):
                row += ["(reference)" if name == "sft" else NA, "", ""]
            else:
                row += [
                    f"{fmt(entry.get('win_rate'))} {fmt_ci(entry.get('ci95_low'), entry.get('ci95_high'))}",
                    f"{fmt(entry.get('wins'))} / {fmt(entry.get('losses'))} / {fmt(entry.get('ties'))}",
                    fmt(entry.get("tie_rate")),
                ]
        rows.append(row)
    return headers, rows


def tie_statement(summary: dict) -> str:
    """How many of the headline's comparisons with SFT are ties, as a range over the methods; "" without tie rates."""
    judge = headline_judge(summary)
    pairings = (get_path(summary, "eval.win_rates", {}) or {}).get(judge) or {}
    rates = [
        entry["tie_rate"]
        for key, entry in pairings.items()
        if key.endswith("_vs_sft") and isinstance(entry, dict) and is_number(entry.get("tie_rate"))
    ]
    if not rates:
        return ""
    low, high = f"{min(rates):.0%}", f"{max(rates):.0%}"
    share = low if low == high else f"{low}–{high}"
    return (
        f"Under the `{judge}` judge, {share} of each method's comparisons with SFT are ties (answers equally good, "
        "often the very same answer); a tie counts as half a win, so the win rate moves only with the wins and losses."
    )


# judges no stage trained on (online DPO may train on openai's labels)
INDEPENDENT_JUDGES = ("gold", "openai", "independent")


def optimised_reward_model(summary: dict, stage: str) -> bool:
    """Whether `stage`'s policy was trained to maximise the reward model: an RL stage whose reward spec has the
    `model` term (`<stage>.reward_source`, e.g. "model + 0.5*rlhf.task:gold_rewards"), and for online DPO
    whose pairs the reward ranked (`online_dpo.judge` "reward"). Unrecorded settings count as the defaults."""
    if stage not in ONLINE_STAGES:
        return False
    results = summary.get(stage) if isinstance(summary.get(stage), dict) else {}
    terms = [term.strip().split("*")[-1].strip() for term in str(results.get("reward_source", "model")).split("+")]
    return "model" in terms and results.get("judge", "reward") == "reward"


def judges_statement(data: RunData) -> str:
    """Which judges ran; and when none of them is independent of training (only the reward model, the proxy the
    RL stages optimised), that every verdict rests on that proxy, why no independent judge ran, and the command
    that adds the LLM judge to this run."""
    win_rates = get_path(data.summary, "eval.win_rates", {}) or {}
    info = get_path(data.summary, "eval.judges", {}) or {}
    ran = [j for j in list(JUDGES) + sorted(set(win_rates) - set(JUDGES)) if win_rates.get(j)]
    if not ran:
        return ""
    models = eval_models(data.summary)
    trained = [model_label(m) for m in order_models(models) if optimised_reward_model(data.summary, m)]
    picked = [model_label(m) for m in order_models(models) if m.startswith("best_of_")]
    proxy = (
        "the run's own reward model, the proxy "
        + (f"that {and_list(trained)} optimised" if trained else "that the RL stages optimise")
        + (f" and {and_list(picked)} picked by" if picked else "")
    )
    independent = [j for j in ran if j in INDEPENDENT_JUDGES]
    if independent:
        llm = info.get("openai") if isinstance(info.get("openai"), dict) else {}
        described = {
            "gold": "`gold` (the embedded task's exact judge)",
            "openai": "`openai` (the LLM judge" + (f", `{llm['model']}`" if llm.get("model") else "") + ")",
            "independent": "`independent` (a second reward model trained on held-out pairs that neither the training "
            "reward model nor any policy saw; a noisy judge of its own, see [Win rates](#win-rates))",
        }
        return (
            f"**Judges:** {' and '.join(described[j] for j in independent)}, independent of training"
            + (f"; and `reward`, {proxy}, which favours those policies by construction" if "reward" in ran else "")
            + "."
        )
    skipped = [
        f"`{j}` {entry['status']}" for j, entry in info.items() if isinstance(entry, dict) and entry.get("status")
    ]
    why = "; ".join(skipped) if skipped else "none was configured (`eval.judges` names neither `gold` nor `openai`)"
    flags = f"--preset {data.preset}" if data.preset else "--config <its config file>"
    judges_override = "" if "openai" in info else " eval.judges=reward,openai"
    command = f"bash run_all.sh {flags} --output-dir {data.run_dir or '<run folder>'} --only eval,report --force"
    return (
        f"**Judges: the reward model alone.** Every verdict and score below comes from {proxy}, so it favours those "
        "policies by construction: it shows how far each method pushed the proxy, not that its answers are better. "
        f"No independent judge ran ({why}). To add the LLM judge, set `OPENAI_API_KEY` (and `OPENAI_BASE_URL` for "
        f"another OpenAI-compatible server) and run `{command}{judges_override}`, with the run's own "
        "`section.key=value` overrides if it had any."
    )


def section_headline(data: RunData) -> str:
    headers, rows = headline_rows(data.summary)
    lines = ["## Headline", ""]
    if not rows:
        return "\n".join(
            lines + [note("No evaluation results (`eval.models` is empty), so there is no headline table.")]
        )
    n = get_path(data.summary, "eval.decoding.num_prompts")
    n_bon = get_path(data.summary, "eval.best_of_n.n_prompts")
    statement = judges_statement(data)
    lines += [statement, ""] if statement else []
    # eval answers validation prompts when the data has no test split (rlhf.data.heldout_split)
    prompts = (
        "validation prompts (the data has no test split)"
        if get_path(data.summary, "eval.prompt_split") == "val"
        else "held-out test prompts"
    )
    lines += [
        f"Every model answered the same {fmt(n) + ' ' if is_number(n) else ''}{prompts} with the same "
        "decoding settings"
        + (f" (best-of-N: the first {fmt(n_bon)} of them)" if is_number(n_bon) else "")
        + "; details in [Evaluation](#evaluation).",
        "",
        markdown_table(headers, rows),
    ]
    notes = [
        tie_statement(data.summary),
        negative_kl_note(m.get("kl_to_ref") for m in eval_models(data.summary).values()),
    ]
    lines += [line for text in notes if text for line in ("", text)]
    glance = at_a_glance(data.summary, data.responses)
    versus = versus_sft_rows(data.summary)
    if glance or versus:
        proxy_only = statement.startswith("**Judges: the reward model alone.**")
        lead = "At a glance (read off the tables in this report" + (
            "; every line rests on the reward model alone, the proxy):" if proxy_only else "):"
        )
        lines += ["", lead, ""] + [f"- {line}" for line in glance]
    if versus:
        lines += [
            "",
            "Each method against SFT: it *beats* (or *loses to*) SFT when the win rate's 95% interval excludes 0.5 "
            "and the sign test, Holm-adjusted over the judge's comparisons with SFT, is below 0.05.",
            "",
            markdown_table(["method vs SFT", "judge", "win rate", "95% CI", "sign test p (Holm)", "verdict"], versus),
        ]
    return "\n".join(lines)


def at_a_glance(summary: dict, responses: dict[str, list[dict]] | None = None) -> list[str]:
    """A few plain statements derived from the numbers: who scores highest (`versus_sft_rows` says which wins over
    SFT are significant).

    Means are ranked only over models that answered the same prompts: a model evaluated on fewer of them (best-of-N,
    on the first `eval.best_of_n.n_prompts`) is ranked with the others on its own prompts, from `responses`
    (eval/responses/<model>.jsonl rows), or said to be left out when those are not at hand.
    """
    models = eval_models(summary)
    n_all = get_path(summary, "eval.decoding.num_prompts")
    full = [m for m in order_models(models) if not is_number(n_all) or models[m].get("n") in (None, n_all)]
    fewer = [m for m in order_models(models) if m not in full]
    responses = responses or {}
    lines = []
    for key, row_key, what in (
        ("reward_mean", "reward", "reward-model score"),
        ("gold_score_mean", "gold_score", "gold score"),
    ):
        scored = {m: models[m][key] for m in full if is_number(models[m].get(key))}
        if len(scored) > 1:
            top = fmt(max(scored.values()))
            best = [model_label(m) for m, value in scored.items() if fmt(value) == top]  # equal as shown: a tie
            lines.append(
                f"Highest mean {what}: {best[0]} ({top})."
                if len(best) == 1
                else f"Highest mean {what}: a tie at {top} between {and_list(best)}."
            )
        for small in [m for m in fewer if is_number(models[m].get(key))]:
            prompts = {row.get("prompt") for row in responses.get(small) or []}
            on_same = {
                m: [row.get(row_key) for row in responses.get(m) or [] if row.get("prompt") in prompts]
                for m in [*full, small]
            }
            on_same = {m: values for m, values in on_same.items() if len(values) == len(prompts) and prompts}
            if small in on_same and len(on_same) > 1 and all(is_number(v) for vs in on_same.values() for v in vs):
                means = sorted(on_same, key=lambda m: -sum(on_same[m]) / len(on_same[m]))  # stable: ties in order
                lines.append(
                    f"On the {fmt(len(prompts))} prompts {model_label(small)} answered, mean {what}, highest first: "
                    + ", ".join(f"{model_label(m)} {fmt(sum(on_same[m]) / len(on_same[m]))}" for m in means)
                    + "."
                )
            else:
                lines.append(
                    f"{model_label(small)} answered {fmt(models[small].get('n'))} of the {fmt(n_all)} prompts, so "
                    f"its mean {what} is not ranked with the others'."
                )
    return lines


def versus_sft_rows(summary: dict) -> list[list[str]]:
    """The table of every method against SFT under every judge that ran: win rate, interval, sign test and verdict.
    A method beats (or loses to) SFT when its 95% interval excludes 0.5 and its Holm-adjusted sign test
    (`sign_test_p_holm`) is below 0.05; without that key (an older summary.json) the interval alone decides."""
    rows = []
    win_rates = get_path(summary, "eval.win_rates", {}) or {}
    for judge in [j for j in JUDGES if win_rates.get(j)] + sorted(set(win_rates) - set(JUDGES)):
        for key in ordered_pairings(win_rates[judge] or {}):
            pair, entry = parse_pairing(key), win_rates[judge][key]
            if not pair or pair[1] != "sft" or not isinstance(entry, dict):
                continue
            low, high, rate = entry.get("ci95_low"), entry.get("ci95_high"), entry.get("win_rate")
            if not (is_number(low) and is_number(high) and is_number(rate)):
                continue
            p, p_holm = entry.get("sign_test_p"), entry.get("sign_test_p_holm")
            side = "**beats**" if low > 0.5 else "**loses to**" if high < 0.5 else None
            if side is None:
                verdict = "not distinguishable (the interval includes 0.5)"
            elif is_number(p_holm) and p_holm >= 0.05:
                verdict = "not distinguishable after Holm's adjustment"
            else:
                verdict = side
            test = "n/a"
            if is_number(p):
                test = fmt_p(p) + (f" ({fmt_p(p_holm)})" if is_number(p_holm) else "")
            rows.append([model_label(pair[0]), f"`{judge}`", fmt(rate), fmt_ci(low, high), test, verdict])
    return rows


def section_data(data: RunData) -> str:
    d = data.summary.get("data")
    lines = ["## Data", ""]
    if not isinstance(d, dict):
        return "\n".join(lines + [note("No `data` section in summary.json: the data stage's statistics are missing.")])
    splits = [s for s in ("train", "val", "test") if s in (d.get("n_pairs") or {}) or s in (d.get("n_raw") or {})]
    raw, pairs = d.get("n_raw") or {}, d.get("n_pairs") or {}
    lines += [
        "Preference pairs per split: rows read from the source, and pairs kept after parsing and filtering "
        "(validation pairs are carved from train by prompt, so no prompt is in two splits).",
        "",
        markdown_table(
            ["split", "rows read", "pairs kept"],
            [[s, fmt(raw[s]) if s in raw else "(from train)" if s == "val" else NA, fmt(pairs.get(s))] for s in splits],
        ),
    ]
    dropped, by_split = d.get("dropped") or {}, d.get("dropped_by_split") or {}
    if dropped:
        drop_splits = [s for s in ("train", "test") if s in by_split]
        rows = [
            [reason] + [fmt(by_split[s].get(reason)) for s in drop_splits] + [fmt(count)]
            for reason, count in dropped.items()
        ]
        lines += [
            "",
            "Edge cases: rows dropped, by reason (a row counts under the first reason that applies).",
            "",
            markdown_table(["reason"] + drop_splits + ["total"], rows),
        ]
    lengths = d.get("lengths") or {}
    rows = [
        [
            s,
            fmt(v.get("n")),
            fmt(v.get("prompt_tokens_mean"), 1),
            fmt_pm(v.get("chosen_tokens_mean"), v.get("chosen_tokens_std"), 1),
            fmt_pm(v.get("rejected_tokens_mean"), v.get("rejected_tokens_std"), 1),
            fmt(v.get("chosen_minus_rejected_mean"), 2),
            fmt(v.get("chosen_longer_fraction")),
        ]
        for s, v in lengths.items()
        if isinstance(v, dict) and v.get("n")
    ]
    if rows:
        lines += [
            "",
            "Token lengths. *Chosen longer* is the share of pairs whose preferred response is the longer one: "
            '0.5 means no length bias, and it is also the accuracy of a "pick the longer response" baseline.',
            "",
            markdown_table(
                [
                    "split",
                    "pairs",
                    "prompt tokens",
                    "chosen tokens",
                    "rejected tokens",
                    "chosen − rejected",
                    "chosen longer",
                ],
                rows,
            ),
        ]
    embedded = d.get("embedded")
    if isinstance(embedded, dict):
        ceiling, agree = embedded.get("noise_ceiling") or {}, embedded.get("gold_agreement") or {}
        rows = [
            [s, fmt(ceiling.get(s)), fmt(agree.get(s))] for s in ("train", "val", "test") if s in ceiling or s in agree
        ]
        lines += [
            "",
            f"Embedded task: the simulated annotator picks the longer response with probability "
            f"{fmt(embedded.get('length_bias'), 2)} and otherwise errs with probability "
            f"{fmt(embedded.get('annotator_noise'), 2)}. "
            "The *noise ceiling* is the best accuracy any predictor can reach on these noisy labels; *gold agreement* "
            "is the share of labels that match the gold judge.",
            "",
            markdown_table(["split", "noise ceiling", "labels agree with gold"], rows),
        ]
    return "\n".join(lines)


def section_collect(data: RunData) -> str:
    """The collect stage's pairs of SFT samples, when the run has them: counts, drops, and (embedded
    task) how well the annotator's labels agree with gold by what separates the two responses."""
    c = data.summary.get("collect")
    if not isinstance(c, dict):
        return ""
    annotator = (c.get("annotator") or {}).get("judge", NA)
    readers = [
        f"`{stage}.pairs`"
        for stage in PAIR_READERS
        if get_path(data.summary, f"{STAGES[stage].summary_section}.pairs") in ("collected", "both")
    ]
    lines = [
        "## Collected pairs",
        "",
        f"The collect stage sampled {fmt(c.get('samples_per_prompt'))} responses to each of {fmt(c.get('prompts'))} "
        f"training prompts from the SFT policy and had the `{annotator}` annotator compare "
        f"{fmt(c.get('pairs_compared'))} distinct pairs of them; {fmt(c.get('n_pairs'))} labelled pairs were written. "
        + (f"Trained on them: {', '.join(readers)}." if readers else "No stage of this run trained on them."),
    ]
    dropped = {reason: n for reason, n in (c.get("dropped") or {}).items() if n}
    if dropped:
        lines += ["", markdown_table(["pairs dropped because", "count"], [[r, fmt(n)] for r, n in dropped.items()])]
    by_kind = c.get("labels_vs_gold_by_gold_difference") or {}
    if by_kind:
        lines += [
            "",
            f"Against gold, the labels agree on {fmt(c.get('gold_agreement'))} of the written pairs "
            f"(noise ceiling {fmt(c.get('noise_ceiling'))}); gold ties {fmt(c.get('gold_tie_rate'))} of the compared "
            "pairs. By what separates the two responses:",
            "",
            markdown_table(
                ["gold difference", "pairs", "labels agree with gold"],
                [[kind, fmt(v.get("n_decisive")), fmt(v.get("agreement_decisive"))] for kind, v in by_kind.items()],
            ),
        ]
    return "\n".join(lines)


def section_reward_model(data: RunData) -> str:
    rm = data.summary.get("reward_model")
    lines = ["## Reward model", ""]
    if not isinstance(rm, dict):
        return "\n".join(lines + [note("No `reward_model` section in summary.json: the reward stage did not run.")])
    ceiling = get_path(data.summary, "data.embedded.noise_ceiling", {}) or {}
    lengths = get_path(data.summary, "data.lengths", {}) or {}
    has_gold = any(f"{s}_gold_accuracy" in rm for s in ("val", "test"))
    headers = (
        ["split", "accuracy (labels)"]
        + (["accuracy (gold)"] if has_gold else [])
        + (["noise ceiling"] if ceiling else [])
        + ["pick-the-longer baseline", "length–reward corr.", "mean reward chosen", "mean reward rejected"]
    )
    rows = []
    for split in ("val", "test"):
        if f"{split}_accuracy" not in rm:
            continue
        row = [split, fmt(rm.get(f"{split}_accuracy"))] + ([fmt(rm.get(f"{split}_gold_accuracy"))] if has_gold else [])
        row += [fmt(ceiling.get(split))] if ceiling else []
        row += [
            fmt((lengths.get(split) or {}).get("chosen_longer_fraction")),
            fmt(rm.get(f"{split}_length_reward_correlation")),
            fmt(rm.get(f"{split}_chosen_reward_mean")),
            fmt(rm.get(f"{split}_rejected_reward_mean")),
        ]
        rows.append(row)
    lines += [
        "Accuracy is the share of held-out pairs where the reward model scores the chosen response above the "
        "rejected one."
        + (
            " *Gold* accuracy scores the same ranking against the gold judge's preference instead of the noisy labels."
            if has_gold
            else ""
        )
        + " A length–reward correlation far from 0 means the model rewards length itself.",
        "",
        markdown_table(headers, rows) if rows else note("No held-out accuracy was recorded."),
    ]
    judge_rm = data.summary.get("judge_reward_model")
    if isinstance(judge_rm, dict):
        lines += [
            "",
            "The independent judge's reward model (stage `judge_rm`), trained the same way on "
            f"{fmt(judge_rm.get('train_pairs'))} held-out pairs that neither this reward model nor any policy saw: "
            f"accuracy val {fmt(judge_rm.get('val_accuracy'))}, test {fmt(judge_rm.get('test_accuracy'))}.",
        ]
    by_family = rm.get("gold_accuracy_by_family")
    if isinstance(by_family, dict) and by_family:
        families = sorted({f for accuracies in by_family.values() if isinstance(accuracies, dict) for f in accuracies})
        rows = [[split] + [fmt((accuracies or {}).get(f)) for f in families] for split, accuracies in by_family.items()]
        lines += [
            "",
            "Agreement with gold by prompt family shows what the reward model has and has not learned:",
            "",
            markdown_table(["split"] + families, rows),
        ]
    if is_number(rm.get("offset")):
        lines += [
            "",
            f"Normalisation offset subtracted from every reward: {fmt(rm['offset'])} (reference responses score 0 on "
            "average; Huang et al. 2024).",
        ]
    if is_number(rm.get("length_heuristic_weight")):
        lines += [
            "",
            "Trained as a length-heuristic rater (`reward.length_heuristic`): each label is read as the longer "
            f"response with probability w = {fmt(rm['length_heuristic_weight'])}, learnt from the labels, and as the "
            "reward model's preference otherwise, so labels that length explains teach the reward less.",
        ]
    lines += ["", "### Error analysis", ""]
    analysis = data.error_analysis or {}
    if not analysis:
        counts = rm.get("error_counts") or {}
        analysis = {split: {"counts": c} for split, c in counts.items()}
    if not analysis:
        return "\n".join(lines + [note("No error analysis in this run (`reward/error_analysis.json` is missing).")])
    categories = [c for c in ERROR_CATEGORY_ORDER if any(c in (a.get("counts") or {}) for a in analysis.values())]
    categories += sorted({c for a in analysis.values() for c in (a.get("counts") or {})} - set(categories))
    rows = [
        [split, fmt(a.get("misclassified")), fmt(a.get("n"))]
        + [fmt((a.get("counts") or {}).get(c)) for c in categories]
        for split, a in analysis.items()
    ]
    lines += [
        "Misclassified pairs by category (a pair can be in several): `confident_wrong` = margin beyond one std "
        "of the margins, `small_margin` = within a quarter std (ambiguous), `longer_rejected_preferred` = the "
        "wrongly preferred response is the longer one, `very_short` = a response of at most 3 tokens.",
        "",
        markdown_table(["split", "misclassified", "pairs"] + categories, rows),
    ]
    examples = _error_examples(analysis, 2)
    for category, example in examples:
        gold = ""
        if is_number(example.get("gold_chosen")) and is_number(example.get("gold_rejected")):
            gold = f"; gold scores chosen {fmt(example['gold_chosen'])}, rejected {fmt(example['gold_rejected'])}"
            if example["gold_chosen"] < example["gold_rejected"]:
                gold += ' (the gold judge agrees with the reward model: this "error" is a noisy label)'
        lines += [
            "",
            f"Example (`{category}`): reward chosen {fmt(example.get('reward_chosen'))}, rejected "
            f"{fmt(example.get('reward_rejected'))}{gold}.",
            "",
            "Prompt:",
            "",
            code_block(example.get("prompt", ""), 600),
            "",
            "The pair: the response the label prefers, which the reward model scored lower, and the other one.",
            "",
            markdown_table(
                ["response", "text"],
                [
                    ["chosen (label)", escape_cell(example.get("chosen"), 300)],
                    ["rejected", escape_cell(example.get("rejected"), 300)],
                ],
                "ll",
            ),
        ]
    return "\n".join(lines)


def _error_examples(analysis: dict, k: int) -> list[tuple[str, dict]]:
    """Up to k examples from different categories, test split first."""
    split = next((s for s in ("test", "val") if s in analysis), next(iter(analysis), None))
    examples = (analysis.get(split) or {}).get("examples") or {}
    picked, seen = [], set()
    for category in list(ERROR_CATEGORY_ORDER) + sorted(examples):
        for example in examples.get(category) or []:
            key = (example.get("prompt"), example.get("chosen"), example.get("rejected"))
            if category not in {c for c, _ in picked} and key not in seen and len(picked) < k:
                picked.append((category, example))
                seen.add(key)
    return picked


def stage_result(key: str, value, digits: int) -> str:
    """One value of a training-table row: strings as they are, KL estimates marked when below 0, else `fmt`."""
    if isinstance(value, str):
        return value
    return fmt_kl(value, digits=digits) if key == "kl_to_ref" else fmt(value, digits)


def section_training(data: RunData) -> str:
    timing = data.summary.get("timing_s") or {}
    lines = [
        "## Training",
        "",
        "One row per training stage, from summary.json: its length, its final metrics, its "
        "wall-clock time and, where recorded, its peak memory (CUDA max allocated on GPU, process max RSS on CPU). "
        "*val* numbers are the stage's own measurements on validation prompts (a comparison with SFT there is with "
        "SFT's samples of those prompts); the [Headline](#headline) and [Evaluation](#evaluation) judge every model "
        f"again on the {eval_split(data.summary)} prompts, so their scores and win rates differ from these.",
        "",
    ]
    rows, missing, kls = [], [], []
    for stage in TRAINED_STAGES:
        results = data.summary.get(SUMMARY_SECTION.get(stage, stage))
        if not isinstance(results, dict):
            missing.append(stage)
            continue
        kls.append(results.get("kl_to_ref"))
        length_key = next((k for k in ("steps", "iterations", "rounds") if is_number(results.get(k))), None)
        shown = [
            f"{label} {stage_result(key, results[key], digits)}"
            for key, label, digits in STAGES[stage].results
            if results.get(key) is not None
        ]
        rows.append(
            [
                STAGE_LABELS[stage],
                f"{fmt(results[length_key])} {length_key}" if length_key is not None else NA,
                "; ".join(shown) or NA,
                fmt_seconds(timing.get(stage)),
                peak_memory(results),
            ]
        )
    lines.append(
        markdown_table(["stage", "length", "final metrics", "time", "peak memory"], rows, "llllr")
        if rows
        else note("No training stage has results in summary.json.")
    )
    for stage in missing:
        lines += [
            "",
            note(
                f"{STAGE_LABELS[stage]}: not in this run "
                f"(no `{SUMMARY_SECTION.get(stage, stage)}` section in summary.json)."
            ),
        ]
    kl_note = negative_kl_note(kls)
    return "\n".join(lines + (["", kl_note] if kl_note else []))
