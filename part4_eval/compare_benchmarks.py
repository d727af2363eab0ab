"""Two models' public-benchmark answers compared on the same prompts, from part4_eval/benchmarks.py's output folders.

    python part4_eval/compare_benchmarks.py results/smollm2-ifeval/base results/smollm2-ifeval/grpo

Reads each folder's <benchmark>.jsonl (every answer with its verdict), checks that both answered the same prompts
with the same decoding and engine, and prints a markdown table: each model's accuracies with 95% intervals and the
change (second minus first) with its paired interval and p, by the rules of eval's `change_vs_sft`
(docs/benchmarks.md); with --by-type, IFEval's strict accuracy per instruction type too. --json writes the numbers.
Beside the rates, whether the answers have degenerated: distinct-2 across a model's answers and 4-gram repetition
within each (`rlhf.analysis.evaluation`, over whitespace-separated words, since the answer files hold text), and the
second model flagged when eval's rule (`degeneration_reasons`) would flag it against the first.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.analysis.evaluation import degeneration_reasons, distinct_n, repetition_within
from rlhf.benchmarks import ifeval, xstest
from rlhf.core.errors import UserError
from rlhf.judges.refusal import classify_refusal
from rlhf.stage.cli import run_stage

METRICS = {
    "ifeval": ("prompt_strict", "instruction_strict", "prompt_loose", "instruction_loose"),
    "xstest": ("safe_compliance", "unsafe_refusal"),
}


def read_answers(folder: Path, bench: str) -> tuple[list[dict], dict]:
    path, report = folder / f"{bench}.jsonl", folder / "benchmarks.json"
    if not path.is_file() or not report.is_file():
        raise UserError(f"{folder} has no {bench}.jsonl and benchmarks.json; give part4_eval/benchmarks.py's --output")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    written = json.loads(report.read_text())
    # the engine decodes too: greedy answers from two engines can part on a tie (older folders are generate's)
    return rows, {**written["decoding"], "engine": written.get("engine", "hf")}


def word_degeneration(rows: list[dict]) -> dict:
    """distinct-2 over all answers and mean within-answer 4-gram repetition, each over the answers' words, and the
    three most common two-word openings with their counts (a model that answers everything alike shows here)."""
    words = [row["response"].split() for row in rows]
    openings = Counter(" ".join(answer[:2]) for answer in words).most_common(3)
    return {
        "distinct_2_words": distinct_n(words, 2),
        "repetition_4_words": repetition_within(words, 4),
        "top_openings_2_words": [[opening, count] for opening, count in openings],
    }


def compare(first: Path, second: Path, bench: str) -> dict:
    (rows_a, decoding_a), (rows_b, decoding_b) = read_answers(first, bench), read_answers(second, bench)
    if decoding_a != decoding_b:
        raise UserError(f"{first} and {second} decoded differently ({decoding_a} vs {decoding_b}); compare like runs")
    if bench == "ifeval":
        summaries = [ifeval.summarize(rows_a), ifeval.summarize(rows_b)]
        change = ifeval.paired_change(rows_a, rows_b)
    else:  # each answer classified by the refusal judge as it is now, not as it was when the answers were written
        rows_a, rows_b = ([{**r, "class": classify_refusal(r["response"])} for r in rows] for rows in (rows_a, rows_b))
        summaries = [xstest.summarize_xstest(rows_a), xstest.summarize_xstest(rows_b)]
        change = xstest.paired_xstest_change(rows_a, rows_b)
    texts = all("response" in r for r in rows_a + rows_b)
    for summary, rows in zip(summaries, (rows_a, rows_b)):
        summary["length_mean"] = sum(r["length"] for r in rows) / len(rows)
        summary["eos_rate"] = sum(r["finished"] for r in rows) / len(rows)
        summary |= word_degeneration(rows) if texts else {}
    as_eval = [
        {"distinct_2": s.get("distinct_2_words"), "repetition_4": s.get("repetition_4_words")} for s in summaries
    ]
    return {
        "benchmark": bench,
        "decoding": decoding_a,
        "models": [str(first), str(second)],
        "n_answers": len(rows_a),
        "summaries": summaries,
        "change": change,
        "second_degenerate": degeneration_reasons(as_eval[1], as_eval[0]) if texts else None,
    }


def table(result: dict, by_type: bool) -> str:
    bench, (a, b), change = result["benchmark"], result["summaries"], result["change"]
    value = "accuracy" if bench == "ifeval" else "rate"
    names = [Path(m).name for m in result["models"]]
    lines = [f"| {bench} | {names[0]} | {names[1]} | change [95% CI] | p |", "|---|---:|---:|---:|---:|"]
    for key in METRICS[bench]:
        c = change[key]
        cells = [f"{s[key][value]:.3f} [{s[key]['ci95_low']:.3f}, {s[key]['ci95_high']:.3f}]" for s in (a, b)]
        lines.append(
            f"| {key} | {cells[0]} | {cells[1]} | {c['change']:+.3f} [{c['ci95_low']:+.3f}, {c['ci95_high']:+.3f}] "
            f"| {c['p']:.3g} |"
        )
    lines.append(f"| answers ended (EOS) | {a['eos_rate']:.3f} | {b['eos_rate']:.3f} | | |")
    lines.append(f"| tokens per answer | {a['length_mean']:.0f} | {b['length_mean']:.0f} | | |")
    if "distinct_2_words" in a:
        lines.append(f"| distinct-2 (words) | {a['distinct_2_words']:.3f} | {b['distinct_2_words']:.3f} | | |")
        lines.append(f"| 4-gram repetition within an answer (words) | {a['repetition_4_words']:.3f} | "
                     f"{b['repetition_4_words']:.3f} | | |")  # fmt: skip
        openings = [", ".join(f"{text!r} {count}" for text, count in s["top_openings_2_words"]) for s in (a, b)]
        label = f"most common openings (2 words) of {result['n_answers']} answers"
        lines.append(f"| {label} | {openings[0]} | {openings[1]} | | |")
    if result["second_degenerate"]:
        lines += ["", f"{names[1]} flagged degenerate against {names[0]}: " + "; ".join(result["second_degenerate"])]
    if by_type and bench == "ifeval":
        lines += ["", f"| instruction type (strict) | n | {names[0]} | {names[1]} |", "|---|---:|---:|---:|"]
        for kind, entry in a["by_instruction_strict"].items():
            other = b["by_instruction_strict"][kind]
            lines.append(f"| {kind} | {entry['n']} | {entry['accuracy']:.3f} | {other['accuracy']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python part4_eval/compare_benchmarks.py", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("first", type=Path, help="the baseline's benchmarks.py --output folder")
    parser.add_argument("second", type=Path, help="the other model's")
    parser.add_argument("--benchmarks", default="ifeval", help="comma-separated: ifeval, xstest")
    parser.add_argument("--by-type", action="store_true", help="IFEval's strict accuracy per instruction type")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args(argv)
    benches = [bench.strip() for bench in args.benchmarks.split(",") if bench.strip()]
    if unknown := sorted(set(benches) - set(METRICS)):
        raise UserError(f"--benchmarks: unknown {', '.join(unknown)}; choose from {', '.join(METRICS)}")
    results = [compare(args.first, args.second, bench) for bench in benches]
    print("\n\n".join(table(result, args.by_type) for result in results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    run_stage(main)
