"""The gateway's statuses over the transport's error kinds, and its envelopes (pure functions)."""

from __future__ import annotations

import pytest
from triton_embed.transport.failures import ErrorKind, TransportError, upstream_error
from triton_embed_server.gateway import errors
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
    error = errors.from_transport(upstream_error(upstream(status, message)))
    assert type(error) is kind
    assert message in error.message


def test_every_error_kind_has_one_status():
    assert set(errors.STATUS_OF_KIND) == set(ErrorKind)
    statuses = {kind: errors.from_transport(TransportError(kind, "x")).status for kind in ErrorKind}
    assert statuses == {
        ErrorKind.INVALID_INPUT: 400,
        ErrorKind.OVER_BUDGET: 400,
        ErrorKind.OVERLOADED: 429,
        ErrorKind.TIMEOUT: 504,
        ErrorKind.MODEL_MISSING: 503,
        ErrorKind.UNREACHABLE: 503,
        ErrorKind.NO_UPSTREAM: 503,
        ErrorKind.ACCESS_DENIED: 502,
        ErrorKind.BAD_ANSWER: 502,
        ErrorKind.OTHER: 502,
    }


def test_a_refused_input_names_the_input_field_and_a_budget_its_own():
    refused = errors.from_transport(upstream_error(upstream("INVALID_ARGUMENT", "text 0 is empty")))
    assert (refused.param, refused.code) == ("input", None)
    budget = errors.from_transport(TransportError(ErrorKind.OVER_BUDGET, "over", field="inputs"))
    assert (budget.status, budget.param, budget.code) == (400, "inputs", "too_many_tokens")


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


def test_headers_of_refusals_and_of_a_closed_connection():
    assert errors.Unavailable("x").headers() == {"Retry-After": "1"}
    assert errors.RequestTimeout("x").headers() == {"Connection": "close"}
    assert errors.UpstreamError("x").headers() == {}
    assert errors.EmptyInput("x").status == 400 and errors.EmptyInput("x").code is None
