"""The input contract: arbitrary bytes, lengths and request options never crash the tokenizer
step, and the client sends the options the server reads."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton_embed.options import InvalidUtf8, RequestOptions, Truncation
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import (
    EmptyTextError,
    InvalidArgumentError,
    InvalidUtf8Error,
    TooLongError,
)
from triton_embed_server.steps.tokenization import (
    TextRequest,
    TextTokenizer,
    Tokenized,
    parse_request_options,
)


@pytest.fixture(scope="module")
def tokenizer():
    config = TokenizerConfig.from_model_config(
        {"parameters": {"max_chars": {"string_value": "2000"}}}
    )
    return TextTokenizer(config)


DOCUMENTED = (EmptyTextError, InvalidUtf8Error, TooLongError)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(st.binary(max_size=3000), min_size=1, max_size=4),
    truncation=st.sampled_from(list(Truncation)),
    allow_empty=st.booleans(),
    replace=st.booleans(),
)
def test_any_bytes_give_a_tokenization_or_a_documented_error(
    tokenizer, texts, truncation, allow_empty, replace
):
    options = RequestOptions(
        truncation, allow_empty, InvalidUtf8.REPLACE if replace else InvalidUtf8.ERROR
    )
    request = TextRequest(texts=texts, options=options)
    (result,) = tokenizer.tokenize_requests([request])
    if isinstance(result, Tokenized):
        assert len(result.token_ids) == len(texts)
        for ids in result.token_ids:
            assert 2 <= len(ids) <= 256
            assert ids[0] == 101 and ids[-1] == 102
            assert all(0 <= i < tokenizer.vocab_size for i in ids)
    else:
        assert isinstance(result, DOCUMENTED), repr(result)
        assert "text " in str(result)


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(words=st.integers(min_value=0, max_value=700))
def test_any_length_gives_a_vector_sized_input_or_too_long(tokenizer, words):
    text = ("word " * words).encode()
    (end,) = tokenizer.tokenize_requests(
        [TextRequest([text], RequestOptions(Truncation.END, allow_empty=True))]
    )
    assert end.num_tokens == [min(words + 2, 256)]
    (none,) = tokenizer.tokenize_requests(
        [TextRequest([text], RequestOptions(Truncation.NONE, allow_empty=True))]
    )
    if len(text) > 2000:  # this fixture's max_chars: rejected before tokenization
        assert isinstance(none, TooLongError) and f"has {len(text)} characters" in str(none)
    elif words + 2 > 256:
        assert isinstance(none, TooLongError) and f"has {words + 2} tokens" in str(none)
    else:
        assert none.num_tokens == [words + 2]


@given(
    st.dictionaries(
        st.sampled_from(["truncation", "allow_empty", "invalid_utf8", "priority", "truncaton"]),
        st.one_of(
            st.sampled_from(["NONE", "end", " Start ", "true", "FALSE", "1", "0", "Replace"]),
            st.text(max_size=8),
            st.booleans(),
            st.integers(),
        ),
    )
)
def test_request_options_parse_or_raise_invalid_argument(params):
    try:
        options = parse_request_options(params)
    except InvalidArgumentError as exc:
        assert str(exc).startswith("request parameter ")
        if "truncaton" in params:  # a misspelt option is refused, naming it and the options
            assert "'truncaton' is not an option" in str(exc)
            assert "truncation, allow_empty, invalid_utf8" in str(exc)
        else:
            assert any(f"request parameter {name}=" in str(exc) for name in params)
    else:
        assert "truncaton" not in params
        # Every option the request set is kept, normalized; the client sends it back as is.
        sent = options.to_parameters()
        assert set(sent) == set(params) - {"priority"}
        assert RequestOptions.from_parameters(sent) == options


def test_whitespace_runs_do_not_push_words_past_the_character_cap(tokenizer):
    text = (" " * 20000 + "the cat sat on the mat").encode()
    (result,) = tokenizer.tokenize_requests([TextRequest([text])])
    assert result.num_tokens == [8]  # [CLS] the cat sat on the mat [SEP]


# --- the same options on the client side -------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"truncation": "middle"}, "truncation='middle' is not one of NONE, END, START, CHUNK"),
        ({"invalid_utf8": "ignore"}, "invalid_utf8='ignore' is not one of error, replace"),
        ({"allow_empty": "maybe"}, "allow_empty='maybe' must be true or false"),
    ],
)
def test_client_refuses_a_bad_option_before_sending(kwargs, message):
    from triton_embed import EmbeddingClient, InvalidInputError

    with pytest.raises(InvalidInputError) as info:
        EmbeddingClient("127.0.0.1:1", **kwargs)  # nothing listens there: never reached
    assert str(info.value) == message


def test_client_sends_the_options_the_server_reads(monkeypatch):
    from triton_embed import EmbeddingClient

    monkeypatch.setattr(EmbeddingClient, "_server_max_batch_size", lambda self, model: 64)
    client = EmbeddingClient(
        "127.0.0.1:1", truncation="start", allow_empty=False, invalid_utf8="REPLACE"
    )
    assert client.parameters == {
        "truncation": "START",
        "allow_empty": False,
        "invalid_utf8": "replace",
    }
    assert parse_request_options(client.parameters) == RequestOptions(
        Truncation.START, False, InvalidUtf8.REPLACE
    )
    assert EmbeddingClient("127.0.0.1:1").parameters == {}  # server defaults apply
