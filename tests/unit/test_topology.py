"""topology: parsers of nvidia-smi topo -m / -p2p, lscpu, numactl --hardware and sysfs.

Every real output in ``<repo>/../shared/fixtures/topology`` is parsed and compared with its
``expected_*.json`` on every field the parser covers; garbled, truncated, empty and foreign
inputs must raise ``TopologyParseError`` with a message naming the command; this machine's
own ``lscpu``, ``numactl --hardware`` and sysfs are read too.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from triton_embed_server.topology import (
    TopologyParseError,
    core_groups,
    cpu_ranges_of,
    format_cpu_list,
    infer_siblings,
    parse_cpu_list,
    parse_cpu_ranges,
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
    read_sysfs_cpu_siblings,
    read_sysfs_nodes,
)

FIXTURES = Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "topology"
# Keys of expected_*.json that describe the capture, not the output: no parser can give them.
NOT_FROM_OUTPUT = {"file", "command", "host", "notes", "sockets_known_from_context"}


def fixture_text(name: str) -> str:
    if not FIXTURES.is_dir():
        pytest.skip(f"topology fixtures not found at {FIXTURES} (shared/ is not beside the repo)")
    return (FIXTURES / name).read_text()


def expected(name: str) -> dict:
    return json.loads(fixture_text(f"expected_{Path(name).stem}.json"))


def parse_any(name: str):
    text = fixture_text(name)
    if name.startswith("topo_m"):
        return parse_topo_matrix(text)
    if name.startswith("p2p_r"):
        return parse_p2p(text, mode="r")
    if name.startswith("lscpu"):
        return parse_lscpu(text)
    return parse_numactl(text)


TOPO = [f"topo_m_0{i}.txt" for i in range(1, 8)]
P2P = ["p2p_r_01.txt", "p2p_r_02.txt"]
LSCPU = [f"lscpu_0{i}.txt" for i in range(1, 6)]
NUMACTL = [f"numactl_0{i}.txt" for i in range(1, 5)]
ALL = TOPO + P2P + LSCPU + NUMACTL


def test_every_fixture_has_a_test():
    if not FIXTURES.is_dir():
        pytest.skip(f"topology fixtures not found at {FIXTURES}")
    outputs = sorted(p.name for p in FIXTURES.glob("*.txt"))
    assert outputs == sorted(ALL)
    assert sorted(p.name for p in FIXTURES.glob("expected_*.json")) == sorted(
        f"expected_{Path(n).stem}.json" for n in ALL
    )


# --- every fixture against its expected_*.json -------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_fixture_matches_expected_on_every_covered_field(name):
    want = expected(name)
    got = parse_any(name).to_dict()
    covered = [k for k in want if k not in NOT_FROM_OUTPUT]
    # Every other key the expected file gives must be produced: no silently skipped field.
    assert set(want) - set(got) <= NOT_FROM_OUTPUT
    for key in covered:
        assert got[key] == want[key], f"{name}: {key}"


@pytest.mark.parametrize("name", TOPO)
def test_topo_fields_one_by_one(name):
    want = expected(name)
    topo = parse_topo_matrix(fixture_text(name))
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


def test_topo_01_empty_field_before_gpu_numa_id_and_phb_pairs():
    topo = parse_topo_matrix(fixture_text("topo_m_01.txt"))
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


def test_topo_03_nvswitch_cross_numa_without_sys():
    topo = parse_topo_matrix(fixture_text("topo_m_03.txt"))
    assert topo.sys_pairs == []
    assert len(topo.cross_numa_pairs) == 16
    assert set(topo.nvlink_pairs.values()) == {18}
    assert topo.gpu_nic_links["GPU3-NIC0"] == "PIX"
    assert topo.gpu_nic_links["GPU7-NIC6"] == "PIX"
    assert topo.nic_legend["NIC9"] == "mlx5_9"
    assert topo.gpu_affinity["GPU4"].cpus[:2] == (64, 65)
    assert topo.gpu_affinity["GPU4"].cpu_count == 128


def test_topo_02_older_format_nic_names_in_header():
    topo = parse_topo_matrix(fixture_text("topo_m_02.txt"))
    assert topo.nics == ("mlx5_0", "mlx5_1")
    assert topo.nic_nic_links == {"mlx5_0-mlx5_1": "PIX"}
    assert topo.gpu_affinity["GPU0"].gpu_numa_id is None
    assert "gpu_numa_id" not in topo.gpu_affinity["GPU0"].to_dict()
    assert topo.legend is None


def test_topo_06_short_cpu_affinity_then_numa_and_gpu_numa_id():
    topo = parse_topo_matrix(fixture_text("topo_m_06.txt"))
    aff = topo.gpu_affinity["GPU2"]
    assert (aff.cpu_affinity, aff.numa_affinity, aff.numa_node, aff.gpu_numa_id) == (
        "32-63",
        "1",
        1,
        "N/A",
    )


def test_topo_07_no_leading_tab_ansi_header():
    topo = parse_topo_matrix(fixture_text("topo_m_07.txt"))
    assert topo.gpus == ("GPU0", "GPU1", "GPU2", "GPU3")
    assert topo.links["GPU0-GPU1"] == "PIX"
    assert topo.ansi_escapes is True


def test_topo_crlf_and_single_gpu():
    text = "\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\r\nGPU0\t X \t0-15\t0\t\tN/A\r\n"
    topo = parse_topo_matrix(text)
    assert topo.gpus == ("GPU0",)
    assert topo.links == {}
    assert topo.gpu_affinity["GPU0"].to_dict() == {
        "numa_node": 0,
        "cpu_affinity": "0-15",
        "cpu_ranges": [[0, 15]],
        "cpu_count": 16,
        "gpu_numa_id": "N/A",
    }


# Captured from a lease machine (1x H200, driver 580.159.04) with LC_ALL=C; bytes as printed.
H200_TOPO_M = (
    "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \t0-15\t0\t\tN/A\n"
    "\nLegend:\n\n  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
H200_P2P_W = (
    " \t\x1b[4mGPU0\t\x1b[0m\n GPU0\tX\t\n\nLegend:\n\n  X    = Self\n  OK   = Status Ok\n"
    "  CNS  = Chipset not supported\n"
)


def test_real_single_gpu_driver_580_outputs():
    topo = parse_topo_matrix(H200_TOPO_M)
    assert topo.gpus == ("GPU0",) and topo.nics == () and topo.links == {}
    assert topo.gpu_affinity["GPU0"].to_dict() == {
        "numa_node": 0,
        "cpu_affinity": "0-15",
        "cpu_ranges": [[0, 15]],
        "cpu_count": 16,
        "gpu_numa_id": "N/A",
    }
    assert list(topo.legend) == ["X", "SYS", "NV#"]
    p2p = parse_p2p(H200_P2P_W, mode="w")
    assert p2p.to_dict() == {
        "mode": "w (P2P write)",
        "gpu_count": 1,
        "gpus": ["GPU0"],
        "status": {},
        "pairs": {},
        "all_ok": True,
        "non_ok_pairs": {},
        "legend": {"X": "Self", "OK": "Status Ok", "CNS": "Chipset not supported"},
    }


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


@pytest.mark.parametrize("name", P2P)
def test_p2p_fields_one_by_one(name):
    want = expected(name)
    p2p = parse_p2p(fixture_text(name), mode="r")
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


@pytest.mark.parametrize("name", LSCPU)
def test_lscpu_fields_one_by_one(name):
    want = expected(name)
    info = parse_lscpu(fixture_text(name))
    assert info.cpus == want["cpus"]
    assert info.online_cpus == want["online_cpus"]
    assert info.vendor_id == want["vendor_id"]
    assert info.model_name == want["model_name"]
    assert info.threads_per_core == want["threads_per_core"]
    assert info.cores_per_socket == want["cores_per_socket"]
    assert info.sockets == want["sockets"]
    assert info.numa_node_count == want["numa_node_count"]
    assert info.physical_cores_total == want["physical_cores_total"]
    for node, spec in want["numa_nodes"].items():
        assert info.numa_nodes[int(node)] == spec["cpu_list"]
        assert len(info.node_cpus(int(node))) == spec["cpu_count"]
    assert len(info.numa_nodes) == len(want["numa_nodes"])


def test_lscpu_01_wrapped_flags_do_not_become_keys():
    info = parse_lscpu(fixture_text("lscpu_01.txt"))
    # 'md_lbr_v2 ...' continuation lines hold no ':' and must not shadow any field
    assert info.model_name == "AMD EPYC 9374F 32-Core Processor"
    assert info.numa_nodes == {0: "0-31", 1: "32-63"}


@pytest.mark.parametrize("name", NUMACTL)
def test_numactl_fields_one_by_one(name):
    want = expected(name)
    numa = parse_numactl(fixture_text(name))
    assert numa.node_count == want["node_count"]
    assert numa.nodes_listed == want["nodes_listed"]
    for node, spec in want["nodes"].items():
        got = numa.nodes[int(node)]
        assert list(got.cpus) == spec["cpus"]
        assert got.size_mb == spec["size_mb"]
        assert got.free_mb == spec["free_mb"]
        assert [list(r) for r in cpu_ranges_of(got.cpus)] == spec["cpu_ranges"]
    assert list(numa.distance_nodes) == want["distance_nodes"]
    assert [list(r) for r in numa.distance_matrix] == want["distance_matrix"]
    assert {
        str(a): {str(b): d for b, d in row.items()} for a, row in numa.distances.items()
    } == want["distances"]
    d = numa.to_dict()
    for key in ("total_cpus", "total_size_mb", "total_free_mb", "local_distance", "max_distance"):
        assert d[key] == want[key]


def test_numactl_03_eight_nodes_npsx4():
    numa = parse_numactl(fixture_text("numactl_03.txt"))
    assert numa.distances[0] == {0: 10, 1: 12, 2: 12, 3: 12, 4: 32, 5: 32, 6: 32, 7: 32}
    assert numa.nodes[7].cpus[:2] == (112, 113)
    assert numa.nodes[7].size_mb == 64428


def test_numactl_memory_only_node():
    text = (
        "available: 2 nodes (0-1)\nnode 0 cpus: 0 1\nnode 0 size: 100 MB\nnode 0 free: 50 MB\n"
        "node 1 cpus:\nnode 1 size: 200 MB\nnode 1 free: 150 MB\n"
        "node distances:\nnode   0   1\n  0:  10  20\n  1:  20  10\n"
    )
    numa = parse_numactl(text)
    assert numa.nodes[1].cpus == ()
    assert numa.to_dict()["total_size_mb"] == 300
    assert numa.to_dict()["total_cpus"] == 2


# --- CPU lists ---------------------------------------------------------------------------


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


# --- unparseable input: one exception type, a message naming the command ----------------


@pytest.mark.parametrize(
    "parse, command",
    [
        (parse_topo_matrix, "nvidia-smi topo -m"),
        (parse_p2p, "nvidia-smi topo -p2p"),
        (parse_lscpu, "lscpu"),
        (parse_numactl, "numactl --hardware"),
    ],
)
@pytest.mark.parametrize("text", ["", "   \n\n", "garbage here\nmore garbage\n", "\x00\x01\x02"])
def test_empty_or_garbage_raises(parse, command, text):
    with pytest.raises(TopologyParseError) as info:
        parse(text)
    assert str(info.value).startswith(command)
    assert "expected" in str(info.value)


def test_topo_truncated_rows():
    lines = fixture_text("topo_m_05.txt").splitlines()
    text = "\n".join(lines[:3])  # header + GPU0 + GPU1 of 4 GPUs and 2 NICs
    with pytest.raises(TopologyParseError, match=r"header lists 6 devices .* truncated or garbled"):
        parse_topo_matrix(text)


def test_topo_truncated_line():
    text = fixture_text("topo_m_04.txt")
    cut = text[: text.index("GPU7  NV12") + 15]  # the last row, cut after two cells
    with pytest.raises(TopologyParseError, match=r"row GPU7 has 2 link cells; the header has 8"):
        parse_topo_matrix(cut)


def test_topo_unknown_label():
    text = fixture_text("topo_m_07.txt").replace("PIX", "QQQ", 1)
    with pytest.raises(
        TopologyParseError, match=r"row GPU0, column GPU1: unknown link label 'QQQ'"
    ):
        parse_topo_matrix(text)


def test_topo_shifted_columns_and_asymmetry():
    text = fixture_text("topo_m_07.txt")
    with pytest.raises(TopologyParseError, match="own column; expected 'X'"):
        parse_topo_matrix(text.replace("GPU1\tPIX\t X ", "GPU1\t X \tPIX", 1))
    with pytest.raises(
        TopologyParseError, match="not symmetric: GPU0->GPU1 is PIX but GPU1->GPU0 is NODE"
    ):
        parse_topo_matrix(text.replace("GPU1\tPIX", "GPU1\tNODE", 1))


def test_topo_extra_values_and_bad_affinity():
    text = fixture_text("topo_m_04.txt")
    with pytest.raises(TopologyParseError, match=r"row GPU0 has 3 values .* 2 affinity columns"):
        parse_topo_matrix(text.replace(" 0-23         0\n", " 0-23  0  7\n", 1))
    with pytest.raises(TopologyParseError, match=r"GPU0 CPU Affinity: cannot read CPU list '0-x'"):
        parse_topo_matrix(text.replace(" 0-23 ", " 0-x ", 1))
    with pytest.raises(TopologyParseError, match=r"GPU0 NUMA Affinity 'zero'"):
        parse_topo_matrix(text.replace(" 0-23         0\n", " 0-23         zero\n", 1))


def test_topo_given_p2p_output_and_p2p_given_topo_output():
    with pytest.raises(TopologyParseError, match="unknown link label 'OK'"):
        parse_topo_matrix(fixture_text("p2p_r_01.txt"))
    with pytest.raises(TopologyParseError, match="holds more than GPU names"):
        parse_p2p(fixture_text("topo_m_01.txt"))


def test_p2p_garbled():
    text = fixture_text("p2p_r_01.txt")
    with pytest.raises(TopologyParseError, match="rows are GPU0 GPU1 GPU2; truncated"):
        parse_p2p("\n".join(text.splitlines()[:4]))
    with pytest.raises(TopologyParseError, match="row GPU0 has 7 cells; expected 8"):
        parse_p2p(text.replace(" GPU0   X       OK", " GPU0   X", 1))
    with pytest.raises(TopologyParseError, match="unknown status 'ok'"):
        parse_p2p(text.replace("X       OK", "X       ok", 1))


def test_lscpu_garbled():
    with pytest.raises(TopologyParseError, match=r"no 'CPU\(s\):' line; .* LC_ALL=C"):
        parse_lscpu("Architecture: x86_64\nProzessoren: 4\n")
    with pytest.raises(TopologyParseError, match=r"'CPU\(s\): many': expected a whole number"):
        parse_lscpu("CPU(s): many\n")
    with pytest.raises(
        TopologyParseError, match=r"lscpu: NUMA node0 CPU\(s\): cannot read CPU list"
    ):
        parse_lscpu("CPU(s): 4\nNUMA node0 CPU(s): 0-x\n")


def test_numactl_garbled():
    text = fixture_text("numactl_01.txt")
    with pytest.raises(TopologyParseError, match="'available: 2 nodes' but 1 'node N cpus:' lines"):
        parse_numactl("\n".join(text.splitlines()[:4]))
    with pytest.raises(TopologyParseError, match="distance matrix is not square"):
        parse_numactl("\n".join(text.splitlines()[:-1]))
    with pytest.raises(TopologyParseError, match="expected CPU numbers separated by spaces"):
        parse_numactl(text.replace("cpus: 0 1 2", "cpus: 0 one 2"))
    with pytest.raises(TopologyParseError, match="No NUMA available on this system"):
        parse_numactl("No NUMA available on this system\n")


@pytest.mark.parametrize("name", ALL)
def test_truncation_at_every_line_never_crashes(name):
    lines = fixture_text(name).splitlines(keepends=True)
    for cut in range(len(lines) + 1):
        try:
            parse_any_text(name, "".join(lines[:cut]))
        except TopologyParseError:
            pass


@pytest.mark.parametrize("name", ALL)
def test_random_damage_never_crashes(name):
    text = fixture_text(name)
    rng = random.Random(name)
    for _ in range(40):
        chars = list(text)
        for _ in range(rng.randint(1, 6)):
            pos = rng.randrange(len(chars))
            chars[pos] = rng.choice(["", "\t", " ", "\n", "X", "-", ",", "9", ":", "\x1b[4m"])
        try:
            parse_any_text(name, "".join(chars))
        except TopologyParseError:
            pass


def parse_any_text(name: str, text: str):
    if name.startswith("topo_m"):
        return parse_topo_matrix(text)
    if name.startswith("p2p"):
        return parse_p2p(text)
    if name.startswith("lscpu"):
        return parse_lscpu(text)
    return parse_numactl(text)


# --- sysfs -------------------------------------------------------------------------------


def make_sysfs(root: Path, nodes: dict[int, str], distances: dict[int, str] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "online").write_text(f"0-{len(nodes) - 1}\n")
    (root / "possible").write_text("0-3\n")  # not a node folder
    for n, cpulist in nodes.items():
        folder = root / f"node{n}"
        folder.mkdir()
        (folder / "cpulist").write_text(cpulist + "\n")
        (folder / "meminfo").write_text(
            f"Node {n} MemTotal:       {2048 * (n + 1)} kB\nNode {n} MemFree:        1024 kB\n"
        )
        if distances is not None:
            (folder / "distance").write_text(distances[n] + "\n")
    return root


def test_read_sysfs_nodes_tree(tmp_path):
    root = make_sysfs(
        tmp_path / "node",
        {0: "0-3,8-11", 1: "4-7,12-15", 2: ""},
        {0: "10 21 30", 1: "21 10 30", 2: "30 30 10"},
    )
    numa = read_sysfs_nodes(root)
    assert numa.source == "sysfs"
    assert numa.nodes_listed == "0-2"
    assert numa.nodes[0].cpus == (0, 1, 2, 3, 8, 9, 10, 11)
    assert numa.nodes[1].cpus == (4, 5, 6, 7, 12, 13, 14, 15)
    assert numa.nodes[2].cpus == ()
    assert [n.size_mb for n in numa.nodes.values()] == [2, 4, 6]
    assert numa.nodes[0].free_mb == 1
    assert numa.distances[1] == {0: 21, 1: 10, 2: 30}


def test_read_sysfs_nodes_missing_or_bad(tmp_path):
    with pytest.raises(TopologyParseError, match="has no node<N> folders"):
        read_sysfs_nodes(tmp_path / "absent")
    root = make_sysfs(tmp_path / "bad", {0: "0-x"})
    with pytest.raises(TopologyParseError, match="cpulist"):
        read_sysfs_nodes(root)
    no_distance = read_sysfs_nodes(make_sysfs(tmp_path / "nodist", {0: "0-1"}))
    assert no_distance.distance_matrix == ()


# --- SMT siblings ------------------------------------------------------------------------


def make_cpu_sysfs(
    root: Path, siblings: dict[int, str | None], name: str = "thread_siblings_list"
) -> Path:
    """A fake /sys/devices/system/cpu: ``cpu<N>/topology/<name>`` per CPU (None: no topology)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "online").write_text("0-7\n")
    (root / "cpufreq").mkdir()
    (root / "cpuidle").mkdir()
    for cpu, text in siblings.items():
        (root / f"cpu{cpu}").mkdir()
        if text is not None:
            (root / f"cpu{cpu}" / "topology").mkdir()
            (root / f"cpu{cpu}" / "topology" / name).write_text(text + "\n")
    return root


