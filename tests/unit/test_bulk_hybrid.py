"""Hybrid (BGE-M3) models in the bulk job (issue 24): ``--output-kind dense|sparse|tokens``.

The kind selection (:func:`~triton_embed.bulk.kinds.model_view`,
:func:`~triton_embed.bulk.kinds.request_options` with a head) on its own, then the job end
to end (CLI, :class:`~triton_embed.bulk.job.BulkJob`, the pool embedder, the shards, verify)
against ``HybridPool``, the gateway tests' double of a hybrid ensemble ``m3``
(:mod:`tests.unit.test_gateway_hybrid`): each head's shards must hold exactly the double's
values (tolerance 0: the job copies what the server sent), and each request must ask for
that head alone (``outputs``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from triton_embed import cli
from triton_embed.bulk import pool_embedder, shards
from triton_embed.bulk.kinds import OutputKind, model_view, request_options
from triton_embed.bulk.verify import verify
from triton_embed.errors import InvalidInputError
from triton_embed.hybrid_options import HybridOptions
from triton_embed.options import RequestOptions
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.catalog import ModelKind

from tests.helpers import PoolLifecycle
from tests.unit.test_gateway_app import MODEL
from tests.unit.test_gateway_hybrid import M3, HybridPool, colbert

TEXTS = ["the cat sat", "a very long sentence here", "dog", "one two three four", "x y"]

# --- the kind selection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "output, kind, head, dimension",
    [
        (None, ModelKind.EMBEDDING, "dense", 2),
        (OutputKind.DENSE, ModelKind.EMBEDDING, "dense", 2),
        (OutputKind.SPARSE, ModelKind.SPARSE, "sparse", 100),
        (OutputKind.TOKENS, ModelKind.MULTIVECTOR, "colbert", 3),
    ],
)
def test_a_hybrid_model_is_seen_as_the_kind_of_its_output(output, kind, head, dimension):
    view = model_view(M3, output, "m3")
    assert (view.kind, view.head, view.dimension, view.name) == (kind, head, dimension, "m3")


def test_another_model_takes_only_its_own_output_kind():
    assert model_view(MODEL, None, "embed") is MODEL
    assert model_view(MODEL, OutputKind.DENSE, "embed") is MODEL
    with pytest.raises(InvalidInputError) as err:
        model_view(MODEL, OutputKind.SPARSE, "embed")
    assert str(err.value) == (
        "--output-kind sparse picks one head of a hybrid model (BGE-M3); 'embed' is an "
        "embedding model, which writes dense vectors only (column 'embedding'): leave "
        "--output-kind out (or pass dense), or pass --model a hybrid model"
    )


def test_output_kind_values():
    assert OutputKind.parse("Tokens") is OutputKind.TOKENS and OutputKind.parse(None) is None
    with pytest.raises(InvalidInputError, match="--output-kind 'colbert' is not one of dense, "):
        OutputKind.parse("colbert")


@pytest.mark.parametrize(
    "kind, head, sparse, want",
    [
        (ModelKind.EMBEDDING, "dense", SparseOptions(), {"outputs": "dense"}),
        (ModelKind.SPARSE, "sparse", SparseOptions(top_k=4, threshold=0.5),
         {"outputs": "sparse", "top_k": 4, "threshold": 0.5}),
        (ModelKind.MULTIVECTOR, "colbert", SparseOptions(), {"outputs": "colbert"}),
    ],
)  # fmt: skip
def test_request_options_ask_a_hybrid_model_for_one_head(kind, head, sparse, want):
    options = RequestOptions(truncation="start", input_type="document")
    got = request_options(kind, "m3", options, sparse, head)
    assert isinstance(got, HybridOptions)
    text = {"truncation": "START", "input_type": "document"}
    assert got.to_parameters() == {**text, **want}


@pytest.mark.parametrize(
    "options, sparse, head, message",
    [
        (RequestOptions(dimensions=8), SparseOptions(), "dense",
         "--dimensions do not apply to a hybrid model; 'm3' is one (BGE-M3: its dense vectors "
         "are CLS, L2-normalized, float32, full dimension): leave it out"),
        (RequestOptions(normalize=False, truncation="chunk"), SparseOptions(), "sparse",
         "--normalize and --truncation CHUNK do not apply to a hybrid model"),
        (RequestOptions(), SparseOptions(top_k=3), "dense",
         "--top-k cut a hybrid model's sparse vectors; this job writes its dense vectors: "
         "leave them out, or pass --output-kind sparse"),
        (RequestOptions(), SparseOptions(threshold=0.1), "colbert", "--threshold cut"),
    ],
)  # fmt: skip
def test_flags_a_head_does_not_take_are_refused(options, sparse, head, message):
    kind = model_view(M3, OutputKind.parse({"colbert": "tokens"}.get(head, head)), "m3").kind
    with pytest.raises(InvalidInputError) as err:
        request_options(kind, "m3", options, sparse, head)
    assert message in str(err.value)


# --- the job over the pool double ---------------------------------------------------------------


class BulkHybridPool(PoolLifecycle, HybridPool):
    """``HybridPool`` as the bulk job's ``UpstreamPool``."""


