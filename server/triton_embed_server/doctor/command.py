"""``triton-embed doctor``: read the host, plan the placement, print the report or JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from triton_embed_server.doctor.gather import gather_host
from triton_embed_server.doctor.plan import plan_placement
from triton_embed_server.doctor.report import render_report


def run_doctor(args: argparse.Namespace) -> dict[str, Any]:
    """Print the report (or JSON) and return the JSON payload.

    The payload is ``{"host": HostTopology.to_dict(), "plan": PlacementPlan.to_dict(),
    "warnings": [...]}`` (host and plan warnings together); ``--plan-out`` gets the plan.

    Args:
        args: the parsed ``doctor`` subcommand: ``from_dir``, ``instances_per_gpu``,
            ``cpu_instances``, ``plan_out``, ``json``.

    Raises:
        TopologyParseError: unparseable input (see
            :func:`~triton_embed_server.doctor.gather.gather_host`).
        ValueError: a count below 1.
    """
    host = gather_host(from_dir=args.from_dir)
    plan = plan_placement(
        host, instances_per_gpu=args.instances_per_gpu, cpu_instances=args.cpu_instances
    )
    payload = {
        "host": host.to_dict(),
        "plan": plan.to_dict(),
        "warnings": [*host.warnings, *plan.warnings],
    }
    if args.plan_out is not None:
        args.plan_out.parent.mkdir(parents=True, exist_ok=True)
        args.plan_out.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    if args.json:
        print(json.dumps(payload, indent=2))
    else:
        print(render_report(host, plan), end="")
    return payload
