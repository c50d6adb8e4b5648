"""Sparse vectors in the bulk job (issue 24): ``triton-embed embed --model SPARSE`` and verify.

The job runs its own code end to end (CLI, :class:`~triton_embed.bulk.job.BulkJob`, the pool
embedder, the shards) against ``BulkPool``, the gateway tests' double of the upstream pool
(``SparsePool``: an embedding ensemble ``embed`` and a sparse one ``splade``, whose vectors
:func:`tests.unit.test_gateway_sparse.reference` computes). Every weight read back from the
Parquet shards must equal the double's float32 bit for bit (tolerance 0: the job copies what
the server sent), every index list exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from triton_embed import cli
from triton_embed.bulk import pool_embedder, shards
from triton_embed.bulk.kinds import SparseVectors, request_options
from triton_embed.bulk.verify import verify
from triton_embed.errors import InvalidInputError
from triton_embed.options import RequestOptions
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.catalog import ModelKind

from tests.helpers import PoolLifecycle
from tests.unit.test_gateway_app import MODEL
from tests.unit.test_gateway_sparse import SPARSE, SparsePool, reference

TEXTS = [
    "the cat sat on the mat",
    "a very long sentence here",
    "dog",
    "sparse vectors from splade models",
    "one two three",
    "hybrid retrieval needs lexical weights",
    "x",
]


class BulkPool(PoolLifecycle, SparsePool):
    """``SparsePool`` as the bulk job's ``UpstreamPool``.

    A model answers as the double's model of its kind in the catalog (``splade`` or
    ``embed``); call number ``crash_at`` (0-based) raises ``RuntimeError``, as a job killed
    mid-run stops.
    """

    def __init__(self, models=(MODEL, SPARSE), crash_at: int | None = None):
        super().__init__(models)
        self.crash_at = crash_at
        self.texts: list[str] = []

    async def infer(self, model, inputs, outputs, parameters=None):
        if self.crash_at is not None and len(self.calls) >= self.crash_at:
            raise RuntimeError("server went away")
        self.texts += [bytes(t).decode() for t in inputs["TEXT"]]
        sparse = self.catalog.resolve(model).kind is ModelKind.SPARSE
        # answer as the double's model of the catalog's kind, whatever the name
        return await super().infer("splade" if sparse else "embed", inputs, outputs, parameters)


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(t + "\n" for t in TEXTS))
    return path


def embed(monkeypatch, pool: BulkPool, corpus: Path, out: Path, *flags: str) -> int:
    """``triton-embed embed corpus -o out --model splade --shard-rows 3 FLAGS`` over ``pool``."""
    monkeypatch.setattr(pool_embedder, "UpstreamPool", lambda targets, **kwargs: pool)
    monkeypatch.setenv("TRITON_EMBED_ADMIN_KEY", "an-admin-key-for-the-tests-0123")
    argv = ["embed", str(corpus), "-o", str(out), "--url", "127.0.0.1:1", "--model", "splade",
            "--shard-rows", "3", "--no-progress", *flags]  # fmt: skip
    return cli.main(argv)


def rows_of(out: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each row's ``(indices, weights)`` of every shard, in input order."""
    vectors = shards.read_sparse(pq.read_table(out, columns=["sparse"]).column("sparse"))
    return [vectors.row(r) for r in range(len(vectors))]


def assert_rows_are(out: Path, top_k: int | None = None, threshold: float = 0.0) -> None:
    got = rows_of(out)
    assert len(got) == len(TEXTS)
    for (indices, weights), text in zip(got, TEXTS, strict=True):
        want_indices, want_weights = reference(text, top_k, threshold)
        assert indices.dtype == np.int32 and weights.dtype == np.float32
        assert indices.tolist() == want_indices
        np.testing.assert_array_equal(weights.view(np.uint32), want_weights.view(np.uint32))


# --- the CLI over the pool double ---------------------------------------------------------------


