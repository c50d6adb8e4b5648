"""``triton-embed doctor``: read the host, plan the placement, print the report or JSON.

Two more outputs: ``--chart-values [FILE|-]`` (Helm values for this host, from the plan:
:mod:`~triton_embed_server.host.doctor.chart`) and ``--in-pod`` (inside a pod: are the
container's CPUs, memory and GPUs on one NUMA node: :mod:`~triton_embed_server.host.doctor.pod`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from triton_embed.cli_args import positive_int

from triton_embed_server.host.doctor.chart import (
    DEFAULT_RESERVED_CORES,
    chart_values,
    render_chart_values,
)
from triton_embed_server.host.doctor.gather import gather_host
from triton_embed_server.host.doctor.placement_plan import plan_placement
from triton_embed_server.host.doctor.pod import check_pod, render_pod_check
from triton_embed_server.host.doctor.report import render_report

#: Embedder instances on a CPU-only host when ``--cpu-instances`` is not given: the shipped
#: CPU config's ``instance_group`` count (model_repository/embedder/config.pbtxt). With
#: ``--chart-values`` it is per NUMA node, so that every node gets a pod of that count.
DEFAULT_CPU_INSTANCES = 2
#: ``--chart-values`` with no file: the values go to standard output.
STDOUT = "-"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``doctor`` to the ``triton-embed`` subcommands (entry point ``triton_embed.commands``).

    Its ``run`` default returns the exit status: 1 when ``--in-pod`` finds the container NOT
    ALIGNED, else ``None`` (0).
    """
    d = subparsers.add_parser(
        "doctor", help="host topology (GPUs, NUMA nodes, cores) and a placement plan"
    )
    add_doctor_args(d)
    d.set_defaults(run=_exit_status)


def _exit_status(args: argparse.Namespace) -> int | None:
    return 1 if run_doctor(args).get("aligned") is False else None


def add_doctor_args(d: argparse.ArgumentParser) -> None:
    """The flags of ``triton-embed doctor`` (read by :func:`run_doctor`)."""
    d.add_argument("--json", action="store_true", help="print JSON (keys: host, plan, warnings)")
    d.add_argument(
        "--from-dir",
        type=Path,
        default=None,
        help="read captured outputs instead of running the commands: topo_m.txt "
        "(nvidia-smi topo -m), p2p.txt (nvidia-smi topo -p2p w|r), lscpu.txt (lscpu), "
        "numactl.txt (numactl --hardware)",
    )
    d.add_argument(
        "--instances-per-gpu",
        type=positive_int,
        default=4,
        help="embedder instances per GPU (default %(default)s)",
    )
    d.add_argument(
        "--cpu-instances",
        type=positive_int,
        default=None,
        help="embedder instances on a CPU-only host, spread over NUMA nodes (default "
        f"{DEFAULT_CPU_INSTANCES}; with --chart-values {DEFAULT_CPU_INSTANCES} per NUMA node)",
    )
    d.add_argument("--plan-out", type=Path, default=None, help="also write the plan as JSON")
    d.add_argument(
        "--chart-values",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE|-",
        help="Helm values of deploy/helm/triton-embed for this host (pods per node, CPUs, "
        "memory and GPUs per pod) as YAML, to FILE or, with - or no FILE, to standard output "
        "instead of the report (docs/kubernetes.md)",
    )
    d.add_argument(
        "--reserved-cores",
        type=positive_int,
        default=DEFAULT_RESERVED_CORES,
        help="with --chart-values: physical cores held back on every NUMA node for the "
        "kubelet, the system and other pods (default %(default)s; twice that on a host with "
        "one NUMA node)",
    )
    d.add_argument(
        "--in-pod",
        "--check-pod",
        dest="in_pod",
        action="store_true",
        help="inside a pod: check that the container's CPUs (cpuset), memory nodes "
        "(Mems_allowed_list) and GPUs are on one NUMA node; exit 0 ALIGNED, 1 NOT ALIGNED",
    )


