"""Figures written by the stages (PNG, headless matplotlib)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from rlhf.core.stages import STAGES


def _save(fig, path: Path) -> None:
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)


def plot_length_distributions(lengths: dict[str, dict[str, list[int]]], path: Path) -> None:
    """Token lengths of chosen vs rejected responses, and of prompts, per split."""
    splits = [name for name, values in lengths.items() if values["chosen"]]
    fig, axes = plt.subplots(1, len(splits) + 1, figsize=(4.2 * (len(splits) + 1), 3.4))
    for ax, name in zip(axes, splits):
        top = max(max(lengths[name]["chosen"]), max(lengths[name]["rejected"]))
        bins = range(0, top + 2, max(1, (top + 1) // 40))
        ax.hist(lengths[name]["chosen"], bins=bins, alpha=0.6, label="chosen")
        ax.hist(lengths[name]["rejected"], bins=bins, alpha=0.6, label="rejected")
        ax.set_title(f"{name}: response tokens")
        ax.set_xlabel("tokens")
        ax.legend()
    for name in splits:
        axes[-1].hist(lengths[name]["prompt"], bins=40, alpha=0.5, label=name)
    axes[-1].set_title("prompt tokens")
    axes[-1].set_xlabel("tokens")
    axes[-1].legend()
    _save(fig, path)


def plot_reward_distributions(chosen: list[float], rejected: list[float], path: Path, title: str) -> None:
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    ax.hist(chosen, bins=40, alpha=0.6, label="chosen")
    ax.hist(rejected, bins=40, alpha=0.6, label="rejected")
    ax.set_xlabel("reward")
    ax.set_ylabel("pairs")
    ax.set_title(title)
    ax.legend()
    _save(fig, path)


def curve_keys(history: list[dict], keys: Sequence[str]) -> list[str]:
    """The keys logged at two or more steps: a metric logged once (a final `*/val/*` number) is a point, not a
    curve, and is left to the tables."""
    return [key for key in keys if sum(key in row for row in history) >= 2]


def plot_training_curves(history: list[dict], keys: Sequence[str], path: Path, title: str) -> None:
    """One panel per metric key logged at two or more steps, against optimizer step, from MetricLogger rows."""
    keys = curve_keys(history, keys)
    if not keys:
        return
    cols = min(3, len(keys))
    rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.0 * rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        points = [(row["step"], row[key]) for row in history if key in row]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.suptitle(title)
    _save(fig, path)


# ------------------------------------------------------------------- report figures (part4_eval/make_report.py)

# The training curves the report puts on one page: each stage's short, fixed `report_curves`; absent keys are skipped.
REPORT_CURVE_KEYS = {name: list(spec.report_curves) for name, spec in STAGES.items() if spec.report_curves}


# What each report curve measures, as a panel's y-axis label (the key without its stage, for a key not listed).
CURVE_LABELS = {
    "train/loss": "train loss",
    "val/loss": "validation loss",
    "train/accuracy": "train accuracy",
    "val/accuracy": "validation accuracy",
    "objective/scores": "reward of samples",
    "objective/kl": "KL to ref (nats)",
    "objective/rlhf_reward": "reward − β·KL",
    "objective/zero_std_groups": "share of groups, equal rewards",
    "selected/score_mean": "reward of kept samples",
    "responses/length_mean": "response tokens (mean)",
    "train/rewards/accuracies": "train pair accuracy",
    "val/rewards/accuracies": "validation pair accuracy",
    "train/rewards/margins": "train reward margin",
}

POINT_MARKERS = ("o", "s", "D", "^", "v", "P", "X", "*", "<", ">")


def plot_reward_vs_kl(points: dict[str, dict], curve: list[dict], curve_label: str, path: Path) -> bool:
    """Reward vs KL to the reference: one point per model, named in the legend (labels written beside the points
    would overlap where models sit close, as they do near the SFT policy), best-of-N as a curve.

    points: label -> {"kl", "reward", "gold" (optional)}; curve: [{"kl", "reward", "gold" (optional), "n"}].
    A second panel with the gold score on y is drawn when any point or curve entry has one.
    Returns False (and writes nothing) when there is nothing to plot.
    """

    def usable(entry: dict, key: str) -> bool:
        return all(isinstance(entry.get(k), (int, float)) and entry.get(k) == entry.get(k) for k in ("kl", key))

    panels = [("reward", "reward-model score (mean)")]
    if any(usable(p, "gold") for p in points.values()) or any(usable(c, "gold") for c in curve):
        panels.append(("gold", "gold score (mean)"))
    if not any(usable(p, "reward") for p in points.values()) and not any(usable(c, "reward") for c in curve):
        return False
    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.2), squeeze=False)
    for ax, (key, ylabel) in zip(axes[0], panels):
        line = [c for c in curve if usable(c, key)]
        if line:
            ax.plot(
                [c["kl"] for c in line],
                [c[key] for c in line],
                color="0.55",
                marker="o",
                markersize=3,
                zorder=1,
                label=curve_label,
            )
            for c in line:
                if "n" in c:
                    ax.annotate(
                        f"N={c['n']}",
                        (c["kl"], c[key]),
                        textcoords="offset points",
                        xytext=(3, -9),
                        fontsize=6,
                        color="0.45",
                    )
        for i, (label, p) in enumerate(points.items()):
            if usable(p, key):  # a marker of its own per model, so coinciding points stay apart
                marker = POINT_MARKERS[i % len(POINT_MARKERS)]
                ax.scatter([p["kl"]], [p[key]], s=40, zorder=2, color=f"C{i}", marker=marker, alpha=0.85, label=label)
        ax.set_xlabel("KL to reference (nats per response)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle("Reward vs KL: up and to the left is better")
    _save(fig, path)
    return True


def _finite(values) -> list[float]:
    return [
        float(v)
        for v in values
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    ]


def _plot_violins(
    values: dict[str, list[float]],
    path: Path,
    ylabel: str,
    title: str,
    limit: float | None = None,
    limit_label: str = "",
) -> bool:
    """One violin per label (median line, mean diamond); False when no label has a finite value."""
    data = {label: _finite(v) for label, v in values.items()}
    data = {label: v for label, v in data.items() if v}
    if not data:
        return False
    fig, ax = plt.subplots(figsize=(max(5.0, 1.1 * len(data) + 2), 3.8))
    positions = list(range(1, len(data) + 1))
    spread = [v if len(set(v)) > 1 else v + [v[0] + 1e-9] for v in data.values()]  # a violin needs some spread
    ax.violinplot(spread, positions=positions, showmedians=True, showextrema=False)
    ax.scatter(positions, [sum(v) / len(v) for v in data.values()], marker="D", color="k", s=18, zorder=3, label="mean")
    if limit is not None:
        ax.axhline(limit, color="C3", linestyle="--", linewidth=1, label=limit_label)
    ax.set_xticks(positions)
    ax.set_xticklabels(list(data), rotation=20)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)
    return True


def plot_model_rewards(rewards: dict[str, list[float]], path: Path) -> bool:
    """One violin per model of its reward-model scores on the evaluation prompts (mean marked)."""
    return _plot_violins(rewards, path, "reward-model score", "Reward per response, by model")


def plot_model_lengths(lengths: dict[str, list[float]], path: Path, budget: float | None = None) -> bool:
    """One violin per model of its response lengths in tokens; `budget` (max_new_tokens) as a dashed line."""
    return _plot_violins(
        lengths,
        path,
        "response tokens",
        "Response length, by model",
        budget,
        f"token budget ({budget:g})" if budget is not None else "",
    )


def plot_win_rate_heatmaps(matrices: dict[str, tuple[list[str], list[list]]], path: Path) -> bool:
    """One heatmap per judge: cell (row A, column B) = win rate of A vs B.

    matrices: judge -> (labels, cells) with cells[i][j] None (not judged: "n/a") or (win_rate, measured, interval),
    where measured=False marks a value derived as 1 - the mirrored pairing (drawn in italics) and interval is the
    95% interval (low, high), drawn under the rate, or None.
    """
    matrices = {judge: m for judge, m in matrices.items() if m[0]}
    if not matrices:
        return False
    size = max(len(labels) for labels, _ in matrices.values())
    # One judge per row: side by side, three judges of nine models made a figure 35 inches wide, which a page
    # shrinks until its numbers cannot be read.
    fig, axes = plt.subplots(
        len(matrices),
        1,
        figsize=(1.3 * size + 3.0, (1.0 * size + 1.6) * len(matrices) + 0.6),
        squeeze=False,
        layout="constrained",
    )
    axes = [row[0] for row in axes]
    image = None
    for ax, (judge, (labels, cells)) in zip(axes, matrices.items()):
        values = [[float("nan") if c is None else c[0] for c in row] for row in cells]
        image = ax.imshow(values, cmap="RdBu", vmin=0.0, vmax=1.0)
        for i, row in enumerate(cells):
            for j, cell in enumerate(row):
                if i == j:
                    continue
                if cell is None:
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=9, color="0.5")
                else:
                    rate, measured, interval = cell
                    text = f"{rate:.2f}" + (f"\n[{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")
                    ax.text(
                        j,
                        i,
                        text,
                        ha="center",
                        va="center",
                        fontsize=9 if interval else 11,
                        style="normal" if measured else "italic",
                        color="white" if abs(rate - 0.5) > 0.3 else "black",
                    )
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=10)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=10)
        ax.set_xlabel("B")
        ax.set_ylabel("A")
        ax.set_title(f"judge: {judge}", fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.8, label="win rate of A vs B")
    fig.suptitle(
        "Win rates with their 95% intervals (ties count half; italics: 1 − the measured mirror pairing)", fontsize=10
    )
    tmp = path.with_name(
        path.stem + ".tmp.png"
    )  # constrained layout, not _save's tight_layout: it places the shared colorbar
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)
    return True


def plot_stage_curves(
    histories: dict[str, list[dict]], keys: dict[str, list[str]], path: Path, titles: dict[str, str] | None = None
) -> bool:
    """Every stage's training curves on one page: one row per stage, one panel per metric key logged at two or
    more steps (`curve_keys`)."""
    rows = []
    for stage, history in histories.items():
        present = curve_keys(history, keys.get(stage, []))
        if present:
            rows.append((stage, present))
    if not rows:
        return False
    cols = max(len(present) for _, present in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(4.2 * cols, 3.2 * len(rows)), squeeze=False)
    for r, (stage, present) in enumerate(rows):
        history = histories[stage]
        for c in range(cols):
            ax = axes[r][c]
            if c >= len(present):
                ax.axis("off")
                continue
            key = present[c]
            points = [(row["step"], row[key]) for row in history if key in row and "step" in row]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 30 else None)
            metric = key.partition("/")[2]
            ax.set_title(f"{(titles or {}).get(stage, stage)}: {CURVE_LABELS.get(metric, metric)}", fontsize=11)
            ax.set_xlabel(STAGES[stage].x_axis, fontsize=9)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps and rounds are whole numbers
            ax.set_ylabel(CURVE_LABELS.get(metric, metric), fontsize=9)
            ax.tick_params(labelsize=8)
            ax.grid(alpha=0.3)
    fig.suptitle("Training curves, one row per stage", fontsize=13)
    _save(fig, path)
    return True


def plot_overoptimization(curves: list[dict], path: Path) -> bool:
    """Gao et al. 2022's over-optimisation figure: gold score (left) and proxy reward-model score
    (right) against sqrt(KL to the initial policy), one line per curve.

    curves: [{"label", "method", "reward", "points": [{"sqrt_kl", "proxy_score", "gold_score" (None off the
    embedded task)}]}]. A method keeps one colour (best-of-N black, the KL-regularised optima grey); a
    policy trained on the gold reward, or the optimum for gold, is dashed. False (and nothing written)
    when no curve has a point.
    """
    curves = [c for c in curves if c["points"]]
    if not curves:
        return False
    panels = [("proxy_score", "proxy score (reward model, mean)")]
    if any(p.get("gold_score") is not None for c in curves for p in c["points"]):
        panels.insert(0, ("gold_score", "gold score (mean)"))
    colours = {"best_of_n": "k", "optimum": "0.55"}
    fig, axes = plt.subplots(1, len(panels), figsize=(5.8 * len(panels), 4.4), squeeze=False)
    for ax, (key, ylabel) in zip(axes[0], panels):
        for curve in curves:
            points = [p for p in curve["points"] if p.get(key) is not None]
            if not points:
                continue
            colour = colours.setdefault(curve["method"], f"C{len(colours) - 1}")
            ax.plot(
                [p["sqrt_kl"] for p in points],
                [p[key] for p in points],
                color=colour,
                marker="o",
                markersize=3,
                linestyle="--" if curve["reward"] == "gold" else "-",
                label=curve["label"],
            )
        ax.set_xlabel("sqrt(KL to the SFT policy)  (nats^0.5)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="best", handlelength=3)  # long enough to show the dashes
    fig.suptitle(
        "Reward over-optimisation (Gao et al. 2022): solid = optimised against the reward model, dashed = against gold",
        fontsize=9,
    )
    _save(fig, path)
    return True
