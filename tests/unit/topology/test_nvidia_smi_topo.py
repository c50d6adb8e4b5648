"""nvidia_smi_topo: ``nvidia-smi topo -m`` captures, layouts and damaged matrices."""

from __future__ import annotations

import pytest
from triton_embed_server.host.topology.errors import TopologyParseError
from triton_embed_server.host.topology.nvidia_smi_topo import parse_topo_matrix

#: The affinity of the one GPU of the single-GPU captures: node 0, CPUs 0-15.
GPU0_ON_NODE_0_CPUS_0_15 = {
    "numa_node": 0,
    "cpu_affinity": "0-15",
    "cpu_ranges": [[0, 15]],
    "cpu_count": 16,
    "gpu_numa_id": "N/A",
}


def test_topo_fields_one_by_one(topo_m_name, capture, expected):
    want = expected(topo_m_name)
    topo = parse_topo_matrix(capture(topo_m_name))
    assert topo.gpu_count == want["gpu_count"]
    assert list(topo.gpus) == want["gpus"]
    assert list(topo.nics) == want["nics"]
    assert topo.nic_legend == want["nic_legend"]
    assert topo.links == want["links"]
    assert len(topo.links) == want["gpu_count"] * (want["gpu_count"] - 1) // 2
    assert topo.nvlink_pairs == want["nvlink_pairs"]
    assert topo.sys_pairs == want["sys_pairs"]
    assert topo.cross_numa_pairs == want["cross_numa_pairs"]
    assert topo.cpu_affinity_disjoint_pairs == want["cpu_affinity_disjoint_pairs"]
    assert {str(k): v for k, v in topo.numa_groups.items()} == want["numa_groups"]
    assert topo.gpu_nic_links == want["gpu_nic_links"]
    assert topo.nic_nic_links == want["nic_nic_links"]
    assert topo.separator == want["format"]["separator"]
    assert topo.ansi_escapes == want["format"]["ansi_escapes"]
    assert (topo.legend is not None) == want["format"]["legend_present"]
    assert (topo.nic_legend is not None) == want["format"]["nic_legend_present"]
    assert list(topo.affinity_columns) == want["format"]["affinity_columns"]
    for gpu, aff in want["gpu_affinity"].items():
        got = topo.gpu_affinity[gpu]
        assert got.numa_node == aff["numa_node"]
        assert got.cpu_affinity == aff["cpu_affinity"]
        assert [list(r) for r in got.cpu_ranges] == aff["cpu_ranges"]
        assert got.cpu_count == aff["cpu_count"]
        assert got.gpu_numa_id == aff.get("gpu_numa_id")
    # links are symmetric and link() answers in either order
    for key, label in topo.links.items():
        a, b = key.split("-")
        assert topo.link(a, b) == topo.link(b, a) == label


def test_topo_01_empty_field_before_gpu_numa_id_and_phb_pairs(capture):
    topo = parse_topo_matrix(capture("topo_m_01.txt"))
    assert topo.gpu_affinity["GPU7"].to_dict() == {
        "numa_node": 1,
        "cpu_affinity": "16-31,48-63",
        "cpu_ranges": [[16, 31], [48, 63]],
        "cpu_count": 32,
        "gpu_numa_id": "N/A",
    }
    assert topo.pairs_with(["PHB"]) == ["GPU1-GPU2", "GPU3-GPU4", "GPU6-GPU7"]
    assert topo.legend["NV#"] == "Connection traversing a bonded set of # NVLinks"
    assert topo.legend["SYS"].startswith(
        "Connection traversing PCIe as well as the SMP interconnect"
    )
    assert list(topo.legend) == ["X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV#"]


def test_topo_03_nvswitch_cross_numa_without_sys(capture):
    topo = parse_topo_matrix(capture("topo_m_03.txt"))
    assert topo.sys_pairs == []
    assert len(topo.cross_numa_pairs) == 16
    assert set(topo.nvlink_pairs.values()) == {18}
    assert topo.gpu_nic_links["GPU3-NIC0"] == "PIX"
    assert topo.gpu_nic_links["GPU7-NIC6"] == "PIX"
    assert topo.nic_legend["NIC9"] == "mlx5_9"
    assert topo.gpu_affinity["GPU4"].cpus[:2] == (64, 65)
    assert topo.gpu_affinity["GPU4"].cpu_count == 128


def test_topo_02_older_format_nic_names_in_header(capture):
    topo = parse_topo_matrix(capture("topo_m_02.txt"))
    assert topo.nics == ("mlx5_0", "mlx5_1")
    assert topo.nic_nic_links == {"mlx5_0-mlx5_1": "PIX"}
    assert topo.gpu_affinity["GPU0"].gpu_numa_id is None
    assert "gpu_numa_id" not in topo.gpu_affinity["GPU0"].to_dict()
    assert topo.legend is None


