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

    python -m triton_embed_server.supervisor [--max-restarts 5 --restart-window-s 600]
        -- <tritonserver arguments>
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.admin_key import restricted_http_headers
from triton_embed_server.instance_group import instance_count

STUB_MARKER = "triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region"
EXIT_RELOAD_FAILED = 70  # --max-restarts 0 only: --max-reloads reloads in a row failed
EXIT_RESTARTS_EXHAUSTED = 75  # the restart budget is spent (sysexits EX_TEMPFAIL)


def stub_model_name(cmdline: list[str]) -> str | None:
    """The model a Python-backend stub serves, from its command line.

    The stub's first argument is ``<repository>/<model>/<version>/model.py``.
    """
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 2:
        return None
    parts = Path(cmdline[1]).parts
    return parts[-3] if len(parts) >= 3 else None


def option_value(args: list[str], name: str, default: str) -> str:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``args`` (the last wins)."""
    value = default
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


def server_arguments(args: list[str]) -> list[str]:
    """``args`` plus explicit model control (needed for reloads) unless a mode is given."""
    if any(a == "--model-control-mode" or a.startswith("--model-control-mode=") for a in args):
        return list(args)
    return [*args, "--model-control-mode", "explicit", "--load-model", "*"]


def stub_parent_pid(cmdline: list[str]) -> int | None:
    """The tritonserver PID a Python-backend stub reports to (its fifth argument)."""
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 6:
        return None
    return int(cmdline[5]) if cmdline[5].isdigit() else None


def stub_shm_region(cmdline: list[str]) -> str | None:
    """The ``/dev/shm`` region a Python-backend stub shares with tritonserver."""
    if not cmdline or STUB_MARKER not in cmdline[0] or len(cmdline) < 3:
        return None
    name = cmdline[2]
    return name if name.startswith(SHM_PREFIX) and "/" not in name else None


def describe_exit(returncode: int) -> str:
    """``returncode`` of :class:`subprocess.Popen` in words: a signal's name, or the code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (signal {-returncode})"
    return f"exited with code {returncode}"


