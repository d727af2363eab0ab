"""Multi-process correctness of every stage, through the documented command (docs/scaling.md): the whole tiny
pipeline from the data stage on 2 gloo processes under `accelerate launch --config_file configs/accelerate/ddp.yaml`
(as written, accelerate not on PATH), against 1 process accumulating the same global batches in 2 micro-batches.
One pair of pipeline runs serves every comparison below (it replaced a pair of runs per stage and a separate
pipeline test, which proved the same equalities at twice the cost); 2 processes under `torch.distributed.run` are
tested in tests/test_bf16_lora_ddp_e2e.py, under FSDP in tests/test_fsdp.py.

What makes the two runs comparable: the offline losses see the same examples either way. The RL
stages sample, and each process has its own seed; but row i of a global rollout batch samples
from its own seed (`rlhf.rollout.generate.sampling_seeds`), not from the process's RNG, so both runs draw
the same responses and every metric can be compared, not only a loss on fixed rollouts. What is
then left to differ is what this file tests: statistics over the whole batch (advantage
whitening, token counts for the loss, explained variance, correlations), RAFT's fine-tuning batches
(every process gathers the kept responses of all and takes its slice of each global batch), gradient
averaging, the reward stage's distillation targets (computed sharded), and the sharded-then-gathered held-out
evaluation. Left padding and batch shapes differ between the runs, so sums are added in another order: the
tolerance, REL, is 1e-4 relative (the runs agree to about 1e-6; a missing all-reduce changes a metric by 1e-2 or
more).

Files: everything a stage writes comes from rank 0 alone: metrics.jsonl and samples.jsonl have as
many rows as in the 1-process run (an append from each rank would double them), and every
TensorBoard event file comes from one process.

The eval stage trains nothing: both runs sample every prompt from its own seed on whichever
process it is sharded to, so they write the same responses, and the judges (the LLM judge among them, the fake
server of tests/fake_openai.py) run once, on rank 0.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY_TEST_OVERRIDES
from fake_openai import KEY, FakeOpenAI
from safetensors.torch import load_file

from rlhf.judges import API_KEY_ENV, BASE_URL_ENV
from rlhf.stage.run import STAGE_SCRIPTS

pytestmark = pytest.mark.slow

REL = 1e-4
KL_ABS = 1e-5  # a response's KL, compared absolutely (same_rows)
LAUNCHERS = ("single", "ddp")
# Global batch 8, micro-batch 4: one process accumulates 2 micro-batches per minibatch, each of 2 processes 1.
OVERRIDES = {
    "ppo": [
        "ppo.total_episodes=24",
        "ppo.batch_size=8",
        "ppo.micro_batch_size=4",
        "ppo.forward_batch_size=8",
        "ppo.epochs=2",
        "ppo.max_new_tokens=16",
        "ppo.eval_prompts=8",
        "ppo.eval_every=2",
        "ppo.samples_every=1",
        "ppo.save_every=0",
        "ppo.cpu_threads=1",
        "ppo.whiten_rewards=true",
    ],
    "grpo": [
        "grpo.total_episodes=48",
        "grpo.batch_size=16",  # 2 groups per process
        "grpo.group_size=4",
        "grpo.micro_batch_size=4",
        # micro-batches by a token budget: packed groups of ~50-130 positions, one or two a micro-batch, as many on
        # each process (FSDP gathers the weights in every forward pass), weighed by their loss units
        "grpo.micro_batch_tokens=160",
        "grpo.forward_batch_size=8",
        "grpo.epochs=2",
        "grpo.loss_normalization=token",
        "grpo.max_new_tokens=16",
        "grpo.eval_prompts=8",
        "grpo.eval_every=2",
        "grpo.samples_every=1",
        "grpo.save_every=0",
        "grpo.cpu_threads=1",
    ],
    "raft": [  # 8 prompts x 4 samples, top 2: 16 kept responses per round, 2 optimizer steps of 8
        "raft.rounds=2",
        "raft.prompts_per_round=8",
        "raft.top_k=2",
        "raft.batch_size=8",
        "raft.micro_batch_size=4",
        "raft.eval_batch_size=8",
        "raft.max_new_tokens=16",
        "raft.eval_prompts=8",
        "raft.eval_every=1",
        "raft.samples_every=1",
        "raft.save_every=0",
        "raft.cpu_threads=1",
    ],
    "dpo": [  # micro-batches by a token budget (rows of 28-130 tokens): one process cuts its 8 rows otherwise than
        # each of 2 cuts its 4, weighed by their pairs, and FSDP's processes take as many each: the same gradient
        "dpo.max_steps=4",
        "dpo.max_train_pairs=32",  # the 32 that 4 steps of 8 train on: the reference scores no others
        "dpo.batch_size=8",
        "dpo.micro_batch_size=4",
        "dpo.micro_batch_tokens=160",
        "dpo.eval_batch_size=16",
        "dpo.eval_prompts=8",
        "dpo.save_every=0",
        "run.log_every=1",
    ],
    "online_dpo": [  # 8 prompts x K = 2 per iteration; the processes keep different numbers of pairs
        "online_dpo.total_episodes=48",
        "online_dpo.batch_size=16",
        "online_dpo.micro_batch_size=3",  # pairs: one process 3 + 3 + 2 of 8, each of 2 processes 2 + 2 of 4
        "online_dpo.forward_batch_size=8",
        "online_dpo.max_new_tokens=16",
        "online_dpo.eval_prompts=8",
        "online_dpo.eval_every=2",
        "online_dpo.samples_every=1",
        "online_dpo.num_samples=2",
        "online_dpo.save_every=0",
        "online_dpo.cpu_threads=1",
    ],
    "eval": [
        "eval.num_prompts=12",
        "eval.batch_size=4",  # several batches on each process
        "eval.best_of_n=4",
        "eval.best_of_n_prompts=3",
        "eval.max_new_tokens=16",
        "eval.suite_prompts=4",  # each suite sharded 2 + 2 (each suite prompt parsed and gold-judged: test_task.py)
        "eval.judges=gold,reward,openai",
        "eval.openai_max_prompts=3",
        "judge.model=judge-test",
    ],
}


def run_stage(
    launcher: str,
    stage: str,
    tiny_run: Path,
    out: Path,
    inputs: tuple[str, ...] = ("data", "sft", "reward"),
    extra: tuple[str, ...] = (),
    master_port: int = 29519,
) -> str:
    """Run `stage` on a copy of the `inputs` stages of `tiny_run`, in one process (`single`) or two on `master_port`
    (`ddp`: torch.distributed.run; `fsdp`: accelerate launch with configs/accelerate/fsdp.yaml), with
    OVERRIDES[stage] and then `extra`; its stdout."""
    for folder in inputs:
        shutil.copytree(tiny_run / folder, out / folder)
    shutil.copy(tiny_run / "summary.json", out / "summary.json")
    launch = {
        "single": [],
        "ddp": ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(master_port)],
        "fsdp": [
            *("-m", "accelerate.commands.launch", "--config_file", str(REPO / "configs" / "accelerate" / "fsdp.yaml")),
            *("--num_processes", "2", "--main_process_port", str(master_port)),
        ],
    }
    script = [str(REPO / STAGE_SCRIPTS[stage]), "--preset", "tiny", "--output-dir", str(out)]
    result = subprocess.run(
        [sys.executable, *launch[launcher], *script, *TINY_TEST_OVERRIDES, *OVERRIDES[stage], *extra],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def comparable(row: dict) -> dict:
    """A metrics or results row without wall times, throughput and memory, which no two runs share, and
    without the reward model's head-to-head: where policy and SFT give the same response it is a tie
    only if both scores are bitwise equal, and batch padding moves their last bits (measured: 0.625 vs
    0.6875 on 8 prompts, scores 3e-7 apart). The gold head-to-head, on the text, is compared. For the same
    reason without DPO's `rewards/accuracies`, the share of pairs whose implicit-reward margin is > 0: while the
    policy is still its reference (online DPO's first step), every margin is 0 up to those last bits (measured:
    0.5 vs 0.5625 on 16 pairs); the margins themselves are compared."""
    skip = ("time", "tokens_per_s", "memory", "reward_win_rate", "rewards/accuracies")
    return {k: v for k, v in row.items() if not any(word in k for word in skip)}


def metric_rows(out: Path, stage: str) -> list[dict]:
    return [comparable(json.loads(line)) for line in (out / stage / "metrics.jsonl").read_text().splitlines()]


def assert_runs_match(runs: Path, stage: str, unmatched: tuple[str, ...] = (), several: str = "ddp") -> None:
    """`stage`'s runs in runs/single and runs/<several> wrote the same metrics (but those named in `unmatched`),
    samples and summary (to REL), and each wrote its TensorBoard events from one process."""
    pair = ("single", several)
    single, ddp = (
        [{k: v for k, v in row.items() if k not in unmatched} for row in metric_rows(runs / run, stage)] for run in pair
    )
    assert len(single) == len(ddp) > 2
    for one, two in zip(single, ddp):
        assert one.keys() == two.keys()
        assert one == pytest.approx(two, rel=REL, abs=1e-6), f"{stage} step {one.get('step')}"
    if stage in ("ppo", "grpo", "raft", "online_dpo"):  # they draw the same samples: held-out comparisons agree too
        for name in ("samples.jsonl", "eval_samples.jsonl"):
            rows = [(runs / run / stage / name).read_text().splitlines() for run in pair]
            assert len(rows[0]) == len(rows[1]) > 0
            responses = [[json.loads(line)["response"] for line in run_rows] for run_rows in rows]
            assert responses[0] == responses[1]
    events = [sorted((runs / run / "tensorboard" / stage).rglob("events.*")) for run in pair]
    assert len(events[0]) == len(events[1]) > 0
    assert len({path.name.split(".")[-2] for path in events[1]}) == 1  # events.out.tfevents.<t>.<host>.<pid>.<n>
    results = [json.loads((runs / run / "summary.json").read_text())[SUMMARY_KEYS.get(stage, stage)] for run in pair]
    # SFT's gold check samples from run.seed on each process, not from a seed per row: its gold_ numbers differ
    numbers = [
        {k: v for k, v in comparable(r).items() if isinstance(v, float) and not (stage == "sft" and "gold" in k)}
        for r in results
    ]
    assert numbers[0] == pytest.approx(numbers[1], rel=REL, abs=1e-6)


SUMMARY_KEYS = {"reward": "reward_model"}  # summary.json's section of each stage, where it is not the stage's name


def assert_same_weights(a: dict, b: dict) -> None:
    """The same tensors, each to REL of its largest entry."""
    assert a.keys() == b.keys()
    for name in a:
        scale = float(a[name].abs().max()) or 1.0
        assert float((a[name] - b[name]).abs().max()) <= REL * scale, name


def flat(tree, path: str = "") -> dict:
    """Nested dicts and lists as {"a/b/0": leaf}."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in flat(value, f"{path}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, value in enumerate(tree) for k, v in flat(value, f"{path}/{i}").items()}
    return {path: tree}


