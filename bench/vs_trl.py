"""Side by side with TRL: each stage's work done by ours (bench/stages.py) and by TRL's trainer
(bench/trl_stages.py), interleaved in one invocation, with the ratio TRL's seconds / ours.

    python3 -m venv /work/trl-venv && /work/trl-venv/bin/pip install -r bench/requirements-trl.txt
    PYTHONPATH=. nice -n 10 /work/trl-venv/bin/python bench/vs_trl.py --run outputs/tiny [--repeats 3] [--steps 10]

Each repeat runs every stage once on each side, each in a fresh process, alternating which side
goes first (ABAB, then BABA) so that a load that comes and goes on a shared machine falls on both;
the ratio is of the medians over repeats. End to end is the stage's whole training work for
(warm-up + steps) steps: optimizer set-up, the reference pass a method needs (DPO), every step; not
model loading or tokenisation (TRL 1.x runs DPO's reference pass in its constructor; that pass is
timed and counted). TRL gets the thread count ours chose (the idle cores when its stage started;
the RL stages' `cpu_threads`). `--profile` adds one torch.profiler pass per side and stage
(bench/profiling.py): positions computed and operator shares. Writes {"vs_trl": {stage: ratio}}
(and per stage the seconds of each repeat, the command and the profile) into
bench/results/<device>-<date>.json, updating only the stages run. TRL 1.x has no PPO trainer, so
ppo is omitted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from run import REPO, device_name, measure_stage, write_results
from trl_stages import TRL_STAGES


def measure_trl(
    stage: str, run: Path, preset: str, steps: int, warmup: int, threads: int, overrides: list[str], profile: bool
) -> dict:
    command = [sys.executable, str(REPO / "bench" / "trl_stages.py"), stage, "--run", str(run), "--preset", preset]
    command += ["--steps", str(steps), "--warmup", str(warmup), "--threads", str(threads), *overrides]
    command += ["--profile"] if profile else []
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def profile_table(stage: str, ours: dict, theirs: dict) -> str:
    """Both sides' profiled timed steps: positions computed, operator seconds, and where they went."""
    lines = [
        f"{stage} profile (under torch.profiler; offline stages: the timed steps, RL: the whole stage): "
        + (f"positions ours {ours['positions']:,} / TRL {theirs['positions']:,}; " if "positions" in ours else "")
        + f"operator CPU s ours {ours['operator_cpu_s']:.2f} / TRL {theirs['operator_cpu_s']:.2f}",
        "  family shares, ours | TRL: "
        + ", ".join(
            f"{name} {ours['families_share'].get(name, 0):.0%} | {theirs['families_share'].get(name, 0):.0%}"
            for name in sorted(set(ours["families_share"]) | set(theirs["families_share"]))
        ),
    ]
    for side, summary in (("ours", ours), ("TRL", theirs)):
        top = ", ".join(
            f"{op} {share:.0%} ({summary['top_ops_calls'][op]})"
            for op, share in list(summary["top_ops_share"].items())[:8]
        )
        lines.append(f"  top ops {side} (share, calls): {top}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import trl

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--run", type=Path, help="run folder (default: outputs/<preset>)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stages", default=",".join(TRL_STAGES))
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed repeats, one torch.profiler pass per side of each offline stage (operator shares)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    run = args.run or REPO / "outputs" / args.preset
    stages = args.stages.split(",")
    seconds = {stage: {"ours": [], "trl": [], "ours_timed": [], "trl_timed": [], "threads": []} for stage in stages}
    for repeat in range(args.repeats):
        for stage in stages:
            sides = ("ours", "trl") if repeat % 2 == 0 else ("trl", "ours")  # the first repeat sets `threads`
            for side in sides:
                if side == "ours":
                    result = measure_stage(stage, run, args.preset, args.steps, args.warmup, args.overrides)
                    threads = result["threads"]
                    seconds[stage]["threads"].append(threads)
                else:
                    threads = seconds[stage]["threads"][-1]
                    result = measure_trl(
                        stage, run, args.preset, args.steps, args.warmup, threads, args.overrides, profile=False
                    )
                seconds[stage][side].append(result["total_s"])
                seconds[stage][f"{side}_positions"] = result.get("profile", {}).get("positions")
                seconds[stage][f"{side}_timed"].append(result["timed_s"])
            s = seconds[stage]
            print(
                f"repeat {repeat + 1} {stage}: ours {s['ours'][-1]:.1f} s, TRL {s['trl'][-1]:.1f} s "
                f"(threads {threads}); TRL/ours {s['trl'][-1] / s['ours'][-1]:.2f}",
                flush=True,
            )
    ratios = {stage: statistics.median(s["trl"]) / statistics.median(s["ours"]) for stage, s in seconds.items()}
    steady = {
        stage: statistics.median(s["trl_timed"]) / statistics.median(s["ours_timed"]) for stage, s in seconds.items()
    }
    for stage in stages:
        print(f"{stage}: TRL/ours end to end {ratios[stage]:.2f}, after warm-up {steady[stage]:.2f}")
    profiles = {}
    if args.profile:
        for stage in stages:
            threads = seconds[stage]["threads"][-1]
            profiles[stage] = {
                "ours": measure_stage(stage, run, args.preset, args.steps, args.warmup, args.overrides, profile=True),
                "trl": measure_trl(stage, run, args.preset, args.steps, args.warmup, threads, args.overrides, True),
            }
            print(profile_table(stage, profiles[stage]["ours"]["profile"], profiles[stage]["trl"]["profile"]))
    # Per stage, so that a later run of some stages (--stages) updates theirs and keeps the others'.
    command = "python bench/vs_trl.py " + " ".join(argv if argv is not None else sys.argv[1:])
    per_stage = {
        stage: {
            "command": command,
            "after_warmup": steady[stage],
            "seconds": seconds[stage],
            **({"profile": {side: r["profile"] for side, r in profiles[stage].items()}} if stage in profiles else {}),
        }
        for stage in stages
    }
    path = args.out / f"{device_name()}-{time.strftime('%Y-%m-%d')}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    results = {
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "vs_trl": {**earlier.get("vs_trl", {}), **ratios},
        "vs_trl_details": {
            "trl_version": trl.__version__,
            "settings": "fp32 both sides; TRL: bf16=False, gradient_checkpointing=False, precompute_ref_log_probs "
            "(DPO; its reference pass, run in the trainer's constructor, is timed and counted), use_cpu, no "
            "logging/checkpoints; same data rows, batch/micro-batch sizes, steps, max lengths, lr and clipping; "
            "torch threads as ours chose",
            "stages": {**earlier.get("vs_trl_details", {}).get("stages", {}), **per_stage},
        },
    }
    path = write_results(results, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
