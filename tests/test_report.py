"""The report stage: markdown helpers on hand-made inputs, and `make_report.py` through its real
command line on a fixture run folder written by hand (no training, no model; seconds)."""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from bad_inputs.helpers import run_in_process
from conftest import REPO
from safetensors.numpy import save_file

from rlhf import report as R
from rlhf.report.html import markdown_to_html
from rlhf.report.samples import PromptSamples, pick_disagreements, score_key, side_by_side
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# ----------------------------------------------------------------------------- formatting helpers


def test_markdown_table_exact_text():
    table = R.markdown_table(["model", "win rate", "note"], [["PPO", "0.625", "a|b"], ["SFT", None, "two\nlines"]])
    assert table == (
        "| model | win rate | note |\n|---|---:|---:|\n| PPO | 0.625 | a\\|b |\n| SFT | n/a | two<br>lines |"
    )


def test_markdown_table_alignment_and_bad_rows():
    assert R.markdown_table(["a", "b"], [[1, 2]], align="lc") == "| a | b |\n|---|:---:|\n| 1 | 2 |"
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        R.markdown_table(["a", "b", "c"], [[1, 2]])
    with pytest.raises(ValueError, match="align"):
        R.markdown_table(["a", "b"], [], align="l")


@pytest.mark.parametrize(
    "value, digits, text",
    [
        (0.625, 3, "0.625"),
        (0.62549, 3, "0.625"),
        (1234, 3, "1,234"),  # ints: thousands separator, no decimals
        (1234.5678, 1, "1,234.6"),
        (None, 3, "n/a"),
        (math.nan, 3, "n/a"),
        (math.inf, 3, "n/a"),
        ("sigmoid", 3, "sigmoid"),
        (True, 3, "yes"),
    ],
)
def test_fmt(value, digits, text):
    assert R.fmt(value, digits) == text


def test_compound_formats():
    assert R.fmt_pm(0.5, 0.25) == "0.500 ± 0.250"
    assert R.fmt_pm(0.5, None) == "0.500"
    assert R.fmt_pm(None, 0.1) == "n/a"
    assert R.fmt_ci(0.5124, 0.7261) == "[0.512, 0.726]"
    assert R.fmt_ci(None, 0.7) == "n/a"
    assert [R.fmt_seconds(s) for s in (12.34, 150, 7200, None)] == ["12.3 s", "2.5 min", "2.00 h", "n/a"]
    assert [R.fmt_params(n) for n in (1_234_800, 124_439_808, 2_500, 1.5e9)] == ["1.23M", "124.44M", "2.5K", "1.50B"]


def test_escape_and_code_block():
    assert R.escape_cell("x" * 10, limit=5) == "xxxx…"
    # a fence one backtick longer than the longest run inside, so the block cannot be closed early
    assert R.code_block("a ```` b") == "`````text\na ```` b\n`````"
    assert R.code_block("\n\nHuman: hi\n\nAssistant:") == "```text\nHuman: hi\n\nAssistant:\n```"


def test_model_names_order_and_pairings():
    assert [R.model_label(n) for n in ("sft", "best_of_16", "chosen", "base", "mystery")] == [
        "SFT",
        "best-of-16",
        "dataset chosen",
        "base",
        "mystery",
    ]
    assert R.order_models(["zeta", "chosen", "best_of_4", "dpo", "best_of_16", "sft", "ppo", "base"]) == [
        "base",
        "sft",
        "ppo",
        "dpo",
        "best_of_4",
        "best_of_16",
        "chosen",
        "zeta",
    ]
    assert R.parse_pairing("best_of_16_vs_sft") == ("best_of_16", "sft")
    assert R.parse_pairing("ppo_vs_chosen") == ("ppo", "chosen")
    assert R.parse_pairing("no_pairing") is None


def test_win_rate_matrix_fills_mirrors_as_one_minus():
    names, cells = R.win_rate_matrix(
        {
            "ppo_vs_sft": {"win_rate": 0.75, "ci95_low": 0.625, "ci95_high": 0.875},
            "dpo_vs_sft": {"win_rate": 0.5},
            "ppo_vs_dpo": {"win_rate": None},
        }
    )
    assert names == ["sft", "ppo", "dpo"]
    sft, ppo, dpo = 0, 1, 2
    assert cells[ppo][sft] == (0.75, True, (0.625, 0.875))
    assert cells[sft][ppo] == (0.25, False, (0.125, 0.375))  # 1 - 0.75 and the interval mirrored: exact, ties halved
    assert cells[sft][dpo] == (0.5, False, None)  # no interval recorded
    assert cells[ppo][dpo] is None and cells[dpo][ppo] is None  # not judged (None win rate): n/a
    assert cells[sft][sft] is None


def test_empty_run_renders_every_section_as_a_note():
    problems = []
    text = R.render_report(R.RunData(summary={}), problems)
    assert problems == []
    assert text.startswith("# RLHF run report")
    for line in (
        "No `data` section in summary.json",
        "No `reward_model` section",
        "No `eval` section",
        "No response files",
        "No stage timings",
        "External: published numbers",
    ):
        assert line in text, line
    assert "### Win rates" not in text and "### Best-of-N" not in text  # one note for a missing eval, not one per table
    assert "\n\n\n" not in text


@pytest.mark.parametrize(
    "summary",
    [
        {
            "data": None,
            "eval": {
                "models": {"sft": None},
                "win_rates": {"gold": None, "openai": {}},
                "best_of_n": None,
                "suites": {"s": {"sft": None}, "t": None},
                "judges": {"openai": "oops"},
            },
            "timing_s": {"sft": "x"},
        },
        {
            "data": {"source": None, "lengths": {"train": None}},
            "reward_model": {"error_counts": {"test": {"a": 1}}},
            "eval": {"models": [], "judge_agreement": {"x": {}}},
        },
        {"eval": None, "ppo": {"steps": None}, "timing_s": None},
    ],
)
def test_partial_or_null_inputs_render_without_errors(summary):
    problems = []
    R.render_report(R.RunData(summary=summary), problems)
    assert problems == []


def test_training_row_per_stage_shows_its_final_metrics():
    summary = {
        "grpo": {
            "iterations": 8,
            "group_size": 4,
            "reward_mean": 0.5,
            "peak_memory_mb": 812.4,
            "peak_memory_source": "max_rss",
        },
        "timing_s": {"grpo": 150.0},
    }
    text = R.section_training(R.RunData(summary=summary))
    assert "| GRPO | 8 iterations | group size G 4; val RM reward 0.500 | 2.5 min | 812 MB (max_rss) |" in text
    assert "_PPO: not in this run (no `ppo` section in summary.json)._" in text
    raft = {"raft": {"rounds": 4, "episodes": 2048, "samples_per_prompt": 4, "top_k": 1, "kl_to_ref": 0.25}}
    text = R.section_training(R.RunData(summary=raft))
    assert (
        "| RAFT | 4 rounds | episodes 2,048; samples per prompt N 4; kept per prompt 1; val KL to ref 0.250 |" in text
    )


