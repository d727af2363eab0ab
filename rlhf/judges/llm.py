"""The LLM judge (`OpenAIJudge`): a GPT-4-class chat model through the official `openai`
client, or any OpenAI-compatible server (vLLM, Ollama) via `judge.base_url` / OPENAI_BASE_URL,
judging each pair in both orders at temperature 0. Its prompt and answer parsing are in
`prompt.py`, its cache in `cache.py`.

- API key: read from OPENAI_API_KEY at request time and handed to a client that lives only for
  one batch. It is never an attribute of the judge, never in `info()` or any result, cache or
  log line (error messages are scrubbed of it too). Without it, `unavailable_reason` is
  `SKIPPED_NO_KEY` and the caller carries on with the other judges.
- Requests: at most `max_concurrency` in flight (threads); the client's own retry is off
  (max_retries=0) and `_request` retries 408/409/429/5xx, timeouts and connection errors with
  exponential backoff and jitter (honouring Retry-After), up to `max_retries` retries. A request
  that still fails becomes a *failed* judgment (verdict "invalid", `error` set, not cached);
  every completed judgment is kept. A connection that broke before the response was complete (a
  body cut off mid-way, a reset) fails that request alone and the batch goes on. 401/403/404
  would fail every request, and so would an address that takes no connection after the retries
  (connection refused, unknown host; not a timeout), so the first one stops the batch: requests
  waiting to retry are reported as abandoned, with their last error, and the rest as not attempted.
  It also stops the judge (`stopped`), as does a batch in which every request failed when no request
  has ever been answered: later batches send nothing, and their judgments fail at once as not attempted,
  with the reason. A judge that has answered goes on through a batch whose every request failed (a few
  dropped connections): its verdicts are kept and the failures counted.
- Answers are bounded: the verdict is read from the whole answer, but only `answer_char_limit`
  (8 characters per `max_tokens` token) is kept, its start and its end around a note of the cut
  (`bound_answer`), so a server that ignores `max_tokens` cannot fill the disk. Counted in
  `n_truncated` and reported. Each answer is stored once, in the cache (`cache_key` in a judgment).
- Cost: prompt/completion tokens from each response's `usage`, times the configured $/1M
  prices: an estimate, not a bill.
"""

from __future__ import annotations

import dataclasses
import os
import random
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from rlhf.core.errors import UserError
from rlhf.judges.base import Item, Judge, JudgeSettings, Judgment
from rlhf.judges.cache import JudgmentCache, cache_key
from rlhf.judges.prompt import (
    CHARS_PER_TOKEN_BOUND,
    JUDGE_PROMPT,
    JUDGE_PROMPT_VERSION,
    JUDGE_SYSTEM_PROMPT,
    bound_answer,
    format_judge_prompt,
    parse_verdict,
)

API_KEY_ENV = "OPENAI_API_KEY"
BASE_URL_ENV = "OPENAI_BASE_URL"
SKIPPED_NO_KEY = f"skipped: {API_KEY_ENV} is not set"


def _public_url(url: str | None) -> str | None:
    """The URL without user info, query or fragment (they can hold credentials)."""
    if not url:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _could_not_connect(err: BaseException) -> bool:
    """No connection was made: refused, unknown host, no route (httpx's ConnectError, found by name
    in the cause chain so that httpx and httpx2 both count). A connection that broke while the
    response came back (RemoteProtocolError, ReadError) and a timeout are not this."""
    seen: BaseException | None = err
    for _ in range(8):  # the openai error, the httpx error, the httpcore error, the OSError
        if seen is None:
            return False
        if any(cls.__name__ == "ConnectError" for cls in type(seen).__mro__):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(err: BaseException, api_key: str) -> str:
    """One line, at most 300 characters, scrubbed of the key: the error and, for a connection error
    (whose own text is only "Connection error."), the transport error under it."""
    message = f"{type(err).__name__}: {err}"
    cause = err.__cause__
    if cause is not None and str(cause):
        message += f" ({type(cause).__name__}: {cause})"
    if api_key:
        message = message.replace(api_key, "***")
    return " ".join(message.split())[:300]


