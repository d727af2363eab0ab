"""Preference pairs and demonstrations: loading, parsing, filtering and splitting.

Formats (`RowFormat`, chosen by `data.format`):
- `hh`, pairs: Anthropic HH-RLHF. A raw row is `{"chosen": dialogue, "rejected": dialogue}`, each a whole
  conversation of `\\n\\nHuman: ...` and `\\n\\nAssistant: ...` turns (Bai et al. 2022, arXiv 2204.05862).
  We split each dialogue into a *prompt* (everything up to and including the final `\\n\\nAssistant:`)
  and a *response* (the text after it).
- `tldr`, pairs: OpenAI's summarize-from-feedback comparisons (Stiennon et al. 2020), raw
  (`info{subreddit, title, post}`, `summaries[2]{text}`, `choice`) or as preprocessed by Huang et al. 2024
  (`query`, `chosen`, `rejected` text fields, which win when present).
- `tldr`, demonstrations (`data.sft_path`): the filtered Reddit TL;DR posts, raw (`subreddit`, `title`,
  `post`, `summary`) or preprocessed (`query`, `reference_response`).

Every format goes through the same edge-case table (DROP_REASONS), token filters and prompt-level split.
The processed files every later stage reads hold `{"prompt", "chosen", "rejected"}` (pairs) or
`{"prompt", "response"}` (demonstrations), responses only, plus metadata the source had.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from rlhf.core.errors import UserError

HUMAN = "\n\nHuman:"
ASSISTANT = "\n\nAssistant:"
LOCAL_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".parquet")

# Every reason a raw pair can be dropped, in the order they are checked. The data stage
# reports a count for each: docs/metrics.md lists them (data.dropped.<reason>).
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
    "malformed": "each row must be a JSON object with string 'chosen' and 'rejected' dialogues, or TRL's "
    "'prompt', 'chosen' and 'rejected' (text, or lists of role/content messages); docs/data.md has an example of each",
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
class RowFormat:
    """How one kind of raw row becomes a processed row, and what a valid one holds (for the one-line errors)."""

    read: Callable[[object], dict | str]  # raw row -> processed row, or the DROP_REASONS entry that rejects it
    responses: tuple[str, ...]  # the processed row's response fields
    malformed_hint: str  # what a valid raw row holds
    kind: str  # the format's name in messages, e.g. "HH-format"

    def hint(self, reason: str) -> str:
        return self.malformed_hint if reason == "malformed" else DROP_HINTS[reason]

    def hints(self) -> dict[str, str]:
        return {reason: self.hint(reason) for reason in DROP_HINTS}


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


SPEAKERS = {"user": "Human", "assistant": "Assistant"}


def conversation_dialogue(messages: object) -> str | None:
    """A list of chat messages ({"role": "user" | "assistant" | "system", "content": str}) as one HH dialogue; a
    system message joins the next user turn. None when `messages` is not such a list."""
    if not isinstance(messages, list):
        return None
    turns, system = [], []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            return None
        role, content = message.get("role"), message["content"].strip()
        if role == "system":
            system.append(content)
        elif role in SPEAKERS:
            if role == "user" and system:
                content, system = "\n".join([*system, content]), []
            turns.append(f"\n\n{SPEAKERS[role]}: {content}")
        else:
            return None
    return "".join(turns)


def hh_prompt(prompt: str) -> str:
    """A plain-text prompt as an HH prompt ending in the assistant's turn; an HH prompt as it is."""
    if prompt.startswith("Human:"):  # HH text whose leading blank line was stripped
        prompt = "\n\n" + prompt
    if not prompt.startswith(HUMAN):
        return f"{HUMAN} {prompt.strip()}{ASSISTANT}"
    return prompt if prompt.rstrip().endswith(ASSISTANT) else prompt.rstrip() + ASSISTANT


