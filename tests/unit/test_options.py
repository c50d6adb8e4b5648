"""Request options: bounded quotes of offending values, the ``normalize`` option."""

from __future__ import annotations

import pytest
from triton_embed.options import QUOTE_CHARS, RequestOptions, quote

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
