"""Seed spread: run.method_seed re-seeds only the alignment stages; the crossed seeds × prompts interval
(rlhf/analysis/seeds.py) by hand and by simulated coverage; the aggregation of seed runs' eval answers; the report's
section; part4_eval/seeds.py's checks, seed folders and, slow, one real run of it with 2 seeds."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REPO, TINY_TEST_OVERRIDES

from rlhf.analysis.seeds import (
    aggregate_seed_runs,
    crossed_mean_interval,
    crossed_mean_squares,
    head_to_head_pairs,
    pairwise_outcomes,
    seed_block,
    student_t_quantile,
    student_t_two_sided_p,
    win_rate_block,
)
from rlhf.core.errors import UserError
from rlhf.models.training import make_accelerator
from rlhf.report import RunData, render_report
from rlhf.report.seeds_section import section_seeds
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import METHOD_STAGES, RunDir, stage_seed, write_json_atomic

_spec = importlib.util.spec_from_file_location("seeds_script", REPO / "part4_eval" / "seeds.py")
seeds_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeds_script)


def tiny_config(*overrides: str):
    return load_config(preset_path("tiny"), list(overrides))


# ----------------------------------------------------------------------------- run.method_seed


def test_method_seed_reruns_only_the_alignment_stages(tmp_path):
    base, seeded = tiny_config(), tiny_config("run.method_seed=7")
    run = RunDir(tmp_path)
    for stage in ("data", "sft", "collect", "reward", "ppo", "grpo", "raft", "dpo", "eval"):
        run.mark_complete(stage, base, {})
    for stage in ("data", "sft", "collect", "reward"):
        assert run.is_complete(stage, seeded), stage
    for stage in ("ppo", "grpo", "raft", "dpo", "eval"):  # eval reads the policies, so it follows them
        assert not run.is_complete(stage, seeded), stage
    assert [stage_seed(seeded, s) for s in ("sft", "reward", "ppo", "online_dpo", "eval")] == [0, 0, 7, 7, 0]
    assert set(METHOD_STAGES) >= {"ppo", "grpo", "raft", "dpo", "online_dpo"}
    # method seed = run.seed is the run itself: nothing re-runs
    same = tiny_config("run.method_seed=0")
    assert all(run.is_complete(stage, same) for stage in ("ppo", "dpo", "eval"))


def test_make_accelerator_seeds_torch_with_the_stage_seed():
    cfg = tiny_config("run.method_seed=7", "run.seed=3")
    make_accelerator(cfg, "ppo")
    assert torch.initial_seed() == 7
    make_accelerator(cfg, "reward")
    assert torch.initial_seed() == 3
    make_accelerator(cfg)
    assert torch.initial_seed() == 3


# ----------------------------------------------------------------------------- Student's t


def test_student_t_quantile_against_closed_forms_and_tables():
    p = 0.975
    # df = 1 (Cauchy): tan(π(p − ½)); df = 2: (2p − 1) / √(2p(1 − p))
    assert student_t_quantile(p, 1.0) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
    assert student_t_quantile(p, 2.0) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9)
    # printed tables (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2): 3.182, 2.228; the normal's 1.960
    assert student_t_quantile(p, 3.0) == pytest.approx(3.182446, abs=1e-6)
    assert student_t_quantile(p, 10.0) == pytest.approx(2.228139, abs=1e-6)
    assert student_t_quantile(p, np.inf) == pytest.approx(1.959964, abs=1e-6)
    assert student_t_quantile(0.995, 5.0) == pytest.approx(4.032143, abs=1e-6)
    between = student_t_quantile(p, np.array([2.5, 1e5]))
    assert 3.182446 < between[0] < 4.302653 and between[1] == pytest.approx(1.96, abs=1e-3)


def test_student_t_two_sided_p_against_tables():
    # the quantiles above, read back: P(|T| >= t(0.975, df)) = 0.05; t = 0 gives 1; the sign does not matter
    for df, quantile in ((3.0, 3.182446), (10.0, 2.228139), (np.inf, 1.959964)):
        assert student_t_two_sided_p(quantile, df) == pytest.approx(0.05, abs=1e-6)
    assert student_t_two_sided_p(0.0, 4.0) == pytest.approx(1.0)
    # df = 1 (Cauchy): P(|T| >= t) = 1 - 2 atan(t) / π
    assert student_t_two_sided_p(-2.0, 1.0) == pytest.approx(1 - 2 * math.atan(2.0) / math.pi, rel=1e-9)


def test_win_rate_block_tests_one_half_with_the_crossed_standard_error():
    # grand mean 5/8; seed means ½, ¾; prompt means ¾, ¾, ¾, ¼; residuals ±3/8 and ∓1/8 (six of them):
    # MS_seed = 4·2·(1/8)² = 1/8, MS_prompt = 2·(3·(1/8)² + (3/8)²) / 3 = 1/8, MS_resid = (2·9 + 6)/64 / 3 = 1/8.
    # Neither component exceeds the residual: both truncate, V = MS_resid / (nK) = 1/64 (SE ⅛) on (K − 1)(n − 1)
    # = 3 df for the interval, while the test takes K − 1 = 1 df: t = (5/8 − ½) / ⅛ = 1, p = 1 − 2·atan(1)/π = ½
    outcomes = np.array([[1, 0.5, 0.5, 0], [0.5, 1, 1, 0.5]])
    block, interval = win_rate_block(outcomes), crossed_mean_interval(outcomes)
    assert block["variance"]["seed"] == 0.0 and block["df"] == pytest.approx(3.0) and block["p_df"] == 1
    assert float(interval["se"]) == pytest.approx(1 / 8) and block["p_value"] == pytest.approx(0.5)
    # the per-seed t test: mean 0.625, sd 0.25/√2, se = sd/√2 = 0.125, t = 1 on 1 df: p = 1 − 2·atan(1)/π = ½
    assert block["p_per_seed"] == pytest.approx(0.5)
    assert win_rate_block(np.full((2, 3), 0.5))["p_value"] == 1.0  # all ties: no difference at all
    assert win_rate_block(np.ones((2, 3)))["p_value"] == 0.0  # every prompt won, no spread


# ----------------------------------------------------------------------------- the crossed interval


def test_crossed_interval_by_hand():
    y = np.array([[1.0, 0.5, 0.0], [1.0, 1.0, 0.5]])  # 2 seeds × 3 prompts, grand mean 2/3
    # seed means 1/2, 5/6; prompt means 1, 3/4, 1/4
    # MS_seed = 3·((1/2 − 2/3)² + (5/6 − 2/3)²) / 1 = 1/6
    # MS_prompt = 2·((1/3)² + (1/12)² + (5/12)²) / 2 = 7/24
    # residuals ±1/6, ∓1/12, ∓1/12 per row: MS_resid = 2·(1/36 + 1/144 + 1/144) / 2 = 1/24
    ms = crossed_mean_squares(y)
    assert (ms["seed"], ms["prompt"], ms["resid"]) == pytest.approx((1 / 6, 7 / 24, 1 / 24))
    # V = (1/6 + 7/24 − 1/24) / 6 = 5/72; df = (5/12)² / ((1/6)²/1 + (7/24)²/2 + (1/24)²/2) = 100/41
    interval = crossed_mean_interval(y)
    assert interval["se"] == pytest.approx(math.sqrt(5 / 72))
    assert interval["df"] == pytest.approx(100 / 41)
    half = float(student_t_quantile(0.975, 100 / 41)) * math.sqrt(5 / 72)
    assert (interval["low"], interval["high"]) == pytest.approx((2 / 3 - half, 2 / 3 + half))
    # σ²_seed = (MS_seed − MS_resid)/n = 1/24, σ²_prompt = (MS_prompt − MS_resid)/K = 1/8
    assert (interval["var_seed"], interval["var_prompt"], interval["var_resid"]) == pytest.approx(
        (1 / 24, 1 / 8, 1 / 24)
    )
    block = seed_block(y)
    assert block["per_seed"] == pytest.approx([0.5, 5 / 6])
    assert block["sd"] == pytest.approx((1 / 3) / math.sqrt(2))  # two values: |difference| / √2


def test_negative_components_are_truncated_to_zero():
    # equal seed means and equal prompt means: MS_seed = MS_prompt = 0 < MS_resid = (4 · ¼) / 2 = ½, so both
    # components are 0, V = MS_resid / (nK) = 1/12 on (K − 1)(n − 1) = 2 degrees of freedom
    interval = crossed_mean_interval(np.array([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]]))
    assert interval["var_seed"] == 0.0 and interval["var_prompt"] == 0.0
    assert interval["se"] == pytest.approx(math.sqrt(1 / 12))
    assert interval["df"] == pytest.approx(2.0)
    # only the seed component truncated: V = MS_prompt / (nK), on n − 1 degrees of freedom. Seed means 0.6, 0.6;
    # prompt means 1, 0, ½, ½, 1: MS_prompt = 2·(0.16 + 0.36 + 0.01 + 0.01 + 0.16) / 4 = 0.35; residuals
    # 0, 0, ±½, ∓½, 0: MS_resid = 1 / 4
    y = np.array([[1.0, 0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0, 1.0]])
    interval = crossed_mean_interval(y)
    assert interval["var_seed"] == 0.0 and interval["var_prompt"] == pytest.approx((0.35 - 0.25) / 2)
    assert interval["se"] == pytest.approx(math.sqrt(0.35 / 10))
    assert interval["df"] == pytest.approx(4.0)
    # the test of ½ does not borrow the prompts' 4 df for a seed variance estimated at zero: K − 1 = 1
    block = win_rate_block(y)
    assert block["df"] == pytest.approx(4.0) and block["p_df"] == 1
    assert block["p_value"] == pytest.approx(1 - 2 * math.atan(0.1 / math.sqrt(0.035)) / math.pi)


def test_a_positive_seed_component_keeps_satterthwaites_df_for_the_test():
    y = np.array([[1.0, 0.5, 0.0], [1.0, 1.0, 0.5]])  # test_crossed_interval_by_hand: σ²_seed = 1/24, df = 100/41
    block = win_rate_block(y)
    assert block["variance"]["seed"] > 0 and block["p_df"] == pytest.approx(100 / 41)
    t = (2 / 3 - 0.5) / math.sqrt(5 / 72)
    assert block["p_value"] == pytest.approx(float(student_t_two_sided_p(t, 100 / 41)))


def test_constant_outcomes_give_a_zero_width_interval():
    interval = crossed_mean_interval(np.full((3, 5), 0.5))
    assert interval["low"] == interval["high"] == 0.5 and interval["se"] == 0.0


def simulate_outcomes(rng, sims: int, seeds: int, prompts: int):
    """Outcomes (sims, K, n) of a method vs SFT with a seed effect a_k ~ U(±0.05) and a prompt effect
    b_j ~ U(±0.45) on the win probability 0.55 + a_k + b_j of a decisive prompt, and ties on 75% of cells: half
    the prompts always tie (both answers right), the other half tie half the time. Truth: 0.75·½ + 0.25·0.55."""
    a = rng.uniform(-0.05, 0.05, size=(sims, seeds, 1))
    b = rng.uniform(-0.45, 0.45, size=(sims, 1, prompts))
    tie_probability = np.where(rng.random((sims, 1, prompts)) < 0.5, 0.5, 1.0)
    win = rng.random((sims, seeds, prompts)) < 0.55 + a + b
    y = np.where(rng.random((sims, seeds, prompts)) < tie_probability, 0.5, np.where(win, 1.0, 0.0))
    return y, 0.75 * 0.5 + 0.25 * 0.55


def test_coverage_of_the_crossed_interval_by_simulation():
    y, truth = simulate_outcomes(np.random.default_rng(0), sims=2000, seeds=4, prompts=300)
    assert np.mean(y == 0.5) == pytest.approx(0.75, abs=0.01)
    interval = crossed_mean_interval(y)
    coverage = np.mean((interval["low"] <= truth) & (truth <= interval["high"]))
    assert 0.93 <= coverage <= 0.97, coverage  # measured 0.9575
    # the per-seed means alone (t on K − 1 df) miss σ²_prompt / n: the prompts are shared by every seed
    per_seed = y.mean(axis=-1)  # (sims, K)
    half = float(student_t_quantile(0.975, 3.0)) * per_seed.std(axis=-1, ddof=1) / 2
    assert np.mean(np.abs(per_seed.mean(axis=-1) - truth) <= half) < 0.93  # measured 0.909


# ----------------------------------------------------------------------------- outcomes and aggregation


def test_pairwise_outcomes_count_ties_within_the_tolerance():
    assert pairwise_outcomes([1.0, 0.5, 0.3, 0.2], [0.5, 1.0, 0.3, 0.25], 0.1).tolist() == [1.0, 0.0, 0.5, 0.5]
    with pytest.raises(ValueError):
        pairwise_outcomes([float("nan")], [0.0], 0.0)
    assert head_to_head_pairs(["ppo", "dpo", "online_dpo"]) == [
        ("dpo", "ppo"),
        ("online_dpo", "ppo"),
        ("online_dpo", "dpo"),
    ]


PROMPTS = ["p0", "p1", "p2", "p3"]
GOLD = {  # per seed run, per model: gold scores of p0..p3
    0: {"sft": [0.5, 1.0, 0.0, 0.9], "dpo": [1.0, 1.0, 0.0, 0.5], "online_dpo": [1.0, 0.9, 0.4, 0.5]},
    1: {"sft": [0.5, 0.5, 0.0, 1.0], "dpo": [0.5, 1.0, 0.4, 1.0], "online_dpo": [0.8, 1.0, 0.4, 1.0]},
}


def write_eval(folder: Path, scores: dict[str, list[float]], key: str = "gold_score", reverse=()) -> Path:
    (folder / "eval" / "responses").mkdir(parents=True)
    for model, values in scores.items():
        rows = [
            {
                "prompt": p,
                "response": f"{model} says {v}",
                "reward": v,
                "kl": None if model == "sft" else v / 10,  # eval measures no KL of SFT to itself
                **({key: v} if key == "gold_score" else {}),
            }
            for p, v in zip(PROMPTS, values)
        ]
        rows = rows[::-1] if model in reverse else rows
        (folder / "eval" / "responses" / f"{model}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder / "eval"


def test_aggregation_of_fake_seed_runs_by_hand(tmp_path):
    eval_dirs = [write_eval(tmp_path / f"s{k}", GOLD[k], reverse=("dpo",) if k else ()) for k in (0, 1)]
    summary = aggregate_seed_runs(eval_dirs, ["dpo", "online_dpo"])
    assert summary["judge"] == "gold" and summary["n_seeds"] == 2 and summary["n_prompts"] == 4
    # dpo vs the same seed's sft: seed 0: 1, ½, ½, 0 -> 0.5; seed 1: ½, 1, 1, ½ -> 0.75
    dpo = summary["win_rate_vs_sft"]["dpo"]
    assert dpo["per_seed"] == [0.5, 0.75] and dpo["mean"] == 0.625
    assert dpo["sd"] == pytest.approx(0.25 / math.sqrt(2))
    expected = crossed_mean_interval(np.array([[1, 0.5, 0.5, 0], [0.5, 1, 1, 0.5]]))
    assert dpo["ci95_low"] == pytest.approx(max(0.0, float(expected["low"])))
    assert dpo["ci95_high"] == pytest.approx(min(1.0, float(expected["high"])))
    # online_dpo vs sft: seed 0: 1, 0, 1, 0 -> 0.5; seed 1: 1, 1, 1, ½ -> 0.875
    assert summary["win_rate_vs_sft"]["online_dpo"]["per_seed"] == [0.5, 0.875]
    # online_dpo vs dpo: seed 0: ½, 0, 1, ½ -> 0.5; seed 1: 1, ½, ½, ½ -> 0.625; ties 5 of 8
    head = summary["head_to_head"]["online_dpo_vs_dpo"]
    assert set(summary["head_to_head"]) == {"online_dpo_vs_dpo"}
    assert head["per_seed"] == [0.5, 0.625] and head["mean"] == 0.5625 and head["tie_rate"] == 0.625
    # gold score and good-rate (score ≥ 0.8), SFT included
    assert summary["gold_score"]["dpo"]["per_seed"] == pytest.approx([0.625, 0.725])
    assert summary["kl_to_ref"]["dpo"]["per_seed"] == pytest.approx([0.0625, 0.0725])  # the methods' answers' KL
    assert set(summary["kl_to_ref"]) == {"dpo", "online_dpo"}
    assert summary["gold_good_rate"]["sft"]["per_seed"] == [0.5, 0.25]
    assert summary["gold_good_rate"]["online_dpo"]["per_seed"] == [0.5, 0.75]  # 0.8 itself is good
    # Holm within each family: the two comparisons with SFT, and the one head-to-head (alone: unadjusted)
    vs_sft = summary["win_rate_vs_sft"]
    ordered = sorted(vs_sft.values(), key=lambda b: b["p_value"])
    assert ordered[0]["p_holm"] == pytest.approx(min(1.0, 2 * ordered[0]["p_value"]))
    assert ordered[1]["p_holm"] == pytest.approx(max(ordered[0]["p_holm"], ordered[1]["p_value"]))
    assert head["p_holm"] == head["p_value"]
    # the sensitivity check: all three comparisons as one family
    every = sorted([*vs_sft.values(), head], key=lambda b: b["p_value"])
    running = 0.0
    for rank, block in enumerate(every):
        running = max(running, min(1.0, (3 - rank) * block["p_value"]))
        assert block["p_holm_all"] == pytest.approx(running)


def test_aggregation_without_gold_falls_back_to_the_reward_judge(tmp_path):
    scores = {"sft": [0.0, 0.0, 0.0, 0.0], "ppo": [0.05, 0.5, -0.5, 0.0]}
    eval_dirs = [write_eval(tmp_path / f"s{k}", scores, key="reward") for k in (0, 1)]
    summary = aggregate_seed_runs(eval_dirs, ["ppo"], reward_tolerance=0.1)
    assert summary["judge"] == "reward" and "gold_score" not in summary and "reward" in summary["judge_note"]
    assert summary["win_rate_vs_sft"]["ppo"]["per_seed"] == [0.5, 0.5]  # 0.05 is within the tolerance: a tie


def test_aggregation_rejects_seed_runs_on_different_prompts(tmp_path):
    first = write_eval(tmp_path / "s0", GOLD[0])
    second = write_eval(tmp_path / "s1", GOLD[1])
    lines = (second / "responses" / "sft.jsonl").read_text().splitlines()
    (second / "responses" / "sft.jsonl").write_text("\n".join(lines[:3]) + "\n")
    with pytest.raises(UserError, match="same prompts"):
        aggregate_seed_runs([first, second], ["dpo"])
    with pytest.raises(UserError, match="did not evaluate 'ppo'"):
        aggregate_seed_runs([first, second], ["ppo"])


# ----------------------------------------------------------------------------- the report


def fake_seeds_summary() -> dict:
    def block(mean, low, high, values, sd=0.02, p_holm=None, p_holm_all=None):
        holm = {} if p_holm is None else {"p_holm": p_holm}
        holm |= {} if p_holm_all is None else {"p_holm_all": p_holm_all}
        return {"mean": mean, "ci95_low": low, "ci95_high": high, "per_seed": values, "sd": sd, "tie_rate": 0.7, **holm}

    return {
        "judge": "gold",
        "n_seeds": 2,
        "n_prompts": 300,
        "methods": ["ppo", "dpo", "online_dpo"],
        "seeds": [{"method_seed": 0, "eval_seed": 1234, "folder": "."}, {"method_seed": 1, "eval_seed": 1235}],
        "win_rate_vs_sft": {
            "ppo": block(0.55, 0.52, 0.58, [0.568, 0.532], p_holm=0.012, p_holm_all=0.03),
            "dpo": block(0.53, 0.49, 0.57, [0.54, 0.52]),
            "online_dpo": block(0.56, 0.51, 0.61, [0.57, 0.55]),
        },
        "gold_score": {m: block(0.5 + i / 100, 0.45, 0.6, [0.5, 0.5]) for i, m in enumerate(["sft", "ppo", "dpo"])},
        "gold_good_rate": {"sft": block(0.493, 0.45, 0.53, [0.49, 0.5])},
        "kl_to_ref": {"ppo": block(0.414, 0.3, 0.5, [0.4, 0.428])},
        "head_to_head": {
            "dpo_vs_ppo": block(0.46, 0.43, 0.49, [0.45, 0.47], p_holm=0.03, p_holm_all=0.06),
            "ppo_vs_online_dpo": block(0.45, 0.42, 0.48, [0.45, 0.46], p_holm=0.01, p_holm_all=0.02),
            "online_dpo_vs_dpo": block(0.53, 0.48, 0.58, [0.52, 0.54], p_holm=0.2),
            "raft_vs_dpo": block(0.54, 0.51, 0.57, [0.53, 0.55], p_holm=0.09),
        },
    }


def test_the_report_shows_the_seed_spread():
    text = section_seeds(RunData(summary={}, seeds=fake_seeds_summary()))
    assert text.startswith("### Seed spread: the methods, on this run's data, SFT and reward model")
    assert "| PPO | 0.550 [0.520, 0.580] | 0.012 | 0.030 | 0.020 | 0.568, 0.532 |" in text
    assert "| SFT | (reference) | n/a | n/a | n/a | n/a | 0.500 [0.450, 0.600] | 0.493 [0.450, 0.530] |" in text
    assert "| online DPO | 0.560 [0.510, 0.610] | n/a | n/a |" in text  # no p-value: n/a, not a guess
    assert "| 0.568, 0.532 | 0.510 [0.450, 0.600] | n/a | 0.41 |" in text  # PPO's KL to SFT, its mean over seeds
    assert "| SFT | (reference) |" in text and "| 0.493 [0.450, 0.530] | 0 |" in text
    # the headline pair first; each head-to-head's verdict is Holm's, not the unadjusted interval's
    assert text.index("online DPO vs DPO | 0.530") < text.index("DPO vs PPO | 0.460")
    assert "| 0.700 | not separated (Holm p 0.2" in text
    # "better" needs both families: 3 with SFT and 4 head-to-heads make one family of 7
    assert "| PPO better in its family (Holm p 0.030), not in one of all 7 (0.060) |" in text
    assert "| online DPO better (Holm p 0.010; all 7: 0.020) |" in text
    assert "RAFT vs DPO | 0.540 [0.510, 0.570]" in text and "| not separated (Holm p 0.09" in text  # CI above ½
    assert "method seeds (0, 1;" in text and "`gold`" in text and "conditional on this run's data" in text
    assert "Only 2 seeds" in text  # fewer than 4: the interval is said to cover less
    four_seeds = {**fake_seeds_summary(), "n_seeds": 4}
    assert "covers less than 95%" in text and "covers less than 95%" not in section_seeds(RunData({}, seeds=four_seeds))
    # both scopes: the whole pipeline's spread first, then the methods'
    both = section_seeds(RunData({}, seeds=fake_seeds_summary(), pipeline_seeds=four_seeds))
    assert both.index("### Seed spread: the whole pipeline redrawn") < both.index("### Seed spread: the methods")
    assert "`pipeline_seeds/summary.json`" in both and "covers the data, SFT and reward model" in both


def test_the_seed_section_is_in_the_report_only_when_seeds_ran():
    summary = {"eval": {"models": {}}}
    assert "### Seed spread" in render_report(RunData(summary=summary, seeds=fake_seeds_summary()))
    assert "Seed spread" not in render_report(RunData(summary=summary))


# ----------------------------------------------------------------------------- part4_eval/seeds.py


def test_seeds_needs_the_base_stages_and_names_the_command(tmp_path):
    with pytest.raises(UserError) as error:
        seeds_script.main(["--preset", "tiny", "--output-dir", str(tmp_path), "--seeds", "2", "ppo.lr=1e-4"])
    message = str(error.value)
    assert "\n" not in message
    assert f"bash run_all.sh --preset tiny --output-dir {tmp_path} --only data,sft,reward ppo.lr=1e-4`" in message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--seeds", "1"], "at least 2 seeds"),
        (["--seeds", "2", "run.method_seed=3"], "drop the run.method_seed override"),
        (["--seeds", "2", "--methods", "ppo,sft"], "unknown method(s) sft in --methods"),
    ],
)
def test_seeds_rejects_bad_arguments(tmp_path, argv, message):
    run = RunDir(tmp_path)
    for stage in ("data", "sft", "reward"):
        run.mark_complete(stage, tiny_config(), {})
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        seeds_script.main(["--preset", "tiny", "--output-dir", str(tmp_path), *argv])


def test_seed_folder_links_the_base_stages_and_their_summary(tmp_path):
    base = RunDir(tmp_path / "run")
    for stage in ("data", "sft", "reward", "ppo"):
        base.stage(stage).mkdir(parents=True)
    sections = {"data": {"n": 1}, "sft": {"x": 2}, "reward_model": {"offset": 0.3}, "ppo": {"win": 0.6}, "eval": {}}
    per_stage = {
        "timing_s": {"data": 1.0, "sft": 2.0, "reward": 3.0, "ppo": 4.0},
        "cpu_threads": {"data": 2, "sft": 2, "reward": 2, "ppo": 1},
    }
    write_json_atomic(base.summary_path, {**sections, **per_stage})
    folder = base.root / "seeds" / "seed_1"
    for _ in range(2):  # a second call (a resumed seeds.py) keeps the links
        seeds_script.link_seed_folder(base, folder, ["data", "sft", "reward"])
    for stage in ("data", "sft", "reward"):
        assert (folder / stage).is_symlink() and os.readlink(folder / stage) == f"../../{stage}"
        assert (folder / stage).resolve() == base.stage(stage).resolve()
    summary = json.loads((folder / "summary.json").read_text())
    assert summary == {
        "data": {"n": 1},
        "sft": {"x": 2},
        "reward_model": {"offset": 0.3},
        "timing_s": {"data": 1.0, "sft": 2.0, "reward": 3.0},
        "cpu_threads": {"data": 2, "sft": 2, "reward": 2},
    }
    (folder / "sft").unlink()
    (folder / "sft").mkdir()
    with pytest.raises(UserError, match="is not a link"):
        seeds_script.link_seed_folder(base, folder, ["data", "sft", "reward"])


# ----------------------------------------------------------------------------- one real run, 2 seeds


SEEDS_OVERRIDES = [
    *TINY_TEST_OVERRIDES,
    "ppo.total_episodes=64",
    "ppo.batch_size=32",
    "ppo.eval_prompts=16",
    "dpo.max_train_pairs=128",
    "dpo.eval_prompts=16",
    "eval.num_prompts=40",
    "eval.best_of_n=2",
    "eval.best_of_n_prompts=4",
    "eval.suites=false",
]


@pytest.mark.slow
def test_seeds_script_end_to_end(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    command = [
        sys.executable,
        str(REPO / "part4_eval" / "seeds.py"),
        "--preset",
        "tiny",
        "--output-dir",
        str(run),
        "--seeds",
        "2",
        "--methods",
        "ppo,dpo",
        *SEEDS_OVERRIDES,
    ]
    env = {key: value for key, value in os.environ.items() if key != "OPENAI_API_KEY"}
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=1800)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    progress = [line for line in result.stdout.splitlines() if line.startswith("[seeds] seed ")]
    assert len(progress) == 2 * 3  # one line per stage (ppo, dpo, eval) per seed

    # seed 0 is the run itself; seed 1 trained on its data, SFT and reward model, with other seeds
    seed_folder = run / "seeds" / "seed_1"
    assert all((seed_folder / stage).is_symlink() for stage in ("data", "sft", "reward"))
    cfg, cfg1 = tiny_config(*SEEDS_OVERRIDES), tiny_config(*SEEDS_OVERRIDES, "run.method_seed=1")
    assert RunDir(run).is_complete("ppo", cfg) and RunDir(run).is_complete("eval", cfg)
    assert RunDir(seed_folder).is_complete("ppo", cfg1) and RunDir(seed_folder).is_complete("dpo", cfg1)
    for stage in ("ppo", "dpo"):
        assert (run / stage / "model" / "model.safetensors").read_bytes() != (
            seed_folder / stage / "model" / "model.safetensors"
        ).read_bytes(), stage
    decoding = json.loads((seed_folder / "summary.json").read_text())["eval"]["decoding"]
    assert decoding["seed"] == 1235 and decoding["num_prompts"] == 40

    spread = json.loads((run / "seeds" / "summary.json").read_text())
    assert spread["judge"] == "gold" and spread["n_seeds"] == 2 and spread["n_prompts"] == 40
    assert [entry["folder"] for entry in spread["seeds"]] == [".", "seeds/seed_1"]
    assert set(spread["win_rate_vs_sft"]) == {"ppo", "dpo"} and set(spread["head_to_head"]) == {"dpo_vs_ppo"}
    base_win = json.loads((run / "summary.json").read_text())["eval"]["win_rates"]["gold"]["ppo_vs_sft"]["win_rate"]
    ppo = spread["win_rate_vs_sft"]["ppo"]
    assert ppo["per_seed"][0] == pytest.approx(base_win)  # seed 0's value is the run's own eval
    assert ppo["ci95_low"] <= ppo["mean"] <= ppo["ci95_high"]
    for name in ("sft", "ppo", "dpo"):
        assert len(spread["gold_score"][name]["per_seed"]) == 2

    # a second call reuses every stage
    again = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sum("complete, reused" in line for line in again.stdout.splitlines()) == 6


def test_pipeline_scope_redraws_the_task_and_seeds_but_keeps_the_test_split():
    cfg = tiny_config("run.seed=3", "data.embedded.seed=5", "data.embedded.test_seed=11")
    assert seeds_script.pipeline_seed_overrides(cfg, 2) == [
        "run.seed=5",
        "data.embedded.seed=7",
        "data.embedded.test_seed=11",
    ]
    # no test_seed: the test split stays the base run's task seed
    unsealed = tiny_config("data.embedded.test_seed=null")
    expected = ["data.embedded.seed=1", "data.embedded.test_seed=0"]
    assert seeds_script.pipeline_seed_overrides(unsealed, 1)[1:] == expected
    # real data: its split is by a hash of each prompt, so only the seeds change
    real = tiny_config("data.path=/some/pairs.jsonl")
    assert seeds_script.pipeline_seed_overrides(real, 1) == ["run.seed=1"]
    # each scope writes its own folder
    assert seeds_script.SCOPE_DIRS == {"methods": "seeds", "pipeline": "pipeline_seeds"}