def test_read_sysfs_cpu_siblings_tree(tmp_path):
    root = make_cpu_sysfs(
        tmp_path / "cpu",
        {0: "0,4", 1: "1,5", 4: "0,4", 5: "1,5", 2: "2", 3: None, 6: "6-x", 10: "10-11"},
    )
    assert read_sysfs_cpu_siblings(root) == {
        0: (0, 4),
        1: (1, 5),
        2: (2,),
        3: (3,),  # offline: no topology folder -> its own core
        4: (0, 4),
        5: (1, 5),
        6: (6,),  # garbled list -> its own core
        10: (10, 11),  # cpu11 absent: kept as the kernel says
    }


def test_read_sysfs_cpu_siblings_newer_file_name_and_missing_root(tmp_path):
    root = make_cpu_sysfs(tmp_path / "cpu", {0: "0-1", 1: "0-1"}, name="core_cpus_list")
    assert read_sysfs_cpu_siblings(root) == {0: (0, 1), 1: (0, 1)}
    assert read_sysfs_cpu_siblings(tmp_path / "absent") == {}
    (tmp_path / "file").write_text("not a folder")
    assert read_sysfs_cpu_siblings(tmp_path / "file") == {}


def test_core_groups_partition_and_cut():
    sib = {0: (0, 4), 4: (0, 4), 1: (1, 5), 5: (1, 5), 2: (2, 6), 6: (2, 6)}
    assert core_groups([0, 1, 2, 4, 5, 6], sib) == ((0, 4), (1, 5), (2, 6))
    # a cpuset holding one thread of core (2, 6); CPU 9 is unknown to the map
    assert core_groups([6, 0, 4, 9], sib) == ((0, 4), (6,), (9,))
    # an inconsistent map still gives disjoint cores
    bad = {0: (0, 1), 1: (1, 2), 2: (0, 2)}
    assert core_groups([0, 1, 2], bad) == ((0, 1), (2,))
    assert core_groups([], sib) == ()


