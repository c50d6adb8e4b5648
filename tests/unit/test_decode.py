"""Token IDs back to text (TEI's ``/decode``, issue 24): the step, the gateway route, the client.

The tokenizer step's decoder (:class:`~triton_embed_server.steps.detokenization.TokenDecoder`)
runs on the shipped model's real ``tokenizer.json`` (all-MiniLM-L6-v2, BERT WordPiece) and
must answer exactly what ``tokenizers.Tokenizer.decode`` (what TEI's ``/decode`` calls) and
``transformers``' ``decode(..., clean_up_tokenization_spaces=False)`` give for the same IDs;
bad IDs fail their own request, naming the sequence, the ID and the limit. The gateway's
route runs against ``DecodePool``, the gateway tests' upstream double whose tokenizer step
decodes with that same decoder (the KServe tensors encoded and decoded on the way).
"""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer
from triton_embed.codec import bytes_elements, encode_token_ids, frame_bytes
from triton_embed.decode_client import check_ids
from triton_embed.decode_options import DecodeOptions
from triton_embed.errors import InvalidInputError
from triton_embed_server.steps.detokenization import DecodeRequest, TokenDecoder
from triton_embed_server.steps.errors import InvalidTokenIdsError, TooMuchWorkError
from triton_embed_server.steps.tokenization import plain_backend
from tritonclient.utils import InferenceServerException

from tests.helpers import MODEL_PATH
from tests.unit.test_gateway_app import MODEL, FakeUpstreamPool, make_client, post

TOKENIZER = MODEL_PATH / "tokenizer.json"
TEXTS = ["The cat sat on the mat.", "Grüße aus Köln, naïve café!", "hybrid retrieval", ""]


@pytest.fixture(scope="module")
def backend() -> Tokenizer:
    return plain_backend(TOKENIZER)


@pytest.fixture(scope="module")
def decoder(backend) -> TokenDecoder:
    return TokenDecoder(backend, backend.get_vocab_size(with_added_tokens=True), 64)


def request(ids, skip=True) -> DecodeRequest:
    return DecodeRequest([bytes(e) for e in encode_token_ids(ids)], skip)


def test_decoding_is_the_tokenizers_own_and_transformers(decoder, backend):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(MODEL_PATH))
    ids = [backend.encode(t).ids for t in TEXTS]  # [CLS] ... [SEP]
    for skip in (True, False):
        got = decoder.decode(request(ids, skip))
        assert got == [backend.decode(i, skip_special_tokens=skip) for i in ids]
        assert got == [
            hf.decode(i, skip_special_tokens=skip, clean_up_tokenization_spaces=False) for i in ids
        ]
    assert decoder.decode(request(ids, False))[0].startswith("[CLS] the cat sat")
    assert decoder.decode(request([[], [2003], [4937]])) == ["", "is", "cat"]  # sparse indices


@pytest.mark.parametrize(
    "ids, message",
    [
        ([[101, 30522]], "sequence 0 has token ID 30522 at position 1, outside the vocabulary "
         "[0, 30522); send IDs from this model's tokenizer"),
        ([[5], [7, -1]], "sequence 1 has token ID -1 at position 1, outside the vocabulary"),
        ([[1] * 40, [2] * 25], "the request has 65 token IDs, over the tokenizer's budget of 64 "
         "per request (parameter max_request_tokens); send fewer IDs per request"),
    ],
)  # fmt: skip
def test_bad_ids_fail_their_request_alone(decoder, ids, message):
    good = request([[2003]])
    results = decoder.decode_requests([good, request(ids), good])
    assert results[0] == results[2] == ["is"]
    assert isinstance(results[1], (InvalidTokenIdsError, TooMuchWorkError))
    assert message in str(results[1]) and results[1].code == "INVALID_ARG"


def test_an_element_of_partial_int32_values_is_refused(decoder):
    with pytest.raises(
        InvalidTokenIdsError, match="sequence 1 is 5 bytes, not whole little-endian"
    ):
        decoder.decode(DecodeRequest([b"\x01\x00\x00\x00", b"\x01\x00\x00\x00\x00"]))


def test_the_option_takes_flags_and_refuses_the_rest():
    assert (
        DecodeOptions.from_parameters({"skip_special_tokens": "false"}).skips_special_tokens
        is False
    )
    assert DecodeOptions().skips_special_tokens
    with pytest.raises(ValueError, match="request parameter 'truncation' is not an option"):
        DecodeOptions.from_parameters({"truncation": "END"})


# --- the gateway's POST /decode -----------------------------------------------------------------


class DecodePool(FakeUpstreamPool):
    """``FakeUpstreamPool`` whose tokenizer step decodes ``DECODE_IDS`` as the real step does."""

    def __init__(self, decoder: TokenDecoder):
        super().__init__()
        self.decoder = decoder

    async def infer(self, model, inputs, outputs, parameters=None):
        if "DECODE_IDS" not in inputs:
            return await super().infer(model, inputs, outputs, parameters)
        elements = list(inputs["DECODE_IDS"])
        self.calls.append((model, len(elements), dict(parameters or {})))
        options = DecodeOptions.from_parameters(parameters or {})
        (result,) = self.decoder.decode_requests(
            [DecodeRequest([bytes(e) for e in elements], options.skips_special_tokens)]
        )
        if isinstance(result, Exception):
            raise InferenceServerException(str(result), status="StatusCode.INVALID_ARGUMENT")
        return {"DECODED": frame_bytes(t.encode() for t in result)}


