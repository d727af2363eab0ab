"""HH-RLHF parsing, every edge-case filter, the prompt-level split and local file loading."""

import gzip
import json

import pytest

from rlhf.core.errors import UserError
from rlhf.data import DROP_REASONS, ParsedPair, count_reasons, load_raw_splits, parse_pair, prompt_split, split_dialogue

PROMPT = "\n\nHuman: Hi there\n\nAssistant: Hello!\n\nHuman: What is 2 plus 2?\n\nAssistant:"


def test_split_dialogue_cuts_at_the_final_assistant_turn():
    prompt, response = split_dialogue(PROMPT + " 2 plus 2 is 4.")
    assert prompt == PROMPT
    assert response == " 2 plus 2 is 4."


def test_human_inside_a_turn_without_blank_line_stays_in_the_response():
    prompt, response = split_dialogue(PROMPT + " I said Human: no. Assistant: fine.")
    assert prompt == PROMPT
    assert response == " I said Human: no. Assistant: fine."


def test_split_dialogue_without_assistant_turn_raises():
    with pytest.raises(ValueError):
        split_dialogue("\n\nHuman: hello")


def test_parse_pair_keeps_the_shared_prompt():
    pair = parse_pair({"chosen": PROMPT + " 4.", "rejected": PROMPT + " 5."})
    assert pair == ParsedPair(PROMPT, " 4.", " 5.")


@pytest.mark.parametrize(
    "row, reason",
    [
        (None, "malformed"),
        ({"chosen": PROMPT + " 4."}, "malformed"),
        ({"chosen": 3, "rejected": PROMPT + " 5."}, "malformed"),
        ({"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: hi"}, "no_assistant_turn"),
        # Multi-turn pair that branches at the first assistant turn: the final responses answer different prompts.
        (
            {
                "chosen": "\n\nHuman: a\n\nAssistant: b\n\nHuman: c\n\nAssistant: d",
                "rejected": "\n\nHuman: a\n\nAssistant: X\n\nHuman: c\n\nAssistant: d2",
            },
            "diverging_prompts",
        ),
        ({"chosen": PROMPT + " 4.", "rejected": PROMPT + " 4."}, "tie"),
        ({"chosen": PROMPT + "   ", "rejected": PROMPT + " 5."}, "empty_response"),
    ],
)
def test_parse_pair_names_each_edge_case(row, reason):
    assert parse_pair(row) == reason


def test_count_reasons_reports_every_reason_even_at_zero():
    counts = count_reasons(["tie", "tie", "malformed"])
    assert list(counts) == list(DROP_REASONS)
    assert counts["tie"] == 2 and counts["malformed"] == 1 and counts["prompt_too_long"] == 0


def test_prompt_split_is_stable_and_respects_the_fraction():
    prompts = [f"\n\nHuman: question {i}\n\nAssistant:" for i in range(4000)]
    first = [prompt_split(p, 0.1) for p in prompts]
    assert first == [prompt_split(p, 0.1) for p in prompts]
    share = first.count("val") / len(first)
    # Binomial(4000, 0.1): sd = sqrt(4000 * 0.1 * 0.9) / 4000 = 0.0047; 4 sd = 0.019.
    assert abs(share - 0.1) < 0.019
    assert all(prompt_split(p, 0.0) == "train" for p in prompts[:50])


def _rows():
    return [
        {"chosen": PROMPT + " 4.", "rejected": PROMPT + " 5."},
        {"chosen": PROMPT + " four.", "rejected": PROMPT + " 22."},
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".json", ".parquet"])
def test_local_formats_load(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        path.write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    elif suffix == ".jsonl.gz":
        with gzip.open(path, "wt") as handle:
            handle.write("\n".join(json.dumps(r) for r in _rows()))
    elif suffix == ".json":
        path.write_text(json.dumps(_rows()))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(_rows()), path)
    splits = load_raw_splits(str(path))
    assert splits["train"] == _rows() and splits["test"] == []


def test_folder_assigns_test_files_to_the_test_split(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps(_rows()[0]) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps(_rows()[1]) + "\n")
    splits = load_raw_splits(str(tmp_path))
    assert splits["train"] == [_rows()[0]] and splits["test"] == [_rows()[1]]


