"""``triton-embed verify``: a bulk job's output folder checked against its manifest and input.

What is checked, with a manifest (``triton-embed embed``) and without one (a Ray Data
output): docs/bulk.md, "Checking the output". The vector column is the one the shards have:
``embedding`` (one width in every shard, the manifest's) or ``sparse`` (indices ascending in
each row, weights finite and above the job's ``threshold``, 0 when none was given).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from triton_embed.bulk.kinds import COLUMNS
from triton_embed.bulk.shards import (
    MANIFEST,
    SPARSE_TYPE,
    embedding_width,
    file_sha256,
    is_shard_file,
    read_manifest,
    read_sparse,
    read_tokens,
    vector_column,
)


@dataclass
class Verdict:
    """What :func:`verify` found.

    Attributes:
        rows: rows in all shards.
        shards: shard files read.
        dim: values per ``embedding`` entry (the same in every shard), or ``None`` (no
            shard read, or sparse vectors).
        column: the vector column, ``embedding`` or ``sparse``, or ``None`` (no shard read).
        weights: a ``sparse`` column's weights, all rows together (0 for ``embedding``).
        problems: one line each; empty when the output is good.
    """

    rows: int = 0
    shards: int = 0
    dim: int | None = None
    column: str | None = None
    weights: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether nothing is wrong."""
        return not self.problems


def _shard_files(directory: Path, manifest: dict | None) -> list[Path]:
    if manifest is not None:
        return [directory / entry["file"] for entry in manifest.get("shards", [])]
    return sorted(p for p in directory.rglob("*.parquet") if not p.name.startswith("."))


