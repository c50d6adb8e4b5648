"""The supervisor and its tritonserver on free loopback ports, for fault tests and timings.

:class:`SupervisedServer` starts ``python -m triton_embed_server.run.supervisor`` (its own
arguments, then ``--`` and tritonserver's: the shipped ``model_repository``, HTTP, gRPC and
metrics on 127.0.0.1) in a session of its own, its output in a log file. Used by
``tests/integration/test_server_restart.py`` and ``scripts/recovery_times.py``, which kill
the server or its stubs and watch the supervisor bring them back. Only the process it
started (and its session: tritonserver, the stubs) is ever signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from triton_embed_server.run.launcher import REPO_ROOT, free_port


class SupervisedServer:
    """The supervisor and its server on free loopback ports, output to ``log_path``.

    Starting is the constructor's job; :meth:`stop` stops it.

    Args:
        log_path: the file the supervisor's and tritonserver's output go to.
        own_args: the supervisor's own arguments (``--max-restarts 2`` ...).

    Attributes:
        ports: ``{"http": port, "grpc": port, "metrics": port}`` on 127.0.0.1.
        process: the supervisor's process.
        server_pids: the PIDs of every tritonserver :meth:`server` returned.
    """

    def __init__(self, log_path: Path, own_args: list[str] = ()):
        self.ports = {name: free_port() for name in ("http", "grpc", "metrics")}
        self.log_path = Path(log_path)
        command = [sys.executable, "-m", "triton_embed_server.run.supervisor", *own_args, "--"]
        command += ["--model-repository", str(REPO_ROOT / "model_repository")]
        for name, port in self.ports.items():
            command += [f"--{name}-address", "127.0.0.1", f"--{name}-port", str(port)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.server_pids: set[int] = set()

    def log(self) -> str:
        """The whole log so far."""
        return self.log_path.read_text(errors="replace")

    def supervisor_lines(self) -> list[str]:
        """The supervisor's own lines of the log (``[supervisor] ...``)."""
        return [line for line in self.log().splitlines() if line.startswith("[supervisor]")]

    def wait_for_line(self, needle: str, count: int, timeout_s: float) -> None:
        """Until ``count`` supervisor lines contain ``needle``.

        Raises:
            RuntimeError: the supervisor exited, or ``timeout_s`` passed (the message holds
                the log's tail).
        """
        deadline = time.monotonic() + timeout_s
        while sum(needle in line for line in self.supervisor_lines()) < count:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"no {needle!r} (#{count}):\n{self.log()[-4000:]}")
            time.sleep(0.2)

    def server(self):
        """The tritonserver process running now (a ``psutil.Process``); its PID is recorded."""
        import psutil

        (child,) = psutil.Process(self.process.pid).children()
        self.server_pids.add(child.pid)
        return child

    def get(self, path: str) -> int:
        """The HTTP status of ``GET path`` on the server's HTTP port; 0 when nothing answered."""
        try:
            url = f"http://127.0.0.1:{self.ports['http']}{path}"
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status
        except OSError:
            return 0

    def ready(self) -> bool:
        """``/v2/health/ready`` answers 200."""
        return self.get("/v2/health/ready") == 200

    def stop(self, timeout_s: float = 120.0) -> None:
        """SIGTERM the supervisor, then SIGKILL whatever is left in its session.

        What is left after ``timeout_s``: the server, orphaned stubs.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.process.poll() is None:
            self.process.wait()