def test_a_sparse_model_writes_a_sparse_column_equal_to_its_vectors(
    monkeypatch, tmp_path, corpus, capsys
):
    pool, out = BulkPool(), tmp_path / "out"
    assert embed(monkeypatch, pool, corpus, out, "--top-k", "3", "--include-text") == 0
    assert "tokens, sparse) in" in capsys.readouterr().out

    table = pq.read_table(out)
    field = table.schema.field("sparse")
    assert field.type.equals(shards.SPARSE_TYPE) and not field.nullable
    assert str(field.type.value_type) == "struct<index: int32, value: float>"
    assert table.schema.names == ["id", "num_tokens", "sparse", "text"]
    assert table.column("id").to_pylist() == list(range(len(TEXTS)))
    assert table.column("text").to_pylist() == TEXTS
    assert table.column("num_tokens").to_pylist() == [len(t.split()) + 2 for t in TEXTS]
    assert_rows_are(out, top_k=3)
    # each request carried the sparse model's options, and a corpus is documents
    assert {json.dumps(p, sort_keys=True) for _, _, p in pool.calls} == {
        '{"input_type": "document", "top_k": 3}'
    }
    manifest = shards.read_manifest(out)
    assert (manifest["kind"], manifest["embedding_type"], manifest["complete"]) == (
        "sparse", None, True,
    )  # fmt: skip
    assert manifest["job"]["parameters"] == {"input_type": "document", "top_k": 3}
    assert [e["rows"] for e in manifest["shards"]] == [3, 3, 1]


@pytest.mark.parametrize("threshold", ["0.35", "0.1"])  # float32(0.1) > 0.1: kept, and fine
def test_threshold_reaches_the_model_and_the_manifest(monkeypatch, tmp_path, corpus, threshold):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkPool(), corpus, out, "--threshold", threshold) == 0
    assert_rows_are(out, threshold=float(threshold))
    assert shards.read_manifest(out)["job"]["parameters"]["threshold"] == float(threshold)
    assert verify(out).problems == []  # every weight is above the job's threshold


