"""corpus: read_texts (text, JSONL) and read_fortunes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from triton_embed.corpus import read_fortunes, read_texts, write_jsonl

# --- read_texts: text --------------------------------------------------------------------


def test_text_one_per_line_blank_lines_skipped(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text(
        "first line\n\n   \nsecond  line  \n\tthird\nlast without newline", encoding="utf-8"
    )
    assert read_texts(f) == ["first line", "second  line  ", "\tthird", "last without newline"]


def test_text_crlf_and_unicode(tmp_path):
    f = tmp_path / "c.txt"
    f.write_bytes("caf\u00e9\r\n\r\n\u65e5\u672c\u8a9e\r\n".encode())
    assert read_texts(f, "text") == ["caf\u00e9", "\u65e5\u672c\u8a9e"]


def test_text_format_reads_jsonl_looking_lines_verbatim(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "a"}\n')
    assert read_texts(f, "text") == ['{"text": "a"}']


def test_text_empty_file(tmp_path):
    f = tmp_path / "empty.txt"
    f.write_text("")
    assert read_texts(f) == []


def test_text_invalid_utf8_raises(tmp_path):
    f = tmp_path / "bad.txt"
    f.write_bytes(b"ok\n\xff\xfe\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: not valid UTF-8 \(byte 0xff at column 1\)"):
        read_texts(f)


# --- read_texts: JSONL -------------------------------------------------------------------


def test_jsonl_auto_detected_by_suffix(tmp_path):
    for suffix in (".jsonl", ".ndjson"):
        f = tmp_path / f"c{suffix}"
        f.write_text('{"text": "one", "id": 1}\n\n{"text": "two \\u00e9"}\n')
        assert read_texts(f) == ["one", "two \u00e9"]


def test_jsonl_custom_field_and_explicit_format(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text('{"body": "x", "text": "ignored"}\n{"body": ""}\n')
    assert read_texts(f, "jsonl", field="body") == ["x", ""]


def test_jsonl_keeps_embedded_newlines(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps({"text": "line 1\nline 2\n"}) + "\n")
    assert read_texts(f) == ["line 1\nline 2\n"]


def test_jsonl_invalid_json_names_line_number(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "a"}\n\n{"text": "b"}\n{not json}\n{"text": "c"}\n')
    with pytest.raises(ValueError) as info:
        read_texts(f)
    msg = str(info.value)
    assert msg.startswith(f"{f}:4: not valid JSON")


@pytest.mark.parametrize(
    "bad_line",
    ['["text", "a"]', '{"text": 5}', '{"other": "a"}', '"just a string"', '{"text": null}'],
)
def test_jsonl_wrong_shape_names_line_and_field(tmp_path, bad_line):
    f = tmp_path / "c.jsonl"
    f.write_text('{"text": "ok"}\n' + bad_line + "\n")
    with pytest.raises(ValueError) as info:
        read_texts(f)
    assert str(info.value) == f"{f}:2: expected an object with a string 'text'"


def test_jsonl_wrong_field_name_in_message(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text('\n\n{"text": "a"}\n')
    with pytest.raises(ValueError) as info:
        read_texts(f, field="content")
    assert str(info.value) == f"{f}:3: expected an object with a string 'content'"


def test_unknown_format(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("a\n")
    with pytest.raises(ValueError) as info:
        read_texts(f, "csv")
    assert str(info.value) == "unknown format 'csv'; use text, jsonl or auto"


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_texts(tmp_path / "absent.txt")


def test_write_jsonl_round_trip(tmp_path):
    f = tmp_path / "out.jsonl"
    records = [{"text": "caf\u00e9"}, {"text": "two\nlines", "n": 2}]
    write_jsonl(f, records)
    assert f.read_text(encoding="utf-8") == (
        '{"text": "caf\u00e9"}\n{"text": "two\\nlines", "n": 2}\n'
    )
    assert read_texts(f) == ["caf\u00e9", "two\nlines"]


# --- read_fortunes -----------------------------------------------------------------------


@pytest.fixture
def fortunes_dir(tmp_path: Path) -> Path:
    d = tmp_path / "fortunes"
    d.mkdir()
    (d / "zen").write_text("  Last database.  \n%\n")
    (d / "computers").write_text(
        "First fortune.\n%\n\nSecond fortune,\n  on two lines.\n\n%\n%\n   \n%\n"
        "Third, no trailing %\n"
    )
    (d / "computers.dat").write_bytes(b"\x00\x00\x00\x02binary index\xff")
    (d / "computers.u8").write_text("should be skipped\n%\n")
    (d / "art").write_text("ASCII art\n%\n")
    (d / "ascii-art").write_text("more art\n%\n")
    (d / "subdir").mkdir()
    (d / "subdir" / "inner").write_text("not read\n%\n")
    (d / "latin").write_bytes(b"caf\xe9\n%\nok\n")
    return d


def test_read_fortunes(fortunes_dir):
    assert read_fortunes(fortunes_dir) == [
        ("computers", "First fortune."),
        ("computers", "Second fortune,\n  on two lines."),
        ("computers", "Third, no trailing %"),
        ("latin", "caf\ufffd"),
        ("latin", "ok"),
        ("zen", "Last database."),
    ]


def test_read_fortunes_skip_list(fortunes_dir):
    out = read_fortunes(fortunes_dir, skip=("computers", "latin"))
    assert out == [("art", "ASCII art"), ("ascii-art", "more art"), ("zen", "Last database.")]


def test_read_fortunes_percent_line_with_spaces_is_separator(tmp_path):
    d = tmp_path / "f"
    d.mkdir()
    (d / "db").write_text("a\n  %  \nb\n100% sure\n%\n")
    assert read_fortunes(d) == [("db", "a"), ("db", "b\n100% sure")]


def test_read_fortunes_empty_folder(tmp_path):
    assert read_fortunes(tmp_path) == []


def test_read_fortunes_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError) as info:
        read_fortunes(tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)
    assert "fortunes" in str(info.value)


def test_read_texts_drops_a_leading_byte_order_mark(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufefffirst\nsecond\n".encode())
    assert read_texts(path) == ["first", "second"]