def test_infer_siblings_split_runs_of_real_lscpu():
    # lscpu_04 (2x Xeon Gold 6342, 2 threads per core): node 0 = 0-23,48-71
    info = parse_lscpu(fixture_text("lscpu_04.txt"))
    sib = infer_siblings(info.node_cpus(0), info.threads_per_core)
    assert sib[0] == (0, 48) and sib[48] == (0, 48) and sib[23] == (23, 71)
    assert core_groups(info.node_cpus(0), sib) == tuple((c, c + 48) for c in range(24))
    # lscpu_02 (EPYC 7451, 8 NUMA nodes): node 5 = 30-35,78-83
    info2 = parse_lscpu(fixture_text("lscpu_02.txt"))
    assert core_groups(info2.node_cpus(5), infer_siblings(info2.node_cpus(5), 2)) == tuple(
        (c, c + 48) for c in range(30, 36)
    )


def test_infer_siblings_numactl_02_without_lscpu():
    # numactl_02: 128 CPUs, node 0 = 0-31,64-95 ("interleaved with SMT siblings"): with no
    # lscpu only the unmistakable shape counts: two equal runs, host CPUs / 2 apart
    numa = parse_numactl(fixture_text("numactl_02.txt"))
    total = sum(len(n.cpus) for n in numa.nodes.values())
    assert total == 128
    for node, first in ((0, 0), (1, 32)):
        sib = infer_siblings(numa.nodes[node].cpus, None, total)
        assert core_groups(numa.nodes[node].cpus, sib) == tuple(
            (c, c + 64) for c in range(first, first + 32)
        )
    assert infer_siblings(numa.nodes[0].cpus, None, None) is None
    assert infer_siblings(numa.nodes[0].cpus, None, 192) is None  # not 96 apart
    # with lscpu's count the same list splits the same way
    assert infer_siblings(numa.nodes[0].cpus, 2) == infer_siblings(numa.nodes[0].cpus, None, 128)


