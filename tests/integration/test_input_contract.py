"""The input contract (README, "Input contract"): one test per rule, real server."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from triton_embed.codec import decode_embeddings, encode_token_ids, encode_windows
from tritonclient.utils import InferenceServerException

from tests.helpers import COSINE_MIN, DIM, MAX_LENGTH, NORM_RTOL, cosines, text_input

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


# ---- work bounds, bounded messages, normalize, cancellation (issue 20) --------------------
HUGE = "x" * 100_000


def step_counts(server, client, model):
    """(successful requests, execute calls) of ``model`` in Triton's statistics."""
    stats = client.get_inference_statistics(model, headers=server.admin_grpc_headers, as_json=True)
    (entry,) = stats["model_stats"]
    success = int(entry["inference_stats"].get("success", {}).get("count", 0))
    return success, int(entry.get("execution_count", 0))


def settled_counts(server, client, model, quiet_s=2.0, deadline_s=120.0):
    """``step_counts`` once they stopped changing for ``quiet_s`` (the server went idle)."""
    last, since, end = step_counts(server, client, model), time.monotonic(), time.monotonic()
    while time.monotonic() - end < deadline_s:
        time.sleep(0.25)
        now = step_counts(server, client, model)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
    raise AssertionError(f"{model} did not go idle within {deadline_s} s: {last}")


def windowed(n_windows, n_texts=1):
    """TOKEN_IDS and WINDOWS inputs: ``n_texts`` texts of ``n_windows`` full 256-ID windows."""
    ids = ([101] + [1000] * (MAX_LENGTH - 2) + [102]) * n_windows
    windows = [(MAX_LENGTH, 0, MAX_LENGTH - 2)] * n_windows
    tensors = []
    for name, payload in (
        ("TOKEN_IDS", encode_token_ids([ids])[0]),
        ("WINDOWS", encode_windows([windows])[0]),
    ):
        arr = np.empty((n_texts, 1), dtype=object)
        arr[:, 0] = [payload] * n_texts
        inp = grpcclient.InferInput(name, list(arr.shape), "BYTES")
        inp.set_data_from_numpy(arr)
        tensors.append(inp)
    return tensors


def infer_or_error(client, model, inputs, **kwargs):
    try:
        return client.infer(model, inputs, **kwargs)
    except InferenceServerException as exc:
        return exc


def test_embedder_refuses_more_windows_than_max_chunks_and_serves_its_batch(server):
    """The hostile request of issue 20: one 64 KiB text of 64 windows x 256 IDs, straight to
    ``embedder``, among good requests in the same dynamic batch."""
    good = encode_token_ids([[101, 7592, 102]])[0]

    def one(i):
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            t0 = time.monotonic()
            if i % 4 == 0:
                return "bad", infer_or_error(client, "embedder", windowed(64)), t0
            return "good", embedder_call(client, [good]), t0
        finally:
            client.close()

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = [(kind, r, time.monotonic() - t0) for kind, r, t0 in pool.map(one, range(16))]
    for kind, result, seconds in results:
        if kind == "bad":
            assert_invalid(
                result, "text 0 has 64 windows, over the limit of 16 per text", "max_chunks"
            )
            assert seconds < 5, seconds  # refused before the engine (it took 5-6 s)
        else:
            assert not isinstance(result, InferenceServerException), result
            assert result.shape == (1, DIM)
    assert_still_serving(server, grpcclient.InferenceServerClient(server.grpc_url))


def embedder_outcomes(server):
    """(requests the embedder step embedded, refused as too_much_work, answered CANCELLED,
    tokens embedded), from its own metrics once they are flushed."""
    from triton_embed_server.steps.metrics import REPORT_INTERVAL_S

    from tests.helpers import metric_sum

    time.sleep(REPORT_INTERVAL_S + 1)
    samples = server.metric_samples()
    failed = "triton_embed_requests_failed_total"
    return (
        metric_sum(samples, "triton_embed_requests_succeeded_total", model="embedder"),
        metric_sum(samples, failed, model="embedder", reason="too_much_work"),
        metric_sum(samples, failed, model="embedder", reason="cancelled"),
        metric_sum(samples, "triton_embed_tokens_total", model="embedder"),
    )