def test_verify_accepts_the_sparse_output_and_names_it(monkeypatch, tmp_path, corpus, capsys):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkPool(), corpus, out) == 0
    capsys.readouterr()
    assert cli.main(["verify", str(out), str(corpus)]) == 0
    weights = sum(len(reference(t)[0]) for t in TEXTS)
    assert capsys.readouterr().out == (
        f"{out}: OK, 7 rows in 3 shards, sparse vectors of {weights / 7:.1f} weights on "
        f"average, ids exactly those of {corpus}\n"
    )
    assert cli.main(["verify", str(out), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert (verdict["column"], verdict["sparse_weights"], verdict["embedding_width"]) == (
        "sparse", weights, None,
    )  # fmt: skip


def test_a_killed_job_resumes_and_equals_an_uninterrupted_run(
    monkeypatch, tmp_path, corpus, capsys
):
    whole = tmp_path / "whole"
    assert embed(monkeypatch, BulkPool(), corpus, whole, "--top-k", "2") == 0
    out = tmp_path / "out"
    # requests of max_batch_size 2 cut at shard ends: [0 1] [2] | [3 4] [5] | [6]; the 4th
    # call fails after shard 0 is written
    with pytest.raises(RuntimeError, match="server went away"):
        embed(monkeypatch, BulkPool(crash_at=3), corpus, out, "--top-k", "2", "--concurrency", "1")
    manifest = shards.read_manifest(out)
    assert (manifest["complete"], manifest["rows"], manifest["kind"]) == (False, 3, "sparse")
    capsys.readouterr()

    again = BulkPool()
    assert embed(monkeypatch, again, corpus, out, "--top-k", "2") == 0
    assert "resuming" in capsys.readouterr().err
    assert again.texts == TEXTS[3:]  # every record embedded once
    assert_rows_are(out, top_k=2)
    sha = [e["sha256"] for e in shards.read_manifest(out)["shards"]]
    assert sha == [e["sha256"] for e in shards.read_manifest(whole)["shards"]]  # bit for bit
    assert verify(out).problems == []


@pytest.mark.parametrize(
    "flags, changed",
    [
        (["--top-k", "5"], "--top-k: 2 then, 5 now"),
        (["--top-k", "2", "--threshold", "0.5"], "--threshold: 'not set' then, 0.5 now"),
        ([], "--top-k: 2 then, 'not set' now"),
    ],
)
def test_resuming_with_other_sparse_options_is_refused(
    monkeypatch, tmp_path, corpus, capsys, flags, changed
):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        embed(monkeypatch, BulkPool(crash_at=3), corpus, out, "--top-k", "2", "--concurrency", "1")
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    pool = BulkPool()
    assert embed(monkeypatch, pool, corpus, out, *flags) == 1
    err = capsys.readouterr().err
    assert f"holds the output of another job: {changed}." in err
    assert "--overwrite" in err
    assert pool.calls == [] and sorted(p.name for p in out.iterdir()) == before


def test_a_model_that_became_another_kind_is_refused_on_resume(
    monkeypatch, tmp_path, corpus, capsys
):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        embed(monkeypatch, BulkPool(crash_at=3), corpus, out)  # splade is sparse
    dense = MODEL.__class__(**{**MODEL.__dict__, "name": "splade", "served_model_name": None})
    capsys.readouterr()
    pool = BulkPool(models=(dense,))
    assert embed(monkeypatch, pool, corpus, out) == 1
    err = capsys.readouterr().err
    assert "holds 1 shards of sparse vectors and model 'splade' now gives embedding vectors" in err
    assert "'embedding' column" in err and "--overwrite" in err
    assert pool.calls == []


def test_a_model_of_another_kind_takes_over_a_folder_with_no_shard(monkeypatch, tmp_path, corpus):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        embed(monkeypatch, BulkPool(crash_at=0), corpus, out)  # stopped before its first shard
    assert shards.read_manifest(out)["kind"] == "sparse"
    dense = MODEL.__class__(**{**MODEL.__dict__, "name": "splade", "served_model_name": None})
    assert embed(monkeypatch, BulkPool(models=(dense,)), corpus, out) == 0
    manifest = shards.read_manifest(out)
    assert (manifest["kind"], manifest["embedding_type"]) == ("embedding", "float32")
    assert manifest["dimension"] == MODEL.dimension
    assert verify(out).problems == []


@pytest.mark.parametrize(
    "model, flags, message",
    [
        ("splade", ["--dimensions", "8"], "--dimensions apply to an embedding model's vectors;"),
        ("splade", ["--embedding-type", "ubinary", "--normalize", "false"],
         "--embedding-type and --normalize apply to an embedding model's vectors;"),
        ("splade", ["--truncation", "chunk"], "--truncation CHUNK apply to"),
        ("embed", ["--top-k", "4"], "--top-k set the weights a sparse model keeps; 'embed' is "
         "an embedding model"),
        ("embed", ["--threshold", "0"], "--threshold set the weights"),
    ],
)  # fmt: skip
def test_flags_of_the_other_kind_are_refused_before_any_request(
    monkeypatch, tmp_path, corpus, capsys, model, flags, message
):
    pool, out = BulkPool(), tmp_path / "out"
    assert embed(monkeypatch, pool, corpus, out, *flags, "--model", model) == 1
    assert message in capsys.readouterr().err
    assert pool.calls == []
    assert [p.name for p in out.iterdir() if p.suffix == ".parquet"] == []


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--top-k", "0"], "argument --top-k: top_k='0' must be a whole number >= 1"),
        (
            ["--threshold", "-1"],
            "argument --threshold: threshold='-1' must be a finite number >= 0",
        ),
        (["--threshold", "nan"], "argument --threshold: threshold='nan'"),
    ],
)
def test_sparse_flags_out_of_bounds_are_usage_errors(capsys, flags, message):
    with pytest.raises(SystemExit) as info:
        cli.main(["embed", "c.txt", "-o", "out", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_sparse_flags_need_an_output_folder(capsys, corpus, tmp_path):
    assert cli.main(["embed", str(corpus), "-o", str(tmp_path / "v.npy"), "--top-k", "3"]) == 1
    assert "--top-k needs an output folder (-o DIR), not a .npy file" in capsys.readouterr().err


def test_the_dense_job_is_unchanged_beside_it(monkeypatch, tmp_path, corpus):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkPool(), corpus, out, "--model", "embed") == 0
    manifest = shards.read_manifest(out)
    assert (manifest["kind"], manifest["embedding_type"]) == ("embedding", "float32")
    assert pq.read_table(out).schema.names == ["id", "num_tokens", "embedding"]
    assert verify(out).problems == []


# --- the column, its reading back, and verify ---------------------------------------------------


def sparse_rows(seed: int = 3, n: int = 6) -> list[tuple[np.ndarray, np.ndarray]]:
    """``n`` rows of random ascending indices (one empty row) and weights with odd bits."""
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(n):
        k = 0 if r == 2 else int(rng.integers(1, 9))
        indices = np.sort(rng.choice(30522, size=k, replace=False)).astype(np.int32)
        weights = rng.uniform(1e-3, 4, size=k).astype(np.float32)
        if k:
            weights[0] = np.float32(1e-45)  # a denormal survives the round trip
        rows.append((indices, weights))
    return rows


def test_sparse_vectors_round_trip_through_arrow_and_parquet(tmp_path):
    rows = sparse_rows()
    parts = [SparseVectors.from_rows(rows[:4]), SparseVectors.from_rows(rows[4:])]
    whole = SparseVectors.concatenate(parts)
    assert len(whole) == 6 and whole.nnz == sum(len(i) for i, _ in rows)
    assert whole.offsets.dtype == np.int32 and whole.offsets[0] == 0
    schema = shards.sparse_schema("string", include_text=False)
    ids = [f"d{i}" for i in range(6)]
    table = shards.table(schema, ids, np.arange(6), parts)  # one chunk per request
    assert table.column("sparse").num_chunks == 2
    shards.write_shard(tmp_path, 0, table, 0, "job")
    back = shards.read_sparse(pq.read_table(tmp_path / shards.shard_name(0)).column("sparse"))
    for r, (indices, weights) in enumerate(rows):
        got_indices, got_weights = back.row(r)
        np.testing.assert_array_equal(got_indices, indices)
        np.testing.assert_array_equal(got_weights.view(np.uint32), weights.view(np.uint32))
    sliced = shards.read_sparse(shards.sparse_array(whole).slice(3, 2))  # offsets not from 0
    assert [sliced.row(r)[0].tolist() for r in range(2)] == [rows[3][0].tolist(),
                                                             rows[4][0].tolist()]  # fmt: skip
    assert len(SparseVectors.concatenate([])) == 0 and SparseVectors.from_rows([]).nnz == 0


def test_from_rows_refuses_rows_of_unequal_lengths():
    with pytest.raises(ValueError, match="as many weights as indices"):
        SparseVectors.from_rows([(np.array([1, 2], np.int32), np.array([0.5], np.float32))])


def write_sparse_folder(out: Path, rows) -> None:
    """One shard of ``rows`` with no manifest (as a Ray Data output)."""
    out.mkdir()
    offsets = np.cumsum([0] + [len(i) for i, _ in rows]).astype(np.int32)
    vectors = SparseVectors(offsets, np.concatenate([i for i, _ in rows]).astype(np.int32),
                            np.concatenate([w for _, w in rows]).astype(np.float32))  # fmt: skip
    schema = shards.sparse_schema("int64", include_text=False)
    pq.write_table(shards.table(schema, list(range(len(rows))), np.ones(len(rows)), vectors),
                   out / "part-0.parquet")  # fmt: skip


def test_verify_names_indices_out_of_order_and_weights_not_above_the_threshold(tmp_path):
    good = [(np.array([1, 5], np.int32), np.array([0.5, 1.0], np.float32)),
            (np.array([2], np.int32), np.array([0.25], np.float32))]  # fmt: skip
    write_sparse_folder(tmp_path / "good", good)
    verdict = verify(tmp_path / "good")
    assert verdict.problems == []
    assert (verdict.column, verdict.weights, verdict.dim) == ("sparse", 3, None)

    bad = [
        (np.array([1, 5], np.int32), np.array([0.5, 1.0], np.float32)),
        (np.array([7, 7, 3], np.int32), np.array([0.5, 0.0, np.nan], np.float32)),
        (np.array([-1], np.int32), np.array([np.inf], np.float32)),
    ]
    write_sparse_folder(tmp_path / "bad", bad)
    assert verify(tmp_path / "bad").problems == [
        "part-0.parquet: indices not ascending (2, first in row 1)",
        "part-0.parquet: negative indices (1, first in row 2)",
        "part-0.parquet: weights not finite and > 0 (3, first in row 1)",
    ]


def test_verify_holds_weights_to_the_jobs_threshold(monkeypatch, tmp_path, corpus):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkPool(), corpus, out) == 0
    manifest = shards.read_manifest(out)
    manifest["job"]["parameters"]["threshold"] = 0.35  # as if the server ignored it
    shards.write_manifest(out, manifest)
    problems = verify(out).problems
    assert problems and all("weights not finite and > 0.35" in p for p in problems)


