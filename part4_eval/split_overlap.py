"""How many of the prompts eval answers occur in another run's test split, and in the run's own training and
validation splits: the check that a new test split shares no prompt with training, and how much of it an earlier
test split (one that settings were chosen on) already held. Then, for every stage that published a model in both
runs, whether the two `model.safetensors` are byte-identical (sha256): with the same settings, a run whose test split
differs trains the same models when no test pair reaches training.

    python part4_eval/split_overlap.py RUN OTHER_RUN [--prompts N] [--out FILE]

RUN and OTHER_RUN are run folders whose data stage completed (e.g. the tiny preset as it is, and the same preset
with `data.embedded.test_seed=0`, the old test: `bash run_all.sh --preset tiny --output-dir outputs/tiny-old-test
--only data data.embedded.test_seed=0`). The prompts are eval's: RUN's first N distinct test prompts in file order
(`rlhf.data.heldout_references`, as part4_eval/evaluate.py takes them; N defaults to the eval.num_prompts of RUN's
data config). Prints one line per comparison and the counts as JSON (also written to FILE with --out).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: rlhf from this checkout

from rlhf.core.errors import UserError
from rlhf.data import heldout_references, read_jsonl, unique_prompts
from rlhf.stage.cli import run_stage
from rlhf.stage.config import load_config
from rlhf.stage.run import STAGES, write_json_atomic


def split_prompts(run: Path, split: str) -> set[str]:
    """The distinct prompts of one split of a run's data stage."""
    return set(unique_prompts(read_jsonl(run / "data" / f"{split}.jsonl")))


def overlap(run: Path, other: Path, n_prompts: int | None) -> dict:
    """Counts: eval's prompts of `run`, and how many of them are in `other`'s test split and in `run`'s train and
    val splits."""
    for folder in (run, other):
        if not (folder / "data" / "complete.json").is_file():
            raise UserError(f"{folder} has no completed data stage; run `bash run_all.sh --only data ...` for it first")
    if n_prompts is None:
        n_prompts = load_config(run / "data" / "config.yaml").eval.num_prompts
    evaluated = list(heldout_references(run / "data", separate=False))[:n_prompts]
    in_other_test = sum(prompt in split_prompts(other, "test") for prompt in evaluated)
    return {
        "evaluated_prompts": len(evaluated),
        "in_other_test": in_other_test,
        "in_train": sum(prompt in split_prompts(run, "train") for prompt in evaluated),
        "in_val": sum(prompt in split_prompts(run, "val") for prompt in evaluated),
        "distinct_test_prompts": len(split_prompts(run, "test")),
    }


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def same_weights(run: Path, other: Path) -> dict:
    """For each stage (in pipeline order) whose `model/model.safetensors` both runs hold: the two sha256 digests and
    whether they are equal."""
    compared = {}
    for stage in STAGES:
        paths = [folder / stage / "model" / "model.safetensors" for folder in (run, other)]
        if all(path.is_file() for path in paths):
            digests = [file_sha256(path) for path in paths]
            compared[stage] = {"sha256": digests, "identical": digests[0] == digests[1]}
    return compared


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python part4_eval/split_overlap.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="the run whose evaluated prompts are checked")
    parser.add_argument("other", type=Path, help="a run whose test split they are compared with")
    parser.add_argument("--prompts", type=int, help="how many of the test prompts eval answers (default: RUN's)")
    parser.add_argument("--out", type=Path, help="also write the counts and digests to this JSON file")
    args = parser.parse_args(argv)
    counts = overlap(args.run, args.other, args.prompts)
    counts["weights"] = same_weights(args.run, args.other)
    n = counts["evaluated_prompts"]
    print(f"{counts['in_other_test']} of the {n} evaluated prompts of {args.run} are in {args.other}'s test split")
    print(f"{counts['in_train']} of them are in its train split and {counts['in_val']} in its val split")
    for stage, entry in counts["weights"].items():
        print(f"{stage}: model.safetensors {'byte-identical' if entry['identical'] else 'DIFFERENT'} in both runs")
    print(json.dumps(counts))
    if args.out:
        write_json_atomic(args.out, counts)


if __name__ == "__main__":
    run_stage(main)