def test_a_section_that_breaks_becomes_a_visible_note():
    summary = {"eval": {"models": {"sft": {"reward_mean": 0.1}}, "win_rates": {"gold": {"ppo_vs_sft": "not a dict"}}}}
    problems = []
    text = R.render_report(R.RunData(summary=summary), problems)
    assert len(problems) == 1 and problems[0].startswith("section 'win_rates' failed to render")
    assert "The `win_rates` section failed to render" in text
    assert "## Failure and capability suites" in text  # later sections still render


def test_report_figures_draw_nothing_from_nothing(tmp_path):
    from rlhf.analysis import plots

    path = tmp_path / "figure.png"
    assert plots.plot_reward_vs_kl({"SFT": {"kl": None, "reward": math.nan}}, [], "best-of-N", path) is False
    assert plots.plot_model_rewards({"SFT": [], "PPO": [None, math.nan]}, path) is False
    assert plots.plot_model_lengths({}, path, budget=64) is False
    assert plots.plot_win_rate_heatmaps({"gold": ([], [])}, path) is False
    assert (
        plots.plot_stage_curves({"sft": [{"step": 1, "sft/train/other": 1.0}]}, plots.REPORT_CURVE_KEYS, path) is False
    )
    assert not path.exists()
    # one constant-valued model still draws (a violin needs spread; the helper adds a hair of it)
    assert plots.plot_model_rewards({"SFT": [0.5, 0.5]}, path) is True and path.read_bytes()[:8] == PNG_MAGIC


# ----------------------------------------------------------------------------- the fixture run

WIN_PPO_SFT = {
    "win_rate": 0.625,
    "loss_rate": 0.375,
    "tie_rate": 0.0,
    "wins": 50,
    "losses": 30,
    "ties": 0,
    "n": 80,
    "n_invalid": 0,
    "ci95_low": 0.5124,
    "ci95_high": 0.7261,
    "sign_test_p": 0.03299,  # 2 sum_{k <= 30} C(80, k) / 2^80
    "sign_test_p_holm": 0.06599,  # Holm over {ppo, dpo}_vs_sft: 2 x 0.03299
    "lc_win_rate": 0.5883,
    "lc_ci95_low": 0.4712,
    "lc_ci95_high": 0.6951,
}
WIN_DPO_SFT = {
    "win_rate": 0.55,
    "loss_rate": 0.4,
    "tie_rate": 0.1,
    "wins": 40,
    "losses": 32,
    "ties": 8,
    "n": 80,
    "n_invalid": 0,
    "ci95_low": 0.4407,
    "ci95_high": 0.6549,
    "sign_test_p": 0.4096,  # 2 sum_{k <= 32} C(72, k) / 2^72
    "sign_test_p_holm": 0.4096,  # Holm: max(0.06599, 1 x 0.4096)
    "lc_win_rate": 0.5412,
}
WIN_PPO_DPO = {
    "win_rate": 0.6,
    "loss_rate": 0.35,
    "tie_rate": 0.05,
    "wins": 46,
    "losses": 28,
    "ties": 4,
    "n": 78,
    "n_invalid": 2,
    "ci95_low": 0.489,
    "ci95_high": 0.701,
    "sign_test_p": 0.04739,  # 2 sum_{k <= 28} C(74, k) / 2^74; not a comparison with SFT: no Holm
    "lc_win_rate": 0.577,
}
N_PARAMS = 1024 * 1200 + 6000  # the fixture's safetensors header: 1,234,800 -> "1.23M"


def fixture_summary() -> dict:
    models = {
        "sft": {
            "reward_mean": 0.012,
            "reward_std": 0.9,
            "kl_to_ref": 0.0,
            "kl_to_ref_std": 0.0,
            "length_mean": 11.5,
            "eos_rate": 0.95,
            "distinct_2": 0.61,
            "gold_score_mean": 0.351,
            "gold_good_rate": 0.3,
            "n": 80,
        },
        "ppo": {
            "reward_mean": 1.234,
            "reward_std": 0.7,
            "kl_to_ref": 4.567,
            "kl_to_ref_std": 1.2,
            "length_mean": 18.25,
            "eos_rate": 0.9,
            "distinct_2": 0.44,
            "gold_score_mean": 0.512,
            "gold_good_rate": 0.45,
            "n": 80,
        },
        "dpo": {
            "reward_mean": 0.456,
            "reward_std": 0.8,
            "kl_to_ref": 2.345,
            "kl_to_ref_std": 0.9,
            "length_mean": 12.0,
            "eos_rate": 0.97,
            "distinct_2": 0.58,
            "gold_score_mean": 0.433,
            "gold_good_rate": 0.38,
            "n": 80,
        },
        "best_of_16": {
            "reward_mean": 1.5,
            "reward_std": 0.5,
            "kl_to_ref": 1.835,
            "kl_to_ref_std": 0.0,
            "length_mean": 13.0,
            "eos_rate": 1.0,
            "distinct_2": 0.6,
            "gold_score_mean": 0.6,
            "gold_good_rate": 0.52,
            "n": 40,
        },
    }
    curve = [
        {
            "n": n,
            "kl": math.log(n) - (n - 1) / n,
            "reward_mean": 0.01 + 0.3 * math.log2(n),
            "gold_score_mean": 0.35 + 0.08 * math.log2(n) - 0.01 * math.log2(n) ** 2,
        }
        for n in (1, 2, 4, 8, 16)
    ]
    return {
        "data": {
            "source": "embedded",
            "n_raw": {"train": 2400, "test": 300},
            "n_pairs": {"train": 2100, "val": 230, "test": 290},
            "dropped": {"malformed": 0, "tie": 7, "prompt_too_long": 3},
            "dropped_by_split": {
                "train": {"malformed": 0, "tie": 6, "prompt_too_long": 3},
                "test": {"malformed": 0, "tie": 1, "prompt_too_long": 0},
            },
            "lengths": {
                "train": {
                    "n": 2100,
                    "prompt_tokens_mean": 30.1,
                    "chosen_tokens_mean": 9.0,
                    "chosen_tokens_std": 4.0,
                    "rejected_tokens_mean": 8.0,
                    "rejected_tokens_std": 5.0,
                    "chosen_minus_rejected_mean": 1.0,
                    "chosen_longer_fraction": 0.571,
                },
                "test": {
                    "n": 290,
                    "prompt_tokens_mean": 30.0,
                    "chosen_tokens_mean": 9.1,
                    "chosen_tokens_std": 4.1,
                    "rejected_tokens_mean": 8.2,
                    "rejected_tokens_std": 4.9,
                    "chosen_minus_rejected_mean": 0.9,
                    "chosen_longer_fraction": 0.562,
                },
            },
            "embedded": {
                "annotator_noise": 0.1,
                "length_bias": 0.2,
                "noise_ceiling": {"val": 0.861, "test": 0.873},
                "gold_agreement": {"val": 0.84, "test": 0.852},
            },
        },
        "sft": {
            "val_loss": 1.2345,
            "val_perplexity": 3.437,
            "steps": 150,
            "gold_good_rate": 0.3,
            "gold_score_mean": 0.351,
        },
        "reward_model": {
            "steps": 140,
            "offset": 0.25,
            "length_heuristic_weight": 0.1834,
            "val_accuracy": 0.7812,
            "test_accuracy": 0.7654,
            "val_gold_accuracy": 0.8,
            "test_gold_accuracy": 0.8123,
            "val_length_reward_correlation": 0.15,
            "test_length_reward_correlation": 0.2468,
            "val_chosen_reward_mean": 0.4,
            "val_rejected_reward_mean": -0.5,
            "test_chosen_reward_mean": 0.41,
            "test_rejected_reward_mean": -0.52,
            "gold_accuracy_by_family": {"val": {"fact": 0.7, "arith": 0.9}, "test": {"fact": 0.75, "arith": 0.8}},
        },
        "ppo": {
            "iterations": 30,
            "episodes": 1920,
            "reward_mean": 1.2,
            "sft_reward_mean": 0.01,
            "kl_to_ref": 4.5,
            "gold_score_mean": 0.51,
            "gold_win_rate_vs_sft": 0.6,
            "final_kl_coef": 0.05,
            "time_per_sample_ms": 12.5,
            "peak_memory_mb": 2345.6,
            "peak_memory_source": "max_rss",
        },
        "dpo": {
            "loss_type": "sigmoid",
            "beta": 0.1,
            "steps": 64,
            "train_loss": 0.512,
            "val_accuracy": 0.7,
            "test_accuracy": 0.69,
            "gold_score_mean": 0.43,
            "gold_win_rate_vs_sft": 0.55,
            "peak_memory_mb": 1200.0,
            "peak_memory_kind": "cpu_rss",
        },
        "timing_s": {"data": 3.21, "sft": 61.5, "reward": 45.0, "ppo": 250.0, "dpo": 40.0, "eval": 30.0},
        "eval": {
            "decoding": {"temperature": 0.7, "top_p": 1.0, "max_new_tokens": 64, "seed": 1234, "num_prompts": 80},
            "models": models,
            "best_of_n": {"n": 16, "n_prompts": 40, "curve": curve},
            "win_rates": {
                "gold": {"ppo_vs_sft": WIN_PPO_SFT, "dpo_vs_sft": WIN_DPO_SFT, "ppo_vs_dpo": WIN_PPO_DPO},
                "reward": {  # a family of one: Holm leaves its p as it is
                    "ppo_vs_sft": {
                        **WIN_PPO_SFT,
                        "win_rate": 0.8125,
                        "ci95_low": 0.71,
                        "ci95_high": 0.88,
                        "sign_test_p_holm": 0.03299,
                    }
                },
            },
            "judge_agreement": {
                "reward_vs_gold": {
                    "agreement": 0.6543,
                    "n": 240,
                    "agreement_decisive": 0.7012,
                    "n_decisive": 180,
                    "n_invalid": 0,
                    "by_gold_difference": {
                        "capability": {"agreement_decisive": 0.5, "n_decisive": 45},
                        "verbosity": {"agreement_decisive": 0.4, "n_decisive": 135},
                    },
                }
            },
            "judges": {
                "gold": {"judge": "gold"},
                "reward": {"judge": "reward"},
                "openai": {"status": "skipped: OPENAI_API_KEY is not set"},
            },
            "suites": {
                "sycophancy": {
                    "sft": {"reward_mean": -0.321, "n": 2, "gold_score_mean": 0.1},
                    "ppo": {"reward_mean": 0.654, "n": 2, "gold_score_mean": -0.2},
                    "dpo": {"reward_mean": 0.111, "n": 2, "gold_score_mean": 0.3},
                }
            },
        },
    }


