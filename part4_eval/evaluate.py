"""Stage `eval`: every policy of the run answers the same held-out prompts, measured the same way.

    python part4_eval/evaluate.py --preset tiny
    accelerate launch --num_processes 8 part4_eval/evaluate.py --preset tiny    # or torchrun

Reads the run's data, SFT policy (also the KL reference), reward model, and whichever of the
PPO, GRPO, RAFT and DPO policies completed; writes `<run>/eval/`: one JSONL of responses per model,
best-of-N from SFT, pairwise win rates from every available judge, the failure suites, and
`eval.*` in summary.json. Every model is sampled with the same decoding settings, prompt i from its
own seed (`rlhf.rollout.generate.sampling_seeds`). On W processes each samples and scores its shard of the
prompts and all get them back in prompt order, so W processes draw what one does; the main process
alone then judges and writes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's rlhf, even under another clone's .venv

from rlhf.methods.rules import STAGE_RULES, requested_benchmarks, requested_judges
from rlhf.stage.cli import answer_early, run_stage, start_stage

if __name__ == "__main__":
    answer_early("eval", STAGE_RULES["eval"])  # --help and config errors at once, before torch loads below

import torch
from tqdm import tqdm

from rlhf import task
from rlhf.analysis.evaluation import (
    best_of_n_choice,
    best_of_n_kl,
    degeneration_reasons,
    distinct_n,
    mean_std,
    repetition_within,
    win_rate_pairings,
)
from rlhf.chat import render_prompt
from rlhf.core.batching import encode_texts
from rlhf.core.errors import UserError
from rlhf.core.winrates import holm_adjust, judge_agreements, length_controlled_win_rate
from rlhf.data import heldout_references, heldout_split, write_jsonl
from rlhf.judges import GoldJudge, OpenAIJudge, RewardJudge, combine_batch_info
from rlhf.judges.refusal import is_refusal, paired_rate_change
from rlhf.models.memory import peak_memory_mb
from rlhf.models.modeling import build_policy, load_policy, load_reward_model, load_tokenizer
from rlhf.models.training import make_accelerator
from rlhf.rollout.batch import eval_sampling
from rlhf.rollout.benchmarks import (
    HEADLINE_BENCHMARK_METRICS,
    answer_benchmark,
    benchmark_line,
    load_benchmark,
    paired_benchmark_change,
)
from rlhf.rollout.engines import build_engine, check_engine
from rlhf.rollout.evaluation import EVAL_STREAM, sample_for_eval
from rlhf.rollout.rewards import text_scorer
from rlhf.stage.run import METHOD_STAGES, judge_needed, write_json_atomic

POLICY_STAGES = METHOD_STAGES  # every alignment stage's policy, when it completed
SUITES_FILE = Path(__file__).resolve().parent / "suites.json"  # HH-style suites; the embedded task has its own
# Best-of-N's samples get seeds of their own: on the eval stream, row 0 (prompt 0's first sample) would share
# its seed, and so its response, with SFT's answer to prompt 0.
BEST_OF_N_STREAM = EVAL_STREAM - 1
REFUSAL_SUITES = ("harmful", "benign")  # suites whose answers the keyword refusal judge reads (rlhf.judges.refusal)


class Answers:
    """One model's responses to a list of prompts, with everything measured about them."""

    def __init__(
        self,
        prompts: list[str],
        texts: list[str],
        lengths: list[int],
        finished: list[bool],
        rewards: list[float],
        kls: list[float] | None,
    ):
        self.prompts, self.texts, self.lengths, self.finished = prompts, texts, lengths, finished
        self.rewards, self.kls = rewards, kls
        self.by_prompt = dict(zip(prompts, texts))

    def rows(self, is_embedded: bool) -> list[dict]:
        rows = []
        for i, (prompt, text) in enumerate(zip(self.prompts, self.texts)):
            row = {
                "prompt": prompt,
                "response": text,
                "reward": self.rewards[i],
                "length": self.lengths[i],
                "finished": self.finished[i],
                "kl": self.kls[i] if self.kls is not None else None,
            }
            if is_embedded:
                row["gold_score"] = task.gold_score(prompt, text)
            rows.append(row)
        return rows

    def metrics(self, token_ids: list[list[int]], is_embedded: bool, kl_override: float | None = None) -> dict:
        reward_mean, reward_std = mean_std(self.rewards)
        kl_mean, kl_std = mean_std(self.kls) if self.kls is not None else (kl_override, 0.0)
        result = {
            "n": len(self.prompts),
            "reward_mean": reward_mean,
            "reward_std": reward_std,
            "kl_to_ref": kl_mean,
            "kl_to_ref_std": kl_std,
            "length_mean": mean_std(self.lengths)[0],
            "eos_rate": sum(self.finished) / len(self.finished),
            "distinct_2": distinct_n(token_ids, 2),
            "repetition_4": repetition_within(token_ids, 4),
        }
        if is_embedded:
            result.update(task.gold_summary(self.prompts, self.texts))
        return result


