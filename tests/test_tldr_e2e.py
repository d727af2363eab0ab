"""The TL;DR presets end to end, offline: every stage of pythia1b-tldr and llama1b-tldr for a few steps, on
small local files in the real formats, with random-init 2-layer models of the presets' architectures
(GPT-NeoX, Llama) and a tokenizer trained on the data."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import REPO, read_summary
from tldr_fixtures import (
    cnndm_comparison,
    post,
    preprocessed_comparison,
    raw_comparison,
    sft_rows,
    write_jsonl,
    write_parquet,
)

pytestmark = pytest.mark.slow

ARCHITECTURES = {
    # preset: (model_type, config_overrides, the pairs' format and file type)
    "pythia1b-tldr": (
        "gpt_neox",
        "{num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 4, intermediate_size: 128, "
        "max_position_embeddings: 1024}",
        "preprocessed",
    ),
    "llama1b-tldr": (
        "llama",
        "{num_hidden_layers: 2, hidden_size: 64, num_attention_heads: 4, num_key_value_heads: 2, "
        "intermediate_size: 128, max_position_embeddings: 1024, tie_word_embeddings: true}",
        "raw",
    ),
}
FEW_STEPS = [
    "run.mixed_precision=no",
    "run.log_every=1",
    "tokenizer.train_from_data=true",
    "tokenizer.vocab_size=400",
    "model.init=random",
    "model.name_or_path=null",
    "data.val_fraction=0.2",
    *(
        f"{stage}.{key}"
        for stage in ("sft", "reward", "dpo")
        for key in ("max_steps=2", "batch_size=4", "micro_batch_size=2", "eval_batch_size=8")
    ),
    "sft.rouge_prompts=6",
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
    "raft.eval_prompts=4",
    "raft.cpu_threads=1",
    "eval.num_prompts=6",
    "eval.best_of_n=2",
    "eval.best_of_n_prompts=3",
    "eval.batch_size=8",
    "eval.suite_prompts=2",
]


def write_data(root, pairs_format: str) -> tuple:
    """Demonstrations (jsonl, raw Reddit layout) and pairs (parquet preprocessed, or jsonl raw), each with a
    test file and one row of each edge case we can count."""
    root.mkdir()
    demos = root / "sft"
    demos.mkdir()
    long_summary = post(900) | {"summary": "word " * 200}  # response_too_long at 169 tokens
    empty_summary = post(901) | {"summary": "  "}  # empty_response
    write_jsonl(demos / "train.jsonl", [*sft_rows(48), long_summary, empty_summary])
    write_jsonl(demos / "test.jsonl", sft_rows(12, start=100))
    pairs = root / "pairs"
    pairs.mkdir()
    tie = raw_comparison(902) | {"summaries": [{"text": " same"}, {"text": " same"}]}
    if pairs_format == "preprocessed":
        tie = preprocessed_comparison(902) | {"chosen": " same<|endoftext|>", "rejected": " same<|endoftext|>"}
        train = [preprocessed_comparison(i) for i in range(48)]
        write_parquet(pairs / "train.parquet", [*train, tie])
        write_parquet(pairs / "validation_test.parquet", [preprocessed_comparison(i) for i in range(100, 110)])
    else:
        train = [raw_comparison(i) for i in range(48)]
        write_jsonl(pairs / "train.jsonl", [*train, tie, cnndm_comparison(903)])  # cnndm: malformed, 1 of 50 rows
        write_jsonl(pairs / "validation_test.jsonl", [raw_comparison(i) for i in range(100, 110)])
    return pairs, demos


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def tldr_run(request, tmp_path_factory):
    preset = request.param
    model_type, overrides, pairs_format = ARCHITECTURES[preset]
    root = tmp_path_factory.mktemp(preset)
    pairs, demos = write_data(root / "data", pairs_format)
    run = root / "run"
    env = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"} | {"OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "rlhf.pipeline",
        "--preset",
        preset,
        "--output-dir",
        str(run),
        f"data.path={pairs}",
        f"data.sft_path={demos}",
        f"model.model_type={model_type}",
        f"model.config_overrides={overrides}",
        *FEW_STEPS,
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return preset, run, result.stdout


def test_data_stage_counts_both_sources_edge_cases(tldr_run):
    preset, run, stdout = tldr_run
    data = read_summary(run)["data"]
    malformed = 1 if ARCHITECTURES[preset][2] == "raw" else 0  # the CNN/DM row of the raw comparisons
    assert data["dropped"]["tie"] == 1 and data["dropped"]["malformed"] == malformed
    assert data["n_pairs"]["train"] + data["n_pairs"]["val"] == 48 and data["n_pairs"]["test"] == 10
    demos = data["demonstrations"]
    assert demos["dropped"]["response_too_long"] == 1 and demos["dropped"]["empty_response"] == 1
    assert demos["n_demonstrations"]["train"] + demos["n_demonstrations"]["val"] == 48
    assert demos["n_demonstrations"]["test"] == 12
    assert demos["lengths"]["train"]["response_tokens_mean"] > 0
    rows = [json.loads(line) for line in (run / "data" / "sft_train.jsonl").read_text().splitlines()]
    assert all(row["prompt"].endswith("\n\nTL;DR:") and row["response"].startswith(" ") for row in rows)
    assert "[data] demonstrations train/val/test" in stdout


def test_every_stage_ran_on_the_presets_architecture(tldr_run):
    preset, run, _ = tldr_run
    architecture = {"pythia1b-tldr": "GPTNeoXForCausalLM", "llama1b-tldr": "LlamaForCausalLM"}[preset]
    for stage in ("sft", "ppo", "grpo", "raft", "dpo", "online_dpo"):
        config = json.loads((run / stage / "model" / "config.json").read_text())
        assert config["architectures"] == [architecture] and config["num_hidden_layers"] == 2
    for stage in ("data", "sft", "reward", "ppo", "grpo", "raft", "dpo", "online_dpo", "eval"):
        assert (run / stage / "complete.json").is_file(), stage
    assert (run / "report.md").is_file()


def test_sft_trained_on_the_demonstrations_and_reports_rouge_l(tldr_run):
    _, run, _ = tldr_run
    sft = read_summary(run)["sft"]
    assert sft["steps"] == 2 and 0.0 <= sft["val_rougeL"] <= 1.0
    rows = [json.loads(line) for line in (run / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [row["sft/val/rougeL"] for row in rows if "sft/val/rougeL" in row] == [sft["val_rougeL"]]


def test_eval_judges_every_model_against_the_reference_summary(tldr_run):
    _, run, _ = tldr_run
    evaluation = read_summary(run)["eval"]
    models = {"sft", "ppo", "grpo", "raft", "dpo", "online_dpo", "best_of_2"}
    assert set(evaluation["models"]) == models
    assert set(evaluation["win_rates"]["reward"]) == {f"{model}_vs_reference" for model in models}
    # The reference is the SFT test split's summary of each prompt.
    test_demos = [json.loads(line) for line in (run / "data" / "sft_test.jsonl").read_text().splitlines()]
    prompts = [
        json.loads(line)["prompt"] for line in (run / "eval" / "responses" / "sft.jsonl").read_text().splitlines()
    ]
    assert prompts == [row["prompt"] for row in test_demos][:6]