def same_rows(paths: list[Path]) -> None:
    """Two JSONL files with the same rows: text, lengths and gold scores exactly, reward-model scores to REL, and
    KLs to KL_ABS: a response's KL is the difference of two sums of its tokens' log-probs (each of magnitude ~5,
    rounded at float32 in another order), so its rounding is set by the log-probs, not by the KL (measured: a KL of
    -0.02988 differed by 3.3e-6 between the runs)."""
    single, ddp = ([json.loads(line) for line in path.read_text().splitlines()] for path in paths)
    assert len(single) == len(ddp) > 0, paths[1]
    for one, two in zip(single, ddp):
        scored = [key for key in ("reward", "kl") if isinstance(one.get(key), float)]
        assert {k: v for k, v in one.items() if k not in scored} == {k: v for k, v in two.items() if k not in scored}
        if "reward" in scored:
            assert one["reward"] == pytest.approx(two["reward"], rel=REL, abs=1e-6)
        if "kl" in scored:
            assert one["kl"] == pytest.approx(two["kl"], abs=KL_ABS)


def same_tree(trees: list) -> None:
    """Two JSON trees with the same leaves: floats to REL (they carry reward-model scores), everything else exactly."""
    single, ddp = (comparable(flat(tree)) for tree in trees)
    assert single.keys() == ddp.keys()
    floats = [k for k, v in single.items() if isinstance(v, float)]
    assert {k: single[k] for k in floats} == pytest.approx({k: ddp[k] for k in floats}, rel=REL, abs=1e-6)
    assert {k: v for k, v in single.items() if k not in floats} == {k: v for k, v in ddp.items() if k not in floats}


