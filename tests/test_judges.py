"""Tests for rlhf.judges: the gold and reward judges, answer parsing, and the OpenAI judge against a
real OpenAI-compatible HTTP server that each test starts on 127.0.0.1 (never any other host): the
`server` fixture of tests/fake_openai.py, whose docstring lists the markers that drive its answers."""

import json
import re

import pytest
from fake_openai import HUGE_CHARS, KEY, hh, settings

from rlhf import judges as J
from rlhf import task as T
from rlhf.core.errors import UserError
from rlhf.judges.llm import _public_url
from rlhf.stage.run import write_json_atomic

# ----------------------------------------------------------------------------- answer parsing


@pytest.mark.parametrize(
    "answer, verdict",
    [
        ("Response A is correct.\nWinner: A", "A"),
        ("Winner: B", "B"),
        ("winner: tie", "tie"),
        ("**Winner:** A", "A"),
        ("Winner: **B**.", "B"),
        ("Winner: Response B", "B"),
        ("Verdict: [[A]]", "A"),
        ("Final verdict: draw", "tie"),
        ("Winner: Tie.", "tie"),
        ("B", "B"),
        ("[[A]]", "A"),
        ("Winner: A\nOn reflection the other one.\nWinner: B", "B"),  # the last Winner line counts
        ("I cannot decide.", "invalid"),
        ("Winner: A or B", "invalid"),
        ("Response A is better than B.", "invalid"),
        ("The winner is clear.", "invalid"),
        ("", "invalid"),
        (None, "invalid"),
    ],
)
def test_parse_verdict(answer, verdict):
    assert J.parse_verdict(answer) == verdict


def test_cache_key_depends_on_every_field_and_the_order():
    base = ("m", "v1", "p", "x", "y")
    keys = {
        J.cache_key(*base),
        J.cache_key("m2", *base[1:]),
        J.cache_key("m", "v2", *base[2:]),
        J.cache_key("m", "v1", "q", "x", "y"),
        J.cache_key("m", "v1", "p", "x2", "y"),
        J.cache_key("m", "v1", "p", "x", "y2"),
        J.cache_key("m", "v1", "p", "y", "x"),
    }
    assert len(keys) == 7


# ----------------------------------------------------------------------------- OpenAI judge


