"""The output of a bulk job: Parquet shards and a manifest, written atomically, verified.

An output folder holds ``part-NNNNN.parquet`` shards and ``_manifest.json`` (a name that
Parquet readers skip, so ``pyarrow.parquet.read_table(folder)`` reads the shards). Shard ``k`` holds
records ``k x shard_rows`` to ``(k + 1) x shard_rows - 1`` of the input, in input order, with
the columns of :func:`schema`:

* ``id``: int64 or string, the record's id (:mod:`triton_embed.bulk.sources`);
* ``num_tokens``: int32, tokens the model read (special tokens and prompt included); for a
  multi-vector model the rows of ``tokens`` (a ColBERT document's punctuation rows left out);
* ``embedding`` (an embedding model): a fixed-size list: ``dim`` float32 (``embedding_type``
  float32), ``dim`` float16, or ``ceil(dim / 8)`` uint8 of packed sign bits (ubinary), as the
  server sent them;
* ``sparse`` (a sparse model, :func:`sparse_schema`): ``list<struct<index: int32, value:
  float32>>``, the record's non-zero vocabulary indices, ascending, and their weights;
* ``tokens`` (a multi-vector model, :func:`tokens_schema`): ``list<fixed_size_list<float32,
  dim>>``, one vector per token (``num_tokens`` of them);
* ``text``: string, only when the job was asked to keep it.

A shard is written to a hidden temporary file (created exclusively, never through a symbolic
link: :func:`replace_atomically`) and renamed into place, so a shard file is complete or
absent; the manifest (the job's settings, each shard's file, rows, id range and SHA-256, and
whether the job is complete) is replaced the same way after each shard. A Ray
Data output (:mod:`triton_embed.bulk.ray_data`) has the same columns and no manifest.
:mod:`triton_embed.bulk.verify` checks an output folder.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from triton_embed.bulk.kinds import SparseVectors, TokenMatrices
from triton_embed.options import EmbeddingType

MANIFEST = "_manifest.json"  # "_": Parquet readers (pyarrow, Ray, Spark) skip it
#: The manifest's ``format``; a newer layout gets a new number.
FORMAT = "triton-embed-shards/1"
#: The key of each shard's Parquet key-value metadata.
SHARD_METADATA_KEY = b"triton_embed"
#: One weight of a ``sparse`` entry: its vocabulary index and its value.
SPARSE_ENTRY = pa.struct([("index", pa.int32()), ("value", pa.float32())])
#: The ``sparse`` column's type (what TEI's ``/embed_sparse`` answers, as Arrow).
SPARSE_TYPE = pa.list_(SPARSE_ENTRY)


_SHARD_FILE = re.compile(r"^\.?part-\d{5}\.parquet(\.tmp)?$")


def is_shard_file(name: str) -> bool:
    """Whether ``name`` is a shard or its temporary: ``[.]part-NNNNN.parquet[.tmp]``."""
    return _SHARD_FILE.match(name) is not None


def shard_name(index: int) -> str:
    """``part-NNNNN.parquet`` of shard ``index``."""
    return f"part-{index:05d}.parquet"


def embedding_width(embedding_type: str, dim: int) -> int:
    """Values per ``embedding`` entry: ``dim``, or ``ceil(dim / 8)`` bytes for ubinary."""
    if EmbeddingType.parse(embedding_type) is EmbeddingType.UBINARY:
        return (dim + 7) // 8
    return dim


def _value_type(embedding_type: str) -> Any:
    return {
        EmbeddingType.FLOAT32: pa.float32(),
        EmbeddingType.FLOAT16: pa.float16(),
        EmbeddingType.UBINARY: pa.uint8(),
    }[EmbeddingType.parse(embedding_type)]


def schema(id_type: str, embedding_type: str, dim: int, include_text: bool) -> Any:
    """The ``pyarrow.Schema`` of an embedding model's shard (see the module docstring)."""
    width = embedding_width(embedding_type, dim)
    vectors = pa.field("embedding", pa.list_(_value_type(embedding_type), width), nullable=False)
    return _schema(id_type, vectors, include_text)


def sparse_schema(id_type: str, include_text: bool) -> Any:
    """The ``pyarrow.Schema`` of a sparse model's shard: ``sparse`` is :data:`SPARSE_TYPE`."""
    return _schema(id_type, pa.field("sparse", SPARSE_TYPE, nullable=False), include_text)


def tokens_type(dim: int) -> Any:
    """The ``tokens`` column's type: ``list<fixed_size_list<float32, dim>>``."""
    return pa.list_(pa.list_(pa.float32(), dim))


def tokens_schema(id_type: str, dim: int, include_text: bool) -> Any:
    """The ``pyarrow.Schema`` of a multi-vector model's shard: ``tokens`` of ``dim`` values."""
    return _schema(id_type, pa.field("tokens", tokens_type(dim), nullable=False), include_text)


def tokens_array(matrices: TokenMatrices) -> Any:
    """A :func:`tokens_type` array of ``matrices`` (their buffers, no object per value)."""
    dim = matrices.dim
    rows = pa.FixedSizeListArray.from_arrays(
        pa.array(np.ascontiguousarray(matrices.values).reshape(-1), pa.float32()), dim
    )
    return pa.ListArray.from_arrays(pa.array(matrices.offsets, pa.int32()), rows, tokens_type(dim))


