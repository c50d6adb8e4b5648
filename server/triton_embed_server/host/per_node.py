"""One ``tritonserver`` per NUMA node, as ``triton-embed doctor`` plans it.

A process that runs on one NUMA node while its memory and GPUs belong to another reaches them
across the interconnect between the sockets, with more latency and less bandwidth than local
accesses. On a multi-node host this starts each planned server under
``numactl --cpunodebind=N --membind=N`` with ``CUDA_VISIBLE_DEVICES`` set to that node's GPUs
and its own ports (node k listens on the base ports + ``port_step * k``); inside it,
``numa_placement=auto`` places the instances on that node's cores. On a single-node host it
runs one server, exactly like ``scripts/serve.sh``.

Requests are not routed between the servers by this process: each server is a complete
``embed`` endpoint, and clients (or a gRPC load balancer in front) spread requests across the
endpoints it prints (README, "Operations").

    PER_NUMA_NODE=1 scripts/serve.sh [tritonserver arguments]
    python -m triton_embed_server.host.per_node --dry-run      # print the commands only
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.host.admin_key import LOCAL_HTTP_ADDRESS, redact
from triton_embed_server.models.instance_group import instance_count, read_config_pbtxt
from triton_embed_server.run.supervisor import option_value

BASE_PORTS = {"http": 8000, "grpc": 8001, "metrics": 8002}
PORT_STEP = 10


@dataclass(frozen=True)
class NodeServer:
    """One planned server: its command line, environment additions and ports."""

    numa_node: int | None
    argv: list[str]
    env: dict[str, str]
    ports: dict[str, int]


def embedder_count(repository: Path, config_name: str | None) -> int:
    """The embedder's instances per device in the config the server will load.

    Raises:
        OSError: the config cannot be read.
        ValueError: it is not a Triton model config.
    """
    folder = repository / "embedder"
    path = folder / "configs" / f"{config_name}.pbtxt" if config_name else folder / "config.pbtxt"
    return instance_count(read_config_pbtxt(path)).per_device


def node_servers(
    plan: dict,
    tritonserver_args: list[str],
    bind_address: str = "127.0.0.1",
    base_ports: dict[str, int] = BASE_PORTS,
    port_step: int = PORT_STEP,
) -> list[NodeServer]:
    """The server commands of a placement plan (``PlacementPlan.to_dict()``).

    Each runs ``python -m triton_embed_server.run.supervisor -- <tritonserver_args> <ports>``
    behind the plan's ``numactl_prefix`` (none on a single-node host). gRPC and metrics listen
    on ``bind_address``, HTTP on loopback only
    (:data:`~triton_embed_server.host.admin_key.LOCAL_HTTP_ADDRESS`).
    """
    servers = []
    for k, planned in enumerate(plan.get("servers") or [{}]):
        ports = {name: port + port_step * k for name, port in base_ports.items()}
        argv = [
            *(planned.get("numactl_prefix") or []),
            sys.executable,
            "-m",
            "triton_embed_server.run.supervisor",
            "--",
            *tritonserver_args,
        ]
        for name in ("http", "grpc", "metrics"):
            address = LOCAL_HTTP_ADDRESS if name == "http" else bind_address
            argv += [f"--{name}-address", address, f"--{name}-port", str(ports[name])]
        servers.append(
            NodeServer(planned.get("numa_node"), argv, dict(planned.get("env") or {}), ports)
        )
    return servers


def main(argv: list[str] | None = None) -> int:
    """Plan, start the servers, forward SIGINT/SIGTERM to them, exit with the worst code."""
    from triton_embed_server.host import doctor

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bind-address", default=os.environ.get("BIND_ADDRESS", "127.0.0.1"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands, start nothing")
    parser.add_argument(
        "tritonserver_args",
        nargs=argparse.REMAINDER,
        help="after --: arguments for every server (--model-repository is required)",
    )
    args = parser.parse_args(argv)
    rest = [a for a in args.tritonserver_args if a != "--"]
    repository = Path(option_value(rest, "--model-repository", "model_repository"))
    config_name = option_value(rest, "--model-config-name", "") or None
    try:
        count = embedder_count(repository, config_name)
    except (OSError, ValueError) as exc:
        print(
            f"per_node: error: cannot read the embedder config of {repository}: {exc}",
            file=sys.stderr,
        )
        return 1
    host = doctor.gather_host()
    plan = doctor.plan_placement(host, instances_per_gpu=count, cpu_instances=count).to_dict()
    base = {
        name: int(option_value(rest, f"--{name}-port", str(port)))
        for name, port in BASE_PORTS.items()
    }
    servers = node_servers(plan, rest, args.bind_address, base)
    for s in servers:
        node = "any node" if s.numa_node is None else f"NUMA node {s.numa_node}"
        env = " ".join(f"{k}={v}" for k, v in s.env.items())
        print(
            f"per_node: {node}: grpc {args.bind_address}:{s.ports['grpc']}, "
            f"http {LOCAL_HTTP_ADDRESS}:{s.ports['http']}, metrics :{s.ports['metrics']}: "
            f"{env} {' '.join(redact(s.argv))}".replace("  ", " "),  # no admin key in logs
            flush=True,
        )
    if args.dry_run:
        return 0
    # The servers share this host's /dev/shm: it must hold all their stubs' shared memory
    # before any starts (each server's supervisor then checks its own share again).
    from triton_embed_server.host import shm

    try:
        needed = sum(
            shm.plan_arguments(rest, len(p.get("gpus") or []) or None).needed_bytes(
                shm.given_default_byte_size(rest)
            )
            for p in plan.get("servers") or [{}]
        )
        shm.require_space(needed, f"the Python-backend stubs of {len(servers)} server(s)")
    except shm.SharedMemoryError as exc:
        print(f"per_node: error: {exc}", file=sys.stderr, flush=True)
        return shm.EXIT_TOO_SMALL
    except (OSError, ValueError) as exc:  # tritonserver reports a bad config itself
        print(f"per_node: shared memory not sized: {exc}", file=sys.stderr, flush=True)
    procs = [subprocess.Popen(s.argv, env={**os.environ, **s.env}) for s in servers]

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    # One node's server gone (a failed start, or the supervisor giving up: exit 75 when its
    # restart budget is spent, 70 with restarts off) stops the others:
    # an orchestrator then restarts the whole host instead of serving with a node missing.
    while True:
        done = [
            (s, p.returncode) for s, p in zip(servers, procs, strict=True) if p.poll() is not None
        ]
        if done:
            break
        time.sleep(1)
    server, code = done[0]
    if len(done) < len(procs) or code:
        print(
            f"per_node: the server of NUMA node {server.numa_node} exited with {code}; "
            "stopping the others",
            file=sys.stderr,
            flush=True,
        )
    forward(signal.SIGTERM, None)
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c), 0)


if __name__ == "__main__":
    sys.exit(main())