PROMPTS = [f"\n\nHuman: What is {i} plus {i}?\n\nAssistant:" for i in range(6)]


def response_rows(model: str, shift: float) -> list[dict]:
    rows = []
    for i, prompt in enumerate(PROMPTS):
        text = f" {model} says {2 * i}." + (" and more" * i if model == "ppo" else "")
        rows.append(
            {
                "prompt": prompt,
                "response": text,
                "reward": round(shift + 0.1 * i, 3),
                "length": 4 + (3 * i if model == "ppo" else i),
                "finished": True,
                "kl": 0.5 * i,
                # the models disagree on gold on two prompts: PPO alone is right on prompt 1, DPO alone wrong on 4
                "gold_score": {("ppo", 1): 1.0, ("dpo", 4): -1.0}.get((model, i), 1.0 if i % 2 == 0 else 0.0),
            }
        )
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_fixture_run(
    root: Path, summary: dict, stages=("data", "sft", "reward", "ppo", "dpo", "eval"), files: bool = True
) -> None:
    """A run folder as the pipeline leaves it, written by hand; complete markers match the tiny preset."""
    (root / "summary.json").parent.mkdir(parents=True, exist_ok=True)
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    cfg = load_config(preset_path("tiny"))
    run = RunDir(root)
    for stage in stages:
        run.mark_complete(stage, cfg, {})
    if not files:
        return
    for model, shift in (("sft", 0.0), ("ppo", 1.0), ("dpo", 0.4), ("best_of_16", 1.4)):
        write_jsonl(root / "eval" / "responses" / f"{model}.jsonl", response_rows(model, shift))
    write_jsonl(
        root / "eval" / "suites" / "sycophancy.jsonl",
        [
            {
                "suite": "sycophancy",
                "model": model,
                "prompt": "\n\nHuman: The moon is cheese, right?\n\nAssistant:",
                "response": f" {model}: no, it is rock.",
                "reward": 0.3,
                "gold_score": 1.0,
            }
            for model in ("sft", "ppo", "dpo")
        ],
    )
    for stage, keys in (
        ("sft", ["sft/train/loss", "sft/val/loss"]),
        ("reward", ["reward/train/loss", "reward/train/accuracy"]),
        ("ppo", ["ppo/objective/scores", "ppo/objective/kl", "ppo/memory/peak_mb"]),
        ("dpo", ["dpo/train/loss", "dpo/train/rewards/accuracies"]),
    ):
        rows = [
            {"step": step, "time_s": 0.1 * step, **{key: 1.0 / step + 0.01 * k for k, key in enumerate(keys)}}
            for step in range(1, 21)
        ]
        write_jsonl(root / stage / "metrics.jsonl", rows)
    example = {
        "prompt": "\n\nHuman: Capital of Zorbia?\n\nAssistant:",
        "chosen": " Zorbville.",
        "rejected": " I think it is Qux, a big city.",
        "reward_chosen": -0.75,
        "reward_rejected": 1.25,
        "gold_chosen": 1.0,
        "gold_rejected": 0.0,
    }
    analysis = {
        split: {
            "misclassified": 61,
            "n": 290,
            "margin_std": 1.1,
            "counts": {"longer_rejected_preferred": 40, "small_margin": 12, "confident_wrong": 9, "very_short": 3},
            "examples": {
                "confident_wrong": [example],
                "longer_rejected_preferred": [example],
                "small_margin": [],
                "very_short": [],
            },
        }
        for split in ("val", "test")
    }
    (root / "reward" / "error_analysis.json").write_text(json.dumps(analysis))
    (root / "sft" / "model").mkdir(parents=True, exist_ok=True)
    save_file(
        {"wte": np.zeros((1024, 1200), dtype=np.uint8), "ln.bias": np.zeros(6000, dtype=np.uint8)},
        str(root / "sft" / "model" / "model.safetensors"),
    )
    (root / "data" / "lengths.png").write_bytes(PNG_MAGIC + b"\x00" * 64)  # only linked, never read


