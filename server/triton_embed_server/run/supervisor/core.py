"""The :class:`Supervisor`: one tritonserver at a time, its stubs watched, restarted when it dies.

It runs the server, checks its Python-backend stubs every poll and reloads a model whose
stub died (through :class:`~triton_embed_server.run.supervisor.server_api.ServerApi`), stops a
server whose reloads keep failing or that is not ready in time, and restarts a dead server
as its :class:`~triton_embed_server.run.supervisor.policy.RestartPolicy` allows, after stopping
what the dead server left behind (:mod:`~triton_embed_server.run.supervisor.processes`). See
:mod:`triton_embed_server.run.supervisor` for the whole story.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

from triton_embed_server.models.instance_group import instance_count
from triton_embed_server.run.supervisor.policy import (
    EXIT_RELOAD_FAILED,
    EXIT_RESTARTS_EXHAUSTED,
    RestartPolicy,
    describe_exit,
    exit_status,
)
from triton_embed_server.run.supervisor.processes import (
    busy_ports,
    child_stubs,
    is_running,
    leftover_stubs,
    process_created_at,
    remove_shm_regions,
    stop_processes,
    stub_instance_name,
)
from triton_embed_server.run.supervisor.server_api import ServerApi
from triton_embed_server.run.supervisor.server_args import server_endpoints
from triton_embed_server.run.supervisor.startup import DEFAULT_STALL_S, StartWatch

#: Seconds a stalled server gets after SIGTERM before SIGKILL: it is blocked in its model
#: load, which SIGTERM does not interrupt.
STALLED_STOP_S = 10.0


class Supervisor:
    """Runs tritonserver, one child process at a time.

    See :mod:`triton_embed_server.run.supervisor`.

    Args:
        command: the tritonserver command line (restarts run it again as it is).
        poll_s: seconds between checks of the stubs and of the server.
        max_reloads: failed model reloads in a row before the server is restarted.
        policy: how often, and after what delay, a dead server is restarted.
        stub_grace_s: seconds a stub gets after SIGTERM before SIGKILL.
        port_timeout_s: how long a restart waits for the dead server's ports to be free.
        ready_timeout_s: a server not ready this long after its start is stopped (and
            restarted, unless it is the first): a Python-backend model load can hang.
        stall_s: a start with no progress for this long (no model state change in the
            server's log, no stub started or gone, under a second of CPU used:
            :mod:`~triton_embed_server.run.supervisor.startup`) is stopped and restarted, the
            first start too, with a line naming the models still loading; 0: off.
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
        stall_s: float = DEFAULT_STALL_S,
    ):
        self.command = command
        self.stall_s = stall_s
        self.poll_s = poll_s
        self.max_reloads = max_reloads
        self.policy = policy or RestartPolicy()
        self.stub_grace_s = stub_grace_s
        self.port_timeout_s = port_timeout_s
        self.ready_timeout_s = ready_timeout_s
        self.endpoints = server_endpoints(command)
        self.api = ServerApi(command)
        # A shm_watch.RegionWatch reloads a model whose stub's region outgrew its plan; set
        self.shm_watch = None  # by the command line (--shm-reclaim-interval-s), None: off
        self.process: subprocess.Popen | None = None
        # The current server's stubs ever seen: {pid: (psutil.Process, /dev/shm region)}.
        self._seen: dict[int, tuple[object, str | None]] = {}
        self._started_at = 0.0  # the current server's creation time (process_created_at)
        self.generation = 0
        self.restarts = 0
        self.ever_ready = False
        self._died_at: float | None = None  # time.monotonic() of the last death
        self._last_exit = ""
        self._stop = threading.Event()
        self._start_stalled = False  # the current server was stopped because its start stalled
        self.ever_ready_now = False  # the current server was ready (its start is over)
        self._watch: StartWatch | None = None
        self._output_lock = threading.Lock()  # one line at a time on stderr

    def log(self, message: str) -> None:
        """Write one ``[supervisor]`` line to stderr."""
        with self._output_lock:
            print(f"[supervisor] {message}", file=sys.stderr, flush=True)

    def _copy_output(self, pipe, out) -> None:
        """Copy the server's output ``pipe`` to ``out`` line by line; feed the start watch.

        Ends when every writer (the server and its stubs) has closed the pipe.
        """
        watch = self._watch
        with pipe:
            for line in iter(pipe.readline, b""):
                with self._output_lock:
                    out.write(line)
                    out.flush()
                if watch is not None and not self.ever_ready_now:
                    watch.feed(line.decode("utf-8", "replace"))

    def _load(self, model: str) -> bool:
        """Reload ``model`` with fresh instances.

        Triton skips a load whose model files and config are unchanged, so the live config
        is sent back with a ``supervisor_generation`` parameter bumped: a changed config
        makes Triton build new instances, switch traffic to them once they are ready, and
        unload the old ones.
        """
        try:
            config = self.api.config(model)
        except (OSError, ValueError) as exc:
            self.log(f"cannot read the config of {model}: {exc}")
            return False
        self.generation += 1
        config.setdefault("parameters", {})["supervisor_generation"] = {
            "string_value": str(self.generation)
        }
        try:
            return self.api.load(model, config)
        except OSError as exc:
            self.log(f"reload of {model} failed: {exc}")
            return False

    def stubs(self) -> dict[int, str]:
        """Live stub processes of the server: ``{pid: model name}``."""
        out: dict[int, str] = {}
        for pid, (proc, model, region) in child_stubs(self.process.pid).items():
            out[pid] = model
            self._seen.setdefault(pid, (proc, region))
        return out

    def expected_stubs(self, ready: set[str] | None = None) -> dict[str, int]:
        """Stub processes each loaded Python-backend model should have.

        From the live configs (:func:`~triton_embed_server.models.instance_group.instance_count`);
        at least what runs now (a ``KIND_GPU`` group without a GPU list runs ``count``
        copies on every GPU).

        Args:
            ready: the server's READY models: each Python-backend one among them is watched,
                even one whose stubs are already gone (it died between its load and this
                look); ``None``: every model that has stubs.
        """
        running: dict[str, int] = {}
        for model in self.stubs().values():
            if ready is None or model in ready:
                running[model] = running.get(model, 0) + 1
        expected = dict(running)
        for model in sorted(set(running) | (ready or set())):
            try:
                config = self.api.config(model)
            except (OSError, ValueError):
                continue
            if model in running or config.get("backend") == "python":
                expected[model] = max(instance_count(config).total, running.get(model, 0))
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
            if not self.ever_ready and not self._start_stalled:  # a stall is no bad config
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
        self._start_stalled = False
        self.ever_ready_now = False  # the current server's start is over (it was ready)
        self._watch = StartWatch(time.monotonic(), self.stall_s) if self.stall_s > 0 else None
        # The server's output goes through the supervisor: during a start its model states
        # are only in its log (its HTTP endpoint opens once every model is loaded).
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self._started_at = process_created_at(self.process.pid)
        for pipe, out in ((self.process.stdout, sys.stdout.buffer),
                          (self.process.stderr, sys.stderr.buffer)):  # fmt: skip
            threading.Thread(target=self._copy_output, args=(pipe, out), daemon=True).start()
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
        watched: set[str] = set()
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
                if self._start_stalled_now(current):
                    code = self._stop_server(timeout_s=STALLED_STOP_S)
                    self._start_stalled = True
                    return code, "was stopped: its start stalled", False
                if time.monotonic() - started > self.ready_timeout_s:
                    self.log(
                        f"tritonserver not ready after {self.ready_timeout_s:g} s "
                        "(--ready-timeout-s); stopping it"
                    )
                    code = self._stop_server(timeout_s=30.0)
                    return code, "was stopped: not ready within --ready-timeout-s", False
                if self.api.status("/v2/health/ready") == 200:
                    ready, self.ever_ready, self.ever_ready_now = True, True, True
                    now = time.monotonic()
                    quiet = (
                        f"; longest stretch without progress {self._watch.longest_quiet_s:.1f} s"
                        f" (--stall-timeout-s {self.stall_s:g})"
                        if self._watch is not None
                        else ""
                    )
                    if self._died_at is not None:
                        self.log(
                            f"tritonserver ready again {now - self._died_at:.1f} s after it "
                            f"{self._last_exit} (restart {self.restarts}; this start took "
                            f"{now - started:.1f} s{quiet})"
                        )
                    else:
                        self.log(f"tritonserver ready after {now - started:.1f} s{quiet}")
                    expected = self.expected_stubs()
                    watched = self._ready_models() or set(expected)
                    self.log(f"watching stub processes per model: {json.dumps(expected)}")
                continue
            # Models loaded or unloaded through the repository API since the last poll: a
            # new READY model is watched from now on; an unloaded one is not reloaded.
            now_ready = self._ready_models()
            if now_ready is not None and now_ready != watched:
                watched = now_ready
                expected = self.expected_stubs(watched)
                self.log(
                    f"models changed; watching stub processes per model: {json.dumps(expected)}"
                )
            alive: dict[str, int] = {}
            for model in current.values():
                alive[model] = alive.get(model, 0) + 1
            for model, want in sorted(expected.items()):
                if alive.get(model, 0) >= want or self._stop.is_set():
                    continue
                if model not in (self._ready_models() or {model}):  # unloaded meanwhile
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
            if self.shm_watch is not None and not self._stop.is_set():
                from triton_embed_server.run.supervisor.shm_watch import reclaim

                reclaim(self, {pid: (m, self._seen[pid][1]) for pid, m in current.items()})

    def _start_stalled_now(self, current: dict[int, str]) -> bool:
        """Sample the start's progress; when it stalled, log which models and return True.

        Args:
            current: the server's live stubs, ``{pid: model}`` (:meth:`stubs`).
        """
        watch = self._watch
        if watch is None:
            return False
        import psutil

        now = time.monotonic()
        cpu: dict[int, float] = {}
        procs = [(self.process.pid, None)] + [(pid, self._seen[pid][0]) for pid in current]
        for pid, proc in procs:
            try:
                times = (proc or psutil.Process(pid)).cpu_times()
                cpu[pid] = times.user + times.system
            except psutil.Error:
                pass
        watch.sample(cpu, now)
        if not watch.stalled(now):
            return False
        stubs = {}
        for pid, model in current.items():
            try:
                instance = stub_instance_name(self._seen[pid][0].cmdline()) or model
            except psutil.Error:
                instance = model
            stubs[pid] = (model, instance)
        self.log(
            f"{watch.describe(stubs, now)}; stopping tritonserver (pid {self.process.pid}): "
            f"SIGTERM, then SIGKILL after {STALLED_STOP_S:g} s; it will be restarted"
        )
        return True

    def _ready_models(self) -> set[str] | None:
        """The server's READY models, or ``None`` when it cannot tell (keep what we had)."""
        try:
            return self.api.ready_models()
        except (OSError, ValueError, KeyError, TypeError):
            return None

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
        leftovers = dict(self._seen)
        for pid, entry in leftover_stubs(self.process.pid, self._started_at).items():
            leftovers.setdefault(pid, entry)
        running = [proc for proc, _ in leftovers.values() if is_running(proc)]
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
        removed = remove_shm_regions(region for _, region in leftovers.values())
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
        self._remove_dead_regions()

    def _remove_dead_regions(self) -> None:
        """Remove the ``/dev/shm`` regions of this server's stubs that are gone.

        A stub that was killed (or died) leaves its region behind, and Triton 2.51 keeps it
        for as long as the replaced version never finishes unloading: a reload after a
        stub death would leak one region each. Only stubs this supervisor saw under this
        server are candidates, never another server's.
        """
        gone = {pid: region for pid, (proc, region) in self._seen.items() if not is_running(proc)}
        removed = remove_shm_regions(gone.values())
        for pid in gone:
            del self._seen[pid]
        if removed:
            self.log(f"removed {len(removed)} shared-memory regions of stubs that are gone")

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