def test_broken_json_line_is_counted_as_malformed(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(_rows()[0]) + "\n{not json\n")
    rows = load_raw_splits(str(path))["train"]
    assert [parse_pair(r) if not isinstance(parse_pair(r), ParsedPair) else "ok" for r in rows] == ["ok", "malformed"]


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("missing.jsonl", None, "does not exist"),
        ("empty.jsonl", "", "no training rows"),
        ("x.json", "{broken", "not valid JSON"),
    ],
)
def test_bad_sources_are_one_line_errors(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError) as info:
        load_raw_splits(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_prompt_split_carves_test_and_judge_after_val():
    prompts = [f"\n\nHuman: question {i}\n\nAssistant:" for i in range(4000)]
    splits = [prompt_split(p, 0.1, 0.2, 0.3) for p in prompts]
    # the val share is the one prompt_split(p, 0.1) gives: adding test and judge shares moves no val prompt
    assert [p for p, s in zip(prompts, splits) if s == "val"] == [p for p in prompts if prompt_split(p, 0.1) == "val"]
    for split, share in (("test", 0.2), ("judge", 0.3), ("train", 0.4)):
        # Binomial(4000, share): 4 sd <= 4 * sqrt(0.25 / 4000) = 0.032
        assert abs(splits.count(split) / len(splits) - share) < 0.032, split


def test_a_single_file_is_all_train_whatever_its_name(tmp_path):
    path = tmp_path / "harmless-base-test.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _rows()) + "\n")
    splits = load_raw_splits(str(path))
    assert splits["train"] == _rows() and splits["test"] == []


BOIL = "\n\nHuman: How do I boil an egg?\n\nAssistant:"
TRL_ROWS = {
    "plain": {"prompt": "How do I boil an egg?", "chosen": "Boil it 8 minutes.", "rejected": "No idea.", "id": 7},
    "plain, an HH prompt": {"prompt": BOIL, "chosen": " Boil it 8 minutes.", "rejected": " No idea.", "id": 7},
    "conversational": {
        "prompt": [{"role": "user", "content": "How do I boil an egg?"}],
        "chosen": [{"role": "assistant", "content": "Boil it 8 minutes."}],
        "rejected": [{"role": "assistant", "content": "No idea."}],
        "id": 7,
    },
    "conversational, no prompt": {
        "chosen": [
            {"role": "user", "content": "How do I boil an egg?"},
            {"role": "assistant", "content": "Boil it 8 minutes."},
        ],
        "rejected": [
            {"role": "user", "content": "How do I boil an egg?"},
            {"role": "assistant", "content": "No idea."},
        ],
        "id": 7,
    },
}


@pytest.mark.parametrize("shape", TRL_ROWS)
def test_trls_preference_rows_read_as_the_hh_row_they_hold(shape):
    """TRL's {"prompt", "chosen", "rejected"} rows, in text or as chat messages, failed as no_assistant_turn."""
    from rlhf.data import hh_row

    assert hh_row(TRL_ROWS[shape]) == {
        "prompt": BOIL,
        "chosen": " Boil it 8 minutes.",
        "rejected": " No idea.",
        "id": 7,
    }


def test_a_system_message_joins_the_next_user_turn_and_odd_messages_are_malformed():
    from rlhf.data import hh_row

    system = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    row = hh_row(
        {
            "prompt": system,
            "chosen": [{"role": "assistant", "content": "Hello."}],
            "rejected": [{"role": "assistant", "content": "Go away."}],
        }
    )
    assert row["prompt"] == "\n\nHuman: Be brief.\nHi?\n\nAssistant:"
    odd = {"prompt": [{"role": "tool", "content": "x"}], "chosen": [], "rejected": []}
    assert hh_row(odd) == "malformed" and hh_row({"prompt": "Hi?", "chosen": ["a"], "rejected": "b"}) == "malformed"
    no_answer = {"chosen": [{"role": "user", "content": "Hi?"}], "rejected": [{"role": "user", "content": "Hi?"}]}
    assert hh_row(no_answer) == "no_assistant_turn"
