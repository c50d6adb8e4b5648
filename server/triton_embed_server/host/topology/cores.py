"""Physical cores from SMT sibling maps, and a guess of those maps from captured outputs.

* :func:`core_groups` -- split CPUs into physical cores, given which CPUs are siblings;
* :func:`infer_siblings` -- guess the siblings of a NUMA node's CPUs from their numbers
  alone, for captured ``lscpu`` / ``numactl --hardware`` / ``nvidia-smi topo -m`` outputs,
  which carry no sibling information (a live host reads them with
  :func:`~triton_embed_server.host.topology.sysfs.read_sysfs_cpu_siblings`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from triton_embed_server.host.topology.cpulist import cpu_ranges_of


def core_groups(
    cpus: Iterable[int], siblings: Mapping[int, Iterable[int]]
) -> tuple[tuple[int, ...], ...]:
    """Split CPUs into physical cores: each core a sorted tuple of its SMT sibling CPUs.

    Args:
        cpus: the CPUs to group (a NUMA node's); siblings outside them are left out, so a
            cpuset that holds one thread of a core gives a one-CPU core.
        siblings: per CPU, the CPUs of its core
            (:func:`~triton_embed_server.host.topology.sysfs.read_sysfs_cpu_siblings` or
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
      the k-th CPU of every block is one core. This is the usual x86 numbering of SMT threads:
      the first thread of every core, then the second (CPU ``c`` and ``c + N/t``).
    * ``t`` unknown (no lscpu): only the split shape with two threads per core, and only when
      it is unmistakable: the node is exactly two equal runs whose starts are
      ``host_cpu_count / 2`` apart (``0-31,64-95`` on a host of 128 CPUs).
    * anything else, including one contiguous run (``0-47`` fits both numberings): unknown.

    Args:
        cpus: the node's CPUs (before any cpuset cut: the pattern is the host's).
        threads_per_core: lscpu's ``Thread(s) per core``; None when not known.
        host_cpu_count: the number of CPUs of the whole host (all nodes); used only when
            ``threads_per_core`` is None.

    Returns:
        ``{cpu: its core's CPUs, sorted}`` for every CPU of ``cpus``, the shape of
        :func:`~triton_embed_server.host.topology.sysfs.read_sysfs_cpu_siblings`;
        None when the siblings cannot be told.
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