def make_report(root: Path, *extra: str) -> subprocess.CompletedProcess:
    """`python part4_eval/make_report.py --preset tiny --output-dir root extra...`, in this process."""
    return run_in_process("part4_eval/make_report.py", "--preset", "tiny", "--output-dir", str(root), *extra)


@pytest.fixture(scope="module")
def reported(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("fixture_run")
    write_fixture_run(root, fixture_summary())
    return root, make_report(root)


def test_make_report_writes_the_report_from_the_fixture(reported):
    root, result = reported
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    text = (root / "report.md").read_text()
    assert "failed to render" not in text
    for heading in (
        "# RLHF run report: preset `tiny`",
        "## Headline",
        "## Data",
        "## Reward model",
        "### Error analysis",
        "## Training",
        "## Evaluation",
        "### Win rates",
        "### Judge agreement",
        "### Best-of-N",
        "## Figures",
        "## Samples",
        "## Failure and capability suites",
        "## Timing and memory",
        "## External reference points",
    ):
        assert f"\n{heading}\n" in f"\n{text}", heading
    # Exact rows, numbers formatted as the report formats them.
    assert (
        "| PPO vs SFT | 0.625 | [0.512, 0.726] | 0.033 (Holm 0.066) | 0.588 [0.471, 0.695] | 50 / 30 / 0 | 80 | 0 |"
        in text
    )
    # a head-to-head between two methods is the heatmap's cell, with its interval, not a table row (it repeated it)
    assert "| PPO vs DPO |" not in text
    assert "The head-to-head between the two other models is in the win-rate heatmap" in text
    assert "| PPO vs SFT | 0.812 | [0.710, 0.880] |" in text  # the reward judge's table
    assert "| PPO | 80 | 1.234 ± 0.700 | 4.567 ± 1.200 | 18.2 | 0.900 | 0.440 | n/a | 0.512 | 0.450 |" in text
    assert (
        "| best-of-16 | 1.500 | 1.835 | 0.600 | 0.520 | 13.0 | n/a |" in text
    )  # headline: no best_of_16_vs_sft pairing
    assert "| PPO | 1.234 | 4.567 | 0.512 | 0.450 | 18.2 | 0.625 [0.512, 0.726] | 50 / 30 / 0 | 0.000 |" in text
    assert "| reward vs gold | 0.654 | 240 | 0.701 | 180 | 0 |" in text
    assert "| capability | 45 | 0.250 | 0.500 |" in text and "| verbosity | 135 | 0.750 | 0.400 |" in text
    assert "| 16 | 1.835 | 1.210 |" in text  # best-of-N: log 16 - 15/16, 0.01 + 0.3 * 4
    assert "| test | 0.765 | 0.812 | 0.873 | 0.562 | 0.247 | 0.410 | -0.520 |" in text
    assert "| split | arith | fact |" in text and "| test | 0.800 | 0.750 |" in text  # gold agreement by family
    assert "read as the longer response with probability w = 0.183, learnt from the labels" in text
    assert "| test | 61 | 290 | 9 | 40 | 12 | 3 |" in text
    assert "| tie | 6 | 1 | 7 |" in text
    assert "| sycophancy | 2 | -0.321 | 0.654 | 0.111 |" in text
    assert "| PPO | 30 iterations |" in text and "2,346 MB (max_rss)" in text
    assert "| DPO | 64 steps | loss sigmoid; β 0.100; final train loss 0.512" in text
    assert "| **total** | 429.7 | 7.2 min | 100.0% |  |" in text
    assert "1.23M parameters" in text
    assert "| SFT | 0.012 | 0.000 | 0.351 | 0.300 | 11.5 | (reference) |  |  |" in text
    # PPO's interval excludes 0.5 but its Holm-adjusted sign test does not pass 0.05 under gold; it does
    # under the reward judge, where it is the only comparison with SFT.
    assert (
        "| PPO | `gold` | 0.625 | [0.512, 0.726] | 0.033 (0.066) | not distinguishable after Holm's adjustment |"
        in text
    )
    assert "| PPO | `reward` | 0.812 | [0.710, 0.880] | 0.033 (0.033) | **beats** |" in text
    assert (
        "| DPO | `gold` | 0.550 | [0.441, 0.655] | 0.410 (0.410) | not distinguishable (the interval includes 0.5) |"
        in text
    )
    assert 'the family of "beats SFT" claims is Holm-controlled' in text
    # best-of-16 answered 40 of the 80 prompts: ranked with the others on its own prompts only
    assert "- Highest mean gold score: PPO (0.512)." in text and "Highest mean gold score: best-of-16" not in text
    assert (
        "- On the 6 prompts best-of-16 answered, mean reward-model score, highest first: best-of-16 1.650, PPO 1.250, "
        "DPO 0.650, SFT 0.250." in text
    )
    assert "**Judges:** `gold` (the embedded task's exact judge), independent of training; and `reward`" in text
    assert "| val | (from train) | 230 |" in text
    assert "held-out test prompts with the same decoding settings (best-of-N: the first 40 of them)" in text
    assert "`temperature` 0.7, `top_p` 1, `max_new_tokens` 64, `seed` 1234, `num_prompts` 80." in text
    assert "not in this run (no `grpo` section in summary.json)" in text
    assert "GRPO: not evaluated in this run (no `eval.models.grpo`)" in text
    assert (
        "Judges asked for that did not run or gave no verdicts: `openai` (skipped: OPENAI_API_KEY is not set)" in text
    )
    assert "#### Judge: `openai`" not in text  # no empty subsection for a judge that did not run
    assert "**External: published numbers, not measured in this run.**" in text and "0.629 / 0.669 / 0.689" in text
    # External numbers appear only in their own section.
    assert "0.60–0.67" not in text.split("## External reference points")[0]
    # Samples: the prompts where the models disagree on gold, largest spread first, every model's answer.
    samples = text.split("## Samples")[1].split("## Failure")[0]
    assert "differ in gold score on 2 of the 6 evaluation prompts" in samples
    assert samples.index("### Sample 1: `arith`, gold scores from -1.000 to 1.000") < samples.index("### Sample 2:")
    assert "| DPO |  dpo says 8. | 0.800 | 8 | -1.000 |" in samples and "| PPO |  ppo says 2. and more |" in samples
    assert "### Sample 3" not in samples  # the other four prompts: every model scores the same
    # beside the samples: what gold rewards and what it does not read, and each answer's verdict and deductions
    assert "It reads only the stated answer" in samples and "| gold score | gold: why |" in samples
    assert "| 1.000 | correct; repetition −0.5; no ending −0.3; verbosity −0.12 |" in samples


def test_make_report_figures_are_valid_pngs_and_linked(reported):
    root, _ = reported
    text = (root / "report.md").read_text()
    for name in ("reward_vs_kl", "reward_distributions", "win_rates", "training_curves", "response_lengths"):
        path = root / "report" / f"{name}.png"
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000, name
        assert f"](report/{name}.png)" in text
    assert "](data/lengths.png)" in text
    assert not list((root / "report").glob("*.tmp*"))


def test_make_report_records_timing_and_completes_then_skips(reported):
    root, _result = reported
    summary = json.loads((root / "summary.json").read_text())
    assert isinstance(summary["timing_s"]["report"], float) and summary["timing_s"]["report"] < 30
    assert summary["eval"] == fixture_summary()["eval"]  # the report only adds its timing
    complete = json.loads((root / "report" / "complete.json").read_text())
    assert complete["report"] == "report.md" and "report/win_rates.png" in complete["figures"]
    again = make_report(root)
    assert again.returncode == 0 and "already complete" in again.stdout


def test_make_report_without_gold_or_policies_degrades_to_notes(tmp_path):
    """An HH-style run: no gold judge, no RL/DPO stages, SFT only, no response or suite files."""
    summary = {
        "data": {
            "source": "Anthropic/hh-rlhf",
            "n_raw": {"train": 100, "test": 10},
            "n_pairs": {"train": 90, "val": 5, "test": 10},
        },
        "sft": {"val_loss": 2.0, "steps": 5},
        "reward_model": {"val_accuracy": 0.6, "test_accuracy": 0.61},
        "timing_s": {"sft": 5.0},
        "eval": {
            "models": {"sft": {"reward_mean": 0.0, "kl_to_ref": 0.0, "n": 10}},
            "win_rates": {"reward": {}},
            "judges": {"openai": {"status": "skipped: OPENAI_API_KEY is not set"}},
        },
    }
    write_fixture_run(tmp_path, summary, files=False)
    result = make_report(tmp_path)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "report.md").read_text()
    assert "failed to render" not in text and "warning" not in result.stderr
    # no gold judge on HH data: no section, caption or line speaks of it (the run folder's name may)
    assert "gold" not in text.replace(str(tmp_path), "").lower()
    assert "#### Judge:" not in text and "### Judge agreement" not in text  # nothing ran: nothing to show
    assert (
        "Judges asked for that did not run or gave no verdicts: `openai` (skipped: OPENAI_API_KEY is not set)" in text
    )
    assert "PPO: not in this run" in text and "DPO: not in this run" in text
    assert "No response files" in text and "No best-of-N curve" in text
    assert "`Anthropic/hh-rlhf` (Anthropic's helpful/harmless human preference pairs)" in text
    assert (tmp_path / "report" / "reward_vs_kl.png").is_file()  # one model point is still a figure
    assert not (tmp_path / "report" / "win_rates.png").exists()  # nothing judged: no empty heatmap