def test_infer_siblings_other_shapes():
    evens = list(range(0, 96, 2))  # a node of every other CPU: siblings c and c+48
    assert core_groups(evens, infer_siblings(evens, 2))[:2] == ((0, 48), (2, 50))
    adjacent = [0, 1, 4, 5, 8, 9]  # runs of exactly 2, aligned: each run is a core
    assert core_groups(adjacent, infer_siblings(adjacent, 2)) == ((0, 1), (4, 5), (8, 9))
    four = [0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51]  # SMT4, split
    assert core_groups(four, infer_siblings(four, 4))[0] == (0, 16, 32, 48)
    assert infer_siblings(range(8), 1) == {c: (c,) for c in range(8)}
    assert infer_siblings([], 2) == {}
    # unknown: one contiguous run fits both numberings; unequal runs; no lscpu, one run
    assert infer_siblings(range(48), 2) is None
    assert infer_siblings([0, 1, 2, 10, 11], 2) is None
    assert infer_siblings([0, 1, 2, 10, 11, 12, 13], 2) is None
    assert infer_siblings(range(32), None, 64) is None
    numa01 = parse_numactl(fixture_text("numactl_01.txt"))  # no SMT, no lscpu: cannot tell
    assert infer_siblings(numa01.nodes[0].cpus, None, 64) is None


