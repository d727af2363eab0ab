"""Fixtures of the bad-input suite: a run folder with earlier results in it, and a run folder whose
data, sft and reward stages look complete (tiny models, built in about a second) for the RL stages."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from transformers import GPT2ForSequenceClassification, GPT2LMHeadModel

from rlhf import task
from rlhf.data import ParsedPair, parse_pair, write_jsonl
from rlhf.models.checkpoint import save_pretrained_atomic
from rlhf.models.modeling import REWARD_CONFIG_FILE, train_tokenizer
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir

from .helpers import prepare_run, tiny_gpt2_config


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No stage this suite starts may reach the network (the subprocesses inherit these; in-process,
    the suite never names a Hub id: missing local paths are refused before any Hub lookup)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """tmp_path/run holding an earlier stage's summary.json (see helpers.assert_nothing_lost)."""
    return prepare_run(tmp_path / "run")


@pytest.fixture(scope="session")
def rl_template(tmp_path_factory) -> Path:
    """A tiny-preset run folder whose data, sft and reward stages are complete for the preset's config:
    embedded-task pairs, a tokenizer trained on them, and a 1-layer, 16-wide GPT-2 as SFT policy and
    (with a score head) reward model. Completion is judged by config fingerprints, not by file contents,
    so an RL stage starts on it as on a real run. Tests copy it (`rl_run`)."""
    root = prepare_run(tmp_path_factory.mktemp("rl_template") / "run")
    cfg, run = load_config(preset_path("tiny")), RunDir(root, preset="tiny")
    raw = task.generate_split("train", 120, seed=0, annotator_noise=0.1, length_bias=0.2)
    rows = [asdict(pair) for pair in map(parse_pair, raw) if isinstance(pair, ParsedPair)]
    run.stage("data").mkdir()
    write_jsonl(run.stage("data") / "train.jsonl", rows[:90])  # 90 distinct prompts
    write_jsonl(run.stage("data") / "val.jsonl", rows[90:])
    tokenizer = train_tokenizer([text for row in rows for text in row.values()], vocab_size=300)
    tokenizer.save_pretrained(run.tokenizer_dir)
    config = tiny_gpt2_config(tokenizer, cfg.model.config_overrides["n_positions"])
    torch.manual_seed(0)
    save_pretrained_atomic(GPT2LMHeadModel(config), tokenizer, run.model_dir("sft"))
    config.num_labels = 1
    reward_model = GPT2ForSequenceClassification(config)
    save_pretrained_atomic(reward_model, tokenizer, run.model_dir("reward"), {REWARD_CONFIG_FILE: {"pooling": "last"}})
    for stage in ("data", "sft", "reward"):
        run.mark_complete(stage, cfg, {})
    return root


@pytest.fixture
def rl_run(rl_template, tmp_path) -> Path:
    """A private copy of `rl_template`."""
    return Path(shutil.copytree(rl_template, tmp_path / "run"))