# The pipeline's budgets: the data stage at 1,200 pairs; SFT and the reward model 6 steps of 16 (micro-batches of 8,
# the reward model with its distillation targets); every later stage as OVERRIDES has it.
PIPELINE_OVERRIDES = [
    "data.embedded.n_train_pairs=1200",
    "data.embedded.n_test_pairs=200",
    *(
        f"{stage}.{key}"
        for stage in ("sft", "reward")
        for key in ("max_steps=6", "batch_size=16", "micro_batch_size=8")
    ),
    "sft.save_every=0",
    "sft.gold_eval_prompts=2",
    "sft.num_samples=1",
    "reward.save_every=0",
    "reward.logprob_distill_coef=1.0",
    *(override for stage in OVERRIDES for override in OVERRIDES[stage]),
]
DOCUMENTED_LAUNCH = "accelerate launch --config_file configs/accelerate/ddp.yaml --num_processes 2"  # docs/scaling.md
# A port of its own (tests/test_fsdp.py has 29523): the two files may run at once on two workers.
FSDP_LAUNCH = "accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 2 --main_process_port 29529"
FSDP_STAGES = ("sft", "reward", "dpo", "grpo")  # the stages that shard what they train (docs/scaling.md)


def failure_report(result: subprocess.CompletedProcess) -> str:
    """The end of a failed launch's output, and every line of its stderr that names an error: a rank that aborts
    prints why (a C++ `terminate called ...`, a gloo error) well above the launcher's closing traceback, which alone
    fills the last few thousand characters."""
    errors = [
        line
        for line in result.stderr.splitlines()
        if any(word in line for word in ("Error", "error:", "terminate", "abort", "Abort", "what():", "Exception"))
    ]
    return "\n".join([result.stdout[-3000:], "--- error lines of stderr ---", *errors[-40:], result.stderr[-3000:]])


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    """The whole tiny pipeline in one process and under the documented 2-process launch, and FSDP_STAGES on the
    1-process run's data under the FSDP launch (the data stage asked for again, complete); per run, its output and
    the number of LLM-judge requests it made. The 1-process run is also the suite's one run of the whole pipeline
    through `python -m rlhf.pipeline` as run_all.sh runs it (the tests at the end of this file)."""
    root = tmp_path_factory.mktemp("pipelines")
    venv_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p != venv_bin)
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    base_env = {k: v for k, v in os.environ.items() if k not in proxies}
    server = FakeOpenAI()
    runs = {}
    try:
        for name, launch in (("single", ""), ("ddp", DOCUMENTED_LAUNCH), ("fsdp", FSDP_LAUNCH)):
            before = len(server.requests)
            command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "tiny", "--output-dir", str(root / name)]
            if name == "fsdp":  # the data stage is complete there: the pipeline skips it
                shutil.copytree(root / "single" / "data", root / name / "data")
                shutil.copy(root / "single" / "summary.json", root / name / "summary.json")
                command += ["--only", ",".join(("data", *FSDP_STAGES))]
            env = {**base_env, "OMP_NUM_THREADS": "1", "PATH": path, "RLHF_LAUNCH": launch}
            env.update({BASE_URL_ENV: server.url, API_KEY_ENV: KEY})
            result = subprocess.run(
                [*command, *PIPELINE_OVERRIDES], capture_output=True, text=True, cwd=REPO, timeout=1800, env=env
            )
            assert result.returncode == 0, failure_report(result)
            runs[name] = (result, len(server.requests) - before)
    finally:
        server.close()
    return root, runs


