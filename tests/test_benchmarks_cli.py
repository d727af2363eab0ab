"""`part4_eval/benchmarks.py`, the command that answers IFEval and XSTest with one checkpoint: its start-up errors
name its own options, and `--engine vllm` answers what `--engine hf` answers (greedy, float32) from a checkpoint
whose tokenizer has no pad of its own, so the engine gets the model with the added pad row."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from conftest import REPO
from test_engines import NO_VLLM, NO_VLLM_REASON, peaked_policy
from test_rollout import TEXTS

from rlhf.core.errors import UserError

SCRIPT = str(REPO / "part4_eval" / "benchmarks.py")
spec = importlib.util.spec_from_file_location("benchmarks_script", SCRIPT)
benchmarks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmarks)
EOS = "<|im_end|>"
# One user turn, ChatML as SmolLM2's template writes it.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.skipif(not NO_VLLM, reason="vLLM is installed here")
def test_vllm_missing_is_one_line_in_this_commands_options(tmp_path):
    with pytest.raises(
        UserError,
        match=r"^benchmarks: --engine vllm but vLLM is not installed here; .* build \.venv-vllm with RLHF_VLLM=1 .* "
        r"and run this with \.venv-vllm/bin/python, .* or set --engine hf$",
    ):
        benchmarks.parse_args(["--model", "m", "--output", str(tmp_path), "--engine", "vllm"])


def test_a_bad_budget_stops_before_any_model_loads(tmp_path):
    with pytest.raises(UserError, match=r"^--max-new-tokens, --batch-size and --limit must be >= 1$"):
        benchmarks.parse_args(["--model", "m", "--output", str(tmp_path), "--max-new-tokens", "0"])


def padless_tokenizer():
    """A byte-level BPE with EOS and no pad token in its vocabulary, as SmolLM2's (whose pad is its EOS)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS], initial_alphabet=alphabet, show_progress=False)
    core.train_from_iterator(TEXTS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token=EOS, pad_token=EOS, chat_template=CHAT_TEMPLATE)


@pytest.fixture(scope="module")
def padless_checkpoint(tmp_path_factory):
    """A random GPT-2 whose tokenizer's pad is its EOS: loading adds a pad token and an embedding row."""
    folder = tmp_path_factory.mktemp("padless")
    tokenizer = padless_tokenizer()
    model = peaked_policy(tokenizer)
    model.resize_token_embeddings(len(tokenizer))  # no spare row
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def answer(checkpoint, output, engine: str) -> list[dict]:
    command = [sys.executable, SCRIPT, "--model", str(checkpoint), "--output", str(output), "--engine", engine]
    command += ["--benchmarks", "ifeval,xstest", "--limit", "6", "--max-new-tokens", "8", "--cpu-kv-cache-mb", "64"]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    return [json.loads(line) for name in ("ifeval", "xstest") for line in open(output / f"{name}.jsonl")]


@pytest.mark.slow  # two benchmark processes (seconds each): out of the unit run
@pytest.mark.vllm
@pytest.mark.skipif(NO_VLLM, reason=NO_VLLM_REASON)
def test_vllm_answers_what_generate_answers(padless_checkpoint, tmp_path):
    by_hf = answer(padless_checkpoint, tmp_path / "hf", "hf")
    by_vllm = answer(padless_checkpoint, tmp_path / "vllm", "vllm")
    assert (tmp_path / "vllm" / "engine_model" / "model.safetensors").exists()  # the model with the added pad row
    assert len(by_hf) == 12 and [r["response"] for r in by_vllm] == [r["response"] for r in by_hf]
    assert any(r["response"] for r in by_hf)  # something was generated to compare
    summary = json.loads((tmp_path / "vllm" / "benchmarks.json").read_text())
    assert summary["engine"] == "vllm" and set(summary["benchmarks"]) == {"ifeval", "xstest"}
