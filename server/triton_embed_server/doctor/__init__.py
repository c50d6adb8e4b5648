"""``triton-embed doctor``: read the host's topology and plan where embedder instances run.

Four layers, each depending only on the ones before it:

* :mod:`~triton_embed_server.doctor.gather` runs the topology commands or reads their
  captures; :mod:`~triton_embed_server.doctor.host` combines the parsed outputs into a
  :class:`HostTopology`.
* :mod:`~triton_embed_server.doctor.plan` turns a host into a :class:`PlacementPlan`.
* :mod:`~triton_embed_server.doctor.report` renders both as text.
* :mod:`~triton_embed_server.doctor.command` is the CLI entry, :func:`run_doctor`.
"""

from triton_embed_server.doctor.command import run_doctor
from triton_embed_server.doctor.gather import (
    CAPTURE_FILES,
    COMMANDS,
    CommandOutput,
    gather_host,
    run_command,
)
from triton_embed_server.doctor.host import SYSFS_SIBLINGS, HostGpu, HostTopology, build_host
from triton_embed_server.doctor.plan import (
    PlacementPlan,
    PlannedInstance,
    ServerPlan,
    host_plan,
    plan_placement,
)
from triton_embed_server.doctor.report import render_report

__all__ = [
    "CAPTURE_FILES",
    "COMMANDS",
    "SYSFS_SIBLINGS",
    "CommandOutput",
    "HostGpu",
    "HostTopology",
    "PlacementPlan",
    "PlannedInstance",
    "ServerPlan",
    "build_host",
    "gather_host",
    "host_plan",
    "plan_placement",
    "render_report",
    "run_command",
    "run_doctor",
]