def hh_dialogues(raw: object) -> object:
    """TRL's preference rows as HH dialogues, other rows as they are. TRL's formats: an explicit prompt,
    {"prompt", "chosen", "rejected"}, in plain text (a prompt and two responses) or as chat messages (the
    prompt's turns and each response's assistant turn); or, without a prompt, two whole conversations as
    messages that share every turn before the last. The prompt field becomes part of each dialogue."""
    if not isinstance(raw, dict):
        return raw
    prompt, chosen, rejected = raw.get("prompt"), raw.get("chosen"), raw.get("rejected")
    meta = {key: value for key, value in raw.items() if key not in ("prompt", "chosen", "rejected")}
    if isinstance(chosen, list) and isinstance(rejected, list) and (prompt is None or isinstance(prompt, list)):
        dialogues = [conversation_dialogue((prompt or []) + response) for response in (chosen, rejected)]
        return {"chosen": dialogues[0], "rejected": dialogues[1], **meta} if None not in dialogues else raw
    if isinstance(prompt, str) and isinstance(chosen, str) and isinstance(rejected, str):
        start = hh_prompt(prompt)
        return {"chosen": f"{start} {chosen.lstrip()}", "rejected": f"{start} {rejected.lstrip()}", **meta}
    return raw


def hh_row(raw: object) -> dict | str:
    """The processed HH row: prompt and responses, plus any metadata the source carried (e.g. gold scores).
    Rows in TRL's preference formats are read too (`hh_dialogues`)."""
    raw = hh_dialogues(raw)
    pair = parse_pair(raw)
    if not isinstance(pair, ParsedPair):
        return pair
    meta = {key: value for key, value in raw.items() if key not in ("chosen", "rejected")}
    return {"prompt": pair.prompt, "chosen": pair.chosen, "rejected": pair.rejected, **meta}


# Huang et al. 2024 (arXiv 2403.17031; summarize_from_feedback_details/tldr_dataset.py): the TL;DR query, built
# from a post's fields; the preprocessed sets hold it ready as `query`, truncated at a newline to 512 tokens.
TLDR_QUERY = "SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"
# vwxyzjn's preprocessing appends Pythia's EOS as text to each response; the stages append the tokenizer's own EOS.
TLDR_EOS_TEXT = "<|endoftext|>"


def _strings(mapping: object, *keys: str) -> list[str] | None:
    """The values of `keys` in `mapping` when it is a dict holding a string under each, else None."""
    if not isinstance(mapping, dict) or not all(isinstance(mapping.get(key), str) for key in keys):
        return None
    return [mapping[key] for key in keys]


def _tldr_response(text: str) -> str:
    return text.removesuffix(TLDR_EOS_TEXT)


def _tldr_query(raw: object) -> str | None:
    """The preprocessed `query`, else one built from `subreddit`, `title`, `post` (None when neither is there)."""
    if (query := _strings(raw, "query")) is not None:
        return query[0]
    fields = _strings(raw, "subreddit", "title", "post")
    return None if fields is None else TLDR_QUERY.format(subreddit=fields[0], title=fields[1], post=fields[2])


def _check_responses(responses: list[str]) -> str | None:
    if len(responses) == 2 and responses[0] == responses[1]:
        return "tie"
    if not all(text.strip() for text in responses):
        return "empty_response"
    return None


def tldr_pair_row(raw: object) -> dict | str:
    """A processed TL;DR comparison: `query`/`chosen`/`rejected` (Huang et al.'s preprocessed set) when present,
    else `info` + `summaries[choice]` vs `summaries[1 - choice]` (OpenAI's raw comparisons). CNN/DM rows, whose
    `info` has an article instead of a post, are malformed here."""
    texts = _strings(raw, "query", "chosen", "rejected")
    if texts is not None:
        prompt, chosen, rejected = texts[0], _tldr_response(texts[1]), _tldr_response(texts[2])
    else:
        summaries, choice = (raw.get("summaries"), raw.get("choice")) if isinstance(raw, dict) else (None, None)
        prompt = _tldr_query(raw.get("info")) if isinstance(raw, dict) else None
        if (
            prompt is None
            or type(choice) is not int
            or choice not in (0, 1)
            or not isinstance(summaries, list)
            or len(summaries) != 2
            or any(_strings(summary, "text") is None for summary in summaries)
        ):
            return "malformed"
        chosen, rejected = summaries[choice]["text"], summaries[1 - choice]["text"]
    reason = _check_responses([chosen, rejected])
    if reason:
        return reason
    info = raw.get("info") if isinstance(raw.get("info"), dict) else {}
    meta = {key: info[key] for key in ("id", "subreddit") if isinstance(info.get(key), str)}
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, **meta}


