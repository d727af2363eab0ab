"""Helpers of the bad-input suite: run a stage's real entry point in-process, exactly as its command
line does (`rlhf.stage.cli.run_stage(main)`), and check the one line the user gets."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import io
import json
import subprocess
import sys
import warnings
from pathlib import Path
from unittest import mock

import pytest
from transformers import GPT2Config

from rlhf.stage.cli import run_stage
from rlhf.stage.run import COMPLETE_FILE

REPO = Path(__file__).resolve().parents[2]
SUMMARY = {"kept": True}  # what a run folder held before the failed stage started


def hh_row(i: int, chosen: str = " Fact.", rejected: str = " No.") -> dict:
    """A valid HH-format pair with a distinct prompt per i."""
    prompt = f"\n\nHuman: Tell me fact {i}.\n\nAssistant:"
    return {"chosen": prompt + chosen, "rejected": prompt + rejected}


def write_lines(path: Path, rows: list) -> Path:
    """Rows as JSONL; a str row is written as the raw line (for lines that are not JSON)."""
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


@functools.cache
def stage_module(script: str):
    """A stage script (e.g. "part1_reward/analyze_data.py") imported as a module, for its main()."""
    path = REPO / script
    spec = importlib.util.spec_from_file_location(f"bad_inputs_stage_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fail_in_process(capsys, script: str, out_dir: Path, *args: str, preset: str | None = "tiny") -> str:
    """Run `script` in this process as `python script --preset PRESET --output-dir out_dir args` (no
    --preset when `preset` is None). It must exit with code 2 and one line on stderr, no traceback;
    -> that line without "error: "."""
    argv = [script, *(["--preset", preset] if preset else []), "--output-dir", str(out_dir), *args]
    capsys.readouterr()
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as exit_info:
        run_stage(stage_module(script).main)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err, err
    start = err.rfind("error: ")
    assert start >= 0, err
    message = err[start + len("error: ") :].rstrip("\n")
    assert "\n" not in message, err
    return message


def run_in_process(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run `script` in this process as `python script args` does (`run_stage(main)`: one-line errors, exit 2), its
    output captured -> what `subprocess.run` would give: the exit code, stdout and stderr, every warning it raised
    on stderr (each time, as a fresh interpreter shows it). Seconds sooner than a new interpreter's imports, for
    the tests of what a script prints and writes; tests/test_commands.py starts each script as its own process."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with (
        mock.patch.object(sys, "argv", [script, *args]),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        try:
            run_stage(stage_module(script).main)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught)
    return subprocess.CompletedProcess([script, *args], code, stdout.getvalue(), shown + stderr.getvalue())


def assert_problem_and_fix(message: str, problem: str | list[str], fix: str | list[str]) -> None:
    """`message` has the form "<what is wrong>; <how to fix it>" on one line: each `problem` fragment
    is in the part before the last "; " and each `fix` fragment in the part after it."""
    assert "\n" not in message, message
    what, sep, how = message.rpartition("; ")
    assert sep, f"no '; <fix>' part in: {message}"
    for fragment in [problem] if isinstance(problem, str) else problem:
        assert fragment in what, f"{fragment!r} not in the problem part of: {message}"
    for fragment in [fix] if isinstance(fix, str) else fix:
        assert fragment in how, f"{fragment!r} not in the fix part of: {message}"


def prepare_run(out_dir: Path) -> Path:
    """A run folder that already holds results of an earlier stage, which a failed stage must keep."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(SUMMARY))
    return out_dir


def assert_nothing_lost(out_dir: Path, stage: str) -> None:
    """The failed stage left nothing that looks complete, and deleted nothing written before it."""
    assert not (out_dir / stage / COMPLETE_FILE).exists()
    assert json.loads((out_dir / "summary.json").read_text()) == SUMMARY


def tiny_gpt2_config(tokenizer, n_positions: int, n_embd: int = 16) -> GPT2Config:
    """A 1-layer GPT-2 for `tokenizer`: loads and saves in milliseconds."""
    return GPT2Config(
        n_layer=1,
        n_embd=n_embd,
        n_head=2,
        n_positions=n_positions,
        vocab_size=len(tokenizer),
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