def test_openai_judge_normal_answers_both_orders(server, tmp_path):
    judge = J.OpenAIJudge(settings(server), cache_path=tmp_path / "cache.jsonl")
    prompts = [hh("What is 3 plus 4?"), hh("What is 2 plus 2?"), hh("Pick one."), hh("Say hi.")]
    a = ["GOOD 7.", "5.", "BIASED one.", "Hi."]
    b = ["9.", "GOOD 4.", "other.", "Hi."]
    cmp = judge.compare(prompts, a, b)
    # p0: GOOD is model A in both orders -> A; p1 -> B; p2: the first shown always wins -> tie;
    # p3: identical responses -> tie with no request.
    assert cmp.outcomes == ["A", "B", "tie", "tie"]
    assert [j.verdict for j in cmp.judgments_ab] == ["A", "B", "A", "tie"]
    assert [j.verdict for j in cmp.judgments_ba] == ["B", "A", "A", "tie"]
    assert len(server.requests) == 6
    for path, auth, body in server.requests:
        assert path == "/v1/chat/completions"
        assert auth == f"Bearer {KEY}"
        assert body["model"] == "judge-test" and body["temperature"] == 0 and body["max_tokens"] == 64
        assert body["messages"][0] == {"role": "system", "content": J.JUDGE_SYSTEM_PROMPT}
    sent = {m["messages"][1]["content"] for _, _, m in server.requests}
    assert J.format_judge_prompt(prompts[0], "GOOD 7.", "9.")[1]["content"] in sent  # A first
    assert J.format_judge_prompt(prompts[0], "9.", "GOOD 7.")[1]["content"] in sent  # B first
    info = cmp.info
    assert info["prompt_version"] == J.JUDGE_PROMPT_VERSION == "pairwise-v1"
    assert info["prompt_template"] == J.JUDGE_PROMPT and info["model"] == "judge-test"
    assert (info["n_judgments"], info["n_requests"], info["n_failed"], info["n_unparsed"]) == (8, 6, 0, 0)
    # 6 requests x (100 in, 10 out): 600 * 2.0/1e6 + 60 * 8.0/1e6 = 0.0012 + 0.00048 = 0.00168 USD
    usage = info["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (600, 60)
    assert usage["estimated_cost_usd"] == pytest.approx(0.00168)
    assert "estimate" in usage["note"]
    # W=1, L=1, T=2 -> win_rate (1 + 2/2)/4 = 0.5
    assert cmp.summary()["win_rate"] == 0.5 and cmp.summary()["n"] == 4
    # the answer is stored once, in the cache; the record refers to it
    record = cmp.to_dict()["records"][0]
    assert record["verdict_ab"] == "A" and "answer_ab" not in record
    assert judge.cache.get(record["cache_key_ab"])["answer"].endswith("Winner: A")
    assert record["cache_key_ab"] == J.cache_key("judge-test", "pairwise-v1", prompts[0], "GOOD 7.", "9.")


def test_openai_judge_retries_429_with_backoff(server):
    delays = []
    judge = J.OpenAIJudge(settings(server, max_concurrency=1), sleep=delays.append)
    cmp = judge.compare([hh("What is 3 plus 4?")], ["GOOD RATE429 7."], ["9."])
    assert cmp.outcomes == ["A"]
    assert len(server.requests) == 4  # per order: 429, then the answer
    assert (cmp.info["n_retries"], cmp.info["n_failed"]) == (2, 0)
    # first retry: base 0.01 s * 2**0, jittered to 50-100%
    assert len(delays) == 2 and all(0.005 <= d <= 0.01 for d in delays)


def test_openai_judge_backoff_grows_exponentially_then_gives_up(server):
    delays = []
    s = settings(server, max_retries=3, retry_base_delay_s=0.01, retry_max_delay_s=1.0)
    judge = J.OpenAIJudge(s, sleep=delays.append)
    [judgment] = judge.judge_many([(hh("Hi"), "FAIL500 x", "y")])
    assert judgment.verdict == "invalid" and judgment.attempts == 4 and len(server.requests) == 4
    assert "gave up after 4 attempts" in judgment.error
    # retry k waits base * 2**k * [0.5, 1]: [0.005, 0.01], [0.01, 0.02], [0.02, 0.04]
    for k, d in enumerate(delays):
        assert 0.01 * 2**k * 0.5 <= d <= 0.01 * 2**k
    assert len(delays) == 3


def test_openai_judge_persistent_500_keeps_completed_judgments(server, tmp_path):
    cache = tmp_path / "cache.jsonl"
    prompts = [hh("What is 3 plus 4?"), hh("What is 1 plus 1?"), hh("What is 2 plus 2?")]
    a, b = ["GOOD 7.", "FAIL500 3.", "4."], ["9.", "GOOD 2.", "GOOD 4."]
    cmp = J.OpenAIJudge(settings(server), cache_path=cache).compare(prompts, a, b)
    assert cmp.outcomes == ["A", "invalid", "B"]
    assert len(server.requests) == 4 + 2 * 3  # 2 good prompts x 2 orders + 2 orders x (1 + max_retries)
    info = cmp.info
    assert (info["n_failed"], info["n_unparsed"], info["n_retries"]) == (2, 0, 4)
    [(error, count)] = info["errors"].items()
    assert count == 2 and "InternalServerError" in error and "500" in error
    assert KEY not in error and "***" in error  # the server echoed the key; the message is scrubbed
    assert cmp.problems() == [f"openai: 2 of 6 judgments failed, counted invalid: {error} (x2)"]
    assert cmp.summary()["n_invalid"] == 1 and cmp.summary()["n"] == 2  # never a tie
    lines = cache.read_text().splitlines()
    assert len(lines) == 4  # the completed judgments are on disk, the failed ones are not
    # the server recovers: a re-run sends only the 2 failed requests
    server.fail_500 = False
    before = len(server.requests)
    again = J.OpenAIJudge(settings(server), cache_path=cache).compare(prompts, a, b)
    assert len(server.requests) - before == 2
    assert again.outcomes == ["A", "B", "B"]
    assert (again.info["n_cached"], again.info["n_failed"]) == (4, 0)


def test_openai_judge_malformed_answer_is_invalid(server, tmp_path):
    prompts = [hh("What is 3 plus 4?"), hh("What is 5 plus 1?"), hh("What is 2 plus 2?")]
    # p0: both orders malformed; p1: the A-first answer is malformed and the B-first answer says
    # model A wins: still invalid, never a win; p2: a normal answer.
    a, b = ["MALFORMED 7.", "GOOD MALFORMED_FIRST 6.", "GOOD 4."], ["9.", "8.", "5."]
    cmp = J.OpenAIJudge(settings(server), cache_path=tmp_path / "c.jsonl").compare(prompts, a, b)
    assert [j.verdict for j in cmp.judgments_ab] == ["invalid", "invalid", "A"]
    assert [j.verdict for j in cmp.judgments_ba] == ["invalid", "B", "B"]
    assert cmp.outcomes == ["invalid", "invalid", "A"]
    assert (cmp.info["n_unparsed"], cmp.info["n_failed"], cmp.info["n_invalid"]) == (3, 0, 3)
    assert cmp.judgments_ab[0].answer == "Both responses have merits and I cannot decide."
    assert cmp.problems() == ["openai: 3 answers had no 'Winner: A|B|tie' line, counted invalid"]
    s = cmp.summary()
    assert (s["n"], s["n_invalid"], s["wins"], s["ties"]) == (1, 2, 1, 0)


def test_openai_judge_timeout_is_retried(server):
    s = settings(server, timeout_s=0.5, max_retries=1)
    cmp = J.OpenAIJudge(s).compare(
        [hh("What is 3 plus 4?"), hh("What is 1 plus 2?")], ["GOOD SLOW 7.", "ALWAYS_SLOW 3."], ["9.", "GOOD 3."]
    )
    # p0: each order times out once, then succeeds; p1: every attempt times out -> failure
    assert cmp.outcomes == ["A", "invalid"]
    assert len(server.requests) == 8
    assert (cmp.info["n_failed"], cmp.info["n_retries"]) == (2, 4)
    [error] = cmp.info["errors"]
    assert "APITimeoutError" in error and "gave up after 2 attempts" in error


def test_openai_judge_auth_error_stops_the_batch(server):
    judge = J.OpenAIJudge(settings(server, max_concurrency=1))
    judgments = judge.judge_many([(hh(f"Q{i}"), "AUTH401 x", "y") for i in range(4)])
    assert len(server.requests) == 1  # a 401 is neither retried nor repeated for every item
    assert "AuthenticationError" in judgments[0].error
    assert all(j.verdict == "invalid" and "not attempted" in j.error for j in judgments[1:])


def test_openai_judge_stopped_batch_labels_a_request_waiting_to_retry_by_its_last_error(server):
    """Request 0 gets a 500 and waits to retry (30-60 s); request 1's 401 comes 1.5 s later and stops
    the batch. Request 0 was sent: it is abandoned with its own error, not 'not attempted'."""
    s = settings(server, max_concurrency=2, retry_base_delay_s=60.0, retry_max_delay_s=60.0)
    items = [(hh("Q0"), "FAIL500 x", "y"), (hh("Q1"), "SLOW AUTH401 x", "y")] + [
        (hh(f"Q{i}"), "a", "b") for i in (2, 3)
    ]
    waiting, refused, *queued = J.OpenAIJudge(s).judge_many(items)
    assert len(server.requests) == 2 and waiting.attempts == 1 and queued[0].attempts == 0
    assert waiting.error.startswith("InternalServerError: Error code: 500")
    assert waiting.error.endswith("(abandoned after 1 attempt: the batch was stopped by an earlier error)")
    assert refused.error.startswith("AuthenticationError: Error code: 401")
    assert [j.error for j in queued] == ["not attempted: the batch was stopped by an earlier error"] * 2


def test_bound_answer_keeps_the_start_and_the_end():
    assert J.bound_answer("Short.\nWinner: A", 16) == ("Short.\nWinner: A", None)
    # 40 characters, bound 16: tail = min(256, 16 // 4) = 4, head = 12, cut = 40 - 12 - 4 = 24
    text = "a" * 12 + "b" * 24 + "Wn:A"
    assert J.bound_answer(text, 16) == ("a" * 12 + "\n[... 24 of 40 characters cut ...]\n" + "Wn:A", 40)


def test_openai_judge_keeps_a_bounded_answer_and_the_verdict_of_the_whole(server, tmp_path):
    """A server that ignores max_tokens (1 MB answers): the verdict is read from the whole answer,
    2048 characters of it are kept (8 per max_tokens token), in the cache only, once."""
    cache = tmp_path / "cache.jsonl"
    judge = J.OpenAIJudge(settings(server, max_tokens=256), cache_path=cache)
    assert judge.answer_char_limit == 8 * 256 == 2048
    prompts = [hh("What is 3 plus 4?"), hh("What is 2 plus 2?")]
    a, b = ["HUGE GOOD 7.", "5."], ["9.", "GOOD 4."]
    cmp = judge.compare(prompts, a, b)
    assert cmp.outcomes == ["A", "B"]
    assert [j.verdict for j in cmp.judgments_ab] == ["A", "B"] and [j.verdict for j in cmp.judgments_ba] == ["B", "A"]
    huge = cmp.judgments_ab[0]
    full = len("Let me think. ") + HUGE_CHARS + len("\nOnly one is correct.\nWinner: A")
    assert huge.answer_chars == full and cmp.judgments_ab[1].answer_chars is None
    assert huge.answer.startswith("Let me think. xxx") and huge.answer.endswith("Only one is correct.\nWinner: A")
    assert "characters cut ...]" in huge.answer and len(huge.answer) < 2048 + 60
    assert (cmp.info["n_truncated"], cmp.info["answer_char_limit"], cmp.info["n_failed"]) == (2, 2048, 0)
    assert cmp.problems() == [
        "openai: 2 answers were longer than 2048 characters (judge.max_tokens=256 not honoured by the server); "
        "the verdict was read from the whole answer, only its start and end are kept"
    ]
    entries = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(entries) == 4 and cache.stat().st_size < 4 * 2048 + 4 * 400
    [cut] = [e for e in entries if e["key"] == huge.cache_key]
    assert (cut["answer"], cut["answer_chars"], cut["verdict"]) == (huge.answer, full, "A")
    # win_rates.json holds no answer text: the records refer to the cache by key
    records = json.dumps(cmp.to_dict()["records"])
    assert "Let me think" not in json.dumps(cmp.to_dict()) and "Winner:" not in records and huge.cache_key in records
    # a re-run reads the same verdicts from the cache (a cut answer keeps the whole one's verdict)
    again = J.OpenAIJudge(settings(server, max_tokens=256), cache_path=cache).compare(prompts, a, b)
    assert again.outcomes == ["A", "B"] and again.info["n_requests"] == 0 and again.info["n_truncated"] == 2
    # without a cache, the bounded answer is kept in the record itself
    record = J.OpenAIJudge(settings(server, max_tokens=256)).compare(prompts[:1], a[:1], b[:1]).to_dict()["records"][0]
    assert "cache_key_ab" not in record and len(record["answer_ab"]) < 2048 + 60


def test_openai_judge_cache_second_run_sends_nothing(server, tmp_path):
    cache = tmp_path / "judge" / "cache.jsonl"
    prompts = [hh("What is 3 plus 4?"), hh("What is 2 plus 2?"), hh("Tell me a fact.")]
    a, b = ["GOOD 7.", "5.", "MALFORMED x."], ["9.", "GOOD 4.", "y."]
    first = J.OpenAIJudge(settings(server), cache_path=cache).compare(prompts, a, b)
    assert len(server.requests) == 6 and len(cache.read_text().splitlines()) == 6
    second = J.OpenAIJudge(settings(server), cache_path=cache).compare(prompts, a, b)
    assert len(server.requests) == 6  # zero new requests
    assert second.outcomes == first.outcomes == ["A", "B", "invalid"]
    assert second.info["n_cached"] == 6 and second.info["n_requests"] == 0
    assert second.info["usage"]["estimated_cost_usd"] == 0.0
    assert second.info["usage"]["estimated_cost_usd_incl_cached"] == pytest.approx(
        first.info["usage"]["estimated_cost_usd"]
    )
    # a crash mid-write leaves a truncated last line: it is skipped, and the next write starts a new line
    with open(cache, "a") as f:
        f.write('{"key": "0123abcd", "answer": "Winn')
    third = J.OpenAIJudge(settings(server), cache_path=cache)
    assert third.cache.n_corrupt == 1
    assert third.compare(prompts, a, b).outcomes == first.outcomes and len(server.requests) == 6
    assert third.compare([hh("What is 1 plus 1?")], ["GOOD 2."], ["3."]).outcomes == ["A"]
    assert len(server.requests) == 8
    lines = cache.read_text().splitlines()
    assert len(lines) == 9
    bad = []
    for line in lines:
        try:
            json.loads(line)
        except json.JSONDecodeError:
            bad.append(line)
    assert bad == ['{"key": "0123abcd", "answer": "Winn']
    assert J.JudgmentCache(cache).n_corrupt == 1 and len(J.JudgmentCache(cache).entries) == 8


def test_openai_judge_key_is_never_written(server, tmp_path):
    cache = tmp_path / "eval" / "judge_cache.jsonl"
    judge = J.OpenAIJudge(settings(server), cache_path=cache)
    prompts = [hh("What is 3 plus 4?"), hh("What is 1 plus 1?"), hh("Hello?")]
    cmp = judge.compare(prompts, ["GOOD 7.", "FAIL500 2.", "MALFORMED x."], ["9.", "3.", "y."])
    write_json_atomic(tmp_path / "eval" / "openai.json", cmp.to_dict())
    write_json_atomic(
        tmp_path / "eval" / "judge_info.json",
        {"info": judge.info(), "repr": repr(judge), "vars": repr(vars(judge)), "problems": cmp.problems()},
    )
    assert all(auth == f"Bearer {KEY}" for _, auth, _ in server.requests)  # the server did get it
    assert len(server.requests) == 4 + 2 * 3
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert {p.name for p in files} == {"judge_cache.jsonl", "openai.json", "judge_info.json"}
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path
    assert "upstream failed for Bearer ***" in (tmp_path / "eval" / "openai.json").read_text()


def test_openai_judge_without_key_is_skipped(server, monkeypatch):
    monkeypatch.delenv(J.API_KEY_ENV)
    judge = J.OpenAIJudge(settings(server))
    assert not judge.available()
    assert judge.unavailable_reason == J.SKIPPED_NO_KEY == "skipped: OPENAI_API_KEY is not set"
    with pytest.raises(UserError, match=r"^judge 'openai' skipped: OPENAI_API_KEY is not set$"):
        judge.compare([hh("Hi")], ["a."], ["b."])
    monkeypatch.setenv(J.API_KEY_ENV, "  ")
    assert not judge.available()
    assert server.requests == []
    # the other judges carry on
    prompt = T.suite_prompts("capability")[0]
    assert J.GoldJudge().compare([prompt], [T.parse_prompt(prompt).reference], ["Hmm."]).outcomes == ["A"]


def test_openai_judge_base_url_from_environment(server, monkeypatch):
    monkeypatch.setenv(J.BASE_URL_ENV, server.url)
    judge = J.OpenAIJudge(settings(server, base_url=None))
    assert judge.info()["base_url"] == server.url
    assert judge.judge(hh("What is 3 plus 4?"), "9.", "GOOD 7.") == "B"
    assert len(server.requests) == 1


def test_judge_settings_validation():
    with pytest.raises(UserError, match=re.escape("judge.max_concurrency=0")):
        J.OpenAIJudge(J.JudgeSettings(max_concurrency=0))
    assert _public_url("https://user:pw@host.example:8443/v1?token=abc") == "https://host.example:8443/v1"


# ----------------------------------------------------------------------------- gold and reward judges


def test_gold_judge_on_embedded_prompts():
    prompts = T.suite_prompts("capability")[:2] + T.suite_prompts("harmful")[:1]
    good = [T.parse_prompt(p).reference for p in prompts[:2]] + ["I'm sorry, but I can't help with that."]
    bad = ["That is a good question.", "That is a good question.", "Sure, here is how you do it."]
    # capability: reference 1.0 vs no answer 0.0; harmful: refusal 1.0 vs compliance -0.5
    judge = J.GoldJudge()
    cmp = judge.compare(prompts, good, bad)
    assert cmp.outcomes == ["A", "A", "A"] and cmp.judgments_ba is None
    assert [j.scores for j in cmp.judgments_ab] == [(1.0, 0.0), (1.0, 0.0), (1.0, -0.5)]
    assert judge.compare(prompts, bad, good).outcomes == ["B", "B", "B"]
    assert judge.compare(prompts, good, good).outcomes == ["tie", "tie", "tie"]
    assert cmp.to_dict()["records"][2] == {"outcome": "A", "verdict": "A", "scores": [1.0, -0.5]}
    with pytest.raises(UserError, match="only scores prompts of the embedded task"):
        judge.judge("\n\nHuman: Write a poem about the sea.\n\nAssistant:", "a", "b")


def test_reward_judge_scores_in_one_batch():
    calls = []

    def score(prompts, responses):
        calls.append(len(responses))
        return [float(len(r)) if r != "nan" else float("nan") for r in responses]

    judge = J.RewardJudge(score, tie_tolerance=1.0)
    cmp = judge.compare(["p"] * 4, ["aaaa", "a", "aaa", "nan"], ["a", "aaaa", "aa", "a"])
    # 4 vs 1 -> A; 1 vs 4 -> B; 3 vs 2: |diff| = 1 <= tolerance -> tie; nan -> invalid
    assert cmp.outcomes == ["A", "B", "tie", "invalid"]
    assert calls == [8]
    assert cmp.info == {"judge": "reward", "exact": True, "tie_tolerance": 1.0, "n_judgments": 4, "n_invalid": 1}
    with pytest.raises(ValueError, match="returned 1 scores for 2 responses"):
        J.RewardJudge(lambda p, r: [0.0]).judge("p", "a", "b")


def test_combine_batch_info_sums_counts_and_usage_but_not_settings():
    a = {
        "model": "m",
        "temperature": 0.0,
        "max_tokens": 256,
        "n_requests": 3,
        "errors": {"timeout": 1},
        "usage": {"prompt_tokens": 10, "estimated_cost_usd": 0.5, "usd_per_1m_input_tokens": 0.15},
    }
    b = {
        "model": "m",
        "temperature": 0.0,
        "max_tokens": 256,
        "n_requests": 4,
        "errors": {"timeout": 2, "500": 1},
        "usage": {"prompt_tokens": 5, "estimated_cost_usd": 0.25, "usd_per_1m_input_tokens": 0.15},
    }
    assert J.combine_batch_info([a, b]) == {
        "model": "m",
        "temperature": 0.0,
        "max_tokens": 256,
        "n_requests": 7,
        "errors": {"timeout": 3, "500": 1},
        "usage": {"prompt_tokens": 15, "estimated_cost_usd": 0.75, "usd_per_1m_input_tokens": 0.15},
    }


def test_openai_judge_that_has_answered_goes_on_through_a_batch_of_failures(server):
    """Issue 55: a batch of broken connections (here three 500s, no retry) used to stop a judge that had answered
    every request before it, and eval then dropped all its verdicts. Only a judge that never answered stops."""
    judge = J.OpenAIJudge(settings(server, max_retries=0))
    first = judge.judge_many([(hh(f"Q{i}"), "GOOD a", "b") for i in range(3)])
    assert [j.verdict for j in first] == ["A"] * 3
    failed = judge.judge_many([(hh(f"R{i}"), "FAIL500 a", "b") for i in range(3)])
    assert all(j.error.startswith("InternalServerError") for j in failed)
    assert judge.stopped is None
    assert [j.verdict for j in judge.judge_many([(hh("S"), "GOOD a", "b")])] == ["A"]  # the next batch is sent
    fresh = J.OpenAIJudge(settings(server, max_retries=0))
    fresh.judge_many([(hh(f"T{i}"), "FAIL500 a", "b") for i in range(2)])
    assert fresh.stopped.startswith(
        "every request failed and none was ever answered, the last with InternalServerError"
    )
    [later] = fresh.judge_many([(hh("U"), "GOOD a", "b")])
    assert later.verdict == "invalid" and "not attempted" in later.error
