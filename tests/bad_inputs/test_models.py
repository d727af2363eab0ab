"""Bad model inputs: a path that does not exist, a tokenizer without a pad token (handled, not an
error), a checkpoint from another architecture given to resume, and damaged safetensors files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast, get_scheduler

from rlhf.core.batching import collate_sequences, encode_responses, encode_texts
from rlhf.models.checkpoint import save_training_state
from rlhf.models.modeling import EOS_TOKEN, PAD_TOKEN, build_policy, load_tokenizer, token_logprobs
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir

from .helpers import (
    assert_nothing_lost,
    assert_problem_and_fix,
    fail_in_process,
    hh_row,
    stage_module,
    tiny_gpt2_config,
    write_lines,
)

DATA = "part1_reward/analyze_data.py"
SFT = "part1_reward/train_sft.py"
GRPO = "part2_ppo_grpo/train_grpo.py"
PPO = "part2_ppo_grpo/train_ppo.py"
PRETRAINED = ["model.init=pretrained", "model.config_overrides={}"]  # the tiny preset otherwise builds from config


def damage(path: Path) -> None:
    """Cut a file in half, as an interrupted copy or download would."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# ----------------------------------------------------------------------------- paths that do not exist


@pytest.mark.parametrize(
    "script, stage, overrides, key",
    [
        (SFT, "sft", ["model.name_or_path=/no/such/model", *PRETRAINED], "model.name_or_path"),
        (SFT, "sft", ["model.name_or_path=./no/such/config", "model.init=random"], "model.name_or_path"),
        (
            DATA,
            "data",
            ["tokenizer.train_from_data=false", "tokenizer.name_or_path=~/no/such/tokenizer"],
            "tokenizer.name_or_path",
        ),
    ],
)
def test_model_path_that_does_not_exist_fails_at_start_up(capsys, run_dir, script, stage, overrides, key):
    """Checked before the stage reads any data (the data stage may first spend minutes loading a dataset)
    or its inputs: this run has none, yet the error is about the path."""
    message = fail_in_process(capsys, script, run_dir, *overrides)
    assert_problem_and_fix(message, f"{key} '", "give an existing model folder or a Hub id")
    assert "does not exist" in message
    assert_nothing_lost(run_dir, stage)


# ----------------------------------------------------------------------------- a tokenizer without a pad token


