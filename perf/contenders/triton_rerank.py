"""Contender ``triton_grpc`` of :mod:`perf.rerank`: our reranker ensemble over gRPC.

:func:`grpc_rerank_load` keeps ``conc`` KServe v2 requests in flight on one
``tritonclient.grpc.aio`` channel, each one query with ``docs`` documents (``QUERY`` and
``DOCUMENT`` BYTES ``[docs, 1]``, docs/rerank.md), and decodes every answer as a client
would: ``SCORE`` FP32 ``[docs, 1]`` and ``NUM_TOKENS`` INT32 ``[docs, 1]``, whose sum is the
token count (the server's own, per pair as scored).
"""

from __future__ import annotations

import asyncio

import numpy as np

from perf.contenders.openai_load import BadAnswer, closed_loop
from perf.corpora import PairCorpus

#: The reranker ensemble's name in the benchmark's repository.
ENSEMBLE = "rerank"


def rerank_inputs(query: str, documents: list[str]) -> list:
    """The ensemble's inputs for one query and its documents (``QUERY``, ``DOCUMENT``).

    Returns:
        ``tritonclient.grpc.InferInput`` objects, BYTES ``[len(documents), 1]`` each (the
        query repeated per pair), built from ``dtype=object`` arrays (STYLE: never ``bytes_``).
    """
    import tritonclient.grpc as grpcclient

    values = {
        "QUERY": np.array([[query.encode()]] * len(documents), dtype=object),
        "DOCUMENT": np.array([[d.encode()] for d in documents], dtype=object),
    }
    inputs = []
    for name, array in values.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_rerank_load(
    url: str,
    corpus: PairCorpus,
    docs: int,
    conc: int,
    seconds: float,
    model: str = ENSEMBLE,
) -> dict:
    """Load the reranker ensemble over gRPC, every score decoded.

    Args:
        url: the server's gRPC ``host:port``.
        corpus: the pairs; request ``r`` is :meth:`PairCorpus.request` ``(r, docs)``.
        docs: documents per request.
        conc: requests in flight.
        seconds: measurement time (the requests in flight at its end count, and their time).
        model: the ensemble.

    Returns:
        A rerank contender result: ``pairs_s``, ``tokens_per_pair`` from the answers'
        ``NUM_TOKENS`` (``tokens_counted_by`` ``server``), p50/p99 latency, errors.
    """
    import tritonclient.grpc.aio as aio
    from tritonclient.utils import InferenceServerException

    async def main():
        client = aio.InferenceServerClient(url)
        try:

            async def call(worker: int, n: int) -> tuple[int, int, int]:
                query, documents = corpus.request(worker + n * conc, docs)
                result = await client.infer(model, rerank_inputs(query, documents))
                scores = result.as_numpy("SCORE")
                tokens = result.as_numpy("NUM_TOKENS")
                if scores is None or scores.shape != (docs, 1) or tokens.shape != (docs, 1):
                    raise BadAnswer(f"SCORE {getattr(scores, 'shape', None)} for {docs} pairs")
                return docs, docs * corpus.length, int(tokens.sum())

            return await closed_loop(conc, seconds, call, (InferenceServerException,))
        finally:
            await client.close()

    return asyncio.run(main()).pairs_result(by_server=True)
