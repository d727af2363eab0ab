"""End-to-end through the real command line: the collect stage on a copy of the session's tiny run,
with each of its three annotators, and the reward and DPO stages training on what it wrote.

The openai annotator talks to a real HTTP server on 127.0.0.1 (tests/fake_openai.py) that prefers
the shorter response and answers 429 to the first attempt of some requests: the labels must follow
its verdicts through both presentation orders, the retries and the cache must work, and the API key
must appear in no file the run wrote.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TINY_TEST_OVERRIDES, read_summary, run_script
from fake_openai import KEY, FakeOpenAI

from rlhf import judges as J
from rlhf import task

pytestmark = pytest.mark.slow

SCRIPT = "part1_reward/collect_pairs.py"
SMALL = ["collect.prompts=48", "collect.samples_per_prompt=3", "collect.batch_size=48"]


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def copy_run(tiny_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    return run


def test_simulated_annotator_pairs_train_the_reward_model_and_dpo(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path)
    run_script(SCRIPT, run, *TINY_TEST_OVERRIDES, *SMALL)
    stats = read_summary(run)["collect"]
    rows = read_rows(run / "collect" / "train.jsonl")
    train_prompts = {row["prompt"] for row in read_rows(run / "data" / "train.jsonl")}

    # Accounting: 48 prompts x 3 samples -> 3 pairs per prompt, each written or dropped for one reason.
    assert stats["samples"] == 144 and len(read_rows(run / "collect" / "samples.jsonl")) == 144
    assert stats["pairs_compared"] + stats["dropped"]["tie"] + stats["dropped"]["empty_response"] == 48 * 3
    assert (
        stats["n_pairs"]
        == len(rows)
        == stats["pairs_compared"]
        - sum(
            stats["dropped"][k] for k in ("annotator_tie", "annotator_invalid", "response_too_long", "prompt_too_long")
        )
    )
    assert rows and all(row["prompt"] in train_prompts and row["chosen"] != row["rejected"] for row in rows)

    # Gold on every row, as the data stage writes it; the simulated annotator labels gold ties too (gold never
    # filters what the methods train on), so it never says "tie".
    for row in rows:
        assert row["annotator"] == "simulated"
        assert row["gold_chosen"] == task.gold_score(row["prompt"], row["chosen"])
        assert row["gold_rejected"] == task.gold_score(row["prompt"], row["rejected"])
        assert 0 < row["p_label"] < 1
    decisive = [r for r in rows if r["gold_chosen"] != r["gold_rejected"]]
    assert 0 < len(decisive) < len(rows)  # the SFT policy's samples often tie in gold: those pairs are kept
    assert stats["gold_agreement"] == pytest.approx(
        sum(r["gold_chosen"] > r["gold_rejected"] for r in decisive) / len(decisive)
    )
    assert stats["dropped"]["annotator_tie"] == 0 and stats["gold_tie_rate"] > 0
    assert 0.5 < stats["noise_ceiling"] < 1 and stats["annotator"]["judge"] == "simulated"

    # The reward model trains on exactly those pairs; DPO on the dataset's and those.
    run_script(
        "part1_reward/train_reward.py",
        run,
        *TINY_TEST_OVERRIDES,
        *SMALL,
        "reward.pairs=collected",
        "reward.max_steps=3",
    )
    reward = read_summary(run)["reward_model"]
    assert reward["pairs"] == "collected" and reward["train_pairs"] == len(rows) and reward["steps"] == 3
    run_script(
        "part3_dpo/train_dpo.py",
        run,
        *TINY_TEST_OVERRIDES,
        *SMALL,
        "dpo.pairs=both",
        "dpo.max_train_pairs=null",
        "dpo.max_steps=2",
        "dpo.eval_prompts=16",
    )
    dpo = read_summary(run)["dpo"]
    n_dataset = len(read_rows(run / "data" / "train.jsonl"))
    assert dpo["pairs"] == "both" and dpo["train_pairs"] == n_dataset + len(rows)

    # Changing the collection makes the reward model that read it stale: re-running it asks for collect first.
    stale = run_script(
        "part1_reward/train_reward.py",
        run,
        *TINY_TEST_OVERRIDES,
        "collect.prompts=40",
        "collect.samples_per_prompt=3",
        "reward.pairs=collected",
        check=False,
    )
    assert stale.returncode == 2 and "stage 'collect' was run with a different config" in stale.stderr


class ShorterWins(FakeOpenAI):
    """An LLM judge that prefers the shorter response (a tie on equal length), and rate-limits the
    first attempt of every request whose text has an even length."""

    def respond(self, user: str, attempt: int, auth: str, model: str):
        if attempt == 1 and len(user) % 2 == 0:
            return 429, {"error": {"message": "Rate limit reached", "type": "requests"}}, 0.0
        first = user.split("[Response A]")[1].split("[Response B]")[0].strip()
        second = user.split("[Response B]")[1].split("Explain your decision")[0].strip()
        winner = "A" if len(first) < len(second) else "B" if len(second) < len(first) else "tie"
        return 200, self.completion(model, f"The shorter one says enough.\nWinner: {winner}"), 0.0


@pytest.fixture
def shorter_wins(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(J.BASE_URL_ENV, raising=False)
    monkeypatch.setenv(J.API_KEY_ENV, KEY)
    fake = ShorterWins()
    yield fake
    fake.close()


def test_openai_annotator_labels_retries_caches_and_never_writes_the_key(tiny_run, tmp_path, shorter_wins):
    run = copy_run(tiny_run, tmp_path)
    overrides = [
        *TINY_TEST_OVERRIDES,
        "collect.annotator=openai",
        "collect.prompts=16",
        "collect.samples_per_prompt=2",
        f"judge.base_url={shorter_wins.url}",
        "judge.model=judge-test",
        "judge.max_retries=2",
        "judge.retry_base_delay_s=0.01",
        "judge.retry_max_delay_s=0.05",
    ]
    run_script(SCRIPT, run, *overrides)
    stats = read_summary(run)["collect"]
    info = stats["annotator"]
    rows = read_rows(run / "collect" / "train.jsonl")

    # Both orders judged for each compared pair; the first attempt of some was rate-limited and retried.
    assert info["judge"] == "openai" and info["n_judgments"] == 2 * stats["pairs_compared"]
    assert info["n_failed"] == 0 and info["n_retries"] > 0
    assert len(shorter_wins.requests) == info["n_requests"] == info["n_judgments"] + info["n_retries"]
    assert info["usage"]["prompt_tokens"] == 100 * info["n_judgments"]  # billed once per judgment, not per retry
    # The labels follow the judge through both orders: the shorter response is chosen, equal lengths dropped.
    assert rows and all(len(r["chosen"].strip()) < len(r["rejected"].strip()) for r in rows)
    assert stats["n_pairs"] + stats["dropped"]["annotator_tie"] == stats["pairs_compared"]

    # A re-run bills nothing: every judgment comes from the cache, and the pairs are the same.
    before = len(shorter_wins.requests)
    run_script(SCRIPT, run, *overrides, "--force")
    assert len(shorter_wins.requests) == before
    assert read_summary(run)["collect"]["annotator"]["n_cached"] == info["n_judgments"]
    assert read_rows(run / "collect" / "train.jsonl") == rows

    # The key went to the server, and into no file of the run.
    assert all(auth == f"Bearer {KEY}" for _, auth, _ in shorter_wins.requests)
    written = [p for p in run.rglob("*") if p.is_file()]
    assert (run / "collect" / "openai_cache.jsonl") in written
    assert not [p for p in written if KEY.encode() in p.read_bytes()]


def test_reward_annotator_chooses_the_response_its_model_scores_higher(tiny_run, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run = copy_run(tiny_run, tmp_path)
    folder = run / "reward" / "model"
    run_script(SCRIPT, run, *TINY_TEST_OVERRIDES, *SMALL, "collect.annotator=reward", f"collect.reward_model={folder}")
    rows = read_rows(run / "collect" / "train.jsonl")
    assert rows and read_summary(run)["collect"]["annotator"]["judge"] == "reward"

    # Scored independently, by the saved model through transformers alone: chosen outscores rejected.
    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    def score(prompt: str, response: str) -> float:
        ids = tokenizer(prompt + response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            return model(input_ids=torch.tensor([ids])).logits[0, 0].item()

    margins = [score(r["prompt"], r["chosen"]) - score(r["prompt"], r["rejected"]) for r in rows]
    assert min(margins) > -1e-4, f"a pair whose chosen response the reward model scores lower: {min(margins)}"
