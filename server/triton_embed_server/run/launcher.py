"""Start a real ``tritonserver`` on free loopback ports, wait until ready, stop it.

Used by the integration tests, the main job (``scripts/main_job.py``) and the benchmarks.
Only the process this object started (and its process group: the Python-backend stubs) is
ever signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from triton_embed.admin import grpc_headers, http_headers

from triton_embed_server.host.admin_key import generate_key, tritonserver_args
from triton_embed_server.run.trace_args import (
    DEFAULT_TRACE_RATE,
    tritonserver_trace_args,
    tritonserver_trace_env,
)

REPO_ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Drawn from 20000-32767, below Linux's default ephemeral range (32768-60999,
    ``net.ipv4.ip_local_port_range``): tritonserver binds it seconds later, and a port from
    the ephemeral range can meanwhile be taken by any outgoing connection.

    Raises:
        RuntimeError: no free port found in 200 tries.
    """
    import random

    for _ in range(200):
        port = random.randint(20000, 32767)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free TCP port in 20000-32767 on 127.0.0.1")


def stop_process(proc: subprocess.Popen | None, timeout_s: float) -> int | None:
    """SIGTERM ``proc``, SIGKILL it if it has not exited after ``timeout_s``; reap it.

    Only ``proc`` itself is signalled, never its process group.

    Returns:
        Its exit code, or ``None`` if ``proc`` is ``None`` (never started).
    """
    if proc is None:
        return None
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


@contextlib.contextmanager
def stopped_on_failure(stop: Callable[[], object]) -> Iterator[None]:
    """Call ``stop()`` when the block raises (anything, ``KeyboardInterrupt`` too), then re-raise.

    For the step after a start that checks the process came up: a server that fails it is not
    left running.
    """
    try:
        yield
    except BaseException:
        stop()
        raise


#: Stalled starts (each restarted by the supervisor) after which :meth:`TritonServer.start` fails.
STALLS_BEFORE_FAILING = 2


