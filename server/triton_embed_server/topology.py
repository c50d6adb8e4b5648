"""Where host-topology command outputs are read: plain parsers, no subprocess.

One parser per command, each taking the text the command printed:

* :func:`parse_topo_matrix` -- ``nvidia-smi topo -m`` (GPU/NIC link matrix, CPU and NUMA
  affinity per GPU, ``NIC Legend``),
* :func:`parse_p2p` -- ``nvidia-smi topo -p2p r|w|n|a|p`` (peer-to-peer status matrix),
* :func:`parse_lscpu` -- ``lscpu`` (C locale; old flat and newer sectioned layouts),
* :func:`parse_numactl` -- ``numactl --hardware``,
* :func:`read_sysfs_nodes` -- ``/sys/devices/system/node`` (the kernel's view; the fallback
  when numactl is not installed),
* :func:`read_sysfs_cpu_siblings` -- ``/sys/devices/system/cpu/cpu<N>/topology`` (which CPUs
  are SMT siblings on one physical core), and :func:`infer_siblings`, the documented guess
  of the same from captured outputs, which carry no sibling information;
  :func:`core_groups` turns either into physical cores,
* :func:`parse_cpu_list` -- the kernel's CPU list format (``0-3,8,10-11``).

:mod:`triton_embed_server.doctor` runs the commands and combines the results. Every parser raises
one :class:`TopologyParseError` naming the command and what it expected, never an
``IndexError``/``KeyError``. Results are frozen dataclasses whose ``to_dict()`` uses the
field names of the ``expected_*.json`` files of the topology test fixtures
(``shared/fixtures/topology/README.md``): GPU pair keys ``"GPUi-GPUj"`` with ``i < j`` in
matrix order, inclusive ``[start, end]`` CPU ranges, NUMA node keys as strings.

Link labels of ``nvidia-smi topo -m`` (the legend nvidia-smi prints under the matrix):

* ``X``    -- self,
* ``SYS``  -- PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric);
  drivers before about 2017 printed ``SOC`` for the same thing,
* ``NODE`` -- PCIe plus the interconnect between PCIe host bridges within one NUMA node,
* ``PHB``  -- PCIe plus a PCIe host bridge (typically the CPU),
* ``PXB``  -- several PCIe bridges, without the host bridge,
* ``PIX``  -- at most one PCIe bridge,
* ``NV#``  -- a bonded set of ``#`` NVLinks (``NV18`` = 18 links, e.g. through NVSwitch).

``SYS``, ``NODE`` and ``PHB`` go through the CPU's root complex; ``PIX``, ``PXB`` and
``NV#`` do not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSFS_NODE_ROOT = Path("/sys/devices/system/node")
SYSFS_CPU_ROOT = Path("/sys/devices/system/cpu")

#: Link labels of ``nvidia-smi topo -m`` and what they mean (nvidia-smi's own legend).
LINK_LEGEND = {
    "X": "Self",
    "SYS": "PCIe + the SMP interconnect between NUMA nodes (e.g. QPI/UPI)",
    "SOC": "PCIe + the SMP link between CPU sockets (pre-2017 drivers' name for SYS)",
    "NODE": "PCIe + the interconnect between PCIe host bridges within a NUMA node",
    "PHB": "PCIe + a PCIe host bridge (typically the CPU)",
    "PXB": "multiple PCIe bridges, without the PCIe host bridge",
    "PIX": "at most a single PCIe bridge",
    "NV#": "a bonded set of # NVLinks",
}
#: Labels whose path goes through the CPU's root complex / host bridge.
CPU_PATH_LABELS = frozenset({"SYS", "SOC", "NODE", "PHB"})
#: Labels that cross the SMP interconnect between NUMA nodes.
SMP_LABELS = frozenset({"SYS", "SOC"})

#: Status codes of ``nvidia-smi topo -p2p`` (its legend; ``DR`` appears in newer drivers).
P2P_LEGEND = {
    "X": "Self",
    "OK": "Status Ok",
    "CNS": "Chipset not supported",
    "GNS": "GPU not supported",
    "TNS": "Topology not supported",
    "NS": "Not supported",
    "U": "Unknown",
    "DR": "Disabled by regkey",
}
#: ``nvidia-smi topo -p2p <mode>`` modes.
P2P_MODES = {
    "r": "r (P2P read)",
    "w": "w (P2P write)",
    "n": "n (NVLink)",
    "a": "a (atomics)",
    "p": "p (prop)",
}

TOPO_CMD = "nvidia-smi topo -m"
P2P_CMD = "nvidia-smi topo -p2p"
LSCPU_CMD = "lscpu"
NUMACTL_CMD = "numactl --hardware"

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_LINK_LABEL = re.compile(r"X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+")
_GPU_NAME = re.compile(r"GPU\d+")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_AFFINITY_FIRST_WORDS = frozenset({"CPU", "NUMA", "GPU"})


class TopologyParseError(ValueError):
    """A command's output could not be read; the message names the command and what was expected."""


# --- CPU lists ---------------------------------------------------------------------------


# Largest CONFIG_NR_CPUS the Linux kernel accepts (arch/x86/Kconfig, NR_CPUS_RANGE_END with
# MAXSMP): CPU numbers are 0..8191, so a list naming more is a damaged capture.
MAX_CPUS = 8192


def parse_cpu_ranges(text: str, what: str = "CPU list") -> tuple[tuple[int, int], ...]:
    """Inclusive ``(start, end)`` ranges of a kernel CPU list, in the order printed.

    Args:
        text: ``"0-3,8,10-11"`` (the format of ``lscpu``, sysfs ``cpulist`` and the
            ``CPU Affinity`` column of ``nvidia-smi topo -m``); empty or blank -> ``()``.
        what: names the source in the error message.

    Raises:
        TopologyParseError: an item is not ``N`` or ``N-M`` with ``N <= M``, or names a CPU
            at or above :data:`MAX_CPUS`.
    """
    text = text.strip()
    if not text:
        return ()
    ranges = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not match:
            raise TopologyParseError(
                f"{what}: cannot read CPU list {text!r}: expected CPU numbers and inclusive "
                "ranges such as '0-3,8,10-11'"
            )
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            raise TopologyParseError(
                f"{what}: CPU range {part.strip()!r} in {text!r} ends before it starts"
            )
        if end >= MAX_CPUS:
            raise TopologyParseError(
                f"{what}: CPU {end} in {text!r} is beyond the kernel's limit of {MAX_CPUS} CPUs "
                "(CONFIG_NR_CPUS): check the capture"
            )
        ranges.append((start, end))
    return tuple(ranges)


