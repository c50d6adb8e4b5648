"""nvidia_smi_p2p: ``nvidia-smi topo -p2p`` captures, folded directions and damaged matrices."""

from __future__ import annotations

import pytest
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.nvidia_smi_p2p import P2P_LEGEND, parse_p2p


def test_p2p_fields_one_by_one(p2p_name, capture, expected):
    want = expected(p2p_name)
    p2p = parse_p2p(capture(p2p_name), mode="r")
    assert list(p2p.gpus) == want["gpus"]
    assert p2p.status == want["status"]
    assert p2p.pairs == want["pairs"]
    assert p2p.all_ok == want["all_ok"]
    assert p2p.non_ok_pairs == want["non_ok_pairs"]
    assert p2p.legend == want["legend"]
    assert p2p.to_dict()["mode"] == want["mode"]


def test_p2p_folds_directions():
    text = (
        "        GPU0    GPU1    GPU2\n"
        " GPU0   X       OK      CNS\n"
        " GPU1   NS      X       OK\n"
        " GPU2   TNS     OK      X\n"
    )
    p2p = parse_p2p(text)
    assert p2p.pairs == {"GPU0-GPU1": "NS", "GPU0-GPU2": "CNS/TNS", "GPU1-GPU2": "OK"}
    assert p2p.non_ok_pairs == {"GPU0-GPU1": "NS", "GPU0-GPU2": "CNS/TNS"}
    assert p2p.all_ok is False
    assert p2p.to_dict()["mode"] is None


def test_h200_single_gpu_driver_580(h200_capture):
    p2p = parse_p2p(h200_capture("p2p.txt"), mode="w")
    assert p2p.to_dict() == {
        "mode": "w (P2P write)",
        "gpu_count": 1,
        "gpus": ["GPU0"],
        "status": {},
        "pairs": {},
        "all_ok": True,
        "non_ok_pairs": {},
        # the legend as printed: every code but DR (newer drivers), in the module's words
        "legend": {code: text for code, text in P2P_LEGEND.items() if code != "DR"},
    }


def test_p2p_given_topo_output(capture):
    with pytest.raises(TopologyParseError, match="holds more than GPU names"):
        parse_p2p(capture("topo_m_01.txt"))


def test_p2p_garbled(capture):
    text = capture("p2p_r_01.txt")
    with pytest.raises(TopologyParseError, match="rows are GPU0 GPU1 GPU2; truncated"):
        parse_p2p("\n".join(text.splitlines()[:4]))
    with pytest.raises(TopologyParseError, match="row GPU0 has 7 cells; expected 8"):
        parse_p2p(text.replace(" GPU0   X       OK", " GPU0   X", 1))
    with pytest.raises(TopologyParseError, match="unknown status 'ok'"):
        parse_p2p(text.replace("X       OK", "X       ok", 1))
