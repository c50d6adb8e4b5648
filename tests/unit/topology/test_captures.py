"""Every capture in ``tests/data/topology`` against its ``expected_*.json``, and damaged.

Garbled, truncated, empty and foreign inputs must raise ``TopologyParseError`` with a message
naming the command, never another exception.
"""

from __future__ import annotations

import random

import pytest
from triton_embed_server.host.topology import (
    TopologyParseError,
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
)

# Keys of expected_*.json that describe the capture, not the output: no parser can give them.
NOT_FROM_OUTPUT = {"file", "command", "host", "notes", "sockets_known_from_context"}


def parse(name: str, text: str):
    if name.startswith("topo_m"):
        return parse_topo_matrix(text)
    if name.startswith("p2p_r"):
        return parse_p2p(text, mode="r")
    if name.startswith("lscpu"):
        return parse_lscpu(text)
    return parse_numactl(text)


def test_every_capture_has_a_test(captures_dir, capture_names):
    assert captures_dir.is_dir(), f"{captures_dir} is part of the repository"
    assert sorted(p.name for p in captures_dir.glob("*.txt")) == sorted(capture_names)
    assert sorted(p.name for p in captures_dir.glob("expected_*.json")) == sorted(
        f"expected_{name.removesuffix('.txt')}.json" for name in capture_names
    )


def test_capture_matches_expected_on_every_covered_field(capture_name, capture, expected):
    want = expected(capture_name)
    got = parse(capture_name, capture(capture_name)).to_dict()
    # Every other key the expected file gives must be produced: no silently skipped field.
    assert set(want) - set(got) <= NOT_FROM_OUTPUT
    for key in want.keys() - NOT_FROM_OUTPUT:
        assert got[key] == want[key], f"{capture_name}: {key}"


@pytest.mark.parametrize(
    "parser, command",
    [
        (parse_topo_matrix, "nvidia-smi topo -m"),
        (parse_p2p, "nvidia-smi topo -p2p"),
        (parse_lscpu, "lscpu"),
        (parse_numactl, "numactl --hardware"),
    ],
)
@pytest.mark.parametrize("text", ["", "   \n\n", "garbage here\nmore garbage\n", "\x00\x01\x02"])
def test_empty_or_garbage_raises(parser, command, text):
    with pytest.raises(TopologyParseError) as info:
        parser(text)
    assert str(info.value).startswith(command)
    assert "expected" in str(info.value)


def test_truncation_at_every_line_never_crashes(capture_name, capture):
    lines = capture(capture_name).splitlines(keepends=True)
    for cut in range(len(lines) + 1):
        try:
            parse(capture_name, "".join(lines[:cut]))
        except TopologyParseError:
            pass


def test_random_damage_never_crashes(capture_name, capture):
    text = capture(capture_name)
    rng = random.Random(capture_name)
    for _ in range(40):
        chars = list(text)
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(chars))
            chars[pos] = rng.choice(["", "\t", " ", "\n", "X", "-", ",", "9", ":", "\x1b[4m"])
        try:
            parse(capture_name, "".join(chars))
        except TopologyParseError:
            pass
