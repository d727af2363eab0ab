"""Bad judge inputs: no API key, a base URL where nothing answers, a server that breaks off or goes
away mid-batch, answers that are not verdicts, and answers far over max_tokens.
The OpenAI judge runs against the fake OpenAI-compatible server of tests/fake_openai.py on 127.0.0.1.
A judge's trouble never stops the eval stage: the judge is skipped, or its judgments are counted
invalid (never a win or a tie) with one line per problem that names the cause and the fix."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys

import pytest
from fake_openai import HUGE_CHARS, KEY, FakeOpenAI, hh, settings

from rlhf import judges as J
from rlhf.core.errors import UserError

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
    assert "Connection refused" in problem  # the transport error under openai's "Connection error."
    assert KEY not in problem and "\n" not in problem
    assert not (tmp_path / "cache.jsonl").exists()  # failures are never cached: a re-run asks again


@pytest.mark.parametrize("cause", ["nothing listens", "every request fails"])
def test_a_judge_that_stopped_sends_nothing_in_later_batches(server, cause):
    """Eval compares many pairings, one batch each: once a batch has found nothing listening, or had every
    request fail, the judge is stopped and a later batch fails at once, with the reason, without a request."""
    url = f"http://127.0.0.1:{closed_port()}/v1" if cause == "nothing listens" else None
    where = {"base_url": url} if url else {}
    judge = J.OpenAIJudge(settings(server, max_retries=1, max_concurrency=2, timeout_s=1.0, **where))
    first = judge.compare(PROMPTS, [f"FAIL500 {a}" for a in A], B)
    assert first.summary()["n"] == 0 and judge.stopped is not None
    expected = (
        f"nothing answers at {url}"
        if url
        else "every request failed and none was ever answered, the last with Internal"
    )
    assert expected in judge.stopped
    sent = len(server.requests)
    later = judge.compare(PROMPTS, B, A)
    assert len(server.requests) == sent and later.info["n_requests"] == 0 and later.info["n_failed"] == 10
    assert {j.error for j in later.judgments_ab} == {f"not attempted: the judge stopped earlier: {judge.stopped}"}


def test_a_response_cut_off_mid_body_fails_that_request_alone(server, tmp_path):
    """After earlier answers, one request's response breaks off mid-body (headers announce the whole
    answer, half comes, the connection closes) on every attempt: that request fails, labelled as a
    broken response, and the batch goes on. Before, this read as 'nothing answers at <url>': the
    batch stopped and every request after it was 'not attempted'."""
    cache = tmp_path / "cache.jsonl"
    s = settings(server, max_concurrency=1)  # in order: p0, p1 (answered), p2 (cut), p3 (cut once), then B-first
    a = A[:2] + [f"CUT_BODY {A[2]}", f"CUT_FIRST {A[3]}"]
    cmp = J.OpenAIJudge(s, cache_path=cache).compare(PROMPTS[:4], a, B[:4])
    assert cmp.outcomes == ["A", "A", "invalid", "A"]  # a cut on the first attempt only is retried and answered
    assert len(server.requests) == 2 * 2 + 2 * 3 + 2 * 2  # p0, p1: 1 each; p2: 1 + max_retries; p3: 2 each
    failed = [j for j in cmp.judgments_ab + cmp.judgments_ba if j.error]
    assert len(failed) == 2 and cmp.info["n_failed"] == 2 and cmp.info["n_judgments"] == 8
    for j in failed:
        assert j.error.startswith("APIConnectionError: Connection error. (RemoteProtocolError: peer closed connection")
        assert j.error.endswith("(the connection broke before a complete response; gave up after 3 attempts)")
    [problem] = cmp.problems()
    assert problem.startswith("openai: 2 of 8 judgments failed, counted invalid: APIConnectionError")
    assert "nothing answers" not in problem and "not attempted" not in problem and "\n" not in problem
    assert len(cache.read_text().splitlines()) == 6  # every answered request; the cut ones are asked again next run


class VanishingServer(FakeOpenAI):
    """Answers `n_before` requests, then closes its listening socket: later connections are refused."""

    n_before = 2

    def respond(self, user, attempt, auth, model):
        if len(self.requests) == self.n_before:
            self.httpd.shutdown()  # this handler runs in its own thread, not the serving one
            self.httpd.socket.close()
        return super().respond(user, attempt, auth, model)


def test_a_server_that_goes_away_mid_batch_stops_it_and_says_so(server):
    """Connections refused after the retries stop the batch, but the line does not claim that nothing
    ever answered: it says how many requests the server answered first."""
    gone = VanishingServer()
    try:
        s = settings(gone, max_concurrency=1)
        cmp = J.OpenAIJudge(s).compare(PROMPTS, A, B)
    finally:
        gone.httpd.server_close()
    assert [j.verdict for j in cmp.judgments_ab[:2]] == ["A", "A"] and len(gone.requests) == 2
    assert cmp.outcomes == ["invalid"] * 5  # no B-first judgment came back
    refused, *rest = [j.error for j in cmp.judgments_ab[2:] + cmp.judgments_ba]
    assert refused.startswith("APIConnectionError: Connection error. (ConnectError: ") and "refused" in refused
    assert refused.endswith(
        f"(gave up after 3 attempts; {gone.url} answered 2 requests of this batch, then stopped taking "
        "connections: check that the server is still running)"
    )
    assert rest == ["not attempted: the batch was stopped by an earlier error"] * 7


@pytest.mark.slow  # a stage process (seconds): out of the unit run
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


@pytest.fixture
def eval_run(rl_run):
    """`rl_run` with a test split (the template has none) for the eval stage."""
    shutil.copy(rl_run / "data" / "val.jsonl", rl_run / "data" / "test.jsonl")
    return rl_run


def run_eval(run, server, *overrides: str):
    """The eval stage on `run` (6 prompts, no suites) with the LLM judge at `server`."""
    from conftest import run_script

    return run_script(
        "part4_eval/evaluate.py",
        run,
        "eval.num_prompts=6",
        "eval.best_of_n=2",
        "eval.best_of_n_prompts=3",
        "eval.suites=false",
        "eval.max_new_tokens=8",
        f"judge.base_url={server.url}",
        "judge.model=judge-test",
        *overrides,
    )


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_eval_stage_with_the_llm_judge_writes_the_key_into_no_file(server, eval_run):
    """The eval stage as a user runs it, with a fake key in the environment and the LLM judge on
    127.0.0.1: the server receives the key, and no file of the run folder contains it."""
    run_eval(eval_run, server, "eval.judges=gold,reward,openai")
    assert server.requests and all(auth == f"Bearer {KEY}" for _, auth, _ in server.requests)
    written = [p for p in eval_run.rglob("*") if p.is_file()]
    assert (eval_run / "eval" / "openai_cache.jsonl") in written
    assert not [p for p in written if KEY.encode() in p.read_bytes()]


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_eval_stage_with_1mb_judge_answers_keeps_the_run_folder_small(server, eval_run):
    """A server that ignores max_tokens and answers 1 MB to every request: the eval stage keeps the
    verdicts, 2 KB of each answer (8 characters per judge.max_tokens token), each answer once (in
    openai_cache.jsonl; win_rates.json refers to it by key). Before: every answer whole, in the cache
    and again in win_rates.json (48 MB for 24 requests)."""
    before = sum(p.stat().st_size for p in eval_run.rglob("*") if p.is_file())
    server.padding = HUGE_CHARS
    result = run_eval(eval_run, server, "eval.judges=openai", "judge.max_tokens=256")
    added = sum(p.stat().st_size for p in eval_run.rglob("*") if p.is_file()) - before
    cache = eval_run / "eval" / "openai_cache.jsonl"
    entries = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(entries) >= 10 and len(entries) <= len(server.requests)
    assert all(e["answer_chars"] > HUGE_CHARS and len(e["answer"]) < 2048 + 60 for e in entries)
    assert added < len(entries) * 2048 + 100_000, added  # measured: 24 answers, 74 KB (48 MB before)
    assert added < HUGE_CHARS  # less than one answer's worth for the whole stage
    stored = sum(p.read_bytes().count(b"Let me think.") for p in eval_run.rglob("*") if p.is_file())
    assert stored == len(entries)  # each answer once
    assert "answers were longer than 2048 characters" in result.stdout


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_an_llm_judge_that_never_answers_stops_once_and_is_reported_failed_not_as_a_judge(server, eval_run):
    """Nothing listens at judge.base_url: the first batch gives up, every later pairing sends nothing, the stage
    says so in one line, and the judge is in no win rate or agreement; its entry is a failed status with the
    counts, which the report shows. Before, each pairing retried in full and the report presented the judge's
    ties between identical answers as its verdicts ("win rate 0.500", "agreement 1.000")."""
    from conftest import REPO

    url = f"http://127.0.0.1:{closed_port()}/v1"
    result = run_eval(
        eval_run, server, "eval.judges=gold,reward,openai", f"judge.base_url={url}", "judge.max_retries=1"
    )
    evaluation = json.loads((eval_run / "summary.json").read_text())["eval"]
    assert "openai" not in evaluation["win_rates"] and set(evaluation["win_rates"]) == {"gold", "reward"}
    assert not any("openai" in key for key in evaluation["judge_agreement"])
    status = evaluation["judges"]["openai"]["status"]
    assert status.startswith("failed (") and "judgments failed; the judge stopped" in status
    assert f"nothing answers at {url}" in status and evaluation["judges"]["openai"]["n_failed"] > 0
    lines = [line for line in result.stdout.splitlines() if line.startswith("[eval] judge openai")]
    assert len(lines) == 1 and lines[0].endswith("left out of the win rates"), result.stdout[-2000:]
    assert server.requests == []
    report_command = [sys.executable, str(REPO / "part4_eval" / "make_report.py"), "--output-dir", str(eval_run)]
    subprocess.run([*report_command, "--config", str(eval_run / "eval" / "config.yaml")], cwd=REPO, check=True)
    report = (eval_run / "report.md").read_text()
    assert "gave no verdicts: `openai` (failed (" in report and "#### Judge: `openai`" not in report


@pytest.mark.slow  # a stage process (seconds): out of the unit run
def test_an_llm_judge_over_a_flaky_connection_keeps_every_verdict_it_gave(server, eval_run):
    """Issue 55: a server that cut some answers off mid-body, stalled others past the client's timeout and answered
    others with no verdict made eval stop the judge when one batch (a pairing's requests) all failed ("every request
    of a batch failed") and drop all its verdicts from summary.json. A judge that answers most requests is a judge:
    its win rates stay, and the failures are counted beside them. Which request fails is fixed by a hash of its text
    and its place in the stream (no retries), so the run is repeatable."""
    import zlib

    # The pairings in the order eval sends them, each prompt in both orders (rlhf.analysis.evaluation.
    # win_rate_pairings): best_of_2 vs sft on eval.best_of_n_prompts=3, sft vs chosen on eval.num_prompts=6, last
    # best_of_2 vs chosen on 3, whose requests all break off (the burst). Each pairing's batch ends before the next
    # starts, so a request's place in the stream says which pairing it belongs to. (The burst was once "requests 13
    # to 24", which straddled two pairings: which of sft vs chosen's requests fell in it depended on the order in
    # which 8 concurrent requests arrived, and the test failed one run in three.)
    PAIRING_REQUESTS = {"best_of_2_vs_sft": 2 * 3, "sft_vs_chosen": 2 * 6, "best_of_2_vs_chosen": 2 * 3}
    BURST_AFTER = PAIRING_REQUESTS["best_of_2_vs_sft"] + PAIRING_REQUESTS["sft_vs_chosen"]

    answer = server.respond

    def flaky_answer(user, attempt, auth, model):
        status, payload, delay = answer(user, attempt, auth, model)
        kind = zlib.crc32(user.encode()) % 8
        if kind == 1:  # stalls past judge.timeout_s
            delay = 4.0
        elif kind == 2:  # an answer that is no verdict
            payload = server.completion(model, "Both responses have merits and I cannot decide.")
        return status, payload, delay

    def broken_off(user, attempt):  # the body breaks off half-way: some requests, and a burst of them
        return len(server.requests) > BURST_AFTER or zlib.crc32(user.encode()) % 8 == 0

    server.respond = flaky_answer
    server.cut_off = broken_off
    # A timeout well above an answer's latency on a loaded machine, so that only the stalled requests time out.
    run_eval(eval_run, server, "eval.judges=gold,openai", "judge.max_retries=0", "judge.timeout_s=2")
    evaluation = json.loads((eval_run / "summary.json").read_text())["eval"]
    info = evaluation["judges"]["openai"]
    assert not str(info.get("status", "")).startswith("failed"), info
    assert len(server.requests) == sum(PAIRING_REQUESTS.values())
    assert info["n_failed"] >= PAIRING_REQUESTS["best_of_2_vs_chosen"], info  # the burst, at least
    assert info["n_judgments"] > info["n_invalid"] + 1, info  # most were answered
    rates = evaluation["win_rates"]["openai"]
    assert set(rates) == set(evaluation["win_rates"]["gold"]) == set(PAIRING_REQUESTS)  # every pairing, as gold's
    assert [key for key, entry in rates.items() if entry["n"] == 0] == ["best_of_2_vs_chosen"]  # all but the burst
    assert sum(entry["n_invalid"] for entry in rates.values()) > 0  # the failures are counted, not hidden
