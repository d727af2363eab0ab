"""The run report: pure functions from a run's loaded files to markdown (no I/O, no models).

`part4_eval/make_report.py` reads the run folder into a `RunData` and calls `render_report`.
Every number in the output comes from that `RunData`, i.e. from the run's own files; the one
exception is `EXTERNAL_REFERENCES`, published numbers that are printed in their own, clearly
labelled section and never mixed into the run's tables.

Missing pieces degrade to a one-line note: a run without GRPO, without the OpenAI judge, or on
HH data (no gold judge) simply has fewer rows and sections.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

NA = "n/a"
TRAINED_STAGES = ("sft", "reward", "ppo", "grpo", "raft", "dpo")
POLICY_STAGES = ("ppo", "grpo", "raft", "dpo")  # trained policies the evaluation is expected to include
SUMMARY_SECTION = {"reward": "reward_model"}  # stage name -> its summary.json section, where they differ
MODEL_ORDER = ("base", "sft", "ppo", "grpo", "raft", "dpo")  # then best_of_<N>, chosen, and anything else by name
STAGE_LABELS = {
    "data": "data",
    "sft": "SFT",
    "reward": "reward model",
    "ppo": "PPO",
    "grpo": "GRPO",
    "raft": "RAFT",
    "dpo": "DPO",
    "eval": "evaluation",
    "report": "report",
}
JUDGES = {
    "gold": "the embedded task's exact gold judge (`rlhf/task/gold.py`): the true quality of each response",
    "reward": "the run's own reward model, used as a judge (the proxy the RL stages optimised)",
    "openai": "an OpenAI-compatible chat model, each pair judged in both orders at temperature 0",
}
ERROR_CATEGORY_ORDER = ("confident_wrong", "longer_rejected_preferred", "small_margin", "very_short")

# Published numbers (see /work/shared/REFERENCES.md), shown only in the "External reference points" section.
EXTERNAL_REFERENCES = (
    (
        "RM accuracy on HH-RLHF, sub-1B language models",
        "about 0.60–0.67",
        "OpenAssistant Pythia reward models; two GPT-2 reports give 0.628 and 0.673",
    ),
    ('RM accuracy on HH-RLHF, the "pick the longer answer" heuristic', "about 0.55", "trlx issue discussion"),
    ("RM accuracy on TL;DR, Pythia 1B / 2.8B / 6.9B", "0.629 / 0.669 / 0.689", "Huang et al. 2024 (arXiv 2403.17031)"),
    (
        "DPO implicit-reward accuracy on TL;DR, same models",
        "0.621 / 0.663 / 0.674",
        "Huang et al. 2024 (arXiv 2403.17031)",
    ),
    (
        "PPO win rate vs reference summaries (GPT-3.5 judge), Pythia 1B / 2.8B / 6.9B",
        "about 0.58 on good seeds (2 of 4 seeds collapsed) / 0.724 / 0.769",
        "Huang et al. 2024 (arXiv 2403.17031)",
    ),
    ("PPO win rate, Pythia-1B, GPT-4o-mini judge", "64.7% (SFT 33.0%)", "TRL documentation"),
    (
        "One checkpoint under three judges",
        "46.3% (Llama-3-70B), 52.5% (GPT-3.5), 63.0% (GPT-4o-mini)",
        "TRL judge script docstring",
    ),
    (
        "DPO vs chosen on HH-RLHF, Pythia-2.8B, GPT-4 judge",
        "about 0.6; PPO no better than base",
        "Rafailov et al. 2023 (arXiv 2305.18290)",
    ),
    ("Human–human agreement on preference labels", "about 0.63–0.77", "Bai et al. 2022; Stiennon et al. 2020"),
    (
        "GPT-2 124M pipeline on one RTX A6000",
        "6.5 h in total; PPO 52 min for 10k prompts; DPO 163 min per epoch",
        "one of the reports this project reproduces",
    ),
)

FIGURES = (  # key, title, what to look for
    (
        "reward_vs_kl",
        "Reward vs KL to the reference",
        "Each model is a point; best-of-N from the SFT policy is the curve (its KL is the analytic log N − (N−1)/N). "
        "Up and to the left is better. A policy far above best-of-N on reward-model score but not on gold score is "
        "over-optimising the proxy (Gao et al. 2022, arXiv 2210.10760).",
    ),
    (
        "reward_distributions",
        "Reward-model scores per model",
        "The spread of the reward-model score over the evaluation prompts, one violin per model.",
    ),
    (
        "win_rates",
        "Win rates per judge",
        "Cell (row A, column B): win rate of A against B, ties counted half. Measured pairings are shown; their mirror "
        "cells are 1 − the measured value; n/a where a pairing was not judged.",
    ),
    (
        "training_curves",
        "Training curves of every stage",
        "A fixed set of metrics per stage, against optimizer step (PPO/GRPO: iteration); absent metrics are skipped.",
    ),
    (
        "response_lengths",
        "Response lengths per model",
        "Tokens per evaluation response. A policy that drifts long (or piles up at the token budget) is a sign of "
        "length hacking or of missing EOS.",
    ),
    ("data_lengths", "Preference data: token lengths", "Chosen vs rejected response lengths, per split (data stage)."),
    ("reward_test", "Reward model on the test split", "Rewards of chosen vs rejected test responses (reward stage)."),
)


@dataclass
class RunData:
    """Everything the report reads, already loaded from the run folder."""

    summary: dict  # summary.json
    preset: str | None = None  # the preset name, when run from one
    run_dir: str = ""  # where the run folder is (shown, never read here)
    model: dict = field(default_factory=dict)  # {"name_or_path", "init", "model_type", "config_overrides", "n_params"}
    responses: dict[str, list[dict]] = field(default_factory=dict)  # eval/responses/<model>.jsonl rows
    suite_rows: dict[str, list[dict]] = field(default_factory=dict)  # eval/suites/<suite>.jsonl rows
    error_analysis: dict = field(default_factory=dict)  # reward/error_analysis.json
    figures: dict[str, str] = field(
        default_factory=dict
    )  # figure key (FIGURES, or curves_<stage>) -> path relative to report.md


# ----------------------------------------------------------------------------- formatting


def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def fmt(value, digits: int = 3) -> str:
    """A number for a table: ints with thousands separators, floats to `digits` decimals, else n/a.

    Strings pass through; None, NaN and infinities are n/a.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not is_number(value):
        return NA
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def fmt_pm(mean, std, digits: int = 3) -> str:
    """`mean ± std`, or just the mean when the std is missing."""
    if not is_number(mean):
        return NA
    return f"{fmt(float(mean), digits)} ± {fmt(float(std), digits)}" if is_number(std) else fmt(float(mean), digits)


