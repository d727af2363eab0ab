"""Formatting for the report: numbers, intervals, model and pairing names, and markdown tables."""

from __future__ import annotations

import math
import re

from rlhf.core.stages import POLICY_STAGES
from rlhf.report.contract import MODEL_ORDER, NA, STAGE_LABELS


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


NEGATIVE_KL_MARK = "†"


def fmt_kl(mean, std=None, digits: int = 3) -> str:
    """A KL estimate (`mean`, or `mean ± std`); a mean below 0 is marked † (explained by `negative_kl_note`)."""
    mark = NEGATIVE_KL_MARK if is_number(mean) and mean < 0 else ""
    text = fmt_pm(mean, std, digits)
    return text.replace(" ± ", f"{mark} ± ", 1) if " ± " in text else text + mark


def negative_kl_note(means) -> str:
    """The note for a table with a KL estimate below 0 (marked by `fmt_kl`); "" when every mean is >= 0."""
    if not any(is_number(m) and m < 0 for m in means):
        return ""
    return note(
        f"{NEGATIVE_KL_MARK} A KL estimate below 0 is sampling noise: it is the mean over sampled responses of "
        "Σ log π − log π_ref, which is unbiased but noisy per response, so its mean can fall below 0 although the "
        "true KL never does. Read it as not distinguishable from 0: the policy is as close to SFT as these samples "
        "can tell."
    )


def eval_split(summary: dict) -> str:
    """Which prompts the evaluation answered: "test", or "validation" when the data has no test split."""
    return "validation" if get_path(summary, "eval.prompt_split") == "val" else "test"


def fmt_ci(low, high, digits: int = 3) -> str:
    return f"[{fmt(float(low), digits)}, {fmt(float(high), digits)}]" if is_number(low) and is_number(high) else NA


def fmt_p(p) -> str:
    """A p-value: three decimals from 0.001 up (0.033), else two significant digits (2.0e-04); else n/a."""
    if not is_number(p):
        return NA
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


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
    return STAGE_LABELS[name] if name in POLICY_STAGES else name


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
    """Model names (canonical order) and cells[i][j] = (win rate of i vs j, measured, its 95% interval) or None.

    A measured `<a>_vs_<b>` fills (a, b), with its interval (`ci95_low`, `ci95_high`; None when absent); its mirror
    (b, a), when not measured itself, is 1 - win_rate with the interval mirrored (exact, as ties count half on both
    sides), flagged measured=False.
    """
    measured = {}
    for key, entry in pairings.items():
        pair = parse_pairing(key)
        if pair and isinstance(entry, dict) and is_number(entry.get("win_rate")):
            low, high = entry.get("ci95_low"), entry.get("ci95_high")
            interval = (float(low), float(high)) if is_number(low) and is_number(high) else None
            measured[pair] = (float(entry["win_rate"]), interval)
    names = order_models({m for pair in measured for m in pair})
    cells = []
    for a in names:
        row = []
        for b in names:
            if (a, b) in measured:
                row.append((measured[(a, b)][0], True, measured[(a, b)][1]))
            elif (b, a) in measured:
                rate, interval = measured[(b, a)]
                row.append((1.0 - rate, False, (1.0 - interval[1], 1.0 - interval[0]) if interval else None))
            else:
                row.append(None)
        cells.append(row)
    return names, cells


def and_list(items: list[str]) -> str:
    """The items as prose: "A", "A and B", "A, B and C"."""
    return " and ".join([", ".join(items[:-1]), items[-1]] if len(items) > 1 else items)


def note(text: str) -> str:
    return f"_{text}_"


def get_path(tree: dict, path: str, default=None):
    """tree["a"]["b"]... for path "a.b...", or default where any level is missing."""
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def eval_models(summary: dict) -> dict[str, dict]:
    """`eval.models`, keeping only well-formed (dict) entries."""
    models = get_path(summary, "eval.models", {}) or {}
    return {name: m for name, m in models.items() if isinstance(m, dict)} if isinstance(models, dict) else {}


def ordered_pairings(pairings: dict) -> list[str]:
    """vs-SFT pairings first, then by model order of A, then B."""
    order = order_models({m for k in pairings for m in (parse_pairing(k) or ())} | {"sft"})

    def key(k: str):
        pair = parse_pairing(k)
        if pair is None:
            return (2, 0, 0, k)
        a, b = pair
        return (0 if b == "sft" else 1, order.index(a), order.index(b), k)

    return sorted(pairings, key=key)


def peak_memory(results: dict) -> str:
    mb = results.get("peak_memory_mb")
    if not is_number(mb):
        return NA
    kind = results.get("peak_memory_source") or results.get("peak_memory_kind")
    return f"{mb:,.0f} MB" + (f" ({kind})" if kind else "")
