"""An engine step's own queue: interactive requests first, batch-class work in short calls.

Why. Triton's dynamic batcher orders a step's queue by priority level, but an engine call
already running cannot be interrupted (neither Triton nor vLLM preempts), and the batch an
interactive request joins is filled with batch-class texts up to ``max_batch_size``. Beside
the bulk CLI at full speed a one-text query waited 297 ms p50 / 807 ms p99 on 2 cores,
against 23 / 30 ms alone (perf/README.md, "Noisy neighbour"). What bounds that wait is the
length of the engine calls an interactive request can land behind, so batch-class work is cut
into short calls here.

How. ``execute`` hands its valid requests to the instance's :class:`EngineQueue` and returns
``None``; the queue's worker thread makes the engine calls and answers every request through
its response sender (a default-mode Python model may: exactly one final response per request;
Triton 2.51 gives the instance its next batch as soon as ``execute`` returns).

* An **interactive** request (request parameter ``priority_class`` absent or
  ``interactive``, :mod:`triton_embed.priority`) runs in the next engine call, with the other
  waiting interactive requests and no batch-class text. ``execute`` returns once it is
  answered, so an interactive-only load runs as before: one engine call per Triton batch, and
  Triton's queue policy of the interactive level.
* A **batch-class** request (``priority_class: batch``) is queued first in, first out, and
  ``execute`` returns at once: the instance takes its next Triton batch (interactive requests
  ahead of the rest) while the engine works. Batch work runs in calls of at most
  ``max_batch_size`` texts; while interactive requests are being served (one arrived in the
  last :attr:`QueueSettings.interactive_window_s`), in calls of at most
  :attr:`QueueSettings.batch_call_tokens` tokens (at least one text), a request cut between
  its texts, so an interactive request waits for one short call at most.
* The batch level's queue policy (``priority_queue_policy`` key 2: ``max_queue_size`` and
  ``default_timeout_microseconds``) holds for the requests waiting here: past the size a new
  one is refused at once, and one that waited past the timeout is refused when its turn comes,
  in Triton's own words ("Exceeds maximum queue size", "Request timeout expired"; gRPC
  ``UNAVAILABLE``), which clients take as overload and retry with backoff.

The queue knows nothing of Triton: a :class:`Runner` (the step's adapter,
:class:`~triton_embed_server.steps.adapters.engine_step.EngineStepModel`) makes the calls and
sends the answers, so the scheduling is tested without a server (tests/unit/test_engine_queue.py).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from triton_embed.priority import Priority

from triton_embed_server.steps.errors import (
    CancelledError,
    EmbedServingError,
    QueueFullError,
    QueueTimeoutError,
    UnloadingError,
)

#: Tokens per batch-class engine call while interactive requests are served: about 35 ms of
#: one core's engine time (bfloat16, 50-token texts: 29 ms for 8 texts, 52 ms for 16;
#: 13,800-15,200 tokens/s against 14,500-15,800 for calls of 32-128 texts).
DEFAULT_BATCH_CALL_TOKENS = 512
#: How long after an interactive request batch work keeps running in short calls, seconds:
#: long, so a query that comes after minutes of quiet still finds short calls (a 10 s window
#: let the first queries of a search burst wait for a full call: p99 238-820 ms beside the
#: bulk CLI; perf/README.md, "Noisy neighbour"); cut calls cost batch work 5-10% tokens/s.
DEFAULT_INTERACTIVE_WINDOW_S = 300.0


@dataclass(frozen=True)
class QueueSettings:
    """How an engine step's queue runs (the step's config; see the module docstring).

    Attributes:
        max_call_texts: texts (windows, pairs) per engine call at most: the model's
            ``max_batch_size``, as Triton would batch them (an interactive request larger
            than that still runs whole, alone).
        batch_call_tokens: tokens per batch-class call while interactive requests are
            served (parameter ``batch_call_tokens``; 0: no cut, calls of ``max_call_texts``).
        interactive_window_s: seconds after an interactive request during which batch work
            runs in short calls (parameter ``interactive_window_s``).
        batch_queue_size: batch-class requests waiting here at most (the batch level's
            ``max_queue_size``; 0: no bound).
        batch_timeout_s: seconds a batch-class request may wait here (the batch level's
            ``default_timeout_microseconds``; 0: no limit).
    """

    max_call_texts: int = 256
    batch_call_tokens: int = DEFAULT_BATCH_CALL_TOKENS
    interactive_window_s: float = DEFAULT_INTERACTIVE_WINDOW_S
    batch_queue_size: int = 0
    batch_timeout_s: float = 0.0

    @classmethod
    def from_model_config(
        cls, model_config: dict[str, Any], batch_call_tokens: int, interactive_window_s: float
    ) -> QueueSettings:
        """The settings of a step: its ``max_batch_size`` and batch level's queue policy.

        Args:
            model_config: the model config as Triton gives it (JSON, parsed).
            batch_call_tokens: the step's ``batch_call_tokens`` parameter, parsed.
            interactive_window_s: the step's ``interactive_window_s`` parameter, parsed.
        """
        batching = model_config.get("dynamic_batching") or {}
        policies = batching.get("priority_queue_policy") or {}
        level = str(Priority.BATCH.level)
        policy = policies.get(level) or policies.get(int(level)) or {}
        return cls(
            max_call_texts=int(model_config.get("max_batch_size") or 0) or cls.max_call_texts,
            batch_call_tokens=batch_call_tokens,
            interactive_window_s=interactive_window_s,
            batch_queue_size=int(policy.get("max_queue_size") or 0),
            batch_timeout_s=int(policy.get("default_timeout_microseconds") or 0) / 1e6,
        )


@dataclass(eq=False)
class Job:
    """One request's work in the queue.

    Attributes:
        request: the step's request (the runner answers it).
        decoded: the request's inputs as the step decoded them.
        batch: a batch-class request (else interactive).
        text_tokens: tokens of each of its texts (windows, pairs), in order.
        cuttable: whether a call may take some of its texts (else the request runs whole).
        arrived: when it was queued (the queue's clock, seconds).
        taken: texts handed to engine calls so far.
        done: texts whose call returned.
        results: what the runner returned for each call's part, in text order.
        failed: answered with an error (its other parts are dropped).
        answered: its response was sent.
    """

    request: Any
    decoded: Any
    batch: bool
    text_tokens: Sequence[int]
    cuttable: bool = False
    arrived: float = 0.0
    taken: int = 0
    done: int = 0
    results: list = field(default_factory=list)
    failed: bool = False
    answered: bool = False

    @property
    def texts(self) -> int:
        """Its texts (windows, pairs)."""
        return len(self.text_tokens)


#: ``(job, first text, end)``: a contiguous part of a request's texts in one engine call.
Part = tuple[Job, int, int]


class Runner(Protocol):
    """What the queue needs from its step."""

    def run_call(self, parts: list[Part]) -> list[Any]:
        """One engine call on ``parts``; a result per part, in order.

        Raises:
            EmbedServingError: the call failed (every part's request is answered with it).
        """

    def answer(self, job: Job, results: list[Any] | None, error: BaseException | None) -> None:
        """Send ``job``'s one response: its parts' ``results`` merged, or ``error``."""

    def cancelled(self, job: Job) -> bool:
        """Whether ``job``'s client cancelled it."""


class EngineQueue:
    """One model instance's queue and the worker thread that runs its engine calls.

    Args:
        runner: the step (makes the calls, answers the requests).
        settings: the limits (:class:`QueueSettings`).
        clock: seconds, monotonic (tests pass a fake).
        name: the worker thread's name.
    """

    def __init__(
        self,
        runner: Runner,
        settings: QueueSettings,
        clock: Callable[[], float] = time.monotonic,
        name: str = "engine-queue",
    ):
        self.runner = runner
        self.settings = settings
        self._clock = clock
        self._cond = threading.Condition()
        self._interactive: deque[Job] = deque()
        self._batch: deque[Job] = deque()
        self._last_interactive = -math.inf
        self._stopping = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, jobs: Sequence[Job]) -> None:
        """Queue ``jobs``; return once its interactive ones are answered (at once if none).

        A batch-class job past :attr:`QueueSettings.batch_queue_size` is refused at once
        (:class:`QueueFullError`); after :meth:`close`, every job is refused.
        """
        refused: list[tuple[Job, EmbedServingError]] = []
        limit = self.settings.batch_queue_size
        with self._cond:
            now = self._clock()
            for job in jobs:
                job.arrived = now
                if self._stopping:
                    refused.append((job, UnloadingError()))
                elif not job.batch:
                    self._interactive.append(job)
                    self._last_interactive = now
                elif limit and len(self._batch) >= limit:
                    refused.append((job, QueueFullError(limit)))
                else:
                    self._batch.append(job)
            self._cond.notify_all()
        for job, exc in refused:
            self._fail(job, exc)
        waiting = [job for job in jobs if not job.batch]
        with self._cond:
            while not all(job.answered for job in waiting):
                if not self._cond.wait(timeout=1.0) and not self._thread.is_alive():
                    break  # a worker that died answers nothing: answer here, below
        for job in waiting:
            if not job.answered:
                self._fail(job, UnloadingError())

    def close(self, timeout_s: float = 30.0) -> None:
        """Stop taking work; answer what waits (``UNAVAILABLE``); wait for the worker."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    @property
    def waiting(self) -> tuple[int, int]:
        """``(interactive, batch-class)`` requests waiting or running."""
        with self._cond:
            return len(self._interactive), len(self._batch)

    def _work(self) -> None:
        while True:
            with self._cond:
                while not (self._interactive or self._batch or self._stopping):
                    self._cond.wait()
                if self._stopping:
                    leftover = [*self._interactive, *self._batch]
                    self._interactive.clear()
                    self._batch.clear()
                    break
                parts, expired = self._take(self._clock())
            for job, exc in expired:
                self._fail(job, exc)
            if parts:
                self._call(parts)
        for job in leftover:
            self._fail(job, UnloadingError())

    def _take(self, now: float) -> tuple[list[Part], list[tuple[Job, EmbedServingError]]]:
        """The next call's parts (under the lock), and the jobs that waited too long."""
        limit = self.settings.max_call_texts
        parts: list[Part] = []
        if self._interactive:
            texts = 0
            while self._interactive and (not parts or texts + self._interactive[0].texts <= limit):
                job = self._interactive.popleft()
                job.taken = job.texts
                parts.append((job, 0, job.texts))
                texts += job.texts
            return parts, []
        short = now - self._last_interactive < self.settings.interactive_window_s
        budget = self.settings.batch_call_tokens if short else 0
        timeout = self.settings.batch_timeout_s
        expired: list[tuple[Job, EmbedServingError]] = []
        texts = tokens = 0
        while self._batch:
            job = self._batch[0]
            if job.failed:
                self._batch.popleft()
                continue
            if job.taken == 0 and timeout and now - job.arrived > timeout:
                self._batch.popleft()
                expired.append((job, QueueTimeoutError(timeout)))
                continue
            start = job.taken
            end, cost = start, 0
            # a step: one text of a cuttable job, else the whole job
            step = 1 if job.cuttable else job.texts
            remaining = job.text_tokens[start:] if job.cuttable else [sum(job.text_tokens)]
            for n in remaining:
                if (parts or end > start) and (
                    texts + step > limit or (budget and tokens + cost + n > budget)
                ):
                    break
                cost += n
                end += step
                texts += step
            if end == start and job.texts:
                break  # the call is full
            parts.append((job, start, end))
            job.taken = end
            tokens += cost
            if job.taken < job.texts:
                break  # the call is full; the rest of the job goes next
            self._batch.popleft()
        return parts, expired

    def _call(self, parts: list[Part]) -> None:
        """Run one call and answer the jobs it completes (any failure: theirs)."""
        live = []
        for part in parts:
            job = part[0]
            if job.failed:
                continue
            if part[1] == 0 and self._cancelled(job):
                self._fail(job, CancelledError("the request was cancelled before it was run"))
                continue
            live.append(part)
        if not live:
            return
        try:
            results = self.runner.run_call(live)
        except Exception as exc:  # noqa: BLE001 - the engine's or a bug's: the calls' requests
            for job in {id(p[0]): p[0] for p in live}.values():
                self._fail(job, exc)
            return
        for (job, start, end), result in zip(live, results, strict=True):
            if job.failed:
                continue
            job.results.append(result)
            job.done += end - start
            if job.done == job.texts and job.taken == job.texts:
                self._answer(job, job.results, None)

    def _cancelled(self, job: Job) -> bool:
        try:
            return bool(self.runner.cancelled(job))
        except Exception:  # noqa: BLE001 - a request that cannot tell is not cancelled
            return False

    def _fail(self, job: Job, error: BaseException) -> None:
        if job.failed or job.answered:
            return
        job.failed = True
        self._answer(job, None, error)

    def _answer(self, job: Job, results: list | None, error: BaseException | None) -> None:
        try:
            self.runner.answer(job, results, error)
        except Exception:  # noqa: BLE001 - a response that cannot be sent must not stop the queue
            pass
        with self._cond:
            job.answered = True
            self._cond.notify_all()
