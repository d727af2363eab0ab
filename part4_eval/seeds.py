"""Seed spread: re-run the alignment stages (or the whole pipeline) with K seeds, evaluate each, and give every
method's win rate against SFT an interval that counts both the seeds and the prompts.

    python part4_eval/seeds.py --preset tiny --seeds 4 [--scope methods|pipeline] [--methods ppo,dpo]
                               [--output-dir DIR] [section.key=value ...]

Two scopes, two questions:
- `--scope methods` (the default): the methods re-run on ONE run's data, SFT policy and reward model. Its interval
  is conditional on that draw: it says how a method does from this SFT and this reward model. In DIR/seeds/.
- `--scope pipeline`: seed i redraws everything upstream as well: `run.seed` + i (the SFT's and reward model's
  initialisation and data order, and the methods), on the embedded task `data.embedded.seed` + i (new training
  and validation pairs, a new tokenizer), with the test split held fixed (`data.embedded.test_seed`, the base
  run's), so that every seed answers the same test prompts. Its interval covers the whole pipeline: what a
  method gains over SFT when the data, SFT and reward model are drawn again. In DIR/pipeline_seeds/. Every stage
  of seed i runs in DIR/pipeline_seeds/seed_<s>/, a run folder of its own (about one full run's time per seed).

One run cannot rank methods a few points apart: changing the sampling seeds alone moved PPO's gold win rate
against SFT from 0.568 to 0.532 on the tiny preset. Seed i (0 ≤ i < K) trains with method seed run.seed + i
(`run.method_seed`, read only by the alignment stages: rlhf.stage.run.stage_seed) and is evaluated with sampling seed
eval.seed + i, so the spread is that of training and of evaluation sampling together.

For `--scope methods`:
- Seed 0 is the run itself (DIR): its method stages and eval are reused when complete for this config, and run
  there otherwise, as `bash run_all.sh --from ppo` would (the overrides given apply to every seed, seed 0 too).
- Seed i ≥ 1 runs in DIR/seeds/seed_<s>/, whose data, sft, reward (and collect) folders are links to DIR's and
  whose summary.json starts with DIR's sections of those stages. A seed folder resumes and skips like any run.
  Its eval answers the same prompts with SEED_EVAL_OVERRIDES: no failure suites, no LLM judge and a token
  best-of-N, none of which the spread uses (every model's answers are sampled as in a full eval).
- Then `rlhf.analysis.seeds.aggregate_seed_runs` reads every seed's eval/responses/*.jsonl and writes
  <scope dir>/summary.json:
  per method the win rate against the SAME seed's SFT answers (gold judge; the reward model without one), gold
  score and good-rate, and every head-to-head, each with its mean, sd over seeds, per-seed values and a 95%
  interval over seeds × prompts (the equations are in rlhf/analysis/seeds.py), a two-sided p-value of "no difference"
  from the same standard error, and that p Holm-adjusted over its family (the comparisons with SFT; the
  head-to-heads). DIR/report.md is re-rendered to show them.

Methods: --methods, else the alignment stages that completed in DIR, else every one the pipeline has. Stage
output goes to DIR/seeds/logs/seed_<s>_<stage>.log, one progress line per stage per seed to the console;
RLHF_LAUNCH starts each stage under a launcher, as in run_all.sh.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.analysis.seeds import FEW_SEEDS, SCOPE_DIRS, aggregate_seed_runs
from rlhf.core.errors import UserError
from rlhf.pipeline.launch import launcher_command
from rlhf.pipeline.stage_process import preload, run_stage_script
from rlhf.stage.cli import REPO_ROOT, parse_stage_args, run_stage
from rlhf.stage.run import METHOD_STAGES, STAGE_SCRIPTS, RunDir, collect_needed, write_json_atomic

# Seed runs' eval: the spread reads only every model's answers to the eval prompts, which these leave as they are
# (best-of-N samples on a stream of its own). Tiny preset, 5 models x 300 prompts, shared 2-core CPU (2026-11-26):
# eval took 102 s as configured (suites, best-of-16 on 100 prompts) and 45 s with these.
SEED_EVAL_OVERRIDES = ["eval.suites=false", "eval.judges=gold,reward", "eval.best_of_n=1", "eval.best_of_n_prompts=1"]
UPSTREAM_SECTIONS = ("data", "sft", "collect", "reward_model")  # summary.json sections of the linked stages
TAIL_LINES = 15  # of a failed stage's log, shown on the console
SCOPES = tuple(SCOPE_DIRS)


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """seeds.py's own flags, and the stage command line without --output-dir: [--preset NAME | --config FILE]
    followed by the overrides."""
    parser = argparse.ArgumentParser(
        prog="python part4_eval/seeds.py", description="Re-run the alignment stages with K seeds."
    )
    parser.add_argument("--seeds", type=int, required=True, help="K: method seeds run.seed, ..., run.seed + K - 1")
    parser.add_argument(
        "--scope",
        choices=SCOPES,
        default="methods",
        help="methods: re-run the methods on this run's data, SFT and reward model (DIR/seeds/); "
        "pipeline: redraw the data, SFT and reward model per seed too (DIR/pipeline_seeds/)",
    )
    parser.add_argument(
        "--methods",
        help=f"comma-separated, from: {', '.join(METHOD_STAGES)} (default: those complete in the run folder, else all)",
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", help="configs/NAME.yaml (default: tiny)")
    source.add_argument("--config", help="any YAML config file")
    parser.add_argument("--output-dir", help="the run folder (default: outputs/<preset>)")
    parser.add_argument("overrides", nargs="*", metavar="section.key=value", help="override any config key")
    args = parser.parse_args(argv)
    flags = ["--preset", args.preset] if args.preset else ["--config", args.config] if args.config else []
    return args, flags


def choose_methods(requested: str | None, run: RunDir, cfg) -> list[str]:
    available = [stage for stage in METHOD_STAGES if stage in STAGE_SCRIPTS]
    if requested:
        chosen = [name.strip() for name in requested.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in available]
        if unknown or not chosen:
            raise UserError(
                f"unknown method(s) {', '.join(unknown) or '(none given)'} in --methods; "
                f"choose from: {', '.join(available)}"
            )
        return [stage for stage in available if stage in chosen]
    completed = [stage for stage in available if run.is_complete(stage, cfg)]
    return completed or available


def link_seed_folder(base: RunDir, folder: Path, upstream: list[str]) -> None:
    """DIR/seeds/seed_<s>/: links to the base run's upstream stage folders (relative, so the run folder can
    move) and their summary.json sections."""
    folder.mkdir(parents=True, exist_ok=True)
    for stage in upstream:
        link, target = folder / stage, os.path.relpath(base.stage(stage).absolute(), folder.absolute())
        if link.is_symlink() and os.readlink(link) == target:
            continue
        if link.is_symlink():
            link.unlink()
        elif link.exists():
            raise UserError(f"{link} is not a link to {base.stage(stage)}; delete it, and seeds.py links it again")
        link.symlink_to(target, target_is_directory=True)
    base_summary, seed_run = base.read_summary(), RunDir(folder)
    summary = seed_run.read_summary()
    summary.update({key: base_summary[key] for key in UPSTREAM_SECTIONS if key in base_summary})
    for per_stage in ("timing_s", "cpu_threads"):  # {stage: value} entries, the linked stages' copied
        entries = {stage: v for stage, v in base_summary.get(per_stage, {}).items() if stage in upstream}
        if entries:
            summary[per_stage] = {**summary.get(per_stage, {}), **entries}
    write_json_atomic(seed_run.summary_path, summary)


def pipeline_seed_overrides(cfg, i: int) -> list[str]:
    """`--scope pipeline`'s overrides for seed i >= 1: run.seed + i, and on the embedded task its task seed + i
    with the test split's seed held at the base run's, so that every seed answers the same test prompts."""
    overrides = [f"run.seed={cfg.run.seed + i}"]
    if cfg.data.path == "embedded":
        spec = cfg.data.embedded
        test_seed = spec.seed if spec.test_seed is None else spec.test_seed
        overrides += [f"data.embedded.seed={spec.seed + i}", f"data.embedded.test_seed={test_seed}"]
    return overrides


def main(argv: list[str] | None = None) -> None:
    # 1. The command line, the run and its config; everything checked before any stage starts.
    args, source = parse_args(argv)
    preload()  # the libraries every stage imports, once, before any other work (rlhf.pipeline.stage_process)
    output = ["--output-dir", args.output_dir] if args.output_dir else []
    cfg, run, _ = parse_stage_args("seeds", [*source, *output, *args.overrides])
    flags = shlex.join(source or ["--preset", "tiny"])
    if args.seeds < 2:
        raise UserError(f"--seeds {args.seeds}: the spread needs at least 2 seeds; pass --seeds 4 (or more)")
    if cfg.run.method_seed is not None:
        raise UserError(
            "seeds.py sets run.method_seed itself (run.seed + i for seed i); drop the run.method_seed override"
        )
    upstream = ["data", "sft", *(["collect"] if collect_needed(cfg) else []), "reward"]
    missing = [stage for stage in upstream if not run.is_complete(stage, cfg)]
    if missing:
        raise UserError(
            f"stage(s) {', '.join(missing)} not complete for this config in {run.root}; run "
            f"`bash run_all.sh {flags} --output-dir {run.root} --only {','.join(upstream)} "
            f"{shlex.join(args.overrides)}`".rstrip()
            + " first"
        )
    if args.seeds < FEW_SEEDS:
        print(f"[seeds] warning: {args.seeds} seeds give intervals that cover less than 95% where the seeds matter")
    methods = choose_methods(args.methods, run, cfg)
    launcher = launcher_command(os.environ.get("RLHF_LAUNCH", ""))
    seeds_dir = run.root / SCOPE_DIRS[args.scope]
    redrawn = (
        "with the data, SFT and reward model redrawn per seed"
        if args.scope == "pipeline"
        else (f"on the {', '.join(upstream)} of {run.root}")
    )
    print(f"[seeds] {args.seeds} seeds of {', '.join(methods)} {redrawn}; stage logs in {seeds_dir / 'logs'}")

    # 2. Each seed: the method stages, then eval, in its own run folder (seed 0: the run itself).
    seed_runs = []
    for i in range(args.seeds):
        method_seed, eval_seed = cfg.run.seed + i, cfg.eval.seed + i
        if i == 0:
            folder, overrides = run.root, list(args.overrides)
        elif args.scope == "pipeline":
            folder = seeds_dir / f"seed_{method_seed}"
            overrides = [
                *SEED_EVAL_OVERRIDES,
                *args.overrides,
                *pipeline_seed_overrides(cfg, i),
                f"eval.seed={eval_seed}",
            ]
        else:
            folder = seeds_dir / f"seed_{method_seed}"
            link_seed_folder(run, folder, upstream)
            overrides = [
                *SEED_EVAL_OVERRIDES,
                *args.overrides,
                f"run.method_seed={method_seed}",
                f"eval.seed={eval_seed}",
            ]
        stage_args = [*source, "--output-dir", str(folder), *overrides]
        label = f"[seeds] seed {i + 1}/{args.seeds} (seed {method_seed}, eval seed {eval_seed}"
        label += ", the run itself)" if i == 0 else ")"
        own_upstream = upstream if args.scope == "pipeline" and i > 0 else []
        for stage in [*own_upstream, *methods, "eval"]:
            stage_cfg, stage_run, _ = parse_stage_args(stage, stage_args)
            # an eval that completed before one of the methods did has no answers of it: it runs again
            answered = all((folder / "eval" / "responses" / f"{m}.jsonl").is_file() for m in methods)
            redo = ["--force"] if stage == "eval" and not answered else []
            if stage_run.is_complete(stage, stage_cfg) and not redo:
                print(f"{label} {stage}: complete, reused", flush=True)
                continue
            log_path = seeds_dir / "logs" / f"seed_{method_seed}_{stage}.log"
            started = time.perf_counter()
            code = run_stage_script(REPO_ROOT / STAGE_SCRIPTS[stage], [*stage_args, *redo], log_path, launcher)
            if code != 0:
                tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-TAIL_LINES:]
                print("\n".join(tail), file=sys.stderr)
                raise UserError(
                    f"seed {method_seed}: stage '{stage}' failed (exit {code}); its output is in {log_path}; "
                    "fix it and re-run the same command (finished stages are reused)"
                )
            print(f"{label} {stage}: done in {time.perf_counter() - started:.0f}s", flush=True)
        seed_runs.append({"method_seed": method_seed, "eval_seed": eval_seed, "folder": folder})

    # 3. The spread over seeds × prompts, from every seed's eval answers.
    spread = aggregate_seed_runs(
        [entry["folder"] / "eval" for entry in seed_runs], methods, cfg.judge.reward_tie_tolerance
    )
    spread["seeds"] = [
        {**entry, "folder": os.path.relpath(entry["folder"].absolute(), run.root.absolute())} for entry in seed_runs
    ]
    spread["scope"] = args.scope
    spread["seed_eval_overrides"] = SEED_EVAL_OVERRIDES
    spread["interval"] = (
        "mean over seeds x prompts ± t(0.975, Satterthwaite df) · SE, SE² = (MS_seed + MS_prompt − MS_resid) / (nK), "
        "two-way random-effects ANOVA, zero-truncated components; p_value tests 0.5 with the same SE on at most "
        "K − 1 df where the seed component is zero; p_holm within its family, p_holm_all over all "
        "(rlhf/analysis/seeds.py)"
    )
    write_json_atomic(seeds_dir / "summary.json", spread)
    for method, block in spread["win_rate_vs_sft"].items():
        print(
            f"[seeds] {method}: {spread['judge']} win rate vs SFT {block['mean']:.3f} "
            f"[{block['ci95_low']:.3f}, {block['ci95_high']:.3f}], sd {block['sd']:.3f} over seeds "
            f"({' '.join(f'{v:.3f}' for v in block['per_seed'])})"
        )

    # 4. The run's report, re-rendered to show the spread.
    log_path = seeds_dir / "logs" / "report.log"
    report_args = [*source, "--output-dir", str(run.root), *args.overrides, "--force"]
    code = run_stage_script(REPO_ROOT / STAGE_SCRIPTS["report"], report_args, log_path, launcher)
    report = f"{run.root / 'report.md'} updated" if code == 0 else f"report not updated (exit {code}; see {log_path})"
    print(f"[seeds] wrote {seeds_dir / 'summary.json'}; {report}")


if __name__ == "__main__":
    run_stage(main)