@pytest.fixture
def gateway(decoder):
    test_client, pool, _ = make_client(DecodePool(decoder), max_request_tokens=100)
    return test_client, pool


def test_decode_answers_teis_list_of_strings(gateway, backend):
    c, pool = gateway
    ids = [backend.encode(t).ids for t in TEXTS[:3]]
    r = post(c, "/decode", {"ids": ids})
    assert r.status_code == 200, r.text
    assert r.json() == [backend.decode(i) for i in ids]
    assert pool.calls[-1] == ("tokenizer", 3, {"skip_special_tokens": True})
    r = post(c, "/decode", {"ids": ids[0], "skip_special_tokens": False, "model": "embed"})
    assert r.json() == [backend.decode(ids[0], skip_special_tokens=False)]  # one sequence


@pytest.mark.parametrize(
    "body, status, message",
    [
        ({"ids": []}, 400, "'ids' is required and must not be empty"),
        ({}, 400, "'ids' is required and must not be empty"),
        ({"ids": "101"}, 400, "'ids' must be a list of token IDs ([101, 2023]) or a list of"),
        ({"ids": [1, [2]]}, 400, "not a mix of IDs and lists"),
        ({"ids": [[1, 2.5]]}, 400, "ids[0][1] is 2.5, not a token ID: a whole number from 0 to "
         "2147483647 (the model's vocabulary, [0, vocab_size), is checked by its tokenizer)"),
        ({"ids": [[1], [True]]}, 400, "ids[1][0] is true, not a token ID"),
        ({"ids": [[-3]]}, 400, "ids[0][0] is -3, not a token ID"),
        ({"ids": [7, 1.5]}, 400, "ids[1] is 1.5, not a token ID"),  # one flat sequence
        ({"ids": ["7592"]}, 400, "ids[0] is '7592', not a token ID"),
        ({"ids": [[2**31]]}, 400, "ids[0][0] is 2147483648, not a token ID"),
        ({"ids": [[1]] * 2049}, 413, "'ids' holds 2049 sequences, over the limit of 2048 per "
         "request; send them in several requests"),
        ({"ids": [[1] * 60, [2] * 41]}, 413, "'ids' holds 101 token IDs, over the limit of 100 "
         "per request (the gateway's --max-request-tokens); send them in several requests"),
        ({"ids": [1], "skip_special_tokens": "yes"}, 400, "'skip_special_tokens' must be true "
         "or false"),
        ({"ids": [1], "extra": 1}, 400, "unknown field 'extra'"),
        ({"ids": [1], "model": "nope"}, 404, "the model 'nope' does not exist"),
    ],
)  # fmt: skip
def test_bad_requests_are_refused_before_any_upstream_call(gateway, body, status, message):
    c, pool = gateway
    r = post(c, "/decode", body)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]
    assert pool.calls == []


def test_an_id_outside_the_vocabulary_is_the_steps_400_naming_it(gateway):
    c, pool = gateway
    r = post(c, "/decode", {"ids": [[2003], [101, 40000]]})
    assert r.status_code == 400, r.text
    assert (
        "sequence 1 has token ID 40000 at position 1, outside the vocabulary [0, 30522)"
        in (r.json()["error"])
    )


def test_a_reranker_has_no_decoding_step(decoder):
    from triton_embed.transport.catalog import Catalog

    from tests.unit.gateway_fakes import rerank_info

    pool = DecodePool(decoder)
    pool.catalog = Catalog.build([MODEL, rerank_info(4, max_length=512)])
    c, _, _ = make_client(pool)
    r = post(c, "/decode", {"ids": [[1]], "model": "rerank"})
    assert r.status_code == 400, r.text
    assert r.json()["error"].startswith("the model 'rerank' is a reranker; /decode decodes")
    assert pool.calls == []


# --- the client's argument check ----------------------------------------------------------------


def test_the_clients_ids_are_lists_of_int32_ids():
    assert check_ids([[1, np.int64(2)], np.array([3], np.int32), []]) == [[1, 2], [3], []]
    for ids, message in [
        ([1, 2], "ids[0] is int, not a sequence of token IDs; pass one list per sequence"),
        ([[1], [2**31]], "ids[1][0] is 2147483648, outside 0 to 2147483647 (int32)"),
        ([[-1]], "ids[0][0] is -1, outside"),
        ([[1.0]], "ids[0][0] is 1.0, not a whole number"),
        ("101", "ids must be a sequence of token-ID sequences"),
    ]:
        with pytest.raises(InvalidInputError, match=None) as err:
            check_ids(ids)
        assert message in str(err.value)


def test_bytes_elements_round_trip_decoded_texts():
    texts = ["", "a\x00b", "日本"]
    assert [
        bytes(e).decode() for e in bytes_elements(frame_bytes(t.encode() for t in texts), 3)
    ] == texts


def test_the_tokenizer_config_declares_the_decode_tensors():
    from triton_embed.decode_options import DECODE_INPUT, DECODE_OUTPUT
    from triton_embed_server.models.instance_group import read_config_pbtxt

    from tests.helpers import REPO_ROOT

    config = read_config_pbtxt(REPO_ROOT / "model_repository" / "tokenizer" / "config.pbtxt")
    inputs = {i["name"]: i for i in config["input"]}
    assert inputs[DECODE_INPUT]["data_type"] == "TYPE_STRING" and inputs[DECODE_INPUT]["optional"]
    assert inputs["TEXT"]["optional"]  # the ensemble sends TEXT; a decode request does not
    assert DECODE_OUTPUT in {o["name"] for o in config["output"]}
