"""What a bulk job writes for each model kind: the vector column, the request options.

The output follows the model: an embedding ensemble's records get an ``embedding`` column
(dense vectors), a sparse ensemble's (SPLADE, docs/sparse.md) a ``sparse`` column (per record
its non-zero vocabulary indices, ascending, and their weights), a multi-vector ensemble's
(ColBERT, token embeddings) a ``tokens`` column (per record one float32 vector per token).
The job learns the kind from the servers' model configs
(:class:`~triton_embed.transport.catalog.ModelKind`), so the flags of every kind are taken
and checked against it once the model is known
(:func:`request_options`): a flag of the other kind is refused, naming it.

A hybrid model (BGE-M3: dense, sparse and ColBERT heads from one forward pass) writes the
vectors of one head, picked by ``--output-kind`` (:class:`OutputKind`: ``dense``, ``sparse``,
``tokens``): the job sees the model as that kind (:func:`model_view`, the catalog's
:meth:`~triton_embed.transport.hybrid_info.HybridInfo.view`) and asks the server for that
head alone (the ``outputs`` request parameter, :func:`request_options`), so the shards have
the column, Arrow type, resume and verify of that kind's shards. Without ``--output-kind`` a
hybrid model writes its dense vectors: what ``EmbeddingClient.embed`` and ``/v1/embeddings``
give for it, and the manifest records the kind written, so resuming with another
``--output-kind`` is refused.

A multi-vector answer is held as :class:`TokenMatrices` (one offsets array, one
``[tokens, dim]`` array), which becomes the ``list<fixed_size_list<float32, dim>>`` column the
same way. A sparse answer is held as :class:`SparseVectors` (compressed sparse rows: one offsets
array, one indices array, one weights array), which becomes the Arrow column without a
Python object per weight (:func:`triton_embed.bulk.shards.sparse_array`). Plain numpy: the
pool (:mod:`~triton_embed.bulk.pool_embedder`) runs without pyarrow.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from triton_embed.errors import InvalidInputError
from triton_embed.hybrid_options import HybridOptions
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import DEFAULT_EMBEDDING_TYPE, RequestOptions, Truncation
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.catalog import ModelInfo, ModelKind
from triton_embed.transport.hybrid_info import head_options

#: The vector column of each kind the bulk job writes.
COLUMNS = {
    ModelKind.EMBEDDING: "embedding",
    ModelKind.SPARSE: "sparse",
    ModelKind.MULTIVECTOR: "tokens",
}


class OutputKind(str, enum.Enum):
    """The vectors a bulk job writes of a hybrid model (``--output-kind``): one head's."""

    DENSE = "dense"
    SPARSE = "sparse"
    TOKENS = "tokens"

    @property
    def model_kind(self) -> ModelKind:
        """The kind whose shards it writes (``embedding``, ``sparse``, ``multivector``)."""
        return _VIEWS[self]

    @classmethod
    def parse(cls, value: OutputKind | str | None) -> OutputKind | None:
        """``dense`` / ``sparse`` / ``tokens`` (case-insensitive); ``None`` stays ``None``.

        Raises:
            InvalidInputError: another value (names it and the allowed ones).
        """
        if value is None or isinstance(value, cls):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            allowed = ", ".join(k.value for k in cls)
            raise InvalidInputError(f"--output-kind {value!r} is not one of {allowed}") from None


_VIEWS = {
    OutputKind.DENSE: ModelKind.EMBEDDING,
    OutputKind.SPARSE: ModelKind.SPARSE,
    OutputKind.TOKENS: ModelKind.MULTIVECTOR,
}
#: The output kind of each kind's shards (for the messages).
OUTPUT_OF = {kind: output for output, kind in _VIEWS.items()}


def model_view(info: ModelInfo, output: OutputKind | None, model: str) -> ModelInfo:
    """The model as the kind of vectors the job writes.

    Args:
        info: the served model (the catalog's).
        output: ``--output-kind``; ``None``: a hybrid model's dense vectors.
        model: its name, for the messages.

    Returns:
        ``info`` itself, or of a hybrid model its view of ``output``'s kind (its ``head``
        is the one the requests ask for, its ``dimension`` that head's).

    Raises:
        InvalidInputError: ``output`` names a kind other than a non-hybrid model's own.
    """
    if info.kind is ModelKind.HYBRID:
        return info.view((output or OutputKind.DENSE).model_kind)  # type: ignore[attr-defined]
    if output is not None and info.kind in OUTPUT_OF and output.model_kind is not info.kind:
        own = OUTPUT_OF[info.kind].value
        article = "an" if info.kind is ModelKind.EMBEDDING else "a"
        raise InvalidInputError(
            f"--output-kind {output.value} picks one head of a hybrid model (BGE-M3); "
            f"{model!r} is {article} {info.kind.value} model, which writes {own} vectors only "
            f"(column {COLUMNS[info.kind]!r}): leave --output-kind out (or pass {own}), or "
            "pass --model a hybrid model"
        )
    return info


