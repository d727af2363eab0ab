"""Reward over-optimisation curves (Gao et al. 2022, "Scaling Laws for Reward Model Overoptimization",
arXiv 2210.10760): gold score and proxy (reward-model) score against sqrt(KL to the SFT policy).

    python part4_eval/overoptimization.py --preset tiny [--output-dir outputs/tiny] [flags] [section.key=value ...]

Needs a run folder whose data, sft and reward stages completed with the same preset and overrides
(`bash run_all.sh --preset tiny --only data,sft,reward`). Then, as Gao et al. do:

1. RL against each reward: PPO and GRPO (`--methods`), each trained against the reward model ("rm")
   and, on the embedded task, against the gold judge ("gold" = `rlhf.task:gold_rewards`)
   (`--rewards`), with a low KL penalty (`--kl-coefs`, one run per value). Each variant runs the
   real stage script as its own process in `<run>/overopt/<variant>/`, a run folder whose data/,
   sft/ and reward/ link to the main run's, with `<stage>.eval_every` set so that at least
   `--points` evaluations on the held-out prompts fall along training (plus one before it, and the
   final one): every checkpoint is one KL budget.
2. Best-of-N from the SFT policy on the same held-out prompts, seed and sampling settings (PPO's):
   N samples per prompt, the one the reward model ranks highest is kept, for each n of `--best-of-n`;
   its KL is the analytic log n - (n - 1)/n.
3. The KL-regularised optimum on the same samples (`rlhf.analysis.overoptimization.kl_optimum_points`): pi* =
   pi_SFT exp(r / beta) / Z, the policy every RL method here aims at, reweighting the samples, for
   r = the reward model and, on the embedded task, r = gold, at each KL budget of `--optimum-kls`.
   It is the ceiling a reward sets, whatever the optimiser: RL curves below their reward's optimum
   lose to optimisation, an optimum below gold's loses to the reward. `--methods none` draws only
   best-of-N and the optima (a few minutes: no RL runs), e.g. to compare reward models.
4. One figure, `<run>/overopt/overoptimization.png` (gold score and proxy score against sqrt(KL),
   one line per method and reward, best-of-N and the optima included), and every point in
   `<run>/overopt/overoptimization.json`.

Re-running reuses every variant that completed for the same settings (each stage skips itself) and
the best-of-N samples; `--force` redoes them. The defaults take about 4 minutes on 2 CPU
cores for the tiny preset; `--ppo-episodes`, `--grpo-episodes`, `--eval-prompts` and `--best-of-n`
set the budget.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.analysis.overoptimization import best_of_n_points, eval_every_for, eval_points, kl_optimum_points
from rlhf.analysis.plots import plot_overoptimization
from rlhf.core.errors import UserError
from rlhf.data import read_jsonl
from rlhf.methods.rules import check_grpo_config, check_ppo_config
from rlhf.models.modeling import load_policy, load_reward_model, load_tokenizer
from rlhf.models.roles import frozen
from rlhf.models.training import make_accelerator, set_cpu_threads
from rlhf.online.prompts import load_rl_prompts
from rlhf.rollout.batch import SamplingConfig
from rlhf.rollout.engines import build_engine
from rlhf.rollout.evaluation import sample_for_eval
from rlhf.rollout.reward_spec import MODEL, load_reward_function
from rlhf.stage.cli import REPO_ROOT, parse_stage_args, run_stage
from rlhf.stage.run import STAGE_SCRIPTS, write_json_atomic

GOLD_REWARD = "rlhf.task:gold_rewards"  # the embedded task's gold judge as a reward function
REWARD_SPECS = {"rm": MODEL, "gold": GOLD_REWARD}
METHOD_LABELS = {"ppo": "PPO", "grpo": "GRPO"}
NO_METHODS = "none"  # --methods none: best-of-N and the KL-regularised optima only
REWARD_LABELS = {"rm": "reward model", "gold": "gold judge"}
CHECKS = {"ppo": check_ppo_config, "grpo": check_grpo_config}
LINKED_STAGES = ("data", "sft", "reward")


@dataclass(frozen=True)
class Variant:
    name: str  # its sub-run folder under <run>/overopt/
    method: str  # "ppo" | "grpo"
    reward: str  # "rm" | "gold"
    kl_coef: float
    iterations: int
    eval_every: int
    overrides: list[str]  # appended to the user's overrides, so they win


def csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: list[str] | None):
    parser = argparse.ArgumentParser(
        prog="python part4_eval/overoptimization.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", help="configs/NAME.yaml (default: tiny)")
    source.add_argument("--config", help="any YAML config file")
    parser.add_argument(
        "--output-dir", help="the run folder with completed data, sft and reward stages (default: outputs/<preset>)"
    )
    parser.add_argument("--force", action="store_true", help="re-run every variant and best-of-N even if complete")
    parser.add_argument("--methods", default="ppo,grpo", help="RL methods to train, or none (default: ppo,grpo)")
    parser.add_argument(
        "--rewards",
        default=None,
        help="rm (the reward model) and/or gold (embedded task only); default: rm,gold on the embedded task, else rm",
    )
    parser.add_argument(
        "--kl-coefs",
        default="0.01",
        help="KL penalty coefficients, one run per value and method (<stage>.kl_coef; default: 0.01, low)",
    )
    parser.add_argument(
        "--ppo-episodes", type=int, default=None, help="PPO responses per run (default: ppo.total_episodes)"
    )
    parser.add_argument(
        "--grpo-episodes", type=int, default=None, help="GRPO responses per run (default: grpo.total_episodes)"
    )
    parser.add_argument(
        "--points", type=int, default=4, help="held-out evaluations along each run besides the start (default: 4)"
    )
    parser.add_argument(
        "--eval-prompts", type=int, default=None, help="held-out prompts per evaluation (default: ppo.eval_prompts)"
    )
    parser.add_argument(
        "--best-of-n", default="1,2,4,8,16", help="n values for best-of-n from SFT (default: 1,2,4,8,16)"
    )
    parser.add_argument(
        "--optimum-kls",
        default="0.05,0.1,0.2,0.4,0.8,1.2",
        help="KL budgets (nats) of the KL-regularised optimum over the best-of-N samples (default: 0.05,...,1.2)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="section.key=value", help="config overrides, as for every stage"
    )
    return parser.parse_args(argv)


def base_args(args) -> list[str]:
    """The user's config arguments, without the output folder: every variant starts from these."""
    chosen = ["--preset", args.preset] if args.preset else ["--config", args.config] if args.config else []
    return chosen + (["--force"] if args.force else [])


