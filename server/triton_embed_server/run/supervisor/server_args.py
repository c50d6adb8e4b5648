"""What the supervisor reads from, and adds to, tritonserver's command line.

:func:`option_value` reads one option; :func:`server_arguments` adds explicit model control
(model reloads need it) and non-strict readiness; :func:`server_endpoints` lists the HTTP,
gRPC and metrics endpoints the server will listen on (a restart waits for their ports).
"""

from __future__ import annotations

from triton_embed_server.host.shm.tritonserver_args import option_values


def option_value(args: list[str], name: str, default: str) -> str:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``args`` (the last wins)."""
    return (option_values(args, name) or [default])[-1]


def _given(args: list[str], name: str) -> bool:
    return any(a == name or a.startswith(name + "=") for a in args)


def server_arguments(args: list[str]) -> list[str]:
    """``args`` plus explicit model control and non-strict readiness, unless given.

    Explicit model control: reloads need it. ``--strict-readiness false``: with Triton's
    default (true) the whole server reports not ready (``/v2/health/ready`` 400) while any
    model is unloading, and for good after a model fails to load through the repository API
    (Triton 2.51 keeps the failed load's state until a load of that name succeeds), so one
    bad ``repository load`` would take every model of the server out of its load balancer.
    The server is still not ready before its initial models are loaded (its endpoints open
    only then) and per-model readiness (``/v2/models/<name>/ready``) is unchanged.
    """
    out = list(args)
    if not _given(args, "--model-control-mode"):
        out += ["--model-control-mode", "explicit", "--load-model", "*"]
    if not _given(args, "--strict-readiness"):
        out += ["--strict-readiness", "false"]
    return out


def server_endpoints(args: list[str]) -> list[tuple[str, str, int]]:
    """``(name, address, port)`` of each endpoint tritonserver will listen on.

    From ``--allow-{http,grpc,metrics}``, ``--{name}-address`` (default ``0.0.0.0``) and
    ``--{name}-port`` (default 8000, 8001, 8002) in the server's arguments.
    """
    out = []
    for name, port in (("http", 8000), ("grpc", 8001), ("metrics", 8002)):
        allowed = option_value(args, f"--allow-{name}", "true").lower()
        if allowed in ("false", "0", "no", "off"):
            continue
        address = option_value(args, f"--{name}-address", "0.0.0.0")
        out.append((name, address, int(option_value(args, f"--{name}-port", str(port)))))
    return out