def test_embedder_refuses_a_request_over_its_token_budget(server, grpc_client):
    """17 texts x 16 windows x 256 IDs = 69,632 token IDs, over the 65,536 per request."""
    before = embedder_outcomes(server)
    result = infer_or_error(grpc_client, "embedder", windowed(16, n_texts=17))
    assert_invalid(
        result,
        "the request has 69632 token IDs, over the embedder's budget of 65536 per request",
        "max_request_tokens",
    )
    after = embedder_outcomes(server)
    assert (after[0] - before[0], after[1] - before[1]) == (0, 1)  # refused, nothing embedded
    assert not isinstance(infer_or_error(grpc_client, "embedder", windowed(16, 16)), Exception)
    assert_still_serving(server, grpc_client)


def test_ensemble_request_over_the_token_budget_is_refused_before_the_engine(server, grpc_client):
    """64 texts of 1,100 words with CHUNK: 5 windows each, 71,168 tokens > 65,536."""
    texts = [f"text {i} " + "word " * 1_100 for i in range(64)]
    before = settled_counts(server, grpc_client, "embedder")
    result = call(grpc_client, texts, truncation="CHUNK")
    assert_invalid(
        result,
        "the request's 64 texts come to 71168 tokens",
        "over the budget of 65536 tokens per request (the tokenizer's max_request_tokens",
        "send fewer or shorter texts per request",
    )
    assert step_counts(server, grpc_client, "embedder") == before  # no engine work at all
    vectors, _ = call(grpc_client, texts[:12], truncation="CHUNK")  # 13,344 tokens: served
    assert vectors.shape == (12, DIM)
    assert_still_serving(server, grpc_client)


@pytest.mark.parametrize(
    "parameters, fragment",
    [
        ({"truncation": HUGE}, "request parameter truncation='xxxx"),
        ({HUGE: "1"}, "is not an option of this service"),
        ({"input_type": HUGE}, "request parameter input_type='xxxx"),
        ({"normalize": HUGE}, "request parameter normalize='xxxx"),
    ],
)
def test_a_100000_character_value_is_invalid_argument_with_a_bounded_message(
    server, grpc_client, parameters, fragment
):
    """It was RESOURCE_EXHAUSTED: the full value in grpc-message overflowed gRPC's metadata."""
    result = call(grpc_client, ["hello"], **parameters)
    assert_invalid(result, fragment, "... (100000 characters)")
    assert len(result.message()) < 600, len(result.message())
    assert_still_serving(server, grpc_client)


def test_normalize_false_returns_the_pooled_vectors_without_the_normalize_module(
    grpc_client, reference_model
):
    """TEI's ``normalize``: false = the model's pooling without its Normalize module."""
    from sentence_transformers import SentenceTransformer

    texts = ["A short sentence.", "Another one, somewhat longer than the first one is.", "x"]
    pooled_only = SentenceTransformer(modules=[reference_model[0], reference_model[1]])
    expected = pooled_only.encode(texts)
    raw, _ = call(grpc_client, texts, normalize=False)
    assert cosines(raw, expected).min() >= COSINE_MIN
    np.testing.assert_allclose(
        np.linalg.norm(raw, axis=1), np.linalg.norm(expected, axis=1), rtol=NORM_RTOL
    )
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).min() > 0.1  # really not normalized
    default, _ = call(grpc_client, texts)
    normalized, _ = call(grpc_client, texts, normalize=True)
    assert np.array_equal(normalized, default)  # true is today's output, the default unchanged
    assert cosines(default, reference_model.encode(texts)).min() >= COSINE_MIN
    np.testing.assert_allclose(np.linalg.norm(default, axis=1), 1, rtol=1e-5)


