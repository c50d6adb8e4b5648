"""Any local sentence-transformers folder works by changing `model_path`."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import TritonServer

from tests.helpers import COSINE_MIN, MODEL_PATH, cosines, infer_embed

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_copied_model_folder_serves_by_changing_model_path(tmp_path, reference_model):
    model_copy = tmp_path / "my-local-model"
    shutil.copytree(MODEL_PATH, model_copy)
    repo = copy_repository(tmp_path / "model_repository")
    for name in ("tokenizer", "embedder"):
        edit_config(
            repo / name / "config.pbtxt", count=1, parameters={"model_path": str(model_copy)}
        )
    with TritonServer(model_repository=repo) as server:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(server.grpc_url)
        texts = ["served from a copied folder", "another sentence"]
        elements, num_tokens = infer_embed(client, texts)
        client.close()
        log = server.log_tail(100_000)
    from triton_embed.codec import decode_embeddings

    assert "my-local-model" in log
    got = decode_embeddings(elements)
    assert cosines(got, reference_model.encode(texts)).min() >= COSINE_MIN
    assert num_tokens.tolist() == [7, 4]
    assert np.isfinite(got).all()