@pytest.fixture
def corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("".join(t + "\n" for t in TEXTS))
    return path


def embed(monkeypatch, pool, corpus: Path, out: Path, *flags: str) -> int:
    """``triton-embed embed corpus -o out --model m3 --shard-rows 2 FLAGS`` over ``pool``."""
    monkeypatch.setattr(pool_embedder, "UpstreamPool", lambda targets, **kwargs: pool)
    monkeypatch.setenv("TRITON_EMBED_ADMIN_KEY", "an-admin-key-for-the-tests-0123")
    argv = ["embed", str(corpus), "-o", str(out), "--url", "127.0.0.1:1", "--model", "m3",
            "--shard-rows", "2", "--no-progress", *flags]  # fmt: skip
    return cli.main(argv)


def sent_outputs(pool) -> set[str]:
    return {p.get("outputs") for m, _, p in pool.calls if m == "m3"}


@pytest.mark.parametrize("flags", [[], ["--output-kind", "dense"]])
def test_dense_shards_hold_the_dense_head(monkeypatch, tmp_path, corpus, flags):
    pool, out = BulkHybridPool(), tmp_path / "out"
    assert embed(monkeypatch, pool, corpus, out, *flags) == 0
    assert sent_outputs(pool) == {"dense"}
    table = pq.read_table(out)
    assert table.schema.field("embedding").type == pa.list_(pa.float32(), 2)
    want = [[len(t.split()), 1] for t in TEXTS]
    assert np.array(table.column("embedding").to_pylist()).tolist() == want
    assert table.column("num_tokens").to_pylist() == [len(t.split()) + 2 for t in TEXTS]
    manifest = shards.read_manifest(out)
    assert (manifest["kind"], manifest["dimension"]) == ("embedding", 2)
    assert verify(out).problems == []


def test_sparse_shards_hold_the_sparse_head(monkeypatch, tmp_path, corpus):
    pool, out = BulkHybridPool(), tmp_path / "out"
    assert embed(monkeypatch, pool, corpus, out, "--output-kind", "sparse", "--top-k", "4") == 0
    assert {json.dumps(p, sort_keys=True) for _, _, p in pool.calls} == {
        '{"input_type": "document", "outputs": "sparse", "top_k": 4}'
    }
    table = pq.read_table(out)
    assert table.schema.equals(shards.sparse_schema("int64", include_text=False))
    rows = table.column("sparse").to_pylist()
    assert rows == [[{"index": len(t.split()), "value": 0.5}] for t in TEXTS]
    assert shards.read_manifest(out)["kind"] == "sparse"
    assert verify(out).problems == []