@dataclass(frozen=True)
class SparseVectors:
    """``n`` sparse vectors as compressed sparse rows, in input order.

    Row ``r`` is ``indices[offsets[r]:offsets[r + 1]]`` (int32 vocabulary indices,
    ascending, as the server sends them) with ``weights[offsets[r]:offsets[r + 1]]``
    (float32).

    Attributes:
        offsets: int32 ``[n + 1]``, from 0 to ``nnz``, non-decreasing.
        indices: int32 ``[nnz]``.
        weights: float32 ``[nnz]``.
    """

    offsets: np.ndarray
    indices: np.ndarray
    weights: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def nnz(self) -> int:
        """Weights held, all rows together."""
        return int(self.offsets[-1])

    @classmethod
    def from_rows(cls, rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> SparseVectors:
        """From ``(indices [k], weights [k])`` per row (:meth:`.inference.Embeddings.sparse`).

        Raises:
            ValueError: a row's indices and weights differ in length, or the rows hold
                2**31 weights or more (int32 offsets, Arrow's ``list``).
        """
        lengths = np.array([len(i) for i, _ in rows], np.int64)
        if any(len(i) != len(w) for i, w in rows):
            raise ValueError("a sparse row has as many weights as indices")
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise ValueError(f"{offsets[-1]} sparse weights in one batch; at most 2**31 - 1")
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32))
        indices, weights = zip(*rows, strict=True) if rows else empty
        return cls(
            offsets.astype(np.int32),
            np.concatenate([np.asarray(i, np.int32).ravel() for i in indices] or [empty[0]]),
            np.concatenate([np.asarray(w, np.float32).ravel() for w in weights] or [empty[1]]),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[SparseVectors]) -> SparseVectors:
        """The rows of ``parts``, one after the other.

        Raises:
            ValueError: 2**31 weights or more in all.
        """
        starts = np.cumsum([0] + [p.nnz for p in parts], dtype=np.int64)
        if starts[-1] >= 2**31:
            raise ValueError(f"{starts[-1]} sparse weights in one batch; at most 2**31 - 1")
        offsets = [np.zeros(1, np.int64)]
        offsets += [p.offsets[1:].astype(np.int64) + s for p, s in zip(parts, starts, strict=False)]
        return cls(
            np.concatenate(offsets).astype(np.int32),
            np.concatenate([np.zeros(0, np.int32)] + [p.indices for p in parts]),
            np.concatenate([np.zeros(0, np.float32)] + [p.weights for p in parts]),
        )

    def row(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        """Row ``r``: ``(indices int32 [k], weights float32 [k])``."""
        start, stop = int(self.offsets[r]), int(self.offsets[r + 1])
        return self.indices[start:stop], self.weights[start:stop]


@dataclass(frozen=True)
class TokenMatrices:
    """``n`` texts' token vectors, one after the other, in input order.

    Text ``r`` is ``values[offsets[r]:offsets[r + 1]]``, float32 ``[tokens_r, dim]``.

    Attributes:
        offsets: int32 ``[n + 1]``, from 0 to the rows, non-decreasing.
        values: float32 ``[rows, dim]``.
    """

    offsets: np.ndarray
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def dim(self) -> int:
        """Values per token vector."""
        return int(self.values.shape[1])

    @classmethod
    def from_matrices(cls, matrices: Sequence[np.ndarray], dim: int = 0) -> TokenMatrices:
        """From per-text ``[tokens, dim]`` (:meth:`.inference.Embeddings.token_matrices`).

        Raises:
            ValueError: the matrices differ in ``dim``, or hold 2**31 rows or more.
        """
        dims = {m.shape[1] for m in matrices if len(m)} or {dim}
        if len(dims) > 1:
            raise ValueError(f"token matrices of different dimensions: {sorted(dims)}")
        width = dims.pop()
        offsets = np.zeros(len(matrices) + 1, np.int64)
        np.cumsum([len(m) for m in matrices], out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise ValueError(f"{offsets[-1]} token vectors in one batch; at most 2**31 - 1")
        rows = [np.asarray(m, np.float32).reshape(-1, width) for m in matrices]
        values = np.concatenate(rows) if rows else np.zeros((0, width), np.float32)
        return cls(offsets.astype(np.int32), values)

    @classmethod
    def concatenate(cls, parts: Sequence[TokenMatrices]) -> TokenMatrices:
        """The texts of ``parts``, one after the other."""
        matrices = [p.row(r) for p in parts for r in range(len(p))]
        return cls.from_matrices(matrices, parts[0].dim if parts else 0)

    def row(self, r: int) -> np.ndarray:
        """Text ``r``'s float32 ``[tokens, dim]``."""
        return self.values[int(self.offsets[r]) : int(self.offsets[r + 1])]


def _dense_flags(options: RequestOptions) -> list[str]:
    """The flags of ``options`` that only an embedding model takes, those that are set."""
    embedding_type = options.embedding_type
    set_flags = [
        ("--dimensions", options.dimensions is not None),
        ("--embedding-type", embedding_type not in (None, DEFAULT_EMBEDDING_TYPE)),
        ("--normalize", options.normalize is not None),
        ("--truncation CHUNK", options.truncation is Truncation.CHUNK),
    ]
    return [name for name, given in set_flags if given]


def request_options(
    kind: ModelKind,
    model: str,
    options: RequestOptions,
    sparse: SparseOptions,
    head: str | None = None,
) -> RequestOptions | SparseOptions | MultiVectorOptions | HybridOptions:
    """The options each request of the job sends to a model of ``kind``.

    Args:
        kind: the kind of vectors written (of a hybrid model, its view's:
            :func:`model_view`).
        model: its name, for the messages.
        options: the text options and an embedding model's (``--dimensions``,
            ``--embedding-type``, ``--normalize``).
        sparse: a sparse model's own (``top_k``, ``threshold``; its text options unused).
        head: a hybrid model's head the job writes (``dense``, ``sparse``, ``colbert``: the
            view's ``head``); ``None``: not a hybrid model.

    Returns:
        ``options`` for an embedding model; for a sparse model, a
        :class:`~triton_embed.sparse_options.SparseOptions` of ``options``' text options
        with ``sparse``'s ``top_k`` and ``threshold``; for a multi-vector model, its
        :class:`~triton_embed.multivector_options.MultiVectorOptions`; with ``head``, a
        :class:`~triton_embed.hybrid_options.HybridOptions` of those asking for ``head``
        alone (``outputs``).

    Raises:
        InvalidInputError: a flag of the other kind is set (names it and the model's kind),
            a flag a hybrid model does not take (``--dimensions``...), or ``kind`` is
            none of these.
    """
    if head is not None:
        given = _dense_flags(options)
        if given:
            raise InvalidInputError(
                f"{' and '.join(given)} do not apply to a hybrid model; {model!r} is one "
                "(BGE-M3: its dense vectors are CLS, L2-normalized, float32, full dimension): "
                f"leave {'it' if len(given) == 1 else 'them'} out"
            )
        if head != "sparse":
            given = [f"--{n.replace('_', '-')}" for n in ("top_k", "threshold")
                     if getattr(sparse, n) is not None]  # fmt: skip
            if given:
                raise InvalidInputError(
                    f"{' and '.join(given)} cut a hybrid model's sparse vectors; this job "
                    f"writes its {head} vectors: leave them out, or pass --output-kind sparse"
                )
        kind_options = request_options(kind, model, RequestOptions(
            truncation=options.truncation, allow_empty=options.allow_empty,
            invalid_utf8=options.invalid_utf8, input_type=options.input_type), sparse)  # fmt: skip
        try:
            return head_options(kind_options, head)
        except ValueError as exc:
            raise InvalidInputError(f"{exc} (model {model!r} is a hybrid model)") from None
    if kind is ModelKind.EMBEDDING:
        given = [f"--{n.replace('_', '-')}" for n in ("top_k", "threshold")
                 if getattr(sparse, n) is not None]  # fmt: skip
        if given:
            raise InvalidInputError(
                f"{' and '.join(given)} set the weights a sparse model keeps; {model!r} is an "
                "embedding model: leave them out, or pass --model a sparse model"
            )
        return options
    if kind is ModelKind.SPARSE:
        given = _dense_flags(options)
        if given:
            raise InvalidInputError(
                f"{' and '.join(given)} apply to an embedding model's vectors; {model!r} is a "
                "sparse model (it writes a 'sparse' column of indices and weights): leave "
                f"{'it' if len(given) == 1 else 'them'} out, or pass --model an embedding model"
            )
        text = {n: getattr(options, n) for n in ("truncation", "allow_empty", "invalid_utf8",
                                                 "input_type")}  # fmt: skip
        return SparseOptions(**text, top_k=sparse.top_k, threshold=sparse.threshold)
    if kind is ModelKind.MULTIVECTOR:
        given = _dense_flags(options) + [
            f"--{n.replace('_', '-')}"
            for n in ("top_k", "threshold")
            if getattr(sparse, n) is not None
        ]
        if given:
            raise InvalidInputError(
                f"{' and '.join(given)} do not apply to a multi-vector model; {model!r} writes "
                "a 'tokens' column (one vector per token): leave them out, or pass --model "
                "another model"
            )
        try:
            return MultiVectorOptions(
                truncation=options.truncation,
                allow_empty=options.allow_empty,
                invalid_utf8=options.invalid_utf8,
                input_type=options.input_type,
            )
        except ValueError as exc:
            raise InvalidInputError(f"{exc} (model {model!r} is a multi-vector model)") from None
    raise InvalidInputError(
        f"model {model!r} is a {kind.value}; the bulk job writes the vectors of an embedding, "
        "a sparse, a multi-vector or a hybrid model: pass --model the name of one"
    )
