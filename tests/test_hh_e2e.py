"""The gpt2-hh preset end to end, offline, as a new user with real data and no gold judge runs it: every stage
through `python -m rlhf.pipeline` (what run_all.sh runs) on a local folder of HH-format rows that are not the
embedded task's, with a random-init 1-layer GPT-2 and a tokenizer trained on the data, a few steps per stage,
and the LLM judge asked for (the preset's eval.judges) but without OPENAI_API_KEY.

Checks what a real-data run used to get wrong: throughput against a hand count of tokens, a report without
gold wording or empty judge sections whose headline says which judges ran, and counts that name their prompts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, read_summary

from bench.hh_rows import write_hh_folder

pytestmark = pytest.mark.slow

EVAL_PROMPTS, BEST_OF_N_PROMPTS, BEST_OF_N = 30, 10, 4
OVERRIDES = [
    "run.mixed_precision=no",
    "run.log_every=1",
    "model.init=random",
    "model.name_or_path=null",
    "model.model_type=gpt2",
    "model.config_overrides={n_layer: 1, n_embd: 32, n_head: 2, n_positions: 1024}",
    "tokenizer.train_from_data=true",
    "tokenizer.vocab_size=512",
    *(
        f"{stage}.{key}"
        for stage in ("sft", "reward")
        for key in ("max_steps=3", "batch_size=8", "micro_batch_size=8", "eval_batch_size=32")
    ),
    # DPO: one whole epoch in batches of one micro-batch, so its token count is known by hand
    "dpo.batch_size=16",
    "dpo.micro_batch_size=16",
    "dpo.eval_batch_size=32",
    "dpo.eval_prompts=4",
    *(
        f"{rl}.{key}"
        for rl in ("ppo", "grpo", "online_dpo")
        for key in (
            "total_episodes=16",
            "batch_size=8",
            "micro_batch_size=4",
            "forward_batch_size=8",
            "eval_prompts=4",
            "max_new_tokens=16",
            "cpu_threads=1",
        )
    ),
    "ppo.epochs=1",
    "grpo.group_size=4",
    "raft.rounds=1",
    "raft.prompts_per_round=4",
    "raft.samples_per_prompt=2",
    "raft.batch_size=4",
    "raft.micro_batch_size=4",
    "raft.eval_batch_size=8",
    "raft.eval_prompts=4",
    "raft.max_new_tokens=16",
    "raft.cpu_threads=1",
    f"eval.num_prompts={EVAL_PROMPTS}",
    f"eval.best_of_n={BEST_OF_N}",
    f"eval.best_of_n_prompts={BEST_OF_N_PROMPTS}",
    "eval.batch_size=32",
    "eval.max_new_tokens=16",
    "eval.suite_prompts=2",
]
RL_STAGES = {"ppo": 8, "grpo": 8, "online_dpo": 8, "raft": 4 * 2}  # responses sampled per iteration (round)


@pytest.fixture(scope="module")
def hh_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("hh")
    data = write_hh_folder(root / "harmless-base", n_train=300, n_test=40)
    run = root / "run"
    env = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"} | {"OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "gpt2-hh", "--output-dir", str(run)]
    started = time.perf_counter()
    result = subprocess.run(
        [*command, f"data.path={data}", *OVERRIDES], capture_output=True, text=True, cwd=REPO, env=env, timeout=1200
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    print(f"gpt2-hh pipeline: {time.perf_counter() - started:.0f}s")
    return run, result.stdout


def metric_rows(run: Path, stage: str) -> list[dict]:
    return [json.loads(line) for line in (run / stage / "metrics.jsonl").read_text().splitlines()]


def test_every_stage_ran_on_the_local_hh_rows(hh_run):
    run, stdout = hh_run
    summary = read_summary(run)
    assert summary["data"]["source"].endswith("harmless-base") and "embedded" not in summary["data"]
    assert summary["data"]["n_pairs"]["test"] == 40
    for stage in ("data", "sft", "reward", "ppo", "grpo", "raft", "dpo", "online_dpo", "eval", "report"):
        assert (run / stage / "complete.json").is_file(), stage
    assert not (run / "collect").exists()  # no stage reads collected pairs
    assert "[dpo] reference log-probs: train, val, test computed, cached in " in stdout
    assert summary["timing_s"]["pipeline_total"] > sum(
        seconds for stage, seconds in summary["timing_s"].items() if stage != "pipeline_total"
    )
    for section in ("sft", "reward_model", "dpo", "ppo", "eval"):  # one name for one thing, in every section
        assert summary[section]["peak_memory_source"] == "cpu_max_rss" and summary[section]["peak_memory_mb"] > 0
    assert not any("peak_memory_kind" in section for section in summary.values() if isinstance(section, dict))


def test_dpo_tokens_per_s_counts_the_tokens_a_hand_count_gives(hh_run):
    """DPO's row is [prompt][chosen + EOS][rejected + EOS]: each pair's tokens, the prompt once. A whole epoch
    in batches of 16 leaves out fewer than 16 pairs, so the count lies between the smallest and the largest
    sums of that many pairs' tokens (it was about T times too large: the (B, 1, T, T) mask summed)."""
    from transformers import AutoTokenizer

    run, _ = hh_run
    tokenizer = AutoTokenizer.from_pretrained(str(run / "sft" / "model"))
    rows = [json.loads(line) for line in (run / "data" / "train.jsonl").read_text().splitlines()]

    def n_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    per_pair = sorted(n_tokens(r["prompt"]) + n_tokens(r["chosen"]) + 1 + n_tokens(r["rejected"]) + 1 for r in rows)
    dpo = read_summary(run)["dpo"]
    trained = dpo["steps"] * 16
    assert dpo["steps"] == len(rows) // 16
    assert sum(per_pair[:trained]) <= dpo["timed_tokens"] <= sum(per_pair[-trained:])
    # tokens_per_s is that count over the training time: the last training row's rate times its clock
    last = [row for row in metric_rows(run, "dpo") if "dpo/train/tokens_per_s" in row][-1]
    assert last["dpo/train/tokens_per_s"] == dpo["tokens_per_s"]
    assert 0.5 < dpo["tokens_per_s"] * last["time_s"] / dpo["timed_tokens"] < 2


