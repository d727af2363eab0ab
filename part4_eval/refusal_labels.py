"""Hand labels for the refusal judge: a blind labelling sheet of models' XSTest answers, and the judge's agreement
with the labels once they are filled in.

    python part4_eval/refusal_labels.py sheet outputs/xstest/sft outputs/xstest/raft --output results/refusal-labels
    (fill in every "label" of results/refusal-labels/sheet.jsonl: full_compliance, full_refusal or partial_refusal)
    python part4_eval/refusal_labels.py score results/refusal-labels

`sheet` draws --n answers from the folders' `xstest.jsonl` (written by part4_eval/benchmarks.py or a run's
`eval/benchmarks/`), half to XSTest's safe prompts and half to its unsafe ones, uniformly over the folders'
answers, and shuffles them. The sheet holds only the prompt and the response: not the model, not XSTest's label,
not the judge's verdict, so the labeller is blind to all three; `key.jsonl` beside it holds them. The first half
of the sheet's ids is `dev` (where a change to the judge's rules may be tried), the second `held_out` (the figure
to report). Classes as XSTest's paper defines them (Röttger et al. 2024; rlhf/judges/refusal.py).

`score` classifies every labelled response with the judge as it is now and writes `agreement.json`: agreement,
Cohen's kappa, refusal precision and recall with intervals (`rlhf.judges.refusal.agreement_with_labels`), on each
split, on both, and per model; and, under `as_scored`, the same measures for the verdicts the answer files carry (the
`class` each row of `xstest.jsonl` got from the judge of the code that answered, a judge since changed), while those
files are where the key says.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's rlhf, even under another clone's .venv

from rlhf.core.errors import UserError
from rlhf.data import read_jsonl
from rlhf.judges.refusal import CLASSES, agreement_with_labels, classify_refusal
from rlhf.stage.cli import run_stage

SPLITS = ("dev", "held_out")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python part4_eval/refusal_labels.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    sheet = commands.add_parser("sheet", help="write a blind labelling sheet")
    sheet.add_argument("answers", nargs="+", type=Path, help="folders holding an xstest.jsonl")
    sheet.add_argument("--output", type=Path, required=True, help="folder for sheet.jsonl and key.jsonl")
    sheet.add_argument("--n", type=int, default=200, help="answers to label, half safe and half unsafe (even)")
    sheet.add_argument("--seed", type=int, default=0, help="seed of the draw and the shuffle")
    score = commands.add_parser("score", help="the judge's agreement with a filled-in sheet")
    score.add_argument("folder", type=Path, help="the folder sheet wrote")
    args = parser.parse_args(argv)
    if args.command == "sheet" and (args.n < 2 or args.n % 2):
        raise UserError(f"--n={args.n}: give an even number >= 2 (half safe, half unsafe prompts)")
    return args


def write_sheet(folders: list[Path], output: Path, n: int, seed: int) -> None:
    answers = []
    for folder in folders:
        path = folder / "xstest.jsonl"
        if not path.is_file():
            raise UserError(
                f"{path} not found; answer XSTest first: python part4_eval/benchmarks.py --benchmarks xstest"
            )
        answers += [{**row, "source": str(folder)} for row in read_jsonl(path)]
    if (output / "sheet.jsonl").exists():
        raise UserError(f"{output / 'sheet.jsonl'} exists (labels may be in it); pass another --output")
    rng = random.Random(seed)
    drawn = []
    for label in ("safe", "unsafe"):
        pool = [row for row in answers if row["label"] == label]
        if len(pool) < n // 2:
            raise UserError(f"only {len(pool)} answers to {label} prompts for --n={n}; lower --n or add folders")
        drawn += rng.sample(pool, n // 2)
    rng.shuffle(drawn)
    output.mkdir(parents=True, exist_ok=True)
    with open(output / "key.jsonl", "w") as key, open(output / "sheet.jsonl", "w") as sheet:
        for i, row in enumerate(drawn, start=1):
            split = SPLITS[0] if i <= n // 2 else SPLITS[1]
            sheet.write(json.dumps({"id": i, "prompt": row["prompt"], "response": row["response"], "label": None}))
            sheet.write("\n")
            kept = {k: row[k] for k in ("source", "model", "id", "type", "label")}
            key.write(json.dumps({"id": i, "split": split, **{f"xstest_{k}": v for k, v in kept.items()}}) + "\n")
    print(f"[refusal_labels] {n} answers to label in {output / 'sheet.jsonl'} (key: {output / 'key.jsonl'})")


def verdicts_as_scored(key: dict[int, dict]) -> dict[int, str] | None:
    """Each sheet id's verdict as its answer file holds it (None when a file the key names is gone). A source is a
    path as `sheet` was given it: relative to where it ran, the repository's root for the published sheet."""
    stored = {}
    for source in {row["xstest_source"] for row in key.values()}:
        path = Path(source) / "xstest.jsonl"
        path = path if path.is_absolute() or path.is_file() else REPO / path
        if not path.is_file():
            return None
        stored |= {(source, str(row["id"])): row.get("class") for row in read_jsonl(path)}
    verdicts = {i: stored.get((row["xstest_source"], str(row["xstest_id"]))) for i, row in key.items()}
    return verdicts if all(v in CLASSES for v in verdicts.values()) else None


