"""Stage `report`: turn a finished run folder into `report.md` and its figures.

    python part4_eval/make_report.py --preset tiny

Reads only files in the run folder (summary.json, eval/responses/*.jsonl, eval/suites/*.jsonl,
each stage's metrics.jsonl, reward/error_analysis.json, the model's safetensors header); never
loads a model or retrains, so it runs in seconds. Writes `<run>/report.md` and PNG
figures beside it, and `<run>/report.html`: the same sections on one self-contained page (figures inlined)
with a browser of every evaluation sample. Both come from the pure, tested functions of the `rlhf.report` package;
anything the run lacks (a stage, a judge, gold scores) becomes a one-line note, not an error.
"""

from __future__ import annotations

import base64
import json
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("report")  # --help and config errors at once, before the imports below load torch

from rlhf.analysis.plots import (
    REPORT_CURVE_KEYS,
    plot_model_lengths,
    plot_model_rewards,
    plot_reward_vs_kl,
    plot_stage_curves,
    plot_win_rate_heatmaps,
)
from rlhf.core.errors import UserError
from rlhf.report import (
    STAGE_LABELS,
    TRAINED_STAGES,
    RunData,
    eval_models,
    get_path,
    is_number,
    join_sections,
    model_label,
    order_models,
    render_html,
    render_sections,
    win_rate_matrix,
)
from rlhf.stage.run import RunDir, write_text_atomic
from rlhf.task import parse_prompt

# Figures other stages drew, linked from the report when present (key -> path in the run folder).
STAGE_FIGURES = {
    "data_lengths": "data/lengths.png",
    "reward_test": "reward/rewards_test.png",
    **{f"curves_{stage}": f"{stage}/curves.png" for stage in TRAINED_STAGES},
}


def read_jsonl_tolerant(path: Path, problems: list[str]) -> list[dict]:
    """Rows of a JSONL file; a line that does not parse (e.g. cut short by a crash) is skipped and reported."""
    rows, bad = [], 0
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(row, dict):
                rows.append(row)
    if bad:
        problems.append(f"{path}: skipped {bad} unparseable line(s)")
    return rows


def read_json_optional(path: Path, problems: list[str]) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        problems.append(f"{path}: not valid JSON ({exc}); ignored")
        return {}


def safetensors_parameter_count(model_dir: Path) -> int | None:
    """Parameters stored in a model folder, from the safetensors headers alone (no tensor is read)."""
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with open(file, "rb") as handle:
            (header_len,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_len))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total


def prompt_families(prompts, embedded: bool) -> dict[str, str]:
    """The embedded task's family of each prompt (the sample browser filters by it); none on other data."""
    families = {}
    for prompt in prompts if embedded else ():
        try:
            families[prompt] = parse_prompt(prompt).family
        except ValueError:
            continue  # not a task prompt: unfiltered by family
    return families


def inline_figures(root: Path, figures: dict[str, str]) -> dict[str, str]:
    """Each figure's path as report.md links it -> a base64 PNG data URI, for report.html."""
    return {
        rel: "data:image/png;base64," + base64.b64encode((root / rel).read_bytes()).decode("ascii")
        for rel in figures.values()
    }


def stale_evaluations(run: RunDir) -> list[str]:
    """A warning per policy stage that completed again, with another config, after eval evaluated it: its row in
    the evaluation is of the earlier model, its training table of the new one."""
    marker = run.stage("eval") / "complete.json"
    evaluated = json.loads(marker.read_text()).get("policy_fingerprints", {}) if marker.is_file() else {}
    warnings = []
    for stage, fingerprint in evaluated.items():
        now = run.completed_fingerprint(stage)
        if now != fingerprint:
            state = "has not completed since" if now is None else f"now holds another (config {now})"
            warnings.append(
                f"{STAGE_LABELS.get(stage, stage)}: the evaluation is of an earlier {stage} model (config "
                f"{fingerprint}); the stage {state}, so its evaluation and training rows describe different "
                f"models: re-run eval and the report (bash run_all.sh --from eval with this run's settings)"
            )
    return warnings


