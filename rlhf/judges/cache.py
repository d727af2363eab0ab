"""The LLM judge's cache: one JSONL line per completed judgment, keyed by the exact request.

Append-only, flushed and fsynced as each judgment arrives, keyed by sha256(model, prompt
version, prompt, first response, second response): the order is which response is shown first.
A re-run bills nothing already judged and a crash loses nothing; a truncated last line (crash
mid-write) is skipped. The cache keeps the answer (bounded), so verdicts are re-parsed on load and
a parser fix needs no new requests; a cut answer also keeps the verdict read from the whole one.
The cache is where each answer is stored: `Comparison.to_dict` refers to it by `cache_key`,
however many pairings share it. Failed requests are never cached: a re-run asks them again.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path


def cache_key(model: str, prompt_version: str, prompt: str, first: str, second: str) -> str:
    """sha256 of (judge model, prompt version, prompt, first shown, second shown): the order is
    which response is shown first, so A-first and B-first are different keys."""
    blob = json.dumps([model, prompt_version, prompt, first, second], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgmentCache:
    """Append-only JSONL of completed LLM judgments: {"key", "answer", "prompt_tokens", ...}; an
    answer cut by `bound_answer` also has "answer_chars" (its full length) and "verdict" (read from
    the whole answer, which the cut one may no longer show).

    Each `put` writes one line, then flushes and fsyncs, so a crash loses at most the line being
    written; on load, lines that do not parse (a truncated last line) are skipped and counted in
    `n_corrupt`, and the next write starts on a fresh line.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.entries: dict[str, dict] = {}
        self.n_corrupt = 0
        self._lock = threading.Lock()
        self._needs_newline = False
        if self.path.is_file():
            data = self.path.read_bytes()
            self._needs_newline = bool(data) and not data.endswith(b"\n")
            for line in data.decode("utf-8", errors="replace").splitlines():
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                    self.entries[entry["key"]] = entry
                except (json.JSONDecodeError, KeyError, TypeError):
                    self.n_corrupt += 1

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, entry: dict) -> None:
        line = json.dumps(entry, ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                if self._needs_newline:
                    f.write("\n")
                    self._needs_newline = False
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            self.entries[entry["key"]] = entry