def score_sheet(folder: Path) -> dict:
    sheet, key = read_jsonl(folder / "sheet.jsonl"), {row["id"]: row for row in read_jsonl(folder / "key.jsonl")}
    if missing := [row["id"] for row in sheet if row["label"] not in CLASSES]:
        raise UserError(
            f"{len(missing)} rows of {folder / 'sheet.jsonl'} have no valid label (ids {missing[:5]}...); "
            f"set each to one of {', '.join(CLASSES)}"
        )
    rows = [{**row, **key[row["id"]], "verdict": classify_refusal(row["response"])} for row in sheet]
    as_scored = verdicts_as_scored(key)

    def measured(subset: list[dict]) -> dict:
        return agreement_with_labels([r["label"] for r in subset], [r["verdict"] for r in subset])

    result = {
        "n": len(rows),
        "labels": {c: sum(r["label"] == c for r in rows) for c in CLASSES},
        "all": measured(rows),
        **{split: measured([r for r in rows if r["split"] == split]) for split in SPLITS},
        "by_model": {
            model: measured([r for r in rows if r["xstest_source"] == model])
            for model in sorted({r["xstest_source"] for r in rows})
        },
        "as_scored": None if as_scored is None else measured([{**r, "verdict": as_scored[r["id"]]} for r in rows]),
        "disagreements": [
            {k: r[k] for k in ("id", "split", "prompt", "response", "label", "verdict")}
            for r in rows
            if r["label"] != r["verdict"]
        ],
    }
    tmp = folder / "agreement.json.tmp"
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(folder / "agreement.json")
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "sheet":
        write_sheet(args.answers, args.output, args.n, args.seed)
        return
    result = score_sheet(args.folder)
    for split in ("all", *SPLITS, "as_scored"):
        if (m := result[split]) is None:
            continue
        a, recall, precision = m["agreement"], m["refusal"]["recall"], m["refusal"]["precision"]
        kappa = "n/a" if m["kappa"] is None else f"{m['kappa']:.3f}"
        name = "the answer files' own verdicts" if split == "as_scored" else split
        print(
            f"[refusal_labels] {name}: agreement {a['rate']:.3f} [{a['ci95_low']:.3f}, {a['ci95_high']:.3f}] "
            f"of {m['n']}, kappa {kappa}, refusal recall "
            + ("n/a" if recall is None else f"{recall['rate']:.3f} ({recall['hits']}/{recall['n']})")
            + ", precision "
            + ("n/a" if precision is None else f"{precision['rate']:.3f} ({precision['hits']}/{precision['n']})")
        )
    print(f"[refusal_labels] written {args.folder / 'agreement.json'}")


if __name__ == "__main__":
    run_stage(main)
