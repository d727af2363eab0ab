"""Bad datasets given to the data stage (part1_reward/analyze_data.py), run in-process through its
command-line wrapper: each fails in one line naming the problem and the fix, and the run folder keeps
what it held and gains no data/complete.json."""

from __future__ import annotations

import gzip
import json

import pytest

from rlhf.core.errors import UserError
from rlhf.data import INVALID_REASONS, check_invalid_share

from .helpers import (
    assert_nothing_lost,
    assert_problem_and_fix,
    fail_in_process,
    hh_row,
    prepare_run,
    stage_module,
    write_lines,
)

DATA = "part1_reward/analyze_data.py"
GOOD = [hh_row(i) for i in range(60)]


@pytest.mark.parametrize(
    "name, rows, problem, fix",
    [
        ("missing.jsonl", None, "does not exist", "give an HH-format"),
        ("empty.jsonl", [], "has no training rows", "give a non-empty HH-format file"),
        ("blank_lines.jsonl", ["", "  "], "has no training rows", "give a non-empty HH-format file"),
        (
            "not_json.jsonl",
            ["this is not JSON", "{broken", "[1, 2"],
            ["3 of 3 train rows are invalid", "3 malformed", "data.max_invalid_fraction=0.05"],
            ["fix the file", "raise data.max_invalid_fraction"],
        ),
        (
            "wrong_fields.jsonl",
            [{"prompt": "Hi", "response": "Hello"}, {"question": "Hi", "answer": "Hello"}],
            [
                "2 of 2 train rows are invalid",
                "string 'chosen' and 'rejected' dialogues, or TRL's 'prompt', 'chosen' and 'rejected'",
            ],
            "fix the file",
        ),
        (
            "non_string_fields.jsonl",
            [{"chosen": 1, "rejected": 2}, {"chosen": ["a"], "rejected": {"b": 1}}, {"chosen": None, "rejected": "x"}],
            ["3 of 3 train rows are invalid", "3 malformed"],
            "fix the file",
        ),
        (
            "not_objects.jsonl",
            ["1", '"a string"', "[]", "null"],
            ["4 of 4 train rows are invalid", "JSON object"],
            "fix the file",
        ),
        (
            "no_assistant.jsonl",
            [{"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: yo"}, {"chosen": "Assistant: a", "rejected": "b"}],
            ["2 of 2 train rows are invalid", "2 no_assistant_turn", "Assistant:' turn"],
            "fix the file",
        ),
    ],
)
def test_unusable_file_is_one_line(capsys, run_dir, tmp_path, name, rows, problem, fix):
    path = tmp_path / name
    if rows is not None:
        write_lines(path, rows)
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}")
    assert_problem_and_fix(message, problem, fix)
    assert_nothing_lost(run_dir, "data")


def test_every_row_filtered_out_names_the_filter_and_its_key(capsys, run_dir, tmp_path):
    path = write_lines(tmp_path / "long.jsonl", [hh_row(i, chosen=" word" * 30) for i in range(40)])
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}", "data.max_response_tokens=4")
    assert_problem_and_fix(
        message,
        ["train split is empty after filtering", "40 pairs dropped as response_too_long"],
        "raise data.max_response_tokens",
    )
    assert_nothing_lost(run_dir, "data")


def test_every_row_a_tie_says_why_nothing_is_usable(capsys, run_dir, tmp_path):
    path = write_lines(tmp_path / "ties.jsonl", [hh_row(i, chosen=" Same.", rejected=" Same.") for i in range(5)])
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}")
    assert_problem_and_fix(message, ["no usable training pairs among 5 rows", "5 dropped as tie"], "must differ")
    assert_nothing_lost(run_dir, "data")


def test_validation_share_that_empties_a_split(capsys, run_dir, tmp_path):
    path = write_lines(tmp_path / "hh.jsonl", GOOD)
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}", "data.val_fraction=0")
    assert_problem_and_fix(message, "the val split is empty with data.val_fraction=0.0", "raise data.val_fraction")
    assert_nothing_lost(run_dir, "data")


def test_too_few_prompts_for_a_validation_split_says_how_many_were_read_and_how_many_it_needs(
    capsys, run_dir, tmp_path
):
    """Five TRL-format rows gave "the val split is empty with data.val_fraction=0.1; raise it (or give more
    prompts)": not how many were read, nor how many it takes."""
    rows = [{"prompt": f"Question {i}?", "chosen": "A good answer.", "rejected": "No."} for i in range(5)]
    path = write_lines(tmp_path / "five.jsonl", rows)
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}", "data.val_fraction=0.1")
    assert_problem_and_fix(
        message,
        ["the val split is empty with data.val_fraction=0.1", "5 pairs kept, all in train"],
        "give about 30 or more prompts, or raise data.val_fraction",
    )
    assert_nothing_lost(run_dir, "data")


