"""Side by side with TRL: each stage's work done by ours (bench/stages.py) and by TRL's trainer
(bench/trl_stages.py), interleaved in one invocation, with the ratio TRL's seconds / ours.

    python3 -m venv /work/trl-venv && /work/trl-venv/bin/pip install -r bench/requirements-trl.txt
    PYTHONPATH=. nice -n 10 /work/trl-venv/bin/python bench/vs_trl.py --run outputs/tiny [--repeats 3] [--steps 10]

Each repeat runs every stage once on each side per thread setting, each in a fresh process,
alternating which side goes first (ABAB, then BABA) so that a load that comes and goes on a shared
machine falls on both; the ratio is of the medians over repeats. End to end is the stage's whole
training work for (warm-up + steps) steps: optimizer set-up, the reference pass a method needs (DPO),
every step; not model loading or tokenisation (TRL 1.x runs DPO's reference pass in its
constructor; that pass is timed and counted).

Threads (`--threads`, both by default): `default` runs each side at its own default, as a user
would (ours: the preset's, one per core unless `<stage>.cpu_threads` says otherwise; TRL: torch's),
and `equal` gives TRL the count ours ran with; every run's count is recorded. `OMP_NUM_THREADS=N`
before the command pins both sides to N. `--profile` adds one torch.profiler pass per side and stage
(bench/profiling.py, under the first `--threads` setting): positions computed and operator shares.
Writes {"vs_trl": {stage: ratio}} (the first `--threads` setting's; per stage, every setting's
ratio, the seconds and threads of each repeat, the command and the profile) into
bench/results/<device>-<date>.json, updating only the stages run. TRL 1.x has no PPO trainer, so
ppo is omitted.

Same work: each run's trainable parameters (LoRA adapters and heads where the preset's `model.lora` covers the
stage, which TRL then trains through its `peft_config`), and for the offline stages the sequences each side
trained on (count, tokens, tokens in the loss, an order-free digest: equal digests, the same tokens), are printed
and recorded per repeat; GRPO: each side's generated tokens.
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

THREAD_SETTINGS = ("default", "equal")  # each side at its own default; TRL at the count ours ran with


def measure_trl(
    stage: str,
    run: Path,
    preset: str,
    steps: int,
    warmup: int,
    threads: int | None,
    overrides: list[str],
    profile: bool,
) -> dict:
    """TRL's `bench/trl_stages.py` result in a fresh process; threads None: torch's default."""
    command = [sys.executable, str(REPO / "bench" / "trl_stages.py"), stage, "--run", str(run), "--preset", preset]
    command += ["--steps", str(steps), "--warmup", str(warmup), *overrides]
    command += ["--threads", str(threads)] if threads is not None else []
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


def trl_threads(setting: str, ours_threads: list[int]) -> int | None:
    """The thread count TRL is given under a `--threads` setting: none under `default` (torch's own
    choice), under `equal` the count of ours' latest run of that setting."""
    return ours_threads[-1] if setting == "equal" else None


