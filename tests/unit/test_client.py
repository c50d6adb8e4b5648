"""EmbeddingClient without a server: argument checks, text positions in errors, URL hints.

The gRPC client is replaced by :class:`tests.fake_triton.FakeTriton`, which answers as the
server does, so batching and error mapping run the library's own code.
"""

from __future__ import annotations

import http.server
import threading

import numpy as np
import pytest
from triton_embed import EmbeddingClient, InvalidInputError, ServerUnavailableError
from triton_embed.errors import map_error
from triton_embed.options import RequestOptions
from tritonclient.utils import InferenceServerException

from tests import fake_triton as fake_server


@pytest.fixture
def fake_triton(monkeypatch):
    """The real EmbeddingClient over a stand-in gRPC client (tests/fake_triton.py)."""
    return fake_server.install(monkeypatch)


EMPTY = (
    "in ensemble 'embed', text 6 is empty; send at least one character, or set the request "
    "parameter allow_empty=true to embed it"
)


# ---- the absolute index of a rejected text ----------------------------------------------


def test_a_rejected_text_is_named_by_its_index_in_the_whole_input():
    exc = InferenceServerException(msg=EMPTY, status="StatusCode.INVALID_ARGUMENT")
    error = map_error(exc, "h:1", 64, 36)
    assert isinstance(error, InvalidInputError)
    assert error.index == 70
    assert error.server_message == EMPTY  # kept as the server sent it
    assert error.reason.startswith("is empty; send at least one character")
    assert str(error).startswith(f"texts[70] was rejected: {EMPTY}")
    assert "texts[64:100]" in str(error)  # the request it was in


@pytest.mark.parametrize(
    "message",
    [
        "in ensemble 'embed', [request id: <id_unknown>] text 3 is empty; send ...",
        "text 3 has 300 tokens; the model accepts 256; shorten it or set ...",
        "in ensemble 'embed', text 3 is not valid UTF-8: byte 0xff at byte offset 2 (...)",
    ],
)
def test_the_servers_text_index_is_found_wherever_it_stands(message):
    exc = InferenceServerException(msg=message, status="StatusCode.INVALID_ARGUMENT")
    error = map_error(exc, "h:1", 8, 4)
    assert error.index == 11 and message in str(error)


@pytest.mark.parametrize(
    "message",
    [
        "unexpected shape for input 'TEXT' for model 'embed'",  # no text index
        "in ensemble 'embed', text 9 is empty",  # not an index of this 4-text request
    ],
)
def test_a_message_without_a_usable_index_keeps_the_requests_range(message):
    exc = InferenceServerException(msg=message, status="StatusCode.INVALID_ARGUMENT")
    error = map_error(exc, "h:1", 8, 4)
    assert error.index is None and str(error) == f"texts[8:12]: {message}"


def test_embed_names_the_failing_text_across_batches(fake_triton):
    texts = ["t"] * 10
    texts[6] = ""
    with EmbeddingClient("h:1") as client:  # max_batch_size 4: [0:4] [4:8] [8:10]
        with pytest.raises(InvalidInputError) as info:
            client.embed(texts)
    assert info.value.index == 6
    assert str(info.value).startswith("texts[6] was rejected: in ensemble 'embed', text 2 is")


# ---- texts the client refuses before sending ---------------------------------------------


def test_a_lone_surrogate_is_invalid_input_naming_the_text(fake_triton):
    with EmbeddingClient("h:1") as client:
        with pytest.raises(InvalidInputError) as info:
            client.embed(["fine"] * 5 + ["a\ud800b"])
        assert fake_triton.requests == []  # refused before anything was sent
        assert client.embed(["a\ufffdb"]).shape == (1, 2)
    error = info.value
    assert not isinstance(error, UnicodeError)
    assert error.index == 5 and error.server_message is None
    assert "texts[5]" in str(error) and "U+D800" in str(error) and "character 1" in str(error)
    assert "remove" in str(error)


def test_a_text_of_another_type_names_its_index(fake_triton):
    with EmbeddingClient("h:1") as client:
        with pytest.raises(InvalidInputError, match=r"texts\[1\] must be str or bytes, got int"):
            client.embed(["a", 42])