def verify(directory: str | Path, source=None) -> Verdict:
    """Check a finished output: shard integrity, schema, dimension, row count and ids.

    With a manifest: every listed shard exists with its SHA-256, row count and id range;
    the job is complete; the shards' rows add up to the manifest's. Without one (a Ray Data
    output): every ``*.parquet`` file under ``directory``. Always: the columns and types of
    :func:`~.shards.schema` (or :func:`~.shards.sparse_schema`), one embedding width (sparse:
    indices ascending in each row, weights finite and above the job's ``threshold``), no
    null, ids unique. With ``source`` (a
    :class:`~triton_embed.bulk.sources.Source`): its fingerprint equals the manifest's, and
    the ids are exactly the input's (in input order when there is a manifest).

    Args:
        directory: the output folder.
        source: the input, or ``None``.

    Returns:
        :class:`Verdict`.

    Raises:
        ValueError: ``directory`` is no folder, or its manifest is unreadable.
    """
    directory = Path(directory)
    if directory.is_file():
        raise ValueError(f"{directory} is a file; verify checks an output folder")
    if not directory.is_dir():
        raise ValueError(f"{directory}: no such folder")
    manifest = read_manifest(directory)
    verdict = Verdict()
    visible_shards = [p for p in directory.iterdir()
                      if is_shard_file(p.name) and not p.name.startswith(".")]  # fmt: skip
    if manifest is None and visible_shards:
        verdict.problems.append(
            f"{directory} holds part-NNNNN.parquet shards of 'triton-embed embed' but no "
            f"{MANIFEST}: it was deleted, or the job never started a manifest; embed it again"
        )
    files = _shard_files(directory, manifest)
    if not files:
        verdict.problems.append(f"{directory}: no shards")
    if manifest is not None and not manifest.get("complete"):
        verdict.problems.append(
            f"{directory / MANIFEST}: the job is not complete "
            f"({len(manifest.get('shards', []))} shards written); run the same command again"
        )
    entries = {e["file"]: e for e in (manifest or {}).get("shards", [])}
    threshold = float(((manifest or {}).get("job", {}).get("parameters") or {}).get("threshold", 0))
    ids: list = []
    first_schema = None
    for path in files:
        entry = entries.get(path.name)
        if not path.exists():
            verdict.problems.append(f"{path.name}: listed in the manifest but missing")
            continue
        if entry is not None and file_sha256(path) != entry.get("sha256"):
            verdict.problems.append(f"{path.name}: SHA-256 differs from the manifest's (changed)")
        try:
            shard = pq.read_table(path)
        except (OSError, ValueError) as exc:
            verdict.problems.append(f"{path.name}: not a readable Parquet file ({exc})")
            continue
        verdict.shards += 1
        verdict.rows += shard.num_rows
        problem = _schema_problem(shard.schema)
        if problem:
            verdict.problems.append(f"{path.name}: {problem}")
            continue
        plain = shard.schema.remove_metadata()
        column = vector_column(plain)
        if first_schema is None:
            first_schema, verdict.column = plain, column
            if column == "embedding":
                verdict.dim = plain.field("embedding").type.list_size
            if column == "tokens":
                verdict.dim = plain.field("tokens").type.value_type.list_size
        elif not plain.equals(first_schema):
            verdict.problems.append(
                f"{path.name}: columns {plain} differ from the first shard's {first_schema}"
            )
        if shard.column(column).null_count or shard.column("id").null_count:
            verdict.problems.append(f"{path.name}: null ids or {column} vectors")
        if column == "sparse":
            verdict.weights += _sparse_problems(verdict, path.name, shard.column(column), threshold)
        if column == "tokens":
            _tokens_problems(verdict, path.name, shard)
        shard_ids = shard.column("id").to_pylist()
        if (
            entry is not None
            and shard_ids
            and (
                entry.get("rows") != len(shard_ids)
                or entry.get("first_id") != shard_ids[0]
                or entry.get("last_id") != shard_ids[-1]
            )
        ):
            verdict.problems.append(
                f"{path.name}: rows or id range differ from the manifest's ({len(shard_ids)} "
                f"rows, ids {shard_ids[0]!r}..{shard_ids[-1]!r})"
            )
        ids += shard_ids
    if manifest is not None and manifest.get("complete") and manifest.get("rows") != verdict.rows:
        verdict.problems.append(
            f"the shards hold {verdict.rows} rows, the manifest says {manifest.get('rows')}"
        )
    kind = (manifest or {}).get("kind") or "embedding"
    want_column = {k.value: c for k, c in COLUMNS.items()}.get(kind)
    if manifest is not None and verdict.column is not None and verdict.column != want_column:
        verdict.problems.append(
            f"the shards hold {verdict.column!r} vectors; the manifest's model is a {kind} "
            f"model, which writes {want_column or 'no vectors the job knows'!r}"
        )
    elif manifest is not None and verdict.dim is not None and verdict.column == "tokens":
        if manifest.get("dimension") not in (None, verdict.dim):
            verdict.problems.append(
                f"token vectors have {verdict.dim} values, the manifest {manifest['dimension']}"
            )
    elif manifest is not None and verdict.dim is not None:
        want = embedding_width(manifest["embedding_type"], manifest["dimension"])
        if want != verdict.dim:
            verdict.problems.append(f"embeddings have {verdict.dim} values, the manifest {want}")
    unique = set(ids)
    if len(unique) != len(ids):
        seen: set = set()
        twice = sorted({i for i in ids if i in seen or seen.add(i)}, key=str)
        verdict.problems.append(f"{len(ids) - len(unique)} duplicate ids, e.g. {twice[:3]}")
    if source is not None:
        _check_against_input(verdict, manifest, source, ids, unique)
    return verdict


def _schema_problem(shard_schema: Any) -> str | None:
    missing = {"id", "num_tokens"} - set(shard_schema.names)
    column = vector_column(shard_schema)
    if missing or column is None:
        vectors = [] if column else ["embedding or sparse (one of them)"]
        return f"missing columns {sorted(missing) + vectors} (has {shard_schema.names})"
    kind = shard_schema.field(column).type
    if column == "embedding" and not pa.types.is_fixed_size_list(kind):
        return f"embedding is {kind}, not a fixed-size list"
    if column == "sparse" and not kind.equals(SPARSE_TYPE):
        return f"sparse is {kind}, not {SPARSE_TYPE}"
    if column == "tokens" and not (
        pa.types.is_list(kind)
        and pa.types.is_fixed_size_list(kind.value_type)
        and kind.value_type.value_type == pa.float32()
    ):
        return f"tokens is {kind}, not list<fixed_size_list<float32, dim>>"
    if shard_schema.field("num_tokens").type != pa.int32():
        return f"num_tokens is {shard_schema.field('num_tokens').type}, not int32"
    return None