def answer(
    engine,
    model,
    ref_model,
    reward_model,
    tokenizer,
    prompts: list[str],
    cfg,
    accelerator,
    with_kl: bool = True,
    stream: int = EVAL_STREAM,
) -> tuple[Answers, list[list[int]]]:
    """The shared decoding: every model samples with the same settings, prompt i from its own seed, on whichever
    process it is sharded to (`sample_for_eval`), so every process count draws the same responses. `engine`
    (`rlhf.rollout.engines`) samples; `model` is the policy whose weights it samples from."""
    sampling = eval_sampling(cfg)
    samples = sample_for_eval(
        engine,
        model,
        tokenizer,
        encode_texts(tokenizer, prompts),
        sampling,
        cfg.eval.seed,
        cfg.eval.batch_size,
        reward_model,
        accelerator,
        reference=ref_model if with_kl else None,
        stream=stream,
        sampler_logprobs=True,  # one forward pass less per model (SFT, identical to the reference, has no KL pass)
    )
    answers = Answers(
        prompts,
        samples["responses"],
        samples["lengths"],
        samples["finished"],
        samples["rewards"],
        samples["kl"] if with_kl else None,
    )
    return answers, samples["response_ids"]


def progress(items, desc: str, total: int, accelerator):
    """A progress bar with the time left over the eval's long loops (main process; redrawn rarely in a log)."""
    return tqdm(
        items,
        desc=desc,
        total=total,
        disable=not accelerator.is_main_process,
        mininterval=0.1 if sys.stderr.isatty() else 30.0,
    )


def say_line(accelerator, line: str) -> None:
    """A line printed above the progress bar rather than through it (main process)."""
    if accelerator.is_main_process:
        tqdm.write(line)


def judge_failure(reason: str, infos: list[dict]) -> dict:
    """judges_info's entry for a judge that stopped: its request counts so far and a status naming the cause."""
    counts = combine_batch_info(infos)
    failures = f"{counts.get('n_failed', 0)} of {counts.get('n_judgments', 0)} judgments failed"
    return {**counts, "status": f"failed ({failures}; the judge stopped: {reason})"}


def build_judges(cfg, run, is_embedded: bool, scorer, independent_scorer) -> tuple[dict, dict]:
    """The judges asked for in eval.judges that can run here; the others with the reason why not.
    `independent_scorer` scores with the judge_rm stage's reward model (None when data.judge_fraction is 0)."""
    requested = requested_judges(cfg)
    judges, skipped = {}, {}
    if "gold" in requested:
        if is_embedded:
            judges["gold"] = GoldJudge()
        else:
            skipped["gold"] = "skipped: the gold judge exists only for the embedded task"
    if "reward" in requested:
        judges["reward"] = RewardJudge(scorer, tie_tolerance=cfg.judge.reward_tie_tolerance)
    if "independent" in requested:
        if independent_scorer is not None:
            judges["independent"] = RewardJudge(
                independent_scorer, tie_tolerance=cfg.judge.reward_tie_tolerance, name="independent"
            )
        else:
            skipped["independent"] = "skipped: no independent judge's reward model (set data.judge_fraction > 0)"
    if "openai" in requested:
        cfg.judge.validate()
        judge = OpenAIJudge(cfg.judge, cache_path=run.stage("eval") / "openai_cache.jsonl")
        if judge.available():
            judges["openai"] = judge
        else:
            skipped["openai"] = judge.unavailable_reason
    return judges, skipped


def gold_differences(answers: dict, pairings: list[tuple[str, str]]) -> dict[str, list[str | None]]:
    """Per pairing `<a>_vs_<b>` and common prompt, what separates the two answers in the gold judge's eyes
    (`task.gold_difference`), in the order the judges compared them."""
    differences = {}
    for a, b in pairings:
        common = [p for p in answers[a].prompts if p in answers[b].by_prompt]
        differences[f"{a}_vs_{b}"] = [
            task.gold_difference(
                task.gold_details(p, answers[a].by_prompt[p]), task.gold_details(p, answers[b].by_prompt[p])
            )
            for p in common
        ]
    return differences