@pytest.mark.parametrize("stage", ["sft", "reward", "ppo", "grpo", "raft", "dpo", "online_dpo"])
def test_two_processes_match_one_process(pipelines, stage):
    root, _ = pipelines
    assert_runs_match(root, stage)


def test_the_documented_launch_writes_what_one_process_writes(pipelines):
    """One process prints, draws progress bars and writes files: the same files, TensorBoard runs, results, samples
    and weights as the 1-process pipeline."""
    root, runs = pipelines
    ddp = runs["ddp"][0]
    assert ddp.stdout.count("[report] wrote") == ddp.stdout.count("[data] pairs") == 1
    assert "Loading weights" not in ddp.stderr
    folders = [root / name for name in LAUNCHERS]
    files = [
        sorted(str(p.relative_to(f)) for p in f.rglob("*") if p.is_file() and "tensorboard" not in p.parts)
        for f in folders
    ]
    assert files[0] == files[1]
    events = [sorted(p.parent for p in (f / "tensorboard").rglob("events.*")) for f in folders]
    assert events[0] == [folders[0] / p.relative_to(folders[1]) for p in events[1]]

    summaries = [json.loads((f / "summary.json").read_text()) for f in folders]
    for summary in summaries:  # SFT's gold check samples from run.seed on each process, not from a seed per row;
        summary["sft"] = {k: v for k, v in summary["sft"].items() if not k.startswith("gold_")}
        del summary["dpo"]["timed_tokens"]  # and DPO counts rank 0's tokens x processes (rlhf/methods/dpo.py)
    same_tree([{k: v for k, v in s.items() if k != "timing_s"} for s in summaries])
    for name in files[0]:
        if name.endswith("model.safetensors"):
            weights = [load_file(f / name) for f in folders]
            assert weights[0].keys() == weights[1].keys()
            for key in weights[0]:
                torch.testing.assert_close(weights[1][key], weights[0][key], rtol=REL, atol=1e-6, msg=name)


