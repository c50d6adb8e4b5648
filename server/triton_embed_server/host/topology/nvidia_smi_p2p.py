"""Where ``nvidia-smi topo -p2p <mode>`` is parsed: the GPU peer-to-peer status matrix.

:func:`parse_p2p` reads what ``nvidia-smi topo -p2p r|w|n|a|p`` printed (modes and status
codes as listed by ``nvidia-smi topo -h`` and the legend under the matrix) into a
:class:`P2PMatrix`: per ordered GPU pair, whether peer-to-peer access of that kind works.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from triton_embed_server.host.topology import _text
from triton_embed_server.host.topology.errors import TopologyParseError

P2P_CMD = "nvidia-smi topo -p2p"

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
                    out[_text.pair(a, b)] = ab
                elif ab == "OK":
                    out[_text.pair(a, b)] = ba
                else:
                    out[_text.pair(a, b)] = f"{ab}/{ba}"
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
    lines, header_at = _text.matrix_lines(
        text, cmd, "a matrix whose header is 'GPU0 GPU1 ...'", "'GPU0 GPU1 ...'"
    )
    gpus = lines[header_at].split()
    if not all(_text.GPU_NAME.fullmatch(g) for g in gpus):
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
            legend = _text.parse_legend_block(lines, i, r"(\S+)\s*=\s*(.+?)")
    return P2PMatrix(gpus=tuple(gpus), status=status, legend=legend, mode=mode)
