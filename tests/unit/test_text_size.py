"""The tokenizer step's per-text size limit (issue 20 item 2): refused from the byte size alone."""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import pytest
from triton_embed.options import RequestOptions, Truncation
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import TextTooLargeError, TooLongError, to_triton_error
from triton_embed_server.steps.tokenization import (
    TextRequest,
    TextTokenizer,
    Tokenized,
    check_text_size,
    max_text_bytes,
)


def _config(**params: str) -> TokenizerConfig:
    return TokenizerConfig.from_model_config(
        {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    )


@pytest.fixture(scope="module")
def small() -> TextTokenizer:
    """max_chars=50, max_chunks=2: at most 4 x 50 x 2 = 400 bytes per text."""
    return TextTokenizer(_config(max_chars="50", max_chunks="2"))


def _one(tok, texts, **options):
    [result] = tok.tokenize_requests([TextRequest(texts, RequestOptions(**options))])
    return result


def test_the_limit_is_four_bytes_per_character_of_the_chunk_cap():
    shipped = _config()
    assert (shipped.max_chars, shipped.max_chunks) == (16384, 16)
    assert max_text_bytes(shipped) == 4 * 16384 * 16 == 1 << 20
    assert max_text_bytes(_config(max_chars="50", max_chunks="2")) == 400


@pytest.mark.parametrize("truncation", list(Truncation))
def test_a_text_one_byte_over_is_refused_in_every_truncation_mode(small, truncation):
    result = _one(small, [b"fine", b"x" * 401], truncation=truncation)
    assert isinstance(result, TextTooLargeError) and isinstance(result, TooLongError)
    assert str(result) == (
        "text 1 is 401 bytes, over the limit of 400 bytes per text (4 bytes per character x "
        "max_chars=50 x max_chunks=2: the longest text truncation=CHUNK accepts); split it "
        "into texts under the limit, or send only the part to embed"
    )
    assert result.reason == "too_long"
    pb = SimpleNamespace(
        TritonError=type(
            "TritonError",
            (),
            {
                "INVALID_ARG": 3,
                "INTERNAL": 13,
                "__init__": lambda s, m, c: vars(s).update(m=m, c=c),
            },
        )
    )
    assert to_triton_error(result, pb).c == 3


def test_texts_at_the_limit_are_cut_or_chunked_as_before(small):
    at_limit = b"word " * 80  # 400 bytes, 400 characters
    end = _one(small, [at_limit], truncation=Truncation.END)
    assert isinstance(end, Tokenized) and end.num_input_tokens == [12]  # 50 chars: 10 words + 2
    four_byte = "\U0001f600".encode() * 100  # 400 bytes, 100 characters: the CHUNK cap
    chunk = _one(small, [four_byte], truncation=Truncation.CHUNK)
    assert isinstance(chunk, Tokenized)
    over_cap = _one(small, [b"w" * 101], truncation=Truncation.CHUNK)  # characters, not bytes
    assert isinstance(over_cap, TooLongError) and not isinstance(over_cap, TextTooLargeError)
    assert "101 characters, over the 100-character cap" in str(over_cap)


def test_the_size_is_checked_before_decoding_and_quotes_nothing(small):
    invalid = b"\xff" * 500  # invalid UTF-8: the size is what is refused
    result = _one(small, [invalid])
    assert isinstance(result, TextTooLargeError), result
    assert "\\xff" not in str(result) and "0xff" not in str(result)


def test_other_requests_of_the_call_are_served(small):
    ok, bad = small.tokenize_requests(
        [TextRequest([b"hello"]), TextRequest([b"hello", b"y" * 10_000])]
    )
    assert isinstance(ok, Tokenized) and ok.num_tokens == [3]
    assert isinstance(bad, TextTooLargeError) and str(bad).startswith("text 1 is 10000 bytes")
    assert len(str(bad)) < 300


def test_check_is_constant_time_on_a_100_mib_text():
    config = _config()
    huge = b"a" * (100 << 20)
    t0 = time.perf_counter()
    for _ in range(1000):
        with pytest.raises(TextTooLargeError) as info:
            check_text_size(huge, 0, config, max_text_bytes(config))
    assert time.perf_counter() - t0 < 0.5  # nothing decoded or copied: 1000 checks
    assert str(info.value).startswith(
        f"text 0 is {100 << 20} bytes, over the limit of 1048576 bytes per text"
    )
    check_text_size(b"a" * (1 << 20), 0, config, max_text_bytes(config))  # at the limit: fine


@pytest.mark.parametrize("kind", ["sparse", "multivector"])
def test_a_kind_without_chunk_is_not_told_to_use_it(kind):
    config = dataclasses.replace(_config(max_chars="50", max_chunks="2"), kind=kind)
    with pytest.raises(TextTooLargeError) as caught:
        check_text_size(b"x" * 401, 1, config, max_text_bytes(config))
    assert "CHUNK" not in str(caught.value)
    assert "max_chunks=2: the longest text this model's step reads" in str(caught.value)
