"""The output of a bulk job: Parquet shards and a manifest, written atomically, verified.

An output folder holds ``part-NNNNN.parquet`` shards and ``_manifest.json`` (a name that
Parquet readers skip, so ``pyarrow.parquet.read_table(folder)`` reads the shards). Shard ``k`` holds
records ``k x shard_rows`` to ``(k + 1) x shard_rows - 1`` of the input, in input order, with
the columns of :func:`schema`:

* ``id``: int64 or string, the record's id (:mod:`triton_embed.bulk.sources`);
* ``num_tokens``: int32, tokens the model read (special tokens and prompt included);
* ``embedding``: a fixed-size list: ``dim`` float32 (``embedding_type`` float32), ``dim``
  float16, or ``ceil(dim / 8)`` uint8 of packed sign bits (ubinary), as the server sent them;
* ``text``: string, only when the job was asked to keep it.

A shard is written to a hidden temporary file (created exclusively, never through a symbolic
link: :func:`replace_atomically`) and renamed into place, so a shard file is complete or
absent; the manifest (the job's settings, each shard's file, rows, id range and SHA-256, and
whether the job is complete) is replaced the same way after each shard. A Ray
Data output (:mod:`triton_embed.bulk.ray_data`) has the same columns and no manifest.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from triton_embed.options import EmbeddingType

MANIFEST = "_manifest.json"  # "_": Parquet readers (pyarrow, Ray, Spark) skip it
#: The manifest's ``format``; a newer layout gets a new number.
FORMAT = "triton-embed-shards/1"
#: The key of each shard's Parquet key-value metadata.
SHARD_METADATA_KEY = b"triton_embed"


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
    """The ``pyarrow.Schema`` of a shard (see the module docstring)."""
    fields = [
        pa.field("id", pa.int64() if id_type == "int64" else pa.string(), nullable=False),
        pa.field("num_tokens", pa.int32(), nullable=False),
        pa.field(
            "embedding",
            pa.list_(_value_type(embedding_type), embedding_width(embedding_type, dim)),
            nullable=False,
        ),
    ]
    if include_text:
        fields.append(pa.field("text", pa.string(), nullable=False))
    return pa.schema(fields)


def table(
    shard_schema: Any,
    ids: list,
    num_tokens: np.ndarray,
    vectors: np.ndarray | Sequence[np.ndarray],
    texts: list[str] | None = None,
) -> Any:
    """A ``pyarrow.Table`` of ``shard_schema`` from one shard's rows.

    Args:
        shard_schema: :func:`schema`.
        ids: ``n`` ids.
        num_tokens: int ``[n]``.
        vectors: ``[n, width]`` of the embedding's value type, or several such arrays (one per
            request) whose rows add up to ``n``: they become the chunks of the column, without
            being copied into one array first.
        texts: ``n`` texts, when the schema has a ``text`` column.
    """
    embedding_type = shard_schema.field("embedding").type
    parts = [vectors] if isinstance(vectors, np.ndarray) else list(vectors)
    embeddings = pa.chunked_array(
        [
            pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(p).reshape(-1), type=embedding_type.value_type),
                embedding_type.list_size,
            )
            for p in parts
        ],
        type=embedding_type,
    )
    columns = [
        pa.chunked_array([pa.array(ids, type=shard_schema.field("id").type)]),
        pa.chunked_array([pa.array(np.asarray(num_tokens, dtype=np.int32))]),
        embeddings,
    ]
    if "text" in shard_schema.names:
        columns.append(pa.chunked_array([pa.array(texts, type=pa.string())]))
    return pa.Table.from_arrays(columns, schema=shard_schema)


def _sha256(path: Path) -> str:
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
        "sha256": _sha256(path),
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
    columns = [pq.read_table(directory / e["file"], columns=["embedding"]).column(0)
               for e in manifest["shards"]]  # fmt: skip
    return np.concatenate([np.stack(c.to_numpy(zero_copy_only=False)) for c in columns if len(c)])


# ---- verify -------------------------------------------------------------------------------


@dataclass
class Verdict:
    """What :func:`verify` found.

    Attributes:
        rows: rows in all shards.
        shards: shard files read.
        dim: values per ``embedding`` entry (the same in every shard), or ``None``.
        problems: one line each; empty when the output is good.
    """

    rows: int = 0
    shards: int = 0
    dim: int | None = None
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
    :func:`schema`, one embedding width, no null, ids unique. With ``source`` (a
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
    ids: list = []
    first_schema = None
    for path in files:
        entry = entries.get(path.name)
        if not path.exists():
            verdict.problems.append(f"{path.name}: listed in the manifest but missing")
            continue
        if entry is not None and _sha256(path) != entry.get("sha256"):
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
        if first_schema is None:
            first_schema = plain
            verdict.dim = plain.field("embedding").type.list_size
        elif not plain.equals(first_schema):
            verdict.problems.append(
                f"{path.name}: columns {plain} differ from the first shard's {first_schema}"
            )
        if shard.column("embedding").null_count or shard.column("id").null_count:
            verdict.problems.append(f"{path.name}: null ids or embeddings")
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
    if manifest is not None and verdict.dim is not None:
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
    need = {"id", "num_tokens", "embedding"}
    missing = need - set(shard_schema.names)
    if missing:
        return f"missing columns {sorted(missing)} (has {shard_schema.names})"
    kind = shard_schema.field("embedding").type
    if not pa.types.is_fixed_size_list(kind):
        return f"embedding is {kind}, not a fixed-size list"
    if shard_schema.field("num_tokens").type != pa.int32():
        return f"num_tokens is {shard_schema.field('num_tokens').type}, not int32"
    return None


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