def test_a_folder_of_test_files_only_says_to_add_a_training_file(capsys, run_dir, tmp_path):
    """The empty-source message said "a file whose name contains 'test' is used as the test split" after every
    empty file, where docs/data.md says a single file is the whole source whatever its name."""
    folder = tmp_path / "pairs"
    folder.mkdir()
    write_lines(folder / "test.jsonl", GOOD[:10])
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={folder}")
    assert_problem_and_fix(
        message,
        "has no training rows: every file in it is a test file",
        "add a training file (HH-format) whose name does not contain 'test'",
    )
    assert_nothing_lost(run_dir, "data")


def test_mix_above_the_invalid_share_stops_naming_the_setting(capsys, run_dir, tmp_path):
    # 60 good rows + 4 broken lines: 4/64 = 6.25% > 5% (the default)
    path = write_lines(tmp_path / "mix.jsonl", GOOD + ["{not json"] * 4)
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}")
    assert_problem_and_fix(
        message,
        ["4 of 64 train rows are invalid", "4 malformed", "more than data.max_invalid_fraction=0.05"],
        ["fix the file", "raise data.max_invalid_fraction"],
    )
    assert_nothing_lost(run_dir, "data")


def test_mix_within_the_invalid_share_is_counted_and_skipped(capsys, run_dir, tmp_path):
    # 60 good rows + 1 broken line + 1 row without an assistant turn: 2/62 = 3.2% <= 5%
    bad = ["{not json", {"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: yo"}]
    path = write_lines(tmp_path / "mix.jsonl", GOOD + bad)
    stage_module(DATA).main(["--preset", "tiny", "--output-dir", str(run_dir), f"data.path={path}"])
    stats = json.loads((run_dir / "data" / "stats.json").read_text())
    assert (stats["dropped"]["malformed"], stats["dropped"]["no_assistant_turn"]) == (1, 1)
    assert stats["n_pairs"]["train"] + stats["n_pairs"]["val"] == 60
    assert (run_dir / "data" / "complete.json").is_file()
    # the same file with a lower share allowed stops instead: the setting is what decides
    strict = prepare_run(tmp_path / "strict")
    message = fail_in_process(capsys, DATA, strict, f"data.path={path}", "data.max_invalid_fraction=0.01")
    assert_problem_and_fix(
        message, ["2 of 62 train rows are invalid", "data.max_invalid_fraction=0.01"], "fix the file"
    )
    assert_nothing_lost(strict, "data")


def test_skipped_rows_are_named_by_line_and_a_missing_test_split_is_said_once(capsys, run_dir, tmp_path):
    """A file of pairs alone (no test file) with a blank line and two invalid rows: the data stage says where the
    invalid rows are (file:line, blank lines counted, as an editor shows them), and once that there is no test
    split and what that does to the reward stage and eval (before: `test = 0`, then `test nan`, then validation
    prompts reported as held-out ones)."""
    no_turn = {"chosen": "\n\nHuman: hi", "rejected": "\n\nHuman: yo"}
    path = write_lines(tmp_path / "mine.jsonl", [*GOOD[:10], "", "{not json", *GOOD[10:], no_turn])  # lines 12, 63
    capsys.readouterr()
    stage_module(DATA).main(["--preset", "tiny", "--output-dir", str(run_dir), f"data.path={path}"])
    err = capsys.readouterr().err
    assert (
        f"[data] warning: data.path '{path}': skipped 2 invalid train rows of 62 (1 malformed, 1 no_assistant_turn); "
        f"the first at {path}:12, {path}:63"
    ) in err
    assert (
        f"[data] warning: data.path '{path}': it has no test split (a single file is split by data.test_fraction, "
        "which is 0), so the reward model's test accuracy will be nan and eval will answer validation prompts, not "
        "held-out test ones; set data.test_fraction (e.g. 0.1) to hold one out"
    ) in err
    assert err.count("test split") == 1
    # past data.max_invalid_fraction the error names the lines too
    strict = prepare_run(tmp_path / "strict")
    message = fail_in_process(capsys, DATA, strict, f"data.path={path}", "data.max_invalid_fraction=0.01")
    assert_problem_and_fix(message, f"the first at {path}:12, {path}:63", "fix the file")