def fmt_ci(low, high, digits: int = 3) -> str:
    return f"[{fmt(float(low), digits)}, {fmt(float(high), digits)}]" if is_number(low) and is_number(high) else NA


def fmt_seconds(seconds) -> str:
    """Wall-clock time: seconds below two minutes, minutes below two hours, else hours."""
    if not is_number(seconds):
        return NA
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def fmt_params(n) -> str:
    if not is_number(n):
        return NA
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}K"


def model_label(name: str) -> str:
    """Display name of a model key: sft -> SFT, best_of_16 -> best-of-16, chosen -> dataset chosen."""
    match = re.fullmatch(r"best_of_(\d+)", name)
    if match:
        return f"best-of-{match.group(1)}"
    if name == "chosen":
        return "dataset chosen"
    return {"sft": "SFT", "ppo": "PPO", "grpo": "GRPO", "raft": "RAFT", "dpo": "DPO"}.get(name, name)


def order_models(names) -> list[str]:
    """Canonical order: base, sft, ppo, grpo, raft, dpo, best_of_<N> (by N), chosen, then the rest by name."""

    def key(name: str):
        if name in MODEL_ORDER:
            return (0, MODEL_ORDER.index(name), 0, "")
        match = re.fullmatch(r"best_of_(\d+)", name)
        if match:
            return (1, 0, int(match.group(1)), "")
        return (2 if name == "chosen" else 3, 0, 0, name)

    return sorted(set(names), key=key)


def parse_pairing(key: str) -> tuple[str, str] | None:
    """`<a>_vs_<b>` -> (a, b); model names may contain underscores but not `_vs_`."""
    parts = key.split("_vs_")
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