def test_topo_06_short_cpu_affinity_then_numa_and_gpu_numa_id(capture):
    topo = parse_topo_matrix(capture("topo_m_06.txt"))
    aff = topo.gpu_affinity["GPU2"]
    assert (aff.cpu_affinity, aff.numa_affinity, aff.numa_node, aff.gpu_numa_id) == (
        "32-63",
        "1",
        1,
        "N/A",
    )


def test_topo_07_no_leading_tab_ansi_header(capture):
    topo = parse_topo_matrix(capture("topo_m_07.txt"))
    assert topo.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert topo.links["GPU0-GPU1"] == "PIX"
    assert topo.ansi_escapes is True


def test_topo_crlf_and_single_gpu():
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\r\nGPU0\t X \t0-15\t0\t\tN/A\r\n"
    topo = parse_topo_matrix(text)
    assert topo.gpus == ("GPU0",)
    assert topo.links == {}
    assert topo.gpu_affinity["GPU0"].to_dict() == GPU0_ON_NODE_0_CPUS_0_15


def test_h200_single_gpu_driver_580(h200_capture):
    topo = parse_topo_matrix(h200_capture("topo_m.txt"))
    assert topo.gpus == ("GPU0",) and topo.nics == () and topo.links == {}
    assert topo.gpu_affinity["GPU0"].to_dict() == GPU0_ON_NODE_0_CPUS_0_15
    assert topo.ansi_escapes is True and topo.separator == "tab"
    assert list(topo.legend) == ["X", "SYS", "NODE", "PHB", "PXB", "PIX", "NV#"]


def test_topo_na_affinity_and_old_soc_label():
    text = (
        "        GPU0    GPU1    CPU Affinity\n"
        "GPU0     X      SOC     N/A\n"
        "GPU1    SOC      X      N/A\n"
    )
    topo = parse_topo_matrix(text)
    assert topo.sys_pairs == ["GPU0-GPU1"]
    assert topo.gpu_affinity["GPU0"].cpu_ranges == ()
    assert topo.gpu_affinity["GPU0"].numa_node is None
    assert topo.has_numa_affinity is False
    assert topo.cross_numa_pairs == []
    assert topo.cpu_affinity_disjoint_pairs == []


def test_topo_truncated_rows(capture):
    lines = capture("topo_m_05.txt").splitlines()
    text = "\n".join(lines[:3])  # header + GPU0 + GPU1 of 4 GPUs and 2 NICs
    with pytest.raises(TopologyParseError, match=r"header lists 6 devices .* truncated or garbled"):
        parse_topo_matrix(text)


def test_topo_truncated_line(capture):
    text = capture("topo_m_04.txt")
    cut = text[: text.index("GPU7  NV12") + 15]  # the last row, cut after two cells
    with pytest.raises(TopologyParseError, match=r"row GPU7 has 2 link cells; the header has 8"):
        parse_topo_matrix(cut)


def test_topo_unknown_label(capture):
    text = capture("topo_m_07.txt").replace("PIX", "QQQ", 1)
    with pytest.raises(
        TopologyParseError, match=r"row GPU0, column GPU1: unknown link label 'QQQ'"
    ):
        parse_topo_matrix(text)


def test_topo_shifted_columns_and_asymmetry(capture):
    text = capture("topo_m_07.txt")
    with pytest.raises(TopologyParseError, match="own column; expected 'X'"):
        parse_topo_matrix(text.replace("GPU1\tPIX\t X ", "GPU1\t X \tPIX", 1))
    with pytest.raises(
        TopologyParseError, match="not symmetric: GPU0->GPU1 is PIX but GPU1->GPU0 is NODE"
    ):
        parse_topo_matrix(text.replace("GPU1\tPIX", "GPU1\tNODE", 1))


def test_topo_extra_values_and_bad_affinity(capture):
    text = capture("topo_m_04.txt")
    with pytest.raises(TopologyParseError, match=r"row GPU0 has 3 values .* 2 affinity columns"):
        parse_topo_matrix(text.replace(" 0-23         0\n", " 0-23  0  7\n", 1))
    with pytest.raises(TopologyParseError, match=r"GPU0 CPU Affinity: cannot read CPU list '0-x'"):
        parse_topo_matrix(text.replace(" 0-23 ", " 0-x ", 1))
    with pytest.raises(TopologyParseError, match=r"GPU0 NUMA Affinity 'zero'"):
        parse_topo_matrix(text.replace(" 0-23         0\n", " 0-23         zero\n", 1))


def test_topo_given_p2p_output(capture):
    with pytest.raises(TopologyParseError, match="unknown link label 'OK'"):
        parse_topo_matrix(capture("p2p_r_01.txt"))