def _sparse_problems(verdict: Verdict, name: str, column: Any, threshold: float) -> int:
    """Note indices not ascending in a row, and weights not finite and above ``threshold``.

    Returns:
        The column's weights, all rows together.
    """
    vectors = read_sparse(column)
    entries = column.combine_chunks().values if len(column) else None
    if entries is not None and any(entries.field(f).null_count for f in ("index", "value")):
        verdict.problems.append(f"{name}: null sparse indices or weights")
    indices, weights, offsets = vectors.indices, vectors.weights, vectors.offsets
    # indices[j + 1] > indices[j] unless j + 1 starts a row; weights compared in float64, as
    # the threshold was given (a float32 weight just above it is not rounded down to it)
    rising = np.diff(indices.astype(np.int64)) > 0
    rising[offsets[1:-1][(offsets[1:-1] > 0) & (offsets[1:-1] < vectors.nnz)] - 1] = True
    bad = [
        ("indices not ascending", np.flatnonzero(~rising) + 1),
        ("negative indices", np.flatnonzero(indices < 0)),
        (f"weights not finite and > {threshold:g}",
         np.flatnonzero(~(np.isfinite(weights) & (weights.astype(np.float64) > threshold)))),
    ]  # fmt: skip
    for what, where in bad:
        if where.size:
            row = int(np.searchsorted(offsets, where[0], side="right")) - 1
            verdict.problems.append(f"{name}: {what} ({where.size}, first in row {row})")
    return vectors.nnz


def _tokens_problems(verdict: Verdict, name: str, shard: Any) -> None:
    """Note rows whose vector count is not their ``num_tokens``, and values not finite."""
    matrices = read_tokens(shard.column("tokens"))
    counts = np.diff(matrices.offsets.astype(np.int64))
    num_tokens = shard.column("num_tokens").to_numpy()
    wrong = np.flatnonzero(counts != num_tokens)
    if wrong.size:
        verdict.problems.append(
            f"{name}: {wrong.size} rows hold another number of token vectors than num_tokens "
            f"(first row {int(wrong[0])}: {int(counts[wrong[0]])} vs {int(num_tokens[wrong[0]])})"
        )
    if not np.isfinite(matrices.values).all():
        verdict.problems.append(f"{name}: token vectors not finite")


def _check_against_input(verdict: Verdict, manifest, source, ids: list, unique: set) -> None:
    if manifest is not None and manifest["job"]["input"]["fingerprint"] != source.fingerprint():
        verdict.problems.append(
            f"{source.path} is not the input this output was made from (its fingerprint "
            "differs from the manifest's)"
        )
        return
    expected: list = []
    for chunk in source.chunks(65536):
        expected += chunk.ids
    if len(expected) != len(ids):
        verdict.problems.append(f"{len(ids)} rows for {len(expected)} input records")
    if manifest is not None:
        if ids != expected:
            pairs = enumerate(zip(ids, expected, strict=False))
            at = next((i for i, (a, b) in pairs if a != b), None)
            verdict.problems.append(
                "ids are not the input's in input order"
                + (
                    f" (first difference at row {at}: {ids[at]!r} vs {expected[at]!r})"
                    if at is not None
                    else ""
                )  # fmt: skip
            )
        return
    missing = set(expected) - unique
    extra = unique - set(expected)
    if missing:
        verdict.problems.append(f"{len(missing)} input ids missing, e.g. {sorted(missing)[:3]}")
    if extra:
        verdict.problems.append(f"{len(extra)} ids not in the input, e.g. {sorted(extra)[:3]}")
