"""TL;DR readers (OpenAI's comparisons, raw and preprocessed; Reddit TL;DR posts), their edge cases, the
data.sft_path/eval.baseline settings, ROUGE-L and the win-rate pairings."""

from __future__ import annotations

import sys
import types

import pytest
from tldr_fixtures import cnndm_comparison, post, preprocessed_comparison, query, raw_comparison, write_jsonl

from rlhf.analysis.evaluation import rouge_l, win_rate_pairings
from rlhf.core.errors import UserError
from rlhf.data import (
    DEMONSTRATION_FORMATS,
    PAIR_FORMATS,
    heldout_references,
    heldout_split,
    length_stats,
    load_raw_splits,
    read_demonstrations,
    tldr_demonstration_row,
    tldr_pair_row,
)
from rlhf.stage.config import load_config


def test_preprocessed_comparison_uses_its_query_and_strips_the_eos_text():
    row = tldr_pair_row(preprocessed_comparison(3))  # choice 1: summaries[1] is the better one
    fields = post(3)
    assert row == {
        "prompt": query(fields["subreddit"], fields["title"], fields["post"]),
        "chosen": f" {fields['summary']}.",
        "rejected": f" I {fields['post'][:20]}",
        "id": fields["id"],
        "subreddit": fields["subreddit"],
    }
    assert row["prompt"].endswith("\n\nTL;DR:") and row["prompt"].startswith("SUBREDDIT: r/")


def test_preprocessed_query_wins_over_the_raw_fields():
    raw = preprocessed_comparison(4) | {"query": "TRUNCATED QUERY\n\nTL;DR:"}
    assert tldr_pair_row(raw)["prompt"] == "TRUNCATED QUERY\n\nTL;DR:"


@pytest.mark.parametrize("choice", [0, 1])
def test_raw_comparison_builds_the_query_and_follows_the_choice(choice):
    raw = raw_comparison(5, choice=choice)
    row = tldr_pair_row(raw)
    assert row["chosen"] == raw["summaries"][choice]["text"] and row["rejected"] == raw["summaries"][1 - choice]["text"]
    # The raw and the preprocessed row of the same comparison read the same.
    assert row == tldr_pair_row(preprocessed_comparison(5) | {"choice": choice} | _swap_texts(raw, choice))


def _swap_texts(raw: dict, choice: int) -> dict:
    return {
        "chosen": raw["summaries"][choice]["text"] + "<|endoftext|>",
        "rejected": raw["summaries"][1 - choice]["text"] + "<|endoftext|>",
    }


def _with(row: dict, **changes) -> dict:
    return row | changes


@pytest.mark.parametrize(
    "raw, reason",
    [
        (None, "malformed"),
        ("a string", "malformed"),
        ({"chosen": "\n\nHuman: hi\n\nAssistant: a", "rejected": "\n\nHuman: hi\n\nAssistant: b"}, "malformed"),
        (cnndm_comparison(1), "malformed"),  # an article, no post
        (_with(raw_comparison(1), choice=2), "malformed"),
        (_with(raw_comparison(1), choice=True), "malformed"),
        (_with(raw_comparison(1), choice=1.0), "malformed"),
        (_with(raw_comparison(1), summaries=[{"text": " one"}]), "malformed"),
        (_with(raw_comparison(1), summaries=[{"text": " one"}, {"text": None}]), "malformed"),
        (_with(raw_comparison(1), info={"post": "p", "title": "t"}), "malformed"),  # no subreddit
        (_with(raw_comparison(1), summaries=[{"text": " same"}, {"text": " same"}]), "tie"),
        (_with(raw_comparison(1), summaries=[{"text": "  "}, {"text": " fine"}]), "empty_response"),
        (_with(preprocessed_comparison(1), chosen=" same<|endoftext|>", rejected=" same<|endoftext|>"), "tie"),
        (_with(preprocessed_comparison(1), chosen="<|endoftext|>"), "empty_response"),
    ],
)
def test_comparison_edge_cases_have_their_drop_reason(raw, reason):
    assert tldr_pair_row(raw) == reason


def test_demonstration_rows_raw_and_preprocessed():
    fields = post(7)
    expected = {
        "prompt": query(fields["subreddit"], fields["title"], fields["post"]),
        "response": " " + fields["summary"],  # Huang et al. add the leading space the raw summaries lack
        "id": fields["id"],
        "subreddit": fields["subreddit"],
    }
    assert tldr_demonstration_row(fields) == expected
    preprocessed = fields | {"query": expected["prompt"], "reference_response": f" {fields['summary']}<|endoftext|>"}
    assert tldr_demonstration_row(preprocessed) == expected


@pytest.mark.parametrize(
    "raw, reason",
    [
        (None, "malformed"),
        ({k: v for k, v in post(1).items() if k != "summary"}, "malformed"),
        ({k: v for k, v in post(1).items() if k != "title"}, "malformed"),
        (post(1) | {"summary": 3}, "malformed"),
        (post(1) | {"summary": "   "}, "empty_response"),
    ],
)
def test_demonstration_edge_cases_have_their_drop_reason(raw, reason):
    assert tldr_demonstration_row(raw) == reason


