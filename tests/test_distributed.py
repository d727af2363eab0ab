"""Multi-process correctness of the PPO, GRPO, RAFT, DPO, online DPO and eval stages: `torch.distributed.run`
with 2 gloo processes on CPU against 1 process accumulating the same global batch in 2 micro-batches (as the
SFT and reward tests in test_part1_e2e.py), through the real command line.

What makes the two runs comparable: the offline DPO loss sees the same pairs either way. The RL
stages sample, and each process has its own seed; but row i of a global rollout batch samples
from its own seed (`rlhf.rollout.generate.sampling_seeds`), not from the process's RNG, so both runs draw
the same responses and every metric can be compared, not only a loss on fixed rollouts. What is
then left to differ is what this file tests: statistics over the whole batch (advantage
whitening, token counts for the loss, explained variance, correlations), RAFT's fine-tuning batches
(every process gathers the kept responses of all and takes its slice of each global batch), gradient
averaging, and the sharded-then-gathered held-out evaluation. Left padding and batch shapes differ between the
runs, so sums are added in another order: the tolerance, REL, is 1e-4 relative (the runs agree
to about 1e-6; a missing all-reduce changes a metric by 1e-2 or more).

Files: everything a stage writes comes from rank 0 alone: metrics.jsonl and samples.jsonl have as
many rows as in the 1-process run (an append from each rank would double them), and every
TensorBoard event file comes from one process.

The eval stage trains nothing: both runs sample every prompt from its own seed on whichever
process it is sharded to, so they write the same responses, and the judges run once, on rank 0.
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

from rlhf.judges import BASE_URL_ENV
from rlhf.models.checkpoint import save_pretrained_atomic
from rlhf.models.modeling import load_policy, load_tokenizer
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir

pytestmark = pytest.mark.slow

REL = 1e-4
LAUNCHERS = ("single", "ddp")
SCRIPTS = {
    "ppo": "part2_ppo_grpo/train_ppo.py",
    "grpo": "part2_ppo_grpo/train_grpo.py",
    "raft": "part2_ppo_grpo/train_raft.py",
    "dpo": "part3_dpo/train_dpo.py",
    "online_dpo": "part3_dpo/train_online_dpo.py",
    "eval": "part4_eval/evaluate.py",
}
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
        "grpo.batch_size=16",  # 2 groups per process, each packed micro-batch one whole group
        "grpo.group_size=4",
        "grpo.micro_batch_size=4",
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
    "dpo": [
        "dpo.max_steps=4",
        "dpo.batch_size=8",
        "dpo.micro_batch_size=4",
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
    script = [str(REPO / SCRIPTS[stage]), "--preset", "tiny", "--output-dir", str(out)]
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


@pytest.mark.parametrize("stage", ["ppo", "grpo", "raft", "dpo", "online_dpo"])
def test_two_processes_match_one_process(tiny_run, tmp_path, stage):
    for launcher in LAUNCHERS:
        run_stage(launcher, stage, tiny_run, tmp_path / launcher)
    assert_runs_match(tmp_path, stage)


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
    if stage != "dpo":  # the RL stages draw the same samples, so their held-out comparisons agree too
        for name in ("samples.jsonl", "eval_samples.jsonl"):
            rows = [(runs / run / stage / name).read_text().splitlines() for run in pair]
            assert len(rows[0]) == len(rows[1]) > 0
            responses = [[json.loads(line)["response"] for line in run_rows] for run_rows in rows]
            assert responses[0] == responses[1]
    events = [sorted((runs / run / "tensorboard").rglob("events.*")) for run in pair]
    assert len(events[0]) == len(events[1]) > 0
    assert len({path.name.split(".")[-2] for path in events[1]}) == 1  # events.out.tfevents.<t>.<host>.<pid>.<n>
    results = [json.loads((runs / run / "summary.json").read_text())[stage] for run in pair]
    numbers = [{k: v for k, v in comparable(r).items() if isinstance(v, float)} for r in results]
    assert numbers[0] == pytest.approx(numbers[1], rel=REL, abs=1e-6)


def add_policy(run_dir: Path, stage: str) -> None:
    """A policy other than SFT, without training one: the SFT weights plus fixed noise, published as `stage`."""
    policy = load_policy(run_dir / "sft" / "model")
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    save_pretrained_atomic(policy, load_tokenizer(run_dir / "sft" / "model"), run_dir / stage / "model")
    RunDir(run_dir).mark_complete(stage, load_config(preset_path("tiny"), TINY_TEST_OVERRIDES), {})


def flat(tree, path: str = "") -> dict:
    """Nested dicts and lists as {"a/b/0": leaf}."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in flat(value, f"{path}/{key}").items()}
    if isinstance(tree, list):
        return {k: v for i, value in enumerate(tree) for k, v in flat(value, f"{path}/{i}").items()}
    return {path: tree}