def plan_variants(args, cfg, is_embedded: bool) -> list[Variant]:
    """One variant per method x reward x KL coefficient, with the overrides its stage runs with.
    Flag mistakes are one-line errors before anything runs."""
    methods, coefs = ([] if args.methods == NO_METHODS else csv(args.methods)), csv(args.kl_coefs)
    rewards = csv(args.rewards) if args.rewards is not None else (["rm", "gold"] if is_embedded else ["rm"])
    if (not methods and args.methods != NO_METHODS) or set(methods) - set(METHOD_LABELS):
        raise UserError(f"--methods {args.methods!r}: choose from {', '.join(METHOD_LABELS)}, or {NO_METHODS}")
    if not rewards or set(rewards) - set(REWARD_SPECS):
        raise UserError(
            f"--rewards {args.rewards!r}: choose from rm (the reward model), gold (the embedded task's gold judge)"
        )
    if "gold" in rewards and not is_embedded:
        raise UserError("--rewards gold needs the embedded task's gold judge (data.path=embedded); use --rewards rm")
    try:
        kl_coefs = [float(c) for c in coefs]
    except ValueError:
        raise UserError(f"--kl-coefs {args.kl_coefs!r} must be comma-separated numbers, e.g. 0.01,0.05") from None
    if not kl_coefs or any(c < 0 for c in kl_coefs):
        raise UserError(f"--kl-coefs {args.kl_coefs!r} must be one or more numbers >= 0")
    if args.points < 1:
        raise UserError(f"--points {args.points} must be at least 1")
    eval_prompts = args.eval_prompts or cfg.ppo.eval_prompts
    variants = []
    for method in methods:
        episodes = {"ppo": args.ppo_episodes, "grpo": args.grpo_episodes}[method] or getattr(cfg, method).total_episodes
        iterations = episodes // getattr(cfg, method).batch_size
        if iterations < 1:
            raise UserError(
                f"--{method}-episodes {episodes} is less than one batch "
                f"({method}.batch_size={getattr(cfg, method).batch_size})"
            )
        every = eval_every_for(iterations, args.points)
        for reward in rewards:
            for kl_coef in kl_coefs:
                name = f"{method}_{reward}" + (f"_kl{kl_coef:g}" if len(kl_coefs) > 1 else "")
                overrides = [
                    f"{method}.reward={REWARD_SPECS[reward]}",
                    f"{method}.kl_coef={kl_coef}",
                    f"{method}.total_episodes={episodes}",
                    f"{method}.eval_every={every}",
                    f"{method}.eval_prompts={eval_prompts}",
                ]
                if method == "ppo":
                    overrides.append("ppo.kl_target=null")  # a fixed beta: the KL budget comes from training longer
                variants.append(Variant(name, method, reward, kl_coef, iterations, every, overrides))
    return variants


