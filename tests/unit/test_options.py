"""Request options: bounded quotes of offending values, the ``normalize`` option."""

from __future__ import annotations

import argparse

import pytest
from triton_embed.options import OptionError, RequestOptions
from triton_embed.quoting import QUOTE_CHARS, quote

HUGE = "x" * 100_000


def test_quote_keeps_short_values_and_cuts_long_ones_naming_their_length():
    assert quote("END") == "'END'"
    assert quote(7) == "7"
    assert quote(HUGE) == "'" + "x" * (QUOTE_CHARS - 1) + "... (100000 characters)"
    assert len(quote(b"\x00" * 10_000)) < 100


@pytest.mark.parametrize(
    "parameters",
    [
        {"truncation": HUGE},
        {"allow_empty": HUGE},
        {"invalid_utf8": HUGE},
        {"input_type": " " * 100_000},
        {"dimensions": HUGE},
        {"embedding_type": HUGE},
        {"normalize": HUGE},
        {HUGE: "1"},
        {f"{HUGE}{i}": "1" for i in range(100)},  # 100 long unknown names
    ],
)
def test_a_100000_character_value_or_name_is_quoted_as_a_bounded_prefix(parameters):
    with pytest.raises(ValueError) as info:
        RequestOptions.from_parameters(parameters)
    message = str(info.value)
    assert len(message) < 500, message  # gRPC carries it in an 8 KiB metadata budget
    assert message.startswith("request parameter")


def test_normalize_is_a_flag_sent_only_when_set():
    assert RequestOptions.from_parameters({"normalize": False}).normalize is False
    assert RequestOptions.from_parameters({"normalize": "TRUE"}).normalize is True
    assert RequestOptions(normalize=False).to_parameters() == {"normalize": False}
    assert "normalize" not in RequestOptions().to_parameters()
    with pytest.raises(ValueError, match="normalize='maybe' must be true or false"):
        RequestOptions.from_parameters({"normalize": "maybe"})


def test_from_args_reads_the_option_flags_and_no_other_attribute():
    args = argparse.Namespace(
        truncation="START",
        allow_empty=True,
        input_type="query",
        dimensions=64,
        embedding_type="ubinary",
        normalize=False,
        url="h:1",
        model="m",
    )
    options = RequestOptions.from_args(args, input_type_default="document")
    assert options == RequestOptions("START", True, None, "query", 64, "ubinary", False)
    assert options.to_parameters() == {
        "truncation": "START",
        "allow_empty": True,
        "input_type": "query",
        "dimensions": 64,
        "embedding_type": "ubinary",
        "normalize": False,
    }


def test_from_args_leaves_unset_and_missing_flags_unset_but_for_the_input_type_default():
    none = argparse.Namespace(truncation=None, allow_empty=None, input_type=None, normalize=None)
    assert RequestOptions.from_args(none) == RequestOptions()  # no dimensions, embedding_type
    assert RequestOptions.from_args(none, "document") == RequestOptions(input_type="document")
    assert RequestOptions.from_args(argparse.Namespace(), "document").to_parameters() == {
        "input_type": "document"
    }


@pytest.mark.parametrize("input_type", ["", "  "])
def test_from_args_refuses_a_blank_input_type_naming_it(input_type):
    with pytest.raises(OptionError, match="input_type=.* must be a prompt name such as query"):
        RequestOptions.from_args(argparse.Namespace(input_type=input_type), "document")
