"""Session fixtures: real tritonservers on free loopback ports, the reference model.

Each server configuration starts once per session, whichever modules use it (a start takes
30-60 s on 2 cores); a module that changes its server (kills, restarts) starts its own.
"""

from __future__ import annotations

import os
import shutil

import pytest
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import TritonServer

from tests.helpers import MODEL_PATH, running
from tests.otlp_receiver import OtlpReceiver

READY_TIMEOUT_S = float(os.environ.get("TRITON_READY_TIMEOUT_S", "400"))
#: The embedder queue of :func:`one_embedder_server`: the 5th waiting request is refused.
SMALL_QUEUE = 4
#: The folder name of :func:`one_embedder_server`'s copy of the model.
LOCAL_MODEL = "my-local-model"
#: The session server's trace rate: 1 in a million requests without a ``traceparent`` is
#: traced (Triton 2.51 traces every request that has one, whatever the rate).
ONLY_PROPAGATED_TRACES = 1_000_000


@pytest.fixture(scope="session")
def otlp_receiver():
    """An OTLP/HTTP trace receiver on 127.0.0.1 (:class:`tests.otlp_receiver.OtlpReceiver`)."""
    with OtlpReceiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def server(otlp_receiver):
    """A real tritonserver serving model_repository; stopped even when tests fail.

    Its traces (OpenTelemetry mode) go to ``otlp_receiver``: those of requests sent with a
    ``traceparent`` (test_traces.py), at a rate that traces almost no other request.
    """
    srv = TritonServer(
        ready_timeout_s=READY_TIMEOUT_S,
        otlp_endpoint=otlp_receiver.url,
        trace_rate=ONLY_PROPAGATED_TRACES,
    )
    with running(srv) as srv:
        yield srv


@pytest.fixture(scope="session")
def one_embedder_server(tmp_path_factory):
    """A copy of the shipped repository: 1 embedder replica, a queue of SMALL_QUEUE requests,
    both steps reading a copy of the model folder (``model_path`` = ``.../LOCAL_MODEL``).

    Shared by test_overload.py (the small queue) and test_other_model_folder.py (the
    ``model_path`` change); neither changes the server.
    """
    root = tmp_path_factory.mktemp("one-embedder")
    model_copy = root / LOCAL_MODEL
    shutil.copytree(MODEL_PATH, model_copy)
    repo = copy_repository(root / "model_repository")
    local = {"model_path": str(model_copy)}
    edit_config(repo / "tokenizer" / "config.pbtxt", parameters=local)
    edit_config(
        repo / "embedder" / "config.pbtxt", count=1, max_queue_size=SMALL_QUEUE, parameters=local
    )
    srv = TritonServer(model_repository=repo, ready_timeout_s=READY_TIMEOUT_S)
    with running(srv, "one-embedder tritonserver") as srv:
        yield srv


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
