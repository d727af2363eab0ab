"""The run folder's summary.json: what a re-run stage leaves behind."""

import json

from rlhf.run import RunDir


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