def main(argv: list[str] | None = None) -> None:
    started = start_stage("eval", argv, requires=("reward",), check=STAGE_RULES["eval"])
    if started is None:
        return
    cfg, run = started
    t_start = time.perf_counter()
    out_dir = run.stage("eval")
    (out_dir / "responses").mkdir(parents=True, exist_ok=True)
    is_embedded = cfg.data.path == "embedded"

    # 1. Models: SFT (also the KL reference), every completed policy stage, and the base model if pretrained.
    accelerator = make_accelerator(cfg)
    check_engine(cfg.rollout, "eval")
    device = accelerator.device
    tokenizer = load_tokenizer(run.model_dir("sft"))
    ref_model = load_policy(run.model_dir("sft")).to(device).eval()
    reward_model = load_reward_model(run.model_dir("reward")).to(device).eval()
    # the independent judge's reward model: trained on pairs no policy and not the reward model saw (stage judge_rm)
    judge_model = load_reward_model(run.model_dir("judge_rm")).to(device).eval() if judge_needed(cfg) else None
    engine = build_engine(cfg.rollout, "eval", run.model_dir("sft"), tokenizer, accelerator, cfg.eval.batch_size)
    policies = {stage: run.model_dir(stage) for stage in POLICY_STAGES if run.is_complete(stage, cfg)}
    for stage in POLICY_STAGES:
        if stage not in policies:
            accelerator.print(f"[eval] {stage}: no completed policy in this run; left out")

    # 2. Held-out prompts (test split), with the dataset's response as one more contestant: the test pairs'
    #    chosen one, or with eval.baseline=reference the reference response (data.sft_path's demonstrations).
    separate = cfg.eval.baseline == "reference" and cfg.data.sft_path is not None
    reference = "reference" if cfg.eval.baseline == "reference" else "chosen"
    chosen_by_prompt = heldout_references(run.stage("data"), separate)
    prompts = list(chosen_by_prompt)[: cfg.eval.num_prompts]
    prompt_split = heldout_split(run.stage("data"), separate)
    if prompt_split == "val":  # the data stage warned about it
        accelerator.print(f"[eval] {len(prompts)} validation prompts: the data has no test split")

    # 3. Every model answers with the same decoding and per-prompt seeds; RM score, KL to SFT, length, EOS,
    #    diversity. Every process samples and scores its shard of the prompts and gets all of them back in order.
    answers: dict[str, Answers] = {}
    metrics: dict[str, dict] = {}
    with accelerator.autocast():
        models = {"sft": ref_model} | {stage: load_policy(path).to(device).eval() for stage, path in policies.items()}
        if cfg.model.init == "pretrained":
            try:
                models["base"] = build_policy(cfg.model, tokenizer, run.pretrained_source(cfg)).to(device).eval()
            except UserError as exc:
                accelerator.print(f"[eval] base model left out: {exc}")
        for name, model in progress(models.items(), "eval: answers", len(models), accelerator):
            started_at = time.perf_counter()
            answers[name], token_ids = answer(
                engine, model, ref_model, reward_model, tokenizer, prompts, cfg, accelerator, with_kl=name != "sft"
            )
            if name == "sft":
                answers[name].kls = [0.0] * len(prompts)  # pi = pi_ref: the estimate is exactly zero
            metrics[name] = answers[name].metrics(token_ids, is_embedded)
            say_line(
                accelerator,
                f"[eval] {name}: reward {metrics[name]['reward_mean']:+.3f}  KL {metrics[name]['kl_to_ref']:.2f}"
                + (f"  gold {metrics[name]['gold_score_mean']:.3f}" if is_embedded else "")
                + f"  ({time.perf_counter() - started_at:.0f}s)",
            )

        # 4. Best-of-N from SFT ranked by the reward model: a reference point at a known KL.
        n_best = cfg.eval.best_of_n
        bon_prompts = prompts[: cfg.eval.best_of_n_prompts]
        repeated = [p for p in bon_prompts for _ in range(n_best)]
        bon_all, bon_ids = answer(
            engine,
            ref_model,
            ref_model,
            reward_model,
            tokenizer,
            repeated,
            cfg,
            accelerator,
            with_kl=False,
            stream=BEST_OF_N_STREAM,
        )
        scores = torch.tensor(bon_all.rewards).view(len(bon_prompts), n_best)  # (P, N)

        def best_picks(n: int) -> list[int]:  # each prompt's best of its first n samples, as rows of bon_all
            return [p * n_best + j for p, j in enumerate(best_of_n_choice(scores, n).tolist())]

        curve = []
        for n in sorted({2**k for k in range(n_best.bit_length()) if 2**k <= n_best} | {n_best}):
            picks = best_picks(n)
            point = {"n": n, "kl": best_of_n_kl(n), "reward_mean": mean_std([bon_all.rewards[i] for i in picks])[0]}
            if is_embedded:
                point["gold_score_mean"] = mean_std(
                    [task.gold_score(bon_all.prompts[i], bon_all.texts[i]) for i in picks]
                )[0]
            curve.append(point)
        best, picks = f"best_of_{n_best}", best_picks(n_best)
        answers[best] = Answers(
            bon_prompts,
            [bon_all.texts[i] for i in picks],
            [bon_all.lengths[i] for i in picks],
            [bon_all.finished[i] for i in picks],
            [bon_all.rewards[i] for i in picks],
            None,
        )
        metrics[best] = answers[best].metrics(
            [bon_ids[i] for i in picks], is_embedded, kl_override=best_of_n_kl(n_best)
        )

    # 4b. Degeneration: a model whose answers loop or repeat themselves across prompts is flagged, with why.
    for name in metrics:
        if name != "sft":
            metrics[name]["degenerate"] = degeneration_reasons(metrics[name], metrics["sft"])
            if metrics[name]["degenerate"] and accelerator.is_main_process:
                say_line(accelerator, f"[eval] {name} looks degenerate: {'; '.join(metrics[name]['degenerate'])}")

    # 5. Failure and capability suites: every model answers each one.
    suites: dict[str, dict] = {}
    suite_rows: dict[str, list[dict]] = {}
    if cfg.eval.suites:
        suite_prompts = (
            {name: task.suite_prompts(name) for name in task.SUITES}
            if is_embedded
            else json.loads(SUITES_FILE.read_text())
        )
        chosen = [name.strip() for name in cfg.eval.suite_names.split(",") if name.strip()] or list(suite_prompts)
        if unknown := sorted(set(chosen) - set(suite_prompts)):
            raise UserError(
                f"eval.suite_names has unknown suite(s) {', '.join(unknown)}; choose from {', '.join(suite_prompts)}"
            )
        suite_prompts = {name: suite_prompts[name][: cfg.eval.suite_prompts] for name in chosen}
        if cfg.data.chat_template:  # HH-format suites, in the model's template as the data stage renders prompts
            suite_prompts = {
                name: [render_prompt(tokenizer, p) for p in suite_list] for name, suite_list in suite_prompts.items()
            }
        with accelerator.autocast():
            runs = [(suite, name) for suite in suite_prompts for name in models]
            for suite, name in progress(runs, "eval: suites", len(runs), accelerator):
                model, suite_list = models[name], suite_prompts[suite]
                suite_rows.setdefault(suite, [])
                suites.setdefault(suite, {})
                result, _ = answer(
                    engine, model, ref_model, reward_model, tokenizer, suite_list, cfg, accelerator, with_kl=False
                )
                rows = result.rows(is_embedded)
                suite_rows[suite] += [
                    {
                        "suite": suite,
                        "model": name,
                        **{
                            k: row[k]
                            for k in ("prompt", "response", "reward", *(("gold_score",) if is_embedded else ()))
                        },
                    }
                    for row in rows
                ]
                entry = {"n": len(rows), "reward_mean": mean_std(result.rewards)[0]}
                if suite in REFUSAL_SUITES:
                    refused = [is_refusal(text) for text in result.texts]
                    entry["refusal_rate"] = sum(refused) / len(refused)
                    for row, flag in zip(suite_rows[suite][-len(rows) :], refused):
                        row["refused"] = flag
                if is_embedded:
                    entry["gold_score_mean"] = mean_std([row["gold_score"] for row in rows])[0]
                    entry["gold_good_rate"] = sum(
                        task.is_good(p, t) for p, t in zip(result.prompts, result.texts)
                    ) / len(rows)
                suites[suite][name] = entry
        # The change in each refusal rate against SFT's on the same prompts, Holm-adjusted over the models.
        for suite in (name for name in REFUSAL_SUITES if name in suites):
            refused = {
                name: [row["refused"] for row in suite_rows[suite] if row["model"] == name] for name in suites[suite]
            }
            changes = {name: paired_rate_change(refused["sft"], refused[name]) for name in refused if name != "sft"}
            for name, p_holm in holm_adjust({name: change["p"] for name, change in changes.items()}).items():
                suites[suite][name]["refusal_change_vs_sft"] = {**changes[name], "p_holm": p_holm}

    # 5b. Public benchmarks (eval.benchmarks): every model answers IFEval and XSTest greedily, scored by the
    #     benchmarks' own rules; each model's change against SFT on the same prompts, Holm-adjusted over the models.
    benchmarks: dict[str, dict] = {}
    benchmark_records: dict[str, list[dict]] = {}
    for bench in requested_benchmarks(cfg):
        rows = load_benchmark(bench, getattr(cfg.eval, f"{bench}_path"))[: cfg.eval.benchmark_prompts]
        answered = {}
        with accelerator.autocast():
            for name, model in progress(models.items(), f"eval: {bench}", len(models), accelerator):
                answered[name] = answer_benchmark(
                    bench,
                    rows,
                    engine,
                    model,
                    tokenizer,
                    cfg.data.chat_template,
                    cfg.eval.benchmark_max_new_tokens,
                    cfg.eval.batch_size,
                    accelerator,
                )
        benchmarks[bench] = {name: result.summary() for name, result in answered.items()}
        changes = {name: paired_benchmark_change(answered["sft"], answered[name]) for name in answered if name != "sft"}
        for metric in HEADLINE_BENCHMARK_METRICS[bench]:
            for name, p_holm in holm_adjust({name: change[metric]["p"] for name, change in changes.items()}).items():
                changes[name][metric]["p_holm"] = p_holm
        for name, change in changes.items():
            benchmarks[bench][name]["change_vs_sft"] = change
        benchmark_records[bench] = [record for name, result in answered.items() for record in result.records(name)]
        say_line(accelerator, f"[eval] {bench}: " + benchmark_line(bench, benchmarks[bench]))

    # 6. From here on the main process alone writes, judges and publishes.
    if not accelerator.is_main_process:
        return
    for name, result in answers.items():
        write_jsonl(out_dir / "responses" / f"{name}.jsonl", result.rows(is_embedded))
    for suite, rows in suite_rows.items():
        (out_dir / "suites").mkdir(exist_ok=True)
        write_jsonl(out_dir / "suites" / f"{suite}.jsonl", rows)
    for bench, records in benchmark_records.items():
        (out_dir / "benchmarks").mkdir(exist_ok=True)
        write_jsonl(out_dir / "benchmarks" / f"{bench}.jsonl", records)

    # 7. Pairwise judges, by eval.baseline: each policy vs SFT, each pair of policies and each model vs the
    #    dataset's chosen response; or each model vs the reference response.
    known = {(p, t): r for a in answers.values() for p, t, r in zip(a.prompts, a.texts, a.rewards)}
    scorer = text_scorer(reward_model, tokenizer, device, cfg.eval.batch_size, known, accelerator.autocast)
    independent_scorer = None
    if judge_model is not None:  # every model's mean score under the independent judge, beside the reward model's
        independent_scorer = text_scorer(
            judge_model, tokenizer, device, cfg.eval.batch_size, autocast=accelerator.autocast
        )
        for name, result in progress(answers.items(), "eval: independent judge", len(answers), accelerator):
            independent = independent_scorer(result.prompts, result.texts)
            metrics[name]["independent_reward_mean"] = mean_std(independent)[0]
    judges, skipped = build_judges(cfg, run, is_embedded, scorer, independent_scorer)
    pairings = win_rate_pairings(list(answers), cfg.eval.baseline, reference)
    answers[reference] = Answers(
        prompts,
        [chosen_by_prompt[p] for p in prompts],
        [len(ids) for ids in encode_texts(tokenizer, [chosen_by_prompt[p] for p in prompts])],
        [True] * len(prompts),
        [],
        None,
    )
    win_rates: dict[str, dict] = {}
    records: dict[str, dict] = {}
    outcomes: dict[str, dict[str, list[str]]] = {}
    prompt_limits = {"openai": cfg.eval.openai_max_prompts}  # an LLM judge's calls cost: its prompts are capped
    failed: dict[str, dict] = {}  # judges that stopped (an LLM server that never answers): no verdicts to report
    for judge_name, judge in judges.items():
        win_rates[judge_name], records[judge_name], outcomes[judge_name] = {}, {}, {}
        for a, b in pairings:
            common = [p for p in answers[a].prompts if p in answers[b].by_prompt][: prompt_limits.get(judge_name)]
            texts_a = [answers[a].by_prompt[p] for p in common]
            texts_b = [answers[b].by_prompt[p] for p in common]
            comparison = judge.compare(common, texts_a, texts_b)
            if getattr(judge, "stopped", None) is not None:
                failed[judge_name] = judge_failure(
                    judge.stopped, [r["info"] for r in records[judge_name].values()] + [comparison.info]
                )
                break
            for problem in comparison.problems():
                print(f"[eval] {judge_name} {a} vs {b}: {problem}")
            lengths_a = [len(ids) for ids in encode_texts(tokenizer, texts_a)]
            lengths_b = [len(ids) for ids in encode_texts(tokenizer, texts_b)]
            lc = length_controlled_win_rate(comparison.outcomes, lengths_a, lengths_b)
            key = f"{a}_vs_{b}"
            win_rates[judge_name][key] = {
                **comparison.summary(),
                "lc_win_rate": lc["lc_win_rate"],
                "lc_ci95_low": lc["lc_ci95_low"],
                "lc_ci95_high": lc["lc_ci95_high"],
            }
            records[judge_name][key] = comparison.to_dict()
            outcomes[judge_name][key] = comparison.outcomes
        if judge_name in failed:
            print(f"[eval] judge {judge_name} {failed[judge_name]['status']}; left out of the win rates")
            for table in (win_rates, records, outcomes):
                del table[judge_name]
            continue
        # "<method> beats SFT" is claimed once per method: Holm-adjust that family's sign tests, per judge.
        vs_sft = {k: v["sign_test_p"] for k, v in win_rates[judge_name].items() if k.endswith("_vs_sft")}
        for key, p_holm in holm_adjust(vs_sft).items():
            win_rates[judge_name][key]["sign_test_p_holm"] = p_holm
    judge_agreement = judge_agreements(outcomes, gold_differences(answers, pairings) if "gold" in outcomes else None)
    judges_info = {name: combine_batch_info([r["info"] for r in records[name].values()]) for name in records}
    judges_info |= failed | {name: {"status": why} for name, why in skipped.items()}
    for name, why in skipped.items():
        print(f"[eval] judge {name} {why}")

    # 8. Publish.
    memory_mb, memory_source = peak_memory_mb(device)
    write_json_atomic(out_dir / "win_rates.json", records)
    decoding = {
        "temperature": cfg.eval.temperature,
        "top_p": cfg.eval.top_p,
        "max_new_tokens": cfg.eval.max_new_tokens,
        "seed": cfg.eval.seed,
        "num_prompts": len(prompts),
    }
    run.update_summary(
        {
            "eval": {
                "models": metrics,
                "best_of_n": {"n": n_best, "n_prompts": len(bon_prompts), "curve": curve},
                "win_rates": win_rates,
                "judge_agreement": judge_agreement,
                "judges": judges_info,
                "suites": suites,
                "benchmarks": benchmarks,
                "benchmark_decoding": {"temperature": 0.0, "max_new_tokens": cfg.eval.benchmark_max_new_tokens},
                "decoding": decoding,
                "prompt_split": prompt_split,
                "peak_memory_mb": memory_mb,
                "peak_memory_source": memory_source,
            },
            "timing_s": {"eval": round(time.perf_counter() - t_start, 2)},
        }
    )
    # which completion of each policy stage these numbers are of: the report warns when a stage has since changed
    evaluated = {stage: run.completed_fingerprint(stage) for stage in policies}
    run.mark_complete("eval", cfg, {"models": list(metrics), "policy_fingerprints": evaluated})
    if "gold" in win_rates:
        print(
            "[eval] gold win rate vs SFT: "
            + ", ".join(
                f"{k.split('_vs_')[0]} {v['win_rate']:.3f}"
                for k, v in win_rates["gold"].items()
                if k.endswith("_vs_sft")
            )
        )


if __name__ == "__main__":
    run_stage(main)