def test_eval_on_two_processes_judges_once_and_writes_the_same_samples(pipelines):
    root, runs = pipelines
    requests = {name: count for name, (_, count) in runs.items()}
    # Rank 0 alone judges and prints: as many LLM-judge requests and lines as one process.
    assert requests["single"] > 0 and requests["ddp"] == requests["single"]
    assert runs["ddp"][0].stdout.count("[eval] dpo: reward") == 1
    evals = [root / run / "eval" for run in LAUNCHERS]
    files = [sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) for folder in evals]
    assert files[0] == files[1]
    assert {"responses/sft.jsonl", "responses/dpo.jsonl", "responses/best_of_4.jsonl", "suites/ood.jsonl"} <= set(
        files[0]
    )
    # The same samples, whichever process drew them.
    for name in files[0]:
        if name.endswith(".jsonl") and name != "openai_cache.jsonl":
            same_rows([folder / name for folder in evals])
    summaries = [json.loads((root / run / "summary.json").read_text())["eval"] for run in LAUNCHERS]
    assert summaries[0]["models"]["dpo"]["kl_to_ref"] > 0
    assert summaries[0]["win_rates"]["gold"] and summaries[0]["win_rates"]["gold"] == summaries[1]["win_rates"]["gold"]
    same_tree(summaries)
    same_tree([json.loads((folder / "win_rates.json").read_text()) for folder in evals])


@pytest.mark.parametrize("stage", FSDP_STAGES)
def test_fsdp_on_two_processes_matches_one_process(pipelines, stage):
    """FSDP2 on CPU (rlhf/models/sharding.py), launched as docs/scaling.md documents it: the same per-step metrics
    and published weights as one process. (A checkpoint of a sharded run resumes in one process: tests/test_fsdp.py.)"""
    root, runs = pipelines
    assert f"[{stage}]" in runs["fsdp"][0].stdout and "sharded over 2 processes" in runs["fsdp"][0].stdout
    rows = [metric_rows(root / name, stage) for name in ("single", "fsdp")]
    assert len(rows[0]) == len(rows[1]) > 2
    for one, two in zip(*rows):
        assert one.keys() == two.keys()
        assert one == pytest.approx(two, rel=REL, abs=1e-6), f"{stage} step {one.get('step')}"
    assert_same_weights(
        *(load_file(root / name / stage / "model" / "model.safetensors") for name in ("single", "fsdp"))
    )
    if stage == "reward":  # a parameter with its own optimizer settings keeps them when sharding replaces it
        results = [
            json.loads((root / name / "summary.json").read_text())["reward_model"] for name in ("single", "fsdp")
        ]
        assert results[0]["length_heuristic_weight"] != pytest.approx(0.1, abs=1e-3)
        assert results[1]["length_heuristic_weight"] == pytest.approx(results[0]["length_heuristic_weight"], rel=REL)


