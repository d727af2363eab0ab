"""Bad judge inputs: no API key, a base URL where nothing answers, and answers that are not verdicts.
The OpenAI judge runs against the fake OpenAI-compatible server of tests/fake_openai.py on 127.0.0.1.
A judge's trouble never stops the eval stage: the judge is skipped, or its judgments are counted
invalid (never a win or a tie) with one line per problem that names the cause and the fix."""

from __future__ import annotations

import shutil
import socket

import pytest
from fake_openai import KEY, FakeOpenAI, hh, settings

from rlhf import judges as J
from rlhf.errors import UserError

PROMPTS = [hh(f"What is {i} plus 1?") for i in range(5)]
A = [f"GOOD {i + 1}." for i in range(5)]
B = [f"{i + 2}." for i in range(5)]


def test_missing_api_key_skips_the_judge_without_a_request(server, monkeypatch, tmp_path):
    monkeypatch.delenv(J.API_KEY_ENV)
    judge = J.OpenAIJudge(settings(server), cache_path=tmp_path / "cache.jsonl")
    assert not judge.available() and J.API_KEY_ENV in judge.unavailable_reason  # eval reports it as the status
    with pytest.raises(UserError) as error:
        judge.compare(PROMPTS, A, B)
    assert "\n" not in str(error.value) and J.API_KEY_ENV in str(error.value)
    assert server.requests == [] and not (tmp_path / "cache.jsonl").exists()


def closed_port() -> int:
    """A port on 127.0.0.1 with nothing listening (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_base_url_stops_the_batch_after_one_request_gives_up(server, tmp_path):
    """Before, every request retried on its own: with the default settings (5 retries, 1 s base backoff)
    about half a minute per judgment, for hundreds of judgments."""
    url = f"http://127.0.0.1:{closed_port()}/v1"
    s = settings(server, base_url=url, max_retries=2, max_concurrency=2, timeout_s=1.0)
    cmp = J.OpenAIJudge(s, cache_path=tmp_path / "cache.jsonl").compare(PROMPTS, A, B)
    assert cmp.outcomes == ["invalid"] * 5 and cmp.summary()["n"] == 0  # no win, loss or tie is claimed
    assert cmp.info["n_failed"] == 10 and cmp.info["n_requests"] <= 2 * 3  # at most the in-flight requests retried
    assert server.requests == []
    [problem] = cmp.problems()
    assert "10 of 10 judgments failed" in problem and f"nothing answers at {url}" in problem
    assert "check judge.base_url or OPENAI_BASE_URL" in problem and "not attempted" in problem
    assert KEY not in problem and "\n" not in problem
    assert not (tmp_path / "cache.jsonl").exists()  # failures are never cached: a re-run asks again


def test_timeouts_are_still_retried_per_request(server):
    """Unlike an address where nothing listens, a slow server may answer the next request."""
    s = settings(server, timeout_s=1.0, max_retries=1, max_concurrency=1)  # ALWAYS_SLOW sleeps 1.5 s
    cmp = J.OpenAIJudge(s).compare([hh("Q1"), hh("Q2")], ["ALWAYS_SLOW a.", "GOOD b."], ["x.", "y."])
    assert cmp.outcomes == ["invalid", "A"]  # the second prompt was still judged


def test_answers_without_a_verdict_are_counted_invalid_and_cached(server, tmp_path):
    cache = tmp_path / "cache.jsonl"
    prompts, a, b = PROMPTS[:3], [f"MALFORMED {x}" for x in A[:3]], B[:3]
    cmp = J.OpenAIJudge(settings(server), cache_path=cache).compare(prompts, a, b)
    assert cmp.outcomes == ["invalid"] * 3
    assert (cmp.summary()["n"], cmp.summary()["n_invalid"], cmp.summary()["ties"]) == (0, 3, 0)
    assert cmp.problems() == ["openai: 6 answers had no 'Winner: A|B|tie' line, counted invalid"]
    # the raw answers are kept, so a fixed parser needs no new requests
    before = len(server.requests)
    again = J.OpenAIJudge(settings(server), cache_path=cache).compare(prompts, a, b)
    assert len(server.requests) == before and again.info["n_cached"] == 6


class OddServer(FakeOpenAI):
    """Answers that are not chat completions: HTMLPAGE (a web page), NOCHOICES (an empty choice list),
    NULLCONTENT (a message without content)."""

    def respond(self, user, attempt, auth, model):
        if "HTMLPAGE" in user:
            return 200, "<html><body>Welcome to nginx!</body></html>", 0.0
        if "NOCHOICES" in user:
            return 200, {**self.completion(model, ""), "choices": []}, 0.0
        if "NULLCONTENT" in user:
            answer = self.completion(model, "")
            answer["choices"][0]["message"]["content"] = None
            return 200, answer, 0.0
        return super().respond(user, attempt, auth, model)


@pytest.fixture
def odd_server(server):
    """An OddServer with the `server` fixture's environment (key set, no proxy)."""
    odd = OddServer()
    yield odd
    odd.close()


@pytest.mark.parametrize(
    "marker, error",
    [
        ("HTMLPAGE", "not a chat completion ('<html><body>Welcome to nginx!"),
        ("NOCHOICES", "the response holds no message content"),
        ("NULLCONTENT", "the response holds no message content"),
    ],
)
def test_a_reply_that_is_not_a_chat_completion_is_a_failed_judgment(odd_server, marker, error):
    cmp = J.OpenAIJudge(settings(odd_server)).compare([hh("Q"), hh("R")], [f"{marker} a.", "GOOD b."], ["x.", "y."])
    assert cmp.outcomes == ["invalid", "A"]  # the other prompt is judged as usual
    assert len(odd_server.requests) == 4  # such a reply is not retried
    [problem] = cmp.problems()
    assert "2 of 4 judgments failed" in problem and error in problem and "\n" not in problem
    if marker == "HTMLPAGE":
        assert "check that judge.base_url is an OpenAI-compatible /v1 endpoint" in problem


def test_eval_stage_with_the_llm_judge_writes_the_key_into_no_file(server, rl_run):
    """The eval stage as a user runs it, with a fake key in the environment and the LLM judge on
    127.0.0.1: the server receives the key, and no file of the run folder contains it."""
    from conftest import run_script

    shutil.copy(rl_run / "data" / "val.jsonl", rl_run / "data" / "test.jsonl")  # the template has no test split
    run_script(
        "part4_eval/evaluate.py",
        rl_run,
        "eval.judges=gold,reward,openai",
        "eval.num_prompts=6",
        "eval.best_of_n=2",
        "eval.best_of_n_prompts=3",
        "eval.suites=false",
        "eval.max_new_tokens=8",
        f"judge.base_url={server.url}",
        "judge.model=judge-test",
    )
    assert server.requests and all(auth == f"Bearer {KEY}" for _, auth, _ in server.requests)
    written = [p for p in rl_run.rglob("*") if p.is_file()]
    assert (rl_run / "eval" / "openai_cache.jsonl") in written
    assert not [p for p in written if KEY.encode() in p.read_bytes()]
