"""The over-optimisation study (Gao et al. 2022): its math by hand (rlhf/analysis/overoptimization.py), its
figure, and the command end to end (part4_eval/overoptimization.py) on the tiny test run."""

import itertools
import json
import math
import shutil

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, run_script

from rlhf.analysis.overoptimization import (
    best_of_n_points,
    eval_every_for,
    eval_points,
    kl_optimum_points,
    sqrt_kl,
    tilted_kl,
    tilted_weights,
    tilted_win_rate,
)
from rlhf.analysis.plots import plot_overoptimization


def close(actual, expected, tol=1e-6):  # scores are float32
    assert math.isclose(actual, expected, rel_tol=tol, abs_tol=tol), (actual, expected)


def test_sqrt_kl_by_hand():
    close(sqrt_kl(2.25), 1.5)
    assert sqrt_kl(0.0) == 0.0 and sqrt_kl(-0.003) == 0.0  # a Monte Carlo estimate just below 0 counts as 0


def test_best_of_n_points_by_hand():
    # 2 prompts x 4 samples; the proxy picks, gold is only reported
    proxy = torch.tensor([[0.1, 0.5, 0.2, 0.9], [0.3, 0.2, 0.8, 0.4]])
    gold = torch.tensor([[1.0, 0.0, 1.0, -0.5], [0.5, 1.0, 0.0, 1.0]])
    n1, n2, n4 = best_of_n_points(proxy, gold, [1, 2, 4])
    # n=1: the first samples; n=2: samples 1 and 0; n=4: samples 3 and 2
    close(n1["proxy_score"], (0.1 + 0.3) / 2), close(n1["gold_score"], (1.0 + 0.5) / 2)
    close(n2["proxy_score"], (0.5 + 0.3) / 2), close(n2["gold_score"], (0.0 + 0.5) / 2)
    close(n4["proxy_score"], (0.9 + 0.8) / 2), close(n4["gold_score"], (-0.5 + 0.0) / 2)
    # KL_bon = log n - (n - 1)/n: 0, log 2 - 1/2, log 4 - 3/4 (Gao et al. 2022, sec. 2)
    close(n1["kl"], 0.0), close(n2["kl"], math.log(2) - 0.5), close(n4["kl"], math.log(4) - 0.75)
    close(n4["sqrt_kl"], math.sqrt(math.log(4) - 0.75))
    assert [p["n"] for p in (n1, n2, n4)] == [1, 2, 4]
    assert best_of_n_points(proxy, None, [2])[0]["gold_score"] is None
    with pytest.raises(ValueError, match="best-of-8 needs 1 <= n <= 4"):
        best_of_n_points(proxy, gold, [8])


def test_eval_points_read_the_held_out_rows_of_a_stage():
    rows = [
        {"step": 0, "ppo/eval/kl_to_ref": 0.0, "ppo/eval/reward_mean": 0.1, "ppo/eval/gold_score_mean": 0.6},
        {"step": 1, "ppo/objective/scores": 0.3},  # a training row: not a point
        {"step": 2, "ppo/eval/kl_to_ref": 0.25, "ppo/eval/reward_mean": 0.4, "ppo/eval/sft_reward_mean": 0.1},
        {"step": 1, "ppo/eval/kl_to_ref": -0.01, "ppo/eval/reward_mean": 0.2, "ppo/eval/gold_score_mean": 0.7},
    ]
    assert eval_points(rows, "ppo", batch_size=64) == [
        {"iteration": 0, "episodes": 0, "kl": 0.0, "sqrt_kl": 0.0, "proxy_score": 0.1, "gold_score": 0.6},
        {"iteration": 1, "episodes": 64, "kl": -0.01, "sqrt_kl": 0.0, "proxy_score": 0.2, "gold_score": 0.7},
        {"iteration": 2, "episodes": 128, "kl": 0.25, "sqrt_kl": 0.5, "proxy_score": 0.4, "gold_score": None},
    ]
    assert eval_points(rows, "grpo", batch_size=64) == []


