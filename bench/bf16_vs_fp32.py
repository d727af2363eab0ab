"""bf16 autocast against fp32 on this machine: seconds per optimizer step of SFT, reward and DPO, at the tiny preset's
model shape and at GPT-2 124M's, each measurement `bench/stages.py` in its own process, fp32 and bf16 interleaved.

    python bench/bf16_vs_fp32.py --run outputs/tiny [--shapes tiny,gpt2] [--stages sft,reward,dpo] [--steps 3]
                                 [--warmup 1] [--repeats 1]

The run folder needs completed data and sft stages (any precision: only its data, tokenizer and SFT weights are read).
The gpt2 shape is a randomly initialised GPT-2 124M (12 layers, width 768, 12 heads, vocabulary 50,257) written as the
SFT model of a scratch run folder beside the tiny run's data, so it trains on the same rows: the tiny task's short
sequences (prompt <= 96 tokens, response <= 64) at 8 examples (pairs) per step. Writes
bench/results/<device>-<date>-bf16.json and .md, with the load average before and after every measurement: the numbers
are wall-clock on whatever else the machine runs. The GPU presets train in bf16 whatever this says about a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from run import REPO, device_name, measure_stage

PRECISIONS = ("no", "bf16")
SHAPES = ("tiny", "gpt2")
STAGES = ("sft", "reward", "dpo")
# GPT-2 124M: 8 examples (pairs) per optimizer step, in one micro-batch, for every stage.
GPT2_OVERRIDES = [f"{stage}.{key}=8" for stage in STAGES for key in ("batch_size", "micro_batch_size")]
GPT2_OVERRIDES += ["dpo.eval_batch_size=8"]


def load_average() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def write_gpt2_run(tiny_run: Path, folder: Path) -> Path:
    """A run folder holding `tiny_run`'s data and a random GPT-2 124M (with tiny's tokenizer) as its SFT model."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    sys.path.insert(0, str(REPO))
    from rlhf.models.modeling import load_tokenizer

    (folder / "data").symlink_to((tiny_run / "data").resolve())
    tokenizer = load_tokenizer(tiny_run / "sft" / "model")
    special = {key: getattr(tokenizer, key) for key in ("bos_token_id", "eos_token_id", "pad_token_id")}
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, **special))
    model.save_pretrained(folder / "sft" / "model")
    tokenizer.save_pretrained(folder / "sft" / "model")
    return folder


def markdown(results: dict) -> str:
    lines = [
        f"Device {results['device']}, {results['date']}. s/step: median over repeats of the timed steps' seconds per",
        "optimizer step; bf16 / fp32 > 1: bf16 slower; load: the 1-minute load average before and after.",
        "",
        "| shape | stage | examples/step | fp32 s/step | bf16 s/step | bf16 / fp32 | threads | load | measured |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['shape']} | {row['stage']} | {row['batch_size']} | {row['fp32_s_per_step']:.3f} | "
            f"{row['bf16_s_per_step']:.3f} | {row['bf16_over_fp32']:.2f} | {row['threads']} | "
            f"{row['load_min']:.1f}-{row['load_max']:.1f} | {row['measured']} |"
        )
    commands = sorted({row["command"] for row in results["rows"]})
    return "\n".join([*lines, "", *(f"`{command}`" for command in commands)]) + "\n"


def write_results(results: dict, out_dir: Path) -> Path:
    """-> <out_dir>/<device>-<date>-bf16.json and .md; rows of another shape or stage already there are kept."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{results['device']}-{results['date']}-bf16.json"
    new = {(row["shape"], row["stage"]) for row in results["rows"]}
    kept = (
        [row for row in json.loads(path.read_text())["rows"] if (row["shape"], row["stage"]) not in new]
        if path.exists()
        else []
    )
    results = {
        **results,
        "rows": sorted(kept + results["rows"], key=lambda r: (SHAPES.index(r["shape"]), STAGES.index(r["stage"]))),
    }
    path.write_text(json.dumps(results, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown(results))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, default=REPO / "outputs" / "tiny")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--steps", type=int, default=3, help="timed optimizer steps per measurement")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--repeats", type=int, default=1, help="fp32/bf16 pairs per stage, interleaved")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = parser.parse_args(argv)
    shapes, stages = args.shapes.split(","), args.stages.split(",")
    if bad := sorted(set(shapes) - set(SHAPES)) + sorted(set(stages) - set(STAGES)):
        raise SystemExit(f"error: unknown shape or stage {', '.join(bad)}; shapes: {SHAPES}, stages: {STAGES}")
    results = {"device": device_name(), "date": time.strftime("%Y-%m-%d"), "rows": []}
    command = "python bench/bf16_vs_fp32.py " + " ".join(argv if argv is not None else sys.argv[1:])
    with tempfile.TemporaryDirectory(prefix="bench-bf16-") as scratch:
        for shape in shapes:
            run, overrides = args.run, []
            if shape == "gpt2":
                run, overrides = write_gpt2_run(args.run, Path(scratch)), GPT2_OVERRIDES
            for stage in stages:
                seconds: dict[str, list[float]] = {p: [] for p in PRECISIONS}
                loads = [load_average()]
                for _ in range(args.repeats):
                    for precision in PRECISIONS:
                        raw = measure_stage(
                            stage,
                            run,
                            "tiny",
                            args.steps,
                            args.warmup,
                            [*overrides, f"run.mixed_precision={precision}"],
                        )
                        seconds[precision].append(raw["timed_s"] / raw["steps"])
                        loads.append(load_average())
                fp32, bf16 = statistics.median(seconds["no"]), statistics.median(seconds["bf16"])
                row = {
                    "shape": shape,
                    "stage": stage,
                    "batch_size": raw["batch_size"],
                    "fp32_s_per_step": fp32,
                    "bf16_s_per_step": bf16,
                    "bf16_over_fp32": bf16 / fp32,
                    "load_min": min(loads),
                    "load_max": max(loads),
                    "raw_s_per_step": seconds,
                    "threads": raw["threads"],
                    "measured": time.strftime("%Y-%m-%d %H:%M"),
                    "command": command,
                }
                results["rows"].append(row)
                print(f"{shape} {stage}: fp32 {fp32:.3f} s/step, bf16 {bf16:.3f} s/step ({bf16 / fp32:.2f}x)")
    path = write_results(results, args.out)
    print(f"wrote {path} and {path.with_suffix('.md').name}")


if __name__ == "__main__":
    main()