def test_cancelled_requests_queued_at_the_embedder(server):
    """What Triton 2.51 does with requests cancelled while they wait for a busy embedder.

    Both embedder instances are busy; 3 ``embed`` requests (already through the tokenizer
    step, 5 tokens each) and 3 requests sent straight to ``embedder`` (50 token IDs each)
    wait behind them; their clients cancel all 6. Usually the direct ones are never embedded
    (the dynamic batcher drops them, or the step's ``request.is_cancelled()`` answers
    CANCELLED), but in one loaded run all 6 were answered before the cancel; the ensemble's
    ones are embedded in some runs and dropped in others (seen: 3 of 3, 0 of 3): 2.51 checks a
    cancelled ensemble request between its steps, and whether its composing request already
    queued at the embedder is dropped is a race. So the test holds each request to one answer
    and the step's counts to what was embedded, and prints which way each went.
    """
    client = grpcclient.InferenceServerClient(server.grpc_url)
    settled_counts(server, client, "embedder")
    before = embedder_outcomes(server)
    answers = []

    def answered(result, error):
        answers.append(error)

    with ThreadPoolExecutor(max_workers=2) as pool:
        t0 = time.monotonic()

        def busy_call():
            result = infer_or_error(
                grpcclient.InferenceServerClient(server.grpc_url), "embedder", windowed(16, 16)
            )
            return result, time.monotonic() - t0

        busy = [pool.submit(busy_call) for _ in range(2)]  # 65,536 tokens each
        time.sleep(0.5)
        fifty = encode_token_ids([[101] + [7592] * 48 + [102]])[0]
        arr = np.empty((1, 1), dtype=object)
        arr[0, 0] = fifty
        direct = grpcclient.InferInput("TOKEN_IDS", [1, 1], "BYTES")
        direct.set_data_from_numpy(arr)
        queued = [
            client.async_infer("embed", [text_input([f"queued {i}"])], answered) for i in range(3)
        ] + [client.async_infer("embedder", [direct], answered) for _ in range(3)]
        time.sleep(1.0)  # tokenized at once, now waiting for an embedder instance
        for context in queued:
            context.cancel()
        cancelled_at = time.monotonic() - t0
        done = [f.result() for f in busy]
    assert all(not isinstance(r, Exception) for r, _ in done)
    assert min(s for _, s in done) > cancelled_at + 0.5, (cancelled_at, done)  # still busy
    settled_counts(server, client, "embedder")
    after = embedder_outcomes(server)
    embedded, cancelled = after[0] - before[0], after[2] - before[2]
    tokens = after[3] - before[3] - 2 * 16 * 16 * MAX_LENGTH  # beyond the two busy requests
    ensemble, direct = tokens % 50 // 5, tokens // 50  # 5 tokens each, 50 tokens each
    print(f"embedded {embedded}: 2 busy, {ensemble} of the 3 cancelled ensemble requests, "
          f"{direct} of the 3 direct ones; {cancelled} answered CANCELLED by the step")  # fmt: skip
    assert len(answers) == 6, answers
    # Each request is answered once: CANCELLED, or (when its answer came back before the
    # cancel reached it) embedded; the step's counts add up to exactly what was embedded.
    assert all(e is None or e.status() == "StatusCode.CANCELLED" for e in answers), answers
    assert embedded == 2 + ensemble + direct and tokens == 5 * ensemble + 50 * direct
    assert sum(e is None for e in answers) <= ensemble + direct, answers
    assert_still_serving(server, client)


def test_the_client_cancels_on_timeout_and_sends_no_more_pieces(server):
    """16 pieces of 64 x 256 tokens, 0.5 s deadline: at most the 4 in flight are computed.

    The deadline is shorter than one piece's engine time (16,384 tokens: 0.8 s at bfloat16
    on an AMX core, the fastest host measured; at 1 s one piece finished there and the
    client rightly sent a fifth), so no piece ends before it.
    """
    from triton_embed import EmbeddingClient
    from triton_embed.errors import EmbedTimeoutError

    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    texts = [f"piece text {i} " + "word " * 300 for i in range(16 * 64)]
    before = settled_counts(server, grpc, "embedder")
    tokenized_before = settled_counts(server, grpc, "tokenizer")
    with EmbeddingClient(
        server.grpc_url, timeout_s=0.5, max_concurrency=4, batch_size=64, retry=None
    ) as client:
        t0 = time.monotonic()
        with pytest.raises(EmbedTimeoutError, match="timed out"):
            client.embed(texts)
        assert time.monotonic() - t0 < 10  # raised at the deadline, not after all 16 pieces
    after = settled_counts(server, grpc, "embedder")
    tokenized = settled_counts(server, grpc, "tokenizer")[0] - tokenized_before[0]
    assert tokenized <= 4 and after[0] - before[0] <= 4, (tokenized, before, after)
    assert_still_serving(server, grpc)