def link_inputs(main_run: Path, sub_run: Path) -> None:
    """A sub-run folder whose data/, sft/ and reward/ are the main run's (relative links): the stage
    reads them, and their complete.json markers, as if it ran there; it writes only its own folder."""
    sub_run.mkdir(parents=True, exist_ok=True)
    for stage in LINKED_STAGES:
        link = sub_run / stage
        target = Path(os.path.relpath(main_run / stage, sub_run))
        if link.is_symlink() and Path(os.readlink(link)) != target:
            link.unlink()
        if not link.exists() and not link.is_symlink():
            link.symlink_to(target, target_is_directory=True)


def sampled_curves(
    cfg, run, ns: list[int], kls: list[float], n_prompts: int, is_embedded: bool, cache: Path, force: bool
) -> dict[str, list[dict]]:
    """Best-of-n points, and the KL-regularised optimum for the reward model (and gold) at each KL of
    `kls`, from one set of SFT samples on the RL evaluations' held-out prompts, seed and sampling
    settings (PPO's): max(ns) samples per prompt, scored once. The points are cached in `cache` with
    everything they depend on, so a re-run only re-plots. -> {"best_of_n", "optimum_rm", "optimum_gold"}."""
    sampling = SamplingConfig(cfg.ppo.max_new_tokens, cfg.ppo.temperature, cfg.ppo.top_p, cfg.ppo.top_k)
    key = {
        "reward_fingerprint": run.fingerprint("reward", cfg),
        "ns": ns,
        "optimum_kls": kls,
        "eval_prompts": n_prompts,
        "seed": cfg.run.seed,
        "sampling": asdict(sampling),
    }
    if cache.is_file() and not force:
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            print(f"[overopt] best-of-n: reusing {cache}")
            return cached["points"]
    started = time.perf_counter()
    accelerator = make_accelerator(cfg)
    device = accelerator.device
    set_cpu_threads("ppo", cfg.ppo.cpu_threads, device)
    tokenizer = load_tokenizer(run.model_dir("sft"))
    prompts = load_rl_prompts("ppo", run, cfg, tokenizer, n_prompts)
    sft = frozen(load_policy(run.model_dir("sft")), device)
    reward_model = frozen(load_reward_model(run.model_dir("reward")), device)
    engine = build_engine(
        cfg.rollout, "overopt", run.model_dir("sft"), tokenizer, accelerator, cfg.ppo.forward_batch_size
    )
    N = max(ns)
    repeated_ids = [ids for ids in prompts.eval_ids for _ in range(N)]
    repeated_texts = [text for text in prompts.eval_texts for _ in range(N)]
    print(f"[overopt] best-of-n: {len(prompts.eval_ids)} prompts x {N} SFT samples")
    with accelerator.autocast():
        samples = sample_for_eval(
            engine,
            sft,
            tokenizer,
            repeated_ids,
            sampling,
            cfg.run.seed,
            cfg.ppo.forward_batch_size,
            reward_model,
            accelerator,
        )
    proxy = torch.tensor(samples["rewards"]).view(-1, N)  # (P, N)
    gold = None
    if is_embedded:
        gold = torch.tensor(load_reward_function(GOLD_REWARD, "overopt")(repeated_texts, samples["responses"])).view(
            -1, N
        )  # (P, N)
    points = {
        "best_of_n": best_of_n_points(proxy, gold, ns),
        "optimum_rm": kl_optimum_points(proxy, proxy, gold, kls),
        "optimum_gold": [] if gold is None else kl_optimum_points(gold, proxy, gold, kls),
    }
    write_json_atomic(cache, {"key": key, "points": points})
    print(f"[overopt] best-of-n done in {time.perf_counter() - started:.0f}s")
    return points


