"""Where ``nvidia-smi topo -m`` is parsed: the GPU/NIC link matrix and each GPU's affinity.

:func:`parse_topo_matrix` reads what ``nvidia-smi topo -m`` printed (options as listed by
``nvidia-smi topo -h``) into a :class:`TopoMatrix`: the devices, the link label of every
device pair and, per GPU, its ``CPU Affinity``, ``NUMA Affinity`` and ``GPU NUMA ID`` columns.

Link labels (the legend nvidia-smi prints under the matrix):

* ``X``    -- self,
* ``SYS``  -- PCIe plus the SMP interconnect between NUMA nodes (QPI/UPI/Infinity Fabric);
  older drivers printed ``SOC`` for the same thing,
* ``NODE`` -- PCIe plus the interconnect between PCIe host bridges within one NUMA node,
* ``PHB``  -- PCIe plus a PCIe host bridge (typically the CPU),
* ``PXB``  -- several PCIe bridges, without the host bridge,
* ``PIX``  -- at most one PCIe bridge,
* ``NV#``  -- a bonded set of ``#`` NVLinks (``NV18`` = 18 links, e.g. through NVSwitch).

``SYS``, ``NODE`` and ``PHB`` go through the CPU's root complex (:data:`CPU_PATH_LABELS`);
``PIX``, ``PXB`` and ``NV#`` do not. ``SYS``/``SOC`` cross NUMA nodes (:data:`SMP_LABELS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from triton_embed_server.host.topology import _text
from triton_embed_server.host.topology.cpulist import parse_cpu_ranges
from triton_embed_server.host.topology.errors import TopologyParseError

TOPO_CMD = "nvidia-smi topo -m"

#: Labels whose path goes through the CPU's root complex / host bridge.
CPU_PATH_LABELS = frozenset({"SYS", "SOC", "NODE", "PHB"})
#: Labels that cross the SMP interconnect between NUMA nodes.
SMP_LABELS = frozenset({"SYS", "SOC"})

_LINK_LABEL = re.compile(r"X|SYS|SOC|NODE|PHB|PXB|PIX|NV\d+")
_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_AFFINITY_FIRST_WORDS = frozenset({"CPU", "NUMA", "GPU"})


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
            "cpu_ranges": _text.ranges_json(self.cpu_ranges),
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
        return self.links[_text.pair(a, b) if i < j else _text.pair(b, a)]

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
    lines, header_at = _text.matrix_lines(
        text,
        TOPO_CMD,
        "the GPU matrix whose header starts with 'GPU0'",
        "the matrix printed by 'nvidia-smi topo -m' (GPU0 GPU1 ... CPU Affinity NUMA Affinity)",
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

    gpus = tuple(d for d in devices if _text.GPU_NAME.fullmatch(d))
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
                    out[_text.pair(a, b)] = cells[a][ib]
        return out

    legend = nic_legend = None
    for i, line in enumerate(lines[end:], start=end):
        stripped = line.strip()
        if stripped == "Legend:":
            legend = _text.parse_legend_block(lines, i, r"(\S+)\s*=\s*(.+?)")
        elif stripped == "NIC Legend:":
            nic_legend = _text.parse_legend_block(lines, i, r"(\S+):\s*(\S.*?)")

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
        ansi_escapes=bool(_text.ANSI_ESCAPE.search(text)),
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