def test_rl_tokens_per_s_counts_response_tokens_only(hh_run):
    """PPO, GRPO, RAFT and online DPO: generated response tokens (EOS included) per second of generation, so
    rate x generation time / responses is the mean response length, at most max_new_tokens."""
    run, _ = hh_run
    for stage, responses in RL_STAGES.items():
        rows = [row for row in metric_rows(run, stage) if f"{stage}/time/tokens_per_s" in row]
        assert rows, stage
        for row in rows:
            tokens = row[f"{stage}/time/tokens_per_s"] * row[f"{stage}/time/generate_s"]
            mean_length = row[f"{stage}/responses/length_mean"]
            assert tokens == pytest.approx(mean_length * responses, rel=1e-4), stage
            assert 1 <= mean_length <= 16, stage


def test_the_report_says_which_judges_ran_and_never_speaks_of_gold(hh_run):
    run, _ = hh_run
    text = (run / "report.md").read_text()
    evaluation = read_summary(run)["eval"]
    assert set(evaluation["win_rates"]) == {"reward"} and evaluation["judge_agreement"] == {}
    assert evaluation["judges"]["openai"] == {"status": "skipped: OPENAI_API_KEY is not set"}
    headline = text.split("## Headline")[1].split("\n## ")[0]
    assert "**Judges: the reward model alone.**" in headline
    assert "the proxy that PPO, GRPO, RAFT and online DPO optimised and best-of-4 picked by" in headline
    assert "No independent judge ran (`openai` skipped: OPENAI_API_KEY is not set)." in headline
    assert f"`bash run_all.sh --preset gpt2-hh --output-dir {run} --only eval,report --force`" in headline
    assert "gold" not in text.replace(str(run), "").lower()
    assert "#### Judge: `reward`" in text and "#### Judge: `openai`" not in text and "### Judge agreement" not in text
    assert (
        "Judges asked for that did not run or gave no verdicts: `openai` (skipped: OPENAI_API_KEY is not set)" in text
    )
    assert "pipeline_total" not in text


def test_the_report_counts_name_their_prompts(hh_run):
    run, _ = hh_run
    text = (run / "report.md").read_text()
    models = read_summary(run)["eval"]["models"]
    assert models["best_of_4"]["n"] == BEST_OF_N_PROMPTS and models["sft"]["n"] == EVAL_PROMPTS
    assert (
        f"of the {BEST_OF_N_PROMPTS} evaluation prompts that every model answered (best-of-4 answered only these of "
        f"the {EVAL_PROMPTS})" in text
    )
    assert "Highest mean reward-model score: best-of-4" not in text  # its 10-prompt mean is not ranked with 30s
    line = next(line for line in text.splitlines() if line.startswith("- On the 10 prompts best-of-4 answered"))
    assert line.startswith("- On the 10 prompts best-of-4 answered, mean reward-model score, highest first: ")
    assert "SFT" in line and "PPO" in line and "online DPO" in line