# --- this machine ------------------------------------------------------------------------


def run_here(*argv: str) -> str:
    if shutil.which(argv[0]) is None:
        pytest.skip(f"{argv[0]} is not installed on this machine")
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "LC_ALL": "C"},
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"{' '.join(argv)} failed here: {done.stderr.strip()}")
    return done.stdout


def online_cpus_here() -> list[int]:
    return sorted(parse_cpu_list(Path("/sys/devices/system/cpu/online").read_text()))


def test_this_machines_lscpu():
    info = parse_lscpu(run_here("lscpu"))
    assert info.cpus >= len(online_cpus_here())  # CPU(s) counts offline CPUs too
    assert sorted(parse_cpu_list(info.online_cpus)) == online_cpus_here()
    node_cpus = sorted(c for n in info.numa_nodes for c in info.node_cpus(n))
    if info.numa_nodes:
        assert node_cpus == online_cpus_here()
        assert info.numa_node_count >= len(info.numa_nodes)  # memory-only nodes have no CPUs


def test_this_machines_sysfs():
    if not Path("/sys/devices/system/node/node0").is_dir():
        pytest.skip("this kernel exposes no /sys/devices/system/node")
    numa = read_sysfs_nodes()
    assert sorted(c for n in numa.nodes.values() for c in n.cpus) == online_cpus_here()
    assert all(n.size_mb and n.size_mb > 0 for n in numa.nodes.values())
    assert all(numa.distances[n][n] == 10 for n in numa.nodes)


