"""The input contract (README, "Input contract"): one test per rule, real server."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_embed.codec import decode_embeddings, encode_token_ids
from tritonclient.utils import InferenceServerException

from tests.helpers import COSINE_MIN, DIM, MAX_LENGTH, cosines, text_input

pytestmark = pytest.mark.integration


def call(client, texts, model="embed", timeout_s=60, **parameters):
    """(embeddings [n, dim], num_tokens [n]) or the InferenceServerException."""
    try:
        r = client.infer(
            model, [text_input(texts)], parameters=parameters or None, client_timeout=timeout_s
        )
    except InferenceServerException as exc:
        return exc
    return decode_embeddings(r.as_numpy("EMBEDDING").reshape(-1)), r.as_numpy("NUM_TOKENS").reshape(
        -1
    )


def assert_invalid(result, *fragments):
    assert isinstance(result, InferenceServerException), f"expected an error, got {result!r}"
    assert result.status() == "StatusCode.INVALID_ARGUMENT", result
    for fragment in fragments:
        assert fragment in result.message(), result.message()


def assert_still_serving(server, client):
    assert server.is_ready()
    vectors, counts = call(client, ["still serving"])
    assert vectors.shape == (1, DIM) and counts.tolist() == [4]


LONG = "word " * 600  # 602 tokens with [CLS]/[SEP]


# ---- truncation --------------------------------------------------------------------------
def test_truncation_default_is_end_and_keeps_the_start(grpc_client, hf_tokenizer, reference_model):
    text = "unique beginning words. " + "filler text " * 400
    vectors, counts = call(grpc_client, [text])
    assert counts.tolist() == [MAX_LENGTH]
    assert cosines(vectors, reference_model.encode([text]))[0] >= COSINE_MIN


def test_truncation_start_keeps_the_end(grpc_client, hf_tokenizer, reference_model):
    text = "filler text " * 400 + "a distinctive ending sentence about penguins."
    vectors, counts = call(grpc_client, [text], truncation="START")
    assert counts.tolist() == [MAX_LENGTH]
    ids = hf_tokenizer(text, add_special_tokens=False)["input_ids"][-(MAX_LENGTH - 2) :]
    tail_text = hf_tokenizer.decode(ids)
    ref = reference_model.encode([tail_text])
    assert cosines(vectors, ref)[0] >= 0.999  # decode/re-encode of the kept tail


def test_truncation_none_rejects_with_index_count_limit_and_options(grpc_client):
    result = call(grpc_client, ["short", LONG], truncation="NONE")
    assert_invalid(result, "text 1 has 602 tokens", "accepts 256", "truncation=END, START or CHUNK")


def test_unknown_truncation_value_is_rejected(grpc_client):
    assert_invalid(
        call(grpc_client, ["x"], truncation="MIDDLE"), "MIDDLE", "NONE, END, START, CHUNK"
    )


def test_misspelt_request_parameter_is_rejected(grpc_client):
    assert_invalid(
        call(grpc_client, ["x"], truncaton="NONE"),
        "'truncaton' is not an option",
        "truncation, allow_empty, invalid_utf8",
    )


# ---- empty, UTF-8, control characters ---------------------------------------------------
def test_empty_text_is_rejected_with_its_index(grpc_client):
    assert_invalid(call(grpc_client, ["fine", ""]), "text 1 is empty", "allow_empty")


def test_empty_text_opt_in(grpc_client):
    vectors, counts = call(grpc_client, ["", "x"], allow_empty=True)
    assert counts.tolist() == [2, 3] and vectors.shape == (2, DIM)


@pytest.mark.parametrize(
    "payload, offset",
    [
        (b"\xff", 0),
        (b"ok \xc3", 3),
        (b"abc\xe2\x82", 3),
        (b"\xed\xa0\x80 surrogate", 0),
        (b"a\xc0\xafb", 1),
    ],
)
def test_invalid_utf8_is_rejected_with_index_and_byte_offset(grpc_client, payload, offset):
    result = call(grpc_client, [b"valid", payload])
    assert_invalid(
        result, "text 1 is not valid UTF-8", f"byte offset {offset}", "invalid_utf8=replace"
    )


def test_invalid_utf8_replaced_when_opted_in(grpc_client, reference_model):
    vectors, _ = call(grpc_client, [b"caf\xff bar"], invalid_utf8="replace")
    ref = reference_model.encode(["caf\ufffd bar"])
    assert cosines(vectors, ref)[0] >= COSINE_MIN


def test_nul_and_control_characters_reach_the_tokenizer_as_sent(
    grpc_client, hf_tokenizer, reference_model
):
    texts = ["first\x00 second third", "tab\tand\x01ctrl\x1fchars", "ends with nul\x00", "\x00"]
    vectors, counts = call(grpc_client, texts)
    assert counts.tolist() == [len(ids) for ids in hf_tokenizer(texts)["input_ids"]]
    assert counts[0] == 5  # not cut at the NUL: [CLS] first second third [SEP]
    assert cosines(vectors, reference_model.encode(texts)).min() >= COSINE_MIN


# ---- huge texts and length boundaries ----------------------------------------------------
def test_a_megabyte_text_is_answered_quickly_both_ways(grpc_client):
    big = ("word " * 209_715).encode()  # 1,048,575 bytes: just under the 1 MiB per-text limit
    t0 = time.monotonic()
    vectors, counts = call(grpc_client, [big])
    assert counts.tolist() == [MAX_LENGTH] and vectors.shape == (1, DIM)
    result = call(grpc_client, [big], truncation="NONE")
    assert_invalid(result, "1048575 characters", "16384-character cap")
    assert time.monotonic() - t0 < 30


def test_a_text_over_the_per_text_byte_limit_is_refused_in_every_mode(server, grpc_client):
    """A 5 MB text: refused from its size, the message bounded (issue 20 item 2)."""
    huge = ("word " * 1_000_000).encode()  # 5 MB
    for truncation in ("END", "START", "CHUNK", "NONE"):
        result = call(grpc_client, ["fine", huge], truncation=truncation)
        assert_invalid(
            result,
            "text 1 is 5000000 bytes, over the limit of 1048576 bytes per text (4 bytes per "
            "character x max_chars=16384 x max_chunks=16",
            "split it into texts under the limit",
        )
        assert len(result.message()) < 400 and "word word" not in result.message()
    assert_still_serving(server, grpc_client)


def test_every_length_from_zero_past_the_limit_answers(server, grpc_client, hf_tokenizer):
    """Lengths 0..600 words (0..602 tokens) in steps around the limit: a vector or an error."""
    lengths = [0, 1, 2, 100, 252, 253, 254, 255, 256, 300, 600]
    for truncation in ("END", "NONE"):
        for n in lengths:
            text = "word " * n
            result = call(
                grpc_client, [text], truncation=truncation, allow_empty=True, timeout_s=30
            )
            tokens = n + 2
            if truncation == "NONE" and tokens > MAX_LENGTH:
                assert_invalid(result, f"has {tokens} tokens")
            else:
                vectors, counts = result
                assert counts.tolist() == [min(tokens, MAX_LENGTH)], (truncation, n)
                assert vectors.shape == (1, DIM)
    assert_still_serving(server, grpc_client)


# ---- batch shape, size, dtype ------------------------------------------------------------
def test_more_texts_than_max_batch_size_is_rejected_by_the_server(grpc_client):
    result = call(grpc_client, ["t"] * 65)
    assert isinstance(result, InferenceServerException)
    assert "batch-size must be <= 64" in result.message()


@pytest.mark.parametrize("shape", [[2, 2], [4]])
def test_wrong_shape_is_rejected(grpc_client, shape):
    arr = np.array([b"a"] * int(np.prod(shape)), dtype=object).reshape(shape)
    inp = grpcclient.InferInput("TEXT", shape, "BYTES")
    inp.set_data_from_numpy(arr)
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.infer("embed", [inp])
    assert "TEXT" in exc.value.message() and "shape" in exc.value.message()


def test_wrong_dtype_and_missing_input_are_rejected(grpc_client):
    inp = grpcclient.InferInput("TEXT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.infer("embed", [inp])
    assert "data-type" in exc.value.message() and "BYTES" in exc.value.message()
    other = grpcclient.InferInput("NOT_TEXT", [1, 1], "BYTES")
    other.set_data_from_numpy(np.array([[b"a"]], dtype=object))
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.infer("embed", [other])
    assert "TEXT" in exc.value.message()


def embedder_call(client, payloads):
    arr = np.empty((len(payloads), 1), dtype=object)
    arr[:, 0] = payloads
    inp = grpcclient.InferInput("TOKEN_IDS", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    try:
        return decode_embeddings(client.infer("embedder", [inp]).as_numpy("EMBEDDING").reshape(-1))
    except InferenceServerException as exc:
        return exc


@pytest.mark.parametrize(
    "ids, fragment",
    [
        ([101, 999999, 102], "token ID 999999 at position 1, outside the vocabulary [0, 30522)"),
        ([101, -5, 102], "token ID -5 at position 1"),
        ([101] + [1000] * 300 + [102], "has 302 token IDs; the model accepts 256"),
        ([], "has no token IDs"),
    ],
)
def test_embedder_rejects_bad_token_ids_before_the_engine(server, grpc_client, ids, fragment):
    good = encode_token_ids([[101, 7592, 102]])[0]
    bad = encode_token_ids([ids])[0]
    assert_invalid(embedder_call(grpc_client, [good, bad]), "text 1", fragment)
    assert embedder_call(grpc_client, [good]).shape == (1, DIM)


def test_embedder_rejects_payloads_that_are_not_int32(grpc_client):
    assert_invalid(embedder_call(grpc_client, [b"\x01\x02\x03"]), "text 0", "not a multiple of 4")


# ---- batch invariance and isolation ------------------------------------------------------
def test_embedding_does_not_depend_on_batch_company(server, grpc_client, reference_model):
    target = "The embedding of this sentence must not depend on its neighbours."
    alone, _ = call(grpc_client, [target])
    mixed, _ = call(grpc_client, ["x", LONG, target, "short one", LONG[:1000]])
    assert cosines(alone, mixed[2:3])[0] >= COSINE_MIN

    def one(_):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            return call(client, [target])[0]
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=16) as pool:  # 50 concurrent copies, dynamic batching
        results = list(pool.map(one, range(50)))
    assert cosines(np.concatenate(results), np.repeat(alone, 50, axis=0)).min() >= COSINE_MIN


def test_a_bad_request_fails_alone_in_a_dynamic_batch(server):
    """Concurrent good and bad requests: every good one succeeds, every bad one fails."""

    def one(i):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            if i % 3 == 0:
                return "bad", call(client, [f"good {i}", b"\xff"])
            if i % 3 == 1:
                return "bad", call(client, [LONG], truncation="NONE")
            return "good", call(client, [f"good text {i}", "another"])
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(one, range(60)))
    for kind, result in results:
        if kind == "bad":
            assert isinstance(result, InferenceServerException)
            assert result.status() == "StatusCode.INVALID_ARGUMENT"
        else:
            assert not isinstance(result, InferenceServerException), result
            assert result[0].shape == (2, DIM)


def test_one_bad_text_fails_its_whole_request(grpc_client):
    """KServe v2 norm: one response status per request, so one bad text fails the request."""
    assert_invalid(call(grpc_client, ["good", "also good", ""]), "text 2 is empty")