def test_verify_refuses_a_sparse_column_of_another_type(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    entries = pa.array([[{"index": 1, "value": 0.5}]])  # int64 and double: not the type
    pq.write_table(pa.table({"id": [0], "num_tokens": pa.array([3], pa.int32()),
                             "sparse": entries}), out / "part-0.parquet")  # fmt: skip
    assert verify(out).problems == [
        "part-0.parquet: sparse is list<element: struct<index: int64, value: double>>, not "
        "list<item: struct<index: int32, value: float>>"
    ]


def test_query_refuses_a_sparse_folder(monkeypatch, tmp_path, corpus):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkPool(), corpus, out) == 0
    with pytest.raises(ValueError, match="holds the sparse vectors of 'splade', not embeddings"):
        shards.read_vectors(out)


# --- the request options of each kind -----------------------------------------------------------


def test_request_options_of_a_sparse_model_take_the_text_options():
    options = RequestOptions(truncation="start", allow_empty=True, input_type="document")
    got = request_options(ModelKind.SPARSE, "splade", options, SparseOptions(top_k=4))
    assert got == SparseOptions(truncation="START", allow_empty=True, input_type="document",
                                top_k=4)  # fmt: skip
    assert request_options(ModelKind.EMBEDDING, "embed", options, SparseOptions()) is options
    with pytest.raises(InvalidInputError, match="'rerank' is a reranker"):
        request_options(ModelKind.RERANKER, "rerank", options, SparseOptions())


