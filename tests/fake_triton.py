"""A stand-in for ``tritonclient.grpc.InferenceServerClient`` with the ``embed`` input rules.

Unit tests patch it in (:func:`install`) for the real gRPC client, so that
:class:`triton_embed.EmbeddingClient` (and the CLI over it) runs its own code, batching and
error mapping included, with no server.
It answers the way the server does: an empty text without ``allow_empty`` and a text of more
than :attr:`FakeTriton.max_tokens` words with ``truncation=NONE`` fail the request with gRPC
``INVALID_ARGUMENT`` and the server's message, which counts texts from the start of the request.
Text ``t`` embeds to ``[len(t), 1.0]``; it has ``len(t.split()) + 2`` tokens.

It also serves a reranker ensemble, ``rerank`` (``QUERY``, ``DOCUMENT`` -> ``SCORE``,
``NUM_TOKENS``; docs/rerank.md), with the same ``max_batch_size``: a pair's raw score is the
number of the query's words in the document, minus 1, and its score the sigmoid of that
(``raw_scores=true``: the raw one); it has ``len(q.split()) + len(d.split()) + 3`` tokens. An
empty document fails its request with the pair tokenizer's message ("the document of pair
i is empty").

And a sparse ensemble, ``splade`` (``TEXT`` -> ``SPARSE``, ``NUM_TOKENS``; docs/sparse.md): a
text's word ``j`` (of ``w``) is vocabulary index ``100 * j + len(w)`` with weight ``len(w)``;
``top_k`` keeps the largest (ties: lower index), ``threshold`` those above it.
"""

from __future__ import annotations

import numpy as np
from triton_embed.codec import encode_embeddings, encode_sparse
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor

#: The reranker ensemble's name in this stand-in.
RERANKER = "rerank"
#: The sparse ensemble's name in this stand-in.
SPARSE = "splade"


def sparse_vector(text: bytes, top_k: int | None = None, threshold: float = 0.0):
    """The stand-in's sparse vector of ``text``: int32 indices ascending, float32 weights."""
    entries = [(100 * j + len(w), float(len(w))) for j, w in enumerate(text.split())]
    kept = sorted(entries, key=lambda e: (-e[1], e[0]))[:top_k]
    kept = sorted(e for e in kept if e[1] > threshold)
    return np.array([i for i, _ in kept], np.int32), np.array([v for _, v in kept], np.float32)


class _Result:
    def __init__(self, outputs: dict[str, np.ndarray]):
        self.outputs = outputs

    def as_numpy(self, name: str) -> np.ndarray:
        return self.outputs[name]


