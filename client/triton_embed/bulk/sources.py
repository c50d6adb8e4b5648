"""Corpus inputs read in chunks: text files, JSON Lines and Parquet, each record with an id.

A *record* is one text to embed and its id:

* a text file (one text per line): the id is the text's 0-based line number (blank lines
  are skipped, their numbers are not reused);
* JSON Lines: the text is the string under ``text_field``; the id is the value under
  ``id_field`` when the first record has that key (then every record must have one, of the
  same type: int or str), else the 0-based line number;
* Parquet: the text is the column ``text_field``; the id is the column ``id_field`` when the
  file has it (integer or string), else the 0-based row number.

Records are numbered from 0 in file order (the *record index*, which shards are cut by);
:meth:`Source.chunks` yields them ``size`` at a time from any record index, reading the
file once, so memory does not grow with the corpus. :meth:`Source.fingerprint` is the
SHA-256 of the file's bytes and the reading settings: a job refuses to continue an output
made from other input.

What :meth:`Source.chunks` reads is hashed as it streams (text, JSON Lines: every byte of
every line; Parquet: the bytes of the file it opened, once its rows are read) and checked
against the fingerprint and record count taken before: an input that grows, shrinks or is
rewritten while a job reads it raises :class:`InputChangedError` (a record past the count
at once, any other change at the end, before the last records are handed out), so a job
never completes under a fingerprint that is not what it embedded.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: Bytes read at a time when hashing the input.
HASH_BLOCK = 1 << 20
FORMATS = ("auto", "text", "jsonl", "parquet")
INT_ID = "int64"
BOM = b"\xef\xbb\xbf"
#: The ids an ``int64`` column holds.
INT64_RANGE = range(-(2**63), 2**63)
STRING_ID = "string"


@dataclass(frozen=True)
class Chunk:
    """Consecutive records.

    Attributes:
        start: record index of the first.
        ids: their ids (ints or strs, one type per input).
        texts: their texts.
        lines: where each is in the file: 1-based line (text, JSONL) or 0-based row (Parquet),
            for error messages.
    """

    start: int
    ids: list
    texts: list[str]
    lines: list[int]


class InputError(ValueError):
    """The input cannot be read as asked; the message names the file, line and the fix."""


class InputChangedError(InputError):
    """The input changed while it was read: what was read is not the fingerprinted file."""


def detect_format(path: Path, fmt: str) -> str:
    """The format of ``path``: ``fmt``, or for ``auto`` one from the file name.

    ``auto``: ``parquet`` for ``.parquet``/``.pq``, ``jsonl`` for ``.jsonl``/``.ndjson``,
    else ``text``.

    Raises:
        InputError: ``fmt`` is not one of :data:`FORMATS`.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    if fmt != "auto":
        return fmt
    suffix = path.suffix.lower()
    if suffix in (".parquet", ".pq"):
        return "parquet"
    return "jsonl" if suffix in (".jsonl", ".ndjson") else "text"