def test_token_shards_hold_the_colbert_head_one_row_per_vector(monkeypatch, tmp_path, corpus):
    pool, out = BulkHybridPool(), tmp_path / "out"
    assert embed(monkeypatch, pool, corpus, out, "--output-kind", "tokens") == 0
    assert sent_outputs(pool) == {"colbert"}
    table = pq.read_table(out)
    assert table.schema.equals(shards.tokens_schema("int64", 3, include_text=False))
    for got, text in zip(table.column("tokens").to_pylist(), TEXTS, strict=True):
        np.testing.assert_array_equal(np.array(got, np.float32), colbert(text))
    # num_tokens of token shards is the rows: the CLS token's row is not served
    assert table.column("num_tokens").to_pylist() == [len(t.split()) + 1 for t in TEXTS]
    assert shards.read_manifest(out)["dimension"] == 3
    assert verify(out).problems == []


def test_resuming_with_another_output_kind_is_refused(monkeypatch, tmp_path, corpus, capsys):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkHybridPool(), corpus, out, "--output-kind", "sparse") == 0
    capsys.readouterr()
    pool = BulkHybridPool()
    assert embed(monkeypatch, pool, corpus, out, "--output-kind", "tokens") == 1
    err = capsys.readouterr().err
    assert "--output-kind: 'sparse' then, 'tokens' now" in err and "--overwrite" in err
    assert pool.calls == []


def test_dense_is_what_no_output_kind_writes_so_a_rerun_may_name_it(
    monkeypatch, tmp_path, corpus, capsys
):
    out = tmp_path / "out"
    assert embed(monkeypatch, BulkHybridPool(), corpus, out) == 0
    pool = BulkHybridPool()
    assert embed(monkeypatch, pool, corpus, out, "--output-kind", "dense") == 0
    assert "then," not in capsys.readouterr().err
    assert pool.calls == []  # the job was complete: nothing sent again


def test_a_step_named_as_the_model_is_refused_at_once(monkeypatch, tmp_path, corpus, capsys):
    class StepsListed(BulkHybridPool):
        def describe(self) -> list[dict]:
            models = ["m3", "m3_tokenizer"]
            return [{"address": "127.0.0.1:1", "ready": True, "models": models, "problem": ""}]

    started = time.monotonic()
    code = embed(monkeypatch, StepsListed(), corpus, tmp_path / "out", "--model", "m3_tokenizer")
    assert code == 1 and time.monotonic() - started < 10  # not the 30 s wait for the model
    err = capsys.readouterr().err
    assert "model 'm3_tokenizer' is served but is not an ensemble the bulk job can call" in err
    assert "the ensembles: embed, m3; pass one of them as --model" in err


def test_output_kind_is_refused_with_a_npy_output(capsys, corpus, tmp_path):
    argv = ["embed", str(corpus), "-o", str(tmp_path / "x.npy"), "--output-kind", "sparse"]
    assert cli.main(argv) == 1
    assert "--output-kind needs an output folder (-o DIR)" in capsys.readouterr().err


def test_the_ray_actor_writes_the_head_asked_for(monkeypatch):
    from triton_embed.bulk.ray_data import TritonEmbedder

    pool = BulkHybridPool()
    monkeypatch.setattr(pool_embedder, "UpstreamPool", lambda targets, **kwargs: pool)
    actor = TritonEmbedder("127.0.0.1:1", "m3", admin_key="k" * 32, output_kind="tokens")
    batch = pa.table({"id": pa.array(range(len(TEXTS)), pa.int64()), "text": TEXTS})
    out = actor(batch)
    del actor
    assert out.schema.equals(shards.tokens_schema("int64", 3, include_text=False))
    assert sent_outputs(pool) == {"colbert"}
    np.testing.assert_array_equal(
        np.array(out.column("tokens").to_pylist()[0], np.float32), colbert(TEXTS[0])
    )


def test_the_ray_jobs_output_kind_reaches_the_actors(monkeypatch):
    from tests.unit.test_bulk_ray_job import run_job

    made, _ = run_job(monkeypatch, ["in", "s3://b/out", "--model", "m3", "--output-kind", "sparse"])
    assert (made["model"], made["output_kind"]) == ("m3", "sparse")
