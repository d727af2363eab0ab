"""A real OpenAI-compatible HTTP server on 127.0.0.1 (never any other host) for the judge tests
(tests/test_judges.py, tests/bad_inputs/): the `server` fixture starts one per test (registered in
tests/conftest.py), `settings(server, ...)` points a JudgeSettings at it.

The fake server is a deterministic judge driven by markers in the text it is sent:
  GOOD in one response              "Winner: <that position>" (no GOOD or both: "Winner: tie")
  BIASED                            always "Winner: A" (position bias)
  MALFORMED                         an answer with no Winner line
  MALFORMED_FIRST in the first shown response: an answer with no Winner line
  RATE429                           429 on the first attempt of each request, then an answer
  FAIL500                           500 while `server.fail_500` is on (the body echoes the
                                    Authorization header, so error messages contain the key)
  SLOW / ALWAYS_SLOW                sleep SLOW_S before answering (any status) on the first / every
                                    attempt: longer than a short client timeout
  AUTH401                           401
  HUGE                              a 1 MB rationale before the Winner line (a server ignoring max_tokens)
  CUT_BODY / CUT_FIRST              on every / the first attempt: headers announcing the whole answer,
                                    half of it, then the connection closes (a response cut off mid-body)
Every answer reports usage: 100 prompt tokens, 10 completion tokens. `server.padding = n` puts n
characters before every answer's Winner line. Subclasses may override `respond` (the answer) and
`cut_off` (whether to drop it mid-body).
"""

import http.server
import json
import threading
import time
from collections import Counter

import pytest

from rlhf import judges as J

KEY = "sk-test-DISTINCTIVE-5e1b0c7a9d"
PROMPT_TOKENS, COMPLETION_TOKENS = 100, 10
SLOW_S = 1.5
HUGE_CHARS = 1_000_000


class FakeOpenAI:
    def __init__(self):
        self.requests = []  # (path, authorization header, JSON body)
        self.attempts = Counter()  # user message -> requests seen
        self.fail_500 = True
        self.padding = 0  # characters of rationale before every answer's Winner line
        self.lock = threading.Lock()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                auth = self.headers.get("Authorization")
                with fake.lock:
                    fake.requests.append((self.path, auth, body))
                    user = body["messages"][-1]["content"]
                    fake.attempts[user] += 1
                    attempt = fake.attempts[user]
                status, payload, delay = fake.respond(user, attempt, auth, body["model"])
                time.sleep(delay)
                data = json.dumps(payload).encode()
                cut = fake.cut_off(user, attempt)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data[: len(data) // 2] if cut else data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass
                self.close_connection = cut or self.close_connection  # a cut: close with the body half sent

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @staticmethod
    def completion(model: str, content: str) -> dict:
        return {
            "id": "chatcmpl-test",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
            "usage": {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            },
        }

    def respond(self, user: str, attempt: int, auth: str, model: str) -> tuple[int, dict, float]:
        first = user.split("[Response A]")[1].split("[Response B]")[0]
        second = user.split("[Response B]")[1].split("Explain your decision")[0]
        delay = SLOW_S if ("SLOW" in user and attempt == 1) or "ALWAYS_SLOW" in user else 0.0
        if "AUTH401" in user:
            return 401, {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}, delay
        if "FAIL500" in user and self.fail_500:
            return 500, {"error": {"message": f"upstream failed for {auth}", "type": "server_error"}}, delay
        if "RATE429" in user and attempt == 1:
            return 429, {"error": {"message": "Rate limit reached", "type": "requests"}}, delay
        if "MALFORMED_FIRST" in first or "MALFORMED" in user.replace("MALFORMED_FIRST", ""):
            content = "Both responses have merits and I cannot decide."
        elif "BIASED" in user:
            content = "The first one reads better.\nWinner: A"
        else:
            a, b = "GOOD" in first, "GOOD" in second
            content = "Only one is correct.\nWinner: " + ("A" if a and not b else "B" if b and not a else "tie")
        padding = HUGE_CHARS if "HUGE" in user else self.padding
        if padding:
            content = "Let me think. " + "x" * padding + "\n" + content
        return 200, self.completion(model, content), delay

    def cut_off(self, user: str, attempt: int) -> bool:
        """Whether this answer breaks off mid-body (CUT_BODY: every attempt, CUT_FIRST: the first)."""
        return "CUT_BODY" in user or ("CUT_FIRST" in user and attempt == 1)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(monkeypatch):
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(var, raising=False)  # 127.0.0.1 only, never through a proxy
    monkeypatch.delenv(J.BASE_URL_ENV, raising=False)
    monkeypatch.setenv(J.API_KEY_ENV, KEY)
    fake = FakeOpenAI()
    yield fake
    fake.close()


def settings(server, **overrides) -> J.JudgeSettings:
    base = {
        "model": "judge-test",
        "base_url": server.url,
        "max_concurrency": 4,
        "max_retries": 2,
        "timeout_s": 5.0,
        "max_tokens": 64,
        "retry_base_delay_s": 0.01,
        "retry_max_delay_s": 0.05,
        "usd_per_1m_input_tokens": 2.0,
        "usd_per_1m_output_tokens": 8.0,
    }
    return J.JudgeSettings(**{**base, **overrides})


def hh(text: str) -> str:
    return f"\n\nHuman: {text}\n\nAssistant:"
