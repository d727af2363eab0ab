"""Preference data in the Anthropic HH-RLHF format: loading, parsing, filtering and splitting.

A raw row is `{"chosen": dialogue, "rejected": dialogue}`, each a whole conversation of
`\\n\\nHuman: ...` and `\\n\\nAssistant: ...` turns (Bai et al. 2022, arXiv 2204.05862). We split
each dialogue into a *prompt* (everything up to and including the final `\\n\\nAssistant:`)
and a *response* (the text after it). The processed files every later stage reads hold
`{"prompt", "chosen", "rejected"}` with responses only, plus any metadata the source had.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import statistics
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from rlhf.errors import UserError

HUMAN = "\n\nHuman:"
ASSISTANT = "\n\nAssistant:"
LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")

# Every reason a raw pair can be dropped, in the order they are checked. The data stage
# reports a count for each: this is the edge-case table of README.md.
DROP_REASONS = (
    "malformed",  # not a mapping with string `chosen` and `rejected`
    "no_assistant_turn",  # a dialogue without "\n\nAssistant:"
    "diverging_prompts",  # chosen and rejected differ before the final assistant turn
    "tie",  # identical chosen and rejected responses
    "empty_response",  # a response that is empty after stripping whitespace
    "response_too_short",  # fewer than data.min_response_tokens tokens
    "response_too_long",  # more than data.max_response_tokens tokens
    "prompt_too_long",  # more than data.max_prompt_tokens tokens
)
# What the user can do about each reason, for the one-line errors of the data stage.
DROP_HINTS = {
    "malformed": "each row must be a JSON object with string 'chosen' and 'rejected' fields",
    "no_assistant_turn": "each dialogue needs a '\\n\\nAssistant:' turn",
    "diverging_prompts": "chosen and rejected must share every turn before the final response",
    "tie": "chosen and rejected responses must differ",
    "empty_response": "responses must not be empty",
    "response_too_short": "lower data.min_response_tokens",
    "response_too_long": "raise data.max_response_tokens",
    "prompt_too_long": "raise data.max_prompt_tokens",
}
# Rows that are not HH pairs at all (as opposed to pairs filtered by design): counted and skipped up
# to data.max_invalid_fraction of a split, see `check_invalid_share`.
INVALID_REASONS = ("malformed", "no_assistant_turn")


@dataclass(frozen=True)
class ParsedPair:
    prompt: str
    chosen: str
    rejected: str


def split_dialogue(dialogue: str) -> tuple[str, str]:
    """Split a dialogue at its final assistant turn: (prompt ending in "\\n\\nAssistant:", response).

    Raises ValueError when there is no assistant turn. Only the *final* "\\n\\nAssistant:" counts,
    so a "Human:" inside a turn (without the leading blank line) stays part of that turn.
    """
    cut = dialogue.rfind(ASSISTANT)
    if cut < 0:
        raise ValueError("no assistant turn")
    cut += len(ASSISTANT)
    return dialogue[:cut], dialogue[cut:]


def parse_pair(row: object) -> ParsedPair | str:
    """A ParsedPair, or the name of the DROP_REASONS entry that rejects the row (before tokenization)."""
    if not isinstance(row, dict) or not isinstance(row.get("chosen"), str) or not isinstance(row.get("rejected"), str):
        return "malformed"
    try:
        chosen_prompt, chosen = split_dialogue(row["chosen"])
        rejected_prompt, rejected = split_dialogue(row["rejected"])
    except ValueError:
        return "no_assistant_turn"
    if chosen_prompt != rejected_prompt:
        # The two dialogues branch before the last assistant turn, so the final responses answer
        # different prompts. Pairing them would compare answers to different questions; drop.
        return "diverging_prompts"
    if chosen == rejected:
        return "tie"
    if not chosen.strip() or not rejected.strip():
        return "empty_response"
    return ParsedPair(chosen_prompt, chosen, rejected)


def prompt_split(prompt: str, val_fraction: float) -> str:
    """'val' or 'train' from a stable hash of the prompt, so no prompt appears in both splits."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2**64
    return "val" if bucket < val_fraction else "train"


