"""The bulk job on a Ray cluster: a callable class for Ray Data's ``Dataset.map_batches``.

>>> import ray
>>> from triton_embed.bulk.ray_data import TritonEmbedder, embed_dataset
>>> ds = ray.data.read_parquet("s3://bucket/corpus/")            # columns: id, text
>>> out = embed_dataset(ds, urls="triton-grpc.embed.svc:8001", concurrency=4)
>>> out.write_parquet("s3://bucket/embeddings/")                 # then: triton-embed verify

Each actor of the pool is one :class:`TritonEmbedder`: a gRPC client of the Triton servers
(``urls``: the servers of its node, several balanced, or a Kubernetes Service whose name
resolves to every pod), through the same upstream pool as the CLI and the gateway
(:class:`~triton_embed.bulk.pool_embedder.BlockingEmbedder`). With ``node_local_port`` an
actor talks to the server on its own node (``<node ip>:<port>``) instead, so a cluster with
one server per node keeps its traffic local.

Batches come in and go out as ``pyarrow.Table``; the output has the columns of the CLI's
shards (:func:`triton_embed.bulk.shards.schema`: ``id``, ``num_tokens``, ``embedding`` as a
fixed-size list, and ``text`` when asked; a sparse model's ``sparse`` column instead of
``embedding``, :func:`~triton_embed.bulk.shards.sparse_schema`), so ``triton-embed verify
OUT INPUT`` checks a Ray output too (it has no manifest: verify reads every ``*.parquet``
file; ids are compared as a set, since Ray does not keep the input order).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from triton_embed.bulk import shards
from triton_embed.bulk.kinds import SparseVectors, TokenMatrices
from triton_embed.bulk.pool_embedder import BULK_RETRY, BlockingEmbedder
from triton_embed.errors import InvalidInputError
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, RequestOptions
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.catalog import ModelKind


class TritonEmbedder:
    """Embeds a Ray Data batch (``pyarrow.Table``) with a Triton embedding or sparse ensemble.

    Args:
        urls: gRPC ``host:port`` endpoints, comma-separated or a list.
        model: the ensemble's name.
        text_column: the input column of the texts.
        id_column: the input column of the ids (integers or strings).
        include_text: keep the texts in the output (column ``text``).
        node_local_port: when set, use ``<this node's IP>:<port>`` instead of ``urls``.
        admin_key: the servers' admin key (the pool reads their model configs); ``None``:
            ``TRITON_EMBED_ADMIN_KEY`` / ``TRITON_EMBED_ADMIN_KEY_FILE`` on the worker.
        timeout_s: deadline of one request, seconds.
        output_kind: a hybrid model's head to write: ``dense`` (``None``, the default),
            ``sparse`` or ``tokens`` (:class:`~triton_embed.bulk.kinds.OutputKind`); another
            model takes only its own kind.
        **options: request options, the fields of
            :class:`~triton_embed.options.RequestOptions` (``input_type`` (default
            ``document``), ``dimensions``, ``embedding_type``, ``truncation``, ``allow_empty``,
            ``normalize``, ``invalid_utf8``); for a sparse model also ``top_k`` and
            ``threshold`` (:class:`~triton_embed.sparse_options.SparseOptions`).

    Returns (per call): a ``pyarrow.Table`` with ``id``, ``num_tokens`` (int32),
    ``embedding`` (fixed-size list; a sparse model: ``sparse``, ``list<struct<index: int32,
    value: float32>>``; a multi-vector model: ``tokens``, ``list<fixed_size_list<float32,
    dim>>``; a hybrid model: that of ``output_kind``) and optionally ``text``, rows in the
    batch's order.

    Raises:
        InvalidInputError: the server refused a text (the message names its id), or an
            option does not apply to the model's kind (names it).
        ServerUnavailableError: the servers stayed unreachable through the retries.
    """

    def __init__(
        self,
        urls: str | list[str] = "127.0.0.1:8001",
        model: str = "embed",
        *,
        text_column: str = "text",
        id_column: str = "id",
        include_text: bool = False,
        node_local_port: int | None = None,
        admin_key: str | None = None,
        timeout_s: float = 120.0,
        output_kind: str | None = None,
        **options: Any,
    ):
        from triton_embed.admin import read_admin_key

        if node_local_port is not None:
            import ray

            urls = f"{ray.util.get_node_ip_address()}:{node_local_port}"
        options.setdefault("input_type", "document")  # a corpus is documents
        sparse = SparseOptions(top_k=options.pop("top_k", None),
                               threshold=options.pop("threshold", None))  # fmt: skip
        self.options = RequestOptions(**options)
        self.text_column = text_column
        self.id_column = id_column
        self.include_text = include_text
        self._embedder = BlockingEmbedder(
            urls,
            model,
            self.options,
            sparse=sparse,
            output=output_kind,
            timeout_s=timeout_s,
            admin_key=admin_key or read_admin_key(),
            retry=BULK_RETRY,
        )
        self._schema = None

    def __call__(self, batch: Any) -> Any:
        """Embed one batch (``pyarrow.Table`` with the text and id columns)."""
        texts = batch.column(self.text_column).to_pylist()
        ids = batch.column(self.id_column).to_pylist()
        try:
            answer = self._embedder.embed(texts)
        except InvalidInputError as exc:
            where = f" (id {ids[exc.index]!r})" if exc.index is not None else ""
            raise InvalidInputError(f"{exc}{where}", index=exc.index) from None
        if self._schema is None:
            import pyarrow as pa

            id_type = batch.schema.field(self.id_column).type
            id_type = "int64" if pa.types.is_integer(id_type) else "string"
            if self._embedder.info.kind is ModelKind.SPARSE:
                self._schema = shards.sparse_schema(id_type, self.include_text)
            elif self._embedder.info.kind is ModelKind.MULTIVECTOR:
                dim = self._embedder.info.dimension or answer.vectors.dim
                self._schema = shards.tokens_schema(id_type, dim, self.include_text)
            else:
                kind = (self.options.embedding_type or DEFAULT_EMBEDDING_TYPE).value
                width = answer.vectors.shape[1]
                self._schema = shards.schema(
                    id_type,
                    kind,
                    width * 8 if kind == "ubinary" else width,  # the schema needs the width only
                    self.include_text,
                )
        vectors = answer.vectors
        return shards.table(
            self._schema,
            ids,
            answer.num_tokens,
            vectors if isinstance(vectors, (SparseVectors, TokenMatrices)) else np.asarray(vectors),
            texts if self.include_text else None,
        )

    def __del__(self) -> None:
        embedder = getattr(self, "_embedder", None)
        if embedder is not None:
            embedder.close()


def embed_dataset(
    ds: Any,
    urls: str | list[str],
    *,
    model: str = "embed",
    concurrency: int = 2,
    batch_size: int = 256,
    text_column: str = "text",
    id_column: str = "id",
    include_text: bool = False,
    node_local_port: int | None = None,
    output_kind: str | None = None,
    num_cpus: float = 0.5,
    **options: Any,
) -> Any:
    """``ds.map_batches(TritonEmbedder, ...)`` with an actor pool of ``concurrency`` actors.

    Args:
        ds: a ``ray.data.Dataset`` with a text column and an id column (integers or
            strings; Ray Data keeps no global row number to make ids from).
        urls: the Triton servers' gRPC endpoints (comma-separated or a list).
        concurrency: actors (each a client with up to ``batch_size`` texts in flight, sent in
            requests of the ensemble's ``max_batch_size``).
        batch_size: rows per ``map_batches`` batch.
        num_cpus: CPUs Ray reserves per actor (the work is the servers'; an actor waits).
        model: the ensemble's name.
        text_column: the column of the texts.
        id_column: the column of the ids.
        include_text: keep the texts in the output.
        output_kind: a hybrid model's head to write (``dense``, ``sparse``, ``tokens``).
        node_local_port: each actor talks to ``<its node's IP>:<port>`` instead of ``urls``.
        **options: request options, as :class:`TritonEmbedder`.

    Returns:
        The lazy output dataset (``write_parquet`` it).
    """
    names = ds.schema().names
    for column, what in ((text_column, "text"), (id_column, "id")):
        if column not in names:
            raise ValueError(
                f"the dataset has no {what} column {column!r} (columns: {', '.join(names)}); "
                + ("pass text_column=" if what == "text" else
                   "pass id_column=, or add ids: Ray Data keeps no global row number")
            )  # fmt: skip
    from ray.data import ActorPoolStrategy

    return ds.map_batches(
        TritonEmbedder,
        fn_constructor_kwargs={
            "urls": urls,
            "model": model,
            "text_column": text_column,
            "id_column": id_column,
            "include_text": include_text,
            "node_local_port": node_local_port,
            "output_kind": output_kind,
            **options,
        },
        batch_format="pyarrow",
        batch_size=batch_size,
        compute=ActorPoolStrategy(size=concurrency),
        num_cpus=num_cpus,
    )