# --- Ray Data -----------------------------------------------------------------------------------


def test_the_ray_actor_writes_the_sparse_column(monkeypatch, tmp_path):
    from triton_embed.bulk.ray_data import TritonEmbedder

    pool = BulkPool()
    monkeypatch.setattr(pool_embedder, "UpstreamPool", lambda targets, **kwargs: pool)
    actor = TritonEmbedder("127.0.0.1:1", "splade", admin_key="k" * 32, top_k=2, threshold=0.25)
    batch = pa.table({"id": pa.array(range(len(TEXTS)), pa.int64()), "text": TEXTS})
    out = actor(batch)
    del actor  # its __del__ stops the pool's loop (Ray drops an actor the same way)
    assert out.schema.equals(shards.sparse_schema("int64", include_text=False))
    assert {json.dumps(p, sort_keys=True) for _, _, p in pool.calls} == {
        '{"input_type": "document", "threshold": 0.25, "top_k": 2}'
    }
    folder = tmp_path / "ray"
    folder.mkdir()
    pq.write_table(out, folder / "part-0.parquet")
    assert_rows_are(folder, top_k=2, threshold=0.25)
    assert verify(folder).problems == []


def test_the_ray_jobs_sparse_flags_reach_the_actors(monkeypatch):
    from tests.unit.test_bulk_ray_job import run_job

    made, _ = run_job(monkeypatch, ["in", "out", "--model", "splade", "--top-k", "64",
                                    "--threshold", "0.1"])  # fmt: skip
    assert (made["model"], made["top_k"], made["threshold"]) == ("splade", 64, 0.1)
    made, _ = run_job(monkeypatch, ["in", "out"])
    assert "top_k" not in made and "threshold" not in made
