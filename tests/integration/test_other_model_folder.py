"""Any local sentence-transformers folder works by changing `model_path`.

The server is the session's ``one_embedder_server`` (tests/integration/conftest.py): both
steps of a copy of the shipped repository read a copy of the model folder.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import COSINE_MIN, cosines, infer_embed
from tests.integration.conftest import LOCAL_MODEL

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_copied_model_folder_serves_by_changing_model_path(one_embedder_server, reference_model):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(one_embedder_server.grpc_url)
    texts = ["served from a copied folder", "another sentence"]
    elements, num_tokens = infer_embed(client, texts)
    client.close()
    # the whole log: other modules may have used this server since its start
    log = one_embedder_server.log_path.read_text(errors="replace")
    from triton_embed.codec import decode_embeddings

    assert LOCAL_MODEL in log
    got = decode_embeddings(elements)
    assert cosines(got, reference_model.encode(texts)).min() >= COSINE_MIN
    assert num_tokens.tolist() == [7, 4]
    assert np.isfinite(got).all()
