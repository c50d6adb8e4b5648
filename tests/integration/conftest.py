"""Session fixtures: one real tritonserver on free loopback ports, the reference model."""

from __future__ import annotations

import os

import pytest
from triton_embed_server.run.launcher import TritonServer

from tests.helpers import MODEL_PATH


@pytest.fixture(scope="session")
def server():
    """A real tritonserver serving model_repository; stopped even when tests fail."""
    srv = TritonServer(ready_timeout_s=float(os.environ.get("TRITON_READY_TIMEOUT_S", "400")))
    try:
        srv.start()
    except RuntimeError as exc:
        pytest.fail(f"tritonserver did not start: {exc}")
    yield srv
    code = srv.stop()
    print(f"\ntritonserver stopped with exit code {code}; log: {srv.log_path}")


@pytest.fixture(scope="session")
def grpc_client(server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def reference_model():
    """sentence-transformers on the same model folder: the reference implementation."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(MODEL_PATH), device="cpu")


@pytest.fixture(scope="session")
def hf_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(MODEL_PATH))
