"""Hosts for the doctor tests, built from the real captures in ``tests/data/topology``.

topo_m_06 + numactl_01 + lscpu_01 are one machine (ASUS ESC8000A-E12), topo_m_05 + lscpu_04
another (RunPod); see ``tests/data/topology/README.md``. Expected plans in the tests are
written out by hand from the node CPU lists.
"""

from __future__ import annotations

from pathlib import Path

from triton_embed_server.host.doctor import (
    CAPTURE_FILES,
    COMMANDS,
    CommandOutput,
    HostTopology,
    build_host,
    gather_host,
    run_command,
)
from triton_embed_server.host.topology import parse_lscpu, parse_numactl, parse_topo_matrix

CAPTURES = Path(__file__).resolve().parents[2] / "data" / "topology"
H200_CAPTURES = CAPTURES.parent / "topology_h200"


def capture(name: str) -> str:
    """The text of a capture in ``tests/data/topology``."""
    return (CAPTURES / name).read_text()


def numactl_text(nodes: dict[int, range]) -> str:
    """``numactl --hardware`` output for the given node CPU lists."""
    lines = [f"available: {len(nodes)} nodes (0-{len(nodes) - 1})"]
    for n, cpus in nodes.items():
        lines += [
            f"node {n} cpus: {' '.join(map(str, cpus))}",
            f"node {n} size: 1000 MB",
            f"node {n} free: 900 MB",
        ]
    lines += ["node distances:", "node " + " ".join(f"  {n}" for n in nodes)]
    for a in nodes:
        lines.append(f"  {a}: " + " ".join(" 10" if a == b else " 21" for b in nodes))
    return "\n".join(lines) + "\n"


def asus_host() -> HostTopology:
    """ASUS ESC8000A-E12: 4x RTX 6000 Ada, 2x EPYC 9374F (topo_m_06 + numactl_01 + lscpu_01)."""
    return build_host(
        topo=parse_topo_matrix(capture("topo_m_06.txt")),
        numa=parse_numactl(capture("numactl_01.txt")),
        lscpu=parse_lscpu(capture("lscpu_01.txt")),
    )


def runpod_host() -> HostTopology:
    """RunPod: 4x A40, 2x Xeon Gold 6342 with SMT (topo_m_05 + lscpu_04)."""
    return build_host(
        topo=parse_topo_matrix(capture("topo_m_05.txt")),
        lscpu=parse_lscpu(capture("lscpu_04.txt")),
    )


def h200_host() -> HostTopology:
    """8x H200 NVSwitch, 2 NUMA nodes (topo_m_03 alone)."""
    return build_host(topo=parse_topo_matrix(capture("topo_m_03.txt")))


def span(a: int, b: int) -> list[int]:
    """``[a, ..., b]``."""
    return list(range(a, b + 1))


def instances(plan) -> list[dict]:
    """A plan's instances as JSON."""
    return plan.to_dict()["instances"]


def fake_runner(outputs: dict[tuple[str, ...], CommandOutput], calls: list):
    """A ``run`` for ``gather_host`` answering from ``outputs`` and recording its calls."""

    def run(argv, timeout_s):
        calls.append((tuple(argv), timeout_s))
        return outputs.get(tuple(argv), CommandOutput(None, "not available: not in this test"))

    return run


def no_gpu_runner(argv, timeout_s):
    """Runs the commands of this machine, as if nvidia-smi were not installed."""
    if argv[0] == "nvidia-smi":
        return CommandOutput(None, "not available: nvidia-smi not found on PATH")
    return run_command(argv, timeout_s)


def write_capture(folder: Path, **names: str) -> Path:
    """A ``--from-dir`` folder holding the given captures (``topo_m="topo_m_06.txt"``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for key, name in names.items():
        (folder / CAPTURE_FILES[key]).write_text(capture(name))
    return folder


def make_cpu_sysfs(root: Path, siblings: dict[int, tuple[int, ...]]) -> Path:
    """A fake ``/sys/devices/system/cpu`` with ``thread_siblings_list`` per CPU."""
    for cpu, sib in siblings.items():
        (root / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(
            ",".join(map(str, sib)) + "\n"
        )
    return root


def runpod_live(tmp_path: Path, siblings: dict[int, tuple[int, ...]], node_sysfs) -> HostTopology:
    """The RunPod host read live: its captures as command outputs, sysfs from ``siblings``."""
    run = fake_runner(
        {
            COMMANDS["topo_m"]: CommandOutput(capture("topo_m_05.txt"), "ok"),
            COMMANDS["lscpu"]: CommandOutput(capture("lscpu_04.txt"), "ok"),
            COMMANDS["numactl"]: CommandOutput(None, "not available: numactl not found on PATH"),
        },
        [],
    )
    return gather_host(
        run=run,
        sysfs_root=node_sysfs(tmp_path / "node", {0: "0-23,48-71", 1: "24-47,72-95"}),
        process_cpus=lambda: range(96),
        cpu_sysfs_root=make_cpu_sysfs(tmp_path / "cpu", siblings),
    )


def assert_no_shared_core(plan, core_of) -> None:
    """No two instances hold CPUs of the same physical core (``core_of``: CPU -> core id)."""
    owner: dict = {}
    for inst in plan.instances:
        for cpu in inst.cpus:
            assert owner.setdefault(core_of(cpu), inst.index) == inst.index, (cpu, inst.index)