def test_formats_name_what_a_valid_row_holds():
    assert "summaries[2]" in PAIR_FORMATS["tldr"].hint("malformed")
    assert "summary" in DEMONSTRATION_FORMATS["tldr"].hint("malformed")
    assert PAIR_FORMATS["tldr"].hint("tie") == PAIR_FORMATS["hh"].hint("tie")


def test_hub_test_split_falls_back_to_validation(monkeypatch):
    """The TL;DR preference set has train, validation and validation_cnndm: validation is the test split."""
    hub = {"train": [{"n": 1}], "validation": [{"n": 2}], "validation_cnndm": [{"n": 3}]}
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda path: hub))
    assert load_raw_splits("vwxyzjn/some-set") == {"train": [{"n": 1}], "test": [{"n": 2}]}
    hub["test"] = [{"n": 4}]
    assert load_raw_splits("vwxyzjn/some-set")["test"] == [{"n": 4}]


def test_a_missing_demonstration_file_names_its_key(tmp_path):
    with pytest.raises(UserError, match=r"^data.sft_path '.*missing.jsonl' does not exist; give an OpenAI TL;DR"):
        load_raw_splits(str(tmp_path / "missing.jsonl"), "data.sft_path", DEMONSTRATION_FORMATS["tldr"].kind)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.format=json"], "data.format='json' is unknown; use one of hh, tldr"),
        (["data.sft_path=x.jsonl"], "data.sft_path is set but data.format=hh has no demonstration format"),
        (["data.format=tldr"], "data.path=embedded generates HH-format pairs; set data.format=hh"),
        (["eval.baseline=chosen"], "eval.baseline='chosen' is unknown; use one of sft, reference"),
    ],
)
def test_bad_tldr_settings_fail_at_load_time_in_one_line(overrides, message):
    with pytest.raises(UserError) as info:
        load_config("configs/tiny.yaml", overrides)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_demonstrations_come_from_sft_files_or_the_chosen_responses(tmp_path):
    write_jsonl(tmp_path / "val.jsonl", [{"prompt": "p1", "chosen": " c1", "rejected": " r1"}])
    write_jsonl(tmp_path / "sft_val.jsonl", [{"prompt": "q1", "response": " s1"}])
    assert read_demonstrations(tmp_path, "val", separate=False) == [{"prompt": "p1", "response": " c1"}]
    assert read_demonstrations(tmp_path, "val", separate=True) == [{"prompt": "q1", "response": " s1"}]


def test_heldout_references_keep_the_first_per_prompt_and_fall_back_to_val(tmp_path):
    write_jsonl(tmp_path / "sft_test.jsonl", [])
    write_jsonl(
        tmp_path / "sft_val.jsonl",
        [{"prompt": "a", "response": " 1"}, {"prompt": "b", "response": " 2"}, {"prompt": "a", "response": " 3"}],
    )
    assert heldout_references(tmp_path, separate=True) == {"a": " 1", "b": " 2"}
    assert heldout_split(tmp_path, separate=True) == "val"  # what eval records as eval.prompt_split
    write_jsonl(tmp_path / "sft_test.jsonl", [{"prompt": "c", "response": " 4"}])
    assert heldout_split(tmp_path, separate=True) == "test"


def test_length_stats_of_demonstrations():
    stats = length_stats({"prompt": [10, 20], "response": [3, 5]})
    assert stats == {
        "n": 2,
        "prompt_tokens_mean": 15.0,
        "response_tokens_mean": 4.0,
        "response_tokens_std": 1.0,
    }


def test_rouge_l_by_hand():
    # LCS("the cat sat", "the cat sat on the mat") = 3 words: P = 3/3, R = 3/6, F = 2PR/(P+R) = 2/3.
    assert rouge_l(["the cat sat"], ["the cat sat on the mat"]) == pytest.approx(2 / 3)
    # A mean over examples: the second shares nothing (F = 0).
    assert rouge_l(["the cat sat", "dogs bark"], ["the cat sat on the mat", "birds sing"]) == pytest.approx(1 / 3)
    # LCS is a subsequence, not a substring: "a c" in "a b c" has LCS 2; P = 1, R = 2/3, F = 0.8.
    assert rouge_l(["a c"], ["a b c"]) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        rouge_l(["x"], [])


def test_win_rate_pairings():
    models = ["sft", "ppo", "dpo", "best_of_4"]
    assert win_rate_pairings(models, "reference", "reference") == [
        ("sft", "reference"),
        ("ppo", "reference"),
        ("dpo", "reference"),
        ("best_of_4", "reference"),
    ]
    assert win_rate_pairings(models, "sft", "chosen") == [
        ("ppo", "sft"),
        ("dpo", "sft"),
        ("best_of_4", "sft"),
        ("ppo", "dpo"),
        ("ppo", "best_of_4"),
        ("dpo", "best_of_4"),
        ("sft", "chosen"),
        ("ppo", "chosen"),
        ("dpo", "chosen"),
        ("best_of_4", "chosen"),
    ]
