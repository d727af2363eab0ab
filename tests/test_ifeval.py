"""IFEval's scoring (rlhf/benchmarks/ifeval.py), the verifiable training prompts (instruction_prompts.py), the
reward function that reads each prompt's own columns, and the eval stage's benchmark rules: against IFEval's real
file and hand-computed values."""

from __future__ import annotations

import json
import math
import random
import re

import pytest
import torch
from bad_inputs.helpers import run_in_process
from conftest import REPO

from rlhf.benchmarks import ifeval, locate
from rlhf.benchmarks.instruction_prompts import (
    SUBJECTS,
    all_base_requests,
    build_instruction_prompts,
    ifeval_overlap,
    subject_split,
)
from rlhf.core.errors import UserError
from rlhf.core.winrates import wilson_interval
from rlhf.methods.rules import requested_benchmarks
from rlhf.online.held_out import compare_with_sft
from rlhf.online.prompts import row_columns
from rlhf.rollout.reward_functions import ifeval_instructions
from rlhf.rollout.rewards import RewardSource, columns_for, required_columns
from rlhf.stage.config import load_config

IFEVAL_FILE = REPO.parent / "shared" / "data" / "ifeval" / "input_data.jsonl"


def row(ids: list[str], kwargs: list[dict], prompt: str = "Write something.") -> ifeval.InstructionPrompt:
    return ifeval.InstructionPrompt("k", prompt, tuple(ids), tuple(kwargs))


def test_the_real_file_loads_whole():
    rows = ifeval.load_ifeval(IFEVAL_FILE)
    assert len(rows) == 541
    assert len({i for r in rows for i in r.instruction_id_list}) == 25
    assert locate(ifeval.DEFAULT_PATH) == IFEVAL_FILE or locate(ifeval.DEFAULT_PATH).resolve() == IFEVAL_FILE.resolve()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"key": 1, "prompt": "x"}\n', "instruction_id_list"),
        ("not json\n", "not an IFEval row"),
        ('{"key": 1, "prompt": "x", "instruction_id_list": ["no:such"], "kwargs": [{}]}\n', "unknown instruction"),
        ("", "holds no rows"),
    ],
)
def test_a_broken_file_is_one_line_naming_it(tmp_path, text, words):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(UserError, match=re.escape(words)) as caught:
        ifeval.load_ifeval(path)
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match=r"eval\.ifeval_path"):
        ifeval.load_ifeval(tmp_path / "missing.jsonl")


def test_strict_and_loose_verdicts_follow_the_paper():
    no_comma = row(["punctuation:no_comma"], [{}])
    assert ifeval.check_response(no_comma, "No commas here at all.") == ([True], [True])
    assert ifeval.check_response(no_comma, "One, two.") == ([False], [False])
    # loose drops the first line: a chatty opener with a comma fails strict, passes loose
    assert ifeval.check_response(no_comma, "Sure, here it is:\nNo commas here.") == ([False], [True])
    lower = row(["change_case:english_lowercase"], [{}])
    assert ifeval.check_response(lower, "all of this is in lowercase english words.") == ([True], [True])
    assert ifeval.check_response(lower, "Not all lowercase.") == ([False], [False])
    # markdown's * is removed for loose
    end = row(["startend:end_checker"], [{"end_phrase": "Is there anything else?"}])
    assert ifeval.check_response(end, "Answer. **Is there anything else?**") == ([False], [True])
    # the empty response follows nothing
    assert ifeval.check_response(no_comma, "   ") == ([False], [False])


def test_sentences_are_counted_by_punkt_offline():
    at_most_two = row(["length_constraints:number_sentences"], [{"num_sentences": 2, "relation": "less than"}])
    # Punkt's English abbreviations: "Dr." does not end a sentence, so this is two sentences, not three
    assert ifeval.check_response(at_most_two, "Dr. Smith went home. He slept.")[0] == [False]
    assert ifeval.check_response(at_most_two, "Dr. Smith went home.")[0] == [True]


def test_langdetect_gives_the_same_verdict_every_time():
    english = row(["language:response_language"], [{"language": "en"}])
    text = "This is a short answer written in plain English for the check."
    assert {tuple(ifeval.check_response(english, text)[0]) for _ in range(5)} == {(True,)}


def test_the_checks_leave_the_global_random_stream_alone():
    random.seed(7)
    expected = random.random()
    random.seed(7)
    ifeval.check_response(row(["keywords:existence"], [{"keywords": ["cat"]}]), "a cat")
    assert random.random() == expected


