"""The benchmark harness runs one timed step of every stage on the tiny preset (never a timed test:
it checks that the harness works and reports what it should, not how fast)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, TINY_TEST_OVERRIDES

from bench.run import STAGES, UNITS


@pytest.mark.slow
def test_harness_times_an_offline_and_an_rl_stage_and_writes_its_table(tiny_run, tmp_path):
    """bench/run.py's command line and files, on one offline and one RL stage (one warm-up and one timed step). Every
    stage of STAGES is timed through the same `measure_stage` and `rates` by the GPU check's test below."""
    chosen = ("sft", "grpo")
    command = [sys.executable, str(REPO / "bench" / "run.py"), "--preset", "tiny", "--run", str(tiny_run)]
    command += ["--stages", ",".join(chosen), "--steps", "1", "--warmup", "1", "--out", str(tmp_path)]
    done = subprocess.run([*command, *TINY_TEST_OVERRIDES], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    [path] = tmp_path.glob("*.json")
    results = json.loads(path.read_text())
    assert list(results["stages"]) == list(chosen) and set(chosen) <= set(STAGES)
    for stage, entry in results["stages"].items():
        rates = entry["rates"]
        assert rates[f"{UNITS[stage]}_per_s"] > 0
        assert rates["peak_memory_mb"] > 0
        assert entry["raw"]["steps"] == 1
        assert entry["raw"]["total_s"] >= entry["raw"]["timed_s"] > 0
        if stage in ("ppo", "grpo"):  # the time split into the RL phases
            assert {f"{p}_s_per_step" for p in ("generate", "score", "train")} <= set(rates)
            assert rates["generated_tokens_per_s"] > 0
        else:
            assert rates["tokens_per_s"] > 0
    table = path.with_suffix(".md").read_text()
    assert all(f"| {stage} |" in table for stage in chosen)


@pytest.mark.slow
def test_stage_start_times_both_ways(tiny_run, tmp_path):
    command = [sys.executable, str(REPO / "bench" / "stage_start.py"), "--run", str(tiny_run), "--repeats", "1"]
    done = subprocess.run([*command, "--out", str(tmp_path), *TINY_TEST_OVERRIDES], capture_output=True, text=True)
    if "nothing to compare" in done.stderr:
        pytest.skip("stages are not forked here")
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("*-stage-start.json")
    results = json.loads(path.read_text())["results"]
    assert list(results) == ["complete", "grpo-1-iteration"]
    for entry in results.values():
        assert all(len(times) == 1 and times[0] > 0 for times in entry["seconds"].values())
        assert entry["speedup"] == round(entry["median_s"]["fresh"] / entry["median_s"]["forked"], 2)


def test_vs_trl_runs_both_sides_at_their_defaults_and_at_equal_threads(tmp_path, monkeypatch):
    """Both thread settings in every repeat, with both sides' counts recorded; the headline ratio is at the
    defaults. Ours here is pinned to 1 thread (as `<stage>.cpu_threads=1` would), TRL's default is 2."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import vs_trl

    trl_given = []

    def ours(stage, run, preset, steps, warmup, overrides, profile=False):
        return {"total_s": 2.0, "timed_s": 1.0, "threads": 1, "tokens": 640}

    def trl(stage, run, preset, steps, warmup, threads, overrides, profile):
        trl_given.append((stage, threads))
        return {"total_s": 3.0 if threads is None else 4.0, "timed_s": 1.5, "threads": threads or 2, "tokens": 700}

    monkeypatch.setattr(vs_trl, "measure_stage", ours)
    monkeypatch.setattr(vs_trl, "measure_trl", trl)
    monkeypatch.setitem(sys.modules, "trl", SimpleNamespace(__version__="test"))
    vs_trl.main(["--run", str(tmp_path), "--stages", "sft,grpo", "--repeats", "2", "--out", str(tmp_path)])

    # default: torch's own count; equal: ours'
    assert trl_given == [(stage, threads) for _ in range(2) for stage in ("sft", "grpo") for threads in (None, 1)]
    [path] = tmp_path.glob("*.json")
    results = json.loads(path.read_text())
    assert results["vs_trl"] == {"sft": 1.5, "grpo": 1.5}  # at the defaults
    details = results["vs_trl_details"]["stages"]
    assert details["sft"]["vs_trl"] == {"default": 1.5, "equal": 2.0}
    threads = {
        setting: {side: s[f"{side}_threads"] for side in ("ours", "trl")}
        for setting, s in details["sft"]["seconds"].items()
    }
    assert threads == {"default": {"ours": [1, 1], "trl": [2, 2]}, "equal": {"ours": [1, 1], "trl": [1, 1]}}
    # GRPO's generation work, each side's count per run, to check that both generated as much
    grpo = details["grpo"]["seconds"]["default"]
    assert (grpo["ours_generated_tokens"], grpo["trl_generated_tokens"]) == ([640, 640], [700, 700])
    assert "ours_generated_tokens" not in details["sft"]["seconds"]["default"]


def test_trl_generated_tokens_are_counted_over_the_timed_steps(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    from trl_stages import generated_tokens

    per_step = [10.0, 11.5, 12.0]
    assert generated_tokens(per_step, warmup=1, total_steps=3, batch_size=64) == (11.5 + 12.0) * 64
    with pytest.raises(SystemExit, match="TRL recorded 3 generation batches, expected 4"):
        generated_tokens(per_step, warmup=1, total_steps=4, batch_size=64)


def test_trl_harness_reward_scores_what_ours_scores(tiny_run):
    """bench/trl_stages.py's reward function for TRL gives ours' GRPO scores (EOS read, missing-EOS penalty), where
    TRL's own path, reading the text without its EOS, gives others."""
    command = [sys.executable, str(REPO / "bench" / "trl_reward_check.py"), "--run", str(tiny_run), "--samples", "16"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["samples"] == 16 and result["harness_max_abs_diff"] < 1e-5
    assert abs(result["trl_default"] - result["ours"]) > 1e-3


def test_step_profile_counts_positions_only_while_started_and_shares_sum_to_one():
    from transformers import GPT2Config, GPT2LMHeadModel

    from bench.profiling import StepProfile, family

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50, n_positions=32))
    profile = StepProfile(model, operators=True)
    ids = torch.randint(0, 50, (3, 7))
    model(input_ids=ids)  # before start: not counted
    profile.start()
    model(input_ids=ids).logits.sum().backward()
    model(input_ids=ids[:, :5])
    profile.stop()
    model(input_ids=ids)  # after stop: not counted
    summary = profile.summary()
    assert summary["positions"] == 3 * 7 + 3 * 5
    assert sum(summary["families_share"].values()) == pytest.approx(1.0)
    assert summary["families_share"]["matmul"] > 0
    assert [family(op) for op in ("aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::gelu")] == [
        "matmul",
        "attention",
        "other",
    ]