def load_run(run: RunDir, cfg, problems: list[str]) -> tuple[RunData, dict[str, list[dict]]]:
    """Everything the report shows, read from the run folder; also each stage's metrics rows."""
    summary = run.read_summary()
    responses = {
        path.stem: read_jsonl_tolerant(path, problems)
        for path in sorted((run.stage("eval") / "responses").glob("*.jsonl"))
    }
    suite_rows = {
        path.stem: read_jsonl_tolerant(path, problems)
        for path in sorted((run.stage("eval") / "suites").glob("*.jsonl"))
    }
    histories = {
        stage: read_jsonl_tolerant(run.stage(stage) / "metrics.jsonl", problems)
        for stage in TRAINED_STAGES
        if (run.stage(stage) / "metrics.jsonl").is_file()
    }
    try:
        n_params = safetensors_parameter_count(run.model_dir("sft"))
    except (OSError, ValueError, KeyError, struct.error) as exc:
        problems.append(f"{run.model_dir('sft')}: could not read the safetensors header ({exc})")
        n_params = None
    model = {
        "name_or_path": cfg.model.name_or_path,
        "init": cfg.model.init,
        "model_type": cfg.model.model_type,
        "config_overrides": dict(cfg.model.config_overrides or {}),
        "n_params": n_params,
    }
    data = RunData(
        summary=summary,
        preset=run.preset,
        run_dir=str(run.root),
        model=model,
        responses=responses,
        suite_rows=suite_rows,
        error_analysis=read_json_optional(run.stage("reward") / "error_analysis.json", problems),
        seeds=read_json_optional(run.root / "seeds" / "summary.json", problems),
        pipeline_seeds=read_json_optional(run.root / "pipeline_seeds" / "summary.json", problems),
        prompt_families=prompt_families(
            {row.get("prompt") for rows in responses.values() for row in rows},
            get_path(summary, "data.source") == "embedded",
        ),
        warnings=stale_evaluations(run),
    )
    problems += data.warnings
    return data, histories


def draw_figures(data: RunData, histories: dict[str, list[dict]], out_dir: Path, problems: list[str]) -> dict[str, str]:
    """The report's own figures; returns figure key -> file name for those drawn."""
    ev = data.summary.get("eval") or {}
    models = eval_models(data.summary)
    names = order_models(models)
    bon = ev.get("best_of_n") or {}
    points = {
        model_label(name): {
            "kl": models[name].get("kl_to_ref"),
            "reward": models[name].get("reward_mean"),
            "gold": models[name].get("gold_score_mean"),
        }
        for name in names
    }
    curve = [
        {"n": p.get("n"), "kl": p.get("kl"), "reward": p.get("reward_mean"), "gold": p.get("gold_score_mean")}
        for p in bon.get("curve") or []
    ]
    response_models = order_models(name for name, rows in data.responses.items() if rows)
    rewards = {model_label(m): [row.get("reward") for row in data.responses[m]] for m in response_models}
    lengths = {model_label(m): [row.get("length") for row in data.responses[m]] for m in response_models}
    budget = (ev.get("decoding") or {}).get("max_new_tokens")
    matrices = {}
    for judge, pairings in (ev.get("win_rates") or {}).items():
        labels, cells = win_rate_matrix(pairings or {})
        if labels:
            matrices[judge] = ([model_label(m) for m in labels], cells)
    jobs = {
        "reward_vs_kl": lambda path: plot_reward_vs_kl(
            points, curve, f"best-of-N (SFT, N ≤ {bon.get('n', '?')})", path
        ),
        "reward_distributions": lambda path: plot_model_rewards(rewards, path),
        "win_rates": lambda path: plot_win_rate_heatmaps(matrices, path),
        "training_curves": lambda path: plot_stage_curves(histories, REPORT_CURVE_KEYS, path, STAGE_LABELS),
        "response_lengths": lambda path: plot_model_lengths(lengths, path, budget if is_number(budget) else None),
    }
    drawn = {}
    for key, draw in jobs.items():
        path = out_dir / f"{key}.png"
        path.unlink(missing_ok=True)  # never link a stale figure from an earlier report
        try:
            if draw(path):
                drawn[key] = f"{out_dir.name}/{path.name}"  # relative to report.md in the run folder
        except Exception as exc:
            problems.append(f"figure {key}.png failed: {type(exc).__name__}: {exc}")
    return drawn


def main(argv: list[str] | None = None) -> None:
    started = start_stage("report", argv, requires=("eval",))
    if started is None:
        return
    cfg, run = started
    if not run.summary_path.is_file():
        raise UserError(f"no summary.json in {run.root}; run the pipeline (bash run_all.sh) before the report")
    t_start = time.perf_counter()
    out_dir = run.stage("report")
    problems: list[str] = []

    # 1. Load the run's own files: summary, responses, suites, metrics, error analysis.
    data, histories = load_run(run, cfg, problems)

    # 2. Figures: the report's own, plus links to those the stages drew (paths relative to report.md).
    figures = draw_figures(data, histories, out_dir, problems)
    figures.update({key: rel for key, rel in STAGE_FIGURES.items() if (run.root / rel).is_file()})
    data.figures = figures

    # 3. Markdown and the HTML page from the same sections (pure functions of rlhf.report), written atomically.
    sections = render_sections(data, problems)
    write_text_atomic(run.root / "report.md", join_sections(sections))
    write_text_atomic(run.root / "report.html", render_html(sections, data, inline_figures(run.root, figures)))

    # 4. Timing, then mark complete.
    run.update_summary({"timing_s": {"report": round(time.perf_counter() - t_start, 2)}})
    run.mark_complete(
        "report", cfg, {"report": "report.md", "html": "report.html", "figures": sorted(figures.values())}
    )
    for problem in problems:
        print(f"[report] warning: {problem}", file=sys.stderr)
    print(
        f"[report] wrote {run.root / 'report.md'} and report.html with {len(figures)} figures "
        f"({len(problems)} warnings)"
    )


if __name__ == "__main__":
    run_stage(main)
