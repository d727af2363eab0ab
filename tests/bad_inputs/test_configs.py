"""Bad configurations: each stops the stage at start-up in one line naming the key and the fix, before
any model loads and before the stage clears its own completion marker."""

from __future__ import annotations

import json

import pytest

from rlhf.core.errors import UserError
from rlhf.methods.plan import plan_rl
from rlhf.models.training import plan_steps
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import COMPLETE_FILE, RunDir

from .helpers import assert_nothing_lost, assert_problem_and_fix, fail_in_process, stage_module

DATA = "part1_reward/analyze_data.py"
SFT = "part1_reward/train_sft.py"
REWARD = "part1_reward/train_reward.py"
DPO = "part3_dpo/train_dpo.py"
GRPO = "part2_ppo_grpo/train_grpo.py"
PPO = "part2_ppo_grpo/train_ppo.py"


def test_unknown_preset(capsys, run_dir):
    message = fail_in_process(capsys, SFT, run_dir, preset="tiyn")
    assert_problem_and_fix(message, "unknown preset 'tiyn'", ["available presets:", "tiny", "gpt2-hh"])
    assert_nothing_lost(run_dir, "sft")


def test_config_file_not_found(capsys, run_dir, tmp_path):
    message = fail_in_process(capsys, SFT, run_dir, "--config", str(tmp_path / "mine.yaml"), preset=None)
    assert_problem_and_fix(message, "config file not found", ["give an existing YAML file", "--preset", "tiny"])


@pytest.mark.parametrize(
    "override, problem, fix",
    [
        ("sft.lrr=1e-4", "unknown config key 'sft.lrr'", "did you mean 'sft.lr'?"),
        ("sft.learning_rate=1e-4", "unknown config key 'sft.learning_rate'", "did you mean 'sft.lr'?"),
        ("zzz.qqq=1", "unknown config key 'zzz.qqq'", "keys look like section.key with section one of"),
        ("sft.lr=fast", "config key 'sft.lr' expects float, got 'fast'", "e.g. sft.lr=0.002"),
        ("sft.batch_size=32.5", "config key 'sft.batch_size' expects int", "e.g. sft.batch_size=32"),
        ("sft.group_by_length=sometimes", "expects bool", "e.g. sft.group_by_length=true"),
        ("sft.max_steps=many", "expects int", "or null"),
    ],
)
def test_unknown_key_or_wrong_type_on_the_command_line(capsys, run_dir, override, problem, fix):
    message = fail_in_process(capsys, SFT, run_dir, override)
    assert_problem_and_fix(message, problem, fix)
    assert_nothing_lost(run_dir, "sft")


@pytest.mark.parametrize(
    "yaml_text, problem, fix",
    [
        ("sft:\n  epocs: 2\n", "unknown config key 'sft.epocs'", "did you mean 'sft.epochs'?"),
        ("sft:\n  batch_size: [32]\n", "config key 'sft.batch_size' expects int", "e.g. sft.batch_size=64"),
        ("model:\n  config_overrides: 12\n", "expects dict", "e.g. 'model.config_overrides={}'"),
    ],
)
def test_unknown_key_or_wrong_type_in_a_config_file(capsys, run_dir, tmp_path, yaml_text, problem, fix):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml_text)
    message = fail_in_process(capsys, SFT, run_dir, "--config", str(path), preset=None)
    assert_problem_and_fix(message, [str(path), problem], fix)


@pytest.mark.parametrize(
    "script, stage, override, problem",
    [
        (SFT, "sft", "sft.batch_size=0", "sft.batch_size=0 must be at least 1"),
        (SFT, "sft", "sft.micro_batch_size=-4", "sft.micro_batch_size=-4 must be at least 1"),
        (SFT, "sft", "sft.epochs=0", "sft.epochs=0.0 must be > 0"),
        (SFT, "sft", "sft.max_steps=0", "sft.max_steps=0 must be at least 1"),
        (SFT, "sft", "run.log_every=0", "run.log_every=0 must be at least 1"),
        (DATA, "data", "data.max_prompt_tokens=0", "data.max_prompt_tokens=0 must be at least 1"),
        (DATA, "data", "data.embedded.n_train_pairs=-1", "data.embedded.n_train_pairs=-1 must be at least 1"),
        (REWARD, "reward", "reward.eval_batch_size=0", "reward.eval_batch_size=0 must be at least 1"),
        (DPO, "dpo", "dpo.batch_size=-32", "dpo.batch_size=-32 must be at least 1"),
        (PPO, "ppo", "ppo.total_episodes=0", "ppo.total_episodes=0 must be at least 1"),
        (GRPO, "grpo", "grpo.max_new_tokens=0", "grpo.max_new_tokens=0 must be at least 1"),
    ],
)
def test_zero_or_negative_size(capsys, run_dir, script, stage, override, problem):
    """Caught when the config loads: before, a zero batch divided by zero inside the training loop."""
    message = fail_in_process(capsys, script, run_dir, override)
    assert_problem_and_fix(message, problem, f"set {override.partition('=')[0]} to a positive number")
    assert_nothing_lost(run_dir, stage)