def test_this_machines_numactl_agrees_with_sysfs():
    numa = parse_numactl(run_here("numactl", "--hardware"))
    sysfs = read_sysfs_nodes()
    assert {n: v.cpus for n, v in numa.nodes.items()} == {n: v.cpus for n, v in sysfs.nodes.items()}
    assert {n: v.size_mb for n, v in numa.nodes.items()} == {
        n: v.size_mb for n, v in sysfs.nodes.items()
    }
    assert numa.distance_matrix == sysfs.distance_matrix
    assert numa.nodes_listed == sysfs.nodes_listed


def test_this_machines_cpu_siblings():
    if not Path("/sys/devices/system/cpu/cpu0/topology").is_dir():
        pytest.skip("this kernel exposes no /sys/devices/system/cpu/cpu0/topology")
    sib = read_sysfs_cpu_siblings()
    online = online_cpus_here()
    assert set(online) <= set(sib)
    assert all(cpu in sib[cpu] for cpu in online)
    cores = core_groups(online, sib)
    assert sorted(c for core in cores for c in core) == online
    threads = parse_lscpu(run_here("lscpu")).threads_per_core
    if threads == 1:  # this 2-CPU machine: every CPU is its own core
        assert cores == tuple((c,) for c in online)
    elif threads is not None:
        assert {len(core) for core in cores} == {threads}