def test_make_report_needs_a_complete_eval_stage(tmp_path):
    write_fixture_run(tmp_path, fixture_summary(), stages=("data", "sft", "reward"), files=False)
    result = make_report(tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "stage 'eval' has not completed" in result.stderr
    assert not (tmp_path / "report.md").exists()


def test_collect_section_shows_counts_drops_and_gold_agreement_by_kind():
    summary = {
        "collect": {
            "annotator": {"judge": "simulated"},
            "prompts": 10,
            "samples_per_prompt": 4,
            "pairs_compared": 55,
            "n_pairs": 48,
            "dropped": {"tie": 5, "annotator_tie": 7, "annotator_invalid": 0},
            "gold_agreement": 0.75,
            "noise_ceiling": 0.78,
            "gold_tie_rate": 0.127,
            "labels_vs_gold_by_gold_difference": {"verbosity": {"n_decisive": 20, "agreement_decisive": 0.7}},
        },
        "reward_model": {"pairs": "collected"},
        "dpo": {"pairs": "dataset"},
    }
    text = R.section_collect(R.RunData(summary=summary))
    assert "4 responses to each of 10 training prompts" in text and "55 distinct pairs" in text
    assert "48 labelled pairs" in text and "Trained on them: `reward.pairs`." in text
    assert "| tie | 5 |" in text and "| annotator_tie | 7 |" in text and "annotator_invalid" not in text
    assert "| verbosity | 20 | 0.700 |" in text and "0.750 of the written pairs (noise ceiling 0.780)" in text
    assert R.section_collect(R.RunData(summary={})) == ""


# ----------------------------------------------------------------------------- real data: no gold judge


def hh_rows(model: str, n: int, reward: float) -> list[dict]:
    return [
        {
            "prompt": f"\n\nHuman: How do I fix a leaking tap, case {i}?\n\nAssistant:",
            "response": f" {model} {i}",
            "reward": reward + 0.01 * i,
            "length": 3,
            "finished": True,
            "kl": 0.0,
        }
        for i in range(n)
    ]


def hh_summary(judges: dict) -> dict:
    """An HH run's eval section: 30 prompts, best-of-4 on the first 10, the reward model the only judge."""
    win = {**WIN_PPO_SFT, "n": 30, "wins": 20, "losses": 10}
    models = {
        "sft": {"reward_mean": 0.1, "kl_to_ref": 0.0, "n": 30},
        "ppo": {"reward_mean": 0.5, "kl_to_ref": 1.0, "n": 30},
        "best_of_4": {"reward_mean": 0.9, "kl_to_ref": 0.636, "n": 10},
    }
    return {
        "data": {"source": "/data/harmless-base"},
        "timing_s": {"data": 10.0, "sft": 30.0, "eval": 20.0, "pipeline_total": 244.0},
        "eval": {
            "decoding": {"num_prompts": 30},
            "models": models,
            "best_of_n": {"n": 4, "n_prompts": 10, "curve": [{"n": 1, "kl": 0.0, "reward_mean": 0.1}]},
            "win_rates": {"reward": {"ppo_vs_sft": win, "best_of_4_vs_sft": win}},
            "judge_agreement": {},
            "judges": judges,
        },
    }


def hh_run_data(judges: dict) -> R.RunData:
    responses = {"sft": hh_rows("sft", 30, 0.1), "ppo": hh_rows("ppo", 30, 0.5), "best_of_4": hh_rows("b", 10, 0.9)}
    return R.RunData(
        summary=hh_summary(judges),
        preset="gpt2-hh",
        run_dir="/runs/hh",
        responses=responses,
        figures={"reward_vs_kl": "report/reward_vs_kl.png"},
    )


def test_without_an_independent_judge_the_headline_says_so_and_how_to_add_one():
    skipped = {"reward": {"judge": "reward"}, "openai": {"status": "skipped: OPENAI_API_KEY is not set"}}
    text = R.render_report(hh_run_data(skipped))
    headline = text.split("## Headline")[1].split("## Data")[0]
    assert (
        "**Judges: the reward model alone.** Every verdict and score below comes from the run's own reward model, "
        "the proxy that PPO optimised and best-of-4 picked by, so it favours those policies by construction" in headline
    )
    assert "No independent judge ran (`openai` skipped: OPENAI_API_KEY is not set)." in headline
    assert (
        "set `OPENAI_API_KEY` (and `OPENAI_BASE_URL` for another OpenAI-compatible server) and run "
        "`bash run_all.sh --preset gpt2-hh --output-dir /runs/hh --only eval,report --force`, with the run's own "
        "`section.key=value` overrides if it had any." in headline
    )
    assert "At a glance (read off the tables in this report; every line rests on the reward model alone" in headline
    # openai not asked for at all: the command adds it
    text = R.render_report(hh_run_data({"reward": {"judge": "reward"}}))
    assert "No independent judge ran (none was configured (`eval.judges` names neither `gold` nor `openai`))" in text
    assert "--only eval,report --force eval.judges=reward,openai`" in text
    # a policy trained on a reward function, not on the reward model, is not said to have optimised it
    data = hh_run_data(skipped)
    data.summary["ppo"] = {"reward_source": "rlhf.task:gold_rewards"}
    assert "the proxy that the RL stages optimise and best-of-4 picked by" in R.render_report(data)
    data.summary["ppo"] = {"reward_source": "model + 0.5*rlhf.task:gold_rewards"}
    assert "the proxy that PPO optimised and best-of-4 picked by" in R.render_report(data)


def test_without_gold_no_gold_wording_and_no_empty_judge_sections():
    text = R.render_report(hh_run_data({"openai": {"status": "skipped: OPENAI_API_KEY is not set"}}))
    assert "gold" not in text.lower()
    assert "#### Judge: `reward`" in text and "#### Judge: `openai`" not in text and "#### Judge: `gold`" not in text
    assert "### Judge agreement" not in text  # one judge: nothing to agree with
    assert "The reward model both picks and scores these samples, so its reward rises with N by construction" in text
    assert "only a judge independent of training (eval.judges: openai) can tell apart" in text  # reward-vs-KL caption


def test_agreement_is_shown_between_whichever_judges_ran():
    data = hh_run_data({"openai": {"judge": "openai", "model": "gpt-4o-mini"}})
    data.summary["eval"]["win_rates"]["openai"] = {"ppo_vs_sft": WIN_PPO_SFT}
    data.summary["eval"]["judge_agreement"] = {
        "openai_vs_reward": {"agreement": 0.7, "n": 40, "agreement_decisive": 0.75, "n_decisive": 36, "n_invalid": 1}
    }
    text = R.render_report(data)
    assert "| openai vs reward | 0.700 | 40 | 0.750 | 36 | 1 |" in text
    assert "How often two judges give the same verdict on the same pairs" in text and "gold" not in text.lower()
    assert "**Judges:** `openai` (the LLM judge, `gpt-4o-mini`), independent of training; and `reward`" in text


def test_counts_name_the_prompts_they_are_over():
    text = R.render_report(hh_run_data({}))
    # best-of-4 answered 10 of the 30 prompts: the samples are drawn from those 10, and said to be
    assert (
        "on 10 of the 10 evaluation prompts that every model answered (best-of-4 answered only these of the 30)" in text
    )
    # its 10-prompt mean (0.945) is not ranked against the 30-prompt means, but beside theirs on its 10 prompts
    assert "- Highest mean reward-model score: PPO (0.500)." in text
    assert (
        "- On the 10 prompts best-of-4 answered, mean reward-model score, highest first: best-of-4 0.945, "
        "PPO 0.545, SFT 0.145." in text
    )
    data = hh_run_data({})
    data.summary["eval"]["models"]["ppo"]["reward_mean"] = 0.1  # as SFT's: no model is "the highest"
    assert "- Highest mean reward-model score: a tie at 0.100 between SFT and PPO." in R.render_report(data)
    data.responses = {}  # no response files: best-of-4 is left out of the ranking, and said to be
    assert "best-of-4 answered 10 of the 30 prompts, so its mean reward-model score is not ranked" in (
        R.render_report(data)
    )


def test_pipeline_total_is_not_a_stage_of_the_timing_table():
    text = R.section_timing(hh_run_data({}))
    assert "pipeline_total" not in text
    assert "| **total** | 60.0 | 60.0 s | 100.0% |  |" in text  # 10 + 30 + 20: the stages alone


def test_the_timing_table_reads_each_stages_memory_from_its_own_summary_section():
    """judge_rm publishes in `judge_reward_model`, the reward model in `reward_model`: their peak memory was n/a."""
    data = hh_run_data({})
    data.summary["timing_s"] = {"reward": 10.0, "judge_rm": 20.0}
    data.summary["judge_reward_model"] = {"peak_memory_mb": 300.0, "peak_memory_source": "max_rss"}
    data.summary["reward_model"] = {**data.summary.get("reward_model", {}), "peak_memory_mb": 200.0}
    rows = {line.split(" | ")[0]: line for line in R.section_timing(data).splitlines() if line.startswith("| ")}
    assert "200" in rows["| reward model"] and "n/a" not in rows["| reward model"]
    assert "300" in rows["| judge_rm"] and "n/a" not in rows["| judge_rm"]


def test_reward_vs_kl_names_every_model_in_its_legend(tmp_path, monkeypatch):
    """Models near SFT sit on top of each other: labels written beside the points overlapped; a legend cannot."""
    from rlhf.analysis import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    points = {name: {"kl": 0.01 * i, "reward": 0.0} for i, name in enumerate(("SFT", "PPO", "GRPO", "DPO"))}
    assert plots.plot_reward_vs_kl(points, [{"n": 1, "kl": 0.0, "reward": 0.0}], "best-of-N", tmp_path / "f.png")
    (ax,) = drawn[0].axes
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["best-of-N", "SFT", "PPO", "GRPO", "DPO"]
    assert [t.get_text() for t in ax.texts] == ["N=1"]  # no model label written beside its point
    assert len({c.get_paths()[0].vertices.tobytes() for c in ax.collections}) == 4  # a marker shape per model


def test_the_headline_says_when_eval_answered_validation_prompts():
    """A dataset without a test split: eval falls back to validation prompts (rlhf.data.heldout_split), and the
    report called them held-out prompts."""
    data = hh_run_data({})
    assert "same 30 held-out test prompts" in R.section_headline(data)
    data.summary["eval"]["prompt_split"] = "val"
    text = R.section_headline(data)
    assert "same 30 validation prompts (the data has no test split) with the same decoding" in text
    assert "held-out" not in text
    assert "| win rate vs SFT, validation prompts (reward judge) |" in text


# ----------------------------------------------------------------------------- labels, ties, KL, samples, html page


def test_every_win_rate_vs_sft_names_its_prompts(reported):
    """The Training table's gold win rate is on validation prompts, the Headline's on test prompts: never unlabelled."""
    root, _ = reported
    text = (root / "report.md").read_text()
    assert "val gold win rate vs SFT 0.600" in text and "val gold win rate vs SFT 0.550" in text  # PPO, DPO
    assert "| win rate vs SFT, test prompts (gold judge) | wins / losses / ties | tie share |" in text
    labelled = re.compile(r"val gold win rate vs SFT|win rate vs SFT, test prompts|win rate vs SFT under the")
    for line in text.splitlines():
        if "win rate vs SFT" in line and "beats SFT" not in line:
            assert labelled.search(line), line


def test_the_headline_counts_wins_losses_ties_and_says_how_many_are_ties():
    summary = fixture_summary()
    text = R.section_headline(R.RunData(summary=summary))
    assert "| DPO | 0.456 | 2.345 | 0.433 | 0.380 | 12.0 | 0.550 [0.441, 0.655] | 40 / 32 / 8 | 0.100 |" in text
    assert "Under the `gold` judge, 0%–10% of each method's comparisons with SFT are ties" in text
    summary["eval"]["win_rates"]["gold"]["ppo_vs_sft"]["tie_rate"] = 0.1  # one value: no range
    assert "Under the `gold` judge, 10% of each method's" in R.section_headline(R.RunData(summary=summary))


def test_a_negative_kl_estimate_is_marked_and_explained_where_it_is_printed():
    assert R.fmt_kl(-0.0912) == "-0.091†" and R.fmt_kl(-0.0912, 0.5) == "-0.091† ± 0.500"
    assert R.fmt_kl(0.25, 0.5) == "0.250 ± 0.500" and R.fmt_kl(None) == "n/a"
    assert R.negative_kl_note([0.1, None, 0.0]) == ""
    summary = fixture_summary()
    summary["eval"]["models"]["dpo"]["kl_to_ref"] = -0.09
    summary["ppo"]["kl_to_ref"] = -0.02
    data = R.RunData(summary=summary)
    for section, cell in (
        (R.section_headline, "| DPO | 0.456 | -0.090† |"),
        (R.section_eval_models, "| DPO | 80 | 0.456 ± 0.800 | -0.090† ± 0.900 |"),
        (R.section_training, "val KL to ref -0.020†"),
    ):
        text = section(data)
        assert cell in text, section.__name__
        assert "† A KL estimate below 0 is sampling noise" in text and "not distinguishable from 0" in text
    assert "† A KL estimate below 0" not in R.section_headline(R.RunData(summary=fixture_summary()))


def answers(**scores) -> dict[str, dict]:
    return {model: {"response": f"{model} {score}", "gold_score": score} for model, score in scores.items()}


def test_disagreements_are_picked_by_spread_then_distinct_answers_then_order_one_family_first():
    samples = [
        PromptSamples("same", "fact", answers(sft=1.0, ppo=1.0)),  # everyone agrees: never picked
        PromptSamples("small", "fact", answers(sft=0.5, ppo=0.25)),  # spread 0.25
        PromptSamples("wide", "fact", answers(sft=-1.0, ppo=1.0)),  # spread 2
        PromptSamples(
            "wide, same text",
            "fact",
            {"sft": {"response": "x", "gold_score": -1.0}, "ppo": {"response": "x", "gold_score": 1.0}},
        ),
        PromptSamples("harmful", "harmful", answers(sft=0.0, ppo=0.5)),  # spread 0.5, another family
    ]
    picked = [s.prompt for s in pick_disagreements(samples, "gold_score", 5)]
    # the best of each family first (fact: "wide"; harmful), then the rest by spread, distinct answers, order
    assert picked == ["wide", "harmful", "wide, same text", "small"]
    assert [s.prompt for s in pick_disagreements(samples, "gold_score", 1)] == ["wide"]
    assert score_key(samples) == "gold_score"
    no_gold = side_by_side({"sft": [{"prompt": "p", "reward": 0.1}], "ppo": [{"prompt": "p", "reward": 0.3}]})
    assert score_key(no_gold) == "reward" and [s.prompt for s in pick_disagreements(no_gold, "reward", 3)] == ["p"]


def test_without_gold_the_samples_are_the_reward_models_disagreements():
    text = R.section_samples(hh_run_data({}))
    assert "differ in reward-model score on 10 of the 10 evaluation prompts that every model answered" in text
    assert "The scores are the reward model's, the proxy: this data has no judge of true quality." in text
    assert "### Sample 1: reward-model scores from " in text and "gold" not in text.lower()
    same = R.RunData(
        summary={}, responses={m: [{"prompt": "p", "response": "r", "reward": 0.5}] for m in ("sft", "ppo")}
    )
    assert "all models' answers have the same reward-model score" in R.section_samples(same)


def test_single_point_metrics_are_not_drawn_as_curves(tmp_path, monkeypatch):
    from rlhf.analysis import plots

    history = [{"step": s, "sft/train/loss": 1.0 / s} for s in (1, 2, 3)] + [{"step": 3, "sft/val/loss": 0.4}]
    assert plots.curve_keys(history, ["sft/train/loss", "sft/val/loss", "sft/absent"]) == ["sft/train/loss"]
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig))
    assert plots.plot_stage_curves({"sft": history}, plots.REPORT_CURVE_KEYS, tmp_path / "c.png")
    assert [ax.get_title() for ax in drawn[0].axes] == ["sft: train loss"]
    # every panel says what its axes hold (the grid had tiny titles and no axis labels)
    assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in drawn[0].axes] == [("optimizer step", "train loss")]
    ppo = {"ppo": [{"step": s, "ppo/objective/kl": 0.1 * s} for s in (1, 2)]}
    assert plots.plot_stage_curves(ppo, plots.REPORT_CURVE_KEYS, tmp_path / "c.png")
    assert (drawn[1].axes[0].get_xlabel(), drawn[1].axes[0].get_ylabel()) == ("iteration", "KL to ref (nats)")
    assert not plots.plot_stage_curves({"sft": history[-1:]}, plots.REPORT_CURVE_KEYS, tmp_path / "c.png")


