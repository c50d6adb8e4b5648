"""Reading text corpora: one text per line, JSON Lines, and Debian's fortune files."""

from __future__ import annotations

import json
from pathlib import Path

FORTUNES_DIR = Path("/usr/share/games/fortunes")


def read_texts(path: str | Path, fmt: str = "auto", field: str = "text") -> list[str]:
    """Read texts from a file (:func:`read_texts_and_lines` without the line numbers).

    Raises:
        ValueError: as :func:`read_texts_and_lines`.
    """
    return read_texts_and_lines(path, fmt, field)[0]


def read_texts_and_lines(
    path: str | Path, fmt: str = "auto", field: str = "text"
) -> tuple[list[str], list[int]]:
    """Read texts from a file, with the line each text is on.

    Args:
        path: the file.
        fmt: ``text`` (one text per line; blank lines skipped), ``jsonl`` (one JSON object
            per line, the text under ``field``; blank lines skipped), or ``auto``
            (``jsonl`` for ``.jsonl``/``.ndjson`` files, else ``text``).
        field: the JSON key holding the text.

    Returns:
        The texts in file order, and the line number (from 1) of each: blank lines are
        skipped, so text ``i`` is on line ``lines[i]``, which can be further down than ``i + 1``.

    Raises:
        ValueError: unknown ``fmt``, a line that is not UTF-8, or a JSONL line that is not
            an object with a string under ``field`` (names the line number).
    """
    path = Path(path)
    if fmt == "auto":
        fmt = "jsonl" if path.suffix in (".jsonl", ".ndjson") else "text"
    if fmt not in ("text", "jsonl"):
        raise ValueError(f"unknown format {fmt!r}; use text, jsonl or auto")
    texts: list[str] = []
    lines: list[int] = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")  # -sig: drop a BOM
            except UnicodeDecodeError as exc:
                raise ValueError(
                    f"{path}:{lineno}: not valid UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                    f"{exc.start + 1}); convert the file to UTF-8"
                ) from None
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if fmt == "text":
                texts.append(line)
                lines.append(lineno)
                continue
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from None
            if not isinstance(record, dict) or not isinstance(record.get(field), str):
                raise ValueError(f"{path}:{lineno}: expected an object with a string {field!r}")
            texts.append(record[field])
            lines.append(lineno)
    return texts, lines


def read_fortunes(
    directory: str | Path = FORTUNES_DIR, skip: tuple[str, ...] = ("ascii-art", "art")
) -> list[tuple[str, str]]:
    """Read Debian's ``fortunes`` data files (texts separated by lines holding ``%``).

    Args:
        directory: the fortunes folder (package ``fortunes``: ``/usr/share/games/fortunes``).
        skip: database names to leave out (ASCII art is not prose).

    Returns:
        ``(database, text)`` pairs, databases in name order, texts in file order, each text
        stripped of surrounding blank space; empty texts dropped.

    Raises:
        FileNotFoundError: the folder does not exist (install Debian's ``fortunes`` package).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} not found; install Debian's 'fortunes' package")
    out: list[tuple[str, str]] = []
    for path in sorted(directory.iterdir()):
        if path.suffix in (".dat", ".u8") or not path.is_file() or path.name in skip:
            continue
        chunk: list[str] = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.strip() == "%":
                text = "\n".join(chunk).strip()
                if text:
                    out.append((path.name, text))
                chunk = []
            else:
                chunk.append(line)
        text = "\n".join(chunk).strip()
        if text:
            out.append((path.name, text))
    return out


def write_jsonl(path: str | Path, records: list[dict]) -> None:
    """Write records as JSON Lines (UTF-8, one object per line, non-ASCII kept as is).

    Args:
        path: the file to write (replaced if it exists).
        records: JSON-serializable objects, written in order.
    """
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