def test_the_pipeline_skips_a_completed_stage_without_starting_it(pipelines):
    """A stage complete for this config is skipped before its process starts (by hand: tests/test_pipeline.py)."""
    _, runs = pipelines
    fsdp = runs["fsdp"][0].stdout
    assert "[data] already complete for this config" in fsdp and "[data] pairs" not in fsdp
    assert "[sft] already complete" not in fsdp  # not copied: trained again under FSDP


def test_eval_measures_every_policy_the_same_way(pipelines):
    """The evaluation of the 1-process pipeline: every policy and best-of-n with the same metrics and decoding, every
    judge's win rates with intervals, the reward model's disagreements with gold by their cause, every suite."""
    root, _ = pipelines
    run = root / "single"
    evaluation = json.loads((run / "summary.json").read_text())["eval"]
    assert set(evaluation["models"]) == {"sft", "ppo", "grpo", "raft", "dpo", "online_dpo", "best_of_4"}
    for name, metrics in evaluation["models"].items():
        for key in (
            "reward_mean",
            "reward_std",
            "kl_to_ref",
            "length_mean",
            "eos_rate",
            "distinct_2",
            "gold_score_mean",
        ):
            assert isinstance(metrics[key], float), (name, key)
        assert metrics["n"] == (3 if name == "best_of_4" else 12)  # eval.best_of_n_prompts, eval.num_prompts
    assert evaluation["models"]["sft"]["kl_to_ref"] == 0.0
    assert evaluation["models"]["best_of_4"]["kl_to_ref"] == pytest.approx(1.3862944 - 0.75)  # log n - (n - 1) / n
    for model in ("ppo", "grpo", "raft", "dpo", "online_dpo", "best_of_4"):
        rates = evaluation["win_rates"]["gold"][f"{model}_vs_sft"]
        assert 0.0 <= rates["win_rate"] <= 1.0 and rates["ci95_low"] <= rates["win_rate"] <= rates["ci95_high"]
        assert "lc_win_rate" in rates
    assert "ppo_vs_dpo" in evaluation["win_rates"]["reward"] and "sft_vs_chosen" in evaluation["win_rates"]["gold"]
    assert "status" not in evaluation["judges"]["openai"] and evaluation["win_rates"]["openai"]  # it judged
    reward_vs_gold = evaluation["judge_agreement"]["reward_vs_gold"]
    by_difference = reward_vs_gold["by_gold_difference"]
    assert set(by_difference) <= {"capability", "content", "flags", "verbosity"}
    assert sum(entry["n_decisive"] for entry in by_difference.values()) == reward_vs_gold["n_decisive"]
    assert set(evaluation["suites"]) >= {"sycophancy", "ood", "harmful", "capability"}
    # Same decoding and seed for every model; each model's responses are on disk.
    assert evaluation["decoding"]["seed"] == 1234
    for name in evaluation["models"]:
        rows = [json.loads(line) for line in (run / "eval" / "responses" / f"{name}.jsonl").read_text().splitlines()]
        assert len(rows) == evaluation["models"][name]["n"] and "gold_score" in rows[0]


def test_report_is_written_with_its_figures(pipelines):
    root, _ = pipelines
    run = root / "single"
    text = (run / "report.md").read_text()
    for figure in ("reward_vs_kl", "win_rates", "training_curves", "reward_distributions", "response_lengths"):
        assert (run / "report" / f"{figure}.png").stat().st_size > 5000
        assert f"(report/{figure}.png)" in text
    summary = json.loads((run / "summary.json").read_text())
    assert f"{summary['eval']['win_rates']['gold']['ppo_vs_sft']['win_rate']:.3f}" in text
    assert "report" in summary["timing_s"] and "pipeline_total" in summary["timing_s"]
