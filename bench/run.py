"""Benchmark harness: every training stage's throughput, timed for a fixed number of steps after
warm-up, written to bench/results/<device>-<date>.json with a markdown table beside it.

    python bench/run.py --preset tiny --run outputs/tiny [--steps 10] [--warmup 2] [--stages sft,dpo] [key=value ...]

Needs a run folder whose data, sft and reward stages completed for the same preset and overrides
(`bash run_all.sh --preset tiny --only data,sft,reward`). Each stage runs in its own process
(bench/stages.py), so its peak memory and thread count are its own. Reports:
- sft, reward, dpo: tokens/s (non-pad) and examples/s (demonstrations or pairs) of the timed steps;
- ppo, grpo: samples/s and generated tokens/s, and the seconds split into generate, score and train;
- peak memory: CPU max RSS, or CUDA max allocated.
Numbers are wall-clock on whatever else the machine runs: run it with `nice`, and compare only
numbers taken side by side (bench/vs_trl.py interleaves runs for that reason).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = ("sft", "reward", "dpo", "ppo", "grpo")
UNITS = {"sft": "examples", "reward": "pairs", "dpo": "pairs", "ppo": "samples", "grpo": "samples"}


def measure_stage(
    stage: str, run: Path, preset: str, steps: int, warmup: int, overrides: list[str], profile: bool = False
) -> dict:
    """One stage's `bench/stages.py` result (a dict), run in a fresh process; `profile`: with operator times."""
    command = [sys.executable, str(REPO / "bench" / "stages.py"), stage, "--run", str(run)]
    command += ["--preset", preset, "--steps", str(steps), "--warmup", str(warmup), *overrides]
    command += ["--profile"] if profile else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rates(result: dict) -> dict:
    """Throughput of the timed steps: <unit>/s and tokens/s (RL: generated tokens/s), plus the RL split."""
    seconds = result["timed_s"]
    unit = UNITS[result["stage"]]
    summary = {
        f"{unit}_per_s": result["steps"] * result["batch_size"] / seconds,
        ("generated_tokens_per_s" if unit == "samples" else "tokens_per_s"): result["tokens"] / seconds,
        "seconds_per_step": seconds / result["steps"],
        "peak_memory_mb": result["peak_memory_mb"],
    }
    summary.update({f"{phase}_s_per_step": s / result["steps"] for phase, s in result["split_s"].items()})
    return summary


def device_name() -> str:
    """`cuda-<gpu name>` or `cpu-<cores>core`, as a file-name slug."""
    import torch

    if torch.cuda.is_available():
        return "cuda-" + torch.cuda.get_device_name().lower().replace(" ", "-")
    return f"cpu-{os.cpu_count()}core"


def markdown_table(results: dict) -> str:
    lines = [
        f"Device {results['device']}, {results['date']}; `{results.get('command', '')}`",
        "",
        "| stage | steps | throughput | tokens/s | s/step | generate / score / train s/step | threads | peak MB |",
        "|---|---:|---:|---:|---:|---|---:|---:|",
    ]
    for stage, entry in results.get("stages", {}).items():
        r, raw = entry["rates"], entry["raw"]
        unit = UNITS[stage]
        tokens = r.get("tokens_per_s", r.get("generated_tokens_per_s"))
        split = " / ".join(
            f"{r[f'{p}_s_per_step']:.2f}" for p in ("generate", "score", "train") if f"{p}_s_per_step" in r
        )
        lines.append(
            f"| {stage} | {raw['steps']} | {r[f'{unit}_per_s']:.1f} {unit}/s | {tokens:,.0f} | "
            f"{r['seconds_per_step']:.3f} | {split} | {raw['threads']} | {r['peak_memory_mb']:.0f} |"
        )
    if "vs_trl" in results:
        lines += ["", "TRL's seconds / ours for the same work (end to end): "]
        lines[-1] += ", ".join(f"{stage} {ratio:.2f}" for stage, ratio in results["vs_trl"].items())
    return "\n".join(lines) + "\n"


def write_results(results: dict, out_dir: Path) -> Path:
    """results -> <out_dir>/<device>-<date>.json and .md; an existing file's other keys (vs_trl) are kept."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{results['device']}-{results['date']}.json"
    merged = {**(json.loads(path.read_text()) if path.exists() else {}), **results}
    path.write_text(json.dumps(merged, indent=2) + "\n")
    path.with_suffix(".md").write_text(markdown_table(merged))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--run", type=Path, help="run folder (default: outputs/<preset>)")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps (RL: iterations) per stage")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before them")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    stages = args.stages.split(",")
    if unknown := sorted(set(stages) - set(STAGES)):
        raise SystemExit(f"error: unknown stage(s) {', '.join(unknown)}; choose from {', '.join(STAGES)}")
    run = args.run or REPO / "outputs" / args.preset
    results = {
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "command": "python bench/run.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "stages": {},
    }
    for stage in stages:
        raw = measure_stage(stage, run, args.preset, args.steps, args.warmup, args.overrides)
        results["stages"][stage] = {"rates": rates(raw), "raw": raw}
        print(f"{stage}: " + ", ".join(f"{k} {v:,.2f}" for k, v in results["stages"][stage]["rates"].items()))
    path = write_results(results, args.out)
    print(f"wrote {path} and {path.with_suffix('.md').name}")


if __name__ == "__main__":
    main()