def test_eval_every_gives_at_least_the_asked_points():
    assert eval_every_for(16, 4) == 4  # evaluations after 4, 8, 12 and the final one at 16
    assert eval_every_for(18, 4) == 4  # 4, 8, 12, 16 and 18
    assert eval_every_for(3, 4) == 1  # fewer iterations than points: every one
    with pytest.raises(ValueError):
        eval_every_for(0, 4)


def test_plot_overoptimization_writes_one_figure(tmp_path):
    point = {"sqrt_kl": 0.0, "proxy_score": 0.1, "gold_score": 0.6}
    curves = [
        {
            "label": "PPO vs RM",
            "method": "ppo",
            "reward": "rm",
            "points": [point, {**point, "sqrt_kl": 0.5, "proxy_score": 0.4}],
        },
        {"label": "PPO vs gold", "method": "ppo", "reward": "gold", "points": [point]},
        {"label": "best-of-N", "method": "best_of_n", "reward": "rm", "points": []},
    ]
    assert plot_overoptimization(curves, tmp_path / "figure.png")
    assert (tmp_path / "figure.png").stat().st_size > 10_000
    assert not plot_overoptimization([curves[-1]], tmp_path / "none.png") and not (tmp_path / "none.png").exists()


# ---------------------------------------------------------------- the command's plan


def overopt_script():
    """part4_eval/overoptimization.py as a module (the part folders are scripts, not packages)."""
    import importlib.util
    import sys

    from conftest import REPO

    if "overoptimization_script" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "overoptimization_script", REPO / "part4_eval" / "overoptimization.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # registered before it runs: its dataclass looks itself up there
        spec.loader.exec_module(module)
    return sys.modules["overoptimization_script"]


def test_plan_variants_one_run_per_method_reward_and_kl_coef():
    from rlhf.core.errors import UserError
    from rlhf.stage.config import load_config, preset_path

    script = overopt_script()
    cfg = load_config(preset_path("tiny"))  # ppo: 1024 episodes / 64; grpo: 1536 / 64

    def plan(*flags, embedded=True):
        return script.plan_variants(script.parse_args(list(flags)), cfg, embedded)

    variants = plan()
    assert [v.name for v in variants] == ["ppo_rm", "ppo_gold", "grpo_rm", "grpo_gold"]
    assert plan("--methods", "none") == []  # best-of-N and the KL-regularised optima only
    ppo_gold = variants[1]
    assert (ppo_gold.iterations, ppo_gold.eval_every) == (16, 4)  # 4 checkpoints after the start: 4, 8, 12, 16
    assert ppo_gold.overrides == [
        "ppo.reward=rlhf.task:gold_rewards",
        "ppo.kl_coef=0.01",
        "ppo.total_episodes=1024",
        "ppo.eval_every=4",
        "ppo.eval_prompts=200",
        "ppo.kl_target=null",
    ]
    assert (variants[2].iterations, variants[2].eval_every) == (24, 6)
    several = plan(
        "--methods", "grpo", "--rewards", "rm", "--kl-coefs", "0.01,0.1", "--grpo-episodes", "640", "--points", "5"
    )
    assert [(v.name, v.kl_coef, v.iterations, v.eval_every) for v in several] == [
        ("grpo_rm_kl0.01", 0.01, 10, 2),
        ("grpo_rm_kl0.1", 0.1, 10, 2),
    ]
    assert [v.name for v in plan(embedded=False)] == ["ppo_rm", "grpo_rm"]  # no gold judge off the embedded task
    for flags, message in [
        (["--methods", "dpo"], "--methods 'dpo': choose from ppo, grpo"),
        (["--rewards", "gold"], "--rewards gold needs the embedded task's gold judge"),
        (["--kl-coefs", "low"], "--kl-coefs 'low' must be comma-separated numbers"),
        (["--points", "0"], "--points 0 must be at least 1"),
        (["--ppo-episodes", "10"], "--ppo-episodes 10 is less than one batch (ppo.batch_size=64)"),
    ]:
        with pytest.raises(UserError, match=None) as info:
            plan(*flags, embedded=flags != ["--rewards", "gold"])
        assert message in str(info.value), str(info.value)


