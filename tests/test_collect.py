"""The collect stage's parts, by hand: the simulated annotator as a judge, pair selection, and how the
`pairs` settings wire the reward and DPO stages to the collected pairs (inputs, fingerprints, pipeline)."""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import pytest

from rlhf import task
from rlhf.core.errors import UserError
from rlhf.judges import SimulatedAnnotatorJudge
from rlhf.methods.rules import check_collect_config
from rlhf.pipeline.driver import select_stages
from rlhf.stage.config import load_config, preset_path
from rlhf.stage.run import RunDir, collect_needed, config_inputs, stage_inputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "part1_reward"))
from collect_pairs import pair_indices

# A fact prompt and three answers the gold table scores by hand (rlhf/task/gold.py).
PROMPT = task.hh("What is the capital of Bathol?")
CAPITAL = task.COUNTRIES["Bathol"]
RIGHT = f" The capital of Bathol is {CAPITAL}."
RIGHT_PADDED = f" The capital of Bathol is {CAPITAL}. I hope this helps."
RIGHT_SHORT = f" It is {CAPITAL}."
REFUSAL = " I cannot help with that, sorry."


def test_simulated_preference_labels_gold_ties_and_reports_both_scores():
    rng = random.Random(0)
    verdicts = [task.simulated_preference(PROMPT, RIGHT, RIGHT_SHORT, rng, 0.1, 0.2)[0] for _ in range(4000)]
    assert task.gold_score(PROMPT, RIGHT) == task.gold_score(PROMPT, RIGHT_SHORT)  # a gold tie, still labelled
    p = task.p_first(RIGHT, RIGHT_SHORT, 0.0, 0.0, 0.1, 0.2)  # the longer one: 0.2 + 0.8 * 0.5 = 0.6
    assert set(verdicts) == {"A", "B"}
    assert abs(verdicts.count("A") / 4000 - p) < 4 * math.sqrt(p * (1 - p) / 4000)
    verdict, gold_first, gold_second = task.simulated_preference(PROMPT, REFUSAL, RIGHT, rng, 0.0, 0.0)
    assert verdict == "B"  # a careful, noiseless annotator picks the gold-better response, shown second
    assert (gold_first, gold_second) == (task.gold_score(PROMPT, REFUSAL), task.gold_score(PROMPT, RIGHT))


def test_simulated_annotator_noiseless_and_fully_length_biased_by_hand():
    assert task.gold_score(PROMPT, RIGHT) > task.gold_score(PROMPT, RIGHT_PADDED)  # padding costs verbosity
    careful = SimulatedAnnotatorJudge(annotator_noise=0.0, length_bias=0.0)
    assert [j.verdict for j in careful.judge_many([(PROMPT, RIGHT, RIGHT_PADDED), (PROMPT, RIGHT_PADDED, RIGHT)])] == [
        "A",
        "B",
    ]
    by_length = SimulatedAnnotatorJudge(annotator_noise=0.0, length_bias=1.0)
    assert [
        j.verdict for j in by_length.judge_many([(PROMPT, RIGHT, RIGHT_PADDED), (PROMPT, RIGHT_PADDED, RIGHT)])
    ] == [
        "B",
        "A",
    ]
    contrary = SimulatedAnnotatorJudge(annotator_noise=1.0, length_bias=0.0)
    assert contrary.judge(PROMPT, REFUSAL, RIGHT) == "A"  # always the gold-worse one


def test_simulated_annotator_is_order_free_and_deterministic():
    judge = SimulatedAnnotatorJudge(annotator_noise=0.3, length_bias=0.3, seed=7)
    prompts = task.sample_prompts("train", 40, seed=3)
    rng = random.Random(1)
    items = [(p, task.sample_candidate(task.parse_prompt(p), rng)[1], RIGHT) for p in prompts]
    forward = [j.verdict for j in judge.judge_many(items)]
    backward = [j.verdict for j in judge.judge_many([(p, b, a) for p, a, b in items])]
    flip = {"A": "B", "B": "A", "tie": "tie"}
    assert backward == [flip[v] for v in forward]
    assert forward == [j.verdict for j in SimulatedAnnotatorJudge(0.3, 0.3, seed=7).judge_many(items)]
    other_seed = [j.verdict for j in SimulatedAnnotatorJudge(0.3, 0.3, seed=8).judge_many(items)]
    assert other_seed != forward  # 40 noisy labels: identical by chance with probability < 1e-6


def test_simulated_annotator_picks_the_better_at_the_rate_of_p_better():
    """Over many distinct pairs whose better response is the shorter, the annotator picks it at
    P = (1 - bias)(1 - noise) = 0.72 (rlhf/task/annotator.py), within 4 binomial standard deviations."""
    judge = SimulatedAnnotatorJudge(annotator_noise=0.1, length_bias=0.2)
    n = 2000
    items = [(PROMPT, RIGHT, RIGHT_PADDED + " " + "Thank you." * (k % 5) + f" {k}") for k in range(n)]
    scored = [(a, b) for a, b in ((task.gold_score(p, x), task.gold_score(p, y)) for p, x, y in items)]
    assert all(a > b for a, b in scored)  # the first, shorter response is gold-better in every pair
    p = task.p_better(RIGHT, RIGHT_PADDED, 0.1, 0.2)
    assert p == pytest.approx(0.72)
    rate = sum(j.verdict == "A" for j in judge.judge_many(items)) / n
    assert abs(rate - p) < 4 * math.sqrt(p * (1 - p) / n)