def read_tokens(column: Any) -> TokenMatrices:
    """The :class:`~triton_embed.bulk.kinds.TokenMatrices` of a ``tokens`` column (or array)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = array.offsets.to_numpy().astype(np.int64)
    dim = array.type.value_type.list_size
    flat = array.values.values.to_numpy(zero_copy_only=False).reshape(-1, dim)
    start = offsets[0]
    return TokenMatrices((offsets - start).astype(np.int32), flat[start : offsets[-1]])


def _schema(id_type: str, vectors: Any, include_text: bool) -> Any:
    fields = [
        pa.field("id", pa.int64() if id_type == "int64" else pa.string(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        vectors,
    ]
    if include_text:
        fields.append(pa.field("text", pa.string(), nullable=False))
    return pa.schema(fields)


def vector_column(shard_schema: Any) -> str | None:
    """The schema's vector column (``embedding``, ``sparse`` or ``tokens``), or ``None``."""
    found = [name for name in ("embedding", "sparse", "tokens") if name in shard_schema.names]
    return found[0] if len(found) == 1 else None


def sparse_array(vectors: SparseVectors) -> Any:
    """A :data:`SPARSE_TYPE` array of ``vectors`` (their buffers, no object per weight)."""
    entries = pa.StructArray.from_arrays(
        [pa.array(vectors.indices, pa.int32()), pa.array(vectors.weights, pa.float32())],
        fields=list(SPARSE_ENTRY),
    )
    return pa.ListArray.from_arrays(pa.array(vectors.offsets, pa.int32()), entries, SPARSE_TYPE)


def read_sparse(column: Any) -> SparseVectors:
    """The :class:`~triton_embed.bulk.kinds.SparseVectors` of a ``sparse`` column (or array)."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = array.offsets.to_numpy().astype(np.int64)
    entries = array.values
    indices = entries.field("index").to_numpy(zero_copy_only=False)
    weights = entries.field("value").to_numpy(zero_copy_only=False)
    start = offsets[0]
    return SparseVectors(
        (offsets - start).astype(np.int32),
        indices[start : offsets[-1]].astype(np.int32),
        weights[start : offsets[-1]].astype(np.float32),
    )


def table(
    shard_schema: Any,
    ids: list,
    num_tokens: np.ndarray,
    vectors: np.ndarray | SparseVectors | Sequence[np.ndarray | SparseVectors],
    texts: list[str] | None = None,
) -> Any:
    """A ``pyarrow.Table`` of ``shard_schema`` from one shard's rows.

    Args:
        shard_schema: :func:`schema` or :func:`sparse_schema`.
        ids: ``n`` ids.
        num_tokens: int ``[n]``.
        vectors: ``[n, width]`` of the embedding's value type (a :func:`sparse_schema`:
            :class:`~triton_embed.bulk.kinds.SparseVectors` of ``n`` rows), or several such
            (one per request) whose rows add up to ``n``: they become the chunks of the
            column, without being copied into one array first.
        texts: ``n`` texts, when the schema has a ``text`` column.
    """
    one = isinstance(vectors, (np.ndarray, SparseVectors, TokenMatrices))
    parts = [vectors] if one else list(vectors)
    if vector_column(shard_schema) == "sparse":
        embeddings = pa.chunked_array([sparse_array(p) for p in parts], type=SPARSE_TYPE)
    elif vector_column(shard_schema) == "tokens":
        kind = shard_schema.field("tokens").type
        embeddings = pa.chunked_array([tokens_array(p) for p in parts], type=kind)
    else:
        kind = shard_schema.field("embedding").type
        embeddings = pa.chunked_array(
            [pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(p).reshape(-1), type=kind.value_type),
                kind.list_size,
            ) for p in parts],
            type=kind,
        )  # fmt: skip
    columns = [
        pa.chunked_array([pa.array(ids, type=shard_schema.field("id").type)]),
        pa.chunked_array([pa.array(np.asarray(num_tokens, dtype=np.int32))]),
        embeddings,
    ]
    if "text" in shard_schema.names:
        columns.append(pa.chunked_array([pa.array(texts, type=pa.string())]))
    return pa.Table.from_arrays(columns, schema=shard_schema)


def file_sha256(path: Path) -> str:
    """SHA-256 of the file's bytes, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def temporary_name(path: Path) -> Path:
    """The temporary that :func:`replace_atomically` writes before ``path``: ``.NAME.tmp``."""
    return path.with_name(f".{path.name}.tmp")