@pytest.mark.parametrize(
    "reasons, n_rows, max_fraction, stops",
    [
        ([], 10, 0.0, False),
        (["tie", "empty_response", "prompt_too_long"], 3, 0.0, False),  # filtered by design, never invalid
        (["malformed"], 100, 0.01, False),  # exactly the share allowed
        (["malformed", "no_assistant_turn"], 100, 0.01, True),
        (["no_assistant_turn"], 1, 1.0, False),
        (["malformed"], 1000, 0.0, True),  # 0: the first invalid row stops the stage
    ],
)
def test_invalid_share_counts_only_rows_that_are_not_pairs(reasons, n_rows, max_fraction, stops):
    assert set(INVALID_REASONS) == {"malformed", "no_assistant_turn"}
    if stops:
        with pytest.raises(UserError, match=r"data\.max_invalid_fraction"):
            check_invalid_share("x.jsonl", "train", reasons, n_rows, max_fraction)
    else:
        check_invalid_share("x.jsonl", "train", reasons, n_rows, max_fraction)


def test_invalid_share_applies_to_the_test_split_too(capsys, run_dir, tmp_path):
    folder = tmp_path / "hh"
    folder.mkdir()
    write_lines(folder / "train.jsonl", GOOD)
    write_lines(folder / "test.jsonl", [hh_row(100)] + ["oops"] * 3)
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={folder}")
    assert_problem_and_fix(message, "3 of 4 test rows are invalid", "fix the file")


@pytest.mark.parametrize(
    "name, content, problem, fix",
    [
        ("broken.parquet", b"PAR1 this is not parquet", "cannot read", "complete Parquet file"),
        ("broken.jsonl.gz", b"not gzip at all", "cannot read", "check that it is complete"),
        ("latin1.jsonl", "caf\xe9\n".encode("latin-1"), "cannot read", "UTF-8"),
        ("broken.json", b'[{"chosen": ', "is not valid JSON", "HH .json files hold a list"),
        ("object.json", b'{"chosen": "a", "rejected": "b"}', "holds a JSON dict, not a list", "hold a list"),
        ("rows.csv", b"chosen,rejected\n", "unsupported suffix", "use one of"),
    ],
)
def test_unreadable_file_is_one_line(capsys, run_dir, tmp_path, name, content, problem, fix):
    path = tmp_path / name
    path.write_bytes(content)
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}")
    assert_problem_and_fix(message, problem, fix)
    assert_nothing_lost(run_dir, "data")


def test_truncated_gzip_is_one_line(capsys, run_dir, tmp_path):
    whole = gzip.compress("".join(json.dumps(r) + "\n" for r in GOOD).encode())
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(whole[: len(whole) // 2])
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={path}")
    assert_problem_and_fix(message, "cannot read", "check that it is complete")
    assert_nothing_lost(run_dir, "data")


def test_folder_without_data_files(capsys, run_dir, tmp_path):
    (tmp_path / "empty_folder").mkdir()
    (tmp_path / "empty_folder" / "notes.txt").write_text("no data here")
    message = fail_in_process(capsys, DATA, run_dir, f"data.path={tmp_path / 'empty_folder'}")
    assert_problem_and_fix(message, "holds no .jsonl, .jsonl.gz, .json or .parquet files", "put HH-format files")
    assert_nothing_lost(run_dir, "data")


def test_rows_that_look_like_paths_write_nothing_outside_the_run_folder(run_dir, tmp_path):
    """File names come from the config, never from the data: rows whose text, field names and values
    look like paths (absolute, `..`, a `split` field) leave every file they name unwritten."""
    target = tmp_path / "escaped"
    sneaky = [
        {**hh_row(i), "split": f"../../{target.name}/x", "../escaped": str(target / "y.jsonl")} for i in range(60)
    ]
    sneaky += [hh_row(100, chosen=f" {target}/z.jsonl", rejected=" ../../../escaped/w")]
    path = write_lines(tmp_path / "hh.jsonl", sneaky)
    before = set(tmp_path.rglob("*"))
    stage_module(DATA).main(["--preset", "tiny", "--output-dir", str(run_dir), f"data.path={path}"])
    assert (run_dir / "data" / "complete.json").is_file()
    created = set(tmp_path.rglob("*")) - before
    assert created and all(p.is_relative_to(run_dir) for p in created), sorted(map(str, created - {run_dir}))
    assert not target.exists()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["data.test_fraction=1.5"], "data.test_fraction must be in [0, 1), got 1.5"),
        (["data.judge_fraction=-0.1"], "data.judge_fraction must be in [0, 1), got -0.1"),
        (
            ["data.val_fraction=0.4", "data.test_fraction=0.3", "data.judge_fraction=0.3"],
            "leaves no training prompts; lower them to a sum below 1",
        ),
    ],
)
def test_split_shares_fail_at_start_up(tmp_path, capsys, overrides, message):
    path = write_lines(tmp_path / "pairs.jsonl", GOOD)
    out = prepare_run(tmp_path / "run")
    assert message in fail_in_process(capsys, DATA, out, f"data.path={path}", *overrides)
    assert_nothing_lost(out, "data")
    assert not (out / "data" / "train.jsonl").exists()