def parse_cpu_list(text: str, what: str = "CPU list") -> list[int]:
    """The CPUs of a kernel CPU list, in the order printed: ``"0-3,8"`` -> ``[0, 1, 2, 3, 8]``.

    Raises:
        TopologyParseError: see :func:`parse_cpu_ranges`.
    """
    return [cpu for start, end in parse_cpu_ranges(text, what) for cpu in range(start, end + 1)]


def cpu_ranges_of(cpus: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """Runs of consecutive CPUs as inclusive ranges: ``[0, 1, 2, 8]`` -> ``((0, 2), (8, 8))``."""
    ranges: list[tuple[int, int]] = []
    for cpu in sorted(set(cpus)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], cpu)
        else:
            ranges.append((cpu, cpu))
    return tuple(ranges)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The kernel CPU list format of a set of CPUs: ``[0, 1, 2, 8]`` -> ``"0-2,8"``."""
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in cpu_ranges_of(cpus))


def _ranges_json(ranges: Iterable[tuple[int, int]]) -> list[list[int]]:
    return [[a, b] for a, b in ranges]


def _count(ranges: Iterable[tuple[int, int]]) -> int:
    return sum(b - a + 1 for a, b in ranges)


def _lines(text: str) -> list[str]:
    """Lines of ``text`` with ANSI escapes removed and any line ending."""
    return _ANSI_ESCAPE.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _pair(a: str, b: str) -> str:
    return f"{a}-{b}"


# --- nvidia-smi topo -m ------------------------------------------------------------------


@dataclass(frozen=True)
class GpuAffinity:
    """The affinity columns of one GPU row of ``nvidia-smi topo -m``.

    Attributes:
        cpu_affinity: the ``CPU Affinity`` cell as printed (``"0-15,32-47"``, ``"N/A"``);
            None when the row has no such value.
        cpu_ranges: inclusive CPU ranges of ``cpu_affinity`` in the order printed
            (empty for ``N/A``).
        numa_affinity: the ``NUMA Affinity`` cell as printed; None when there is no such column.
        numa_node: ``numa_affinity`` as one node number; None when the column is missing,
            ``N/A`` or not a single node.
        gpu_numa_id: the ``GPU NUMA ID`` cell as printed (``"N/A"`` unless the GPU memory
            is its own NUMA node, as on Grace Hopper); None when there is no such column.
    """

    cpu_affinity: str | None
    cpu_ranges: tuple[tuple[int, int], ...]
    numa_affinity: str | None
    numa_node: int | None
    gpu_numa_id: str | None

    @property
    def cpus(self) -> tuple[int, ...]:
        """The CPUs of ``cpu_affinity``, sorted."""
        return tuple(sorted({c for a, b in self.cpu_ranges for c in range(a, b + 1)}))

    @property
    def cpu_count(self) -> int:
        """Number of CPUs in ``cpu_affinity``."""
        return len(self.cpus)

    def to_dict(self) -> dict[str, Any]:
        """``numa_node``, ``cpu_affinity``, ``cpu_ranges``, ``cpu_count`` (+ ``gpu_numa_id``)."""
        out: dict[str, Any] = {
            "numa_node": self.numa_node,
            "cpu_affinity": self.cpu_affinity,
            "cpu_ranges": _ranges_json(self.cpu_ranges),
            "cpu_count": self.cpu_count,
        }
        if self.gpu_numa_id is not None:
            out["gpu_numa_id"] = self.gpu_numa_id
        return out


@dataclass(frozen=True)
class TopoMatrix:
    """What ``nvidia-smi topo -m`` says: devices, links between them, affinity of each GPU.

    Attributes:
        gpus: GPU names in matrix order (``GPU0``, ``GPU1``, ...).
        nics: NIC names in matrix order as the header prints them (``NIC0`` in newer
            drivers, the RDMA device name such as ``mlx5_0`` in older ones).
        nic_legend: ``NIC Legend`` (``{"NIC0": "mlx5_0"}``); None when not printed.
        gpu_affinity: per GPU name, its affinity columns.
        links: link label per GPU pair ``"GPUi-GPUj"`` (``i < j`` in matrix order).
        gpu_nic_links: link label per ``"GPUi-NICj"`` pair; None without NICs.
        nic_nic_links: link label per NIC pair; None without NICs.
        legend: the printed ``Legend`` (label -> meaning); None when not printed.
        separator: ``"tab"`` or ``"spaces"`` (how the header's columns are separated).
        ansi_escapes: whether the output held ANSI escapes (nvidia-smi underlines the header).
        affinity_columns: the header's columns after the device columns, in order.
    """

    gpus: tuple[str, ...]
    nics: tuple[str, ...]
    nic_legend: dict[str, str] | None
    gpu_affinity: dict[str, GpuAffinity]
    links: dict[str, str]
    gpu_nic_links: dict[str, str] | None
    nic_nic_links: dict[str, str] | None
    legend: dict[str, str] | None
    separator: str
    ansi_escapes: bool
    affinity_columns: tuple[str, ...]

    @property
    def gpu_count(self) -> int:
        """Number of GPUs in the matrix."""
        return len(self.gpus)

    @property
    def has_numa_affinity(self) -> bool:
        """Whether the output has a ``NUMA Affinity`` column."""
        return "NUMA Affinity" in self.affinity_columns

    def link(self, a: str, b: str) -> str:
        """The link label between two GPUs (either order); ``"X"`` for a GPU with itself.

        Raises:
            KeyError: a name is not a GPU of the matrix.
        """
        if a == b:
            return "X"
        i, j = self.gpus.index(a), self.gpus.index(b)
        return self.links[_pair(a, b) if i < j else _pair(b, a)]

    def pairs_with(self, labels: Iterable[str]) -> list[str]:
        """GPU pairs (matrix order) whose label is one of ``labels`` (``"NV#"`` = any NVLink)."""
        wanted = set(labels)
        return [
            key
            for key, label in self.links.items()
            if label in wanted or ("NV#" in wanted and label.startswith("NV"))
        ]

    @property
    def nvlink_pairs(self) -> dict[str, int]:
        """Number of bonded NVLinks per GPU pair connected by ``NV#``."""
        return {k: int(v[2:]) for k, v in self.links.items() if re.fullmatch(r"NV\d+", v)}

    @property
    def sys_pairs(self) -> list[str]:
        """GPU pairs whose link label is ``SYS`` (or the older ``SOC``): they cross the SMP link."""
        return self.pairs_with(SMP_LABELS)

    @property
    def cross_numa_pairs(self) -> list[str]:
        """GPU pairs whose ``NUMA Affinity`` differs (both known); may be NVLink-connected."""
        out = []
        for key in self.links:
            a, b = key.split("-")
            na, nb = self.gpu_affinity[a].numa_node, self.gpu_affinity[b].numa_node
            if na is not None and nb is not None and na != nb:
                out.append(key)
        return out

    @property
    def cpu_affinity_disjoint_pairs(self) -> list[str]:
        """GPU pairs whose CPU affinity sets are both known and do not overlap."""
        out = []
        for key in self.links:
            a, b = key.split("-")
            ca, cb = set(self.gpu_affinity[a].cpus), set(self.gpu_affinity[b].cpus)
            if ca and cb and not ca & cb:
                out.append(key)
        return out

    @property
    def numa_groups(self) -> dict[int, list[str]]:
        """GPUs per NUMA node (from ``NUMA Affinity``; GPUs without a node are left out)."""
        groups: dict[int, list[str]] = {}
        for gpu in self.gpus:
            node = self.gpu_affinity[gpu].numa_node
            if node is not None:
                groups.setdefault(node, []).append(gpu)
        return dict(sorted(groups.items()))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; keys follow ``expected_topo_m_*.json``."""
        return {
            "format": {
                "separator": self.separator,
                "ansi_escapes": self.ansi_escapes,
                "legend_present": self.legend is not None,
                "nic_legend_present": self.nic_legend is not None,
                "affinity_columns": list(self.affinity_columns),
            },
            "gpu_count": self.gpu_count,
            "gpus": list(self.gpus),
            "nics": list(self.nics),
            "nic_legend": dict(self.nic_legend) if self.nic_legend is not None else None,
            "gpu_affinity": {g: a.to_dict() for g, a in self.gpu_affinity.items()},
            "links": dict(self.links),
            "nvlink_pairs": self.nvlink_pairs,
            "sys_pairs": self.sys_pairs,
            "cross_numa_pairs": self.cross_numa_pairs,
            "numa_groups": {str(n): gpus for n, gpus in self.numa_groups.items()},
            "cpu_affinity_disjoint_pairs": self.cpu_affinity_disjoint_pairs,
            "gpu_nic_links": dict(self.gpu_nic_links) if self.gpu_nic_links is not None else None,
            "nic_nic_links": dict(self.nic_nic_links) if self.nic_nic_links is not None else None,
            "legend": dict(self.legend) if self.legend is not None else None,
        }


def _split_affinity_columns(remainder: str) -> tuple[str, ...]:
    """Header text after the device columns -> column names (they contain single spaces)."""
    columns: list[str] = []
    for chunk in re.split(r"\t+| {2,}", remainder.strip()):
        chunk = chunk.strip()
        while chunk:
            known = next((name for name in _AFFINITY_COLUMNS if chunk.startswith(name)), None)
            if known is None:
                columns.append(chunk)
                break
            columns.append(known)
            chunk = chunk[len(known) :].strip()
    return tuple(columns)


def _parse_legend_block(lines: list[str], start: int, pattern: str) -> dict[str, str]:
    """``KEY = meaning`` (or ``KEY: value``) lines after a ``...Legend:`` line."""
    entries: dict[str, str] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            if entries:
                break
            continue
        match = re.fullmatch(pattern, line.strip())
        if not match:
            break
        entries[match.group(1)] = match.group(2)
    return entries


def parse_topo_matrix(text: str) -> TopoMatrix:
    """Parse the output of ``nvidia-smi topo -m``.

    Handles tab- and space-separated layouts, ANSI escapes (the header is underlined),
    a header with or without a leading tab, the empty field nvidia-smi prints between
    ``NUMA Affinity`` and ``GPU NUMA ID``, NIC columns named ``NICn`` (with a
    ``NIC Legend``) or by RDMA device (older drivers), and outputs without a legend or
    without the ``NUMA Affinity`` / ``GPU NUMA ID`` columns.

    Args:
        text: the command's standard output.

    Returns:
        The devices, the link label of every pair and the affinity of every GPU.

    Raises:
        TopologyParseError: no ``GPU0 ...`` header, rows that do not match the header
            (truncated or garbled output), an unknown link label, a self cell that is not
            ``X``, an asymmetric matrix, or an unreadable CPU list.
    """
    if not text or not text.strip():
        raise TopologyParseError(
            f"{TOPO_CMD}: empty output; expected the GPU matrix whose header starts with 'GPU0'"
        )
    lines = _lines(text)
    header_at = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"]), None)
    if header_at is None:
        raise TopologyParseError(
            f"{TOPO_CMD}: no header line starting with 'GPU0'; expected the matrix printed by "
            "'nvidia-smi topo -m' (GPU0 GPU1 ... CPU Affinity NUMA Affinity)"
        )
    header = lines[header_at]
    header_tokens = list(re.finditer(r"\S+", header))
    n_dev = next(
        (i for i, m in enumerate(header_tokens) if m.group() in _AFFINITY_FIRST_WORDS),
        len(header_tokens),
    )
    devices = [m.group() for m in header_tokens[:n_dev]]
    if len(set(devices)) != len(devices):
        raise TopologyParseError(
            f"{TOPO_CMD}: the header names a device twice: {' '.join(devices)}"
        )
    remainder = header[header_tokens[n_dev - 1].end() :] if n_dev else header
    affinity_columns = _split_affinity_columns(remainder)

    rows: list[list[str]] = []
    end = header_at + 1
    while end < len(lines):
        tokens = lines[end].split()
        if not tokens or tokens[0] not in devices:
            break
        rows.append(tokens)
        end += 1
    labels = [r[0] for r in rows]
    if labels != devices:
        raise TopologyParseError(
            f"{TOPO_CMD}: the header lists {len(devices)} devices ({' '.join(devices)}) but the "
            f"rows below it are {' '.join(labels) or 'missing'}; the output looks truncated or "
            "garbled (expected one row per header device, in header order)"
        )

    cells: dict[str, list[str]] = {}
    values: dict[str, list[str]] = {}
    for i, tokens in enumerate(rows):
        name = tokens[0]
        row = tokens[1 : 1 + n_dev]
        if len(row) < n_dev:
            raise TopologyParseError(
                f"{TOPO_CMD}: row {name} has {len(row)} link cells; the header has {n_dev} "
                "devices (truncated line?)"
            )
        for col, label in zip(devices, row, strict=True):
            if not _LINK_LABEL.fullmatch(label):
                raise TopologyParseError(
                    f"{TOPO_CMD}: row {name}, column {col}: unknown link label {label!r}; "
                    "expected X, SYS, NODE, PHB, PXB, PIX or NV# (nvidia-smi's legend)"
                )
        if row[i] != "X":
            raise TopologyParseError(
                f"{TOPO_CMD}: row {name} has {row[i]!r} in its own column; expected 'X' "
                "(columns are shifted: garbled output?)"
            )
        cells[name] = row
        values[name] = tokens[1 + n_dev :]
    for i, a in enumerate(devices):
        for j in range(i + 1, n_dev):
            b = devices[j]
            if cells[a][j] != cells[b][i]:
                raise TopologyParseError(
                    f"{TOPO_CMD}: the matrix is not symmetric: {a}->{b} is {cells[a][j]} but "
                    f"{b}->{a} is {cells[b][i]}"
                )

    gpus = tuple(d for d in devices if _GPU_NAME.fullmatch(d))
    nics = tuple(d for d in devices if d not in gpus)
    if not gpus:
        raise TopologyParseError(f"{TOPO_CMD}: the matrix has no GPU rows (GPU0, GPU1, ...)")

    gpu_affinity = {g: _gpu_affinity(g, values[g], affinity_columns) for g in gpus}

    def links_between(first: Iterable[str], second: Iterable[str], same: bool) -> dict[str, str]:
        out = {}
        for a in first:
            for b in second:
                ia, ib = devices.index(a), devices.index(b)
                if (same and ia < ib) or (not same and a != b):
                    out[_pair(a, b)] = cells[a][ib]
        return out

    legend = nic_legend = None
    for i, line in enumerate(lines[end:], start=end):
        stripped = line.strip()
        if stripped == "Legend:":
            legend = _parse_legend_block(lines, i, r"(\S+)\s*=\s*(.+?)")
        elif stripped == "NIC Legend:":
            nic_legend = _parse_legend_block(lines, i, r"(\S+):\s*(\S.*?)")

    return TopoMatrix(
        gpus=gpus,
        nics=nics,
        nic_legend=nic_legend,
        gpu_affinity=gpu_affinity,
        links=links_between(gpus, gpus, same=True),
        gpu_nic_links=links_between(gpus, nics, same=False) if nics else None,
        nic_nic_links=links_between(nics, nics, same=True) if nics else None,
        legend=legend,
        separator="tab" if "\t" in header else "spaces",
        ansi_escapes=bool(_ANSI_ESCAPE.search(text)),
        affinity_columns=affinity_columns,
    )


def _gpu_affinity(gpu: str, values: list[str], columns: tuple[str, ...]) -> GpuAffinity:
    """Map a GPU row's trailing cells onto the affinity columns.

    Cells are whitespace-split, so the empty field nvidia-smi prints before ``GPU NUMA ID``
    disappears and the remaining cells line up with the header's columns in order.
    """
    if len(values) > len(columns):
        raise TopologyParseError(
            f"{TOPO_CMD}: row {gpu} has {len(values)} values after its link cells "
            f"({' '.join(values)}) but the header has {len(columns)} affinity columns "
            f"({', '.join(columns) or 'none'})"
        )
    cell = dict(zip(columns, values, strict=False))  # trailing columns may be empty
    cpu_affinity = cell.get("CPU Affinity")
    ranges: tuple[tuple[int, int], ...] = ()
    if cpu_affinity is not None and cpu_affinity != "N/A":
        ranges = parse_cpu_ranges(cpu_affinity, f"{TOPO_CMD}: {gpu} CPU Affinity")
    numa_affinity = cell.get("NUMA Affinity")
    numa_node = None
    if numa_affinity is not None and numa_affinity != "N/A":
        if not re.fullmatch(r"\d+(?:[-,]\d+)*", numa_affinity):
            raise TopologyParseError(
                f"{TOPO_CMD}: {gpu} NUMA Affinity {numa_affinity!r}: expected a node number or N/A"
            )
        numa_node = int(numa_affinity) if numa_affinity.isdigit() else None
    gpu_numa_id = cell.get("GPU NUMA ID")
    if gpu_numa_id is None and "GPU NUMA ID" in columns:
        gpu_numa_id = "N/A"
    return GpuAffinity(
        cpu_affinity=cpu_affinity,
        cpu_ranges=ranges,
        numa_affinity=numa_affinity,
        numa_node=numa_node,
        gpu_numa_id=gpu_numa_id,
    )


# --- nvidia-smi topo -p2p ----------------------------------------------------------------


@dataclass(frozen=True)
class P2PMatrix:
    """What ``nvidia-smi topo -p2p <mode>`` says.

    Attributes:
        gpus: GPU names in matrix order.
        status: directional status, ``"GPU0->GPU1"`` = row GPU0, column GPU1 (``OK``,
            ``CNS``, ``GNS``, ``TNS``, ``NS``, ``U``, ``DR``; see :data:`P2P_LEGEND`).
        legend: the printed legend; None when not printed.
        mode: the ``-p2p`` mode letter when known (``r``, ``w``, ``n``, ``a``, ``p``).
    """

    gpus: tuple[str, ...]
    status: dict[str, str]
    legend: dict[str, str] | None
    mode: str | None = None

    @property
    def pairs(self) -> dict[str, str]:
        """Status per GPU pair ``"GPUi-GPUj"``, both directions folded.

        Equal directions give that status; otherwise the non-``OK`` one, or ``"A/B"``
        (``i->j`` / ``j->i``) when both differ from ``OK``.
        """
        out = {}
        for i, a in enumerate(self.gpus):
            for b in self.gpus[i + 1 :]:
                ab, ba = self.status[f"{a}->{b}"], self.status[f"{b}->{a}"]
                if ab == ba or ba == "OK":
                    out[_pair(a, b)] = ab
                elif ab == "OK":
                    out[_pair(a, b)] = ba
                else:
                    out[_pair(a, b)] = f"{ab}/{ba}"
        return out

    @property
    def all_ok(self) -> bool:
        """Whether every direction of every pair is ``OK``."""
        return all(s == "OK" for s in self.status.values())

    @property
    def non_ok_pairs(self) -> dict[str, str]:
        """Pairs whose folded status is not ``OK``."""
        return {k: v for k, v in self.pairs.items() if v != "OK"}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; keys follow ``expected_p2p_*.json``."""
        return {
            "mode": P2P_MODES.get(self.mode, self.mode) if self.mode else None,
            "gpu_count": len(self.gpus),
            "gpus": list(self.gpus),
            "status": dict(self.status),
            "pairs": self.pairs,
            "all_ok": self.all_ok,
            "non_ok_pairs": self.non_ok_pairs,
            "legend": dict(self.legend) if self.legend is not None else None,
        }


def parse_p2p(text: str, mode: str | None = None) -> P2PMatrix:
    """Parse the output of ``nvidia-smi topo -p2p <mode>``.

    Args:
        text: the command's standard output (rows may be indented, as nvidia-smi prints them).
        mode: the mode letter the command was run with, recorded as is (the output does not
            say it).

    Raises:
        TopologyParseError: no header of GPU names, rows that do not match it, a status
            that is not an upper-case code, or a self cell that is not ``X``.
    """
    cmd = f"{P2P_CMD} {mode}" if mode else P2P_CMD
    if not text or not text.strip():
        raise TopologyParseError(
            f"{cmd}: empty output; expected a matrix whose header is 'GPU0 GPU1 ...'"
        )
    lines = _lines(text)
    header_at = next((i for i, ln in enumerate(lines) if ln.split()[:1] == ["GPU0"]), None)
    if header_at is None:
        raise TopologyParseError(
            f"{cmd}: no header line starting with 'GPU0'; expected 'GPU0 GPU1 ...'"
        )
    gpus = lines[header_at].split()
    if not all(_GPU_NAME.fullmatch(g) for g in gpus):
        raise TopologyParseError(
            f"{cmd}: header {' '.join(gpus)!r} holds more than GPU names; expected 'GPU0 GPU1 ...' "
            "(is this 'nvidia-smi topo -m' output?)"
        )
    if len(set(gpus)) != len(gpus):
        raise TopologyParseError(f"{cmd}: the header names a GPU twice: {' '.join(gpus)}")
    status: dict[str, str] = {}
    rows = []
    for line in lines[header_at + 1 :]:
        tokens = line.split()
        if not tokens or tokens[0] not in gpus:
            break
        rows.append(tokens)
    labels = [r[0] for r in rows]
    if labels != gpus:
        raise TopologyParseError(
            f"{cmd}: the header lists {' '.join(gpus)} but the rows are "
            f"{' '.join(labels) or 'missing'}; truncated or garbled output"
        )
    for i, tokens in enumerate(rows):
        cells = tokens[1:]
        if len(cells) != len(gpus):
            raise TopologyParseError(
                f"{cmd}: row {tokens[0]} has {len(cells)} cells; expected {len(gpus)}"
            )
        for j, value in enumerate(cells):
            if not re.fullmatch(r"[A-Z]{1,5}", value):
                raise TopologyParseError(
                    f"{cmd}: row {tokens[0]}, column {gpus[j]}: unknown status {value!r}; "
                    f"expected one of {', '.join(P2P_LEGEND)}"
                )
            if i == j:
                if value != "X":
                    raise TopologyParseError(
                        f"{cmd}: row {tokens[0]} has {value!r} in its own column; expected 'X'"
                    )
            else:
                status[f"{tokens[0]}->{gpus[j]}"] = value
    legend = None
    for i, line in enumerate(lines):
        if line.strip() == "Legend:":
            legend = _parse_legend_block(lines, i, r"(\S+)\s*=\s*(.+?)")
    return P2PMatrix(gpus=tuple(gpus), status=status, legend=legend, mode=mode)


# --- lscpu -------------------------------------------------------------------------------


@dataclass(frozen=True)
class LscpuInfo:
    """What ``lscpu`` says about CPUs, sockets and NUMA nodes.

    Attributes:
        cpus: logical CPUs (``CPU(s)``).
        online_cpus: ``On-line CPU(s) list`` as printed; None when absent.
        vendor_id: ``Vendor ID``; None when absent.
        model_name: the first ``Model name``; None when absent.
        threads_per_core: ``Thread(s) per core``; None when absent or ``-``.
        cores_per_socket: ``Core(s) per socket``; None when absent or ``-``.
        sockets: ``Socket(s)``; None when absent or ``-``.
        numa_node_count: ``NUMA node(s)``, else the number of node lines.
        numa_nodes: per node number, its ``NUMA nodeN CPU(s)`` list as printed.
    """

    cpus: int
    online_cpus: str | None
    vendor_id: str | None
    model_name: str | None
    threads_per_core: int | None
    cores_per_socket: int | None
    sockets: int | None
    numa_node_count: int
    numa_nodes: dict[int, str]

    @property
    def physical_cores_total(self) -> int | None:
        """``cores_per_socket * sockets``; None when either is unknown."""
        if self.cores_per_socket is None or self.sockets is None:
            return None
        return self.cores_per_socket * self.sockets

    def node_cpus(self, node: int) -> tuple[int, ...]:
        """The CPUs of a NUMA node, sorted."""
        return tuple(sorted(parse_cpu_list(self.numa_nodes[node], f"{LSCPU_CMD}: NUMA node{node}")))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; keys follow ``expected_lscpu_*.json``."""
        nodes = {}
        for node, cpu_list in self.numa_nodes.items():
            ranges = parse_cpu_ranges(cpu_list, f"{LSCPU_CMD}: NUMA node{node}")
            nodes[str(node)] = {
                "cpu_list": cpu_list,
                "cpu_ranges": _ranges_json(ranges),
                "cpu_count": _count(ranges),
            }
        return {
            "cpus": self.cpus,
            "online_cpus": self.online_cpus,
            "vendor_id": self.vendor_id,
            "model_name": self.model_name,
            "threads_per_core": self.threads_per_core,
            "cores_per_socket": self.cores_per_socket,
            "sockets": self.sockets,
            "numa_node_count": self.numa_node_count,
            "numa_nodes": nodes,
            "physical_cores_total": self.physical_cores_total,
        }


def _lscpu_fields(lines: list[str]) -> list[tuple[str, str]]:
    """``(key, value)`` per ``Key: value`` line; wrapped values (``Flags``) are re-joined.

    A line indented at least as far as the previous value's column continues that value
    (the newer tty layout wraps at the terminal width, sometimes inside a word).
    """
    fields: list[tuple[str, str]] = []
    value_col = 0
    for line in lines:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        if fields and value_col and indent >= value_col:
            key, value = fields[-1]
            fields[-1] = (key, value + line[value_col:].rstrip())
            continue
        match = re.fullmatch(r"\s*([^:]+?):(\s*)(.*?)\s*", line)
        if not match:
            continue
        fields.append((match.group(1), match.group(3)))
        value_col = match.start(3) if match.group(3) else 0
    return fields


def parse_lscpu(text: str) -> LscpuInfo:
    """Parse the output of ``lscpu`` (C locale), old flat or newer sectioned layout.

    Args:
        text: the command's standard output.

    Raises:
        TopologyParseError: no ``Key: value`` lines, no ``CPU(s):`` line, or a count or
            CPU list that cannot be read.
    """
    if not text or not text.strip():
        raise TopologyParseError(
            f"{LSCPU_CMD}: empty output; expected 'CPU(s):', 'NUMA node0 CPU(s):' ..."
        )
    fields = _lscpu_fields(_lines(text))
    if not fields:
        raise TopologyParseError(
            f"{LSCPU_CMD}: no 'Key: value' lines; expected the output of 'lscpu' in the C locale"
        )
    first: dict[str, str] = {}
    for key, value in fields:
        first.setdefault(key, value)

    def count(key: str) -> int | None:
        value = first.get(key)
        if value is None or value == "-":
            return None
        if not value.isdigit():
            raise TopologyParseError(f"{LSCPU_CMD}: '{key}: {value}': expected a whole number")
        return int(value)

    cpus = count("CPU(s)")
    if cpus is None:
        raise TopologyParseError(
            f"{LSCPU_CMD}: no 'CPU(s):' line; expected the output of 'lscpu' in the C locale "
            "(run it with LC_ALL=C)"
        )
    numa_nodes: dict[int, str] = {}
    for key, value in fields:
        match = re.fullmatch(r"NUMA node(\d+) CPU\(s\)", key)
        if match:
            parse_cpu_ranges(value, f"{LSCPU_CMD}: {key}")
            numa_nodes[int(match.group(1))] = value
    online = first.get("On-line CPU(s) list")
    if online is not None:
        parse_cpu_ranges(online, f"{LSCPU_CMD}: On-line CPU(s) list")
    node_count = count("NUMA node(s)")
    return LscpuInfo(
        cpus=cpus,
        online_cpus=online,
        vendor_id=first.get("Vendor ID"),
        model_name=first.get("Model name"),
        threads_per_core=count("Thread(s) per core"),
        cores_per_socket=count("Core(s) per socket"),
        sockets=count("Socket(s)"),
        numa_node_count=node_count if node_count is not None else len(numa_nodes),
        numa_nodes=dict(sorted(numa_nodes.items())),
    )


# --- numactl --hardware / sysfs ----------------------------------------------------------


@dataclass(frozen=True)
class NumaNode:
    """One NUMA node: its CPUs and memory.

    Attributes:
        cpus: CPU numbers in the order listed (empty for a memory-only node).
        size_mb: memory size in MB as printed by numactl (MiB: bytes >> 20); None when unknown.
        free_mb: free memory in MB (same unit); None when unknown.
    """

    cpus: tuple[int, ...]
    size_mb: int | None
    free_mb: int | None

    def to_dict(self) -> dict[str, Any]:
        """``cpus``, ``cpu_ranges`` (consecutive runs), ``cpu_count``, ``size_mb``, ``free_mb``."""
        return {
            "cpus": list(self.cpus),
            "cpu_ranges": _ranges_json(cpu_ranges_of(self.cpus)),
            "cpu_count": len(self.cpus),
            "size_mb": self.size_mb,
            "free_mb": self.free_mb,
        }


@dataclass(frozen=True)
class NumaTopology:
    """NUMA nodes and their distances, from ``numactl --hardware`` or sysfs.

    Attributes:
        nodes: per node number, its CPUs and memory.
        nodes_listed: the node list as printed (``available: 2 nodes (0-1)`` -> ``"0-1"``,
            sysfs ``online``); None when not printed.
        distance_nodes: the nodes of the distance matrix's rows and columns, in order.
        distance_matrix: ACPI SLIT distances (10 = local), rows/columns per ``distance_nodes``.
        source: ``"numactl --hardware"`` or ``"sysfs"``.
    """

    nodes: dict[int, NumaNode]
    nodes_listed: str | None
    distance_nodes: tuple[int, ...]
    distance_matrix: tuple[tuple[int, ...], ...]
    source: str = NUMACTL_CMD

    @property
    def node_count(self) -> int:
        """Number of nodes."""
        return len(self.nodes)

    @property
    def distances(self) -> dict[int, dict[int, int]]:
        """``distances[a][b]``: the distance from node ``a`` to node ``b``."""
        return {
            a: dict(zip(self.distance_nodes, row, strict=True))
            for a, row in zip(self.distance_nodes, self.distance_matrix, strict=True)
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form; keys follow ``expected_numactl_*.json``."""
        sizes = [n.size_mb for n in self.nodes.values()]
        frees = [n.free_mb for n in self.nodes.values()]
        diagonal = [row[i] for i, row in enumerate(self.distance_matrix)]
        flat = [d for row in self.distance_matrix for d in row]
        return {
            "source": self.source,
            "node_count": self.node_count,
            "nodes_listed": self.nodes_listed,
            "nodes": {str(k): v.to_dict() for k, v in self.nodes.items()},
            "total_cpus": sum(len(n.cpus) for n in self.nodes.values()),
            "total_size_mb": None if None in sizes else sum(sizes),  # type: ignore[arg-type]
            "total_free_mb": None if None in frees else sum(frees),  # type: ignore[arg-type]
            "distance_nodes": list(self.distance_nodes),
            "distance_matrix": [list(r) for r in self.distance_matrix],
            "distances": {
                str(a): {str(b): d for b, d in row.items()} for a, row in self.distances.items()
            },
            "local_distance": min(diagonal) if diagonal else None,
            "max_distance": max(flat) if flat else None,
        }


def parse_numactl(text: str) -> NumaTopology:
    """Parse the output of ``numactl --hardware`` (``numactl -H``).

    Args:
        text: the command's standard output (trailing spaces on distance rows are fine).

    Raises:
        TopologyParseError: ``No NUMA available``, no ``available: N nodes`` line, a node
            count that differs from the ``node N cpus:`` lines, a CPU that is not a number,
            or a distance matrix that is not square.
    """
    if not text or not text.strip():
        raise TopologyParseError(
            f"{NUMACTL_CMD}: empty output; expected 'available: N nodes (...)'"
        )
    lines = [ln.strip() for ln in _lines(text)]
    if any(ln.startswith("No NUMA available") for ln in lines):
        raise TopologyParseError(
            f"{NUMACTL_CMD}: 'No NUMA available on this system' (the kernel exposes no NUMA "
            "nodes); use sysfs or lscpu instead"
        )
    available = next(
        (
            m
            for ln in lines
            if (m := re.fullmatch(r"available:\s*(\d+)\s+nodes?\s*(?:\((.*)\))?", ln))
        ),
        None,
    )
    if available is None:
        raise TopologyParseError(
            f"{NUMACTL_CMD}: no 'available: N nodes (...)' line; expected the output of "
            "'numactl --hardware'"
        )
    cpus: dict[int, tuple[int, ...]] = {}
    size: dict[int, int] = {}
    free: dict[int, int] = {}
    distance_nodes: tuple[int, ...] = ()
    distance_rows: list[tuple[int, tuple[int, ...]]] = []
    in_distances = False
    for ln in lines:
        if m := re.fullmatch(r"node\s+(\d+)\s+cpus:\s*(.*)", ln):
            tokens = m.group(2).split()
            if not all(t.isdigit() for t in tokens):
                raise TopologyParseError(
                    f"{NUMACTL_CMD}: {ln!r}: expected CPU numbers separated by spaces"
                )
            cpus[int(m.group(1))] = tuple(int(t) for t in tokens)
        elif m := re.fullmatch(r"node\s+(\d+)\s+(size|free):\s*(\d+)\s*MB", ln):
            (size if m.group(2) == "size" else free)[int(m.group(1))] = int(m.group(3))
        elif ln == "node distances:":
            in_distances = True
        elif in_distances and (m := re.fullmatch(r"node((?:\s+\d+)+)", ln)):
            distance_nodes = tuple(int(t) for t in m.group(1).split())
        elif in_distances and (m := re.fullmatch(r"(\d+):((?:\s+\d+)+)", ln)):
            distance_rows.append((int(m.group(1)), tuple(int(t) for t in m.group(2).split())))
    declared = int(available.group(1))
    if len(cpus) != declared:
        raise TopologyParseError(
            f"{NUMACTL_CMD}: 'available: {declared} nodes' but {len(cpus)} 'node N cpus:' lines; "
            "truncated output?"
        )
    matrix = tuple(row for _, row in distance_rows)
    if distance_rows or distance_nodes:
        width = len(distance_nodes)
        if [n for n, _ in distance_rows] != list(distance_nodes) or any(
            len(r) != width for r in matrix
        ):
            raise TopologyParseError(
                f"{NUMACTL_CMD}: the distance matrix is not square over nodes "
                f"{' '.join(map(str, distance_nodes)) or '(no header)'}; truncated output?"
            )
    nodes = {
        n: NumaNode(cpus=c, size_mb=size.get(n), free_mb=free.get(n))
        for n, c in sorted(cpus.items())
    }
    return NumaTopology(
        nodes=nodes,
        nodes_listed=available.group(2),
        distance_nodes=distance_nodes,
        distance_matrix=matrix,
        source=NUMACTL_CMD,
    )


def read_sysfs_nodes(root: Path = SYSFS_NODE_ROOT) -> NumaTopology:
    """NUMA nodes as the kernel exposes them under ``/sys/devices/system/node``.

    Reads ``node<N>/cpulist``, ``node<N>/meminfo`` (``MemTotal``/``MemFree`` kB, shown as
    MB = kB >> 10, the unit numactl prints), ``node<N>/distance`` and ``online``.

    Args:
        root: the ``node`` folder (a copy of it in tests).

    Raises:
        TopologyParseError: no ``node<N>`` folders, or an unreadable ``cpulist``.
    """
    dirs = sorted(
        (int(p.name[4:]), p)
        for p in (root.iterdir() if root.is_dir() else ())
        if re.fullmatch(r"node\d+", p.name)
    )
    if not dirs:
        raise TopologyParseError(
            f"sysfs: {root} has no node<N> folders (no NUMA information from the kernel)"
        )
    nodes: dict[int, NumaNode] = {}
    rows: list[tuple[int, ...]] = []
    for number, folder in dirs:
        try:
            cpulist = (folder / "cpulist").read_text()
        except OSError as exc:
            raise TopologyParseError(f"sysfs: cannot read {folder / 'cpulist'}: {exc}") from exc
        meminfo = _read_optional(folder / "meminfo")
        total = re.search(r"MemTotal:\s*(\d+)\s*kB", meminfo)
        free = re.search(r"MemFree:\s*(\d+)\s*kB", meminfo)
        nodes[number] = NumaNode(
            cpus=tuple(parse_cpu_list(cpulist, f"sysfs: {folder / 'cpulist'}")),
            size_mb=int(total.group(1)) >> 10 if total else None,
            free_mb=int(free.group(1)) >> 10 if free else None,
        )
        distance = _read_optional(folder / "distance").split()
        rows.append(tuple(int(d) for d in distance if d.isdigit()))
    numbers = tuple(n for n, _ in dirs)
    square = all(len(r) == len(numbers) for r in rows)
    online = _read_optional(root / "online").strip() or None
    return NumaTopology(
        nodes=nodes,
        nodes_listed=online,
        distance_nodes=numbers if square else (),
        distance_matrix=tuple(rows) if square else (),
        source="sysfs",
    )


def _read_optional(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


# --- SMT siblings (physical cores) -------------------------------------------------------


def read_sysfs_cpu_siblings(root: Path = SYSFS_CPU_ROOT) -> dict[int, tuple[int, ...]]:
    """Per CPU, the CPUs of its physical core, as the kernel exposes them in sysfs.

    Reads ``cpu<N>/topology/thread_siblings_list`` (``core_cpus_list``, its newer name, when
    the old file is absent) under ``/sys/devices/system/cpu``: the logical CPUs that are SMT
    threads of the same core (``"0,48"``; ``"3"`` without SMT).

    Args:
        root: the ``cpu`` folder (a copy of it in tests).

    Returns:
        ``{cpu: sorted siblings, the CPU itself included}`` for every ``cpu<N>`` folder; a CPU
        whose file is missing, unreadable or garbled (an offline CPU has no ``topology``) is
        its own core. Empty when ``root`` is not a readable folder. Never raises.
    """
    try:
        entries = list(root.iterdir())
    except OSError:
        return {}
    siblings: dict[int, tuple[int, ...]] = {}
    for entry in entries:
        match = re.fullmatch(r"cpu(\d+)", entry.name)
        if not match:
            continue
        cpu = int(match.group(1))
        topology = entry / "topology"
        text = _read_optional(topology / "thread_siblings_list") or _read_optional(
            topology / "core_cpus_list"
        )
        try:
            found = set(parse_cpu_list(text, f"sysfs: {topology}"))
        except TopologyParseError:
            found = set()
        siblings[cpu] = tuple(sorted(found | {cpu}))
    return dict(sorted(siblings.items()))


def core_groups(
    cpus: Iterable[int], siblings: Mapping[int, Iterable[int]]
) -> tuple[tuple[int, ...], ...]:
    """Split CPUs into physical cores: each core a sorted tuple of its SMT sibling CPUs.

    Args:
        cpus: the CPUs to group (a NUMA node's); siblings outside them are left out, so a
            cpuset that holds one thread of a core gives a one-CPU core.
        siblings: per CPU, the CPUs of its core (:func:`read_sysfs_cpu_siblings` or
            :func:`infer_siblings`); a CPU absent from it is its own core.

    Returns:
        The cores, ordered by their lowest CPU; every CPU of ``cpus`` is in exactly one core
        (an inconsistent ``siblings`` map cannot make cores overlap).
    """
    wanted = sorted(set(cpus))
    inside = set(wanted)
    taken: set[int] = set()
    groups: list[tuple[int, ...]] = []
    for cpu in wanted:
        if cpu in taken:
            continue
        group = tuple(sorted(((set(siblings.get(cpu, ())) | {cpu}) & inside) - taken))
        taken.update(group)
        groups.append(group)
    return tuple(groups)


def infer_siblings(
    cpus: Iterable[int], threads_per_core: int | None, host_cpu_count: int | None = None
) -> dict[int, tuple[int, ...]] | None:
    """Guess which of a NUMA node's CPUs are SMT siblings from the CPU numbers alone.

    For captured outputs (``lscpu``, ``numactl --hardware``, ``nvidia-smi topo -m``), which
    never say which CPUs share a core. ``t`` is ``threads_per_core`` (lscpu's
    ``Thread(s) per core``); the rules, first match wins:

    * ``t == 1``: no SMT, every CPU is its own core.
    * ``t > 1``, *adjacent*: the node's CPUs are more than ``t`` runs of consecutive
      numbers, each exactly ``t`` long and starting at a multiple of ``t``
      (``0-1,4-5,8-9``): each run is one core. Only such a list shows adjacent numbering.
    * ``t > 1``, *split*: the sorted list is not one run and cuts into ``t`` equal blocks,
      each the first block shifted by a constant (``0-23,48-71``; ``0,2,...,46,48,...,94``):
      the k-th CPU of every block is one core. This is how Linux numbers x86 SMT threads:
      the first thread of every core, then the second (CPU ``c`` and ``c + N/t``).
    * ``t`` unknown (no lscpu): only the split shape with two threads per core, and only when
      it is unmistakable: the node is exactly two equal runs whose starts are
      ``host_cpu_count / 2`` apart (numactl_02: ``0-31,64-95`` of 128 CPUs).
    * anything else, including one contiguous run (``0-47`` fits both numberings): unknown.

    Args:
        cpus: the node's CPUs (before any cpuset cut: the pattern is the host's).
        threads_per_core: lscpu's ``Thread(s) per core``; None when not known.
        host_cpu_count: the number of CPUs of the whole host (all nodes); used only when
            ``threads_per_core`` is None.

    Returns:
        ``{cpu: its core's CPUs, sorted}`` for every CPU of ``cpus``, the shape of
        :func:`read_sysfs_cpu_siblings`; None when the siblings cannot be told.
    """
    ordered = sorted(set(cpus))
    t = threads_per_core
    if not ordered:
        return {}
    if t == 1:
        return {c: (c,) for c in ordered}
    runs = cpu_ranges_of(ordered)
    if len(runs) < 2:
        return None
    cores: list[tuple[int, ...]] | None = None
    if t is None:
        (a0, b0), *rest = runs
        if (
            host_cpu_count
            and host_cpu_count % 2 == 0
            and len(runs) == 2
            and rest[0][1] - rest[0][0] == b0 - a0
            and rest[0][0] - a0 == host_cpu_count // 2
        ):
            cores = [(c, c + host_cpu_count // 2) for c in range(a0, b0 + 1)]
    elif t > 1:
        if len(runs) > t and all(a % t == 0 and b - a + 1 == t for a, b in runs):
            cores = [tuple(range(a, b + 1)) for a, b in runs]
        elif len(ordered) % t == 0:
            size = len(ordered) // t
            blocks = [ordered[j * size : (j + 1) * size] for j in range(t)]
            shifts = [block[0] - blocks[0][0] for block in blocks]
            if all(
                block == [c + shift for c in blocks[0]]
                for block, shift in zip(blocks, shifts, strict=True)
            ):
                cores = [tuple(c + shift for shift in shifts) for c in blocks[0]]
    if cores is None:
        return None
    return {c: core for core in cores for c in core}
