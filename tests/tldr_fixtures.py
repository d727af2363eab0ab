"""Small TL;DR files in the real column layouts, for tests/test_tldr_data.py and tests/test_tldr_e2e.py.

- Reddit TL;DR posts (vwxyzjn/summarize_from_feedback_tldr_3_filtered): id, subreddit, title, post, summary
  (no leading space).
- OpenAI's raw comparisons (openai/summarize_from_feedback, comparisons): info{id, post, title, subreddit, site,
  article}, summaries[2]{text, policy, note}, choice, worker, batch, split, extra. CNN/DM rows have an article
  and no post.
- Huang et al. 2024's preprocessed comparisons (vwxyzjn/summarize_from_feedback_oai_preprocessing_1706381144):
  the raw fields plus query (ending "TL;DR:"), chosen and rejected (leading space, "<|endoftext|>" appended),
  and token columns.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SUBREDDITS = ("relationships", "AskReddit", "personalfinance", "tifu")
WORDS = ("my", "friend", "car", "job", "money", "rent", "city", "dog", "cat", "sister", "brother", "boss")


def query(subreddit: str, title: str, post: str) -> str:
    return f"SUBREDDIT: r/{subreddit}\n\nTITLE: {title}\n\nPOST: {post}\n\nTL;DR:"


def post(i: int) -> dict:
    """The fields of Reddit post i; its summary names the post's first three words."""
    rng = random.Random(i)
    words = [rng.choice(WORDS) for _ in range(12 + i % 9)]
    return {
        "id": f"t3_{i:05d}",
        "subreddit": SUBREDDITS[i % len(SUBREDDITS)],
        "title": f"Question {i} about my {words[0]}",
        "post": " ".join(words) + ".",
        "summary": f"{words[0]} {words[1]} {words[2]} problem",
    }


def sft_rows(n: int, start: int = 0) -> list[dict]:
    return [post(i) for i in range(start, start + n)]


def raw_comparison(i: int, choice: int | None = None) -> dict:
    fields = post(i)
    better, worse = f" {fields['summary']}.", f" I {fields['post'][:20]}"
    choice = i % 2 if choice is None else choice
    summaries = [better, worse] if choice == 0 else [worse, better]
    return {
        "info": {k: fields[k] for k in ("id", "post", "title", "subreddit")} | {"site": None, "article": None},
        "summaries": [{"text": text, "policy": f"sup{k}", "note": None} for k, text in enumerate(summaries)],
        "choice": choice,
        "worker": "w1",
        "batch": "batch1",
        "split": "train",
        "extra": {"confidence": None},
    }


def preprocessed_comparison(i: int) -> dict:
    row = raw_comparison(i)
    chosen, rejected = (row["summaries"][row["choice"]]["text"], row["summaries"][1 - row["choice"]]["text"])
    info = row["info"]
    return row | {
        "query": query(info["subreddit"], info["title"], info["post"]),
        "query_token": [0] * 8,
        "chosen": chosen + "<|endoftext|>",
        "rejected": rejected + "<|endoftext|>",
        "chosen_token": [1] * 4,
        "rejected_token": [2] * 4,
        "chosen_policy": "sup0",
        "rejected_policy": "sup1",
        "policies": "sup0--sup1",
    }


def cnndm_comparison(i: int) -> dict:
    """A CNN/DM row of the raw comparisons: an article and no post (not a TL;DR pair)."""
    row = raw_comparison(i)
    row["info"] = {"id": f"cnn{i}", "post": None, "title": "News", "subreddit": None, "article": "Some news."}
    return row


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
