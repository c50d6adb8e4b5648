"""Where the doctor reads a host: it runs the topology commands, or reads their captures.

Live, :func:`gather_host` runs ``nvidia-smi topo -m``, ``nvidia-smi topo -p2p w``, ``lscpu``
and ``numactl --hardware`` (see :data:`COMMANDS`), falls back to sysfs for NUMA nodes, reads
SMT siblings from sysfs and cuts the CPUs to this process's affinity. From a folder, it reads
the captured outputs (:data:`CAPTURE_FILES`) of another host. Either way the parsed results go
to :func:`~triton_embed_server.host.doctor.host.build_host`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.host.doctor.host import HostTopology, build_host
from triton_embed_server.host.topology import (
    LSCPU_CMD,
    NUMACTL_CMD,
    P2P_CMD,
    SYSFS_CPU_ROOT,
    SYSFS_NODE_ROOT,
    TOPO_CMD,
    TopologyParseError,
    parse_lscpu,
    parse_numactl,
    parse_p2p,
    parse_topo_matrix,
    read_sysfs_cpu_siblings,
    read_sysfs_nodes,
)

#: File names ``--from-dir`` reads: the captured standard output of each command.
CAPTURE_FILES = {
    "topo_m": "topo_m.txt",  # nvidia-smi topo -m
    "p2p": "p2p.txt",  # nvidia-smi topo -p2p w (or r)
    "lscpu": "lscpu.txt",  # LC_ALL=C lscpu
    "numactl": "numactl.txt",  # numactl --hardware
}
#: The commands :func:`gather_host` runs on this host.
COMMANDS = {
    "topo_m": ("nvidia-smi", "topo", "-m"),
    "p2p": ("nvidia-smi", "topo", "-p2p", "w"),
    "lscpu": ("lscpu",),
    "numactl": ("numactl", "--hardware"),
}
COMMAND_TIMEOUT_S = 10.0
OK = "ok"
#: The name of each source in :attr:`HostTopology.sources`.
_LABELS = {"topo_m": TOPO_CMD, "p2p": P2P_CMD, "lscpu": LSCPU_CMD, "numactl": NUMACTL_CMD}


@dataclass(frozen=True)
class CommandOutput:
    """A command's standard output, or why there is none.

    Attributes:
        text: the output; None when the command could not give one.
        status: ``"ok"`` or ``"not available: <why>"``.
    """

    text: str | None
    status: str


def run_command(argv: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> CommandOutput:
    """Run a read-only host command in the C locale; never raises.

    Returns:
        The output, or ``"not available: ..."`` naming a missing command, a timeout, or a
        non-zero exit status with the first line the command printed.
    """
    if shutil.which(argv[0]) is None:
        return CommandOutput(None, f"not available: {argv[0]} not found on PATH")
    try:
        done = subprocess.run(
            list(argv),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env={**os.environ, "LC_ALL": "C"},
        )
    except subprocess.TimeoutExpired:
        return CommandOutput(
            None, f"not available: {' '.join(argv)} timed out after {timeout_s:g} s"
        )
    except OSError as exc:
        return CommandOutput(None, f"not available: {' '.join(argv)}: {exc}")
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        why = f": {said[0].strip()}" if said else ""
        return CommandOutput(
            None, f"not available: {' '.join(argv)} exited with status {done.returncode}{why}"
        )
    return CommandOutput(done.stdout, OK)


def gather_host(
    from_dir: Path | None = None,
    *,
    run: Callable[[Sequence[str], float], CommandOutput] = run_command,
    timeout_s: float = COMMAND_TIMEOUT_S,
    sysfs_root: Path = SYSFS_NODE_ROOT,
    process_cpus: Callable[[], Iterable[int]] = lambda: os.sched_getaffinity(0),
    cpu_sysfs_root: Path = SYSFS_CPU_ROOT,
) -> HostTopology:
    """Read this host's topology, or one captured in a folder.

    Live (``from_dir`` None): runs the :data:`COMMANDS` with ``timeout_s`` each; a missing
    command, a timeout or a non-zero exit is recorded as ``"not available: <why>"``; without
    numactl the NUMA nodes come from ``sysfs_root``; SMT siblings come from
    ``cpu_sysfs_root``; node CPU lists are cut to this process's CPU affinity. From a
    folder: reads the :data:`CAPTURE_FILES` that exist (no sysfs, no affinity: the folder
    describes another host; SMT siblings are guessed from lscpu and the CPU numbering).

    Args:
        from_dir: folder of captured outputs; None to run the commands here.
        run: runs one command (tests pass a fake).
        timeout_s: limit per command, seconds.
        sysfs_root: the sysfs NUMA folder used when numactl is not available.
        process_cpus: the CPUs this process may use (live only; tests pass a fake).
        cpu_sysfs_root: the sysfs ``cpu`` folder read for SMT siblings (live only).

    Raises:
        TopologyParseError: an output is present but cannot be parsed (the message names
            the command or file), or no source gives the CPUs.
        FileNotFoundError: ``from_dir`` is not a folder.
    """
    texts: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    if from_dir is not None:
        if not from_dir.is_dir():
            raise FileNotFoundError(f"--from-dir {from_dir}: no such folder")
        for key, fname in CAPTURE_FILES.items():
            path = from_dir / fname
            texts[key] = path.read_text(errors="replace") if path.is_file() else None
            sources[_LABELS[key]] = OK if texts[key] is not None else f"not available: no {path}"
        if all(t is None for t in texts.values()):
            raise TopologyParseError(
                f"--from-dir {from_dir}: holds none of {', '.join(CAPTURE_FILES.values())}"
            )
    else:
        for key in ("topo_m", "p2p", "lscpu", "numactl"):
            if key == "p2p" and texts.get("topo_m") is None:
                texts[key], sources[_LABELS[key]] = (
                    None,
                    "not available: no GPU matrix (nvidia-smi topo -m)",
                )
                continue
            out = run(COMMANDS[key], timeout_s)
            texts[key], sources[_LABELS[key]] = out.text, out.status

    def parsed(key: str, parse: Callable[[str], Any]) -> Any:
        text = texts.get(key)
        if text is None:
            return None
        try:
            return parse(text)
        except TopologyParseError as exc:
            where = f" ({from_dir / CAPTURE_FILES[key]})" if from_dir is not None else ""
            raise TopologyParseError(f"{exc}{where}") from exc

    p2p_mode = "w" if from_dir is None else None
    topo = parsed("topo_m", parse_topo_matrix)
    p2p = parsed("p2p", lambda t: parse_p2p(t, mode=p2p_mode))
    lscpu = parsed("lscpu", parse_lscpu)
    numa = parsed("numactl", parse_numactl)
    allowed = None
    siblings = None
    if from_dir is None:
        siblings = read_sysfs_cpu_siblings(cpu_sysfs_root)
        if numa is None:
            try:
                numa = read_sysfs_nodes(sysfs_root)
                sources["sysfs"] = OK
            except TopologyParseError as exc:
                sources["sysfs"] = f"not available: {exc}"
        allowed = sorted(process_cpus())
    host = build_host(topo, p2p, lscpu, numa, sources, allowed_cpus=allowed, siblings=siblings)
    if from_dir is not None and topo is None:
        missing = from_dir / CAPTURE_FILES["topo_m"]
        note = (
            f"no {missing}: planned as a CPU-only host; if the host has GPUs, add the output "
            f"of `{TOPO_CMD}` there"
        )
        host = dataclasses.replace(host, warnings=(*host.warnings, note))
    return host
