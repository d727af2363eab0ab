"""HH dialogues as chat messages: a pretrained chat model reads its own template, not "Human:/Assistant:" text.

An HH prompt is a run of `\\n\\nHuman: ...` and `\\n\\nAssistant: ...` turns ending in an empty final
`\\n\\nAssistant:` (`rlhf.data.split_dialogue`). `hh_messages` turns it into `[{"role", "content"}]` messages,
`render_prompt` into the text the model's chat template makes of them with the generation prompt appended
(SmolLM2: `<|im_start|>user\\n...<|im_end|>\\n<|im_start|>assistant\\n`), and `fit_turns` drops its earliest
turns until it fits a token budget: truncation from the left that never cuts a turn, or the template, in half.
"""

from __future__ import annotations

import re

from rlhf.core.errors import UserError

_TURN = re.compile(r"\n\n(Human|Assistant):")
_ROLES = {"Human": "user", "Assistant": "assistant"}
# `hh_text` as a Jinja chat template, for a model trained on HH text that has no template of its own (the tiny and
# GPT-2 presets): written into an exported GGUF file, it lets llama.cpp and Ollama prompt the model as it was trained.
# A system message is read as a user turn (HH has no system role).
HH_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ '\\n\\nAssistant: ' }}{% else %}{{ '\\n\\nHuman: ' }}{% endif %}"
    "{{ message['content'] }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '\\n\\nAssistant:' }}{% endif %}"
)


def hh_messages(prompt: str) -> list[dict[str, str]]:
    """The turns of an HH prompt as chat messages, without its final empty assistant turn. Text before the first
    turn marker (rare) joins the first message; each message's surrounding whitespace is stripped."""
    parts = _TURN.split(prompt)  # [preamble, role, text, role, text, ...]
    preamble, turns = parts[0], list(zip(parts[1::2], parts[2::2]))
    if turns and turns[-1][0] == "Assistant" and not turns[-1][1].strip():
        turns = turns[:-1]
    messages = [{"role": _ROLES[role], "content": text.strip()} for role, text in turns]
    if preamble.strip():
        if messages:
            messages[0]["content"] = f"{preamble.strip()}\n{messages[0]['content']}"
        else:
            messages = [{"role": "user", "content": preamble.strip()}]
    return messages


def hh_text(messages: list[dict[str, str]]) -> str:
    """The HH prompt of `messages` (the inverse of `hh_messages` for well-formed turns)."""
    names = {role: name for name, role in _ROLES.items()}
    return "".join(f"\n\n{names[m['role']]}: {m['content']}" for m in messages) + "\n\nAssistant:"


def check_chat_template(tokenizer, source: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            f"data.chat_template=true, but the tokenizer of '{source}' has no chat template; "
            "set data.chat_template=false to train on the raw 'Human:/Assistant:' text"
        )


def render_prompt(tokenizer, prompt: str) -> str:
    """An HH prompt in the tokenizer's chat template, ending where the assistant's answer begins."""
    return tokenizer.apply_chat_template(hh_messages(prompt), tokenize=False, add_generation_prompt=True)


def fit_turns(prompt: str, fits) -> str | None:
    """`prompt` with its earliest turns dropped, a human turn first, until `fits(candidate)`; None when even its
    last human turn alone does not fit. Returns `prompt` itself when it fits whole."""
    messages = hh_messages(prompt)
    for start in range(len(messages)):
        if messages[start]["role"] != "user":
            continue
        candidate = prompt if start == 0 else hh_text(messages[start:])
        if fits(candidate):
            return candidate
    return None
