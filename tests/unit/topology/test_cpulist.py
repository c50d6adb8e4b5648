"""cpulist: the kernel's CPU list format, parsed and printed."""

from __future__ import annotations

import pytest
from triton_embed_server.host.topology.cpulist import (
    cpu_ranges_of,
    format_cpu_list,
    parse_cpu_list,
    parse_cpu_ranges,
)
from triton_embed_server.host.topology.errors import TopologyParseError


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("0,1") == [0, 1]
    assert parse_cpu_list("5") == [5]
    assert parse_cpu_list("") == []
    assert parse_cpu_list(" 0-1\n") == [0, 1]
    assert parse_cpu_list("48-49,0-1") == [48, 49, 0, 1]  # order printed
    assert parse_cpu_ranges("0-15,32-47") == ((0, 15), (32, 47))


@pytest.mark.parametrize(
    "bad", ["a", "0-", "-3", "3-1", "0-3,,4", "0..3", "0-3;4", "0-9999999", "8192"]
)
def test_parse_cpu_list_rejects(bad):
    with pytest.raises(TopologyParseError, match="CPU"):
        parse_cpu_list(bad, "test source")


def test_cpu_ranges_and_format():
    assert cpu_ranges_of([3, 0, 1, 2, 8, 10, 11]) == ((0, 3), (8, 8), (10, 11))
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"
    assert format_cpu_list([]) == ""
    assert format_cpu_list(parse_cpu_list("0-23,48-71")) == "0-23,48-71"
