"""The gateway's error mapping, its tensor reading and its piece splitting (pure functions)."""

from __future__ import annotations

import numpy as np
import pytest
from triton_embed.codec import encode_embeddings
from triton_embed_server.gateway import errors
from triton_embed_server.gateway.inference import pieces
from triton_embed_server.gateway.tensors import (
    bytes_elements,
    float32_matrix,
    frame_bytes,
    int32_values,
)
from tritonclient.utils import InferenceServerException


def upstream(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(msg=message, status=f"StatusCode.{status}")


@pytest.mark.parametrize(
    "status, message, kind",
    [
        ("INVALID_ARGUMENT", "text 0 is empty", errors.BadRequest),
        ("UNAVAILABLE", "in ensemble 'embed', Exceeds maximum queue size", errors.Overloaded),
        ("UNAVAILABLE", "in ensemble 'embed', Request timeout expired", errors.Overloaded),
        ("DEADLINE_EXCEEDED", "Deadline Exceeded", errors.Timeout),
        ("NOT_FOUND", "Request for unknown model: 'x' is not found", errors.Unavailable),
        ("UNAVAILABLE", "failed to connect to all addresses", errors.Unavailable),
        ("UNKNOWN", "Socket closed", errors.Unavailable),
        ("INTERNAL", "engine failed", errors.UpstreamError),
        (
            "UNAVAILABLE",
            "This protocol is restricted, expecting header 'x'",
            errors.UpstreamError,
        ),
    ],
)
def test_upstream_errors_map_to_one_gateway_error(status, message, kind):
    error = errors.from_upstream(upstream(status, message))
    assert type(error) is kind
    assert message in error.message


def test_statuses_and_envelopes():
    expected = {
        errors.BadRequest: (400, "invalid_request_error", "Validation"),
        errors.EmptyInput: (400, "invalid_request_error", "Empty"),
        errors.Unauthorized: (401, "invalid_request_error", "Unauthorized"),
        errors.NotFound: (404, "invalid_request_error", "NotFound"),
        errors.TooLarge: (413, "invalid_request_error", "Validation"),
        errors.Overloaded: (429, "rate_limit_error", "Overloaded"),
        errors.Internal: (500, "server_error", "Backend"),
        errors.UpstreamError: (502, "api_error", "Backend"),
        errors.Unavailable: (503, "service_unavailable", "Unhealthy"),
        errors.Timeout: (504, "timeout_error", "Backend"),
    }
    for cls, (status, openai_type, tei_type) in expected.items():
        error = cls("what went wrong", param="input")
        assert error.status == status
        assert error.openai_body() == {
            "error": {
                "message": "what went wrong",
                "type": openai_type,
                "param": "input",
                "code": error.code,
            }
        }
        assert error.tei_body() == {"error": "what went wrong", "error_type": tei_type}
    assert errors.Overloaded("x").headers() == {"Retry-After": "1"}
    assert errors.Unauthorized("x").headers()["WWW-Authenticate"].startswith("Bearer")


def test_a_text_index_is_renumbered_from_the_piece_to_the_request():
    message = "in ensemble 'embed', text 6 has 602 tokens; the model accepts 256"
    assert errors.rebase_text_index(message, 64, 64) == message.replace("text 6", "text 70")
    assert errors.rebase_text_index(message, 0, 64) == message
    assert errors.rebase_text_index(message, 64, 5) == message  # not an index of the piece
    assert errors.rebase_text_index("no index here", 64, 64) == "no index here"


def test_bytes_elements_keep_trailing_zero_bytes_and_refuse_bad_framing():
    vectors = np.array([[1.0, 0.0], [0.5, 0.0], [0.0, 0.0]], dtype=np.float32)
    payloads = list(encode_embeddings(vectors))
    raw = frame_bytes(payloads)
    elements = bytes_elements(raw, 3)
    assert [bytes(e) for e in elements] == payloads
    assert np.array_equal(float32_matrix(elements), vectors)
    with pytest.raises(ValueError, match="does not hold 4 framed elements"):
        bytes_elements(raw, 4)
    with pytest.raises(ValueError, match="does not hold 2 framed elements"):
        bytes_elements(raw, 2)
    with pytest.raises(ValueError, match="not float32 vectors of one dimension"):
        float32_matrix([b"\0" * 8, b"\0" * 4])
    assert int32_values(np.array([3, 4], "<i4").tobytes(), 2).tolist() == [3, 4]
    with pytest.raises(ValueError):
        int32_values(b"\0" * 4, 2)


def test_pieces_cover_every_input_once_in_order():
    assert pieces(0, 4) == []
    assert pieces(4, 4) == [(0, 4)]
    assert pieces(2048, 64)[-1] == (1984, 2048) and len(pieces(2048, 64)) == 32
    for n in range(0, 40):
        spans = pieces(n, 7)
        assert [i for a, b in spans for i in range(a, b)] == list(range(n))
        assert all(0 < b - a <= 7 for a, b in spans)
    with pytest.raises(ValueError):
        pieces(3, 0)