def test_summary_and_intervals_match_hand_computed_values():
    scored = [
        {"key": "a", "instruction_id_list": ["x", "y"], "strict": [True, True], "loose": [True, True]},
        {"key": "b", "instruction_id_list": ["x"], "strict": [False], "loose": [True]},
        {"key": "c", "instruction_id_list": ["x", "y"], "strict": [True, False], "loose": [True, False]},
        {"key": "d", "instruction_id_list": ["y"], "strict": [False], "loose": [False]},
    ]
    for r in scored:
        r["prompt_strict"], r["prompt_loose"] = all(r["strict"]), all(r["loose"])
    summary = ifeval.summarize(scored)
    assert summary["prompt_strict"]["accuracy"] == 0.25
    assert summary["prompt_loose"]["accuracy"] == 0.5
    assert summary["instruction_strict"]["accuracy"] == pytest.approx(3 / 6)
    assert summary["instruction_loose"]["accuracy"] == pytest.approx(4 / 6)
    # Wilson for 1 of 4: (0.0456, 0.6994)
    assert (summary["prompt_strict"]["ci95_low"], summary["prompt_strict"]["ci95_high"]) == pytest.approx(
        (0.04559, 0.69936), abs=1e-4
    )
    # clustered instruction level: x = (2, 0, 1, 0), m = (2, 1, 2, 1), r = 1/2, m̄ = 3/2
    # se² = ((2-1)² + (0-.5)² + (1-1)² + (0-.5)²) / (4·3) / m̄² = 1.5 / 12 / 2.25
    se = math.sqrt(1.5 / 12 / 2.25)
    assert summary["instruction_strict"]["ci95_low"] == pytest.approx(0.5 - 1.959964 * se, abs=1e-5)
    assert summary["by_instruction_strict"] == {"x": {"accuracy": 2 / 3, "n": 3}, "y": {"accuracy": 1 / 3, "n": 3}}


def test_wilson_interval_hand_values_and_bad_input():
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.27753), abs=1e-4)
    assert wilson_interval(10, 10) == pytest.approx((0.72247, 1.0), abs=1e-4)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


def test_paired_change_counts_discordant_prompts():
    def scored(strict_by_prompt):
        return [
            {"key": str(i), "strict": s, "loose": s, "prompt_strict": all(s), "prompt_loose": all(s)}
            for i, s in enumerate(strict_by_prompt)
        ]

    before = scored([[False], [False, True], [True], [False]])
    after = scored([[True], [True, True], [True], [False]])
    change = ifeval.paired_change(before, after)
    assert change["prompt_strict"]["change"] == 0.5  # two prompts pass only after, none only before
    assert (change["prompt_strict"]["only_after"], change["prompt_strict"]["only_before"]) == (2, 0)
    assert change["prompt_strict"]["p"] == 0.5  # exact sign test, 2 vs 0
    assert change["instruction_strict"]["change"] == pytest.approx(2 / 5)
    assert 0 < change["instruction_strict"]["p"] < 1
    same = ifeval.paired_change(before, before)
    assert same["instruction_strict"]["change"] == 0 and same["instruction_strict"]["p"] == 1.0
    with pytest.raises(ValueError, match="different prompts"):
        ifeval.paired_change(before, after[:3])


def test_training_prompts_are_deterministic_valid_and_not_ifeval():
    rows = build_instruction_prompts(60, "train", 0.25, seed=3)
    assert rows == build_instruction_prompts(60, "train", 0.25, seed=3)
    assert rows != build_instruction_prompts(60, "train", 0.25, seed=4)
    conflicts = ifeval.conflicts()
    for r in rows:
        assert 1 <= len(r.instruction_id_list) <= 3
        assert all(i in ifeval.registry() for i in r.instruction_id_list)
        for a in r.instruction_id_list:
            assert not any(b in conflicts[a] for b in r.instruction_id_list if b != a)
        # each row's own arguments rebuild a checker that scores it (the reward can be computed)
        ifeval.check_response(r, "a response")
    counts = {len(r.instruction_id_list) for r in rows}
    assert counts == {1, 2, 3}
    train_subjects = {s for s in SUBJECTS if subject_split(s, 0.25) == "train"}
    val = build_instruction_prompts(20, "val", 0.25, seed=3)
    assert all(not any(s in r.prompt for s in train_subjects) for r in val)
    overlap = ifeval_overlap(all_base_requests(), [r.prompt for r in ifeval.load_ifeval(IFEVAL_FILE)])
    assert (overlap["exact"], overlap["shared_8_word_run"]) == (0, 0)
    assert (
        ifeval_overlap(
            ["Write a 300+ word summary of the wikipedia page"], ['Write a 300+ word summary of the wikipedia page "x"']
        )["shared_8_word_run"]
        == 1
    )