def tldr_demonstration_row(raw: object) -> dict | str:
    """A processed TL;DR demonstration: the query and `" " + summary` (the raw summaries have no leading space;
    Huang et al. add one), or the preprocessed `query` and `reference_response`."""
    prompt = _tldr_query(raw)
    if prompt is None:
        return "malformed"
    if (reference := _strings(raw, "reference_response")) is not None:
        response = _tldr_response(reference[0])
    elif (summary := _strings(raw, "summary")) is not None:
        response = " " + summary[0]
    else:
        return "malformed"
    reason = _check_responses([response])
    if reason:
        return reason
    return {"prompt": prompt, "response": response, **{k: raw[k] for k in ("id", "subreddit") if k in raw}}


PAIR_FIELDS = ("chosen", "rejected")
PAIR_FORMATS = {
    "hh": RowFormat(hh_row, PAIR_FIELDS, DROP_HINTS["malformed"], "HH-format"),
    "tldr": RowFormat(
        tldr_pair_row,
        PAIR_FIELDS,
        "each row needs string query/chosen/rejected, or info{subreddit,title,post}, summaries[2]{text} and choice 0/1",
        "OpenAI TL;DR-format",
    ),
}
# Demonstration sources (data.sft_path), by data.format.
DEMONSTRATION_FORMATS = {
    "tldr": RowFormat(
        tldr_demonstration_row,
        ("response",),
        "each row needs string subreddit/title/post/summary, or query and reference_response",
        "OpenAI TL;DR-format",
    ),
}