# ----------------------------------------------------------------------------- loading


def is_local_source(path: str) -> bool:
    """A file suffix, an existing path or an explicit filesystem prefix means local; else a Hub id."""
    return path.endswith(LOCAL_SUFFIXES) or Path(path).exists() or path.startswith(("/", "./", "../", "~"))


def local_files(path: str) -> dict[str, list[Path]]:
    """Map split name -> files for a local file or folder. A folder's files are assigned to
    'test' when their name contains 'test', else to 'train'."""
    root = Path(path)
    if not root.exists():
        raise UserError(
            f"data.path '{path}' does not exist; give an HH-format .jsonl/.jsonl.gz/.json/.parquet file or folder, "
            "a Hub id, or 'embedded'"
        )
    files = (
        [root]
        if root.is_file()
        else sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(LOCAL_SUFFIXES))
    )
    if not files:
        raise UserError(
            f"data.path '{path}' holds no .jsonl, .jsonl.gz, .json or .parquet files; "
            "put HH-format files in it, or point data.path at one"
        )
    if root.is_file() and not root.name.endswith(LOCAL_SUFFIXES):
        raise UserError(f"data.path '{path}' has an unsupported suffix; use one of {', '.join(LOCAL_SUFFIXES)}")
    splits: dict[str, list[Path]] = {"train": [], "test": []}
    for f in files:
        splits["test" if "test" in f.name.lower() else "train"].append(f)
    return splits


def read_rows(file: Path) -> Iterable[object]:
    """Yield raw rows of one local file. A malformed JSON line is yielded as None (counted as malformed)."""
    name = file.name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            table = pq.read_table(file)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise UserError(
                f"cannot read {file} as Parquet ({' '.join(str(exc).split())[:200]}); "
                "check that it is a complete Parquet file, or convert it to .jsonl"
            ) from None
        yield from table.to_pylist()
        return
    opener = gzip.open if name.endswith(".gz") else open
    try:
        # JSON Lines ends a row only at "\n" (a "\r" inside a row stays part of it; JSON ignores a trailing "\r")
        with opener(file, "rt", encoding="utf-8", newline="\n") as handle:
            if name.endswith(".json"):
                try:
                    payload = json.load(handle)
                except json.JSONDecodeError as exc:
                    raise UserError(
                        f"{file} is not valid JSON ({exc.msg} at line {exc.lineno}); "
                        'HH .json files hold a list of {"chosen", "rejected"} rows'
                    ) from None
                if not isinstance(payload, list):
                    raise UserError(
                        f"{file} holds a JSON {type(payload).__name__}, not a list; "
                        'HH .json files hold a list of {"chosen", "rejected"} rows'
                    )
                yield from payload
                return
            for line in handle:
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError:
                        yield None
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise UserError(
            f"cannot read {file}: {' '.join(str(exc).split())[:200]}; "
            "check that it is complete, UTF-8 text and in the format its suffix names"
        ) from None


def load_raw_splits(path: str) -> dict[str, list[object]]:
    """Raw rows per split ('train', 'test') from a local source or the Hugging Face Hub."""
    if is_local_source(path):
        splits = {split: [row for f in files for row in read_rows(f)] for split, files in local_files(path).items()}
    else:
        splits = _load_hub(path)
    if not splits["train"]:
        raise UserError(
            f"data.path '{path}' has no training rows; give a non-empty HH-format file "
            "(a file whose name contains 'test' is used as the test split)"
        )
    return splits