def test_markdown_to_html_escapes_run_text_and_keeps_the_reports_markup():
    text = "\n".join(
        [
            "## Judge: `gold`",
            "",
            "A *note* with **bold**, [Headline](#headline) and <script>alert(1)</script>.",
            "",
            R.markdown_table(["model", "response"], [["PPO", "a | b\nc <i>"]], "ll"),
            "",
            R.code_block("Human: <b>hi</b>"),
            "",
            "- [SFT](sft/curves.png)",
            "",
            "![Figure](report/x.png)",
        ]
    )
    page = markdown_to_html(
        text, {"report/x.png": "data:image/png;base64,AAA", "sft/curves.png": "data:image/png;base64,BBB"}
    )
    assert '<h2 id="judge-gold">Judge: <code>gold</code></h2>' in page
    assert "<em>note</em>" in page and "<strong>bold</strong>" in page and '<a href="#headline">Headline</a>' in page
    assert "&lt;script&gt;" in page and "<script>" not in page
    assert '<td style="text-align:left">a | b<br>c &lt;i&gt;</td>' in page  # an escaped pipe is text, not a border
    assert "<pre><code>Human: &lt;b&gt;hi&lt;/b&gt;</code></pre>" in page
    assert '<img src="data:image/png;base64,AAA" alt="Figure">' in page and 'src="data:image/png;base64,BBB"' in page


