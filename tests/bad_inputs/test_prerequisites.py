"""A stage started before the stages it reads from: one line that names every stage missing (not one per run),
the config keys a stage run with another config differs in, and commands that keep the run folder
(`rlhf.stage.run.RunDir.require`). Each way out the line names is then checked to work."""

from __future__ import annotations

from rlhf.stage.config import dump_yaml, load_config, preset_path
from rlhf.stage.run import RunDir

from .helpers import assert_nothing_lost, assert_problem_and_fix, fail_in_process


def test_every_missing_input_stage_is_named_with_the_one_command_that_builds_them(capsys, run_dir):
    # an empty run folder: ppo reads reward, which reads sft, which reads data (four round trips before)
    message = fail_in_process(capsys, "part2_ppo_grpo/train_ppo.py", run_dir)
    assert message == (
        f"stages 'data', 'sft', 'reward' have not completed in {run_dir}; build them with: "
        f"bash run_all.sh --only data,sft,reward,ppo --preset tiny --output-dir {run_dir}"
    )
    assert_nothing_lost(run_dir, "ppo")


def test_the_command_repeats_the_overrides_and_the_folder(capsys, run_dir):
    cfg = load_config(preset_path("tiny"), ["sft.lr=1e-4"])
    RunDir(run_dir).mark_complete("data", cfg, {})
    message = fail_in_process(capsys, "part1_reward/train_reward.py", run_dir, "sft.lr=1e-4", "reward.lr=2e-4")
    assert message == (
        f"stage 'sft' has not completed in {run_dir}; build it with: "
        f"bash run_all.sh --only sft,reward --preset tiny --output-dir {run_dir} sft.lr=1e-4 reward.lr=2e-4"
    )


def test_a_stage_run_with_another_config_names_the_keys_and_how_to_reuse_it(capsys, run_dir):
    """The report after `run_all.sh --only eval,report eval.num_prompts=50`, re-run without the override: the old hint
    (run evaluate.py, or run_all.sh --from eval without --output-dir) threw that evaluation away."""
    cfg, ran_with = load_config(preset_path("tiny")), load_config(preset_path("tiny"), ["eval.num_prompts=50"])
    run = RunDir(run_dir, preset="tiny")
    for stage in ("data", "sft", "reward"):
        run.mark_complete(stage, cfg, {})
    run.stage("eval").mkdir()
    saved = run.stage("eval") / "config.yaml"
    saved.write_text(dump_yaml(ran_with))  # as start_stage writes it
    run.mark_complete("eval", ran_with, {})

    message = fail_in_process(capsys, "part4_eval/make_report.py", run_dir, "--force")
    assert message == (
        f"stage 'eval' was run with a different config in {run_dir} (eval.num_prompts: 50 there, 300 now); "
        f"add eval.num_prompts=50 (the settings it ran with), or pass --config {saved} in place of --preset tiny, "
        f"or redo it with this config: bash run_all.sh --only eval,report --preset tiny --output-dir {run_dir}"
    )
    assert_problem_and_fix(message, "stage 'eval' was run with a different config", "--output-dir")
    assert_nothing_lost(run_dir, "report")
    # both ways of reusing it make eval complete for the config the report then runs with
    assert run.is_complete("eval", load_config(preset_path("tiny"), ["eval.num_prompts=50"]))
    assert run.is_complete("eval", load_config(saved))


def test_a_stage_folder_gets_its_config_yaml_at_start_up(capsys, run_dir, tmp_path):
    """data/ and eval/ had no config.yaml (the training stages wrote it through their metric logger); every stage
    folder now gets it once start-up checks pass, so a later mismatch can name its keys."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"chosen": 1}\n')
    fail_in_process(capsys, "part1_reward/analyze_data.py", run_dir, f"data.path={empty}")  # fails after start-up
    saved = load_config(run_dir / "data" / "config.yaml")
    assert saved.data.path == str(empty) and saved.run.output_dir == str(run_dir)