def escape_cell(text, limit: int | None = None) -> str:
    """Text for one markdown table cell: at most `limit` characters, no raw pipes or newlines."""
    text = "" if text is None else str(text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def code_block(text: str, limit: int | None = None) -> str:
    """A fenced block that survives any backticks in `text`."""
    text = "" if text is None else str(text)
    if limit is not None and len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text.strip(chr(10))}\n{fence}"


def markdown_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A GitHub markdown table. Cells are str()-ed (None -> n/a) and escaped.

    align: one letter per column, l (left), r (right) or c (centre); default: first column
    left, the rest right (numbers).
    """
    width = len(headers)
    align = align or "l" + "r" * (width - 1)
    if len(align) != width:
        raise ValueError(f"align has {len(align)} letters for {width} columns")
    rule = {"l": "---", "r": "---:", "c": ":---:"}
    lines = ["| " + " | ".join(escape_cell(h) for h in headers) + " |", "|" + "|".join(rule[a] for a in align) + "|"]
    for row in rows:
        if len(row) != width:
            raise ValueError(f"row {row!r} has {len(row)} cells for {width} columns")
        lines.append("| " + " | ".join(NA if cell is None else escape_cell(cell) for cell in row) + " |")
    return "\n".join(lines)


def win_rate_matrix(pairings: dict) -> tuple[list[str], list[list]]:
    """Model names (canonical order) and cells[i][j] = (win rate of i vs j, measured) or None.

    A measured `<a>_vs_<b>` fills (a, b); its mirror (b, a), when not measured itself, is
    1 - win_rate (exact, as ties count half on both sides), flagged measured=False.
    """
    measured = {}
    for key, entry in pairings.items():
        pair = parse_pairing(key)
        if pair and isinstance(entry, dict) and is_number(entry.get("win_rate")):
            measured[pair] = float(entry["win_rate"])
    names = order_models({m for pair in measured for m in pair})
    cells = []
    for a in names:
        row = []
        for b in names:
            if (a, b) in measured:
                row.append((measured[(a, b)], True))
            elif (b, a) in measured:
                row.append((1.0 - measured[(b, a)], False))
            else:
                row.append(None)
        cells.append(row)
    return names, cells


def note(text: str) -> str:
    return f"_{text}_"


def _get(tree: dict, path: str, default=None):
    """tree["a"]["b"]... for path "a.b...", or default where any level is missing."""
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def eval_models(summary: dict) -> dict[str, dict]:
    """`eval.models`, keeping only well-formed (dict) entries."""
    models = _get(summary, "eval.models", {}) or {}
    return {name: m for name, m in models.items() if isinstance(m, dict)} if isinstance(models, dict) else {}


# ----------------------------------------------------------------------------- sections


def section_intro(data: RunData) -> str:
    summary = data.summary
    source = _get(summary, "data.source")
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
        "and RAFT, which fine-tunes on its own best-of-N samples), and DPO, which learns from the preference pairs "
        "directly. Every number below is read from the run folder"
        + (f" `{data.run_dir}`" if data.run_dir else "")
        + " by `part4_eval/make_report.py`; nothing is retrained.",
        "",
        f"- **Data:** {source_text}.",
        f"- **Policy model:** {model_text}.",
        f"- **Stages in this run:** {', '.join(STAGE_LABELS[s] for s in stages_run) or 'none'}"
        + (f"; not run: {', '.join(STAGE_LABELS[s] for s in stages_missing)}" if stages_missing else "")
        + ".",
        "",
        "How to read the numbers:",
        "",
        "- **RM reward**: the trained reward model's score, normalised so the reference (SFT-data) responses "
        "score 0 on average. It is the proxy that PPO, GRPO and best-of-N optimise, so it can be gamed.",
        "- **KL to ref**: how far a policy has moved from the SFT policy, in nats per response (a Monte Carlo estimate "
        "of Σ log π − log π_ref over the sampled tokens). Higher reward at lower KL is the better trade-off.",
        "- **Gold score** (embedded task only): the exact quality of a response, which no method ever trains on.",
        "- **Win rate** of A vs B: the share of prompts where a judge prefers A's response, ties counted half, with a "
        "95% Wilson interval. The **LC** (length-controlled) win rate is the same, predicted at equal response length "
        "(Dubois et al. 2024), because judges tend to prefer longer answers.",
        "- **best-of-N**: N samples from the SFT policy, the one the reward model likes best kept; a training-free "
        "baseline at a known KL of log N − (N−1)/N.",
    ]
    return "\n".join(lines)


def headline_rows(summary: dict) -> tuple[list[str], list[list]]:
    """The compact per-model table (also for the README): reward, KL, gold, win rate vs SFT."""
    models = eval_models(summary)
    names = order_models(models)
    has_gold = any(is_number(models[m].get("gold_score_mean")) for m in names)
    win_rates = _get(summary, "eval.win_rates", {}) or {}
    judge = next(
        (j for j in ("gold", "openai", "reward") if any(k.endswith("_vs_sft") for k in win_rates.get(j) or {})), None
    )
    headers = (
        ["model", "RM reward", "KL to ref (nats)"]
        + (["gold score", "gold good-rate"] if has_gold else [])
        + (["length"])
        + ([f"win rate vs SFT ({judge} judge)"] if judge else [])
    )
    rows = []
    for name in names:
        m = models[name]
        row = [model_label(name), fmt(m.get("reward_mean")), fmt(m.get("kl_to_ref"))]
        if has_gold:
            row += [fmt(m.get("gold_score_mean")), fmt(m.get("gold_good_rate"))]
        row.append(fmt(m.get("length_mean"), 1))
        if judge:
            entry = win_rates[judge].get(f"{name}_vs_sft")
            row.append(
                "(reference)"
                if name == "sft"
                else NA
                if not entry
                else f"{fmt(entry.get('win_rate'))} {fmt_ci(entry.get('ci95_low'), entry.get('ci95_high'))}"
            )
        rows.append(row)
    return headers, rows


def section_headline(data: RunData) -> str:
    headers, rows = headline_rows(data.summary)
    lines = ["## Headline", ""]
    if not rows:
        return "\n".join(
            lines + [note("No evaluation results (`eval.models` is empty), so there is no headline table.")]
        )
    n = _get(data.summary, "eval.decoding.num_prompts")
    n_bon = _get(data.summary, "eval.best_of_n.n_prompts")
    lines += [
        f"Every model answered the same {fmt(n) + ' ' if is_number(n) else ''}held-out prompts with the same "
        "decoding settings"
        + (f" (best-of-N: the first {fmt(n_bon)} of them)" if is_number(n_bon) else "")
        + "; details in [Evaluation](#evaluation).",
        "",
        markdown_table(headers, rows),
    ]
    glance = at_a_glance(data.summary)
    if glance:
        lines += ["", "At a glance (read off the tables in this report):", ""] + [f"- {line}" for line in glance]
    return "\n".join(lines)


def at_a_glance(summary: dict) -> list[str]:
    """A few plain statements derived from the numbers: who scores highest, and which wins over SFT are significant."""
    models = eval_models(summary)
    lines = []
    for key, what in (("reward_mean", "reward-model score"), ("gold_score_mean", "gold score")):
        scored = [(models[m][key], m) for m in order_models(models) if is_number(models[m].get(key))]
        if len(scored) > 1:
            value, best = max(scored)
            lines.append(f"Highest mean {what}: {model_label(best)} ({fmt(value)}).")
    win_rates = _get(summary, "eval.win_rates", {}) or {}
    for judge in [j for j in JUDGES if win_rates.get(j)] + sorted(set(win_rates) - set(JUDGES)):
        for key in _ordered_pairings(win_rates[judge] or {}):
            pair, entry = parse_pairing(key), win_rates[judge][key]
            if not pair or pair[1] != "sft" or not isinstance(entry, dict):
                continue
            low, high, rate = entry.get("ci95_low"), entry.get("ci95_high"), entry.get("win_rate")
            if not (is_number(low) and is_number(high) and is_number(rate)):
                continue
            verdict = "beats SFT" if low > 0.5 else "loses to SFT" if high < 0.5 else "is not distinguishable from SFT"
            lines.append(
                f"{model_label(pair[0])} {verdict} under the `{judge}` judge: win rate {fmt(rate)}, "
                f"95% CI {fmt_ci(low, high)} {'includes' if low <= 0.5 <= high else 'excludes'} 0.5."
            )
    return lines


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
        f"`{key}`"
        for key, section in (("reward.pairs", "reward_model"), ("dpo.pairs", "dpo"))
        if _get(data.summary, f"{section}.pairs") in ("collected", "both")
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
    ceiling = _get(data.summary, "data.embedded.noise_ceiling", {}) or {}
    lengths = _get(data.summary, "data.lengths", {}) or {}
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
            markdown_table(
                ["", "response"],
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


# What each stage's row of the training table shows: (summary key, label, decimals).
STAGE_RESULT_KEYS = {
    "sft": (
        ("val_loss", "val loss", 3),
        ("val_perplexity", "val perplexity", 2),
        ("gold_good_rate", "gold good-rate", 3),
        ("gold_score_mean", "gold score", 3),
    ),
    "reward": (
        ("val_accuracy", "val accuracy", 3),
        ("test_accuracy", "test accuracy", 3),
        ("test_gold_accuracy", "test accuracy vs gold", 3),
    ),
    "ppo": (
        ("episodes", "episodes", 0),
        ("reward_mean", "RM reward", 3),
        ("sft_reward_mean", "SFT RM reward", 3),
        ("kl_to_ref", "KL to ref", 3),
        ("gold_score_mean", "gold score", 3),
        ("gold_win_rate_vs_sft", "gold win rate vs SFT", 3),
        ("final_kl_coef", "final β", 3),
        ("time_per_sample_ms", "ms per sample", 1),
    ),
    "dpo": (
        ("loss_type", "loss", 0),
        ("beta", "β", 3),
        ("train_loss", "final train loss", 3),
        ("val_accuracy", "val implicit-reward accuracy", 3),
        ("test_accuracy", "test implicit-reward accuracy", 3),
        ("gold_score_mean", "gold score", 3),
        ("win_rate_vs_sft", "gold win rate vs SFT", 3),
    ),
}
STAGE_RESULT_KEYS["grpo"] = (
    ("episodes", "episodes", 0),
    ("group_size", "group size G", 0),
    ("reward_mean", "RM reward", 3),
    ("sft_reward_mean", "SFT RM reward", 3),
    ("kl_to_ref", "KL to ref", 3),
    ("gold_score_mean", "gold score", 3),
    ("gold_win_rate_vs_sft", "gold win rate vs SFT", 3),
    ("train_zero_std_groups", "zero-std groups", 3),
    ("time_per_sample_ms", "ms per sample", 1),
)
STAGE_RESULT_KEYS["raft"] = (
    ("episodes", "episodes", 0),
    ("samples_per_prompt", "samples per prompt N", 0),
    ("top_k", "kept per prompt", 0),
    ("reward_mean", "RM reward", 3),
    ("sft_reward_mean", "SFT RM reward", 3),
    ("kl_to_ref", "KL to ref", 3),
    ("gold_score_mean", "gold score", 3),
    ("gold_win_rate_vs_sft", "gold win rate vs SFT", 3),
    ("time_per_sample_ms", "ms per sample", 1),
)


def peak_memory(results: dict) -> str:
    mb = results.get("peak_memory_mb")
    if not is_number(mb):
        return NA
    kind = results.get("peak_memory_source") or results.get("peak_memory_kind")
    return f"{mb:,.0f} MB" + (f" ({kind})" if kind else "")


def section_training(data: RunData) -> str:
    timing = data.summary.get("timing_s") or {}
    lines = [
        "## Training",
        "",
        "One row per training stage, from summary.json: its length, its final metrics, its "
        "wall-clock time and, where recorded, its peak memory (CUDA max allocated on GPU, process max RSS on CPU).",
        "",
    ]
    rows, missing = [], []
    for stage in TRAINED_STAGES:
        results = data.summary.get(SUMMARY_SECTION.get(stage, stage))
        if not isinstance(results, dict):
            missing.append(stage)
            continue
        length_key = next((k for k in ("steps", "iterations", "rounds") if is_number(results.get(k))), None)
        shown = [
            f"{label} {fmt(results[key], digits) if not isinstance(results[key], str) else results[key]}"
            for key, label, digits in STAGE_RESULT_KEYS.get(stage, ())
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
    return "\n".join(lines)


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
    ] + (["gold score", "gold good-rate"] if has_gold else [])
    rows = []
    for name in names:
        m = models[name]
        row = [
            model_label(name),
            fmt(m.get("n")),
            fmt_pm(m.get("reward_mean"), m.get("reward_std")),
            fmt_pm(m.get("kl_to_ref"), m.get("kl_to_ref_std")),
            fmt(m.get("length_mean"), 1),
            fmt(m.get("eos_rate")),
            fmt(m.get("distinct_2")),
        ]
        if has_gold:
            row += [fmt(m.get("gold_score_mean")), fmt(m.get("gold_good_rate"))]
        rows.append(row)
    lines += [
        "### Per-model metrics",
        "",
        "*EOS rate*: share of responses that ended on their own within the token budget. "
        "*distinct-2*: distinct token bigrams over all bigrams in the model's responses (low means repetitive)."
        + (" *Gold good-rate*: share of responses the gold judge rates fully correct." if has_gold else ""),
        "",
        markdown_table(headers, rows),
    ]
    for stage in ("sft",) + POLICY_STAGES:
        if stage not in models:
            lines += ["", note(f"{model_label(stage)}: not evaluated in this run (no `eval.models.{stage}`).")]
    return "\n".join(lines)


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


def section_win_rates(data: RunData) -> str:
    win_rates = _get(data.summary, "eval.win_rates", {}) or {}
    judges_info = _get(data.summary, "eval.judges", {}) or {}
    if not isinstance(data.summary.get("eval"), dict):
        return ""  # the Evaluation section already says the results are missing
    embedded = _get(data.summary, "data.source") == "embedded"
    lines = [
        "### Win rates",
        "",
        "Pairwise comparisons on the same prompts. Win rate counts ties as half a win; the "
        "95% interval is Wilson's; *LC* is the length-controlled win rate; *invalid* prompts (a judge gave no usable "
        "answer) are excluded from every rate.",
    ]
    for judge in list(JUDGES) + sorted(set(win_rates) - set(JUDGES)):
        info = judges_info.get(judge) or {}
        pairings = win_rates.get(judge) or {}
        lines += ["", f"#### Judge: `{judge}`", ""]
        status = info.get("status") if isinstance(info, dict) else None
        if not pairings:
            reason = status or (
                "no gold judge for this data (it exists only on the embedded task)"
                if judge == "gold" and not embedded
                else "not run"
            )
            lines.append(note(f"No `{judge}` judge results: {reason}."))
            continue
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
        rows = []
        for key in _ordered_pairings(pairings):
            entry = pairings[key]
            a, b = parse_pairing(key) or (key, "")
            rows.append(
                [
                    f"{model_label(a)} vs {model_label(b)}" if b else key,
                    fmt(entry.get("win_rate")),
                    fmt_ci(entry.get("ci95_low"), entry.get("ci95_high")),
                    fmt(entry.get("lc_win_rate")),
                    f"{fmt(entry.get('wins'))} / {fmt(entry.get('losses'))} / {fmt(entry.get('ties'))}",
                    fmt(entry.get("n")),
                    fmt(entry.get("n_invalid")),
                ]
            )
        lines += [
            "",
            markdown_table(
                ["A vs B", "win rate of A", "95% CI", "LC win rate", "wins / losses / ties", "n", "invalid"], rows
            ),
        ]
    return "\n".join(lines)


def _ordered_pairings(pairings: dict) -> list[str]:
    """vs-SFT pairings first, then by model order of A, then B."""
    order = order_models({m for k in pairings for m in (parse_pairing(k) or ())} | {"sft"})

    def key(k: str):
        pair = parse_pairing(k)
        if pair is None:
            return (2, 0, 0, k)
        a, b = pair
        return (0 if b == "sft" else 1, order.index(a), order.index(b), k)

    return sorted(pairings, key=key)


def section_judge_agreement(data: RunData) -> str:
    if not isinstance(data.summary.get("eval"), dict):
        return ""
    agreement = _get(data.summary, "eval.judge_agreement", {}) or {}
    lines = ["### Judge agreement", ""]
    if not agreement:
        return "\n".join(
            lines + [note("No judge-agreement results (they need the gold judge, i.e. the embedded task).")]
        )
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
    lines += [
        "How often a judge's verdict matches the gold judge's on the same pairs, over all pairings. *Decisive* leaves "
        "out pairs where either judge says tie (the gold judge ties often, a reward model almost never).",
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
    bon = _get(data.summary, "eval.best_of_n", {}) or {}
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
        "the reward model's favourite kept. "
        "KL is the analytic log N − (N−1)/N (nats). If the gold score stops rising while the RM reward keeps "
        "climbing, the reward model is being over-optimised (Gao et al. 2022).",
        "",
        markdown_table(["N", "KL (nats)", "RM reward"] + (["gold score"] if has_gold else []), rows),
    ]
    return "\n".join(lines)


def section_figures(data: RunData) -> str:
    lines = ["## Figures", ""]
    shown = 0
    for key, title, caption in FIGURES:
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


def section_samples(data: RunData, k: int = 3, limit: int = 280) -> str:
    lines = ["## Samples", ""]
    names = order_models(name for name, rows in data.responses.items() if rows)
    if not names:
        return "\n".join(lines + [note("No response files (`eval/responses/*.jsonl`), so no samples.")])
    by_model = {name: {} for name in names}
    for name in names:
        for row in data.responses[name]:
            by_model[name].setdefault(row.get("prompt"), row)
    first = data.responses[names[0]]
    common = [row.get("prompt") for row in first if all(row.get("prompt") in by_model[m] for m in names)]
    common = list(dict.fromkeys(common))
    if not common:
        return "\n".join(lines + [note("The models' response files share no prompt, so no side-by-side samples.")])
    picks = [common[i * len(common) // k] for i in range(min(k, len(common)))]
    has_gold = any(is_number(by_model[m][p].get("gold_score")) for m in names for p in picks)
    lines.append(
        f"{len(picks)} of the {fmt(len(common))} evaluation prompts (evenly spaced, not cherry-picked), with every "
        f"model's response (first {limit} characters)."
    )
    for i, prompt in enumerate(picks, 1):
        rows = []
        for name in names:
            row = by_model[name][prompt]
            cells = [
                model_label(name),
                escape_cell(row.get("response"), limit),
                fmt(row.get("reward")),
                fmt(row.get("length")),
            ]
            rows.append(cells + ([fmt(row.get("gold_score"))] if has_gold else []))
        lines += [
            "",
            f"### Sample {i}",
            "",
            code_block(prompt, 800),
            "",
            markdown_table(
                ["model", "response", "RM reward", "tokens"] + (["gold score"] if has_gold else []),
                rows,
                "llr" + "r" * (1 + has_gold),
            ),
        ]
    return "\n".join(lines)


def section_suites(data: RunData, limit: int = 160) -> str:
    suites = _get(data.summary, "eval.suites", {}) or {}
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
            markdown_table(["model", "response", "RM reward"], table_rows, "llr"),
        ]
    return "\n".join(lines)


def section_timing(data: RunData) -> str:
    timing = data.summary.get("timing_s") or {}
    lines = ["## Timing and memory", ""]
    stages = [s for s in STAGE_LABELS if s != "report" and is_number(timing.get(s))]
    stages += sorted(s for s in timing if s not in STAGE_LABELS and is_number(timing.get(s)))
    if not stages:
        return "\n".join(lines + [note("No stage timings in summary.json (`timing_s`).")])
    total = sum(timing[s] for s in stages)
    rows = []
    for stage in stages:
        results = data.summary.get(SUMMARY_SECTION.get(stage, stage))
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
    source = str(_get(data.summary, "data.source", "") or "")
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


SECTIONS = (
    section_intro,
    section_headline,
    section_data,
    section_collect,
    section_reward_model,
    section_training,
    section_eval_models,
    section_gold_breakdown,
    section_win_rates,
    section_judge_agreement,
    section_best_of_n,
    section_figures,
    section_samples,
    section_suites,
    section_timing,
    section_external,
)


def render_report(data: RunData, problems: list[str] | None = None) -> str:
    """The whole report as markdown.

    A section that raises (an input shaped unlike the contract) becomes a visible one-line
    note instead of costing the reader the rest of the report; one line per such failure is
    appended to `problems` when given.
    """
    parts = []
    problems = problems if problems is not None else []
    for section in SECTIONS:
        try:
            parts.append(section(data))
        except Exception as exc:
            name = section.__name__.removeprefix("section_")
            problems.append(f"section '{name}' failed to render: {type(exc).__name__}: {exc}")
            parts.append(
                note(
                    f"The `{name}` section failed to render ({type(exc).__name__}: {escape_cell(exc, 200)}); "
                    "its input in the run folder does not match the expected contract."
                )
            )
    return "\n\n".join(p.rstrip() for p in parts if p.strip()) + "\n"