def create_exclusive(path: Path, mode: int = 0o666) -> int:
    """A new file at ``path``, opened for writing: never an existing file, never a link.

    ``O_CREAT | O_EXCL | O_NOFOLLOW``: whatever lies at ``path`` (a leftover temporary, or a
    symbolic link planted to make the job overwrite a file outside its folder) makes the
    call fail instead of being written through. ``mode`` is masked by the umask, as
    ``open(path, "w")`` would.

    Returns:
        The file descriptor (the caller closes it).

    Raises:
        OSError: ``path`` exists (``FileExistsError``), or cannot be created.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(path, flags, mode)


def replace_atomically(path: Path, write: Callable[[Any], None]) -> None:
    """Write ``path`` whole or not at all: a temporary, synced to disk, renamed over ``path``.

    The temporary (:func:`temporary_name`, in ``path``'s folder) is removed first if
    something lies there: ``unlink`` removes a symbolic link itself, never its target, and
    the folder is the job's (its lock is held). It is then created by
    :func:`create_exclusive`, so a link planted between the two steps makes the write fail
    with a message naming it; nothing outside the folder is ever opened for writing. The
    rename replaces ``path`` itself, even when ``path`` is a link.

    Args:
        path: the file to replace.
        write: ``write(file)`` writes the content to a binary file object.

    Raises:
        OSError: the temporary cannot be created (the message says why and names it), or
            writing, syncing or renaming failed.
    """
    tmp = temporary_name(path)
    try:
        os.unlink(tmp)  # a crash's leftover, or a planted link (the link goes, not its target)
    except FileNotFoundError:
        pass
    try:
        fd = create_exclusive(tmp)
    except FileExistsError:
        raise FileExistsError(
            errno.EEXIST,
            f"{tmp} appeared while this job was replacing it: another process writes in "
            f"{path.parent}; stop it (or name another output folder) and run again",
            str(tmp),
        ) from None
    try:
        with open(fd, "wb", closefd=True) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _entry(path: Path, shard: Any, first_record: int) -> dict:
    """The manifest entry of the shard file ``path`` holding ``shard``."""
    ids = shard.column("id")
    return {
        "file": path.name,
        "rows": shard.num_rows,
        "first_record": first_record,
        "first_id": ids[0].as_py() if shard.num_rows else None,
        "last_id": ids[-1].as_py() if shard.num_rows else None,
        "tokens": int(pc.sum(shard.column("num_tokens")).as_py() or 0),
        "sha256": file_sha256(path),
    }


def write_shard(directory: Path, index: int, shard: Any, first_record: int, job_id: str) -> dict:
    """Write shard ``index`` atomically; returns its manifest entry.

    The file's key-value metadata names the shard, its first record and the job, so a shard
    renamed into place just before a crash (the manifest not yet updated) is recognised.
    """
    meta = {"shard": index, "first_record": first_record, "rows": shard.num_rows, "job": job_id}
    shard = shard.replace_schema_metadata({SHARD_METADATA_KEY: json.dumps(meta).encode()})
    path = directory / shard_name(index)
    # No dictionary encoding: embeddings and ids are (nearly) all distinct, and the
    # dictionary builder would hold a hash table as large as the shard.
    replace_atomically(path, lambda f: pq.write_table(shard, f, use_dictionary=False))
    return _entry(path, shard, first_record)


def shard_entry_if_complete(directory: Path, index: int, first_record: int, job_id: str):
    """The manifest entry of shard ``index`` if its file is there, whole and of this job."""
    path = directory / shard_name(index)
    if path.is_symlink():  # a shard is a file the job wrote, never a link to elsewhere
        return None
    try:
        meta = pq.read_metadata(path).metadata or {}
        stated = json.loads(meta.get(SHARD_METADATA_KEY, b"{}"))
        shard = pq.read_table(path)
    except (OSError, ValueError):
        return None
    if stated.get("job") != job_id or stated.get("first_record") != first_record:
        return None
    return _entry(path, shard, first_record)


def write_manifest(directory: Path, manifest: dict) -> None:
    """Replace ``_manifest.json`` atomically."""
    text = json.dumps(manifest, indent=2, ensure_ascii=False) + "\n"
    replace_atomically(directory / MANIFEST, lambda f: f.write(text.encode("utf-8")))


def read_manifest(directory: Path) -> dict | None:
    """``_manifest.json`` of ``directory``, or ``None`` when there is none.

    Raises:
        ValueError: it is not a manifest of this format (names the file).
    """
    path = directory / MANIFEST
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read it as JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: not a triton-embed manifest (format {FORMAT!r})")
    return manifest


def read_vectors(directory: str | Path) -> np.ndarray:
    """Every embedding of a complete output folder, ``[rows, width]``, in input order.

    Raises:
        ValueError: no manifest (a Ray output has no input order), or the job is not
            complete; the message names the folder.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    if manifest is None or not manifest.get("complete"):
        state = "has no " + MANIFEST if manifest is None else "is not complete"
        raise ValueError(
            f"{directory} {state}: pass a folder 'triton-embed embed' finished (rows in input "
            "order)"
        )
    if manifest.get("kind", "embedding") != "embedding":
        raise ValueError(
            f"{directory} holds the {manifest['kind']} vectors of {manifest['model']!r}, not "
            "embeddings: pass a folder an embedding model wrote"
        )
    columns = [pq.read_table(directory / e["file"], columns=["embedding"]).column(0)
               for e in manifest["shards"]]  # fmt: skip
    return np.concatenate([np.stack(c.to_numpy(zero_copy_only=False)) for c in columns if len(c)])