# ---- constructor arguments -----------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"timeout_s": 0}, "timeout_s must be a finite number of seconds > 0, got 0"),
        ({"timeout_s": -1}, "timeout_s must be a finite number of seconds > 0, got -1"),
        ({"timeout_s": float("nan")}, "timeout_s must be a finite number of seconds > 0"),
        ({"timeout_s": float("inf")}, "timeout_s must be a finite number of seconds > 0"),
        ({"timeout_s": "5"}, "timeout_s must be a finite number of seconds > 0"),
        ({"max_concurrency": 0}, "max_concurrency must be a whole number >= 1, got 0"),
        ({"max_concurrency": -3}, "max_concurrency must be a whole number >= 1, got -3"),
        ({"max_concurrency": 2.5}, "max_concurrency must be a whole number >= 1, got 2.5"),
        ({"batch_size": 0}, "batch_size must be >= 1, got 0"),
    ],
)
def test_out_of_range_arguments_raise_value_error_before_connecting(fake_triton, kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EmbeddingClient("h:1", **kwargs)


def test_good_arguments_are_kept(fake_triton):
    client = EmbeddingClient("h:1", timeout_s=0.5, max_concurrency=np.int64(3), batch_size=2)
    assert (client.timeout_s, client.max_concurrency, client.batch_size) == (0.5, 3, 2)


def test_options_are_sent_and_the_keyword_arguments_given_replace_their_fields(fake_triton):
    base = RequestOptions(truncation="none", input_type="query", normalize=False)
    with EmbeddingClient("h:1", options=base, normalize=True, allow_empty=True) as client:
        client.embed(["a", ""])
        client.embed(["b"], input_type="document")
    assert client.options == RequestOptions("NONE", True, None, "query", normalize=True)
    first = {"truncation": "NONE", "allow_empty": True, "input_type": "query", "normalize": True}
    assert fake_triton.parameters == [first, {**first, "input_type": "document"}]
    assert base.normalize is False  # the caller's options are left as they were


def test_options_of_another_type_are_refused(fake_triton):
    with pytest.raises(InvalidInputError, match="options must be a RequestOptions, got dict"):
        EmbeddingClient("h:1", options={"normalize": False})


@pytest.mark.parametrize("url", ["http://127.0.0.1:8001", "grpc://h:8001", "https://h"])
def test_a_url_with_a_scheme_is_refused_with_a_hint(fake_triton, url):
    with pytest.raises(InvalidInputError) as info:
        EmbeddingClient(url)
    text = str(info.value)
    assert url in text and "host:port" in text and "gRPC port" in text and "8001" in text


def test_the_unavailable_error_says_the_url_must_be_the_grpc_port():
    exc = InferenceServerException(msg="Socket closed", status="StatusCode.UNAVAILABLE")
    error = map_error(exc, "127.0.0.1:8000")
    assert isinstance(error, ServerUnavailableError)
    assert "Socket closed" in str(error)
    assert "gRPC port (8001 by default)" in str(error)


class _QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_a_grpc_client_talking_to_an_http_server_gets_the_port_hint():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _QuietHandler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(ServerUnavailableError, match=r"gRPC port \(8001 by default\)"):
            EmbeddingClient(f"127.0.0.1:{srv.server_address[1]}", retry=0)
    finally:
        srv.shutdown()
        srv.server_close()


# ---- abandoned work is stopped (issue 20, item 5) -----------------------------------------


class _SlowContext:
    def __init__(self, on_cancel):
        self.on_cancel = on_cancel

    def cancel(self):
        self.on_cancel()


def test_a_failed_request_cancels_those_in_flight_and_sends_no_more(fake_triton, monkeypatch):
    """Request 1 of 16 times out: the 2 others in flight are cancelled, none more is sent."""
    sent, cancelled = [], []
    lock = threading.Lock()

    def async_infer(self, model, inputs, callback, client_timeout=None, **kwargs):
        from tritonclient.utils import deserialize_bytes_tensor

        first = bytes(deserialize_bytes_tensor(inputs[0]._get_content())[0]).decode()
        with lock:
            sent.append(first)

        def answer_later():
            if first == "text 4":  # the second request: its deadline passes
                callback(
                    result=None,
                    error=InferenceServerException(
                        msg="Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED"
                    ),
                )

        def on_cancel():
            with lock:
                cancelled.append(first)
            callback(
                result=None,
                error=InferenceServerException(
                    msg="Locally cancelled by application!", status="StatusCode.CANCELLED"
                ),
            )

        threading.Timer(0.05, answer_later).start()
        return _SlowContext(on_cancel)

    monkeypatch.setattr(fake_triton, "async_infer", async_infer)
    client = EmbeddingClient("h:1", max_concurrency=3, timeout_s=30, retry=None)
    texts = [f"text {i}" for i in range(64)]  # 16 requests of 4
    from triton_embed.errors import EmbedTimeoutError

    with pytest.raises(EmbedTimeoutError, match=r"texts\[4:8\]: request to h:1 timed out"):
        client.embed(texts)
    assert sorted(sent) == ["text 0", "text 4", "text 8"]  # the 13 others never sent
    assert sorted(cancelled) == ["text 0", "text 8"]  # the two in flight were cancelled
