"""The tokenizer step with the real all-MiniLM-L6-v2 tokenizer, checked against transformers."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from triton_embed.options import RequestOptions, Truncation
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import (
    EmbedServingError,
    EmptyTextError,
    InvalidArgumentError,
    InvalidUtf8Error,
    TooLongError,
    TooMuchWorkError,
)
from triton_embed_server.steps.tokenization import (
    TextRequest,
    TextTokenizer,
    Tokenized,
    decode_text,
    parse_request_options,
)

CLS, SEP = 101, 102
MAX = 256

SHORT = "The quick brown fox jumps over the lazy dog."
AT_LIMIT = "hello " * (MAX - 2)  # 254 one-token words + [CLS] + [SEP] = 256 tokens
ONE_OVER = "hello " * (MAX - 1)  # 257 tokens
# Distinct tokens everywhere, so START and END truncation give different IDs.
LONG = " ".join(f"item {i} is number {i * 7}" for i in range(200))


@pytest.fixture(scope="module")
def config() -> TokenizerConfig:
    return TokenizerConfig.from_model_config({"parameters": {}})


@pytest.fixture(scope="module")
def tok(config) -> TextTokenizer:
    return TextTokenizer(config)


@pytest.fixture(scope="module")
def hf(config):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(config.model_path))


@pytest.fixture(scope="module")
def hf_left(config):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(config.model_path), truncation_side="left")


@pytest.fixture(scope="module")
def small_chars_tok(tok) -> TextTokenizer:
    cfg = TokenizerConfig.from_model_config({"parameters": {"max_chars": {"string_value": "50"}}})
    assert cfg.max_chars == 50
    return TextTokenizer(cfg)


def one(tok: TextTokenizer, texts, **kw) -> Tokenized | EmbedServingError:
    payloads = [t.encode("utf-8") if isinstance(t, str) else t for t in texts]
    [result] = tok.tokenize_requests([TextRequest(payloads, RequestOptions(**kw))])
    return result


def hf_untruncated_count(hf, text: str) -> int:
    return len(hf(text, truncation=False, verbose=False)["input_ids"])


# --- the tokenizer itself ----------------------------------------------------------------


def test_tokenizer_basics(tok, config):
    assert config.max_length == MAX
    assert tok.prefix == [CLS]
    assert tok.suffix == [SEP]
    assert tok.body_budget == MAX - 2
    assert tok.vocab_size == 30522


# --- agreement with transformers ---------------------------------------------------------


@pytest.mark.parametrize(
    "text", [SHORT, AT_LIMIT, ONE_OVER, LONG], ids=["short", "at", "over1", "long"]
)
def test_end_truncation_matches_hf(tok, hf, text):
    result = one(tok, [text], truncation=Truncation.END)
    assert isinstance(result, Tokenized)
    expected = hf(text, truncation=True, max_length=MAX)["input_ids"]
    assert result.token_ids == [expected]
    assert result.num_tokens == [len(expected)]
    assert result.num_input_tokens == [hf_untruncated_count(hf, text)]


@pytest.mark.parametrize(
    "text", [SHORT, AT_LIMIT, ONE_OVER, LONG], ids=["short", "at", "over1", "long"]
)
def test_start_truncation_matches_hf_left(tok, hf, hf_left, text):
    result = one(tok, [text], truncation=Truncation.START)
    assert isinstance(result, Tokenized)
    expected = hf_left(text, truncation=True, max_length=MAX)["input_ids"]
    assert result.token_ids == [expected]
    assert result.num_input_tokens == [hf_untruncated_count(hf, text)]


def test_start_and_end_differ_on_long_text(tok):
    end = one(tok, [LONG], truncation=Truncation.END)
    start = one(tok, [LONG], truncation=Truncation.START)
    assert len(end.token_ids[0]) == len(start.token_ids[0]) == MAX
    assert end.token_ids[0][0] == start.token_ids[0][0] == CLS
    assert end.token_ids[0][-1] == start.token_ids[0][-1] == SEP
    assert end.token_ids[0] != start.token_ids[0]


def test_server_default_truncation_is_end(tok, hf):
    result = one(tok, [LONG])
    assert result.token_ids == [hf(LONG, truncation=True, max_length=MAX)["input_ids"]]


def test_batch_of_texts_matches_hf_one_by_one(tok, hf):
    texts = [SHORT, "", "Ünïcödé façade — naïve café", "日本語のテキスト", AT_LIMIT, LONG, "x"]
    result = one(tok, texts, allow_empty=True)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(t, truncation=True, max_length=MAX)["input_ids"] for t in texts]
    assert result.num_input_tokens == [hf_untruncated_count(hf, t) for t in texts]
    assert result.num_tokens == [min(n, MAX) for n in result.num_input_tokens]


# --- truncation NONE ---------------------------------------------------------------------


def test_none_accepts_text_exactly_at_limit(tok, hf):
    result = one(tok, [AT_LIMIT], truncation=Truncation.NONE)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(AT_LIMIT)["input_ids"]]
    assert result.num_tokens == [MAX]


def test_none_rejects_over_long_text(tok):
    result = one(tok, [SHORT, SHORT, ONE_OVER], truncation=Truncation.NONE)
    assert isinstance(result, TooLongError)
    msg = str(result)
    assert msg.startswith("text 2 has 257 tokens; the model accepts 256")


def test_none_rejects_long_text_count(tok, hf):
    result = one(tok, [LONG], truncation=Truncation.NONE)
    assert isinstance(result, TooLongError)
    assert f"text 0 has {hf_untruncated_count(hf, LONG)} tokens" in str(result)
    assert "256" in str(result)


# --- empty texts -------------------------------------------------------------------------


def test_empty_text_rejected_by_default(tok):
    result = one(tok, [SHORT, ""])
    assert isinstance(result, EmptyTextError)
    assert str(result).startswith("text 1 is empty")
    assert "allow_empty" in str(result)


def test_empty_text_allowed_per_request(tok):
    result = one(tok, [""], allow_empty=True)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [[CLS, SEP]]
    assert result.num_tokens == [2]
    assert result.num_input_tokens == [2]


def test_allow_empty_false_overrides_server_default(tok, config):
    permissive = copy.copy(tok)  # shares the loaded backend
    permissive.config = replace(config, allow_empty=True)
    assert isinstance(one(permissive, [""]), Tokenized)
    assert isinstance(one(permissive, [""], allow_empty=False), EmptyTextError)


def test_whitespace_only_text_is_not_empty(tok):
    result = one(tok, ["   \t "])
    assert isinstance(result, Tokenized)
    assert result.token_ids == [[CLS, SEP]]


# --- UTF-8 -------------------------------------------------------------------------------


def test_invalid_utf8_names_index_and_offset(tok):
    result = one(tok, [b"fine", b"ok\xff"])
    assert isinstance(result, InvalidUtf8Error)
    msg = str(result)
    assert msg.startswith("text 1 is not valid UTF-8: byte 0xff at byte offset 2")


def test_truncated_multibyte_sequence(tok):
    result = one(tok, ["caf\u00e9".encode()[:-1]])
    assert isinstance(result, InvalidUtf8Error)
    assert "byte 0xc3 at byte offset 3" in str(result)


def test_decode_text_direct():
    assert decode_text(b"caf\xc3\xa9", 0) == "caf\u00e9"
    with pytest.raises(InvalidUtf8Error) as info:
        decode_text(b"ok\xff", 7)
    assert "text 7" in str(info.value)
    assert "byte offset 2" in str(info.value)


def test_nul_and_control_characters_pass_through(tok, hf):
    assert decode_text(b"a\x00b", 0) == "a\x00b"
    assert "\x00" in decode_text(b"a\x00b", 0)
    assert decode_text(b"\x01\x07tab\there\x1b", 0) == "\x01\x07tab\there\x1b"
    texts = ["a\x00b", "\x01\x07tab\there\x1b", "\x00"]
    result = one(tok, texts)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(t)["input_ids"] for t in texts]


# --- per-request isolation ---------------------------------------------------------------


def test_bad_request_fails_only_itself(tok, hf, hf_left):
    good1 = TextRequest([SHORT.encode(), b"second text"])
    bad_utf8 = TextRequest([b"fine", b"ok\xff"])
    good2 = TextRequest([LONG.encode()], RequestOptions(truncation=Truncation.START))
    empty = TextRequest([b""])
    too_long = TextRequest(
        [SHORT.encode(), ONE_OVER.encode()], RequestOptions(truncation=Truncation.NONE)
    )
    good3 = TextRequest([b"last one", b""], RequestOptions(allow_empty=True))
    results = tok.tokenize_requests([good1, bad_utf8, good2, empty, too_long, good3])
    assert len(results) == 6
    assert isinstance(results[0], Tokenized)
    assert results[0].token_ids == [hf(SHORT)["input_ids"], hf("second text")["input_ids"]]
    assert isinstance(results[1], InvalidUtf8Error)
    assert str(results[1]).startswith("text 1 ")
    assert isinstance(results[2], Tokenized)
    assert results[2].token_ids == [hf_left(LONG, truncation=True, max_length=MAX)["input_ids"]]
    assert isinstance(results[3], EmptyTextError)
    assert str(results[3]).startswith("text 0 ")
    assert isinstance(results[4], TooLongError)
    assert str(results[4]).startswith("text 1 has 257 tokens")
    assert isinstance(results[5], Tokenized)
    assert results[5].token_ids == [hf("last one")["input_ids"], [CLS, SEP]]


def test_no_requests(tok):
    assert tok.tokenize_requests([]) == []


def test_only_bad_requests(tok):
    results = tok.tokenize_requests([TextRequest([b""]), TextRequest([b"\xc0"])])
    assert [type(r) for r in results] == [EmptyTextError, InvalidUtf8Error]


def test_request_with_no_texts(tok):
    results = tok.tokenize_requests([TextRequest([]), TextRequest([b"hi"])])
    assert results[0] == Tokenized([], [], [])
    assert results[1].token_ids == [[CLS, 7632, SEP]]


# --- character cap -----------------------------------------------------------------------

CAPPED = "abc def ghi jkl mno pqr stu vwx yz " * 3  # 105 characters


def test_char_cap_none_rejects(small_chars_tok):
    result = one(small_chars_tok, [CAPPED], truncation=Truncation.NONE)
    assert isinstance(result, TooLongError)
    msg = str(result)
    assert msg.startswith(f"text 0 has {len(CAPPED)} characters, over the 50-character cap")
    assert "256 tokens" in msg


def test_char_cap_end_cuts_the_end(small_chars_tok, hf):
    result = one(small_chars_tok, [CAPPED], truncation=Truncation.END)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(CAPPED[:50])["input_ids"]]
    assert result.num_input_tokens == [hf_untruncated_count(hf, CAPPED[:50])]


def test_char_cap_start_keeps_the_end(small_chars_tok, hf):
    result = one(small_chars_tok, [CAPPED], truncation=Truncation.START)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(CAPPED[-50:])["input_ids"]]


def test_char_cap_exactly_at_cap_is_kept(small_chars_tok, hf):
    text = "x" * 49 + "y"
    result = one(small_chars_tok, [text], truncation=Truncation.NONE)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(text)["input_ids"]]


def test_char_cap_counts_characters_not_bytes(small_chars_tok, hf):
    text = "\u00e9" * 50  # 50 characters, 100 bytes
    result = one(small_chars_tok, [text], truncation=Truncation.NONE)
    assert isinstance(result, Tokenized)
    assert result.token_ids == [hf(text)["input_ids"]]


def test_small_max_length_truncates_like_hf(hf):
    small = TextTokenizer(
        TokenizerConfig.from_model_config({"parameters": {"max_length": {"string_value": "8"}}})
    )
    assert small.config.max_chars == 512
    assert small.body_budget == 6
    result = one(small, [LONG])
    assert result.token_ids == [hf(LONG, truncation=True, max_length=8)["input_ids"]]
    assert len(result.token_ids[0]) == 8


# --- request options ---------------------------------------------------------------------


def test_request_options_reach_the_tokenizer(tok, hf, hf_left):
    options = parse_request_options(
        {"truncation": "start", "allow_empty": "true", "invalid_utf8": "replace", "priority": 3}
    )
    result = tok.tokenize_requests([TextRequest([LONG.encode(), b"", b"ok\xff"], options)])[0]
    assert isinstance(result, Tokenized)
    assert result.token_ids[0] == hf_left(LONG, truncation=True, max_length=MAX)["input_ids"]
    assert result.token_ids[1] == [CLS, SEP]
    assert result.token_ids[2] == hf("ok\ufffd")["input_ids"]


def test_no_request_options_means_server_defaults(tok):
    assert parse_request_options({}) == RequestOptions()
    assert parse_request_options({"sequence_id": 7, "priority": 1}) == RequestOptions()
    assert parse_request_options({"triton_enable_empty_final_response": True}) == RequestOptions()
    results = tok.tokenize_requests([TextRequest([b""]), TextRequest([b"ok\xff"])])
    assert [type(r) for r in results] == [EmptyTextError, InvalidUtf8Error]


@pytest.mark.parametrize(
    "parameters, message",
    [
        (
            {"truncaton": "NONE", "lenght": 3},
            "request parameters 'lenght', 'truncaton' are not options of this service; "
            "the options are truncation, allow_empty, invalid_utf8, input_type, dimensions, "
            "embedding_type, normalize; "
            "remove them or fix their spelling",
        ),
        (
            {"truncaton": "NONE"},
            "request parameter 'truncaton' is not an option of this service; "
            "the options are truncation, allow_empty, invalid_utf8, input_type, dimensions, "
            "embedding_type, normalize; "
            "remove it or fix its spelling",
        ),
        (
            {"truncation": "MIDDLE"},
            "request parameter truncation='MIDDLE' is not one of NONE, END, START, CHUNK",
        ),
        ({"allow_empty": "maybe"}, "request parameter allow_empty='maybe' must be true or false"),
        ({"allow_empty": 2}, "request parameter allow_empty=2 must be true or false"),
        (
            {"invalid_utf8": "ignore"},
            "request parameter invalid_utf8='ignore' is not one of error, replace",
        ),
    ],
)
def test_bad_request_option_is_invalid_argument_naming_the_allowed_values(parameters, message):
    with pytest.raises(InvalidArgumentError) as info:
        parse_request_options(parameters)
    assert str(info.value) == message


# ---- the token budget per request (issue 20, item 5) ---------------------------------------


def test_the_default_token_budget_is_texts_x_max_length_x_max_chunks():
    cfg = TokenizerConfig.from_model_config({"max_batch_size": 64, "parameters": {}})
    assert cfg.max_request_tokens == min(64 * 256 * 16, 65_536)  # the stated cap binds
    one = TokenizerConfig.from_model_config({"max_batch_size": 1, "parameters": {}})
    assert one.max_request_tokens == 1 * 256 * 16


def test_a_request_over_the_token_budget_is_refused_before_the_engine():
    params = {"max_request_tokens": {"string_value": "1000"}}
    small = TextTokenizer(TokenizerConfig.from_model_config({"parameters": params}))
    fits = TextRequest(texts=[b"word " * 100] * 3)  # 3 x 102 tokens
    over = TextRequest(texts=[b"word " * 300] * 4, options=RequestOptions(truncation="CHUNK"))
    results = small.tokenize_requests([fits, over])
    assert sum(results[0].num_tokens) == 306
    assert isinstance(results[1], TooMuchWorkError)
    assert results[1].code == "INVALID_ARG"
    assert str(results[1]) == (
        "the request's 4 texts come to 1216 tokens, over the budget of 1000 tokens per "
        "request (the tokenizer's max_request_tokens; at most 256 tokens per text, 16 windows "
        "with truncation=CHUNK); send fewer or shorter texts per request, or truncation=END"
    )