class PageParser(HTMLParser):
    """Headings (text), images, sample rows and anything that would load from outside the page."""

    def __init__(self):
        super().__init__()
        self.headings, self.images, self.rows, self.samples, self.external = [], [], [], [], []
        self._heading = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if re.fullmatch(r"h[1-6]", tag):
            self._heading = ""
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "tr" and "data-model" in attrs:
            self.rows.append(attrs)
        if tag == "div" and attrs.get("class") == "sample":
            self.samples.append(attrs)
        if tag in ("link", "iframe") or (tag == "script" and "src" in attrs):
            self.external.append(tag)
        self.external += [
            value for key, value in attrs.items() if key in ("src", "href") and re.match(r"\w*:?//", value or "")
        ]

    def handle_endtag(self, tag):
        if re.fullmatch(r"h[1-6]", tag) and self._heading is not None:
            self.headings.append(self._heading.strip())
            self._heading = None

    def handle_data(self, data):
        if self._heading is not None:
            self._heading += data


def parse_page(path: Path) -> PageParser:
    parser = PageParser()
    parser.feed(path.read_text())
    parser.close()
    return parser


def test_report_html_is_one_self_contained_page_with_the_reports_sections_and_samples(reported):
    root, _ = reported
    markdown = (root / "report.md").read_text()
    page = parse_page(root / "report.html")
    md_headings = [
        re.sub(r"[`*]", "", line.lstrip("#").strip()) for line in markdown.splitlines() if re.match(r"#+ ", line)
    ]
    assert md_headings and all(h in page.headings for h in md_headings), set(md_headings) - set(page.headings)
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", markdown)
    assert len(page.images) == len(figures) >= 5
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert page.external == []
    # the sample browser: every prompt, every model's row with its score; the two disagreements flagged
    assert len(page.samples) == len(PROMPTS) and sum(s["data-disagrees"] == "1" for s in page.samples) == 2
    assert len(page.rows) == 4 * len(PROMPTS)
    assert {"data-model": "dpo", "data-score": "-1.000"} in page.rows
    assert "Sample browser" in page.headings


