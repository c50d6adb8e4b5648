"""``triton-embed doctor``: read the host's topology and plan where embedder instances run.

Layers, each depending only on the ones before it:

* :mod:`~triton_embed_server.host.doctor.gather` runs the topology commands or reads their
  captures; :mod:`~triton_embed_server.host.doctor.host` combines the parsed outputs into a
  :class:`HostTopology`.
* :mod:`~triton_embed_server.host.doctor.placement_plan` turns a host into a :class:`PlacementPlan`.
* :mod:`~triton_embed_server.host.doctor.report` renders both as text.
* :mod:`~triton_embed_server.host.doctor.chart` turns a host and its plan into Helm chart values
  (pods per host, CPUs, memory and GPUs per pod).
* :mod:`~triton_embed_server.host.doctor.pod` checks, inside a pod, that the container's CPUs,
  memory and GPUs are on one NUMA node.
* :mod:`~triton_embed_server.host.doctor.command` is the CLI entry, :func:`run_doctor`.
"""

from triton_embed_server.host.doctor.chart import (
    ChartValues,
    NodeShare,
    chart_values,
    render_chart_values,
)
from triton_embed_server.host.doctor.command import run_doctor
from triton_embed_server.host.doctor.gather import (
    CAPTURE_FILES,
    COMMANDS,
    CommandOutput,
    gather_host,
    run_command,
)
from triton_embed_server.host.doctor.host import SYSFS_SIBLINGS, HostGpu, HostTopology, build_host
from triton_embed_server.host.doctor.placement_plan import (
    PlacementPlan,
    PlannedInstance,
    ServerPlan,
    host_plan,
    plan_placement,
)
from triton_embed_server.host.doctor.pod import (
    ALIGNED,
    NOT_ALIGNED,
    PodCheck,
    check_pod,
    judge_alignment,
    render_pod_check,
)
from triton_embed_server.host.doctor.report import render_report

__all__ = [
    "ALIGNED",
    "CAPTURE_FILES",
    "COMMANDS",
    "NOT_ALIGNED",
    "SYSFS_SIBLINGS",
    "ChartValues",
    "CommandOutput",
    "HostGpu",
    "HostTopology",
    "NodeShare",
    "PlacementPlan",
    "PlannedInstance",
    "PodCheck",
    "ServerPlan",
    "build_host",
    "chart_values",
    "check_pod",
    "gather_host",
    "host_plan",
    "judge_alignment",
    "plan_placement",
    "render_chart_values",
    "render_pod_check",
    "render_report",
    "run_command",
    "run_doctor",
]
