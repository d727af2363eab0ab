"""Tests for rlhf.rollout.reward_spec and rlhf.rollout.rewards (the reward spec: parsing, importing, run-time checks,
the weighted sum)
and the example reward function in rlhf.rollout.reward_functions. Expected values are worked out by hand."""

import math
import re

import pytest
import torch

from rlhf import task
from rlhf.core.errors import UserError
from rlhf.methods.rules import check_grpo_config, check_ppo_config
from rlhf.rollout.reward_functions import MAX_WORDS, concise_sentence
from rlhf.rollout.reward_spec import MODEL, RewardTerm, format_reward_spec, load_reward_function, parse_reward_spec
from rlhf.rollout.rewards import RewardSource, call_reward_function, combine_rewards, load_reward_source
from rlhf.stage.schema import GRPOConfig, PPOConfig

PROMPT = "\n\nHuman: What is 3 plus 4?\n\nAssistant:"


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(
        torch.as_tensor(actual, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64), rtol=tol, atol=tol
    )


# ---------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    "spec, expected, canonical",
    [
        ("model", [(1.0, MODEL, "model")], "model"),
        ("rlhf.task:gold_rewards", [(1.0, "rlhf.task:gold_rewards", "gold_rewards")], "rlhf.task:gold_rewards"),
        (
            "model + 0.5*rlhf.rollout.reward_functions:concise_sentence",
            [(1.0, MODEL, "model"), (0.5, "rlhf.rollout.reward_functions:concise_sentence", "concise_sentence")],
            "model + 0.5*rlhf.rollout.reward_functions:concise_sentence",
        ),
        (
            " 2 * model-1e-1*pkg.mod:fn ",
            [(2.0, MODEL, "model"), (-0.1, "pkg.mod:fn", "fn")],
            "2*model - 0.1*pkg.mod:fn",
        ),
        ("-model+1e+2*a:f", [(-1.0, MODEL, "model"), (100.0, "a:f", "f")], "-model + 100*a:f"),
        # two functions with the same name: metric names from their full paths
        ("a.b:score + c:score", [(1.0, "a.b:score", "a_b_score"), (1.0, "c:score", "c_score")], "a.b:score + c:score"),
    ],
)
def test_parse_reward_spec_by_hand(spec, expected, canonical):
    terms = parse_reward_spec(spec, "ppo.reward")
    assert [(t.weight, t.source, t.name) for t in terms] == expected
    assert format_reward_spec(terms) == canonical
    assert parse_reward_spec(canonical, "ppo.reward") == terms  # the canonical spelling reads back the same


@pytest.mark.parametrize(
    "spec, message",
    [
        ("", "ppo.reward is empty; expected 'model', 'package.module:function' or a weighted sum"),
        ("rm", "ppo.reward: unknown reward source 'rm' in 'rm'"),
        ("model model", "ppo.reward='model model' is malformed at 'model'"),
        ("model +", "ppo.reward='model +' is malformed at '+'"),
        ("0.5*", "ppo.reward='0.5*' is malformed at '0.5*'"),
        ("pkg.mod:fn:extra", "is malformed at ':extra'"),
        (
            "model + model",
            "ppo.reward: 'model' appears twice in 'model + model'; give it one term with the summed weight",
        ),
        ("0*model", "ppo.reward: 'model' has weight 0 in '0*model'; leave the term out instead"),
    ],
)
def test_malformed_specs_are_one_line_errors(spec, message):
    with pytest.raises(UserError) as info:
        parse_reward_spec(spec, "ppo.reward")
    assert message in str(info.value) and "\n" not in str(info.value)


# ---------------------------------------------------------------- importing