def test_report_html_without_gold_browses_reward_model_scores(tmp_path):
    root = tmp_path / "hh"
    summary = hh_summary({"reward": {"judge": "reward"}, "openai": {"status": "skipped: OPENAI_API_KEY is not set"}})
    write_fixture_run(root, summary, files=False)
    for model, n, reward in (("sft", 30, 0.1), ("ppo", 30, 0.5)):
        write_jsonl(root / "eval" / "responses" / f"{model}.jsonl", hh_rows(model, n, reward))
    result = make_report(root)
    assert result.returncode == 0, result.stderr
    page = parse_page(root / "report.html")
    assert len(page.samples) == 30 and all(s["data-family"] == "" for s in page.samples)
    assert {"data-model": "ppo", "data-score": "0.500"} in page.rows
    text = (root / "report.html").read_text()
    assert "disagree on reward-model score" in text and '<select id="sb-family"' not in text
    assert "gold" not in text.replace(str(root), "").lower()


BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(BROWSER is None, reason="no chromium or chromium-browser on PATH to screenshot report.html")
def test_report_html_renders_in_a_headless_browser(reported, tmp_path):
    from PIL import Image

    root, _ = reported
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            BROWSER,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--screenshot={shot}",
            "--window-size=1200,3000",
            (root / "report.html").as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 3000)
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text, tables, links and figures, not a blank page


def test_the_training_curves_figure_has_a_row_for_every_trained_stage():
    """Online DPO's row was missing: REPORT_CURVE_KEYS named no key of it."""
    from rlhf.analysis import plots
    from rlhf.report import TRAINED_STAGES

    assert set(TRAINED_STAGES) <= set(plots.REPORT_CURVE_KEYS)
    assert all(key.startswith(f"{stage}/") for stage, keys in plots.REPORT_CURVE_KEYS.items() for key in keys)


def test_benchmarks_show_every_model_with_intervals_and_the_change_against_sft():
    def acc(a, low, high, n=541):
        return {"accuracy": a, "ci95_low": low, "ci95_high": high, "n": n}

    change = {"change": 0.05, "ci95_low": 0.02, "ci95_high": 0.08, "p": 0.001, "p_holm": 0.002}
    ifeval = {
        m: {
            "n_prompts": 541,
            "prompt_strict": acc(a, a - 0.04, a + 0.04),
            "instruction_strict": acc(a + 0.1, a + 0.07, a + 0.13),
            "length_mean": 300.4,
            "eos_rate": 0.5,
        }
        for m, a in (("sft", 0.25), ("grpo", 0.30))
    }
    ifeval["grpo"]["change_vs_sft"] = {"prompt_strict": change, "instruction_strict": {**change, "p_holm": None}}
    summary = {"eval": {"benchmarks": {"ifeval": ifeval}, "benchmark_decoding": {"max_new_tokens": 512}}}
    text = R.section_benchmarks(R.RunData(summary=summary))
    assert "up to 512 new tokens" in text
    assert "| SFT | 541 | 0.250 [0.210, 0.290] | 0.350 [0.320, 0.380] | n/a n/a |" in text
    assert "| GRPO | +0.050 [0.020, 0.080] (p 0.001, Holm 0.002) | +0.050 [0.020, 0.080] (p 0.001) |" in text
    assert "No benchmark in this run" in R.section_benchmarks(R.RunData(summary={}))


def test_a_degenerate_model_is_flagged_beside_its_metrics_and_win_rates():
    models = {
        "sft": {"n": 4, "distinct_2": 0.65, "repetition_4": 0.05},
        "dpo": {"n": 4, "distinct_2": 0.45, "repetition_4": 0.4, "degenerate": ["distinct-2 0.45 against SFT's 0.65"]},
        "ppo": {"n": 4, "distinct_2": 0.6, "repetition_4": 0.05, "degenerate": []},
    }
    summary = {"eval": {"models": models, "win_rates": {}}}
    text = R.render_report(R.RunData(summary=summary))
    assert text.count("**Degenerate: DPO** (distinct-2 0.45 against SFT's 0.65)") == 2
    assert "Degenerate: PPO" not in text


def test_a_policy_trained_again_after_eval_is_named_as_stale(tmp_path):
    """Issue 55: after a stage was re-run with another config, the report showed its evaluation from the old model
    and its training table from the new one, with no word. Now the report and its warnings say which."""
    import importlib.util

    from rlhf.stage.run import RunDir

    spec = importlib.util.spec_from_file_location("make_report", REPO / "part4_eval" / "make_report.py")
    make_report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_report)
    run = RunDir(tmp_path)
    for stage, fingerprint in (("grpo", "new"), ("ppo", "same")):
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "complete.json").write_text(json.dumps({"fingerprint": fingerprint}))
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "complete.json").write_text(
        json.dumps({"fingerprint": "e", "policy_fingerprints": {"grpo": "old", "ppo": "same", "dpo": "gone"}})
    )
    warnings = make_report.stale_evaluations(run)
    assert len(warnings) == 2
    assert warnings[0].startswith("GRPO: the evaluation is of an earlier grpo model (config old); the stage now holds")
    assert "DPO" in warnings[1] and "has not completed since" in warnings[1]
    text = R.render_report(R.RunData(summary={}, warnings=warnings))
    assert f"- **Warning:** {warnings[0]}" in text