def test_pair_indices_drops_identical_responses_and_subsamples():
    samples = [" a", " b", " a", " c"]
    pairs, identical = pair_indices(samples, None, random.Random(0))
    assert identical == 1  # (0, 2)
    assert pairs == [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)]
    two, identical = pair_indices(samples, 2, random.Random(0))
    assert identical == 1 and len(two) == 2 and set(two) <= set(pairs) and two == sorted(two)
    assert two == pair_indices(samples, 2, random.Random(0))[0]
    assert pair_indices(samples, 9, random.Random(0))[0] == pairs  # more than there are: all of them


def test_pairs_setting_adds_collect_to_the_inputs_and_the_fingerprint(tmp_path):
    dataset = load_config(None, ["data.path=embedded"])
    collected = load_config(None, ["data.path=embedded", "reward.pairs=collected"])
    both = load_config(None, ["data.path=embedded", "dpo.pairs=both"])
    assert "collect" not in stage_inputs("reward", dataset) and not collect_needed(dataset)
    assert stage_inputs("reward", collected)[-1] == "collect" and config_inputs("reward", collected) == ("collect",)
    assert config_inputs("dpo", collected) == () and config_inputs("dpo", both) == ("collect",)
    assert collect_needed(collected) and collect_needed(both)

    run = RunDir(tmp_path)
    other_collect = load_config(None, ["data.path=embedded", "reward.pairs=collected", "collect.temperature=1.0"])
    assert run.fingerprint("reward", collected) != run.fingerprint("reward", other_collect)
    dataset_other_collect = load_config(None, ["data.path=embedded", "collect.temperature=1.0"])
    assert run.fingerprint("reward", dataset) == run.fingerprint("reward", dataset_other_collect)


def test_training_pairs_reads_dataset_collected_or_both(tmp_path):
    for stage, prompts in (("data", ["d1", "d2"]), ("collect", ["c1"])):
        (tmp_path / stage).mkdir()
        rows = [{"prompt": p, "chosen": " x", "rejected": " y"} for p in prompts]
        (tmp_path / stage / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = RunDir(tmp_path)
    assert [r["prompt"] for r in run.training_pairs("dataset")] == ["d1", "d2"]
    assert [r["prompt"] for r in run.training_pairs("collected")] == ["c1"]
    assert [r["prompt"] for r in run.training_pairs("both")] == ["d1", "d2", "c1"]


def test_pipeline_runs_collect_only_when_something_reads_it():
    assert "collect" not in select_stages(None, None, with_collect=False)
    assert select_stages(None, None, with_collect=True)[:4] == ["data", "sft", "collect", "reward"]
    assert select_stages("collect,reward", None, with_collect=False) == ["collect", "reward"]
    assert "collect" not in select_stages(None, "sft", with_collect=False)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["reward.pairs=offline"], "reward.pairs='offline' is not a pair source"),
        (["dpo.pairs=all"], "dpo.pairs='all' is not a pair source"),
        (["collect.annotator=human"], "collect.annotator='human' is unknown"),
        (["collect.samples_per_prompt=0"], "collect.samples_per_prompt=0 must be at least 1"),
    ],
)
def test_bad_pair_and_annotator_settings_fail_at_load(overrides, message):
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, ["data.path=embedded", *overrides])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["collect.samples_per_prompt=1"], "must be at least 2 to form a pair"),
        (["collect.temperature=0"], "must be > 0"),
        (["collect.max_new_tokens=65", "data.max_response_tokens=64"], "exceeds data.max_response_tokens=64"),
        (["data.path=Anthropic/hh-rlhf"], "labels only the embedded task's prompts"),
        (["collect.annotator=reward"], "needs collect.reward_model=FOLDER"),
        (["collect.annotator=reward", "collect.reward_model=/nonexistent"], "is not a model folder"),
        (["collect.annotator=openai"], "OPENAI_API_KEY is not set"),
    ],
)
def test_collect_config_errors_name_the_fix(overrides, message, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    cfg = load_config(None, ["data.path=embedded", *overrides])
    with pytest.raises(UserError, match=message):
        check_collect_config(cfg)


def test_a_judge_change_re_runs_eval_and_only_the_stages_that_ask_the_llm_judge(tmp_path):
    """Before, changing judge.model re-ran online DPO (the judge section was in its fingerprint whatever its
    judge), so eval, run alone, left online DPO out as incomplete."""
    run = RunDir(tmp_path)
    preset = load_config(preset_path("tiny"))
    other_model = load_config(preset_path("tiny"), ["judge.model=another-judge"])
    assert preset.online_dpo.judge != "openai" and preset.collect.annotator != "openai"
    for stage in ("collect", "online_dpo"):
        assert run.fingerprint(stage, preset) == run.fingerprint(stage, other_model), stage
    assert run.fingerprint("eval", preset) != run.fingerprint("eval", other_model)
    asking = ["online_dpo.judge=openai", "collect.annotator=openai"]
    with_llm = load_config(preset_path("tiny"), asking), load_config(preset_path("tiny"), [*asking, "judge.model=x"])
    for stage in ("collect", "online_dpo"):
        assert run.fingerprint(stage, with_llm[0]) != run.fingerprint(stage, with_llm[1]), stage
