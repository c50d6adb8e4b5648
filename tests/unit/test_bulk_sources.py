"""Bulk inputs: text, JSON Lines and Parquet read in chunks, ids, fingerprint, format detection."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from triton_embed.bulk.sources import Chunk, InputError, Source, detect_format


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def write_parquet(path: Path, columns: dict, row_group_size: int | None = None) -> Path:
    pq.write_table(pa.table(columns), path, row_group_size=row_group_size)
    return path


def read_all(source: Source, size: int = 1000, start: int = 0) -> tuple[list, list, list]:
    ids: list = []
    texts: list = []
    lines: list = []
    for chunk in source.chunks(size, start):
        ids += chunk.ids
        texts += chunk.texts
        lines += chunk.lines
    return ids, texts, lines


# --- text files -------------------------------------------------------------------------------


def test_text_blank_lines_skipped_ids_are_zero_based_line_numbers(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"alpha\n\nbeta\n   \ngamma delta\n\n")
    source = Source(path)
    assert source.format == "text"
    assert (source.id_type, source.has_ids) == ("int64", False)
    ids, texts, lines = read_all(source)
    assert ids == [0, 2, 4]  # the blank lines 1 and 3 keep their numbers
    assert texts == ["alpha", "beta", "gamma delta"]
    assert lines == [1, 3, 5]
    assert source.count() == 3


def test_text_crlf_line_endings_are_stripped(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"one\r\ntwo\r\n\r\nthree")
    ids, texts, _ = read_all(Source(path))
    assert ids == [0, 1, 3]
    assert texts == ["one", "two", "three"]


def test_text_bom_on_first_line_dropped(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes("\ufefffirst\nsecond \ufeff\n".encode())
    ids, texts, _ = read_all(Source(path))
    assert ids == [0, 1]
    assert texts == ["first", "second \ufeff"]  # only a BOM at the start of the file goes


def test_text_invalid_utf8_names_path_line_and_byte(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine\n\nab\xffc\n")
    source = Source(path)
    with pytest.raises(InputError) as err:
        read_all(source)
    message = str(err.value)
    assert f"{path}:3:" in message
    assert "0xff" in message
    assert "column 3" in message


def test_text_invalid_utf8_after_bom_names_the_bad_byte(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"\xef\xbb\xbfab\xffc\n")
    with pytest.raises(InputError) as err:
        read_all(Source(path))
    assert f"{path}:1:" in str(err.value)
    assert "0xff" in str(err.value)


# --- JSON Lines -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, field_and_type, read",
    [
        (
            '{"id": 10, "text": "a"}\n{"id": 7, "text": "b", "x": 1}\n',
            ("id", "int64"),
            ([10, 7], ["a", "b"], [1, 2]),
        ),
        (
            '{"id": "doc-1", "text": "a"}\n\n{"id": "doc-2", "text": "b"}\n',
            ("id", "string"),
            (["doc-1", "doc-2"], ["a", "b"], [1, 3]),
        ),
        # without an id field the ids are the zero-based line numbers
        (
            '{"text": "a"}\n\n{"text": "b", "idx": 5}\n{"text": "c"}\n',
            (None, "int64"),
            ([0, 2, 3], ["a", "b", "c"], [1, 3, 4]),
        ),
    ],
    ids=["int-ids", "str-ids", "no-id-field"],
)
def test_jsonl_ids(tmp_path, content, field_and_type, read):
    """``field_and_type``: the id field (None: none) and the id type; ``read``: the (ids,
    texts, line numbers) of the records."""
    id_field, id_type = field_and_type
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    source = Source(path)
    assert source.format == "jsonl"
    assert (source.id_type, source.has_ids) == (id_type, id_field is not None)
    assert source.describe()["id_field"] == id_field
    assert read_all(source) == read


def test_jsonl_bom_on_first_line_dropped(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": 1, "text": "a"}\n')
    assert read_all(Source(path))[0] == [1]


@pytest.mark.parametrize(
    "records, at_open, line, fragments",
    [
        pytest.param(
            [{"id": 1, "text": "a"}, {"id": 2, "text": "b"}, {"text": "c"}],
            False,
            3,
            ["every record needs an id 'id'", "(int64)"],
            id="missing-after-the-first-had-one",
        ),
        pytest.param(
            [{"id": "x", "text": "a"}, {"id": 2, "text": "b"}],
            False,
            2,
            ["(string)", "got 2"],
            id="another-type-than-the-first",
        ),
        pytest.param([{"id": True, "text": "a"}], True, 1, ["is True"], id="bool-first"),
        pytest.param(
            [{"id": 1, "text": "a"}, {"id": False, "text": "b"}],
            False,
            2,
            ["(int64)", "got False"],
            id="bool-after-int-ids",
        ),
        pytest.param([{"id": 1.5, "text": "a"}], True, 1, ["is 1.5"], id="float-first"),
    ],
)
def test_jsonl_bad_id_refused(tmp_path, records, at_open, line, fragments):
    """A bad first id is refused when the source opens, a later one when it is read."""
    path = write_jsonl(tmp_path / "c.jsonl", records)
    if at_open:
        with pytest.raises(InputError) as err:
            Source(path)
    else:
        source = Source(path)
        with pytest.raises(InputError) as err:
            read_all(source)
    message = str(err.value)
    assert message.startswith(f"{path}:{line}: "), message
    for fragment in fragments:
        assert fragment in message, message
    if at_open:
        assert "ids must be strings or integers that fit int64" in message


@pytest.mark.parametrize("line", ['["text", "a"]', '"a"', '{"body": "a"}', '{"text": 3}'])
def test_jsonl_not_an_object_with_a_string_text(tmp_path, line):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok"}\n' + line + "\n")
    source = Source(path)
    with pytest.raises(InputError) as err:
        read_all(source)
    assert f"{path}:2:" in str(err.value)
    assert "'text'" in str(err.value)
    assert "--field" in str(err.value)


def test_jsonl_not_json_names_the_line(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "ok"}\n{"text": \n')
    with pytest.raises(InputError, match=r":2: not valid JSON"):
        read_all(Source(path))


def test_jsonl_text_field_and_id_field_other_keys(tmp_path):
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [{"body": "a", "key": "k1", "id": 9}, {"body": "b", "key": "k2", "id": 8}],
    )
    source = Source(path, text_field="body", id_field="key")
    ids, texts, _ = read_all(source)
    assert ids == ["k1", "k2"]
    assert texts == ["a", "b"]
    with pytest.raises(InputError, match="'text'"):
        Source(path)  # the default key is missing


# --- Parquet ----------------------------------------------------------------------------------


def test_parquet_int_id_column(tmp_path):
    path = write_parquet(
        tmp_path / "c.parquet",
        {"text": ["a", "b", "c"], "id": pa.array([30, 10, 20], type=pa.int32())},
    )
    source = Source(path)
    assert source.format == "parquet"
    assert (source.id_type, source.has_ids) == ("int64", True)
    ids, texts, lines = read_all(source)
    assert ids == [30, 10, 20]
    assert texts == ["a", "b", "c"]
    assert lines == [0, 1, 2]
    assert source.count() == 3


def test_parquet_string_id_column(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"id": ["x", "y"], "text": ["a", "b"]})
    source = Source(path)
    assert (source.id_type, source.has_ids) == ("string", True)
    assert read_all(source)[:2] == (["x", "y"], ["a", "b"])


def test_parquet_large_string_id_column(tmp_path):
    path = write_parquet(
        tmp_path / "c.parquet",
        {"id": pa.array(["x"], type=pa.large_string()), "text": ["a"]},
    )
    assert Source(path).id_type == "string"


def test_parquet_without_id_column_uses_row_numbers(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"text": ["a", "b", "c"], "other": [7, 8, 9]})
    source = Source(path)
    assert (source.id_type, source.has_ids) == ("int64", False)
    assert read_all(source)[0] == [0, 1, 2]


@pytest.mark.parametrize("kind", [pa.float64(), pa.bool_()])
def test_parquet_id_column_neither_integer_nor_string_refused(tmp_path, kind):
    values = [1.0, 2.0] if kind == pa.float64() else [True, False]
    path = write_parquet(
        tmp_path / "c.parquet", {"text": ["a", "b"], "id": pa.array(values, type=kind)}
    )
    with pytest.raises(InputError) as err:
        Source(path)
    assert str(path) in str(err.value)
    assert "'id'" in str(err.value)
    assert str(kind) in str(err.value)


def test_parquet_missing_text_column_names_the_columns(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"body": ["a"], "id": [1]})
    with pytest.raises(InputError) as err:
        Source(path)
    message = str(err.value)
    assert "no column 'text'" in message
    assert "columns: body, id" in message
    assert Source(path, text_field="body").has_ids


def test_parquet_null_text_refused(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"text": ["a", None, "c"], "id": [1, 2, 3]})
    with pytest.raises(InputError) as err:
        read_all(Source(path))
    assert "row 1: its text is null" in str(err.value)


def test_parquet_null_id_refused(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"text": ["a", "b", "c"], "id": [1, 2, None]})
    with pytest.raises(InputError) as err:
        read_all(Source(path))
    assert "row 2: its id is null" in str(err.value)


def test_parquet_null_after_start_names_its_row(tmp_path):
    path = write_parquet(
        tmp_path / "c.parquet",
        {"text": ["a", "b", "c", "d", None], "id": [1, 2, 3, 4, 5]},
        row_group_size=2,
    )
    with pytest.raises(InputError, match="row 4: its text is null"):
        read_all(Source(path), size=3, start=3)


def test_parquet_several_row_groups_read_from_the_middle_of_one(tmp_path):
    n = 23
    path = write_parquet(
        tmp_path / "c.parquet",
        {"text": [f"t{i}" for i in range(n)], "id": [100 + i for i in range(n)]},
        row_group_size=5,
    )
    assert pq.ParquetFile(path).metadata.num_row_groups == 5
    source = Source(path)
    chunks = list(source.chunks(4, 7))  # 7 is inside the second row group
    assert [c.start for c in chunks] == [7, 11, 15, 19]
    assert [len(c.texts) for c in chunks] == [4, 4, 4, 4]
    assert [i for c in chunks for i in c.ids] == [100 + i for i in range(7, n)]
    assert [t for c in chunks for t in c.texts] == [f"t{i}" for i in range(7, n)]
    assert [x for c in chunks for x in c.lines] == list(range(7, n))
    # a chunk size larger than a row group, from the last row of one
    chunks = list(source.chunks(8, 9))
    assert [(c.start, c.ids[0], len(c.ids)) for c in chunks] == [(9, 109, 8), (17, 117, 6)]


def test_parquet_start_past_the_end_yields_nothing(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"text": ["a", "b"]})
    assert list(Source(path).chunks(2, 2)) == []
    assert list(Source(path).chunks(2, 5)) == []


# --- chunks -----------------------------------------------------------------------------------


def make_inputs(folder: Path, n: int) -> dict[str, Source]:
    """The same n records (ids 1000 + i, texts "text i") as JSONL and Parquet, and a text file."""
    texts = [f"text {i}" for i in range(n)]
    ids = [1000 + i for i in range(n)]
    text_file = folder / "c.txt"
    text_file.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    jsonl = write_jsonl(
        folder / "c.jsonl", [{"id": i, "text": t} for i, t in zip(ids, texts, strict=True)]
    )
    parquet = write_parquet(folder / "c.parquet", {"text": texts, "id": ids}, row_group_size=3)
    return {"text": Source(text_file), "jsonl": Source(jsonl), "parquet": Source(parquet)}


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet"])
@pytest.mark.parametrize(("size", "start"), [(1, 0), (3, 0), (4, 5), (7, 2), (20, 0), (5, 11)])
def test_chunks_from_start_equal_the_full_list_sliced(tmp_path, fmt, size, start):
    n = 11
    source = make_inputs(tmp_path, n)[fmt]
    full_ids, full_texts, _ = read_all(source, size=n)
    assert len(full_ids) == n
    chunks = list(source.chunks(size, start))
    assert [i for c in chunks for i in c.ids] == full_ids[start:]
    assert [t for c in chunks for t in c.texts] == full_texts[start:]
    expected_starts = list(range(start, n, size))
    assert [c.start for c in chunks] == expected_starts
    lengths = [len(c.texts) for c in chunks]
    assert all(length == size for length in lengths[:-1])
    if chunks:
        assert lengths[-1] == min(size, n - expected_starts[-1])
    for c in chunks:
        assert isinstance(c, Chunk)
        assert len(c.ids) == len(c.texts) == len(c.lines)


@settings(max_examples=60, deadline=None)
@given(
    blanks=st.lists(st.booleans(), min_size=0, max_size=25),
    size=st.integers(1, 8),
    start=st.integers(0, 30),
)
def test_text_chunks_property(tmp_path_factory, blanks, size, start):
    folder = tmp_path_factory.mktemp("prop")
    path = folder / "c.txt"
    path.write_text("".join("\n" if blank else f"line {i}\n" for i, blank in enumerate(blanks)))
    source = Source(path)
    full = [i for i, blank in enumerate(blanks) if not blank]
    chunks = list(source.chunks(size, start))
    assert [i for c in chunks for i in c.ids] == full[start:]
    assert [t for c in chunks for t in c.texts] == [f"line {i}" for i in full[start:]]
    assert [line for c in chunks for line in c.lines] == [i + 1 for i in full[start:]]
    record = start
    for k, c in enumerate(chunks):
        assert c.start == record
        if k < len(chunks) - 1:
            assert len(c.texts) == size
        else:
            assert 1 <= len(c.texts) <= size
        record += len(c.texts)
    assert source.count() == len(full)


# --- fingerprint and count --------------------------------------------------------------------


def test_fingerprint_equal_for_the_same_bytes_in_another_file(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"id": 1, "text": "hello"}])
    b = tmp_path / "sub" / "b.jsonl"
    b.parent.mkdir()
    b.write_bytes(a.read_bytes())
    fp = Source(a).fingerprint()
    assert fp.startswith("sha256:") and len(fp) == len("sha256:") + 64
    assert fp == Source(a).fingerprint() == Source(b).fingerprint()


def test_fingerprint_differs_when_one_byte_changes(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"hello world\n")
    before = Source(path).fingerprint()
    path.write_bytes(b"hello worle\n")
    assert Source(path).fingerprint() != before


def test_fingerprint_differs_with_the_reading_settings(tmp_path):
    path = write_jsonl(
        tmp_path / "c.jsonl",
        [
            {"id": 1, "key": "a", "text": "x", "body": "y"},
            {"id": 2, "key": "b", "text": "z", "body": "w"},
        ],
    )
    base = Source(path).fingerprint()
    assert Source(path, text_field="body").fingerprint() != base
    assert Source(path, id_field="key").fingerprint() != base
    assert Source(path, id_field="absent").fingerprint() != base  # line numbers then
    assert Source(path, fmt="text").fingerprint() != base
    assert Source(path, fmt="jsonl").fingerprint() == base


def test_fingerprint_of_parquet_settings(tmp_path):
    path = write_parquet(tmp_path / "c.parquet", {"text": ["a"], "body": ["b"], "id": [1]})
    base = Source(path).fingerprint()
    assert Source(path, text_field="body").fingerprint() != base
    assert Source(path, id_field="nothing").fingerprint() != base


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet"])
def test_count_equals_records(tmp_path, fmt):
    source = make_inputs(tmp_path, 13)[fmt]
    assert source.count() == 13
    assert len(read_all(source, size=4)[0]) == 13


def test_count_skips_blank_lines_in_jsonl(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('\n{"text": "a"}\n\n\n{"text": "b"}\n  \n')
    source = Source(path)
    assert source.count() == 2
    assert read_all(source)[0] == [1, 4]


# --- format detection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("x.parquet", "parquet"),
        ("x.PQ", "parquet"),
        ("x.pq", "parquet"),
        ("x.jsonl", "jsonl"),
        ("x.NDJSON", "jsonl"),
        ("x.ndjson", "jsonl"),
        ("x.txt", "text"),
        ("x.json", "text"),
        ("x", "text"),
    ],
)
def test_detect_format_auto(name, fmt):
    assert detect_format(Path(name), "auto") == fmt


@pytest.mark.parametrize("fmt", ["text", "jsonl", "parquet"])
def test_detect_format_explicit_wins(fmt):
    assert detect_format(Path("x.parquet"), fmt) == fmt


def test_detect_format_unknown_raises():
    with pytest.raises(InputError) as err:
        detect_format(Path("x.txt"), "csv")
    assert "'csv'" in str(err.value)
    assert "auto, text, jsonl, parquet" in str(err.value)


def test_source_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        Source(tmp_path / "absent.txt")


def test_source_explicit_format_reads_a_txt_as_jsonl(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text('{"text": "a", "id": "q"}\n')
    source = Source(path, fmt="jsonl")
    assert source.format == "jsonl"
    assert read_all(source)[0] == ["q"]


def test_jsonl_int_id_outside_int64_refused_naming_the_line(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", [{"id": 1, "text": "a"}, {"id": 2**63, "text": "b"}])
    with pytest.raises(InputError) as err:
        read_all(Source(path))
    assert f"{path}:2:" in str(err.value)