@pytest.mark.slow
def test_offline_stage_profile_counts_every_position_it_computes(tiny_run):
    command = [sys.executable, str(REPO / "bench" / "stages.py"), "sft", "--run", str(tiny_run), "--preset", "tiny"]
    command += ["--steps", "2", "--warmup", "1", "--profile", *TINY_TEST_OVERRIDES]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    profile = result["profile"]
    assert profile["positions"] >= result["tokens"] > 0  # padding included, non-pad tokens counted apart
    assert profile["positions"] % 32 == 0  # whole (32, T) micro-batches of sft.micro_batch_size rows
    assert sum(profile["families_share"].values()) == pytest.approx(1.0)
    assert "aten::mm" in profile["top_ops_share"]


@pytest.mark.slow
def test_gpu_check_runs_every_stage_and_times_each_at_the_tiny_shape(tmp_path):
    """bench/gpu_check.sh as CI runs it (no GPU, the tiny shape, one step each): every gpt2-hh stage completes
    on local HH-format rows, each training stage is timed, and the figures a GPU window needs are written."""
    from bench.gpu_check import PIPELINE_STAGES, TIMED_STAGES

    command = ["bash", str(REPO / "bench" / "gpu_check.sh"), "--shape", "tiny"]
    command += ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    [path] = (tmp_path / "out").glob("*-gpu-check.json")
    results = json.loads(path.read_text())
    assert all(results["pipeline"]["stages"][stage]["completed"] for stage in PIPELINE_STAGES)
    assert list(results["timed"]) == list(TIMED_STAGES) and set(TIMED_STAGES) == set(STAGES)  # bench/run.py's
    for stage, entry in results["timed"].items():
        assert entry["seconds_per_step"] > 0 and entry["peak_memory_mb"] > 0, stage
        assert entry["raw"]["steps"] == 1 and entry["raw"]["total_s"] >= entry["raw"]["timed_s"] > 0
        assert entry[f"{UNITS[stage]}_per_s"] > 0, stage
        if stage in ("ppo", "grpo"):  # the time split into the RL phases
            assert {f"{p}_s_per_step" for p in ("generate", "score", "train")} <= set(entry)
            assert entry["generated_tokens_per_s"] > 0
        else:
            assert entry["tokens_per_s"] > 0
        if stage in ("sft", "reward", "dpo"):  # no GPU: no peak FLOP/s to divide by
            assert entry["model_flops_per_s"] > 0 and entry["mfu"] is None
    grpo = results["grpo_per_sample"]
    assert grpo["engine"] == "hf" and grpo["ms_per_sample"] > grpo["generate_ms_per_sample"] > 0
    assert results["engines"]["hf"] == "measured"
    projection = results["projection"]
    assert set(projection["seconds"]) == {*TIMED_STAGES, "raft"}
    assert projection["steps"]["sft"] == -(-projection["train_pairs"] // 128)  # the preset's batch of 128
    assert projection["total_s_at_gpt2_vocab"] > projection["total_s"] > 0
    assert "| grpo |" in path.with_suffix(".md").read_text()


def test_gpu_check_rows_are_synthetic_or_real_hh_pairs_capped_at_the_shape(tmp_path):
    """--rows synthetic writes the shape's train and test rows; --rows hh reads the real pairs' file, capped at the
    shape's counts in every stage's config, and a missing file is one line naming the way out."""
    from bench.gpu_check import SHAPES, training_rows

    shape = SHAPES["tiny"]
    folder, caps = training_rows("synthetic", shape, tmp_path)
    assert caps == [] and len((folder / "train.jsonl").read_text().splitlines()) == shape["rows"][0]
    real = tmp_path / "pairs.jsonl.gz"
    real.write_bytes(b"")
    assert training_rows("hh", shape, tmp_path, real) == (real, ["data.max_train_pairs=400", "data.max_eval_pairs=24"])
    with pytest.raises(SystemExit, match=r"--rows hh reads .*none.jsonl.gz, which is not there; give --hh-file"):
        training_rows("hh", shape, tmp_path, tmp_path / "none.jsonl.gz")


def test_gpu_check_flops_per_token_by_hand():
    """6 N + 12 L d T: a 2-layer, d = 4, 10-token model attending over 5 tokens."""
    from bench.gpu_check import training_flops_per_token

    shape = {"n_layer": 2, "n_embd": 4, "vocab_size": 10, "params_in_matmuls": 2 * 12 * 16 + 10 * 4}
    assert training_flops_per_token(shape, "sft", 5.0) == 6 * 424 + 12 * 2 * 4 * 5
    assert training_flops_per_token(shape, "reward", 5.0) == 6 * (424 - 40) + 12 * 2 * 4 * 5  # no LM head


def test_omp_wait_times_each_policy_alone_and_beside_a_neighbour(tmp_path, monkeypatch):
    """bench/omp_wait.py: every (load, policy) cell measured in a process whose environment has the policy or lacks
    it, one neighbour per repeat with the default policy, killed after, and the ratios of the medians written."""
    import os

    import bench.omp_wait as omp_wait

    policies_seen, neighbours = [], []

    def fake_measure(stage, run, preset, steps, warmup, overrides, profile=False):
        policy = os.environ.get("OMP_WAIT_POLICY")
        policies_seen.append(policy)
        return {"timed_s": 2.0 if policy == "PASSIVE" else 4.0, "steps": 2}

    class FakeNeighbour:
        def __init__(self, command, env):
            neighbours.append(env.get("OMP_WAIT_POLICY", "unset"))

        def kill(self):
            neighbours.append("killed")

        def wait(self):
            pass

    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the caller's own setting reaches neither side
    monkeypatch.setattr(omp_wait, "measure_stage", fake_measure)
    monkeypatch.setattr(omp_wait.subprocess, "Popen", FakeNeighbour)
    monkeypatch.setattr(omp_wait.time, "sleep", lambda seconds: None)
    omp_wait.main(["--run", str(tmp_path), "--repeats", "2", "--out", str(tmp_path)])

    assert policies_seen == [None, "PASSIVE", None, "PASSIVE"] * 2
    assert neighbours == ["unset", "killed"] * 2 and os.environ["OMP_WAIT_POLICY"] == "ACTIVE"
    result = json.loads(next(tmp_path.glob("*-omp-wait.json")).read_text())
    assert result["median_seconds_per_step"] == {
        "quiet/default": 2.0,
        "quiet/PASSIVE": 1.0,
        "loaded/default": 2.0,
        "loaded/PASSIVE": 1.0,
    }
    assert result["passive_over_default"] == {"quiet": 0.5, "loaded": 0.5}


def test_pipeline_shared_runs_the_pipeline_alone_then_beside_a_neighbour_and_compares_the_runs(tmp_path, monkeypatch):
    """bench/pipeline_shared.py: the quiet run, the loaded one with the neighbour running (killed after), a quiet one
    with OpenMP's default wait policy, the ratios of their wall seconds, and whether the runs' model and answer files
    agree."""
    import bench.pipeline_shared as shared

    events = []

    def fake_run(preset, out, default_policy=False):
        events.append(("run", out.name, default_policy))
        for name in ("sft/model/model.safetensors", "eval/responses/sft.jsonl", "sft/metrics.jsonl"):
            (out / name).parent.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(name if out.name == "quiet" or "metrics" not in name else "other timings")
        return {"quiet": 100.0, "loaded": 180.0, "quiet_default": 80.0}[out.name]

    class FakeNeighbour:
        def __init__(self, command, env):
            events.append("neighbour")

        def kill(self):
            events.append("killed")

        def wait(self):
            pass

    monkeypatch.setattr(shared, "run_pipeline", fake_run)
    monkeypatch.setattr(shared.subprocess, "Popen", FakeNeighbour)
    monkeypatch.setattr(shared.time, "sleep", lambda seconds: None)
    shared.main(["--work", str(tmp_path / "work"), "--out", str(tmp_path)])
    assert events == [("run", "quiet", False), "neighbour", ("run", "loaded", False), "killed"] + [
        ("run", "quiet_default", True)
    ]
    result = json.loads(next(tmp_path.glob("*-pipeline-shared.json")).read_text())
    assert result["loaded_over_quiet"] == 1.8 and result["quiet_over_quiet_default_policy"] == 1.25
    assert result["files_compared"] == 2 and result["identical"] is True

    events.clear()  # some of the runs: those, in their order, and only the ratios they make
    shared.main(
        ["--work", str(tmp_path / "work"), "--out", str(tmp_path), "--runs", "quiet_default,quiet", "--name", "x"]
    )
    assert events == [("run", "quiet", False), ("run", "quiet_default", True)]
    result = json.loads(next(tmp_path.glob("*-x.json")).read_text())
    assert "loaded_over_quiet" not in result and result["quiet_over_quiet_default_policy"] == 1.25


def test_the_generation_bound_by_hand():
    from bench.rollout_engines import arithmetic_bound

    # 100 GFLOP/s and 1e8 parameters: 2e8 FLOPs a token, 2 ms; 100 new tokens after a 100-token prompt: 400 ms
    bound = arithmetic_bound(100.0, 100_000_000, prompt_tokens=100.0, new_tokens=100)
    assert bound == {"matmul_gflops": 100.0, "decode_only_tokens_per_s": 500.0, "with_prefill_tokens_per_s": 250.0}