def same_rows(paths: list[Path]) -> None:
    """Two JSONL files with the same rows: text, lengths and gold scores exactly, reward-model scores and KLs to REL."""
    single, ddp = ([json.loads(line) for line in path.read_text().splitlines()] for path in paths)
    assert len(single) == len(ddp) > 0, paths[1]
    for one, two in zip(single, ddp):
        scored = [key for key in ("reward", "kl") if isinstance(one.get(key), float)]
        assert {k: v for k, v in one.items() if k not in scored} == {k: v for k, v in two.items() if k not in scored}
        assert {k: one[k] for k in scored} == pytest.approx({k: two[k] for k in scored}, rel=REL, abs=1e-6)


def same_tree(trees: list) -> None:
    """Two JSON trees with the same leaves: floats to REL (they carry reward-model scores), everything else exactly."""
    single, ddp = (comparable(flat(tree)) for tree in trees)
    assert single.keys() == ddp.keys()
    floats = [k for k, v in single.items() if isinstance(v, float)]
    assert {k: single[k] for k in floats} == pytest.approx({k: ddp[k] for k in floats}, rel=REL, abs=1e-6)
    assert {k: v for k, v in single.items() if k not in floats} == {k: v for k, v in ddp.items() if k not in floats}


def test_eval_on_two_processes_matches_one_process(tiny_run, tmp_path, server, monkeypatch):
    monkeypatch.setenv(BASE_URL_ENV, server.url)  # the LLM judge: the fake one on 127.0.0.1 (tests/fake_openai.py)
    inputs = tmp_path / "inputs"
    for folder in ("data", "sft", "reward"):
        shutil.copytree(tiny_run / folder, inputs / folder)
    shutil.copy(tiny_run / "summary.json", inputs / "summary.json")
    add_policy(inputs, "dpo")
    stdout, requests = {}, []
    for launcher in LAUNCHERS:
        stdout[launcher] = run_stage(launcher, "eval", inputs, tmp_path / launcher, ("data", "sft", "reward", "dpo"))
        requests.append(len(server.requests))
    evals = [tmp_path / run / "eval" for run in LAUNCHERS]

    # Rank 0 alone judges, prints and writes: as many LLM-judge requests and lines as one process.
    assert requests[0] > 0 and requests[1] == 2 * requests[0]
    assert stdout["ddp"].count("[eval] dpo: reward") == 1
    files = [sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) for folder in evals]
    assert files[0] == files[1]
    assert {"responses/sft.jsonl", "responses/dpo.jsonl", "responses/best_of_4.jsonl", "suites/ood.jsonl"} <= set(
        files[0]
    )

    # The same samples, whichever process drew them.
    for name in files[0]:
        if name.endswith(".jsonl") and name != "openai_cache.jsonl":
            same_rows([folder / name for folder in evals])
    summaries = [json.loads((tmp_path / run / "summary.json").read_text())["eval"] for run in LAUNCHERS]
    assert summaries[0]["models"]["dpo"]["kl_to_ref"] > 0
    assert summaries[0]["win_rates"]["gold"] and summaries[0]["win_rates"]["gold"] == summaries[1]["win_rates"]["gold"]
    same_tree(summaries)
    same_tree([json.loads((folder / "win_rates.json").read_text()) for folder in evals])