def test_load_reward_function_finds_functions_and_names_every_mistake(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "LIMIT = 3\n\ndef short(prompts, responses):\n    return [1.0] * len(responses)\n"
    )
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('no config file\\nsecond line')\n")
    (tmp_path / "needs_dep.py").write_text("import not_installed_package_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward_function("my_rewards:short", "grpo.reward")([PROMPT], [" 7."]) == [1.0]
    assert load_reward_function("rlhf.task:gold_rewards", "grpo.reward") is task.gold_rewards
    cases = {
        "no_such_module_xyz:f": "grpo.reward: no module named 'no_such_module_xyz' "
        "(from reward function 'no_such_module_xyz:f'); "
        "check the spelling, and run from the folder that holds the module, put that folder on PYTHONPATH, "
        "or install it",
        "rlhf.no_such_module:f": "grpo.reward: no module named 'rlhf.no_such_module'",
        # a file name where the module name goes (README's my_rewards.py): drop the .py
        "my_rewards.py:short": "grpo.reward: no module named 'my_rewards.py' (from reward function "
        "'my_rewards.py:short'); name the module without '.py': grpo.reward=my_rewards:short",
        "no_such_file.py:f": "grpo.reward: no module named 'no_such_file.py' (from reward function "
        "'no_such_file.py:f'); name the module without '.py': grpo.reward=no_such_file:f",
        "needs_dep:f": "grpo.reward: module 'needs_dep' imports 'not_installed_package_xyz', which is not installed; "
        "install it",
        "broken_rewards:f": "grpo.reward: importing 'broken_rewards' for reward function 'broken_rewards:f' failed: "
        "RuntimeError: no config file",
        "my_rewards:shrot": "grpo.reward: module 'my_rewards' has no function 'shrot'; "
        "did you mean 'my_rewards:short'?",
        "my_rewards:LIMIT": "grpo.reward: 'my_rewards:LIMIT' is not callable (int); "
        "it must be a function(prompts, responses) -> list[float]",
    }
    for source, message in cases.items():
        with pytest.raises(UserError) as info:
            load_reward_function(source, "grpo.reward")
        assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_stage_config_checks_import_the_reward_at_start_up():
    check_ppo_config(PPOConfig(reward="model + 0.5*rlhf.rollout.reward_functions:concise_sentence", eval_every=4))
    with pytest.raises(
        UserError, match=re.escape("ppo.reward: module 'rlhf.rollout.reward_functions' has no function 'concise'")
    ):
        check_ppo_config(PPOConfig(reward="rlhf.rollout.reward_functions:concise"))
    with pytest.raises(UserError, match=re.escape("grpo.reward: unknown reward source 'gold'")):
        check_grpo_config(GRPOConfig(reward="gold"))
    with pytest.raises(UserError, match=r"grpo.eval_every=-1 must be >= 0 \(0: only the final evaluation\)"):
        check_grpo_config(GRPOConfig(eval_every=-1))


# ---------------------------------------------------------------- run-time checks and the weighted sum


def test_call_reward_function_checks_one_finite_float_per_response():
    responses = [" a", " b", " c"]
    close(call_reward_function("m:f", lambda p, r: [1, 0.5, -2], [PROMPT] * 3, responses), [1.0, 0.5, -2.0])
    close(
        call_reward_function("m:f", lambda p, r: torch.tensor([1.0, 2.0, 3.0]), [PROMPT] * 3, responses),
        [1.0, 2.0, 3.0],
    )
    cases = [
        (
            lambda p, r: [1.0, 2.0],
            "reward function 'm:f' returned 2 scores for 3 responses; it must return one float per response",
        ),
        (
            lambda p, r: [1.0, math.nan, math.inf],
            "reward function 'm:f' returned nan for response 1 (2 non-finite in all)",
        ),
        (lambda p, r: None, "reward function 'm:f' returned NoneType"),
        (lambda p, r: ["good", "bad", "ok"], "reward function 'm:f' returned list"),
    ]
    for function, message in cases:
        with pytest.raises(UserError) as info:
            call_reward_function("m:f", function, [PROMPT] * 3, responses)
        assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_combine_rewards_by_hand():
    model = torch.tensor([1.0, -2.0])
    function = torch.tensor([0.5, 1.0])
    # 1 * model + 0.5 * function - 2 * function
    close(combine_rewards([1.0, 0.5, -2.0], [model, function, function]), [1.0 + 0.25 - 1.0, -2.0 + 0.5 - 2.0])
    assert combine_rewards([1.0], [torch.tensor([1.0], dtype=torch.bfloat16)]).dtype == torch.float32


def test_reward_source_scores_a_batch_with_the_model_and_functions():
    source = RewardSource(
        "model + 0.5*rlhf.rollout.reward_functions:concise_sentence - 2*rlhf.task:gold_rewards", "ppo.reward"
    )
    assert (
        source.uses_model
        and source.spec == "model + 0.5*rlhf.rollout.reward_functions:concise_sentence - 2*rlhf.task:gold_rewards"
    )
    prompts, responses = [PROMPT, PROMPT], [" 3 plus 4 is 7.", " 3 plus 4 is 9"]
    gold = [task.gold_score(p, r) for p, r in zip(prompts, responses)]
    assert gold[0] == 1.0 and gold[1] < 1.0  # right and ended; wrong and unfinished
    total, parts = source.score(prompts, responses, torch.tensor([0.2, -0.4]))
    # concise_sentence: 0.5 + 0.5 for the first; the second does not end a sentence: 0.5
    close(parts["model"], [0.2, -0.4])
    close(parts["concise_sentence"], [1.0, 0.5])
    close(parts["gold_rewards"], gold)
    close(total, [0.2 + 0.5 * 1.0 - 2 * gold[0], -0.4 + 0.5 * 0.5 - 2 * gold[1]])
    functions_only = load_reward_source("grpo", "rlhf.task:gold_rewards")
    assert not functions_only.uses_model
    total, parts = functions_only.score(prompts, responses, None)
    close(total, gold)
    assert list(parts) == ["gold_rewards"]
    assert [RewardTerm(1.0, MODEL, "model")] == load_reward_source("ppo", "model").terms


# ---------------------------------------------------------------- the example reward function


def test_concise_sentence_by_hand():
    long_answer = " " + " ".join(["word"] * MAX_WORDS) + "."
    responses = [
        " 3 plus 4 is 7.",
        " Is it 7?",
        ' He said "no."',
        " 3 plus 4 is",
        long_answer,
        long_answer[:-1] + " more.",
        "",
        "   ",
    ]
    # ends a sentence (0.5) + at most MAX_WORDS words (0.5)
    assert concise_sentence([PROMPT] * len(responses), responses) == [1.0, 1.0, 1.0, 0.5, 1.0, 0.5, 0.0, 0.0]
