"""Run tritonserver, restart a Python-backend model whose stub died, restart a dead server.

Triton 2.51's Python backend does not notice a dead stub: the model stays READY, the server
stays ready, and every request routed to that instance fails with "Stub process ... is not
healthy" for ever (triton-inference-server/server #7230, #8604; ``tests/integration/
test_faults.py`` kills one embedder stub and watches the requests routed to it fail).
Newer Python backends add active health checks; this supervisor brings the same guarantee
to 2.51:

* it starts ``tritonserver`` with ``--model-control-mode explicit --load-model *`` (unless a
  control mode is given) and forwards SIGTERM/SIGINT to it (then it stops, never restarts);
* once the server is ready, it records the stub processes of each model and checks them
  every ``--poll-s`` seconds;
* when a stub is gone (or a zombie) it reloads that model through the KServe v2 repository
  API (``POST /v2/repository/models/<name>/load``), which starts fresh instances; requests
  fail only until the reload completes (about the model's load time); the replaced
  version's surviving stubs get SIGTERM and ``--stub-grace-s`` seconds before SIGKILL;
* when tritonserver itself exits without being asked to (SIGKILL, SIGABRT, any exit code),
  or ``--max-reloads`` reloads in a row failed, it restarts the server on the same command
  line (same ports, same models): the dead server's leftover stubs are stopped (SIGTERM,
  grace, SIGKILL) and their shared-memory regions removed, the ports are waited for, and
  the restart waits an exponential backoff (``--restart-backoff-s`` doubling per recent
  restart, at most ``--restart-backoff-max-s``). The HTTP/gRPC ports are closed meanwhile:
  readiness fails and clients get UNAVAILABLE. A server not ready ``--ready-timeout-s``
  after its start (a model load can hang) is stopped and counts as a death;
* a start that makes no progress for ``--stall-timeout-s`` seconds (60; no model state
  change in the server's log, which the supervisor reads as it passes it on, no stub started
  or gone, under a second of CPU used: :mod:`~triton_embed_server.run.supervisor.startup`) is
  stopped with a line ``[supervisor] start stalled: ...`` naming the models still loading
  and their stubs, and restarted (a first start too: a hang is not a bad command line);
* the ``/dev/shm`` regions of this server's stubs that are gone (killed, or died) are
  removed after a reload and after the server exits, and only those;
* at most ``--max-restarts`` restarts in ``--restart-window-s`` seconds: the next death
  makes it exit with :data:`EXIT_RESTARTS_EXHAUSTED` (75) and a message saying so, so an
  orchestrator takes over. A first server that stops before it was ever ready (a bad command
  line or model) is not restarted: its exit status is returned (1 for 0). ``--max-restarts 0`` turns
  restarts off: the server's exit code is returned, or :data:`EXIT_RELOAD_FAILED` (70)
  after ``--max-reloads`` failed reloads.

The whole-server restart is the net for crashes a model reload cannot fix: the Python
backend shares interprocess mutexes between tritonserver and its stubs, and a stub that dies
holding one makes tritonserver abort with ``boost::interprocess::lock_exception``
(triton-inference-server/server #8882, #5949, #7308).

    python -m triton_embed_server.run.supervisor [--max-restarts 5 --restart-window-s 600]
        -- <tritonserver arguments>

The package, one job per module:

* :mod:`~triton_embed_server.run.supervisor.core`: the :class:`Supervisor` (start, watch,
  reload, stop, restart);
* :mod:`~triton_embed_server.run.supervisor.policy`: the :class:`RestartPolicy` (restart budget
  and backoff), exit codes and descriptions of exits;
* :mod:`~triton_embed_server.run.supervisor.processes`: stub processes, stopping processes
  (SIGTERM, grace, SIGKILL), ``/dev/shm`` regions, ports;
* :mod:`~triton_embed_server.run.supervisor.server_api`: the server's HTTP API (readiness,
  configs, model loads);
* :mod:`~triton_embed_server.run.supervisor.server_args`: reading tritonserver's arguments;
* :mod:`~triton_embed_server.run.supervisor.startup`: a start that makes no progress (read from
  the server's log and CPU time);
* :mod:`~triton_embed_server.run.supervisor.command`: :func:`main`, the supervisor's own options
  (``python -m triton_embed_server.run.supervisor`` runs it).
"""

from triton_embed_server.run.supervisor.command import main
from triton_embed_server.run.supervisor.core import Supervisor
from triton_embed_server.run.supervisor.policy import (
    EXIT_RELOAD_FAILED,
    EXIT_RESTARTS_EXHAUSTED,
    RestartPolicy,
    describe_exit,
    exit_status,
)
from triton_embed_server.run.supervisor.processes import (
    SHM_PREFIX,
    STUB_MARKER,
    busy_ports,
    child_stubs,
    group_stub_regions,
    is_running,
    leftover_stubs,
    process_created_at,
    remove_shm_regions,
    stop_processes,
    stub_instance_name,
    stub_model_name,
    stub_parent_pid,
    stub_shm_region,
)
from triton_embed_server.run.supervisor.server_api import ServerApi
from triton_embed_server.run.supervisor.server_args import (
    option_value,
    server_arguments,
    server_endpoints,
)

__all__ = [
    "EXIT_RELOAD_FAILED",
    "EXIT_RESTARTS_EXHAUSTED",
    "SHM_PREFIX",
    "STUB_MARKER",
    "RestartPolicy",
    "ServerApi",
    "Supervisor",
    "busy_ports",
    "child_stubs",
    "describe_exit",
    "exit_status",
    "group_stub_regions",
    "is_running",
    "leftover_stubs",
    "process_created_at",
    "main",
    "option_value",
    "remove_shm_regions",
    "server_arguments",
    "server_endpoints",
    "stop_processes",
    "stub_model_name",
    "stub_instance_name",
    "stub_parent_pid",
    "stub_shm_region",
]