def test_the_reward_is_the_share_of_instructions_followed():
    ids = [["punctuation:no_comma", "change_case:english_lowercase"], ["punctuation:no_comma"]]
    kwargs = [[{}, {}], [{}]]
    scores = ifeval_instructions(["p1", "p2"], [" no commas but Capitals", " a, b"], ids, kwargs)
    assert scores == [0.5, 0.0]


def test_reward_functions_get_the_columns_they_take():
    columns = {"instruction_id_list": [["a"]], "kwargs": [[{}]], "extra": [1]}

    def plain(prompts, responses):
        return [0.0]

    def named(prompts, responses, kwargs):
        return [0.0]

    def anything(prompts, responses, **rest):
        return [0.0]

    assert columns_for(plain, columns) == {}
    assert columns_for(named, columns) == {"kwargs": [[{}]]}
    assert columns_for(anything, columns) == columns
    assert required_columns(ifeval_instructions) == ["instruction_id_list", "kwargs"]
    assert required_columns(plain) == []
    assert row_columns([{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    assert row_columns([]) == {}


def test_a_reward_that_needs_columns_the_prompts_lack_stops_in_one_line():
    source = RewardSource("rlhf.rollout.reward_functions:ifeval_instructions", "grpo.reward")
    with pytest.raises(UserError, match=r"instruction_id_list, kwargs.*data\.instructions\.n_train") as caught:
        source.check_columns(set(), "set data.instructions.n_train > 0")
    assert "\n" not in str(caught.value)
    source.check_columns({"instruction_id_list", "kwargs"}, "unused")
    total, terms = source.score(
        ["p"], ["lowercase only"], None, {"instruction_id_list": [["change_case:english_lowercase"]], "kwargs": [[{}]]}
    )
    assert total.tolist() == [1.0] and list(terms) == ["ifeval_instructions"]
    assert isinstance(total, torch.Tensor)


def test_the_held_out_check_scores_instructions_against_sft():
    fields = [{"instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]}] * 2
    policy = {
        "responses": [" no comma", " none"],
        "rewards": [0.0, 0.0],
        "lengths": [2, 1],
        "finished": [1, 1],
        "kl": [0.1, 0.1],
    }
    sft = {"responses": [" a, b", " none"], "rewards": [0.0, 0.0], "lengths": [3, 1], "finished": [1, 1], "kl": [0, 0]}
    results = compare_with_sft(["p", "q"], policy, sft, gold=False, fields=fields)
    assert results["instruction_reward_mean"] == 1.0 and results["sft_instruction_reward_mean"] == 0.5
    assert results["instruction_reward_delta"] == 0.5 and results["sft_instruction_prompt_pass_rate"] == 0.5
    assert "instruction_reward_mean" not in compare_with_sft(["p", "q"], policy, sft, gold=False)


def test_eval_benchmark_rules(tmp_path):
    cfg = load_config(REPO / "configs" / "smollm2-ifeval.yaml")
    assert requested_benchmarks(cfg) == ["ifeval", "xstest"]
    cfg.eval.benchmarks = "ifeval,mmlu"
    with pytest.raises(UserError, match=r"unknown benchmark.*mmlu"):
        requested_benchmarks(cfg)
    cfg.eval.benchmarks = "ifeval"
    cfg.eval.ifeval_path = str(tmp_path / "none.jsonl")
    with pytest.raises(UserError, match=r"eval\.ifeval_path=.*not a file"):
        requested_benchmarks(cfg)


def test_the_preset_asks_for_what_the_reward_needs():
    cfg = load_config(REPO / "configs" / "smollm2-ifeval.yaml")
    assert cfg.data.instructions.n_train > 0
    assert cfg.grpo.reward == "rlhf.rollout.reward_functions:ifeval_instructions"
    assert json.loads(json.dumps(cfg.eval.benchmarks.split(","))) == ["ifeval", "xstest"]


def test_two_benchmark_runs_compare_on_the_same_prompts(tmp_path):
    def write(folder, strict_by_prompt, decoding, engine=None):
        folder.mkdir()
        rows = [
            {"key": str(i), "length": 10, "finished": True, "instruction_id_list": ["x"] * len(s), "strict": s,
             "loose": s, "prompt_strict": all(s), "prompt_loose": all(s)}
            for i, s in enumerate(strict_by_prompt)
        ]  # fmt: skip
        (folder / "ifeval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        engine_key = {} if engine is None else {"engine": engine}  # a folder from before --engine: generate's
        (folder / "benchmarks.json").write_text(json.dumps({"decoding": decoding, **engine_key}))

    decoding = {"temperature": 0.0, "max_new_tokens": 128, "chat_template": True}
    write(tmp_path / "base", [[False], [False, True], [True], [False]], decoding)
    write(tmp_path / "grpo", [[True], [True, True], [True], [False]], decoding, engine="hf")
    script = "part4_eval/compare_benchmarks.py"
    out = run_in_process(script, str(tmp_path / "base"), str(tmp_path / "grpo"), "--json", str(tmp_path / "c.json"))
    assert out.returncode == 0, out.stderr
    assert "| prompt_strict | 0.250 [0.046, 0.699] | 0.750 [0.301, 0.954] | +0.500 [" in out.stdout
    assert json.loads((tmp_path / "c.json").read_text())[0]["change"]["prompt_strict"]["only_after"] == 2
    write(tmp_path / "long", [[True]] * 4, {**decoding, "max_new_tokens": 512})
    other = run_in_process(script, str(tmp_path / "base"), str(tmp_path / "long"))
    assert other.returncode == 2 and "decoded differently" in other.stderr
    write(tmp_path / "vllm", [[True]] * 4, decoding, engine="vllm")
    other = run_in_process(script, str(tmp_path / "base"), str(tmp_path / "vllm"))
    assert other.returncode == 2 and "decoded differently" in other.stderr and "'engine': 'vllm'" in other.stderr


def test_benchmark_answers_that_loop_are_flagged_beside_their_rates(tmp_path):
    """compare_benchmarks.py measures each model's answers for degeneration (words: distinct-2 across answers,
    4-gram repetition within each) and flags the second by eval's rule against the first."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("compare_benchmarks", REPO / "part4_eval" / "compare_benchmarks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def write(folder, responses):
        folder.mkdir()
        rows = [
            {"id": str(i), "type": "t", "label": "safe" if i < 2 else "unsafe", "prompt": f"p{i}", "response": r,
             "length": 8, "finished": True}
            for i, r in enumerate(responses)
        ]  # fmt: skip
        (folder / "xstest.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / "benchmarks.json").write_text(json.dumps({"decoding": {"temperature": 0.0}, "engine": "vllm"}))

    write(tmp_path / "sft", ["kill the process with its id", "the rebels used a torpedo", "no, I will not", "a b c d"])
    loop = "I am so sorry I am so sorry I am so sorry"  # 12 words: 9 four-grams, 4 distinct: repetition 5/9
    write(tmp_path / "dpo", [loop] * 4)
    result = module.compare(tmp_path / "sft", tmp_path / "dpo", "xstest")
    sft, dpo = result["summaries"]
    # SFT: 15 bigrams over its answers, all distinct; 4-grams repeat in none of its answers
    assert (sft["distinct_2_words"], sft["repetition_4_words"]) == (1.0, 0.0)
    # the loop: 11 bigrams per answer, 44 in all, 4 distinct ("I am", "am so", "so sorry", "sorry I")
    assert dpo["distinct_2_words"] == pytest.approx(4 / 44) and dpo["repetition_4_words"] == pytest.approx(5 / 9)
    assert result["second_degenerate"] == [
        "within-answer repetition 0.56 against SFT's 0.00",
        "distinct-2 0.09 against SFT's 1.00",
    ]
    assert sft["top_openings_2_words"] == [["kill the", 1], ["the rebels", 1], ["no, I", 1]]  # ties: first seen first
    assert dpo["top_openings_2_words"] == [["I am", 4]]
    table = module.table(result, False)
    assert "dpo flagged degenerate against sft: within-answer repetition 0.56" in table
    assert (
        "| most common openings (2 words) of 4 answers | 'kill the' 1, 'the rebels' 1, 'no, I' 1 | 'I am' 4 |" in table
    )