def tokenizer_without_pad(texts: list[str], pad_is_eos: bool) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with EOS but no pad token (GPT-2's), or with pad = EOS (a common fix
    that would mask every EOS out of the loss)."""
    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN if pad_is_eos else None
    )


@pytest.mark.parametrize("pad_is_eos", [False, True], ids=["no_pad", "pad_is_eos"])
def test_tokenizer_without_pad_token_is_handled(tmp_path, run_dir, pad_is_eos):
    rows = [hh_row(i) for i in range(40)]
    original = tokenizer_without_pad([text for row in rows for text in row.values()], pad_is_eos)
    assert original.pad_token_id is None or original.pad_token_id == original.eos_token_id
    folder = tmp_path / "pretrained"
    original.save_pretrained(folder)
    GPT2LMHeadModel(tiny_gpt2_config(original, n_positions=192)).save_pretrained(folder)
    data = write_lines(tmp_path / "hh.jsonl", rows)
    overrides = [f"data.path={data}", "tokenizer.train_from_data=false", f"model.name_or_path={folder}", *PRETRAINED]

    # The data stage completes and publishes a tokenizer whose pad token is new and distinct from EOS.
    stage_module(DATA).main(["--preset", "tiny", "--output-dir", str(run_dir), *overrides])
    run = RunDir(run_dir)
    assert run.is_complete("data", load_config(preset_path("tiny"), overrides))
    tokenizer = load_tokenizer(run.tokenizer_dir)
    assert tokenizer.pad_token == PAD_TOKEN and tokenizer.pad_token_id not in (None, tokenizer.eos_token_id)
    assert len(tokenizer) == len(original) + 1

    # The policy gets room for it, and a padded batch scores each row as it scores alone.
    policy = build_policy(load_config(preset_path("tiny"), overrides).model, tokenizer).eval()
    assert policy.get_input_embeddings().num_embeddings == len(tokenizer)
    assert policy.config.pad_token_id == tokenizer.pad_token_id != policy.config.eos_token_id
    prompts = encode_texts(tokenizer, [hh_row(1)["chosen"], hh_row(2)["chosen"] + " and more words here"])
    responses = encode_responses(tokenizer, [" Yes.", " No."])  # EOS appended: never masked as padding
    batch = collate_sequences(prompts, responses, tokenizer.pad_token_id)
    assert (batch["input_ids"] == tokenizer.eos_token_id).sum() == 2
    with torch.no_grad():
        padded = token_logprobs(policy, batch["input_ids"], batch["attention_mask"])  # (2, T)
        short = collate_sequences(prompts[:1], responses[:1], tokenizer.pad_token_id)
        alone = token_logprobs(policy, short["input_ids"], short["attention_mask"])  # (1, T0)
    assert torch.isfinite(padded).all()
    torch.testing.assert_close(padded[0, : alone.shape[1]], alone[0], atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- damaged weights


def test_damaged_pretrained_weights_fail_before_sft_trains(capsys, tmp_path, rl_run):
    folder = tmp_path / "pretrained"
    tokenizer = load_tokenizer(RunDir(rl_run).tokenizer_dir)
    GPT2LMHeadModel(tiny_gpt2_config(tokenizer, n_positions=192)).save_pretrained(folder)
    damage(folder / "model.safetensors")
    overrides = [f"model.name_or_path={folder}", *PRETRAINED]
    RunDir(rl_run).mark_complete("data", load_config(preset_path("tiny"), overrides), {})  # data done for it
    message = fail_in_process(capsys, SFT, rl_run, *overrides)
    assert_problem_and_fix(
        message,
        [f"the weights of model '{folder}' are damaged", "deserializ"],
        "download them again",
    )
    assert_nothing_lost(rl_run, "sft")


@pytest.mark.parametrize(
    "script, stage, damaged",
    [(GRPO, "grpo", "sft"), (PPO, "ppo", "sft"), (GRPO, "grpo", "reward")],
)
def test_damaged_upstream_model_fails_in_one_line(capsys, rl_run, script, stage, damaged):
    run = RunDir(rl_run)
    damage(run.model_dir(damaged) / "model.safetensors")
    message = fail_in_process(capsys, script, rl_run)
    assert_problem_and_fix(
        message,
        [f"cannot load {run.model_dir(damaged)}", "SafetensorError"],
        "re-run the stage that wrote it with --force",
    )
    assert_nothing_lost(rl_run, stage)
    assert run.is_complete(damaged, load_config(preset_path("tiny")))  # the failed stage touched nothing upstream


# ----------------------------------------------------------------------------- resuming from a foreign checkpoint


def write_grpo_checkpoint(run: RunDir, fingerprint: str, n_embd: int) -> Path:
    """A complete grpo checkpoint (weights, optimizer, scheduler, RNG, state.json) of a GPT-2 `n_embd` wide."""
    tokenizer = load_tokenizer(run.model_dir("sft"))
    model = GPT2LMHeadModel(tiny_gpt2_config(tokenizer, n_positions=192, n_embd=n_embd))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = get_scheduler("linear", optimizer, num_warmup_steps=0, num_training_steps=10)
    save_training_state(
        run.checkpoint_dir("grpo"), model, optimizer, scheduler, {"iteration": 2, "fingerprint": fingerprint}
    )
    return run.checkpoint_dir("grpo")


def test_checkpoint_of_another_config_and_architecture_is_refused_before_loading(capsys, rl_run):
    """Before, its weights were loaded first and the size mismatch crashed with a traceback."""
    checkpoint = write_grpo_checkpoint(RunDir(rl_run), "0123456789abcdef", n_embd=32)
    message = fail_in_process(capsys, GRPO, rl_run)
    assert_problem_and_fix(message, f"{checkpoint} belongs to a different config", "delete it or pass --force")
    assert (checkpoint / "state.json").is_file() and (checkpoint / "model.safetensors").is_file()  # kept
    assert_nothing_lost(rl_run, "grpo")


def test_checkpoint_of_another_architecture_with_this_config_is_refused(capsys, rl_run):
    """The same fingerprint (e.g. a checkpoint folder copied in by hand) but other weight shapes."""
    run = RunDir(rl_run)
    checkpoint = write_grpo_checkpoint(run, run.fingerprint("grpo", load_config(preset_path("tiny"))), n_embd=32)
    message = fail_in_process(capsys, GRPO, rl_run)
    assert_problem_and_fix(
        message, [f"cannot resume from {checkpoint}", "size mismatch"], ["delete it", "pass --force to start over"]
    )
    assert (checkpoint / "state.json").is_file()
    assert_nothing_lost(rl_run, "grpo")


def test_damaged_checkpoint_is_refused(capsys, rl_run):
    run = RunDir(rl_run)
    checkpoint = write_grpo_checkpoint(run, run.fingerprint("grpo", load_config(preset_path("tiny"))), n_embd=16)
    damage(checkpoint / "model.safetensors")
    message = fail_in_process(capsys, GRPO, rl_run)
    assert_problem_and_fix(message, [f"cannot resume from {checkpoint}", "SafetensorError"], "delete it")
    assert json.loads((checkpoint / "state.json").read_text())["iteration"] == 2
    assert_nothing_lost(rl_run, "grpo")