def _load_hub(path: str) -> dict[str, list[object]]:
    import datasets

    try:
        dataset = datasets.load_dataset(path)
    except Exception as exc:  # network, auth or a wrong id: all are a bad data.path for the user
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(
            f"cannot load dataset '{path}' from the Hugging Face Hub ({first}); "
            "offline, point data.path at a local HH-format file"
        ) from None
    return {
        "train": list(dataset["train"]) if "train" in dataset else [],
        "test": list(dataset["test"]) if "test" in dataset else [],
    }


# ----------------------------------------------------------------------------- processed files


def write_jsonl(path: Path, rows: Iterable[dict]) -> None:
    """Write atomically: a crash never leaves a half-written file under the final name."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserError(f"missing {path}; run the stage that writes it first")
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def count_reasons(reasons: Iterable[str]) -> dict[str, int]:
    counts = Counter(reasons)
    return {reason: counts.get(reason, 0) for reason in DROP_REASONS}


def check_invalid_share(source: str, split: str, reasons: Iterable[str], n_rows: int, max_fraction: float) -> None:
    """Invalid rows (INVALID_REASONS) are counted and skipped up to `max_fraction` of a split's
    `n_rows` (data.max_invalid_fraction); more means the file is not in HH format: a one-line error."""
    counts = count_reasons(reasons)
    n_invalid = sum(counts[reason] for reason in INVALID_REASONS)
    if n_rows and n_invalid > max_fraction * n_rows:
        worst = max(INVALID_REASONS, key=counts.get)
        raise UserError(
            f"data.path '{source}': {n_invalid} of {n_rows} {split} rows are invalid "
            f"({counts[worst]} {worst}: {DROP_HINTS[worst]}), more than data.max_invalid_fraction={max_fraction:g}; "
            "fix the file, or raise data.max_invalid_fraction to skip them"
        )


def check_splits_not_empty(n_train: int, n_val: int, train_reasons: Iterable[str], val_fraction: float) -> None:
    """Train and val must both hold pairs after filtering; the one-line error names the cause: the
    commonest drop reason when nothing survived, else the validation share."""
    if n_train and n_val:
        return
    if n_train or n_val:
        empty = "val" if n_train else "train"
        fix = "raise it (or give more prompts)" if empty == "val" else "lower it below 1"
        raise UserError(f"the {empty} split is empty with data.val_fraction={val_fraction}; {fix}")
    counts = count_reasons(train_reasons)
    worst = max(counts, key=counts.get)
    raise UserError(
        f"the train split is empty after filtering ({counts[worst]} pairs dropped as {worst}); {DROP_HINTS[worst]}"
    )


def token_filter_reason(prompt_len: int, chosen_len: int, rejected_len: int, data_cfg) -> str | None:
    """The DROP_REASONS entry for a pair whose token counts break a `data` limit, else None."""
    if min(chosen_len, rejected_len) < data_cfg.min_response_tokens:
        return "response_too_short"
    if max(chosen_len, rejected_len) > data_cfg.max_response_tokens:
        return "response_too_long"
    if prompt_len > data_cfg.max_prompt_tokens:
        return "prompt_too_long"
    return None


def length_stats(lengths: dict[str, list[int]]) -> dict[str, float]:
    """Token-length statistics of one split: {"prompt", "chosen", "rejected"} -> lists of counts."""
    chosen, rejected, prompt = lengths["chosen"], lengths["rejected"], lengths["prompt"]
    if not chosen:
        return {"n": 0}
    spread = statistics.pstdev
    return {
        "n": len(chosen),
        "prompt_tokens_mean": statistics.fmean(prompt),
        "chosen_tokens_mean": statistics.fmean(chosen),
        "chosen_tokens_std": spread(chosen),
        "rejected_tokens_mean": statistics.fmean(rejected),
        "rejected_tokens_std": spread(rejected),
        "chosen_minus_rejected_mean": statistics.fmean(c - r for c, r in zip(chosen, rejected)),
        "chosen_longer_fraction": sum(c > r for c, r in zip(chosen, rejected)) / len(chosen),
    }