@dataclass
class _Batch:
    """What the requests of one batch share: the stop signal, the key, and how many answers came back."""

    stop: threading.Event
    api_key: str
    n_answered: int = 0  # complete HTTP responses (error statuses included): proof something listens
    stopped_by: str | None = None  # the error that stopped the batch (and so the judge): unreachable, refused
    lock: threading.Lock = field(default_factory=threading.Lock)

    def stop_on(self, error: str) -> None:
        with self.lock:
            self.stopped_by = self.stopped_by or error
        self.stop.set()

    def answered(self) -> None:
        with self.lock:
            self.n_answered += 1


class OpenAIJudge(Judge):
    """A chat model judging each pair in both orders at temperature 0, with retries and a cache."""

    name = "openai"
    symmetric = False

    def __init__(
        self,
        settings: JudgeSettings | None = None,
        cache_path: str | Path | None = None,
        sleep: Callable[[float], None] | None = None,
    ):
        self.settings = settings or JudgeSettings()
        self.settings.validate()
        self.cache = JudgmentCache(cache_path) if cache_path is not None else None
        self._rng = random.Random()
        self._sleep = sleep  # tests may record delays; None: wait on the stop event
        # Set when a batch stops on an error every later request would meet too (nothing answers at the address,
        # the key or model is refused), or when every request of a batch failed and none has ever been answered:
        # later batches send nothing. A judge that has answered keeps going through a batch of broken connections.
        self.stopped: str | None = None
        self.answered = 0  # requests the server answered, over every batch

    # -- configuration ------------------------------------------------------------------

    @property
    def base_url(self) -> str | None:
        return self.settings.base_url or os.environ.get(BASE_URL_ENV) or None

    @property
    def unavailable_reason(self) -> str | None:
        return None if os.environ.get(API_KEY_ENV, "").strip() else SKIPPED_NO_KEY

    @property
    def answer_char_limit(self) -> int:
        """Answers longer than this are cut (bound_answer) before they are kept anywhere."""
        return CHARS_PER_TOKEN_BOUND * self.settings.max_tokens

    def info(self) -> dict:
        s = self.settings
        return {
            "judge": self.name,
            "model": s.model,
            "base_url": _public_url(self.base_url) or "api.openai.com (default)",
            "prompt_version": JUDGE_PROMPT_VERSION,
            "system_prompt": JUDGE_SYSTEM_PROMPT,
            "prompt_template": JUDGE_PROMPT,
            "temperature": 0.0,
            "max_tokens": s.max_tokens,
            "answer_char_limit": self.answer_char_limit,
            "both_orders": True,
        }

    def __repr__(self) -> str:
        return f"OpenAIJudge(model={self.settings.model!r}, base_url={_public_url(self.base_url)!r})"

    # -- batch ---------------------------------------------------------------------------

    def judge_many(self, items: Sequence[Item], progress: bool = False) -> list[Judgment]:
        """Judge each (prompt, first, second) as given (one order each): cache first, then the API."""
        if not self.available():
            raise UserError(f"judge '{self.name}' {self.unavailable_reason}")
        model = self.settings.model
        results: list[Judgment | None] = [None] * len(items)
        todo: dict[str, list[int]] = {}  # cache key -> indices of items with that exact request
        for i, (prompt, first, second) in enumerate(items):
            if first == second:  # nothing to compare, nothing to bill
                results[i] = Judgment("tie", answer=None)
                continue
            key = cache_key(model, JUDGE_PROMPT_VERSION, prompt, first, second)
            entry = self.cache.get(key) if self.cache is not None else None
            if entry is not None:
                results[i] = self._from_cache(key, entry)
            elif self.stopped is not None:
                results[i] = Judgment("invalid", error=f"not attempted: the judge stopped earlier: {self.stopped}")
            else:
                todo.setdefault(key, []).append(i)
        if todo:
            for key, judgment in self._request_all({k: items[idx[0]] for k, idx in todo.items()}, progress):
                for n, i in enumerate(todo[key]):  # a duplicate request is billed once
                    results[i] = judgment if n == 0 else dataclasses.replace(judgment, cached=True, attempts=0)
        return results  # type: ignore[return-value]

    def _from_cache(self, key: str, entry: dict) -> Judgment:
        # A cut answer keeps the verdict read from the whole answer; a whole one is re-parsed, so a
        # parser fix needs no new requests. Entries written before answers were bounded are cut here.
        answer, full_chars = bound_answer(entry["answer"], self.answer_char_limit)
        cut = entry.get("answer_chars") is not None
        return Judgment(
            entry.get("verdict", "invalid") if cut else parse_verdict(entry["answer"]),
            answer=answer,
            answer_chars=entry["answer_chars"] if cut else full_chars,
            cache_key=key,
            cached=True,
            prompt_tokens=entry.get("prompt_tokens", 0),
            completion_tokens=entry.get("completion_tokens", 0),
        )

    def batch_info(self, judgments: Sequence[Judgment]) -> dict:
        s = self.settings
        billed = [j for j in judgments if not j.cached]
        tokens_in, tokens_out = sum(j.prompt_tokens for j in billed), sum(j.completion_tokens for j in billed)
        all_in, all_out = sum(j.prompt_tokens for j in judgments), sum(j.completion_tokens for j in judgments)

        def cost(tokens_in: int, tokens_out: int) -> float:
            return (tokens_in * s.usd_per_1m_input_tokens + tokens_out * s.usd_per_1m_output_tokens) / 1e6

        errors = Counter(j.error for j in judgments if j.error)
        return {
            "n_judgments": len(judgments),
            "n_cached": sum(j.cached for j in judgments),
            "n_requests": sum(j.attempts for j in judgments),
            "n_retries": sum(max(j.attempts - 1, 0) for j in judgments),
            "n_invalid": sum(j.verdict == "invalid" for j in judgments),
            "n_failed": sum(j.error is not None for j in judgments),
            "n_unparsed": sum(j.unparsed for j in judgments),
            "n_truncated": sum(j.answer_chars is not None for j in judgments),
            "errors": dict(errors.most_common(5)),
            "usage": {
                "prompt_tokens": tokens_in,
                "completion_tokens": tokens_out,
                "estimated_cost_usd": cost(tokens_in, tokens_out),
                "prompt_tokens_incl_cached": all_in,
                "completion_tokens_incl_cached": all_out,
                "estimated_cost_usd_incl_cached": cost(all_in, all_out),
                "usd_per_1m_input_tokens": s.usd_per_1m_input_tokens,
                "usd_per_1m_output_tokens": s.usd_per_1m_output_tokens,
                "note": "estimate: API-reported tokens x configured prices, not a bill; "
                "estimated_cost_usd covers this run's requests only",
            },
        }

    def _request_all(self, requests: dict[str, Item], progress: bool):
        """Yield (key, Judgment) as requests complete, at most max_concurrency in flight."""
        import openai  # imported here: the exact judges never need it
        from tqdm import tqdm

        api_key = os.environ.get(API_KEY_ENV, "").strip()  # a local: the judge object never holds it
        batch = _Batch(threading.Event(), api_key)
        client = openai.OpenAI(api_key=api_key, base_url=self.base_url, max_retries=0, timeout=self.settings.timeout_s)
        pool = ThreadPoolExecutor(max_workers=self.settings.max_concurrency)
        failures: list[str] = []
        try:
            futures = {pool.submit(self._request, client, openai, item, batch): k for k, item in requests.items()}
            for future in tqdm(
                as_completed(futures), total=len(futures), desc=f"judge/{self.settings.model}", disable=not progress
            ):
                key, judgment = futures[future], future.result()
                if judgment.error is None and self.cache is not None:  # failures are retried next run
                    cut = {"answer_chars": judgment.answer_chars, "verdict": judgment.verdict}
                    self.cache.put(
                        {
                            "key": key,
                            "model": self.settings.model,
                            "prompt_version": JUDGE_PROMPT_VERSION,
                            "answer": judgment.answer,
                            **(cut if judgment.answer_chars is not None else {}),
                            "prompt_tokens": judgment.prompt_tokens,
                            "completion_tokens": judgment.completion_tokens,
                        }
                    )
                    judgment = dataclasses.replace(judgment, cache_key=key)
                if judgment.error is not None:
                    failures.append(judgment.error)
                else:
                    self.answered += 1
                yield key, judgment
            if batch.stopped_by is not None:
                self.stopped = batch.stopped_by
            elif failures and len(failures) == len(futures) and self.answered == 0:  # nothing has ever answered
                self.stopped = f"every request failed and none was ever answered, the last with {failures[-1]}"
        finally:  # also on Ctrl-C: queued requests are dropped, running ones stop at their next retry
            batch.stop.set()
            pool.shutdown(wait=True, cancel_futures=True)
            client.close()

    # -- one request -------------------------------------------------------------------

    def _backoff(self, retry: int, err: Exception) -> float:
        s = self.settings
        delay = min(s.retry_max_delay_s, s.retry_base_delay_s * 2**retry) * (0.5 + 0.5 * self._rng.random())
        response = getattr(err, "response", None)
        try:
            retry_after = float(response.headers.get("retry-after")) if response is not None else None
        except (TypeError, ValueError):
            retry_after = None  # absent, or an HTTP date: keep our own delay
        if retry_after is not None and retry_after >= 0:
            delay = max(delay, min(retry_after, s.retry_max_delay_s))
        return delay

    def _gave_up(self, err: Exception, message: str, attempts: int, batch: _Batch) -> str:
        """The label of a connection error left after the retries, by what happened to the last
        attempt. A connection that broke before the response was complete (a body cut off, a reset)
        fails this request alone: the server is there. Only an address that takes no connection
        (refused, unknown host) stops the batch, as every other request would fail the same way."""
        if not _could_not_connect(err):
            return f"{message} (the connection broke before a complete response; gave up after {attempts} attempts)"
        url = _public_url(self.base_url) or "api.openai.com"
        if batch.n_answered:
            error = (
                f"{message} (gave up after {attempts} attempts; {url} answered {batch.n_answered} requests of this "
                "batch, then stopped taking connections: check that the server is still running)"
            )
        else:
            error = (
                f"{message} (gave up after {attempts} attempts; nothing answers at {url}: "
                f"check judge.base_url or {BASE_URL_ENV})"
            )
        batch.stop_on(error)
        return error

    def _request(self, client, openai, item: Item, batch: _Batch) -> Judgment:
        """One judgment, with retries; never raises for API trouble: a failure is a Judgment."""
        s, attempts, message = self.settings, 0, ""
        retryable = (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError)
        fatal = (openai.AuthenticationError, openai.PermissionDeniedError, openai.NotFoundError)
        while True:
            if batch.stop.is_set():
                if attempts == 0:
                    error = "not attempted: the batch was stopped by an earlier error"
                else:  # sent, failed, and waiting to retry
                    tries = f"{attempts} attempt{'s' if attempts > 1 else ''}"
                    error = f"{message} (abandoned after {tries}: the batch was stopped by an earlier error)"
                return Judgment("invalid", error=error, attempts=attempts)
            attempts += 1
            try:
                response = client.chat.completions.create(
                    model=s.model, messages=format_judge_prompt(*item), temperature=0.0, max_tokens=s.max_tokens
                )
                batch.answered()
                if not hasattr(response, "choices"):  # e.g. an HTML page: not an OpenAI-compatible endpoint
                    raise ValueError(
                        f"the server's answer is not a chat completion ({str(response)[:60]!r}); "
                        "check that judge.base_url is an OpenAI-compatible /v1 endpoint"
                    )
                choices = response.choices or []
                answer = choices[0].message.content if choices else None
                if answer is None:
                    raise ValueError("the response holds no message content")
                usage = response.usage
                kept, full_chars = bound_answer(answer, self.answer_char_limit)
                return Judgment(
                    parse_verdict(answer),  # the whole answer: a cut one may have lost its Winner line
                    answer=kept,
                    answer_chars=full_chars,
                    attempts=attempts,
                    prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
                    completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
                )
            except Exception as err:
                message = _describe(err, batch.api_key)
                if isinstance(err, openai.APIStatusError):
                    batch.answered()
                if isinstance(err, fatal):
                    batch.stop_on(message)
                    return Judgment("invalid", error=message, attempts=attempts)
                status = getattr(err, "status_code", None)
                if not (isinstance(err, retryable) or status in (408, 409) or (status or 0) >= 500):
                    return Judgment("invalid", error=message, attempts=attempts)
                if attempts > s.max_retries:
                    if isinstance(err, openai.APIConnectionError) and not isinstance(err, openai.APITimeoutError):
                        return Judgment(
                            "invalid", error=self._gave_up(err, message, attempts, batch), attempts=attempts
                        )
                    return Judgment(
                        "invalid", error=f"{message} (gave up after {attempts} attempts)", attempts=attempts
                    )
                delay = self._backoff(attempts - 1, err)
                if self._sleep is not None:
                    self._sleep(delay)
                else:
                    batch.stop.wait(delay)
