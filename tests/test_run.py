"""The run folder's summary.json: what a re-run stage leaves behind."""

import json

from rlhf.stage.run import RunDir


def test_a_rerun_stage_replaces_its_section_and_timings_merge(tmp_path):
    run = RunDir(tmp_path)
    run.update_summary({"eval": {"models": {"sft": 0.5, "raft": 0.6}}, "timing_s": {"eval": 40.0}})
    run.update_summary({"dpo": {"win_rate": 0.52}, "timing_s": {"dpo": 30.0}})
    # eval again, with RAFT left out this time: no RAFT number may survive from the first run
    run.update_summary({"eval": {"models": {"sft": 0.5}}, "timing_s": {"eval": 41.0}})

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["eval"] == {"models": {"sft": 0.5}}
    assert summary["dpo"] == {"win_rate": 0.52}
    assert summary["timing_s"] == {"eval": 41.0, "dpo": 30.0}


def test_each_stage_records_the_threads_it_ran_with_beside_its_timing(tmp_path):
    import torch

    run, threads = RunDir(tmp_path), torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        run.update_summary({"sft": {"val_loss": 1.0}, "timing_s": {"sft": 10.0}})
        torch.set_num_threads(1)
        run.update_summary({"ppo": {"reward_mean": 0.5}, "timing_s": {"ppo": 20.0}})
        run.update_summary({"timing_s": {"pipeline_total": 35.0}})  # not a stage: no thread count
    finally:
        torch.set_num_threads(threads)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cpu_threads"] == {"sft": 2, "ppo": 1}


def test_a_stage_that_replaces_a_result_made_with_other_settings_says_so_as_it_starts(tmp_path, capsys):
    """A stage run by hand with an override, then the preset again: the second run names the setting that
    differs and the folder it replaces, before it clears the first one's result."""
    from rlhf.stage.cli import start_stage

    out = ["--preset", "tiny", "--output-dir", str(tmp_path)]
    started = start_stage("dpo", [*out, "dpo.beta=0.3"])
    assert started is not None and "replaces" not in capsys.readouterr().out  # nothing here before
    cfg, run = started
    run.mark_complete("dpo", cfg, {})
    assert start_stage("dpo", [*out, "dpo.beta=0.3"]) is None  # complete for these settings: skipped
    capsys.readouterr()
    assert start_stage("dpo", out) is not None
    assert capsys.readouterr().out.splitlines()[0] == (
        f"[dpo] completed in {tmp_path / 'dpo'} with dpo.beta: 0.3 there, 0.1 now: re-running it replaces that result"
    )
    assert not run.is_complete("dpo", cfg)
