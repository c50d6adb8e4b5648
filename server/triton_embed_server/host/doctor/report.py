"""The doctor's text report: the host's sources, CPUs, GPUs, links, and the placement plan."""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from triton_embed_server.host.doctor.host import HostTopology
from triton_embed_server.host.doctor.placement_plan import PlacementPlan
from triton_embed_server.host.topology import P2P_LEGEND, SMP_LABELS, format_cpu_list


def _pairs_line(pairs: Sequence[str], labels: dict[str, str]) -> str:
    """GPU pairs with their link labels; ``all N pairs (...)`` when every pair is listed."""
    if not pairs:
        return "none"
    kinds = sorted({labels[p] for p in pairs})
    if len(pairs) == len(labels) > 1:
        return f"all {len(pairs)} pairs ({', '.join(kinds)})"
    return ", ".join(f"{p} ({labels[p]})" for p in pairs)


def render_report(host: HostTopology, plan: PlacementPlan) -> str:
    """A readable report: sources, CPUs per NUMA node, GPUs, links, P2P, the plan, warnings."""
    out: list[str] = ["triton-embed doctor", "", "Sources:"]
    width = max((len(k) for k in host.sources), default=0)
    out += [f"  {k:<{width}}  {v}" for k, v in host.sources.items()]

    out += ["", "CPUs:"]
    cpu = host.lscpu
    if cpu is not None:
        shape = " x ".join(
            f"{v} {what}"
            for v, what in (
                (cpu.sockets, "socket(s)"),
                (cpu.cores_per_socket, "cores"),
                (cpu.threads_per_core, "thread(s) per core"),
            )
            if v is not None
        )
        out.append(
            f"  {cpu.model_name or 'unknown model'} ({cpu.vendor_id or 'unknown vendor'}): "
            f"{cpu.cpus} logical CPUs, online {cpu.online_cpus or '?'}"
            + (f"; {shape}" if shape else "")
        )
    out.append(f"  NUMA nodes (from {host.numa_source}):")
    numa = host.numa
    for node, cpus in host.numa_nodes.items():
        mem = ""
        if numa is not None and node in numa.nodes and numa.nodes[node].size_mb is not None:
            mem = f", {numa.nodes[node].size_mb} MB memory ({numa.nodes[node].free_mb} MB free)"
        out.append(f"    node {node}: CPUs {format_cpu_list(cpus)} ({len(cpus)} CPUs){mem}")
    if numa is not None and len(numa.distance_nodes) > 1:
        out.append(
            "  NUMA distances (10 = local): "
            + "; ".join(
                f"{a}: " + " ".join(str(d) for d in row)
                for a, row in zip(numa.distance_nodes, numa.distance_matrix, strict=True)
            )
        )

    out += ["", "GPUs:"]
    if not host.gpus:
        out.append("  none (CPU-only host)")
    else:
        out.append(f"  {'GPU':<6}{'NUMA':<6}{'CPU affinity':<22}NUMA node from")
        for g in host.gpus:
            node = "?" if g.numa_node is None else str(g.numa_node)
            out.append(
                f"  {g.name:<6}{node:<6}{format_cpu_list(g.cpus) or 'N/A':<22}{g.numa_source}"
            )
    topo = host.topo
    if topo is not None and topo.gpu_count > 1:
        links = topo.links
        out += ["", "GPU pairs by link (nvidia-smi topo -m legend):"]
        for title, labels in (
            ("NVLink (NV#)", ["NV#"]),
            ("PCIe switch, no CPU (PIX/PXB)", ["PIX", "PXB"]),
            ("through the CPU root complex within a node (PHB/NODE)", ["PHB", "NODE"]),
            ("across the SMP interconnect between NUMA nodes (SYS)", sorted(SMP_LABELS)),
        ):
            out.append(f"  {title}: {_pairs_line(topo.pairs_with(labels), links)}")
        out.append(f"  on different NUMA nodes: {_pairs_line(topo.cross_numa_pairs, links)}")
    if host.p2p is not None:
        mode = f" -p2p {host.p2p.mode}" if host.p2p.mode else " -p2p"
        problems = host.p2p.non_ok_pairs
        if not host.p2p.status:
            text = "one GPU, no pairs"
        elif not problems:
            text = "all pairs OK"
        else:
            text = ", ".join(f"{p} {s} ({P2P_LEGEND.get(s, s)})" for p, s in problems.items())
        out += ["", f"Peer-to-peer (nvidia-smi topo{mode}): {text}"]

    out += ["", _plan_title(plan)]
    out += _cores_lines(host, plan)
    for s in plan.servers:
        node = "unknown node" if s.numa_node is None else f"NUMA node {s.numa_node}"
        prefix = shlex.join(s.numactl_prefix) if s.numactl_prefix else "no numactl binding"
        env = " ".join(f"{k}={v}" for k, v in s.env.items())
        out.append(
            f"  server on {node}: {prefix}"
            + (f", {env}" if env else "")
            + f"; CPUs {format_cpu_list(s.cpus) or 'any'}"
        )
        for index in s.instances:
            inst = plan.instances[index]
            where = "CPU only" if inst.gpu is None else f"GPU {inst.gpu}"
            out.append(
                f"    instance {inst.index}: {where}, "
                f"CPUs {format_cpu_list(inst.cpus) or 'not pinned'}"
            )

    warnings = [*host.warnings, *plan.warnings]
    out += ["", "Warnings:" if warnings else "Warnings: none"]
    out += [f"  - {w}" for w in warnings]
    return "\n".join(out) + "\n"


def _cores_lines(host: HostTopology, plan: PlacementPlan) -> list[str]:
    """How the plan's CPU slices relate to physical cores (nothing when nothing is pinned)."""
    nodes = sorted({i.numa_node for i in plan.instances if i.numa_node is not None and i.cpus})
    if not nodes:
        return []
    known = [n for n in nodes if host.siblings_known(n)]
    unknown = [n for n in nodes if not host.siblings_known(n)]
    out = []
    if known:
        smt = any(len(core) > 1 for n in known for core in host.core_groups(n))
        what = "SMT siblings kept together" if smt else "one thread per core"
        where = "" if not unknown else f" on NUMA node(s) {', '.join(map(str, known))}"
        out.append(
            f"  CPU slices are whole physical cores ({what}){where}; cores from {host.smt_source}"
        )
    if unknown:
        out.append(
            f"  CPU slices follow CPU numbers on NUMA node(s) {', '.join(map(str, unknown))}: "
            "SMT siblings unknown"
        )
    return out


def _plan_title(plan: PlacementPlan) -> str:
    """The plan section's heading: the host kind and the instance count."""
    if plan.kind == "cpu":
        return f"Placement plan (CPU-only host, {plan.cpu_instances} instance(s)):"
    return f"Placement plan ({plan.instances_per_gpu} instance(s) per GPU):"
