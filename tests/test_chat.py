"""HH dialogues in a chat model's template (rlhf/chat.py), checked by hand, and the data stage's use of them."""

from __future__ import annotations

import pytest

from rlhf.chat import fit_turns, hh_messages, hh_text, render_prompt
from rlhf.core.errors import UserError

DIALOGUE = "\n\nHuman: How do I bake bread?\n\nAssistant: With flour.\n\nHuman: And yeast?\n\nAssistant:"


class TemplateTokenizer:
    """A chat template as SmolLM2's (ChatML with a default system turn), applied in Python."""

    chat_template = "chatml"

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        assert not tokenize
        text = "<|im_start|>system\nBe kind.<|im_end|>\n" if messages[0]["role"] != "system" else ""
        text += "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


def test_hh_messages_splits_turns_and_drops_the_final_empty_assistant_turn():
    assert hh_messages(DIALOGUE) == [
        {"role": "user", "content": "How do I bake bread?"},
        {"role": "assistant", "content": "With flour."},
        {"role": "user", "content": "And yeast?"},
    ]


def test_hh_messages_keeps_a_human_inside_a_turn_and_a_preamble():
    # "Human:" without the blank line before it is part of the turn (as rlhf.data.split_dialogue reads it)
    assert hh_messages("\n\nHuman: Say 'Human: hi'\n\nAssistant:") == [{"role": "user", "content": "Say 'Human: hi'"}]
    assert hh_messages("Context.\n\nHuman: Q?\n\nAssistant:") == [{"role": "user", "content": "Context.\nQ?"}]


def test_hh_text_inverts_hh_messages():
    assert hh_text(hh_messages(DIALOGUE)) == DIALOGUE


def test_render_prompt_applies_the_template_with_the_generation_prompt():
    assert render_prompt(TemplateTokenizer(), DIALOGUE) == (
        "<|im_start|>system\nBe kind.<|im_end|>\n"
        "<|im_start|>user\nHow do I bake bread?<|im_end|>\n"
        "<|im_start|>assistant\nWith flour.<|im_end|>\n"
        "<|im_start|>user\nAnd yeast?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_fit_turns_drops_whole_earliest_turns_until_it_fits():
    assert fit_turns(DIALOGUE, lambda text: True) == DIALOGUE  # fits whole: the prompt itself, byte for byte
    assert fit_turns(DIALOGUE, lambda text: len(text) < 60) == "\n\nHuman: And yeast?\n\nAssistant:"
    assert fit_turns(DIALOGUE, lambda text: False) is None  # even the last human turn is too long


def test_fit_turns_starts_on_a_human_turn():
    seen = []
    fit_turns(DIALOGUE, lambda text: seen.append(text) or False)
    assert [hh_messages(text)[0]["role"] for text in seen] == ["user", "user"]


def test_data_stage_renders_truncates_and_strips(monkeypatch):
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("analyze_data", REPO / "part1_reward" / "analyze_data.py")
    analyze_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(analyze_data)
    monkeypatch.setattr(analyze_data, "encode_texts", lambda tok, texts: [list(text) for text in texts])

    class Data:
        chat_template, truncate_prompts, max_prompt_tokens = True, True, 120

    rows = [
        {"prompt": DIALOGUE, "chosen": " Yes, yeast. ", "rejected": " No."},
        {"prompt": "\n\nHuman: " + "x" * 200 + "\n\nAssistant:", "chosen": " a", "rejected": " b"},
    ]
    formatted = analyze_data.format_prompts(rows, ("chosen", "rejected"), TemplateTokenizer(), Data)
    assert formatted[0] == {
        "prompt": render_prompt(TemplateTokenizer(), "\n\nHuman: And yeast?\n\nAssistant:"),
        "chosen": "Yes, yeast.",
        "rejected": "No.",
        "dialogue": DIALOGUE,
    }
    assert formatted[1] == "prompt_too_long"


def test_chat_template_needs_a_template():
    from rlhf.chat import check_chat_template

    class Plain:
        chat_template = None

    with pytest.raises(UserError, match=r"has no chat template; set data\.chat_template=false"):
        check_chat_template(Plain(), "gpt2")