@pytest.mark.parametrize(
    "override, problem, fix",
    [
        ("data.max_invalid_fraction=1.5", "data.max_invalid_fraction=1.5 must lie in [0, 1]", "1 never stops"),
        ("judge.timeout_s=0", "judge.timeout_s=0.0 is out of range", "see JudgeSettings"),
        ("judge.max_concurrency=-1", "judge.max_concurrency=-1 is out of range", "see JudgeSettings"),
    ],
)
def test_share_or_judge_setting_out_of_range_fails_in_every_stage(capsys, run_dir, override, problem, fix):
    """Checked once when the config loads, so the pipeline stops before its first stage, not at eval."""
    message = fail_in_process(capsys, SFT, run_dir, override)
    assert_problem_and_fix(message, problem, fix)


def test_grpo_batch_not_divisible_by_the_group_size_fails_before_clearing_the_stage(capsys, rl_run):
    run = RunDir(rl_run, preset="tiny")
    finished = run.stage("grpo") / COMPLETE_FILE  # a finished grpo run for another config
    finished.parent.mkdir()
    finished.write_text(json.dumps({"fingerprint": "from-another-config"}))
    message = fail_in_process(capsys, GRPO, rl_run, "grpo.batch_size=62")
    assert_problem_and_fix(
        message,
        "grpo.batch_size=62 must be divisible by grpo.group_size=4",
        "set grpo.batch_size to a multiple of 4",
    )
    assert json.loads(finished.read_text()) == {"fingerprint": "from-another-config"}  # a config error keeps it
    assert not run.checkpoint_dir("grpo").exists()


