"""Text helpers shared by the parsers: lines, matrix headers, legends, pair keys, JSON ranges."""

from __future__ import annotations

import re
from collections.abc import Iterable

from triton_embed_server.host.topology.errors import TopologyParseError

#: ANSI escape sequences (nvidia-smi underlines its matrix headers with them).
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
#: A GPU name of an nvidia-smi matrix header or row.
GPU_NAME = re.compile(r"GPU\d+")


def lines(text: str) -> list[str]:
    """Lines of ``text`` with ANSI escapes removed and any line ending."""
    return ANSI_ESCAPE.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def matrix_lines(text: str, cmd: str, expected: str, header_expected: str) -> tuple[list[str], int]:
    """The lines of an nvidia-smi GPU matrix and the index of its ``GPU0 ...`` header line.

    Args:
        text: the command's standard output.
        cmd: the command, for messages.
        expected: what the output should hold, for the empty-output message.
        header_expected: what the header should look like, for the no-header message.

    Raises:
        TopologyParseError: the output is empty, or no line starts with ``GPU0``.
    """
    if not text or not text.strip():
        raise TopologyParseError(f"{cmd}: empty output; expected {expected}")
    text_lines = lines(text)
    header_at = next((i for i, ln in enumerate(text_lines) if ln.split()[:1] == ["GPU0"]), None)
    if header_at is None:
        raise TopologyParseError(
            f"{cmd}: no header line starting with 'GPU0'; expected {header_expected}"
        )
    return text_lines, header_at


def pair(a: str, b: str) -> str:
    """The key of a device pair: ``pair("GPU0", "GPU1")`` -> ``"GPU0-GPU1"``."""
    return f"{a}-{b}"


def ranges_json(ranges: Iterable[tuple[int, int]]) -> list[list[int]]:
    """Inclusive ``(start, end)`` ranges as JSON lists: ``((0, 3),)`` -> ``[[0, 3]]``."""
    return [[a, b] for a, b in ranges]


def parse_legend_block(text_lines: list[str], start: int, pattern: str) -> dict[str, str]:
    """``KEY = meaning`` (or ``KEY: value``) lines after a ``...Legend:`` line.

    Args:
        text_lines: the output's lines (see :func:`lines`).
        start: the index of the ``...Legend:`` line.
        pattern: a regular expression with two groups, key and value, matched against each
            stripped line; the block ends at the first line that does not match, or at the
            first blank line after an entry.

    Returns:
        The entries in the order printed.
    """
    entries: dict[str, str] = {}
    for line in text_lines[start + 1 :]:
        if not line.strip():
            if entries:
                break
            continue
        match = re.fullmatch(pattern, line.strip())
        if not match:
            break
        entries[match.group(1)] = match.group(2)
    return entries