class FakeTriton:
    """``InferenceServerClient(url)`` of a server whose ``embed`` has ``max_batch_size`` 4."""

    max_batch_size = 4
    max_tokens = 8
    requests: list[list[bytes]] = []  # every request's texts, in the order they arrived
    parameters: list[dict] = []  # every request's parameters, in the same order
    priorities: list[int] = []  # every request's priority= (0: not sent), in the same order

    def __init__(self, url: str, *args, **kwargs):
        self.url = url

    def is_model_ready(self, model: str, *args, **kwargs) -> bool:
        return model in ("embed", RERANKER, SPARSE)

    def get_model_config(self, model: str, as_json: bool = False, headers=None, **kwargs):
        config = {"name": model, "max_batch_size": self.max_batch_size}
        if model == RERANKER:
            config["input"] = [{"name": "QUERY"}, {"name": "DOCUMENT"}]
            config["output"] = [{"name": "SCORE"}, {"name": "NUM_TOKENS"}]
        elif model == SPARSE:
            config["output"] = [{"name": "SPARSE"}, {"name": "NUM_TOKENS"}]
        else:
            config["output"] = [{"name": "EMBEDDING"}, {"name": "NUM_TOKENS"}]
        return {"config": config}

    def infer(self, model, inputs, outputs=None, client_timeout=None, parameters=None, **kwargs):
        if model == RERANKER:
            return self._score(inputs, dict(parameters or {}))
        texts = [bytes(t) for t in deserialize_bytes_tensor(inputs[0]._get_content())]
        FakeTriton.requests.append(texts)
        params = dict(parameters or {})
        FakeTriton.parameters.append(params)
        FakeTriton.priorities.append(kwargs.get("priority", 0))
        for i, text in enumerate(texts):
            if not text and not params.get("allow_empty"):
                raise InferenceServerException(
                    msg=f"in ensemble 'embed', text {i} is empty; send at least one character, "
                    "or set the request parameter allow_empty=true to embed it",
                    status="StatusCode.INVALID_ARGUMENT",
                )
            tokens = len(text.split()) + 2
            if tokens > self.max_tokens and params.get("truncation") == "NONE":
                raise InferenceServerException(
                    msg=f"in ensemble 'embed', text {i} has {tokens} tokens; the model accepts "
                    f"{self.max_tokens}; shorten it or set the request parameter truncation=END "
                    "or START",
                    status="StatusCode.INVALID_ARGUMENT",
                )
        if model == SPARSE:
            k, threshold = params.get("top_k"), params.get("threshold", 0.0)
            indices, weights = zip(*(sparse_vector(t, k, threshold) for t in texts), strict=True)
            counts = np.array([[len(t.split()) + 2] for t in texts], np.int32)
            sparse = encode_sparse(indices, weights).reshape(-1, 1)
            return _Result({"SPARSE": sparse, "NUM_TOKENS": counts})
        vectors = np.array([[len(t.decode()), 1.0] for t in texts], np.float32)
        counts = np.array([[min(len(t.split()) + 2, self.max_tokens)] for t in texts], np.int32)
        return _Result({"EMBEDDING": encode_embeddings(vectors), "NUM_TOKENS": counts})

    def _score(self, inputs, params: dict) -> _Result:
        named = {t.name(): [bytes(x) for x in deserialize_bytes_tensor(t._get_content())]
                 for t in inputs}  # fmt: skip
        queries, documents = named["QUERY"], named["DOCUMENT"]
        FakeTriton.requests.append(documents)
        FakeTriton.parameters.append(params)
        for i, document in enumerate(documents):
            if not document.strip():
                raise InferenceServerException(
                    msg=f"in ensemble '{RERANKER}', the document of pair {i} is empty; send at "
                    "least one non-blank character",
                    status="StatusCode.INVALID_ARGUMENT",
                )
        pairs = list(zip(queries, documents, strict=True))
        raw = np.array([len(set(q.split()) & set(d.split())) - 1.0 for q, d in pairs], np.float32)
        scores = raw if params.get("raw_scores") else 1 / (1 + np.exp(-raw))
        counts = [len(q.split()) + len(d.split()) + 3 for q, d in pairs]
        return _Result(
            {
                "SCORE": scores.astype(np.float32).reshape(-1, 1),
                "NUM_TOKENS": np.array(counts, np.int32).reshape(-1, 1),
            }
        )

    def async_infer(self, model, inputs, callback, **kwargs):
        """Answer at once through ``callback`` (as ``infer`` would); a cancellable context."""
        try:
            result, error = self.infer(model, inputs, **kwargs), None
        except InferenceServerException as exc:
            result, error = None, exc
        callback(result=result, error=error)
        return _Context()

    def close(self) -> None:
        pass


class _Context:
    """``tritonclient.grpc.CallContext`` of a call that already answered."""

    cancelled = 0

    def cancel(self) -> None:
        _Context.cancelled += 1


def install(monkeypatch) -> type[FakeTriton]:
    """Patch :class:`FakeTriton` in for the gRPC client (a test's ``monkeypatch`` undoes it).

    Returns:
        The class; its ``requests`` lists the texts each request sent, its ``parameters``
        their request parameters, its ``priorities`` their ``priority=`` (0: none sent).
    """
    import tritonclient.grpc

    FakeTriton.requests = []
    FakeTriton.parameters = []
    FakeTriton.priorities = []
    monkeypatch.setattr(tritonclient.grpc, "InferenceServerClient", FakeTriton)
    return FakeTriton
