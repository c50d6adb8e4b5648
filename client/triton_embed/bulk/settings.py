"""What a bulk job is: its settings, and the identity a resumed run must match.

:func:`job_identity` is recorded in the manifest (``job``); a rerun whose identity differs
(:func:`differences`: the input, the model, a request option, the shard size, the columns)
is another job. The options of both model kinds are in it, so a sparse job resumed with
another ``--top-k`` is refused as a dense one with another ``--dimensions``; so is a hybrid
model's ``--output-kind`` when given (a job without it writes dense vectors).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from triton_embed.bulk.kinds import OutputKind
from triton_embed.bulk.pool_embedder import BULK_RETRY
from triton_embed.bulk.sources import Source
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, RequestOptions
from triton_embed.priority import Priority
from triton_embed.retry import RetryPolicy
from triton_embed.sparse_options import SparseOptions

#: Records per shard by default: 10,000 x 1,024 float32 is 40 MB held before a write.
DEFAULT_SHARD_ROWS = 10_000


@dataclass(frozen=True)
class JobSettings:
    """How a bulk job embeds and writes.

    Attributes:
        model: the ensemble's name.
        options: request options (a corpus is embedded with ``input_type=document`` by the
            CLI): the text options, and an embedding model's.
        sparse: a sparse model's ``top_k`` and ``threshold`` (its other fields are not read:
            the text options are ``options``'); refused for an embedding model
            (:func:`~triton_embed.bulk.kinds.request_options`).
        output: the head of a hybrid model to write (``--output-kind``: ``dense``,
            ``sparse``, ``tokens``); ``None``: a hybrid model's dense vectors.
        shard_rows: records per shard (>= 1).
        include_text: also write each record's text.
        concurrency: requests in flight (>= 1).
        batch_size: texts per request; ``None``: the ensemble's ``max_batch_size``.
        timeout_s: deadline of one request, seconds.
        admin_key: the servers' admin key (the pool reads their model configs), or ``None``.
        retry: how a request that failed for a passing reason is sent again.
        priority: the class of its requests (``batch`` by default; not part of the job's
            identity: a resumed job may run at another priority).
    """

    model: str = "embed"
    options: RequestOptions = field(default_factory=RequestOptions)
    sparse: SparseOptions = field(default_factory=SparseOptions)
    output: OutputKind | None = None
    shard_rows: int = DEFAULT_SHARD_ROWS
    include_text: bool = False
    concurrency: int = 4
    batch_size: int | None = None
    timeout_s: float = 120.0
    admin_key: str | None = None
    retry: RetryPolicy = BULK_RETRY
    priority: Priority = Priority.BATCH


def job_identity(source: Source, settings: JobSettings) -> dict:
    """What must not change between a run and its resumption (recorded in the manifest).

    ``parameters`` holds the request options that are set, of both kinds (``top_k`` and
    ``threshold`` only when given, so an embedding job's identity is what it was before
    sparse models); ``output_kind`` is there only when given and not ``dense`` (what a job
    without it writes, of an embedding or a hybrid model), for the same reason.
    """
    params = settings.options.to_parameters()
    if params.get("embedding_type") == DEFAULT_EMBEDDING_TYPE.value:
        del params["embedding_type"]  # the default, whether given or not
    sparse = settings.sparse
    params.update({k: v for k, v in (("top_k", sparse.top_k), ("threshold", sparse.threshold))
                   if v is not None})  # fmt: skip
    given = settings.output
    output = {} if given in (None, OutputKind.DENSE) else {"output_kind": given.value}
    return {
        **output,
        "model": settings.model,
        "parameters": {k: params[k] for k in sorted(params)},
        "shard_rows": settings.shard_rows,
        "include_text": settings.include_text,
        "input": {**source.describe(), "fingerprint": source.fingerprint()},
    }


def job_id_of(identity: dict) -> str:
    """16 hex digits of the identity's SHA-256, the input's path left out."""
    described = dict(identity, input=dict(identity["input"], path=None))  # a moved file is fine
    return hashlib.sha256(json.dumps(described, sort_keys=True).encode()).hexdigest()[:16]


def differences(old: dict, new: dict) -> list[str]:
    """What differs from the ``old`` identity to the ``new`` one, naming the flags."""
    what = []
    if old.get("input", {}).get("fingerprint") != new["input"]["fingerprint"]:
        what.append("the input changed (its SHA-256 or how it is read)")
    names = {"model": "--model", "output_kind": "--output-kind", "shard_rows": "--shard-rows",
             "include_text": "--include-text"}  # fmt: skip
    for key, name in names.items():
        if old.get(key) != new.get(key):
            what.append(
                f"{name}: {old.get(key, 'not set')!r} then, {new.get(key, 'not set')!r} now"
            )
    before, now = old.get("parameters") or {}, new["parameters"]
    for key in sorted(set(before) | set(now)):
        if before.get(key) != now.get(key):
            flag = "--" + key.replace("_", "-")
            what.append(
                f"{flag}: {before.get(key, 'not set')!r} then, {now.get(key, 'not set')!r} now"
            )
    return what
