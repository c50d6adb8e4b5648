"""The supervisor's command line: ``[supervisor options] -- <tritonserver arguments>``.

:func:`main` parses the supervisor's own options, sizes the Python-backend shared memory
(:func:`triton_embed_server.host.shm.server_arguments`), and runs a
:class:`~triton_embed_server.run.supervisor.core.Supervisor` on the tritonserver command line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from triton_embed_server.run.supervisor.core import Supervisor
from triton_embed_server.run.supervisor.policy import EXIT_RESTARTS_EXHAUSTED, RestartPolicy
from triton_embed_server.run.supervisor.server_args import server_arguments
from triton_embed_server.run.supervisor.startup import DEFAULT_STALL_S


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``[supervisor options] -- tritonserver-args...``.

    See :mod:`triton_embed_server.run.supervisor` for what the supervisor does.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    own, server_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else ([], argv)
    )
    parser = argparse.ArgumentParser(prog="python -m triton_embed_server.run.supervisor")
    parser.add_argument("--poll-s", type=float, default=1.0, help="seconds between checks")
    parser.add_argument(
        "--max-reloads", type=int, default=3, help="failed reloads in a row before a restart"
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=RestartPolicy.max_restarts,
        help=f"server restarts allowed per window; more exits {EXIT_RESTARTS_EXHAUSTED}; "
        "0: never restart",
    )
    parser.add_argument(
        "--restart-window-s", type=float, default=RestartPolicy.window_s, help="the window"
    )
    parser.add_argument(
        "--restart-backoff-s",
        type=float,
        default=RestartPolicy.backoff_s,
        help="delay before a restart, doubled per restart in the window",
    )
    parser.add_argument(
        "--restart-backoff-max-s",
        type=float,
        default=RestartPolicy.backoff_max_s,
        help="the longest delay before a restart",
    )
    parser.add_argument(
        "--stub-grace-s", type=float, default=5.0, help="seconds from SIGTERM to SIGKILL"
    )
    parser.add_argument(
        "--port-timeout-s",
        type=float,
        default=60.0,
        help="how long a restart waits for the old server's ports",
    )
    parser.add_argument(
        "--shm-reclaim-interval-s",
        type=float,
        default=0.0,
        help="reload a model whose stub's /dev/shm region grew past the shm plan (a request "
        "beyond the configs), at most once per this many seconds per model (e.g. 60); 0: off, "
        "the default (Triton 2.51 can crash on such a reload under traffic)",
    )
    parser.add_argument(
        "--ready-timeout-s",
        type=float,
        default=600.0,
        help="a server not ready this long after its start is stopped (and restarted)",
    )
    parser.add_argument(
        "--stall-timeout-s",
        type=float,
        default=DEFAULT_STALL_S,
        help="a start with no progress this long (no model state change in the log, no stub "
        "started or gone, under a second of CPU used) is stopped and restarted; 0: off",
    )
    parser.add_argument("--tritonserver", default=str(Path(sys.prefix) / "bin" / "tritonserver"))
    opts = parser.parse_args(own)
    from triton_embed_server.host import shm

    def log(message: str) -> None:
        print(f"[supervisor] {message}", file=sys.stderr, flush=True)

    try:  # Python-backend shared memory sized from the configs; /dev/shm checked first
        server_args = shm.server_arguments(server_args, log=log)
    except shm.SharedMemoryError as exc:
        log(f"error: {exc}")
        return shm.EXIT_TOO_SMALL
    from triton_embed_server.host import node_memory

    try:  # every CPU engine fits its NUMA node's memory (KV cache, weights, process)
        node_memory.check_arguments(server_args, log=log)
    except node_memory.NodeMemoryError as exc:
        log(f"error: {exc}")
        return node_memory.EXIT_TOO_SMALL
    command = [opts.tritonserver, *server_arguments(server_args)]
    policy = RestartPolicy(
        opts.max_restarts, opts.restart_window_s, opts.restart_backoff_s, opts.restart_backoff_max_s
    )
    supervisor = Supervisor(
        command,
        opts.poll_s,
        opts.max_reloads,
        policy,
        opts.stub_grace_s,
        opts.port_timeout_s,
        opts.ready_timeout_s,
        opts.stall_timeout_s,
    )

    from triton_embed_server.run.supervisor.shm_watch import RegionWatch

    supervisor.shm_watch = RegionWatch.from_arguments(command[1:], opts.shm_reclaim_interval_s)
    return supervisor.run()