def main(argv: list[str] | None = None) -> None:
    # 1. Flags and config, checked before anything trains: the main run must have data, sft and reward.
    args = parse_args(argv)
    cfg, run, _ = parse_stage_args(
        "overopt", base_args(args) + (["--output-dir", args.output_dir] if args.output_dir else []) + args.overrides
    )
    run.require(LINKED_STAGES, cfg)  # names every one missing, and the command that builds them
    is_embedded = cfg.data.path == "embedded"
    try:
        ns = sorted({int(n) for n in csv(args.best_of_n)})
    except ValueError:
        raise UserError(f"--best-of-n {args.best_of_n!r} must be comma-separated integers, e.g. 1,2,4,8,16") from None
    if not ns or ns[0] < 1:
        raise UserError(f"--best-of-n {args.best_of_n!r} must list integers >= 1")
    try:
        kls = sorted({float(k) for k in csv(args.optimum_kls)})
    except ValueError:
        raise UserError(f"--optimum-kls {args.optimum_kls!r} must be comma-separated numbers, e.g. 0.1,0.4") from None
    if any(k <= 0 for k in kls):
        raise UserError(f"--optimum-kls {args.optimum_kls!r} must list KL budgets > 0 (nats)")
    n_prompts = args.eval_prompts or cfg.ppo.eval_prompts
    variants = plan_variants(args, cfg, is_embedded)
    out_dir = run.root / "overopt"
    commands = {}
    for variant in variants:
        child = [*base_args(args), "--output-dir", str(out_dir / variant.name), *args.overrides, *variant.overrides]
        variant_cfg, _, _ = parse_stage_args(variant.method, child)  # exactly the config the stage will run with
        CHECKS[variant.method](getattr(variant_cfg, variant.method))
        commands[variant.name] = child
    print(f"[overopt] {len(variants)} RL runs + best-of-n (n = {', '.join(map(str, ns))}) from {run.root} -> {out_dir}")

    # 2. Each variant: the real stage script, as its own process, in its own sub-run folder.
    launch = shlex.split(os.environ.get("RLHF_LAUNCH", "")) or [sys.executable]
    for k, variant in enumerate(variants, 1):
        link_inputs(run.root, out_dir / variant.name)
        print(
            f"[overopt] ({k}/{len(variants)}) {variant.name}: {METHOD_LABELS[variant.method]} against the "
            f"{REWARD_LABELS[variant.reward]}, kl_coef {variant.kl_coef:g}, {variant.iterations} iterations, "
            f"held-out evaluation every {variant.eval_every}",
            flush=True,
        )
        started = time.perf_counter()
        result = subprocess.run([*launch, str(REPO_ROOT / STAGE_SCRIPTS[variant.method]), *commands[variant.name]])
        if result.returncode != 0:
            raise UserError(
                f"variant {variant.name} failed (exit {result.returncode}, output above); fix it and re-run the same "
                f"command: finished variants are reused"
            )
        print(
            f"[overopt] ({k}/{len(variants)}) {variant.name} done in {time.perf_counter() - started:.0f}s", flush=True
        )

    # 3. Best-of-n from the SFT policy, ranked by the reward model, and the KL-regularised optima.
    sampled = sampled_curves(cfg, run, ns, kls, n_prompts, is_embedded, out_dir / "best_of_n.json", args.force)

    # 4. Every point in one JSON, one figure.
    curves = []
    for variant in variants:
        batch_size = getattr(cfg, variant.method).batch_size
        points = eval_points(
            read_jsonl(out_dir / variant.name / variant.method / "metrics.jsonl"), variant.method, batch_size
        )
        label = f"{METHOD_LABELS[variant.method]} vs {'RM' if variant.reward == 'rm' else 'gold'}"
        curves.append(
            {
                "label": label + (f" (kl {variant.kl_coef:g})" if len(csv(args.kl_coefs)) > 1 else ""),
                "method": variant.method,
                "reward": variant.reward,
                "reward_spec": REWARD_SPECS[variant.reward],
                "kl_coef": variant.kl_coef,
                "run": str(out_dir / variant.name),
                "eval_every": variant.eval_every,
                "points": points,
            }
        )
    curves.append(
        {
            "label": "best-of-N (RM picks)",
            "method": "best_of_n",
            "reward": "rm",
            "reward_spec": MODEL,
            "points": sampled["best_of_n"],
        }
    )
    for reward, spec in (("rm", MODEL), ("gold", GOLD_REWARD)):
        if sampled[f"optimum_{reward}"]:
            curves.append(
                {
                    "label": f"KL-regularised optimum vs {'RM' if reward == 'rm' else 'gold'}",
                    "method": "optimum",
                    "reward": reward,
                    "reward_spec": spec,
                    "points": sampled[f"optimum_{reward}"],
                }
            )
    settings = {
        "eval_prompts": n_prompts,
        "seed": cfg.run.seed,
        "best_of_n": ns,
        "optimum": f"pi_SFT exp(r / beta) / Z over the {max(ns)} best-of-N samples per prompt, at each KL of {kls}",
        "x": "sqrt_kl = sqrt(max(KL to SFT, 0)), nats^0.5",
        "proxy": "mean reward-model score (no EOS penalty)",
        "gold": "mean gold score (embedded task)" if is_embedded else None,
    }
    write_json_atomic(out_dir / "overoptimization.json", {"settings": settings, "curves": curves})
    plot_overoptimization(curves, out_dir / "overoptimization.png")
    for curve in curves:
        print(
            f"[overopt] {curve['label']:<34} "
            + "  ".join(
                f"d={p['sqrt_kl']:.2f}: RM {p['proxy_score']:+.2f}"
                + (f" gold {p['gold_score']:.2f}" if p["gold_score"] is not None else "")
                + (f" win {p['gold_win_rate_vs_sft']:.2f}" if p.get("gold_win_rate_vs_sft") is not None else "")
                for p in curve["points"]
            )
        )
    print(f"[overopt] wrote {out_dir / 'overoptimization.json'} and {out_dir / 'overoptimization.png'}")


if __name__ == "__main__":
    run_stage(main)
