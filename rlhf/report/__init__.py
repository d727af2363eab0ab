"""The run report: pure functions from a run's loaded files to markdown (no I/O, no models).

`part4_eval/make_report.py` reads the run folder into a `RunData` and calls `render_report`.
Every number in the output comes from that `RunData`, i.e. from the run's own files; the one
exception is `contract.EXTERNAL_REFERENCES`, published numbers that are printed in their own, clearly
labelled section and never mixed into the run's tables.

Missing pieces degrade to a one-line note: a run without GRPO, without the OpenAI judge, or on
HH data (no gold judge) simply has fewer rows and sections.

Modules: `contract` (RunData and the fixed names), `format` (numbers and markdown),
`training_sections`, `eval_sections` and `seeds_section` (one function per report section), `samples` (every
model's answer per prompt, and where they disagree), `html` (the same sections as one self-contained page with a
sample browser); this module orders the sections and renders them, and re-exports what callers use.
"""

from __future__ import annotations

from rlhf.report.contract import STAGE_LABELS, TRAINED_STAGES, RunData
from rlhf.report.eval_sections import (
    section_benchmarks,
    section_best_of_n,
    section_eval_models,
    section_external,
    section_figures,
    section_gold_breakdown,
    section_judge_agreement,
    section_samples,
    section_suites,
    section_timing,
    section_win_rates,
)
from rlhf.report.format import (
    code_block,
    escape_cell,
    eval_models,
    fmt,
    fmt_ci,
    fmt_kl,
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
    parse_pairing,
    win_rate_matrix,
)
from rlhf.report.html import render_html
from rlhf.report.model_card import section_export
from rlhf.report.seeds_section import section_seeds
from rlhf.report.training_sections import (
    section_collect,
    section_data,
    section_headline,
    section_intro,
    section_reward_model,
    section_training,
)

__all__ = [
    "SECTIONS",
    "STAGE_LABELS",
    "TRAINED_STAGES",
    "RunData",
    "code_block",
    "escape_cell",
    "eval_models",
    "fmt",
    "fmt_ci",
    "fmt_kl",
    "fmt_params",
    "fmt_pm",
    "fmt_seconds",
    "get_path",
    "is_number",
    "join_sections",
    "markdown_table",
    "model_label",
    "negative_kl_note",
    "note",
    "order_models",
    "parse_pairing",
    "render_html",
    "render_report",
    "render_sections",
    "section_collect",
    "section_export",
    "section_training",
    "win_rate_matrix",
]

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
    section_seeds,
    section_judge_agreement,
    section_best_of_n,
    section_figures,
    section_samples,
    section_suites,
    section_benchmarks,
    section_export,
    section_timing,
    section_external,
)


def render_sections(data: RunData, problems: list[str] | None = None) -> list[tuple[str, str]]:
    """Each section that has something to say, as (name, markdown), in report order.

    A section that raises (an input shaped unlike the contract) becomes a visible one-line
    note instead of costing the reader the rest of the report; one line per such failure is
    appended to `problems` when given.
    """
    parts = []
    problems = problems if problems is not None else []
    for section in SECTIONS:
        name = section.__name__.removeprefix("section_")
        try:
            parts.append((name, section(data)))
        except Exception as exc:
            problems.append(f"section '{name}' failed to render: {type(exc).__name__}: {exc}")
            parts.append(
                (
                    name,
                    note(
                        f"The `{name}` section failed to render ({type(exc).__name__}: {escape_cell(exc, 200)}); "
                        "its input in the run folder does not match the expected contract."
                    ),
                )
            )
    return [(name, text.rstrip()) for name, text in parts if text.strip()]


def join_sections(sections: list[tuple[str, str]]) -> str:
    """The report's markdown from `render_sections`."""
    return "\n\n".join(text for _, text in sections) + "\n"


def render_report(data: RunData, problems: list[str] | None = None) -> str:
    """The whole report as markdown (`render_sections`, joined)."""
    return join_sections(render_sections(data, problems))
