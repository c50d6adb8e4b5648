"""Run tritonserver and restart a Python-backend model whose stub process died.

Triton 2.51's Python backend does not notice a dead stub: the model stays READY, the server
stays ready, and every request routed to that instance fails with "Stub process ... is not
healthy" for ever (triton-inference-server/server #7230, #8604; ``tests/integration/
test_faults.py`` kills one embedder stub and watches the requests routed to it fail).
Newer Python backends add active health checks; this supervisor brings the same guarantee
to 2.51:

* it starts ``tritonserver`` with ``--model-control-mode explicit --load-model *`` (unless a
  control mode is given) and forwards SIGTERM/SIGINT to it;
* once the server is ready, it records the stub processes of each model and checks them
  every ``--poll-s`` seconds;
* when a stub is gone (or a zombie) it reloads that model through the KServe v2 repository
  API (``POST /v2/repository/models/<name>/load``), which starts fresh instances; requests
  fail only until the reload completes (about the model's load time);
* if the reload fails ``--max-reloads`` times in a row, it stops the server (exit code 70)
  so an orchestrator restarts it rather than leaving it "ready" while failing.

    python -m triton_embed_server.supervisor [--poll-s 1] -- <tritonserver arguments>
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from triton_embed_server.admin_key import restricted_http_headers
from triton_embed_server.instance_group import instance_count

STUB_MARKER = "triton_python_backend_stub"
EXIT_RELOAD_FAILED = 70


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


class Supervisor:
    """Watches one tritonserver child process; see the module docstring."""

    def __init__(self, command: list[str], poll_s: float = 1.0, max_reloads: int = 3):
        self.command = command
        self.poll_s = poll_s
        self.max_reloads = max_reloads
        address = option_value(command, "--http-address", "127.0.0.1")
        if address in ("0.0.0.0", "::", ""):
            address = "127.0.0.1"
        self.http = f"http://{address}:{option_value(command, '--http-port', '8000')}"
        # The admin key header the server requires (its --http-restricted-api flags), if any.
        self._config_headers = restricted_http_headers(command, "model-config")
        self._repository_headers = restricted_http_headers(command, "model-repository")
        self.process: subprocess.Popen | None = None
        self._seen: set[int] = set()  # stub PIDs ever seen, reaped when the server is gone
        self.generation = 0
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
                model = stub_model_name(child.cmdline())
            except psutil.Error:
                continue
            if model:
                out[child.pid] = model
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
        """Start the server, supervise it, return its exit code."""
        self.process = subprocess.Popen(self.command)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._forward)
        try:
            return self._supervise()
        finally:
            self._reap_stubs()

    def _supervise(self) -> int:
        expected: dict[str, int] = {}
        failures = 0
        while self.process.poll() is None:
            time.sleep(self.poll_s)
            current = self.stubs()  # one process-table scan per poll
            self._seen |= set(current)
            if self._stop.is_set() or self.process.poll() is not None:
                continue
            if not expected:
                if self._get("/v2/health/ready") == 200:
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
                        self.log(
                            f"{failures} reloads failed; stopping the server so it can be restarted"
                        )
                        self.process.send_signal(signal.SIGTERM)
                        self.process.wait()
                        return EXIT_RELOAD_FAILED
        return self.process.returncode

    def _reap_stubs(self, grace_s: float = 10.0) -> None:
        """Kill the stubs a stopped tritonserver left behind.

        After a failed start the embedder stubs can outlive the server and ignore SIGTERM.
        """
        import psutil

        deadline = time.monotonic() + grace_s
        left = [p for p in self._seen if psutil.pid_exists(p)]
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = [p for p in left if psutil.pid_exists(p)]
        for pid in left:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE and stub_model_name(proc.cmdline()):
                    self.log(f"stopping stub process {pid} left behind by tritonserver")
                    proc.kill()
            except psutil.Error:
                pass

    def _retire(self, old: set[int], grace_s: float = 15.0) -> None:
        """Stop the surviving stubs of the replaced model version.

        Traffic already goes to the new instances. Triton 2.51 never finishes unloading a
        version one of whose stubs died, so its surviving stubs would linger with their
        engines' memory; after ``grace_s`` they are killed.
        """
        import psutil

        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(psutil.pid_exists(p) for p in old):
            time.sleep(0.5)
        for pid in old:
            try:
                proc = psutil.Process(pid)
                if proc.status() != psutil.STATUS_ZOMBIE:
                    self.log(f"stopping stub process {pid} of the replaced model version")
                    proc.kill()
            except psutil.Error:
                pass

    def _wait_for_stub_count(self, model: str, expected: int, timeout_s: float = 60.0) -> None:
        """After a reload, wait until the old instances are gone and the new ones run."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sum(1 for m in self.stubs().values() if m == model) == expected:
                return
            time.sleep(0.25)

    def _forward(self, signum, frame) -> None:
        self._stop.set()
        if self.process and self.process.poll() is None:
            self.process.send_signal(signum)


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``[--poll-s S] [--max-reloads N] -- tritonserver-args...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    own, server_args = (
        (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else ([], argv)
    )
    parser = argparse.ArgumentParser(prog="python -m triton_embed_server.supervisor")
    parser.add_argument("--poll-s", type=float, default=1.0, help="seconds between checks")
    parser.add_argument(
        "--max-reloads", type=int, default=3, help="failed reloads before giving up"
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
    return Supervisor(command, opts.poll_s, opts.max_reloads).run()


if __name__ == "__main__":
    sys.exit(main())