def test_link_inputs_makes_a_sub_run_that_reads_the_main_run(tmp_path):
    script = overopt_script()
    for stage in ("data", "sft", "reward"):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "complete.json").write_text("{}")
    sub = tmp_path / "overopt" / "ppo_rm"
    script.link_inputs(tmp_path, sub)
    script.link_inputs(tmp_path, sub)  # idempotent
    assert all(
        (sub / stage).is_symlink() and (sub / stage / "complete.json").is_file() for stage in ("data", "sft", "reward")
    )
    assert str((sub / "sft").readlink()) == "../../sft"  # relative: the run folder can move


# ---------------------------------------------------------------- the command, end to end


# Two iterations per run, evaluations on 16 prompts: every code path, in about a minute per variant.
FAST = [
    "ppo.batch_size=32",
    "ppo.micro_batch_size=16",
    "ppo.forward_batch_size=64",
    "ppo.epochs=1",
    "ppo.lr=1e-4",
    "ppo.max_new_tokens=24",
    "ppo.save_every=0",
    "ppo.samples_every=0",
    "ppo.cpu_threads=1",
    "grpo.batch_size=32",
    "grpo.group_size=4",
    "grpo.micro_batch_size=16",
    "grpo.forward_batch_size=64",
    "grpo.lr=1e-4",
    "grpo.max_new_tokens=24",
    "grpo.save_every=0",
    "grpo.samples_every=0",
    "grpo.cpu_threads=1",
]


