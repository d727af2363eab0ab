"""Where an RL stage's training score comes from: the reward model, Python functions, or a weighted sum.

`ppo.reward`, `grpo.reward`, `raft.reward` and `online_dpo.reward` hold a *reward spec*: one or more terms joined by
`+` or `-`, each an optional weight `w*` and a source,

    model                                        the run's trained reward model (<run>/reward/model); the default
    package.module:function                      a reward function, e.g. rlhf.task:gold_rewards
                                                 (the embedded task's gold judge)
    model + 0.5*rlhf.rollout.reward_functions:concise_sentence      a weighted sum

so that score = sum_k w_k * source_k(prompts, responses). The stage subtracts the missing-EOS
penalty from that sum, as it does from a reward-model score. This is DeepSeekMath's rule-based
reward (arXiv 2402.03300) and the custom reward functions of TRL (`reward_funcs`) and OpenRLHF.

A reward function is called once per rollout batch as `function(prompts, responses)`: prompts as
HH-format text ending in "\\n\\nAssistant:", responses as decoded text without the EOS token
(usually starting with a space), one of each per rollout. It returns one finite float per response.
rlhf/rollout/reward_functions.py holds an example. The module is imported when the stage starts, before
torch loads (this module imports no torch; `rlhf.methods.rules`), from the current directory or the installed
packages, so a misspelt module or function fails in one line. The stage fingerprint (rlhf/stage/run.py) covers
the spec string, not the function's code: after editing a function, re-run the stage with --force.
"""

from __future__ import annotations

import difflib
import importlib
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from rlhf.core.errors import UserError

MODEL = "model"  # the source name of the trained reward model

# One term: an optional sign (required between terms), an optional "weight *", then a source.
_TERM = re.compile(
    r"\s*(?P<sign>[+-])?\s*(?:(?P<weight>(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\*\s*)?"
    r"(?P<source>[A-Za-z_][\w.]*(?::[A-Za-z_]\w*)?)\s*"
)
_FUNCTION = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")

RewardFunction = Callable[[list[str], list[str]], list[float]]


@dataclass(frozen=True)
class RewardTerm:
    weight: float
    source: str  # MODEL or "package.module:function"
    name: str  # metric name: "model", the function's name, or its dotted path with "_" where names clash


def parse_reward_spec(spec: str, key: str) -> list[RewardTerm]:
    """Terms of a reward spec (module docstring), validated; `key` (e.g. "ppo.reward") names the
    config key in the one-line errors."""
    help_text = (
        "expected 'model', 'package.module:function' or a weighted sum like 'model + 0.5*package.module:function'"
    )
    text = spec.strip()
    if not text:
        raise UserError(f"{key} is empty; {help_text}")
    terms: list[tuple[float, str]] = []
    position = 0
    while position < len(text):
        match = _TERM.match(text, position)
        if match is None or match.end() == position or (terms and match["sign"] is None):
            raise UserError(f"{key}='{spec}' is malformed at '{text[position:]}'; {help_text}")
        source = match["source"]
        if source != MODEL and not _FUNCTION.fullmatch(source):
            raise UserError(f"{key}: unknown reward source '{source}' in '{spec}'; {help_text}")
        weight = float(match["weight"] or 1.0) * (-1.0 if match["sign"] == "-" else 1.0)
        if weight == 0 or not math.isfinite(weight):
            raise UserError(f"{key}: '{source}' has weight {weight:g} in '{spec}'; leave the term out instead")
        if source in [s for _, s in terms]:
            raise UserError(f"{key}: '{source}' appears twice in '{spec}'; give it one term with the summed weight")
        terms.append((weight, source))
        position = match.end()
    short = [MODEL if source == MODEL else source.rpartition(":")[2] for _, source in terms]
    names = [
        name if short.count(name) == 1 else source.replace(".", "_").replace(":", "_")
        for name, (_, source) in zip(short, terms)
    ]
    return [RewardTerm(weight, source, name) for (weight, source), name in zip(terms, names)]


def format_reward_spec(terms: list[RewardTerm]) -> str:
    """The canonical spelling of parsed terms: 'model', 'pkg.mod:fn', 'model + 0.5*pkg.mod:fn',
    'model - 2*pkg.mod:fn'."""
    text = ""
    for term in terms:
        body = term.source if abs(term.weight) == 1 else f"{abs(term.weight):g}*{term.source}"
        sign = "-" if term.weight < 0 else "+"
        text = (f"{text} {sign} " if text else "-" if term.weight < 0 else "") + body
    return text


def load_reward_function(source: str, key: str) -> RewardFunction:
    """Import "package.module:function" and return the function; one-line errors for a module that
    is missing or fails to import, a missing attribute, or one that is not callable. The current
    directory is searched first, as `python -m` does, so a user's own module next to the command works."""
    module_name, _, attribute = source.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        if module_name.endswith(".py"):  # a file name where the module name goes
            raise UserError(
                f"{key}: no module named '{module_name}' (from reward function '{source}'); name the module "
                f"without '.py': {key}={module_name.removesuffix('.py')}:{attribute}"
            ) from None
        if missing == module_name or module_name.startswith(missing + "."):  # the module itself, not one it imports
            raise UserError(
                f"{key}: no module named '{missing}' (from reward function '{source}'); check the spelling, "
                f"and run from the folder that holds the module, put that folder on PYTHONPATH, or install it"
            ) from None
        raise UserError(
            f"{key}: module '{module_name}' imports '{missing}', which is not installed; install it"
        ) from None
    except Exception as exc:  # the user's module raised while importing: show what, in one line
        message = str(exc).splitlines()[0] if str(exc) else ""
        raise UserError(
            f"{key}: importing '{module_name}' for reward function '{source}' failed: {type(exc).__name__}: {message}"
        ) from None
    if not hasattr(module, attribute):
        candidates = [name for name in dir(module) if not name.startswith("_") and callable(getattr(module, name))]
        close = difflib.get_close_matches(attribute, candidates, n=1)
        hint = f"; did you mean '{module_name}:{close[0]}'?" if close else ""
        raise UserError(f"{key}: module '{module_name}' has no function '{attribute}'{hint}")
    function = getattr(module, attribute)
    if not callable(function):
        raise UserError(
            f"{key}: '{source}' is not callable ({type(function).__name__}); "
            "it must be a function(prompts, responses) -> list[float]"
        )
    return function


def load_reward_spec(spec: str, key: str) -> tuple[list[RewardTerm], dict[str, RewardFunction]]:
    """`spec` parsed and its functions imported: the terms, and each function term's function by its source."""
    terms = parse_reward_spec(spec, key)
    return terms, {term.source: load_reward_function(term.source, key) for term in terms if term.source != MODEL}
