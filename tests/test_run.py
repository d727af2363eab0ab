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