class Source:
    """One input file, read in chunks.

    Args:
        path: the file.
        fmt: ``auto``, ``text``, ``jsonl`` or ``parquet`` (:func:`detect_format`).
        text_field: the JSON key or Parquet column of the text.
        id_field: the JSON key or Parquet column of the id (used when present).

    Raises:
        InputError: no such file, an unknown format, a Parquet file without ``text_field``
            or with an id column that is neither integer nor string.
    """

    def __init__(self, path: str | Path, fmt: str = "auto", text_field: str = "text",
                 id_field: str = "id"):  # fmt: skip
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(f"{self.path} is a folder; name one input file")
        if not self.path.is_file():
            raise InputError(f"{self.path}: no such file")
        self.format = detect_format(self.path, fmt)
        self.text_field = text_field
        self.id_field = id_field
        # What the last fingerprint() and count() saw: chunks() checks what it reads against them.
        self._fingerprint: str | None = None
        self._count: int | None = None
        try:
            self.id_type, self.has_ids = self._id_kind()
        except (OSError, ValueError) as exc:  # pyarrow: not Parquet, unreadable
            if isinstance(exc, InputError):
                raise
            raise InputError(f"{self.path}: cannot read it as {self.format} ({exc})") from None

    # ---- what the input is --------------------------------------------------------------

    def _id_kind(self) -> tuple[str, bool]:
        """(``int64`` or ``string``, whether ids come from the input's id field)."""
        if self.format == "text":
            return INT_ID, False
        if self.format == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            schema = pq.read_schema(self.path)
            if self.text_field not in schema.names:
                raise InputError(
                    f"{self.path}: no column {self.text_field!r} (columns: "
                    f"{', '.join(schema.names)}); pass --field"
                )
            if self.id_field not in schema.names:
                return INT_ID, False
            kind = schema.field(self.id_field).type
            if pa.types.is_integer(kind) and kind != pa.uint64():
                return INT_ID, True
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                return STRING_ID, True
            raise InputError(
                f"{self.path}: id column {self.id_field!r} is {kind}; ids must be integers that "
                "fit int64 or strings (cast the column, or pass --id-field for another one)"
            )
        for kind in self._jsonl_records(first_only=True):
            return kind
        return INT_ID, False

    def describe(self) -> dict:
        """The reading settings, as the manifest records them."""
        return {
            "path": str(self.path),
            "format": self.format,
            "text_field": self.text_field,
            "id_field": self.id_field if self.has_ids else None,
            "id_type": self.id_type,
        }

    def _digest(self):
        """A SHA-256 fed with the reading settings: the file's bytes come next."""
        digest = hashlib.sha256()
        settings = {k: v for k, v in self.describe().items() if k != "path"}
        digest.update(json.dumps(settings, sort_keys=True).encode())
        return digest

    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the file's bytes and the reading settings.

        :meth:`chunks` then checks that what it reads has this fingerprint.
        """
        digest = self._digest()
        with open(self.path, "rb") as f:
            _hash_file(f, digest)
        self._fingerprint = f"sha256:{digest.hexdigest()}"
        return self._fingerprint

    def count(self) -> int:
        """Records in the input (reads it once; Parquet: from its footer).

        :meth:`chunks` then checks that it reads this many records.
        """
        if self.format == "parquet":
            import pyarrow.parquet as pq

            self._count = pq.ParquetFile(self.path).metadata.num_rows
        else:
            self._count = sum(1 for _ in self._lines())
        return self._count

    def _changed(self, what: str) -> InputChangedError:
        return InputChangedError(
            f"{self.path} changed while this job read it: {what}. The output is not complete. "
            "Keep the input unchanged while a job reads it (copy it first if another program "
            "writes to it), then run the same command again, with --overwrite if the input "
            "now differs from the one the output was started with"
        )

    def _check_count(self, index: int) -> None:
        """Raise when record ``index`` lies past the records :meth:`count` found."""
        if self._count is not None and index >= self._count:
            raise self._changed(
                f"it holds more than the {self._count} records it held when the job started "
                "(lines were appended)"
            )

    def _check_read(self, records: int, digest) -> None:
        """Raise when the ``records`` read and their bytes' ``digest`` are not the input's."""
        if self._count is not None and records != self._count:
            raise self._changed(
                f"{records} records were read, {self._count} when the job started (it was "
                "truncated or rewritten)"
            )
        read = f"sha256:{digest.hexdigest()}"
        if self._fingerprint is not None and read != self._fingerprint:
            raise self._changed(
                f"the bytes read (SHA-256 {read[7:19]}...) are not those of the file the job "
                f"started with ({self._fingerprint[7:19]}...): it was rewritten"
            )

    # ---- reading ------------------------------------------------------------------------

    def chunks(self, size: int, start: int = 0) -> Iterator[Chunk]:
        """Records from record index ``start``, ``size`` at a time (the last may be shorter).

        Raises:
            InputError: a line that is not UTF-8, not a JSON object with a string text, or
                with an id of another type than the first record's (names the line).
        """
        if self.format == "parquet":
            yield from self._parquet_chunks(size, start)
            return
        ids: list = []
        texts: list[str] = []
        lines: list[int] = []
        first = start
        digest = self._digest()
        records = (
            self._text_records(digest) if self.format == "text" else self._jsonl_records(digest)
        )
        index = -1
        for index, (record_id, text, line) in enumerate(records):
            self._check_count(index)
            if index < start:
                continue
            ids.append(record_id)
            texts.append(text)
            lines.append(line)
            if len(texts) == size:
                yield Chunk(first, ids, texts, lines)
                first += size
                ids, texts, lines = [], [], []
        self._check_read(index + 1, digest)  # before the last records are handed out
        if texts:
            yield Chunk(first, ids, texts, lines)

    def _lines(self, digest=None) -> Iterator[tuple[int, str]]:
        """``(1-based line number, line)`` of every non-blank line, decoded as UTF-8.

        Args:
            digest: a ``hashlib`` object that is fed every byte read, or ``None``.
        """
        with open(self.path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                if digest is not None:
                    digest.update(raw)
                bom = len(BOM) if lineno == 1 and raw.startswith(BOM) else 0
                try:
                    line = raw[bom:].decode("utf-8")  # a BOM on line 1 is dropped
                except UnicodeDecodeError as exc:
                    at = bom + exc.start
                    raise InputError(
                        f"{self.path}:{lineno}: not valid UTF-8 (byte 0x{raw[at]:02x} at "
                        f"column {at + 1}); convert the file to UTF-8"
                    ) from None
                line = line.rstrip("\r\n")
                if line.strip():
                    yield lineno, line

    def _text_records(self, digest=None) -> Iterator[tuple[int, str, int]]:
        for lineno, line in self._lines(digest):
            yield lineno - 1, line, lineno

    def _jsonl_records(self, digest=None, first_only: bool = False) -> Iterator:
        """``(id, text, line)`` of each record; with ``first_only``, one ``(id_type, has_ids)``."""
        id_type: str | None = None
        with_ids = False
        for lineno, line in self._lines(digest):
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise InputError(f"{self.path}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get(self.text_field), str):
                raise InputError(
                    f"{self.path}:{lineno}: expected an object with a string {self.text_field!r}"
                    " (pass --field for another key)"
                )
            if id_type is None:
                with_ids = self.id_field in record
                id_type = _json_id_type(record.get(self.id_field)) if with_ids else INT_ID
                if id_type is None:
                    raise InputError(
                        f"{self.path}:{lineno}: id {self.id_field!r} is "
                        f"{record[self.id_field]!r}; ids must be strings or integers that fit "
                        "int64"
                    )
                if first_only:
                    yield id_type, with_ids
                    return
            if not with_ids:
                yield lineno - 1, record[self.text_field], lineno
                continue
            value = record.get(self.id_field)
            if self.id_field not in record or _json_id_type(value) != id_type:
                raise InputError(
                    f"{self.path}:{lineno}: every record needs an id {self.id_field!r} of the "
                    f"first record's type ({'int64' if id_type == INT_ID else 'string'}); "
                    f"got {value!r}"
                )
            yield value, record[self.text_field], lineno

    def _parquet_chunks(self, size: int, start: int) -> Iterator[Chunk]:
        import pyarrow.parquet as pq

        columns = [self.text_field] + ([self.id_field] if self.has_ids else [])
        with open(self.path, "rb") as f:  # one open file: what is read is what is hashed
            parquet = pq.ParquetFile(f)
            self._check_count(parquet.metadata.num_rows - 1)
            yield from self._parquet_batches(parquet, size, start, columns, f)

    def _parquet_batches(self, parquet, size: int, start: int, columns: list[str], f):
        row = 0
        pending_ids: list = []
        pending_texts: list = []
        first = start
        for batch in parquet.iter_batches(batch_size=size, columns=columns):
            rows = batch.num_rows
            if row + rows <= start:
                row += rows
                continue
            skip = max(0, start - row)
            texts = batch.column(self.text_field).to_pylist()[skip:]
            ids = (
                batch.column(self.id_field).to_pylist()[skip:]
                if self.has_ids
                else list(range(row + skip, row + rows))
            )
            for offset, (text, record_id) in enumerate(zip(texts, ids, strict=True)):
                if not isinstance(text, str) or record_id is None:
                    what = "text" if not isinstance(text, str) else "id"
                    value = text if what == "text" else record_id
                    problem = "null" if value is None else f"a {type(value).__name__}, not a string"
                    raise InputError(
                        f"{self.path}: row {row + skip + offset}: its {what} is {problem}; every "
                        "row needs a string text and an id"
                    )
            pending_ids += ids
            pending_texts += texts
            row += rows
            while len(pending_texts) >= size:
                n = len(pending_texts[:size])
                yield Chunk(first, pending_ids[:size], pending_texts[:size],
                            list(range(first, first + n)))  # fmt: skip
                first += n
                pending_ids, pending_texts = pending_ids[size:], pending_texts[size:]
        digest = self._digest()
        f.seek(0)
        _hash_file(f, digest)
        self._check_read(row, digest)  # before the last records are handed out
        if pending_texts:
            yield Chunk(first, pending_ids, pending_texts,
                        list(range(first, first + len(pending_texts))))  # fmt: skip


def _hash_file(f, digest) -> None:
    """Feed ``digest`` every byte of the open binary file ``f`` from where it stands."""
    while block := f.read(HASH_BLOCK):
        digest.update(block)


def _json_id_type(value: object) -> str | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return INT_ID if value in INT64_RANGE else None
    if isinstance(value, str):
        return STRING_ID
    return None