def same_work(s: dict) -> str:
    """The latest repeat's trainable parameters and trained sequences of both sides, where both reported them."""
    text = ""
    if "ours_trainable_params" in s and "trl_trainable_params" in s:
        text += f"; trainable params ours {s['ours_trainable_params'][-1]:,}, TRL {s['trl_trainable_params'][-1]:,}"
    if "ours_trained" in s and "trl_trained" in s:
        ours, theirs = s["ours_trained"][-1], s["trl_trained"][-1]
        text += "; trained " + ", ".join(
            f"{side} {t['sequences']} sequences of {t['tokens']:,} tokens ({t['loss_tokens']:,} in the loss)"
            for side, t in (("ours", ours), ("TRL", theirs))
        )
        text += ": the same tokens" if ours["digest"] == theirs["digest"] else ": DIFFERENT tokens"
    return text


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
        "--threads",
        default=",".join(THREAD_SETTINGS),
        help="thread settings, each timed in every repeat: default (each side's own), equal (TRL at ours' count)",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timed repeats, one torch.profiler pass per side of each offline stage (operator shares)",
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value")
    args = parser.parse_intermixed_args(argv)  # overrides may follow the options
    run = args.run or REPO / "outputs" / args.preset
    stages, settings = args.stages.split(","), args.threads.split(",")
    if unknown := sorted(set(settings) - set(THREAD_SETTINGS)):
        raise SystemExit(f"error: unknown --threads setting(s) {', '.join(unknown)}; choose from default, equal")
    keys = ("ours", "trl", "ours_timed", "trl_timed", "ours_threads", "trl_threads")
    seconds = {stage: {setting: {key: [] for key in keys} for setting in settings} for stage in stages}
    for repeat in range(args.repeats):
        for stage in stages:
            for setting in settings:
                s = seconds[stage][setting]
                # ABAB, then BABA; the first repeat runs ours first, so `equal` has a count to give TRL
                for side in ("ours", "trl") if repeat % 2 == 0 else ("trl", "ours"):
                    if side == "ours":
                        result = measure_stage(stage, run, args.preset, args.steps, args.warmup, args.overrides)
                    else:
                        threads = trl_threads(setting, s["ours_threads"])
                        result = measure_trl(
                            stage, run, args.preset, args.steps, args.warmup, threads, args.overrides, profile=False
                        )
                    s[side].append(result["total_s"])
                    s[f"{side}_positions"] = result.get("profile", {}).get("positions")
                    if stage == "grpo":  # each side's generated tokens: is the generation work the same?
                        s.setdefault(f"{side}_generated_tokens", []).append(result["tokens"])
                    if result.get("trained"):  # offline: the sequences trained on (same digest, same tokens)
                        s.setdefault(f"{side}_trained", []).append(result["trained"])
                    if "trainable_params" in result:  # the same parameters trained (LoRA: adapters and heads)
                        s.setdefault(f"{side}_trainable_params", []).append(result["trainable_params"])
                    s[f"{side}_timed"].append(result["timed_s"])
                    s[f"{side}_threads"].append(result["threads"])
                tokens = (
                    f"; generated tokens ours {s['ours_generated_tokens'][-1]:,}, TRL {s['trl_generated_tokens'][-1]:,}"
                    if stage == "grpo"
                    else ""
                )
                print(
                    f"repeat {repeat + 1} {stage}, {setting} threads: ours {s['ours'][-1]:.1f} s "
                    f"({s['ours_threads'][-1]} threads), TRL {s['trl'][-1]:.1f} s ({s['trl_threads'][-1]} threads); "
                    f"TRL/ours {s['trl'][-1] / s['ours'][-1]:.2f}{tokens}{same_work(s)}",
                    flush=True,
                )

    def ratios(key: str) -> dict[str, dict[str, float]]:
        """TRL's median seconds / ours, per stage and thread setting."""
        return {
            stage: {
                setting: statistics.median(s[f"trl{key}"]) / statistics.median(s[f"ours{key}"])
                for setting, s in by_setting.items()
            }
            for stage, by_setting in seconds.items()
        }

    end_to_end, steady = ratios(""), ratios("_timed")
    for stage in stages:
        for setting in settings:
            print(
                f"{stage}, {setting} threads: TRL/ours end to end {end_to_end[stage][setting]:.2f}, "
                f"after warm-up {steady[stage][setting]:.2f}"
            )
    profiles = {}
    if args.profile:
        for stage in stages:
            threads = trl_threads(settings[0], seconds[stage][settings[0]]["ours_threads"])
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
            "vs_trl": end_to_end[stage],  # per thread setting; the headline `vs_trl` is the first setting's
            "after_warmup": steady[stage],
            "seconds": seconds[stage],  # per thread setting: each repeat's seconds and both sides' thread counts
            **({"profile": {side: r["profile"] for side, r in profiles[stage].items()}} if stage in profiles else {}),
        }
        for stage in stages
    }
    path = args.out / f"{device_name()}-{time.strftime('%Y-%m-%d')}.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    results = {
        "device": device_name(),
        "date": time.strftime("%Y-%m-%d"),
        "vs_trl": {**earlier.get("vs_trl", {}), **{stage: end_to_end[stage][settings[0]] for stage in stages}},
        "vs_trl_details": {
            "trl_version": trl.__version__,
            "settings": "fp32 both sides; TRL: bf16=False, gradient_checkpointing=False, precompute_ref_log_probs "
            "(DPO; its reference pass, run in the trainer's constructor, is timed and counted), use_cpu, no "
            "logging/checkpoints; same data rows, batch/micro-batch sizes, steps, max lengths, lr and clipping; "
            "LoRA where the preset's model.lora covers the stage (TRL: peft_config, the same adapters and heads); "
            f"torch threads: {', '.join(settings)} (default: each side's own; equal: TRL at ours' count), "
            f"vs_trl at {settings[0]}",
            "stages": {**earlier.get("vs_trl_details", {}).get("stages", {}), **per_stage},
        },
    }
    path = write_results(results, args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
