"""A sparse model's request options (``triton_embed.sparse_options``): parsed once, errors named.

The tokenizer step of a sparse ensemble reads them (``kind`` ``sparse``), so a bad value
fails its request before any engine work; the embedding tokenizer still refuses ``top_k``.
"""

from __future__ import annotations

import math

import pytest
from triton_embed.options import InvalidUtf8, OptionError, RequestOptions, Truncation
from triton_embed.sparse_options import SPARSE_NAMES, SparseOptions
from triton_embed_server.steps.errors import InvalidArgumentError
from triton_embed_server.steps.tokenization import parse_request_options


def test_parameters_round_trip_with_their_types():
    options = SparseOptions.from_parameters(
        {
            "truncation": "start",
            "allow_empty": "yes",
            "invalid_utf8": "REPLACE",
            "input_type": " query ",
            "top_k": "12",
            "threshold": "0.25",
        }
    )
    assert options == SparseOptions(Truncation.START, True, InvalidUtf8.REPLACE, "query", 12, 0.25)
    assert isinstance(options.top_k, int) and isinstance(options.threshold, float)
    assert SparseOptions.from_parameters(options.to_parameters()) == options
    assert options.text_options() == RequestOptions(
        truncation="START", allow_empty=True, invalid_utf8="replace", input_type="query"
    )


def test_unset_options_are_not_sent_and_numbers_keep_their_type():
    assert SparseOptions().to_parameters() == {}
    assert SparseOptions(top_k=3, threshold=0).to_parameters() == {"top_k": 3, "threshold": 0.0}
    assert SparseOptions.from_parameters({"top_k": 7, "threshold": 1}).threshold == 1.0


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"top_k": "0"}, r"top_k='0' must be a whole number >= 1"),
        ({"top_k": -3}, r"top_k=-3 must be a whole number >= 1"),
        ({"top_k": "2.5"}, r"top_k='2.5' must be a whole number >= 1"),
        ({"top_k": True}, r"top_k=True must be a whole number >= 1"),
        ({"threshold": "-0.1"}, r"threshold='-0.1' must be a finite number >= 0"),
        ({"threshold": "nan"}, r"threshold='nan' must be a finite number >= 0"),
        ({"threshold": math.inf}, r"threshold=inf must be a finite number >= 0"),
        ({"threshold": "heavy"}, r"threshold='heavy' must be a finite number >= 0"),
        ({"threshold": False}, r"threshold=False must be a finite number >= 0"),
        ({"truncation": "CHUNK"}, r"truncation='CHUNK' is not offered for sparse models"),
        ({"truncation": "middle"}, r"truncation='middle' is not one of NONE, END, START, CHUNK"),
        ({"dimensions": "8"}, r"'dimensions' is not an option of this service; the options are"),
    ],
)
def test_a_bad_parameter_names_itself_and_what_is_allowed(parameters, message):
    with pytest.raises(ValueError, match=r"^request parameter.*" + message):
        SparseOptions.from_parameters(parameters)


def test_chunk_refusal_says_what_to_use():
    with pytest.raises(ValueError, match=r"use one of NONE, END, START$"):
        SparseOptions.from_parameters({"truncation": "chunk"})


def test_triton_reserved_parameters_are_left_alone():
    assert SparseOptions.from_parameters({"priority": 1, "triton_x": "y"}) == SparseOptions()


def test_a_bad_value_in_code_raises_option_error():
    with pytest.raises(OptionError):
        SparseOptions(top_k=0)


def test_the_tokenizer_step_reads_the_options_of_its_kind():
    sparse = parse_request_options({"top_k": 5, "truncation": "END"}, "sparse")
    assert sparse == RequestOptions(truncation="END")
    with pytest.raises(InvalidArgumentError, match="'top_k' is not an option"):
        parse_request_options({"top_k": 5})  # an embedding model's tokenizer
    with pytest.raises(InvalidArgumentError, match="truncation='CHUNK' is not offered"):
        parse_request_options({"truncation": "CHUNK"}, "sparse")
    with pytest.raises(InvalidArgumentError, match="'normalize' is not an option"):
        parse_request_options({"normalize": "true"}, "sparse")
    assert SPARSE_NAMES[-2:] == ("top_k", "threshold")