@pytest.mark.slow
def test_overoptimization_command_end_to_end(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    flags = [
        "--ppo-episodes",
        "64",
        "--grpo-episodes",
        "64",
        "--points",
        "2",
        "--eval-prompts",
        "16",
        "--best-of-n",
        "1,2,4",
    ]
    result = run_script("part4_eval/overoptimization.py", run, *flags, *TINY_TEST_OVERRIDES, *FAST)
    assert "(4/4) grpo_gold done" in result.stdout
    report = json.loads((run / "overopt" / "overoptimization.json").read_text())
    curves = {curve["label"]: curve for curve in report["curves"]}
    assert list(curves) == [
        "PPO vs RM",
        "PPO vs gold",
        "GRPO vs RM",
        "GRPO vs gold",
        "best-of-N (RM picks)",
        "KL-regularised optimum vs RM",
        "KL-regularised optimum vs gold",
    ]
    for label in ("PPO vs RM", "PPO vs gold", "GRPO vs RM", "GRPO vs gold"):
        points = curves[label]["points"]
        # 2 iterations, an evaluation every 1: before training, after 1, and the final one
        assert [p["iteration"] for p in points] == [0, 1, 2], (label, points)
        assert points[0]["kl"] == 0.0 and all(p["gold_score"] is not None for p in points)
        assert all(p["sqrt_kl"] == math.sqrt(max(p["kl"], 0.0)) for p in points)
    method = {"PPO": "ppo", "GRPO": "grpo"}
    for label in ("PPO vs gold", "GRPO vs gold"):  # trained on the gold function; its results say so
        summary = json.loads((run / "overopt" / curves[label]["run"].rsplit("/", 1)[-1] / "summary.json").read_text())
        assert summary[method[label.split()[0]]]["reward_source"] == "rlhf.task:gold_rewards"
    bon = curves["best-of-N (RM picks)"]["points"]
    assert [p["n"] for p in bon] == [1, 2, 4]
    assert [p["kl"] for p in bon] == [0.0, math.log(2) - 0.5, math.log(4) - 0.75]
    assert (
        bon[0]["proxy_score"] <= bon[1]["proxy_score"] <= bon[2]["proxy_score"]
    )  # the RM picks: its score can only rise
    for reward in ("RM", "gold"):  # pi* at each reachable budget (<= log 4 with 4 samples), tilted by its reward
        optimum = curves[f"KL-regularised optimum vs {reward}"]["points"]
        assert optimum and all(round(p["kl"], 6) in (0.05, 0.1, 0.2, 0.4, 0.8, 1.2) for p in optimum)
        key = "proxy_score" if reward == "RM" else "gold_score"
        assert all(a[key] <= b[key] + 1e-9 for a, b in itertools.pairwise(optimum)), optimum  # its own reward rises
        assert all(0 <= p["gold_win_rate_vs_sft"] <= 1 for p in optimum)
    assert (run / "overopt" / "overoptimization.png").stat().st_size > 10_000
    assert (run / "overopt" / "ppo_rm" / "sft").is_symlink() and not (
        run / "overopt" / "ppo_rm" / "sft" / "checkpoint"
    ).exists()

    # A second run reuses everything: every stage skips itself and best-of-n comes from its cache.
    again = run_script("part4_eval/overoptimization.py", run, *flags, *TINY_TEST_OVERRIDES, *FAST)
    assert again.stdout.count("already complete") == 4 and "best-of-n: reusing" in again.stdout
    assert json.loads((run / "overopt" / "overoptimization.json").read_text())["curves"] == report["curves"]


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_overoptimization_flag_mistakes_are_one_line_errors(tmp_path):
    result = run_script("part4_eval/overoptimization.py", tmp_path, "--rewards", "gold", check=False)
    assert result.returncode == 2 and "stages 'data', 'sft', 'reward' have not completed" in result.stderr
    assert "build them with: bash run_all.sh --only data,sft,reward --preset tiny" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_tilted_weights_kl_and_win_rate_by_hand():
    # one prompt, two samples, r = (0, log 3), beta 1: pi* puts 1/4 and 3/4 on them
    weights = tilted_weights(torch.tensor([[0.0, math.log(3)]], dtype=torch.float64), 1.0)
    close(weights[0, 0].item(), 0.25), close(weights[0, 1].item(), 0.75)
    # KL = 1/4 log(2/4) + 3/4 log(6/4)
    close(tilted_kl(weights), 0.25 * math.log(0.5) + 0.75 * math.log(1.5))
    # gold (0, 1): sample 0 beats pi_ref's samples 0 / 1 with 1/2 / 0, sample 1 with 1 / 1/2
    close(tilted_win_rate(weights, torch.tensor([[0.0, 1.0]])), 0.25 * (0.5 + 0) / 2 + 0.75 * (1 + 0.5) / 2)
    uniform = torch.full((3, 4), 0.25, dtype=torch.float64)
    close(tilted_kl(uniform), 0.0), close(tilted_win_rate(uniform, torch.randn(3, 4)), 0.5)
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    close(tilted_kl(one_hot), math.log(4))


def test_kl_optimum_points_hit_each_budget_and_skip_unreachable_ones():
    scores = torch.tensor([[0.0, 1.0, 2.0, 3.0], [1.0, 0.5, 0.0, 0.2]])
    gold = torch.tensor([[0.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    proxy = scores * 2
    points = kl_optimum_points(scores, proxy, gold, [0.1, 0.5, 1.0, math.log(4)])
    assert [round(p["kl"], 6) for p in points] == [0.1, 0.5, 1.0]  # log 4 needs beta -> 0: left out
    for point in points:  # each point is pi* at its beta, recomputed here from the definition
        weights = torch.softmax(scores.double() / point["beta"], dim=1)
        close(point["proxy_score"], (weights * proxy).sum(1).mean().item())
        close(point["gold_score"], (weights * gold).sum(1).mean().item())
        close(point["sqrt_kl"], math.sqrt(point["kl"]))
    assert points[0]["beta"] > points[1]["beta"] > points[2]["beta"]  # more KL, smaller beta
    assert points[0]["proxy_score"] < points[1]["proxy_score"] < points[2]["proxy_score"]
    assert kl_optimum_points(scores, proxy, None, [0.5])[0]["gold_win_rate_vs_sft"] is None