def test_a_reward_flat_within_groups_gets_one_warning(capsys, rl_run, tmp_path, monkeypatch):
    """A custom reward equal for all G samples of nearly every group trained on without a word (zero_std_groups
    0.875 to 1.0): GRPO says so once, on the console, and trains as before."""
    (tmp_path / "flat_rewards.py").write_text("def constant(prompts, responses):\n    return [1.0] * len(responses)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    small = ["grpo.total_episodes=48", "grpo.batch_size=8", "grpo.micro_batch_size=8", "grpo.forward_batch_size=8"]
    small += ["grpo.eval_prompts=0", "grpo.max_new_tokens=8", "grpo.save_every=0"]
    argv = ["--preset", "tiny", "--output-dir", str(rl_run), "grpo.reward=flat_rewards:constant", *small]
    capsys.readouterr()
    stage_module(GRPO).main(argv)  # 6 iterations of 2 groups of 4
    err = capsys.readouterr().err
    assert err.count("[grpo] warning: in the first 5 iterations, ") == 1
    assert "make grpo.reward='flat_rewards:constant' tell more of the responses apart" in err
    assert (rl_run / "grpo" / COMPLETE_FILE).is_file()


def test_batch_not_divisible_by_the_number_of_processes():
    """What the stages compute once the accelerator knows the world size (3 processes here)."""
    cfg = load_config(preset_path("tiny"))  # sft: 32 per step in micro-batches of 32; grpo: 64 = 16 prompts x G=4
    with pytest.raises(UserError) as sft_error:
        plan_steps("sft", cfg.sft, n_examples=7000, world_size=3)
    assert_problem_and_fix(
        str(sft_error.value),
        "sft.batch_size=32 is not divisible by 3 processes",
        "set sft.batch_size to a multiple of 3, or change the number of processes",
    )
    plan_steps("sft", cfg.sft, n_examples=7000, world_size=2)  # micro-batch 32 > the 16 per process: becomes 16
    with pytest.raises(UserError) as grpo_error:
        plan_rl("grpo", cfg.grpo, world_size=3, n_prompts=7000, group_size=cfg.grpo.group_size)
    assert_problem_and_fix(
        str(grpo_error.value),
        "grpo.batch_size=64 gives 16 prompts per iteration, not divisible by 3 processes",
        "set grpo.batch_size to a multiple of 12",
    )
    plan_rl("grpo", cfg.grpo, world_size=2, n_prompts=7000, group_size=cfg.grpo.group_size)  # 16 = 2 x 8: fine


@pytest.mark.parametrize("script, stage", [(GRPO, "grpo"), (PPO, "ppo")])
def test_max_new_tokens_beyond_the_model_context(capsys, rl_run, script, stage):
    """The tiny preset's model has 192 positions: a longest prompt + 190 new tokens cannot fit."""
    message = fail_in_process(capsys, script, rl_run, f"{stage}.max_new_tokens=190")
    assert_problem_and_fix(
        message,
        [f"{stage}.max_new_tokens=190 exceeds the model's 192 positions"],
        f"lower {stage}.max_new_tokens or data.max_prompt_tokens",
    )
    assert_nothing_lost(rl_run, stage)


def test_data_limits_beyond_the_model_context_fail_before_sft_trains(capsys, rl_run):
    """data.max_prompt_tokens + data.max_response_tokens + EOS must fit n_positions; past it an SFT step
    would fail with an index error whenever a long pair came up."""
    overrides = ["model.config_overrides={n_layer: 1, n_embd: 16, n_head: 2, n_positions: 128}"]
    run = RunDir(rl_run, preset="tiny")
    run.mark_complete("data", load_config(preset_path("tiny"), overrides), {})  # data done for this config
    message = fail_in_process(capsys, SFT, rl_run, *overrides)
    assert_problem_and_fix(
        message,
        "data.max_prompt_tokens=96 + data.max_response_tokens=64 + 1 (EOS) = 161 tokens exceeds the model's 128",
        "lower them",
    )
    assert_nothing_lost(rl_run, "sft")
    assert not run.model_dir("sft").with_name("model.tmp").exists()


@pytest.mark.parametrize(
    "script, stage, override, problem, fix",
    [
        (DATA, "data", "data.embedded.length_bias=2", "data.embedded.length_bias=2.0 is a probability", "in [0, 1]"),
        (DATA, "data", "data.embedded.annotator_noise=-0.1", "annotator_noise=-0.1 is a probability", "in [0, 1]"),
        (SFT, "sft", "data.val_fraction=1.5", "data.val_fraction must be in [0, 1), got 1.5", "data.val_fraction=0.1"),
        (SFT, "sft", "sft.micro_batch_size=64", "sft.micro_batch_size=64 is larger than sft.batch_size=32", "divisor"),
    ],
)
def test_out_of_range_settings_stop_every_stage_at_start_up(capsys, run_dir, script, stage, override, problem, fix):
    """Before, the annotator's probabilities failed with a 17-line traceback in the data stage (after writing its
    config.yaml), a micro-batch above the batch was quietly cut to it, and a share above 1 reached only the data
    stage's checks."""
    message = fail_in_process(capsys, script, run_dir, override)
    assert_problem_and_fix(message, problem, fix)
    assert_nothing_lost(run_dir, stage)
    assert not (run_dir / stage / "config.yaml").exists() or stage != "data"


@pytest.mark.parametrize(
    "yaml_text, problem, fix",
    [
        ("model:\n  init: random\ndata:\n  path: [embedded\n", "is not valid YAML at line 5, column 1", "just before"),
        ("sft:\n  lr: 0.001\n", "has no 'model' or 'data' section", "start from a preset's file (configs/tiny.yaml)"),
        ("data:\n  path: embedded\n", "has no 'model' section, so the run would take the default model gpt2", "add"),
    ],
)
def test_a_config_file_that_would_not_run_as_meant_names_where_and_why(
    capsys, run_dir, tmp_path, yaml_text, problem, fix
):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml_text)
    message = fail_in_process(capsys, SFT, run_dir, "--config", str(path), preset=None)
    assert_problem_and_fix(message, [str(path), problem], fix)
