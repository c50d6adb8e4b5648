"""Bulk output: shard schema, atomic shard and manifest writes, verify(), BulkJob's folder."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from triton_embed.bulk import shards
from triton_embed.bulk.job import BulkJob, JobMismatchError
from triton_embed.bulk.pool_embedder import Batch
from triton_embed.bulk.settings import JobSettings, differences, job_id_of, job_identity
from triton_embed.bulk.sources import Source
from triton_embed.bulk.verify import Verdict, verify
from triton_embed.errors import EmbedClientError
from triton_embed.options import RequestOptions

DIM = 4


def vectors_for(ids: list, dim: int = DIM) -> np.ndarray:
    """Distinct float32 rows per id, with values whose bits matter (-0.0, denormals)."""
    base = np.arange(len(ids) * dim, dtype=np.float32).reshape(len(ids), dim) / 7
    base[:, 0] = -0.0
    base[-1, -1] = np.float32(1e-45)
    return base


def shard_table(ids: list, dim: int = DIM, id_type: str = "int64", include_text=False):
    schema = shards.schema(id_type, "float32", dim, include_text)
    texts = [f"text {i}" for i in ids] if include_text else None
    return shards.table(schema, ids, np.arange(len(ids)) + 5, vectors_for(ids, dim), texts)


def read_embeddings(path: Path) -> np.ndarray:
    table = pq.read_table(path)
    width = table.schema.field("embedding").type.list_size
    return table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, width)


# --- schema -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("embedding_type", "dim", "value_type", "width"),
    [
        ("float32", 384, pa.float32(), 384),
        ("float16", 384, pa.float16(), 384),
        ("ubinary", 384, pa.uint8(), 48),
        ("ubinary", 385, pa.uint8(), 49),
        ("ubinary", 1, pa.uint8(), 1),
        ("ubinary", 15, pa.uint8(), 2),
    ],
)
def test_schema_embedding_column(embedding_type, dim, value_type, width):
    schema = shards.schema("int64", embedding_type, dim, include_text=False)
    assert schema.names == ["id", "num_tokens", "embedding"]
    assert schema.field("embedding").type == pa.list_(value_type, width)
    assert schema.field("embedding").type.list_size == width
    assert shards.embedding_width(embedding_type, dim) == width
    assert schema.field("num_tokens").type == pa.int32()
    assert not any(schema.field(name).nullable for name in schema.names)


def test_schema_id_types_and_text():
    assert shards.schema("int64", "float32", 8, False).field("id").type == pa.int64()
    with_text = shards.schema("string", "float32", 8, True)
    assert with_text.field("id").type == pa.string()
    assert with_text.names == ["id", "num_tokens", "embedding", "text"]
    assert with_text.field("text").type == pa.string()


def test_shard_name():
    assert shards.shard_name(3) == "part-00003.parquet"
    assert shards.shard_name(123456) == "part-123456.parquet"


# --- table and write_shard --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("embedding_type", "dtype", "dim", "width"),
    [("float32", np.float32, 5, 5), ("float16", np.float16, 5, 5), ("ubinary", np.uint8, 12, 2)],
)
def test_write_shard_round_trip_bit_identical(tmp_path, embedding_type, dtype, dim, width):
    rng = np.random.default_rng(7)
    n = 6
    if dtype is np.uint8:
        vectors = rng.integers(0, 256, size=(n, width), dtype=np.uint8)
    else:
        vectors = rng.standard_normal((n, width)).astype(dtype)
        vectors[0, 0] = -0.0
        vectors[1, 1] = np.inf
        vectors[2, 2] = np.finfo(dtype).smallest_subnormal
    ids = ["a", "b", "c", "d", "e", "f"]
    num_tokens = np.array([1, 2, 3, 4, 5, 2**20], dtype=np.int64)
    texts = [f"t{i}" for i in range(n)]
    schema = shards.schema("string", embedding_type, dim, include_text=True)
    table = shards.table(schema, ids, num_tokens, vectors, texts)

    entry = shards.write_shard(tmp_path, 3, table, 30, "job-x")

    path = tmp_path / "part-00003.parquet"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part-00003.parquet"]  # no .tmp left
    back = pq.read_table(path)
    assert back.schema.remove_metadata().equals(schema)
    got = read_embeddings(path)
    assert got.dtype == vectors.dtype
    np.testing.assert_array_equal(
        got.view(f"u{vectors.itemsize}"), vectors.view(f"u{vectors.itemsize}")
    )
    assert back.column("id").to_pylist() == ids
    assert back.column("num_tokens").to_pylist() == [1, 2, 3, 4, 5, 2**20]
    assert back.column("text").to_pylist() == texts
    stated = json.loads(back.schema.metadata[shards.SHARD_METADATA_KEY])
    assert stated == {"shard": 3, "first_record": 30, "rows": 6, "job": "job-x"}
    assert entry == {
        "file": "part-00003.parquet",
        "rows": 6,
        "first_record": 30,
        "first_id": "a",
        "last_id": "f",
        "tokens": 1 + 2 + 3 + 4 + 5 + 2**20,
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
    }


def test_write_shard_replaces_an_existing_file(tmp_path):
    shards.write_shard(tmp_path, 0, shard_table([1, 2]), 0, "j")
    entry = shards.write_shard(tmp_path, 0, shard_table([7, 8, 9]), 0, "j")
    assert entry["rows"] == 3
    assert (entry["first_id"], entry["last_id"]) == (7, 9)
    assert pq.read_table(tmp_path / "part-00000.parquet").column("id").to_pylist() == [7, 8, 9]
    assert [p.name for p in tmp_path.iterdir()] == ["part-00000.parquet"]


def test_table_requires_matching_widths():
    schema = shards.schema("int64", "float32", 4, False)
    with pytest.raises((ValueError, pa.ArrowInvalid)):
        shards.table(schema, [1, 2], np.array([1, 1]), np.zeros((2, 3), dtype=np.float32))


# --- shard_entry_if_complete ------------------------------------------------------------------


def test_shard_entry_if_complete_recognises_its_shard(tmp_path):
    written = shards.write_shard(tmp_path, 2, shard_table([20, 21, 22]), 6, "job-a")
    assert shards.shard_entry_if_complete(tmp_path, 2, 6, "job-a") == written


def test_shard_entry_if_complete_none_for_another_job_or_first_record(tmp_path):
    shards.write_shard(tmp_path, 2, shard_table([20, 21, 22]), 6, "job-a")
    assert shards.shard_entry_if_complete(tmp_path, 2, 6, "job-b") is None
    assert shards.shard_entry_if_complete(tmp_path, 2, 9, "job-a") is None
    assert shards.shard_entry_if_complete(tmp_path, 1, 6, "job-a") is None  # missing file


def test_shard_entry_if_complete_none_for_a_truncated_file(tmp_path):
    shards.write_shard(tmp_path, 0, shard_table([1, 2, 3]), 0, "job-a")
    path = tmp_path / "part-00000.parquet"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert shards.shard_entry_if_complete(tmp_path, 0, 0, "job-a") is None
    path.write_bytes(data[:-1])
    assert shards.shard_entry_if_complete(tmp_path, 0, 0, "job-a") is None
    path.write_bytes(b"")
    assert shards.shard_entry_if_complete(tmp_path, 0, 0, "job-a") is None


def test_shard_entry_if_complete_none_without_metadata(tmp_path):
    pq.write_table(
        shard_table([1, 2]).replace_schema_metadata(None), tmp_path / "part-00000.parquet"
    )
    assert shards.shard_entry_if_complete(tmp_path, 0, 0, "job-a") is None


def test_shard_entry_if_complete_missing_folder(tmp_path):
    assert shards.shard_entry_if_complete(tmp_path / "absent", 0, 0, "job-a") is None


# --- manifest ---------------------------------------------------------------------------------


def test_manifest_round_trip(tmp_path):
    manifest = {"format": shards.FORMAT, "shards": [{"file": "part-00000.parquet"}], "név": "ü"}
    shards.write_manifest(tmp_path, manifest)
    assert shards.read_manifest(tmp_path) == manifest
    assert [p.name for p in tmp_path.iterdir()] == ["_manifest.json"]
    assert "név" in (tmp_path / "_manifest.json").read_text(encoding="utf-8")


def test_read_manifest_none_without_one(tmp_path):
    assert shards.read_manifest(tmp_path) is None


@pytest.mark.parametrize(
    "content",
    [{"format": "triton-embed-shards/2"}, {"shards": []}, ["triton-embed-shards/1"], "not json{"],
)
def test_read_manifest_of_another_format_raises(tmp_path, content):
    text = content if isinstance(content, str) else json.dumps(content)
    (tmp_path / "_manifest.json").write_text(text)
    with pytest.raises(ValueError) as err:
        shards.read_manifest(tmp_path)
    assert str(tmp_path / "_manifest.json") in str(err.value)


# --- verify -----------------------------------------------------------------------------------

SETTINGS = JobSettings(model="embed", shard_rows=3)


def text_source(folder: Path, n: int = 6, name: str = "input.txt") -> Source:
    path = folder / name
    path.write_text("".join(f"line {i}\n" for i in range(n)))
    return Source(path)


def good_output(tmp_path: Path, source: Source | None = None) -> tuple[Path, dict]:
    """Two shards of 3 rows (ids 0..5) and a complete manifest made for ``source``."""
    source = source or text_source(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    identity = job_identity(source, SETTINGS)
    job_id = job_id_of(identity)
    entries = [
        shards.write_shard(out, 0, shard_table([0, 1, 2]), 0, job_id),
        shards.write_shard(out, 1, shard_table([3, 4, 5]), 3, job_id),
    ]
    manifest = {
        "format": shards.FORMAT,
        "job": identity,
        "job_id": job_id,
        "model": "embed",
        "embedding_type": "float32",
        "dimension": DIM,
        "shard_rows": 3,
        "shards": entries,
        "rows": 6,
        "tokens": 0,
        "complete": True,
    }
    shards.write_manifest(out, manifest)
    return out, manifest


def only_problem(verdict: Verdict, *parts: str) -> str:
    """The one problem of ``verdict`` that holds every part."""
    matching = [p for p in verdict.problems if all(part in p for part in parts)]
    assert len(matching) == 1, verdict.problems
    return matching[0]


def test_verify_good_output(tmp_path):
    source = text_source(tmp_path)
    out, _ = good_output(tmp_path, source)
    verdict = verify(out)
    assert verdict.problems == []
    assert verdict.ok
    assert (verdict.rows, verdict.shards, verdict.dim) == (6, 2, DIM)
    with_input = verify(out, source)
    assert with_input.problems == []


def test_verify_reads_with_pyarrow_dataset_skipping_the_manifest(tmp_path):
    out, _ = good_output(tmp_path)
    assert sorted(pq.read_table(out).column("id").to_pylist()) == [0, 1, 2, 3, 4, 5]


def test_verify_shard_bytes_changed(tmp_path):
    out, _ = good_output(tmp_path)
    schema = shards.schema("int64", "float32", DIM, False)
    vectors = vectors_for([3, 4, 5]) + 1  # same ids and columns, other embeddings
    changed = shards.table(schema, [3, 4, 5], np.array([5, 6, 7]), vectors)
    pq.write_table(changed, out / "part-00001.parquet")
    verdict = verify(out)
    assert verdict.problems == ["part-00001.parquet: SHA-256 differs from the manifest's (changed)"]


def test_verify_shard_one_byte_flipped(tmp_path):
    out, _ = good_output(tmp_path)
    path = out / "part-00000.parquet"
    data = bytearray(path.read_bytes())
    data[4] ^= 0x01  # right after the "PAR1" magic: the first page header
    path.write_bytes(bytes(data))
    verdict = verify(out)
    assert not verdict.ok
    only_problem(verdict, "part-00000.parquet: SHA-256 differs")


def test_verify_shard_deleted(tmp_path):
    out, _ = good_output(tmp_path)
    (out / "part-00000.parquet").unlink()
    verdict = verify(out)
    only_problem(verdict, "part-00000.parquet: listed in the manifest but missing")
    only_problem(verdict, "the shards hold 3 rows, the manifest says 6")
    assert verdict.shards == 1


def second_shard_wider(out: Path, manifest: dict) -> dict:
    """Rewrite the second shard with embeddings one value wider; the manifest that lists it."""
    entry = shards.write_shard(out, 1, shard_table([3, 4, 5], dim=DIM + 1), 3, manifest["job_id"])
    return dict(manifest, shards=[manifest["shards"][0], entry])


def second_entry_says_4_rows(out: Path, manifest: dict) -> dict:
    entries = [manifest["shards"][0], dict(manifest["shards"][1], rows=4, last_id=6)]
    return dict(manifest, shards=entries)


@pytest.mark.parametrize(
    "edit, parts",
    [
        pytest.param(
            lambda out, manifest: dict(manifest, complete=False),
            ("the job is not complete", "2 shards written"),
            id="manifest-not-complete",
        ),
        pytest.param(
            second_entry_says_4_rows,
            ("part-00001.parquet: rows or id range differ", "3 rows, ids 3..5"),
            id="entry-rows-or-ids-mismatch",
        ),
        pytest.param(
            second_shard_wider,
            ("part-00001.parquet: columns", "differ from the first shard's"),
            id="different-embedding-widths",
        ),
    ],
)
def test_verify_one_problem(tmp_path, edit, parts):
    """``edit(out, manifest)`` breaks the good output and gives the manifest written."""
    out, manifest = good_output(tmp_path)
    shards.write_manifest(out, edit(out, manifest))
    verdict = verify(out)
    assert len(verdict.problems) == 1
    only_problem(verdict, *parts)
    assert verdict.dim == DIM


def test_verify_duplicate_ids_across_shards(tmp_path):
    out, manifest = good_output(tmp_path)
    entry = shards.write_shard(out, 1, shard_table([2, 3, 4]), 3, manifest["job_id"])
    shards.write_manifest(out, dict(manifest, shards=[manifest["shards"][0], entry]))
    verdict = verify(out)
    assert verdict.problems == ["1 duplicate ids, e.g. [2]"]


def test_verify_rows_mismatch_in_the_manifest(tmp_path):
    out, manifest = good_output(tmp_path)
    shards.write_manifest(out, dict(manifest, rows=7))
    assert verify(out).problems == ["the shards hold 6 rows, the manifest says 7"]


def test_verify_wrong_dimension_in_the_manifest(tmp_path):
    out, manifest = good_output(tmp_path)
    shards.write_manifest(out, dict(manifest, dimension=8))
    assert verify(out).problems == ["embeddings have 4 values, the manifest 8"]


def test_verify_ubinary_dimension_is_in_bits(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    schema = shards.schema("int64", "ubinary", 12, False)
    table = shards.table(schema, [0, 1], np.array([1, 1]), np.zeros((2, 2), dtype=np.uint8))
    entry = shards.write_shard(out, 0, table, 0, "j")
    manifest = {"format": shards.FORMAT, "embedding_type": "ubinary", "dimension": 12,
                "shards": [entry], "rows": 2, "complete": True}  # fmt: skip
    shards.write_manifest(out, manifest)
    verdict = verify(out)
    assert verdict.problems == []
    assert verdict.dim == 2
    shards.write_manifest(out, dict(manifest, dimension=17))
    assert verify(out).problems == ["embeddings have 2 values, the manifest 3"]


def test_verify_empty_folder_and_not_a_folder(tmp_path):
    assert verify(tmp_path).problems == [f"{tmp_path}: no shards"]
    with pytest.raises(ValueError, match="no such folder"):
        verify(tmp_path / "absent")


def ray_output(tmp_path: Path, ids_per_file: list[list]) -> Path:
    """A folder of Parquet files with Ray-style names, one in a subfolder, no manifest."""
    out = tmp_path / "ray"
    (out / "sub").mkdir(parents=True)
    for k, ids in enumerate(ids_per_file):
        folder = out / "sub" if k % 2 else out
        pq.write_table(shard_table(ids), folder / f"{k}_00000{k}_000000.parquet")
    return out


def test_verify_without_manifest_unique_ids(tmp_path):
    out = ray_output(tmp_path, [[0, 1, 2], [3, 4], [5]])
    verdict = verify(out)
    assert verdict.problems == []
    assert (verdict.rows, verdict.shards, verdict.dim) == (6, 3, DIM)
    assert verify(out, text_source(tmp_path, 6)).problems == []


def test_verify_without_manifest_ids_out_of_order_are_fine(tmp_path):
    out = ray_output(tmp_path, [[5, 3, 1], [0, 2, 4]])
    assert verify(out, text_source(tmp_path, 6)).problems == []


def test_verify_without_manifest_duplicate_ids(tmp_path):
    out = ray_output(tmp_path, [[0, 1, 2], [2, 1]])
    assert verify(out).problems == ["2 duplicate ids, e.g. [1, 2]"]


def test_verify_without_manifest_input_ids_missing(tmp_path):
    out = ray_output(tmp_path, [[0, 1, 2], [3, 4]])
    verdict = verify(out, text_source(tmp_path, 8))
    assert sorted(verdict.problems) == sorted(
        ["5 rows for 8 input records", "3 input ids missing, e.g. [5, 6, 7]"]
    )


def test_verify_without_manifest_ids_not_in_the_input(tmp_path):
    out = ray_output(tmp_path, [[0, 1, 2], [3, 4, 5], [40, 41]])
    verdict = verify(out, text_source(tmp_path, 6))
    assert sorted(verdict.problems) == sorted(
        ["8 rows for 6 input records", "2 ids not in the input, e.g. [40, 41]"]
    )


def test_verify_without_manifest_ignores_hidden_temporaries(tmp_path):
    out = ray_output(tmp_path, [[0, 1, 2]])
    (out / ".part-00001.parquet").write_bytes(b"partial")
    assert verify(out).problems == []


def test_verify_without_manifest_unreadable_file(tmp_path):
    out = ray_output(tmp_path, [[0, 1, 2]])
    (out / "broken.parquet").write_bytes(b"PAR1 not really")
    verdict = verify(out)
    only_problem(verdict, "broken.parquet: not a readable Parquet file")


def test_verify_with_manifest_and_source_ids_in_input_order(tmp_path):
    source = text_source(tmp_path)
    out, _ = good_output(tmp_path, source)
    assert verify(out, source).problems == []


def test_verify_with_manifest_ids_out_of_input_order(tmp_path):
    source = text_source(tmp_path)
    out, manifest = good_output(tmp_path, source)
    entry = shards.write_shard(out, 1, shard_table([3, 5, 4]), 3, manifest["job_id"])
    shards.write_manifest(out, dict(manifest, shards=[manifest["shards"][0], entry]))
    verdict = verify(out, source)
    assert verdict.problems == [
        "ids are not the input's in input order (first difference at row 4: 5 vs 4)"
    ]


def test_verify_with_manifest_and_fewer_rows_than_input(tmp_path):
    source = text_source(tmp_path, 7)
    out, _ = good_output(tmp_path, source)
    verdict = verify(out, source)
    assert verdict.problems == [
        "6 rows for 7 input records",
        "ids are not the input's in input order",
    ]


def test_verify_with_manifest_and_a_changed_source(tmp_path):
    source = text_source(tmp_path)
    out, _ = good_output(tmp_path, source)
    source.path.write_text("".join(f"line {i}!\n" for i in range(6)))  # same ids, other texts
    verdict = verify(out, Source(source.path))
    assert len(verdict.problems) == 1
    only_problem(verdict, str(source.path), "fingerprint differs")


def test_verify_with_manifest_and_source_read_otherwise(tmp_path):
    path = tmp_path / "input.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(6)))
    out, _ = good_output(tmp_path, Source(path))
    assert verify(out, Source(path)).problems == []
    verdict = verify(out, Source(path, fmt="text"))
    only_problem(verdict, "fingerprint differs")


# --- job identity -----------------------------------------------------------------------------


def test_job_identity_fields(tmp_path):
    source = text_source(tmp_path)
    settings = JobSettings(
        model="m", options=RequestOptions(dimensions=64, truncation="end"), shard_rows=9,
        include_text=True,
    )  # fmt: skip
    identity = job_identity(source, settings)
    assert identity["model"] == "m"
    assert identity["parameters"] == {"truncation": "END", "dimensions": 64}
    assert list(identity["parameters"]) == sorted(identity["parameters"])
    assert identity["shard_rows"] == 9
    assert identity["include_text"] is True
    assert identity["input"]["fingerprint"] == source.fingerprint()
    assert identity["input"]["path"] == str(source.path)
    assert identity["input"]["format"] == "text"


def test_job_id_ignores_the_input_path(tmp_path):
    a = text_source(tmp_path, name="a.txt")
    b = text_source(tmp_path, name="b.txt")
    assert job_id_of(job_identity(a, SETTINGS)) == job_id_of(job_identity(b, SETTINGS))
    other = JobSettings(model="other", shard_rows=3)
    assert job_id_of(job_identity(a, SETTINGS)) != job_id_of(job_identity(a, other))
    assert len(job_id_of(job_identity(a, SETTINGS))) == 16


def test_differences_name_each_change(tmp_path):
    source = text_source(tmp_path)
    old = job_identity(source, SETTINGS)
    assert differences(old, old) == []
    new = job_identity(
        source,
        JobSettings(model="big", options=RequestOptions(dimensions=8), shard_rows=5,
                    include_text=True),
    )  # fmt: skip
    assert differences(old, new) == [
        "--model: 'embed' then, 'big' now",
        "--shard-rows: 3 then, 5 now",
        "--include-text: False then, True now",
        "--dimensions: 'not set' then, 8 now",
    ]
    moved = json.loads(json.dumps(old))
    moved["input"]["path"] = "/elsewhere/input.txt"
    assert differences(moved, old) == []
    assert differences({}, old)[0] == "the input changed (its SHA-256 or how it is read)"


# --- BulkJob's output folder ------------------------------------------------------------------


def listing(folder: Path) -> list[str]:
    """The folder's files but the job's lock file."""
    return sorted(p.name for p in folder.iterdir() if p.name != ".triton-embed.lock")


def make_job(source: Source, out: Path, settings: JobSettings = SETTINGS, **kwargs) -> BulkJob:
    job = BulkJob(source, out, [], settings, progress=False, **kwargs)
    job.close()  # release the folder's lock: these tests open the folder again
    return job


def test_bulkjob_creates_an_incomplete_manifest(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "a" / "out"
    job = make_job(source, out)
    manifest = shards.read_manifest(out)
    assert manifest["complete"] is False
    assert manifest["shards"] == []
    assert manifest["rows"] == 0
    assert manifest["job_id"] == job.job_id
    assert manifest["job"] == job_identity(source, SETTINGS)
    assert manifest["embedding_type"] == "float32"
    assert manifest["dimension"] is None
    assert manifest["shard_rows"] == 3
    assert listing(out) == ["_manifest.json"]
    assert job.resumed_rows == 0


def test_bulkjob_manifest_embedding_type_from_options(tmp_path):
    settings = JobSettings(options=RequestOptions(embedding_type="ubinary"), shard_rows=3)
    make_job(text_source(tmp_path), tmp_path / "out", settings)
    assert shards.read_manifest(tmp_path / "out")["embedding_type"] == "ubinary"


def test_bulkjob_resumes_with_the_same_settings(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    settings = JobSettings(
        options=RequestOptions(truncation="end", dimensions=32, allow_empty=True,
                               input_type="document", embedding_type="float16"),
        shard_rows=3,
    )  # fmt: skip
    first = make_job(source, out, settings)
    again = make_job(Source(source.path), out, settings)
    assert again.job_id == first.job_id
    assert shards.read_manifest(out)["complete"] is False


def test_bulkjob_resumes_after_the_input_moved(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    job = make_job(source, out)
    moved = tmp_path / "moved.txt"
    source.path.rename(moved)
    again = make_job(Source(moved), out)
    assert again.job_id == job.job_id
    assert shards.read_manifest(out)["job"]["input"]["path"] == str(moved)


def test_bulkjob_another_model_refused(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    make_job(source, out)
    (out / "part-00000.parquet").write_bytes(b"written")  # something to lose: refused
    with pytest.raises(JobMismatchError) as err:
        make_job(source, out, JobSettings(model="other", shard_rows=3))
    message = str(err.value)
    assert str(out) in message
    assert "--model: 'embed' then, 'other' now" in message
    assert "--overwrite" in message
    assert "input changed" not in message


def test_bulkjob_changed_input_refused(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    make_job(source, out)
    (out / "part-00000.parquet").write_bytes(b"written")  # something to lose: refused
    source.path.write_text("".join(f"line {i}\n" for i in range(7)))
    with pytest.raises(JobMismatchError) as err:
        make_job(Source(source.path), out)
    assert "the input changed (its SHA-256 or how it is read)" in str(err.value)
    assert "the model" not in str(err.value)


def test_bulkjob_changed_shard_rows_refused(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    make_job(source, out)
    (out / "part-00000.parquet").write_bytes(b"written")  # something to lose: refused
    with pytest.raises(JobMismatchError, match="--shard-rows: 3 then, 4 now"):
        make_job(source, out, JobSettings(shard_rows=4))


def test_bulkjob_overwrite_starts_fresh(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    job = make_job(source, out)
    shards.write_shard(out, 0, shard_table([0, 1, 2]), 0, job.job_id)
    shards.write_shard(out, 1, shard_table([3, 4, 5]), 3, job.job_id)
    (out / ".part-00002.parquet.tmp").write_bytes(b"x")
    other = JobSettings(model="other", shard_rows=3)
    fresh = make_job(source, out, other, overwrite=True)
    assert listing(out) == ["_manifest.json"]
    manifest = shards.read_manifest(out)
    assert manifest["shards"] == []
    assert manifest["rows"] == 0
    assert manifest["model"] == "other"
    assert manifest["job_id"] == fresh.job_id != job.job_id


def test_bulkjob_overwrite_of_shards_without_manifest(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000.parquet").write_bytes(b"old")
    (out / "notes.txt").write_text("kept")
    make_job(text_source(tmp_path), out, overwrite=True)
    assert listing(out) == ["_manifest.json", "notes.txt"]


def test_bulkjob_shard_files_without_manifest_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "part-00000.parquet").write_bytes(b"old")
    with pytest.raises(EmbedClientError) as err:
        make_job(text_source(tmp_path), out)
    assert not isinstance(err.value, JobMismatchError)
    assert "holds shard files (part-NNNNN.parquet) but no _manifest.json" in str(err.value)
    assert (out / "part-00000.parquet").read_bytes() == b"old"


def test_bulkjob_output_that_is_a_file_refused(tmp_path):
    out = tmp_path / "out.parquet"
    out.write_bytes(b"x")
    with pytest.raises(EmbedClientError, match="is a file"):
        make_job(text_source(tmp_path), out)
    assert out.read_bytes() == b"x"


def test_bulkjob_unreadable_manifest_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "_manifest.json").write_text('{"format": "other"}')
    with pytest.raises(EmbedClientError, match="name another -o folder"):
        make_job(text_source(tmp_path), out)


def test_bulkjob_adopts_a_shard_missing_from_the_manifest(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    job = make_job(source, out)
    written = shards.write_shard(out, 0, shard_table([0, 1, 2]), 0, job.job_id)
    (out / ".part-00009.parquet.tmp").write_bytes(b"partial")
    shards.write_shard(out, 2, shard_table([6, 7]), 6, job.job_id)  # later than the next shard
    (out / "part-00005.parquet").write_bytes(b"junk")

    again = make_job(source, out)

    manifest = shards.read_manifest(out)
    assert manifest["shards"] == [written]
    assert manifest["rows"] == 3
    assert again.manifest["rows"] == 3
    assert again.resumed_rows == 3
    assert again.resumed_rows_at_start == 3
    assert listing(out) == ["_manifest.json", "part-00000.parquet"]


def test_bulkjob_adopts_only_the_next_shard(tmp_path):
    source = text_source(tmp_path, 9)
    out = tmp_path / "out"
    job = make_job(source, out)
    first = shards.write_shard(out, 0, shard_table([0, 1, 2]), 0, job.job_id)
    manifest = shards.read_manifest(out)
    shards.write_manifest(out, dict(manifest, shards=[first], rows=3))
    second = shards.write_shard(out, 1, shard_table([3, 4, 5]), 3, job.job_id)

    make_job(source, out)

    manifest = shards.read_manifest(out)
    assert manifest["shards"] == [first, second]
    assert manifest["rows"] == 6
    assert listing(out) == [
        "_manifest.json", "part-00000.parquet", "part-00001.parquet",
    ]  # fmt: skip


def test_bulkjob_does_not_adopt_another_jobs_shard(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    make_job(source, out)
    shards.write_shard(out, 0, shard_table([0, 1, 2]), 0, "0123456789abcdef")
    again = make_job(source, out)
    assert again.manifest["shards"] == []
    assert again.manifest["rows"] == 0
    assert listing(out) == ["_manifest.json"]


def test_bulkjob_does_not_adopt_a_shard_with_another_first_record(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    job = make_job(source, out)
    shards.write_shard(out, 0, shard_table([1, 2, 3]), 1, job.job_id)
    assert make_job(source, out).manifest["shards"] == []
    assert not (out / "part-00000.parquet").exists()


# --- the pipeline with a fake embedder (no server) --------------------------------------------


class FakeEmbedder:
    """Embeds text "line i" as [i, i + 0.5, -i, 1]; fails after ``fail_after`` calls."""

    def __init__(self, fail_after: int | None = None):
        self.calls = 0
        self.texts: list[str] = []
        self.fail_after = fail_after

    async def embed(self, texts: list[str]) -> Batch:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("server went away")
        self.calls += 1
        self.texts += texts
        values = np.array([float(t.split()[1]) for t in texts], dtype=np.float32)
        vectors = np.stack([values, values + 0.5, -values, np.ones_like(values)], axis=1)
        return Batch(vectors, np.full(len(texts), 3, dtype=np.int32), 0.001, 0)


def run_pipeline(job: BulkJob, embedder: FakeEmbedder, size: int) -> None:
    asyncio.run(job._pipeline(embedder, size, lambda batch, count: None))


def test_requests_are_cut_at_shard_boundaries(tmp_path):
    job = make_job(text_source(tmp_path, 8), tmp_path / "out")
    got = [(index, chunk.start, chunk.ids, chunk.lines) for index, chunk in job._requests(4)]
    assert got == [
        (0, 0, [0, 1, 2], [1, 2, 3]),
        (1, 3, [3], [4]),
        (1, 4, [4, 5], [5, 6]),
        (2, 6, [6, 7], [7, 8]),
    ]


def test_pipeline_writes_a_verified_output(tmp_path):
    source = text_source(tmp_path, 8)
    out = tmp_path / "out"
    job = make_job(source, out)
    embedder = FakeEmbedder()
    run_pipeline(job, embedder, size=2)
    manifest = shards.read_manifest(out)
    assert manifest["complete"] is True
    assert [e["file"] for e in manifest["shards"]] == [shards.shard_name(k) for k in range(3)]
    assert [e["rows"] for e in manifest["shards"]] == [3, 3, 2]
    assert [e["first_record"] for e in manifest["shards"]] == [0, 3, 6]
    assert (manifest["rows"], manifest["tokens"], manifest["dimension"]) == (8, 24, 4)
    assert verify(out, source).problems == []
    assert embedder.texts == [f"line {i}" for i in range(8)]
    np.testing.assert_array_equal(read_embeddings(out / "part-00002.parquet")[:, 0], [6, 7])


def test_pipeline_resumes_after_a_crash_embedding_each_record_once(tmp_path):
    source = text_source(tmp_path, 8)
    out = tmp_path / "out"
    # requests [0, 1] [2] | [3, 4] [5] | [6, 7]: the 4th fails; shard 0 was written when the
    # 3rd (the first of shard 1) was taken
    crashing = FakeEmbedder(fail_after=3)
    with pytest.raises(RuntimeError, match="server went away"):
        run_pipeline(make_job(source, out), crashing, size=2)
    manifest = shards.read_manifest(out)
    assert (manifest["complete"], manifest["rows"], len(manifest["shards"])) == (False, 3, 1)

    again = make_job(Source(source.path), out)
    assert again.resumed_rows == 3
    embedder = FakeEmbedder()
    run_pipeline(again, embedder, size=2)
    assert embedder.texts == [f"line {i}" for i in range(3, 8)]
    assert verify(out, source).problems == []
    ids = pq.read_table(out).column("id").to_pylist()
    assert sorted(ids) == list(range(8))


def test_bulkjob_takes_over_a_folder_where_nothing_was_written(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    make_job(source, out)  # stopped before its first shard (e.g. refused options)
    job = make_job(source, out, JobSettings(model="other", shard_rows=3))
    assert shards.read_manifest(out)["job"]["model"] == "other" == job.settings.model


def test_bulkjob_keeps_files_that_are_not_its_shards(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    for name in ("part-notes.txt", ".part-hidden-config", "part-of-speech.csv", "part-1.parquet"):
        (out / name).write_text("mine")
    make_job(source, out)
    make_job(source, out, overwrite=True)
    assert listing(out) == [".part-hidden-config", "_manifest.json", "part-1.parquet",
                            "part-notes.txt", "part-of-speech.csv"]  # fmt: skip


def test_bulkjob_refuses_a_folder_another_job_is_writing(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    first = BulkJob(source, out, [], SETTINGS, progress=False)  # holds the lock
    try:
        with pytest.raises(EmbedClientError, match="is being written by another"):
            BulkJob(source, out, [], SETTINGS, progress=False)
    finally:
        first.close()
    make_job(source, out)  # free again


def test_bulkjob_refuses_an_empty_input(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    with pytest.raises(EmbedClientError, match="holds no texts"):
        make_job(Source(empty), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_explicit_default_embedding_type_is_the_same_job(tmp_path):
    source = text_source(tmp_path)
    out = tmp_path / "out"
    make_job(source, out)
    (out / "part-00000.parquet").write_bytes(b"written")
    explicit = JobSettings(options=RequestOptions(embedding_type="float32"), shard_rows=3)
    make_job(source, out, explicit)  # not refused
