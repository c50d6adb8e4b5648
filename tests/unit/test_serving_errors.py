"""Serving errors and their mapping to pb_utils.TritonError."""

from __future__ import annotations

import types

import pytest
from triton_embed_server.steps.errors import (
    EmbedServingError,
    EmptyTextError,
    EngineError,
    InvalidArgumentError,
    InvalidTokenIdsError,
    InvalidUtf8Error,
    TooLongError,
    to_triton_error,
)
from triton_embed_server.steps.metrics import FAILURE_REASONS, failure_reason


class FakeTritonError:
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4

    def __init__(self, message, code=None):
        self.message = message
        self.code = code


fake_pb_utils = types.SimpleNamespace(TritonError=FakeTritonError)


class NoInvalidArgTritonError:
    """A stub whose TritonError lacks the INVALID_ARG constant."""

    INTERNAL = 13

    def __init__(self, message, code=None):
        self.message = message
        self.code = code


@pytest.mark.parametrize(
    "exc_type",
    [EmptyTextError, InvalidUtf8Error, TooLongError, InvalidTokenIdsError, InvalidArgumentError],
)
def test_invalid_argument_errors_map_to_invalid_arg(exc_type):
    err = to_triton_error(exc_type("text 3 is bad"), fake_pb_utils)
    assert isinstance(err, FakeTritonError)
    assert err.code == FakeTritonError.INVALID_ARG
    assert err.message == "text 3 is bad"


def test_every_error_class_has_its_own_exported_failure_label():
    # The failure counter has one series per label, created up front: a reason missing from
    # FAILURE_REASONS would not be exported, and a shared one would merge two causes.
    classes = [
        EmbedServingError,
        InvalidArgumentError,
        EmptyTextError,
        InvalidUtf8Error,
        TooLongError,
        InvalidTokenIdsError,
        EngineError,
    ]
    reasons = [failure_reason(cls("x")) for cls in classes]
    assert set(reasons) <= set(FAILURE_REASONS)
    assert len(set(reasons)) == len(classes)
    assert failure_reason(KeyError("k")) == "internal" == failure_reason(EmbedServingError("x"))


def test_engine_error_maps_to_internal():
    err = to_triton_error(EngineError("engine died"), fake_pb_utils)
    assert err.code == FakeTritonError.INTERNAL
    assert err.message == "engine died"


def test_base_error_maps_to_internal():
    err = to_triton_error(EmbedServingError("oops"), fake_pb_utils)
    assert err.code == FakeTritonError.INTERNAL
    assert err.message == "oops"


def test_foreign_exception_is_internal_with_type_name():
    err = to_triton_error(KeyError("k"), fake_pb_utils)
    assert err.code == FakeTritonError.INTERNAL
    assert err.message == "KeyError: 'k'"
    err = to_triton_error(RuntimeError("boom"), fake_pb_utils)
    assert err.message == "RuntimeError: boom"


def test_unknown_code_name_falls_back_to_internal():
    pb = types.SimpleNamespace(TritonError=NoInvalidArgTritonError)
    err = to_triton_error(TooLongError("long"), pb)
    assert isinstance(err, NoInvalidArgTritonError)
    assert err.code == NoInvalidArgTritonError.INTERNAL
    assert err.message == "long"
