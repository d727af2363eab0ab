"""part4_eval/degeneration.py: a stage's held-out answers measured for degeneration against SFT's, tokenized with the
run's SFT tokenizer, by hand on a run folder written here."""

from __future__ import annotations

import importlib.util
import json

import pytest
from conftest import REPO

from rlhf.core.errors import UserError

spec = importlib.util.spec_from_file_location("degeneration", REPO / "part4_eval" / "degeneration.py")
degeneration = importlib.util.module_from_spec(spec)
spec.loader.exec_module(degeneration)

LOOP = "I am so sorry I am so sorry I am so sorry"  # 12 tokens: 11 bigrams, 9 four-grams of which 4 distinct
SFT_ANSWERS = ["kill the process with its id", "the rebels used a torpedo", "no I will not", "a b c d"]


def run_folder(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = sorted({word for text in [LOOP, *SFT_ANSWERS] for word in text.split()})
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # one token per word
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]").save_pretrained(tmp_path / "sft" / "model")
    rows = [{"prompt": f"p{i}", "dpo_response": LOOP, "sft_response": answer} for i, answer in enumerate(SFT_ANSWERS)]
    (tmp_path / "dpo").mkdir()
    (tmp_path / "dpo" / "samples.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "summary.json").write_text(json.dumps({"dpo": {"val_accuracy": 0.625, "steps": 20}}))
    return tmp_path


def test_a_looping_policy_is_measured_and_flagged_against_sft(tmp_path, capsys):
    measured = degeneration.measure(run_folder(tmp_path), "dpo")
    # SFT: 15 bigrams, all distinct; no 4-gram repeats within an answer. The loop: 44 bigrams, 4 distinct.
    assert measured["sft"] == {"distinct_2": 1.0, "repetition_4": 0.0}
    assert measured["policy"] == {"distinct_2": pytest.approx(4 / 44), "repetition_4": pytest.approx(5 / 9)}
    assert measured["degenerate"] == [
        "within-answer repetition 0.56 against SFT's 0.00",
        "distinct-2 0.09 against SFT's 1.00",
    ]
    assert measured["prompts"] == 4 and measured["validation"] == {"val_accuracy": 0.625}
    degeneration.main([str(tmp_path), "--json", str(tmp_path / "out.json")])
    assert "| 4 | 0.625 | 0.091 (1.000) | 0.556 (0.000) | within-answer repetition 0.56" in capsys.readouterr().out
    assert json.loads((tmp_path / "out.json").read_text())[0]["degenerate"] == measured["degenerate"]


def test_a_stage_without_paired_samples_is_one_line(tmp_path):
    with pytest.raises(UserError, match=r"samples\.jsonl not found; run the dpo stage"):
        degeneration.measure(tmp_path, "dpo")
    (tmp_path / "ppo").mkdir()
    (tmp_path / "ppo" / "samples.jsonl").write_text(json.dumps({"prompt": "p", "response": "r"}) + "\n")
    with pytest.raises(UserError, match="holds no ppo_response and sft_response pairs"):
        degeneration.measure(tmp_path, "ppo")
    (tmp_path / "dpo").mkdir()
    (tmp_path / "dpo" / "samples.jsonl").write_text(json.dumps({"dpo_response": "a", "sft_response": "b"}) + "\n")
    with pytest.raises(UserError, match="holds no tokenizer; give a run folder whose SFT stage completed"):
        degeneration.measure(tmp_path, "dpo")