def exit_status(returncode: int) -> int:
    """The shell's exit status for ``returncode``: ``128 + N`` for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class RestartPolicy:
    """How often a dead tritonserver is restarted, and after what delay.

    At most ``max_restarts`` restarts within any ``window_s`` seconds. The delay before a
    restart doubles with each restart still in the window: ``backoff_s``, ``2 * backoff_s``,
    ... up to ``backoff_max_s``. ``max_restarts = 0`` turns restarts off.
    """

    max_restarts: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    def recent(self, history: Sequence[float], now: float) -> list[float]:
        """The restart times of ``history`` within the window that ends at ``now``."""
        return [t for t in history if now - t < self.window_s]

    def delay(self, history: Sequence[float], now: float) -> float | None:
        """Seconds to wait before restarting at ``now``, or ``None`` if the budget is spent.

        Args:
            history: the (monotonic) times of the earlier restarts.
            now: the current time on the same clock.
        """
        recent = len(self.recent(history, now))
        if recent >= self.max_restarts:
            return None
        return min(self.backoff_max_s, self.backoff_s * 2**recent)


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


def busy_ports(endpoints: Iterable[tuple[str, str, int]]) -> list[tuple[str, str, int]]:
    """The endpoints whose port cannot be bound now (another process listens on it).

    Binds with ``SO_REUSEADDR`` like tritonserver's HTTP and gRPC servers do, so connections
    in TIME_WAIT do not count as busy.
    """
    busy = []
    for name, address, port in endpoints:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((address, port))
            except OSError:
                busy.append((name, address, port))
    return busy


def stop_processes(procs: Iterable, grace_s: float, log: Callable[[str], None]) -> list[int]:
    """SIGTERM ``procs`` (``psutil.Process``), give them ``grace_s`` seconds, then SIGKILL.

    A ``psutil.Process`` checks its creation time before each signal, so a PID reused by
    another process is never signalled. (A Triton 2.51 Python-backend stub catches SIGTERM
    and ignores it: the grace period is the time it gets to exit on its own, which it does
    within about a second of its tritonserver's death, or when Triton unloads it.)

    Returns:
        The PIDs that had to be killed.
    """
    import psutil

    def running(proc) -> bool:
        try:
            return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def wait(live: list, timeout_s: float) -> list:
        deadline = time.monotonic() + timeout_s
        while True:
            live = [p for p in live if running(p)]
            if not live or time.monotonic() >= deadline:
                return live
            time.sleep(0.1)

    live = [p for p in procs if running(p)]
    for proc in live:
        try:
            proc.terminate()
        except psutil.Error:
            pass
    killed = []
    for proc in wait(live, grace_s):
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            pass
    wait([p for p in live if p.pid in killed], 5.0)
    for pid in killed:
        log(f"killed process {pid}: still running {grace_s:.0f} s after SIGTERM")
    return killed


class Supervisor:
    """Runs tritonserver, one child process at a time; see the module docstring.

    Args:
        command: the tritonserver command line (restarts run it again as it is).
        poll_s: seconds between checks of the stubs and of the server.
        max_reloads: failed model reloads in a row before the server is restarted.
        policy: how often, and after what delay, a dead server is restarted.
        stub_grace_s: seconds a stub gets after SIGTERM before SIGKILL.
        port_timeout_s: how long a restart waits for the dead server's ports to be free.
        ready_timeout_s: a server not ready this long after its start is stopped (and
            restarted, unless it is the first): a Python-backend model load can hang.
    """

    def __init__(
        self,
        command: list[str],
        poll_s: float = 1.0,
        max_reloads: int = 3,
        policy: RestartPolicy | None = None,
        stub_grace_s: float = 5.0,
        port_timeout_s: float = 60.0,
        ready_timeout_s: float = 600.0,
    ):
        self.command = command
        self.poll_s = poll_s
        self.max_reloads = max_reloads
        self.policy = policy or RestartPolicy()
        self.stub_grace_s = stub_grace_s
        self.port_timeout_s = port_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.endpoints = server_endpoints(command)
        address = option_value(command, "--http-address", "127.0.0.1")
        if address in ("0.0.0.0", "::", ""):
            address = "127.0.0.1"
        self.http = f"http://{address}:{option_value(command, '--http-port', '8000')}"
        # The admin key header the server requires (its --http-restricted-api flags), if any.
        self._config_headers = restricted_http_headers(command, "model-config")
        self._repository_headers = restricted_http_headers(command, "model-repository")
        self.process: subprocess.Popen | None = None
        # The current server's stubs ever seen: {pid: (psutil.Process, /dev/shm region)}.
        self._seen: dict[int, tuple[object, str | None]] = {}
        self._started_at = 0.0  # time.time() of the current server's start
        self.generation = 0
        self.restarts = 0
        self.ever_ready = False
        self._died_at: float | None = None  # time.monotonic() of the last death
        self._last_exit = ""
        self._stop = threading.Event()

    def log(self, message: str) -> None:
        """Write one ``[supervisor]`` line to stderr."""
        print(f"[supervisor] {message}", file=sys.stderr, flush=True)

    def _get(self, path: str) -> int:
        try:
            with urllib.request.urlopen(self.http + path, timeout=2) as r:
                return r.status
        except OSError:
            return 0

    def _load(self, model: str) -> bool:
        """Reload ``model`` with fresh instances.

        Triton skips a load whose model files and config are unchanged, so the live config
        is sent back with a ``supervisor_generation`` parameter bumped: a changed config
        makes Triton build new instances, switch traffic to them once they are ready, and
        unload the old ones.
        """
        url = f"{self.http}/v2/models/{model}/config"
        try:
            req = urllib.request.Request(url, headers=self._config_headers)
            with urllib.request.urlopen(req, timeout=10) as r:
                config = json.loads(r.read())
        except (OSError, ValueError) as exc:
            self.log(f"cannot read the config of {model}: {exc}")
            return False
        self.generation += 1
        config.setdefault("parameters", {})["supervisor_generation"] = {
            "string_value": str(self.generation)
        }
        body = json.dumps({"parameters": {"config": json.dumps(config)}}).encode()
        req = urllib.request.Request(
            f"{self.http}/v2/repository/models/{model}/load",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **self._repository_headers},
        )
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                return r.status == 200
        except OSError as exc:
            self.log(f"reload of {model} failed: {exc}")
            return False

    def stubs(self) -> dict[int, str]:
        """Live stub processes of the server: ``{pid: model name}``."""
        import psutil

        out: dict[int, str] = {}
        try:
            children = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            return out
        for child in children:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    continue
                cmdline = child.cmdline()
            except psutil.Error:
                continue
            model = stub_model_name(cmdline)
            if model:
                out[child.pid] = model
                self._seen.setdefault(child.pid, (child, stub_shm_region(cmdline)))
        return out

    def expected_stubs(self) -> dict[str, int]:
        """Stub processes each loaded Python-backend model should have.

        From the live configs (:func:`~triton_embed_server.instance_group.instance_count`);
        at least what runs now (a ``KIND_GPU`` group without a GPU list runs ``count``
        copies on every GPU).
        """
        running: dict[str, int] = {}
        for model in self.stubs().values():
            running[model] = running.get(model, 0) + 1
        expected = dict(running)
        for model in running:
            try:
                req = urllib.request.Request(
                    f"{self.http}/v2/models/{model}/config", headers=self._config_headers
                )
                with urllib.request.urlopen(req, timeout=10) as r:
                    config = json.loads(r.read())
            except (OSError, ValueError):
                continue
            expected[model] = max(instance_count(config).total, running[model])
        return expected

    def run(self) -> int:
        """Start the server, supervise it, restart it when it dies.

        Returns:
            The exit status: the server's when it was stopped by SIGTERM/SIGINT (``128 + N``
            for death by signal N), :data:`EXIT_RESTARTS_EXHAUSTED` when the restart budget
            is spent, the server's when it died before it was ever ready or restarts are
            off, :data:`EXIT_RELOAD_FAILED` when reloads failed and restarts are off.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        history: list[float] = []
        while True:
            started = time.monotonic()
            code, what, reloads_failed = self._run_once()
            self._died_at, self._last_exit = time.monotonic(), what
            self.log(
                f"tritonserver (pid {self.process.pid}) {what} after "
                f"{self._died_at - started:.0f} s"
                + (" (asked to stop)" if self._stop.is_set() else "")
            )
            self._reap_stubs()
            if self._stop.is_set():
                return exit_status(code)
            if self.policy.max_restarts <= 0:
                return EXIT_RELOAD_FAILED if reloads_failed else exit_status(code)
            if not self.ever_ready:
                self.log("it was never ready (a bad command line or model?); not restarting it")
                return exit_status(code) or 1
            delay = self.policy.delay(history, self._died_at)
            recent = len(self.policy.recent(history, self._died_at))
            if delay is None:
                self.log(
                    f"giving up: tritonserver was already restarted {recent} times in the last "
                    f"{self.policy.window_s:g} s (--max-restarts {self.policy.max_restarts} "
                    f"--restart-window-s {self.policy.window_s:g}). Exiting with code "
                    f"{EXIT_RESTARTS_EXHAUSTED}; an orchestrator must restart the service"
                )
                return EXIT_RESTARTS_EXHAUSTED
            history.append(self._died_at)
            self.restarts += 1
            self.log(
                f"restarting tritonserver (restart {self.restarts}; {recent + 1} of at most "
                f"{self.policy.max_restarts} in {self.policy.window_s:g} s; backoff "
                f"{delay:g} s); the ports are closed until it is ready"
            )
            if not self._wait_to_restart(self._died_at + delay):
                return exit_status(code)

    def _run_once(self) -> tuple[int, str, bool]:
        """Start tritonserver and supervise it until it exits; stop what it left behind.

        Returns:
            Its return code, what happened in words, and whether it was stopped because
            ``max_reloads`` reloads in a row failed.
        """
        self._seen = {}
        self._started_at = time.time()
        self.process = subprocess.Popen(self.command)
        if self._stop.is_set():  # SIGTERM/SIGINT arrived while no server was running
            self.process.send_signal(signal.SIGTERM)
        try:
            return self._supervise()
        except BaseException:  # the supervisor itself failed: the server goes with it
            if self.process.poll() is None:
                self._stop_server()
            self._reap_stubs()
            raise

    def _supervise(self) -> tuple[int, str, bool]:
        started = time.monotonic()
        ready = False
        expected: dict[str, int] = {}
        failures = 0
        while True:
            try:  # readiness is checked more often than the stubs, for prompt numbers
                code = self.process.wait(timeout=self.poll_s if ready else min(self.poll_s, 0.25))
                return code, describe_exit(code), False
            except subprocess.TimeoutExpired:
                pass
            current = self.stubs()  # one process-table scan per poll
            if self._stop.is_set():
                continue
            if not ready:
                if time.monotonic() - started > self.ready_timeout_s:
                    self.log(
                        f"tritonserver not ready after {self.ready_timeout_s:g} s "
                        "(--ready-timeout-s); stopping it"
                    )
                    code = self._stop_server(timeout_s=30.0)
                    return code, f"was stopped: not ready after {self.ready_timeout_s:g} s", False
                if self._get("/v2/health/ready") == 200:
                    ready, self.ever_ready = True, True
                    now = time.monotonic()
                    if self._died_at is not None:
                        self.log(
                            f"tritonserver ready again {now - self._died_at:.1f} s after it "
                            f"{self._last_exit} (restart {self.restarts}; this start took "
                            f"{now - started:.1f} s)"
                        )
                    else:
                        self.log(f"tritonserver ready after {now - started:.1f} s")
                    expected = self.expected_stubs()
                    self.log(f"watching stub processes per model: {json.dumps(expected)}")
                continue
            alive: dict[str, int] = {}
            for model in current.values():
                alive[model] = alive.get(model, 0) + 1
            for model, want in sorted(expected.items()):
                if alive.get(model, 0) >= want or self._stop.is_set():
                    continue
                self.log(
                    f"model {model!r} has {alive.get(model, 0)} of {want} stub processes "
                    f"alive; reloading {model!r}"
                )
                t0 = time.monotonic()
                old = {pid for pid, m in self.stubs().items() if m == model}
                if self._load(model):
                    self._retire(old)
                    self._wait_for_stub_count(model, want)
                    self.log(f"reloaded {model!r} in {time.monotonic() - t0:.1f} s")
                    failures = 0
                else:
                    failures += 1
                    if failures >= self.max_reloads:
                        self.log(f"{failures} reloads failed; stopping the server")
                        code = self._stop_server()
                        return code, f"was stopped after {failures} failed reloads", True

    def _stop_server(self, timeout_s: float = 90.0) -> int:
        """SIGTERM the server, SIGKILL it after ``timeout_s``; return its return code.

        (Triton's own ``--exit-timeout-secs``, 30 s by default, bounds a normal shutdown.)
        """
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.log(f"tritonserver still running {timeout_s:.0f} s after SIGTERM; SIGKILL")
            self.process.kill()
            return self.process.wait()

    def _wait_to_restart(self, not_before: float) -> bool:
        """Wait until the dead server's ports are free and ``not_before`` has passed.

        Returns:
            False when SIGTERM/SIGINT arrived meanwhile (then nothing is restarted).
        """
        t0 = time.monotonic()
        busy = busy_ports(self.endpoints)
        while busy and time.monotonic() - t0 < self.port_timeout_s and not self._stop.is_set():
            time.sleep(0.2)
            busy = busy_ports(self.endpoints)
        if busy:
            self.log(
                f"ports still in use after {time.monotonic() - t0:.0f} s: "
                + ", ".join(f"{name} {address}:{port}" for name, address, port in busy)
                + "; starting anyway"
            )
        while time.monotonic() < not_before and not self._stop.is_set():
            time.sleep(min(0.1, max(0.0, not_before - time.monotonic())))
        return not self._stop.is_set()

    def _reap_stubs(self) -> None:
        """Stop what the server that just exited left behind: stubs and /dev/shm regions.

        Only stubs of this server are candidates: those seen as its children, and any stub
        process started since it started whose parent argument is its PID (one that came
        up after the last check). A server that was SIGKILLed or aborted cannot stop its
        stubs or remove their shared-memory regions; a stub exits by itself about a second
        after it sees its server gone, but one can hang in its engine's teardown. They get
        SIGTERM, ``stub_grace_s`` seconds, then SIGKILL. A stub that exits by itself removes
        its shared-memory region; the regions of the killed ones are removed here.
        """
        import psutil

        leftovers = dict(self._seen)
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            cmdline = proc.info["cmdline"] or []
            if (
                stub_parent_pid(cmdline) == self.process.pid
                and (proc.info["create_time"] or 0) >= self._started_at - 1
            ):
                leftovers.setdefault(proc.pid, (proc, stub_shm_region(cmdline)))
        procs = [proc for proc, _ in leftovers.values()]
        running = []
        for proc in procs:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    running.append(proc)
            except psutil.Error:
                pass
        if running:
            self.log(
                f"{len(running)} stub processes of the exited tritonserver still run "
                f"({', '.join(str(p.pid) for p in running)}): SIGTERM, then SIGKILL after "
                f"{self.stub_grace_s:g} s"
            )
            t0 = time.monotonic()
            stop_processes(running, self.stub_grace_s, self.log)
            self.log(
                f"stub processes of the exited server gone after {time.monotonic() - t0:.1f} s"
            )
        removed = []
        for _, region in leftovers.values():
            path = Path("/dev/shm", region) if region else None
            if path is not None and path.exists():
                try:
                    path.unlink()
                    removed.append(region)
                except OSError:
                    pass
        if removed:
            self.log(f"removed {len(removed)} shared-memory regions of the exited tritonserver")

    def _retire(self, old: set[int]) -> None:
        """Stop the surviving stubs of the replaced model version: SIGTERM, grace, SIGKILL.

        Traffic already goes to the new instances. Triton 2.51 never finishes unloading a
        version one of whose stubs died, so its surviving stubs would linger with their
        engines' memory.
        """
        procs = [self._seen[pid][0] for pid in sorted(old) if pid in self._seen]
        if procs:
            self.log(
                "stopping the stub processes of the replaced model version "
                f"({', '.join(str(p.pid) for p in procs)}): SIGTERM, then SIGKILL after "
                f"{self.stub_grace_s:g} s"
            )
            stop_processes(procs, self.stub_grace_s, self.log)

    def _wait_for_stub_count(self, model: str, expected: int, timeout_s: float = 60.0) -> None:
        """After a reload, wait until the old instances are gone and the new ones run."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sum(1 for m in self.stubs().values() if m == model) == expected:
                return
            time.sleep(0.25)

    def _forward(self, signum, frame) -> None:
        self._stop.set()
        if self.process and self.process.returncode is None:
            try:
                self.process.send_signal(signum)
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``[supervisor options] -- tritonserver-args...``; see the module docstring."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, server_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else ([], argv)
    )
    parser = argparse.ArgumentParser(prog="python -m triton_embed_server.supervisor")
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
        "--ready-timeout-s",
        type=float,
        default=600.0,
        help="a server not ready this long after its start is stopped (and restarted)",
    )
    parser.add_argument("--tritonserver", default=str(Path(sys.prefix) / "bin" / "tritonserver"))
    opts = parser.parse_args(own)
    from triton_embed_server import shm

    def log(message: str) -> None:
        print(f"[supervisor] {message}", file=sys.stderr, flush=True)

    try:  # Python-backend shared memory sized from the configs; /dev/shm checked first
        server_args = shm.server_arguments(server_args, log=log)
    except shm.SharedMemoryError as exc:
        log(f"error: {exc}")
        return shm.EXIT_TOO_SMALL
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
    )
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
