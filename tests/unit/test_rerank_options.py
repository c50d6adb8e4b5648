"""A reranker's request options (``triton_embed.rerank_options``): parsed once, errors named."""

from __future__ import annotations

import pytest
from triton_embed.options import OptionError
from triton_embed.rerank_options import (
    MAX_INSTRUCTION_CHARS,
    PairOptions,
    PairTruncation,
)


def test_parameters_round_trip_with_their_types():
    options = PairOptions.from_parameters(
        {
            "truncation": "ONLY_SECOND",
            "raw_scores": "true",
            "max_document_tokens": "12",
            "instruction": "Find the answer",
            "invalid_utf8": "replace",
        }
    )
    assert options.truncation is PairTruncation.ONLY_SECOND
    assert options.raw_scores is True
    assert options.max_document_tokens == 12
    assert options.instruction == "Find the answer"
    assert PairOptions.from_parameters(options.to_parameters()) == options


def test_unset_options_are_not_sent():
    assert PairOptions().to_parameters() == {}
    assert PairOptions(raw_scores=False).to_parameters() == {"raw_scores": False}


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"truncation": "end"}, r"truncation='end' is not one of longest_first, only_second, none"),
        ({"raw_scores": "maybe"}, r"raw_scores='maybe' must be true or false"),
        ({"max_document_tokens": "0"}, r"max_document_tokens='0' must be a whole number >= 1"),
        ({"max_document_tokens": True}, r"max_document_tokens=True must be a whole number"),
        ({"instruction": ""}, r"instruction='' must be a non-empty text of at most 2048"),
        ({"instruction": "x" * (MAX_INSTRUCTION_CHARS + 1)}, r"\(2049 characters\) must be"),
        ({"top_n": "3"}, r"'top_n' is not an option of this service; the options are truncation"),
    ],
)
def test_a_bad_parameter_names_itself_and_what_is_allowed(parameters, message):
    with pytest.raises(ValueError, match=r"^request parameter.*" + message):
        PairOptions.from_parameters(parameters)


def test_triton_reserved_parameters_are_left_alone():
    assert PairOptions.from_parameters({"priority": 1, "triton_x": "y"}) == PairOptions()


def test_a_bad_value_in_code_raises_option_error():
    with pytest.raises(OptionError):
        PairOptions(truncation="sideways")