@dataclass
class TritonServer:
    """A ``tritonserver`` child process on free loopback ports.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with TritonServer() as server:
            client = EmbeddingClient(server.grpc_url)

    Attributes:
        model_repository: folder to serve (default: this repository's ``model_repository``).
        extra_args: further ``tritonserver`` arguments (``--model-config-name gpu``, ...).
        ready_timeout_s: how long :meth:`start` waits for ``/v2/health/ready``; a start
            the supervisor finds stalled (``[supervisor] start stalled: ...``) is restarted
            by it once (Triton 2.51 sometimes hangs after every instance initialized: seen
            in 2 of 4 starts of two sparse models on a busy host, the restart then loads
            them), and fails at its second stall.
        log_path: where the server's stdout/stderr go (a temporary file by default).
        admin_key: the key every API but inference, health and metadata requires, and HTTP
            inference too (:mod:`triton_embed_server.host.admin_key`); a new random one per server
            unless given.
            Send it with :attr:`admin_http_headers` / :attr:`admin_grpc_headers`. Kept out of
            ``repr`` and of every message; it is on the server's command line.
        supervisor_args: options of the supervisor (``["--stall-timeout-s", "20"]``).
        otlp_endpoint: export Triton's traces (OpenTelemetry mode) and the steps' spans to
            this OTLP/HTTP URL (:mod:`~triton_embed_server.run.trace_args`); ``None``:
            Triton's default, no tracing.
        trace_rate: 1 in this many requests without a ``traceparent`` is traced too.
    """

    model_repository: Path = REPO_ROOT / "model_repository"
    extra_args: list[str] = field(default_factory=list)
    ready_timeout_s: float = 300.0
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    grpc_port: int = field(default_factory=free_port)
    http_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None
    admin_key: str = field(default_factory=generate_key, repr=False)
    supervisor_args: list[str] = field(default_factory=list)
    otlp_endpoint: str | None = None
    trace_rate: int = DEFAULT_TRACE_RATE
    _regions: set[str] = field(default_factory=set, repr=False, init=False)

    @property
    def grpc_url(self) -> str:
        """``host:port`` for ``tritonclient.grpc``."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        """``http://host:port`` of the KServe v2 HTTP endpoint (inference needs the admin key)."""
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def admin_http_headers(self) -> dict[str, str]:
        """HTTP headers that carry :attr:`admin_key` (``triton-embed-admin-key``)."""
        return http_headers(self.admin_key)

    @property
    def admin_grpc_headers(self) -> dict[str, str]:
        """The gRPC metadata that carries :attr:`admin_key` (``tritonclient`` ``headers=``)."""
        return grpc_headers(self.admin_key)

    @property
    def metrics_url(self) -> str:
        """Prometheus metrics URL."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def metric_samples(self) -> list:
        """Every sample on the metrics endpoint now.

        Returns:
            ``prometheus_client`` ``Sample`` tuples (``name``, ``labels``, ``value``, ...).
        """
        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        return [s for family in text_string_to_metric_families(text) for s in family.samples]

    def command(self) -> list[str]:
        """The full command line: ``tritonserver`` under the stub supervisor.

        The Python backend's shared memory is sized from the configs
        (:func:`triton_embed_server.host.shm.server_arguments`, unless ``extra_args`` set it), after
        checking that ``/dev/shm`` has room for every stub.

        The supervisor restarts a model whose stub died; see
        :mod:`triton_embed_server.run.supervisor`. It holds :attr:`admin_key` (in the restriction
        flags): pass it through :func:`triton_embed_server.host.admin_key.redact` before showing it.
        """
        from triton_embed_server.host import shm

        argv = [
            sys.executable, "-m", "triton_embed_server.run.supervisor", *self.supervisor_args, "--",
            "--model-repository", str(self.model_repository),
            "--grpc-address", "127.0.0.1", "--grpc-port", str(self.grpc_port),
            "--http-address", "127.0.0.1", "--http-port", str(self.http_port),
            "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
            *tritonserver_args(self.admin_key),
            *(tritonserver_trace_args(self.otlp_endpoint, self.trace_rate)
              if self.otlp_endpoint is not None else []),
            *self.extra_args,
        ]  # fmt: skip
        split = argv.index("--") + 1
        return [*argv[:split], *shm.server_arguments(argv[split:])]

    def start(self) -> TritonServer:
        """Start the server and wait until every model is ready.

        Raises:
            SharedMemoryError: ``/dev/shm`` cannot hold the stubs' shared memory (a
                ``RuntimeError`` saying how much is needed; nothing was started).
            RuntimeError: the server exited or was not ready within ``ready_timeout_s``
                (the message holds the end of its log).
        """
        command = self.command()
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        log = open(self.log_path, "wb")  # noqa: SIM115 - lives as long as the process
        self.process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.trace_env(), **self.env},
            start_new_session=True,  # its own process group: the stubs go with it on stop
        )
        log.close()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            self._regions.update(self.stub_regions())
            if self.process.poll() is not None:
                self._kill_group()  # stubs the server left behind share its process group
                raise RuntimeError(
                    f"tritonserver exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if self.is_ready():
                self._regions.update(self.stub_regions())
                return self
            stalled = self.stall_line(STALLS_BEFORE_FAILING)
            if stalled:
                self.stop()
                raise RuntimeError(f"tritonserver did not start: {stalled}\n{self.log_tail()}")
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(
            f"tritonserver not ready after {self.ready_timeout_s:.0f} s:\n{self.log_tail()}"
        )

    def trace_env(self) -> dict[str, str]:
        """The steps' span endpoint (:func:`~.trace_args.tritonserver_trace_env`), if tracing."""
        return {} if self.otlp_endpoint is None else tritonserver_trace_env(self.otlp_endpoint)

    def stall_line(self, count: int = 1) -> str | None:
        """The supervisor's first ``start stalled: ...`` line, once it wrote ``count`` of them."""
        if self.log_path is None or not self.log_path.exists():
            return None
        marker = b"[supervisor] start stalled:"
        data = self.log_path.read_bytes()
        at = data.find(marker)
        if at < 0 or data.count(marker) < count:
            return None
        end = data.find(b"\n", at)
        return data[at : end if end >= 0 else None].decode("utf-8", "replace")

    def stub_regions(self) -> list[str]:
        """The ``/dev/shm`` regions of this server's live stubs (its process group)."""
        from triton_embed_server.run.supervisor import group_stub_regions

        if self.process is None:
            return []
        return group_stub_regions(self.process.pid)  # the group outlives a dead supervisor

    def _kill_group(self) -> None:
        """SIGKILL what is left of the process group; remove its stubs' ``/dev/shm`` regions.

        The regions are those seen under this server while it ran (:meth:`stub_regions`),
        never another server's. A stub killed with its server cannot remove its region.
        """
        from triton_embed_server.run.supervisor import group_stub_regions, remove_shm_regions

        pid = self.process.pid
        self._regions.update(group_stub_regions(pid))
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while group_stub_regions(pid) and time.monotonic() < deadline:
            time.sleep(0.1)  # until the killed stubs are gone
        remove_shm_regions(self._regions)
        self._regions.clear()

    def is_ready(self) -> bool:
        """``GET /v2/health/ready`` answered 200."""
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log_tail(self, chars: int = 6000) -> str:
        """The end of the server log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")

    def stop(self, timeout_s: float = 60.0) -> int | None:
        """SIGTERM the server (it drains and unloads models), SIGKILL its group if it hangs.

        The ``/dev/shm`` regions of its stubs that are left (a stub killed with the server)
        are removed: only this server's (its process group's stubs), never another's.

        Returns:
            The server's exit code, or ``None`` if it was never started.
        """
        proc = self.process
        if proc is None:
            return None
        if proc.poll() is None:
            self._regions.update(self.stub_regions())
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Stubs left behind by a crashed server are in its process group; a killed stub's
        # /dev/shm region stays unless it is removed.
        self._kill_group()
        return proc.returncode

    def __enter__(self) -> TritonServer:
        """Start the server, unless :meth:`start` already did (and it still runs)."""
        if self.process is not None and self.process.poll() is None:
            return self
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Gateway:
    """The HTTP gateway (``python -m triton_embed_server.gateway``) on a free loopback port.

    Use as a context manager, or call :meth:`start` and :meth:`stop`::

        with TritonServer() as server, Gateway([server.grpc_url], server.admin_key) as gw:
            OpenAI(base_url=f"{gw.base_url}/v1", api_key="unused")

    Attributes:
        upstreams: the servers' gRPC ``host:port``.
        admin_key: the servers' admin key (the gateway reads the ensembles' configs).
        api_key: the key clients must send (``Authorization: Bearer``); ``None``: open. With
            ``tenants``, the key of one of its tenants (what :meth:`start` probes with).
        tenants: a tenants file (``--tenants``, docs/tenants.md) instead of ``api_key``'s file.
        model: :meth:`start` waits until ``GET /v1/models`` lists this model.
        workers: uvicorn worker processes.
        ready_timeout_s: how long :meth:`start` waits.
        port: the gateway's port on 127.0.0.1 (a free one unless given).
        log_path: its stdout and stderr (a temporary file unless given).
        extra_args: further command-line flags (e.g. ``["--merge-in-flight", "0"]``).
        process: the gateway process, once started.
    """

    upstreams: list[str]
    admin_key: str = field(repr=False)
    api_key: str | None = field(default=None, repr=False)
    tenants: Path | None = None
    model: str = "embed"
    workers: int = 1
    ready_timeout_s: float = 60.0
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def auth_headers(self) -> dict[str, str]:
        """The ``Authorization`` header clients send (empty for an open gateway)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def command(self) -> list[str]:
        """The gateway's command line (the API key goes in a file, never on it)."""
        return [
            sys.executable, "-m", "triton_embed_server.gateway",
            "--upstream", ",".join(self.upstreams), "--host", "127.0.0.1",
            "--port", str(self.port), "--workers", str(self.workers), *self.extra_args,
        ]  # fmt: skip

    def start(self) -> Gateway:
        """Start the gateway and wait until it lists :attr:`model`.

        Raises:
            RuntimeError: it exited, or did not list the model within ``ready_timeout_s``
                (the message holds its log's tail); it is stopped first.
        """
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="gateway-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        argv = self.command()
        env = {**os.environ, "TRITON_EMBED_ADMIN_KEY": self.admin_key}
        env.pop("TRITON_EMBED_GATEWAY_API_KEY", None)
        if self.tenants is not None:
            argv += ["--tenants", str(self.tenants)]
        elif self.api_key is not None:
            key_file = self.log_path.with_suffix(".key")
            key_file.touch(mode=0o600)
            key_file.write_text(self.api_key)
            argv += ["--api-key-file", str(key_file)]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        with stopped_on_failure(self.stop):
            self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        import json

        deadline = time.monotonic() + self.ready_timeout_s
        request = urllib.request.Request(f"{self.base_url}/v1/models", headers=self.auth_headers)
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"gateway exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(request, timeout=2) as r:
                    if any(m.get("id") == self.model for m in json.loads(r.read())["data"]):
                        return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise RuntimeError(
            f"gateway did not list {self.model!r} within {self.ready_timeout_s:g} s:\n"
            f"{self.log_tail()}"
        )

    def log_tail(self, chars: int = 6000) -> str:
        """The last ``chars`` characters of the gateway's log."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM the gateway, SIGKILL it after ``timeout_s``.

        Returns:
            Its exit code, or ``None`` if it was never started.
        """
        return stop_process(self.process, timeout_s)

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
