"""The HTTP load generator of the OpenAI-compatible contenders (vLLM's server, our gateway).

:func:`embeddings_load` keeps ``conc`` ``POST /v1/embeddings`` requests of ``batch`` texts in
flight for a while (asyncio + aiohttp, one connection per request in flight) and decodes
every vector of every answer, as a real client would. Only the request's ``model`` and its
extra fields (each server's name of the truncation option) differ between the servers.
:func:`rerank_load` does the same with rerank requests (one query, many documents) on the
rerank routes of :mod:`perf.rerank`'s contenders, decoding every score. Both run on
:func:`post_load`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from perf.corpora import PairCorpus


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float) -> str | None:
    """Poll ``GET url`` (a server's health route) every second until it answers.

    Args:
        proc: the server's process.
        url: its health URL.
        timeout_s: how long to wait.

    Returns:
        ``None`` once it answered; ``"exited"`` if ``proc`` exited first, ``"not ready"`` if
        ``timeout_s`` passed.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return "exited"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return None
        except OSError:
            time.sleep(1)
    return "not ready"


def http_answer(
    url: str, body: dict | None = None, timeout_s: float = 5.0
) -> tuple[int | None, str]:
    """The status and text of a GET of ``url`` (or a JSON POST of ``body``).

    Returns:
        ``(status, text)``; ``(None, why)`` when nothing answered.
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except OSError as exc:
        return None, f"{type(exc).__name__}: {exc}"


def request_body(texts: list[str], fmt: str, model: str, options: dict[str, Any]) -> dict[str, Any]:
    """One ``/v1/embeddings`` request body.

    Args:
        texts: the ``input`` list.
        fmt: ``encoding_format``, ``float`` or ``base64``.
        model: the ``model`` field.
        options: further fields, e.g. ``{"truncate_prompt_tokens": 256}`` (vLLM) or
            ``{"truncate": "END"}`` (the gateway).

    Returns:
        The JSON object to send.
    """
    return {"model": model, "input": texts, "encoding_format": fmt, **options}


def decode(body: dict[str, Any], fmt: str) -> list[np.ndarray]:
    """The vectors of an answer, each float32 ``[dim]``.

    ``base64``: the little-endian float32 bytes of each vector; ``float``: a JSON list.
    """
    if fmt == "base64":
        return [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
    return [np.asarray(d["embedding"], np.float32) for d in body["data"]]


def embeddings_load(
    url: str,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    fmt: str,
    *,
    model: str,
    options: dict[str, Any],
    text_tokens: list[int] | None = None,
) -> dict:
    """Load a ``/v1/embeddings`` endpoint with ``conc`` requests of ``batch`` texts in flight.

    Args:
        url: the server's ``/v1/embeddings`` URL.
        texts: texts to send, in turn.
        batch: texts per request.
        conc: requests in flight.
        seconds: measurement time; the requests in flight at its end are waited for and
            counted (the time includes them).
        fmt: ``encoding_format`` asked for, ``float`` or ``base64``; every vector is decoded.
        model: the request's ``model``.
        options: further request fields (:func:`request_body`).
        text_tokens: tokens of each text (after truncation); the result's
            ``tokens_per_text`` is then the mean over the texts actually sent.

    Returns:
        A contender result; with errors, ``detail`` holds the first one.
    """

    def request(worker: int, n: int) -> tuple[dict[str, Any], int, int]:
        idx = [(worker + n * batch + j) % len(texts) for j in range(batch)]
        body = request_body([texts[x] for x in idx], fmt, model, options)
        return body, batch, sum(text_tokens[x] for x in idx) if text_tokens else 0

    def read(answer: dict[str, Any], items: int) -> None:
        if len(decode(answer, fmt)) != items:  # like a real client
            raise ValueError(f"{len(answer['data'])} vectors for {items} texts")

    run = post_load(url, conc, seconds, request, read)
    return {
        "texts_s": run.items / run.seconds,
        **run.latency_ms(),
        **run.failures(),
        "tokens_per_text": run.tokens_sent / run.items if text_tokens and run.items else None,
    }


def rerank_body(query: str, documents: list[str], model: str, options: dict[str, Any]) -> dict:
    """One rerank request body (Jina's, Cohere's, vLLM's and Infinity's shared fields).

    Args:
        query: the query.
        documents: the documents to score against it.
        model: the ``model`` field.
        options: further fields, e.g. ``{"top_n": 16}`` or ``{"return_documents": False}``.
    """
    return {"model": model, "query": query, "documents": documents, **options}


def rerank_scores(answer: dict[str, Any], expected: int) -> tuple[np.ndarray, int | None]:
    """Decode a rerank answer: every result's score, and the tokens the server counted.

    ``results`` (Jina, Cohere, vLLM, our gateway) or ``data`` (Infinity) hold
    ``{"index", "relevance_score"}`` objects; the tokens are ``usage.prompt_tokens`` (vLLM,
    Infinity) or ``usage.total_tokens`` (Jina).

    Args:
        answer: the JSON answer.
        expected: results asked for (documents sent, or ``top_n``).

    Returns:
        float32 ``[expected]`` scores in the answer's order, and the server's token count
        (``None`` when it gives none).

    Raises:
        ValueError: another number of results, or a result without a score.
    """
    results = answer.get("results", answer.get("data"))
    if not isinstance(results, list) or len(results) != expected:
        got = len(results) if isinstance(results, list) else "no"
        raise ValueError(f"{got} results for {expected} documents")
    try:
        scores = np.asarray([float(r["relevance_score"]) for r in results], np.float32)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"a result without relevance_score: {exc}") from None
    usage = answer.get("usage") or {}
    tokens = usage.get("prompt_tokens", usage.get("total_tokens"))
    return scores, int(tokens) if isinstance(tokens, int) else None


def probe_rerank(url: str, model: str, options: dict[str, Any]) -> str | None:
    """Send one rerank request of one document to ``url``.

    Returns:
        ``None`` when it was answered with a score, else what went wrong (the status and
        the start of the answer).
    """
    status, text = http_answer(url, rerank_body("ready?", ["ready?"], model, options), 60)
    if status != 200:
        return f"POST {url}: " + (f"HTTP {status}: {text[:300]}" if status else text)
    try:
        rerank_scores(json.loads(text), 1)
    except ValueError as exc:
        return f"POST {url}: a bad answer ({exc}): {text[:300]}"
    return None


def rerank_load(
    url: str,
    corpus: PairCorpus,
    docs: int,
    conc: int,
    seconds: float,
    *,
    model: str,
    options: dict[str, Any],
) -> dict:
    """Load a rerank route with ``conc`` requests of one query and ``docs`` documents in flight.

    Args:
        url: the route (``.../v1/rerank``, ``.../rerank``).
        corpus: the pairs; request ``r`` is :meth:`PairCorpus.request` ``(r, docs)``.
        docs: documents per request.
        conc: requests in flight.
        seconds: measurement time (the requests in flight at its end count, and their time).
        model: the request's ``model``.
        options: further request fields (:func:`rerank_body`).

    Returns:
        A rerank contender result: ``pairs_s``; ``tokens_per_pair`` as the server counted
        them when every answer gave its count (``tokens_counted_by`` ``server``), else the
        pairs' exact token count (``client``); p50/p99 latency; errors.
    """

    def request(worker: int, n: int) -> tuple[dict[str, Any], int, int]:
        query, documents = corpus.request(worker + n * conc, docs)
        return rerank_body(query, documents, model, options), docs, docs * corpus.length

    def read(answer: dict[str, Any], items: int) -> int | None:
        return rerank_scores(answer, min(options.get("top_n") or items, items))[1]

    run = post_load(url, conc, seconds, request, read)
    return run.pairs_result(by_server=bool(run.items) and run.answers_counted == run.answered)


@dataclass
class LoadRun:
    """What :func:`post_load` saw.

    Attributes:
        seconds: from the first request to the last answer.
        latencies_s: each answered request's latency.
        items: texts or pairs of the answered requests.
        answered: requests answered.
        tokens_sent: the tokens of the answered requests, as the caller counted them.
        tokens_counted: the tokens the servers' answers counted (where they did).
        answers_counted: answers that gave a token count.
        errors: failed requests (transport, HTTP status, a bad answer).
        problems: each failure, described.
    """

    seconds: float = 0.0
    latencies_s: list[float] = field(default_factory=list)
    items: int = 0
    answered: int = 0
    tokens_sent: int = 0
    tokens_counted: int = 0
    answers_counted: int = 0
    errors: int = 0
    problems: list[str] = field(default_factory=list)

    def latency_ms(self) -> dict[str, float | None]:
        """``{"p50_ms", "p99_ms"}`` over the answered requests (``None`` without any)."""
        lat = np.asarray(self.latencies_s) * 1000
        if not len(lat):
            return {"p50_ms": None, "p99_ms": None}
        return {"p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}

    def failures(self) -> dict[str, Any]:
        """``{"errors": n}``, and ``detail`` (the first failure) when there was one."""
        return {"errors": self.errors, **({"detail": self.problems[0]} if self.problems else {})}

    def pairs_result(self, by_server: bool) -> dict[str, Any]:
        """A rerank contender's result (the items were pairs).

        Args:
            by_server: the tokens are the servers' own count (:attr:`tokens_counted`);
                otherwise the pairs' exact token count (:attr:`tokens_sent`).

        Returns:
            ``pairs_s``, ``tokens_per_pair``, ``tokens_counted_by`` (``server`` or
            ``client``), ``p50_ms``, ``p99_ms``, ``errors`` (and ``detail``).
        """
        tokens = self.tokens_counted if by_server else self.tokens_sent
        return {
            "pairs_s": self.items / self.seconds if self.seconds else 0.0,
            "tokens_per_pair": tokens / self.items if self.items else None,
            "tokens_counted_by": "server" if by_server else "client",
            **self.latency_ms(),
            **self.failures(),
        }


class BadAnswer(Exception):
    """A request the server refused or answered wrongly; the message says how."""


async def closed_loop(
    conc: int,
    seconds: float,
    call: Callable[[int, int], Awaitable[tuple[int, int, int | None]]],
    errors: tuple[type[BaseException], ...] = (),
) -> LoadRun:
    """Keep ``conc`` requests in flight for ``seconds``: the load loop of every client here.

    Each of ``conc`` workers sends its next request when its answer came; the requests in
    flight at the end are waited for and counted, and the time includes them.

    Args:
        conc: requests in flight.
        seconds: measurement time.
        call: ``(worker, n)`` -> ``(items, tokens, counted)``: send worker ``worker``'s
            ``n``-th request and decode its answer as a real client would; the texts or
            pairs it carried, their tokens, and the tokens the answer counted (or ``None``).
            Raises :class:`BadAnswer`, ``ValueError`` or one of ``errors`` on a failure.
        errors: the transport's exceptions, counted as failed requests.

    Returns:
        The run.
    """
    deadline = time.perf_counter() + seconds
    run = LoadRun()

    async def worker(k: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                items, tokens, counted = await call(k, n)
            except BadAnswer as exc:
                run.errors += 1
                run.problems.append(str(exc))
                continue
            except (ValueError, *errors) as exc:
                run.errors += 1
                run.problems.append(f"{type(exc).__name__}: {exc}")
                continue
            finally:
                n += 1
            run.latencies_s.append(time.perf_counter() - t0)
            run.items += items
            run.answered += 1
            run.tokens_sent += tokens
            if counted is not None:
                run.tokens_counted += counted
                run.answers_counted += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(conc)))
    run.seconds = time.perf_counter() - t0
    return run


def post_load(
    url: str,
    conc: int,
    seconds: float,
    request: Callable[[int, int], tuple[dict[str, Any], int, int]],
    read: Callable[[dict[str, Any], int], int | None],
) -> LoadRun:
    """:func:`closed_loop` of JSON POSTs to ``url`` (aiohttp, one connection per request in flight).

    Args:
        url: where to POST.
        conc: requests in flight.
        seconds: measurement time.
        request: ``(worker, n)`` -> ``(body, items, tokens)``: worker ``worker``'s ``n``-th
            request, the texts or pairs it carries and their tokens.
        read: ``(answer, items)`` -> the tokens the answer counted, or ``None``; decodes the
            answer as a real client would, raising ``ValueError`` on a bad one. An answer
            other than 200 is a failure (``HTTP <status>: <answer>``).

    Returns:
        The run.
    """
    import aiohttp

    async def main() -> LoadRun:
        connector = aiohttp.TCPConnector(limit=conc)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def call(worker: int, n: int) -> tuple[int, int, int | None]:
                body, items, tokens = request(worker, n)
                async with session.post(url, json=body) as resp:
                    answer = await resp.json(content_type=None)
                if resp.status != 200:
                    raise BadAnswer(f"HTTP {resp.status}: {str(answer)[:300]}")
                return items, tokens, read(answer, items)

            return await closed_loop(conc, seconds, call, (aiohttp.ClientError,))

    return asyncio.run(main())