def run_doctor(args: argparse.Namespace) -> dict[str, Any]:
    """Print the report (or JSON, chart values, the in-pod verdict) and return the payload.

    The payload is ``{"host": HostTopology.to_dict(), "plan": PlacementPlan.to_dict(),
    "warnings": [...]}`` (host and plan warnings together), plus ``"chart_values"``
    (:meth:`~triton_embed_server.host.doctor.chart.ChartValues.to_dict`) with
    ``--chart-values``; ``--plan-out`` gets the plan. With ``--in-pod`` it is
    :meth:`~triton_embed_server.host.doctor.pod.PodCheck.to_dict`, whose ``aligned`` the CLI turns
    into the exit status.

    Args:
        args: the parsed ``doctor`` subcommand: ``from_dir``, ``instances_per_gpu``,
            ``cpu_instances`` (None: :data:`DEFAULT_CPU_INSTANCES`), ``plan_out``, ``json``,
            and when present ``chart_values`` (a path, ``"-"`` or None), ``reserved_cores``,
            ``in_pod``.

    Raises:
        TopologyParseError: unparseable input (see
            :func:`~triton_embed_server.host.doctor.gather.gather_host`).
        ValueError: a count below 1, flags that exclude each other, or a host on which no pod
            fits (see :func:`~triton_embed_server.host.doctor.chart.chart_values`).
    """
    values_to = getattr(args, "chart_values", None)
    if getattr(args, "in_pod", False):
        if args.from_dir is not None or values_to is not None:
            raise ValueError(
                "--in-pod checks this container; --from-dir and --chart-values do not apply"
            )
        return _run_pod_check(args)
    if values_to == STDOUT and args.json:
        raise ValueError(
            "--json and --chart-values - both write to standard output; give --chart-values a file"
        )
    host = gather_host(from_dir=args.from_dir)
    cpu_instances = args.cpu_instances
    if cpu_instances is None:
        per_node = values_to is not None and not host.gpus
        cpu_instances = DEFAULT_CPU_INSTANCES * (len(host.numa_nodes) if per_node else 1)
    plan = plan_placement(
        host, instances_per_gpu=args.instances_per_gpu, cpu_instances=cpu_instances
    )
    payload: dict[str, Any] = {
        "host": host.to_dict(),
        "plan": plan.to_dict(),
        "warnings": [*host.warnings, *plan.warnings],
    }
    if args.plan_out is not None:
        args.plan_out.parent.mkdir(parents=True, exist_ok=True)
        args.plan_out.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    if values_to is not None:
        reserved = getattr(args, "reserved_cores", None) or DEFAULT_RESERVED_CORES
        values = chart_values(host, plan, reserved_cores=reserved)
        payload["chart_values"] = values.to_dict()
        text = render_chart_values(values)
        if values_to == STDOUT:
            for warning in [*host.warnings, *plan.warnings, *values.warnings]:
                print(f"triton-embed doctor: warning: {warning}", file=sys.stderr)
            print(text, end="")
            return payload
        path = Path(values_to)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print(render_report(host, plan), end="")
        if values_to is not None:
            v = values.values()["triton"]
            print(
                f"\nChart values ({values_to}): {values.pods_per_host} pod(s) per host, each "
                f"{v['resources']['cpu']} CPUs, {v['resources']['memory']}, "
                f"{v['gpusPerPod']} GPU(s), {v['instancesPerGpu']} instance(s) per GPU"
                + ("" if values.kind == "gpu" else " (CPU pods: per pod)")
            )
            print(
                *(f"  - {w}" for w in values.warnings),
                sep="\n",
                end="\n" if values.warnings else "",
            )
    return payload


def _run_pod_check(args: argparse.Namespace) -> dict[str, Any]:
    """``--in-pod``: the verdict as text or JSON; the payload carries ``aligned``."""
    check = check_pod()
    payload = check.to_dict()
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print(render_pod_check(check), end="")
    return payload