def prompt_split(prompt: str, val_fraction: float, test_fraction: float = 0.0, judge_fraction: float = 0.0) -> str:
    """'val', 'test', 'judge' or 'train' from a stable hash of the prompt, so no prompt appears in two splits:
    the hash's first `val_fraction` of [0, 1) is val, the next `test_fraction` test, the next `judge_fraction`
    the independent judge's pairs."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big") / 2**64
    for split, share in (("val", val_fraction), ("test", test_fraction), ("judge", judge_fraction)):
        if bucket < share:
            return split
        bucket -= share
    return "train"


# ----------------------------------------------------------------------------- loading


def is_local_source(path: str) -> bool:
    """A file suffix, an existing path or an explicit filesystem prefix means local; else a Hub id."""
    return path.endswith(LOCAL_SUFFIXES) or Path(path).exists() or path.startswith(("/", "./", "../", "~"))


def local_files(path: str, key: str = "data.path", kind: str = "HH-format") -> dict[str, list[Path]]:
    """Map split name -> files for a local file or folder. A folder's files are assigned to
    'test' when their name contains 'test', else to 'train'; a single file is all 'train'. `key` and `kind` name
    the source in errors."""
    root = Path(path)
    if not root.exists():
        raise UserError(
            f"{key} '{path}' does not exist; give an {kind} .jsonl/.jsonl.gz/.json/.parquet file or folder, "
            "a Hub id" + (", or 'embedded'" if key == "data.path" else "")
        )
    files = (
        [root]
        if root.is_file()
        else sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(LOCAL_SUFFIXES))
    )
    if not files:
        raise UserError(
            f"{key} '{path}' holds no .jsonl, .jsonl.gz, .json or .parquet files; "
            f"put {kind} files in it, or point {key} at one"
        )
    if root.is_file() and not root.name.endswith(LOCAL_SUFFIXES):
        raise UserError(f"{key} '{path}' has an unsupported suffix; use one of {', '.join(LOCAL_SUFFIXES)}")
    if root.is_file():  # one file is the whole source, whatever its name (data.test_fraction can hold out a test split)
        return {"train": files, "test": []}
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


def load_raw_splits(path: str, key: str = "data.path", kind: str = "HH-format") -> dict[str, list[object]]:
    """Raw rows per split ('train', 'test') from a local source or the Hugging Face Hub. `key` and `kind`
    name the source in errors (data.path, HH-format)."""
    if is_local_source(path):
        splits = {
            split: [row for f in files for row in read_rows(f)] for split, files in local_files(path, key, kind).items()
        }
    else:
        splits = _load_hub(path, key, kind)
    if not splits["train"]:
        why, fix = "", f"give a non-empty {kind} file"
        if splits["test"] and is_local_source(path):  # a folder of test files only
            why = ": every file in it is a test file (its name contains 'test')"
            fix = f"add a training file ({kind}) whose name does not contain 'test'"
        raise UserError(f"{key} '{path}' has no training rows{why}; {fix}")
    return splits


def invalid_row_lines(path: str, split: str, read: Callable[[object], dict | str], limit: int = 3) -> list[str]:
    """The "file:line" of the first `limit` rows of `split` that `read` (RowFormat.read) rejects as invalid
    (INVALID_REASONS), in a local source's JSON Lines files, read line by line as `read_rows` reads them: the data
    stage counts and skips invalid rows, and this says where the first ones are. [] for other sources."""
    if not is_local_source(path):
        return []
    found: list[str] = []
    for file in local_files(path)[split]:
        if not file.name.endswith((".jsonl", ".jsonl.gz")):
            continue
        opener = gzip.open if file.name.endswith(".gz") else open
        with opener(file, "rt", encoding="utf-8", newline="\n") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    raw = json.loads(line)
                except json.JSONDecodeError:
                    raw = None
                if read(raw) in INVALID_REASONS:
                    found.append(f"{file}:{number}")
                    if len(found) == limit:
                        return found
    return found


def _load_hub(path: str, key: str, kind: str) -> dict[str, list[object]]:
    """The Hub dataset's train split, and its test split, or its validation split when it has no test
    (the TL;DR preference set has train, validation and validation_cnndm)."""
    import datasets

    try:
        dataset = datasets.load_dataset(path)
    except Exception as exc:  # network, auth or a wrong id: all are a bad data.path for the user
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(
            f"cannot load dataset '{path}' from the Hugging Face Hub ({first}); "
            f"offline, point {key} at a local {kind} file"
        ) from None
    test = next((name for name in ("test", "validation") if name in dataset), None)
    return {
        "train": list(dataset["train"]) if "train" in dataset else [],
        "test": list(dataset[test]) if test else [],
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


def check_invalid_share(
    source: str,
    split: str,
    reasons: Iterable[str],
    n_rows: int,
    max_fraction: float,
    hints: dict[str, str] = DROP_HINTS,
    key: str = "data.path",
    where: Sequence[str] = (),
) -> None:
    """Invalid rows (INVALID_REASONS) are counted and skipped up to `max_fraction` of a split's
    `n_rows` (data.max_invalid_fraction); more means the file is in another format: a one-line error.
    `hints` (RowFormat.hints) says what a valid row holds; `key` names the config key of the source;
    `where` ("file:line" of the first invalid rows, `invalid_row_lines`) is named in the error."""
    counts = count_reasons(reasons)
    n_invalid = sum(counts[reason] for reason in INVALID_REASONS)
    if n_rows and n_invalid > max_fraction * n_rows:
        worst = max(INVALID_REASONS, key=counts.get)
        first = f", the first at {', '.join(where)}" if where else ""
        raise UserError(
            f"{key} '{source}': {n_invalid} of {n_rows} {split} rows are invalid "
            f"({counts[worst]} {worst}: {hints[worst]}{first}), more than "
            f"data.max_invalid_fraction={max_fraction:g}; fix the file, or raise data.max_invalid_fraction to skip them"
        )


def check_splits_not_empty(
    n_train: int,
    n_val: int,
    train_reasons: Iterable[str],
    val_fraction: float,
    hints: dict[str, str] = DROP_HINTS,
    what: str = "pairs",
) -> None:
    """Train and val must both hold rows after filtering; the one-line error names the cause: the
    commonest drop reason when nothing survived, else the validation share. `what`: "pairs" or "demonstrations"."""
    source = "" if what == "pairs" else f"{what} (data.sft_path): "
    if n_train and n_val:
        return
    if n_train or n_val:
        # Each prompt goes to val with probability val_fraction (a hash of its text, `prompt_split`), so about
        # 3 / val_fraction prompts give val at least one with probability ~0.95.
        kept = f"{n_train + n_val} {what} kept, all in {'train' if n_train else 'val'}"
        if n_train:
            need = f"about {math.ceil(3 / val_fraction)}" if val_fraction > 0 else "more"
            fix = f"give {need} or more prompts, or raise data.val_fraction"
        else:
            fix = "lower data.val_fraction"
        empty = "val" if n_train else "train"
        raise UserError(f"{source}the {empty} split is empty with data.val_fraction={val_fraction} ({kept}); {fix}")
    counts = count_reasons(train_reasons)
    worst = max(counts, key=counts.get)
    raise UserError(
        f"{source}the train split is empty after filtering ({counts[worst]} {what} dropped as {worst}); {hints[worst]}"
    )


def token_filter_reason(prompt_len: int, response_lens: Sequence[int], data_cfg) -> str | None:
    """The DROP_REASONS entry for a row (a pair's two responses, or one demonstration) whose token counts
    break a `data` limit, else None."""
    if min(response_lens) < data_cfg.min_response_tokens:
        return "response_too_short"
    if max(response_lens) > data_cfg.max_response_tokens:
        return "response_too_long"
    if prompt_len > data_cfg.max_prompt_tokens:
        return "prompt_too_long"
    return None


def length_stats(lengths: dict[str, list[int]]) -> dict[str, float]:
    """Token-length statistics of one split: {"prompt", then each response field} -> lists of counts;
    for pairs ("chosen", "rejected") also the length bias."""
    responses = [key for key in lengths if key != "prompt"]
    if not lengths[responses[0]]:
        return {"n": 0}
    stats = {"n": len(lengths[responses[0]]), "prompt_tokens_mean": statistics.fmean(lengths["prompt"])}
    for key in responses:
        stats[f"{key}_tokens_mean"] = statistics.fmean(lengths[key])
        stats[f"{key}_tokens_std"] = statistics.pstdev(lengths[key])
    if responses == list(PAIR_FIELDS):
        chosen, rejected = lengths["chosen"], lengths["rejected"]
        stats["chosen_minus_rejected_mean"] = statistics.fmean(c - r for c, r in zip(chosen, rejected))
        stats["chosen_longer_fraction"] = sum(c > r for c, r in zip(chosen, rejected)) / len(chosen)
    return stats


# ----------------------------------------------------------------------------- what later stages read


def read_demonstrations(data_dir: Path, split: str, separate: bool) -> list[dict]:
    """`{"prompt", "response"}` rows of a split: the data stage's demonstrations (`sft_<split>.jsonl`, from
    data.sft_path) when `separate`, else the pairs' chosen responses."""
    if separate:
        return read_jsonl(data_dir / f"sft_{split}.jsonl")
    return [{"prompt": row["prompt"], "response": row["chosen"]} for row in read_jsonl(data_dir / f"{split}.jsonl")]


def heldout_split(data_dir: Path, separate: bool) -> str:
    """The split `heldout_references` reads: "test", or "val" when the test split is empty."""
    return "test" if read_demonstrations(data_dir, "test", separate) else "val"


def heldout_references(data_dir: Path, separate: bool) -> dict[str, str]:
    """Held-out prompt -> its first reference response, in file order: the test split's demonstrations
    (`separate`) or chosen responses, from the validation split when the test split is empty."""
    rows = read_demonstrations(data_dir, "test", separate) or read_demonstrations(data_dir, "val", separate)
    references: dict[str, str] = {}
    for row in rows:
        references.setdefault(row["prompt"], row["response"])
    return references


def unique_prompts(rows: list[dict]) -> list[str]:
    """The distinct prompts of preference rows, in first-seen order."""
    return list(dict.fromkeys(row["prompt"] for row in rows))
