"""A dead tritonserver is restarted by the supervisor, within a budget. One supervised server.

The cases run in order on the same supervisor (``--max-restarts 2``): SIGKILL and SIGABRT are
each followed by a restart on the same ports with the same models, and a third kill spends
the budget: the supervisor exits 75 with its message and leaves no process behind
(docs/operations.md, "A dead tritonserver").
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
import tritonclient.grpc as grpcclient
from triton_embed_server.run.launcher import REPO_ROOT, free_port
from triton_embed_server.run.supervisor import EXIT_RESTARTS_EXHAUSTED, stub_parent_pid
from tritonclient.utils import InferenceServerException

from tests.helpers import DIM, infer_embed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READY_TIMEOUT_S = 400  # a start on 2 shared cores takes 25-100 s
MODELS = ("embed", "tokenizer", "embedder")
WATCHING = "watching stub processes per model"


class Supervised:
    """``python -m triton_embed_server.run.supervisor`` on free loopback ports, output to a log."""

    def __init__(self, log_path, *own_args):
        self.ports = {name: free_port() for name in ("http", "grpc", "metrics")}
        self.log_path = log_path
        command = [sys.executable, "-m", "triton_embed_server.run.supervisor", *own_args, "--"]
        command += ["--model-repository", str(REPO_ROOT / "model_repository")]
        for name, port in self.ports.items():
            command += [f"--{name}-address", "127.0.0.1", f"--{name}-port", str(port)]
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.server_pids: set[int] = set()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_watching(self, count: int) -> None:
        """Until the supervisor saw its ``count``-th server ready (and recorded its stubs)."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.log().count(WATCHING) < count:
            assert self.process.poll() is None, self.log()[-4000:]
            assert time.monotonic() < deadline, self.log()[-4000:]
            time.sleep(0.5)

    def server(self) -> psutil.Process:
        (child,) = psutil.Process(self.process.pid).children()
        self.server_pids.add(child.pid)
        return child

    def get(self, path: str) -> int:
        try:
            url = f"http://127.0.0.1:{self.ports['http']}{path}"
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status
        except OSError:
            return 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        try:  # anything left in its session: the server, orphaned stubs
            os.killpg(self.process.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.process.poll() is None:
            self.process.wait()


@pytest.fixture(scope="module")
def supervised(tmp_path_factory):
    log = tmp_path_factory.mktemp("restart") / "supervisor.log"
    sup = Supervised(log, "--max-restarts", "2", "--restart-backoff-s", "0.5")
    try:
        sup.wait_watching(1)
        yield sup
    finally:
        sup.stop()
        print(f"\nsupervisor log: {log}")


def live_stubs_of(pids: set[int]) -> list[int]:
    """Stub processes, not zombies, whose parent argument is one of ``pids``."""
    out = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and (
            stub_parent_pid(proc.info["cmdline"] or []) in pids
        ):
            out.append(proc.pid)
    return out


def kill_and_recover(sup: Supervised, sig: signal.Signals, restart: int) -> dict[str, float]:
    """Kill the server with ``sig``; wait until it serves again; return the times."""
    old = sup.server()
    old_stubs = old.children()
    assert len(old_stubs) == 3  # tokenizer + 2 embedder instances
    t0 = time.monotonic()
    old.send_signal(sig)
    old.wait(timeout=120)
    gone = time.monotonic() - t0
    ready = None
    # Nothing listens meanwhile. (Channels with their own connections: gRPC shares one
    # between channels to the same target, and after a failed connection it waits out a
    # reconnect backoff, which would delay the first embed below.)
    url, local = f"127.0.0.1:{sup.ports['grpc']}", [("grpc.use_local_subchannel_pool", 1)]
    with grpcclient.InferenceServerClient(url, channel_args=local) as probe:
        with pytest.raises(InferenceServerException) as down:
            infer_embed(probe, ["while it restarts"])
    assert down.value.status() == "StatusCode.UNAVAILABLE", down.value
    client = grpcclient.InferenceServerClient(url, channel_args=local)
    assert sup.get("/v2/health/ready") == 0  # connection refused: not ready
    try:
        while time.monotonic() - t0 < READY_TIMEOUT_S:
            assert sup.process.poll() is None, sup.log()[-4000:]
            if ready is None and sup.get("/v2/health/ready") == 200:
                ready = time.monotonic() - t0
            if ready is not None:
                try:
                    embeddings, tokens = infer_embed(client, ["hello world", "a second text"])
                    break
                except Exception:  # noqa: BLE001 - UNAVAILABLE until the models are in
                    pass
            time.sleep(0.2)
        else:
            pytest.fail(f"not serving {READY_TIMEOUT_S} s after {sig.name}:\n{sup.log()[-4000:]}")
        first_embed = time.monotonic() - t0
    finally:
        client.close()
    assert embeddings.shape == (2,) and all(len(e) == 4 * DIM for e in embeddings)
    assert tokens.tolist() == [4, 5]
    for model in MODELS:  # the same models, READY, on the same HTTP port
        assert sup.get(f"/v2/models/{model}/ready") == 200, model
    metrics = f"http://127.0.0.1:{sup.ports['metrics']}/metrics"
    with urllib.request.urlopen(metrics, timeout=5) as r:
        assert r.status == 200  # and the same metrics port
    new = sup.server()
    assert new.pid != old.pid
    assert not [p.pid for p in old_stubs if p.is_running() and p.status() != "zombie"]
    sup.wait_watching(restart + 1)
    log = sup.log()
    assert f"killed by {sig.name} (signal {int(sig)}) after" in log
    assert f"restarting tritonserver (restart {restart};" in log
    assert log.count("tritonserver ready again") == restart and f"(restart {restart};" in log
    times = {"gone": gone, "ready": ready, "first_embed": first_embed}
    print(
        f"\n{sig.name}: server gone after {gone:.1f} s, /v2/health/ready 200 after "
        f"{ready:.1f} s, first embed after {first_embed:.1f} s"
    )
    return times


def test_a_sigkilled_server_is_restarted_on_the_same_ports(supervised):
    kill_and_recover(supervised, signal.SIGKILL, restart=1)


def test_a_sigabrted_server_is_restarted(supervised):
    kill_and_recover(supervised, signal.SIGABRT, restart=2)


def test_past_the_budget_the_supervisor_exits_75_and_leaves_nothing(supervised):
    server = supervised.server()
    server.kill()
    code = supervised.process.wait(timeout=120)
    log = supervised.log()
    assert code == EXIT_RESTARTS_EXHAUSTED, log[-4000:]
    assert "giving up: tritonserver was already restarted 2 times" in log
    assert "an orchestrator must restart the service" in log
    assert not live_stubs_of(supervised.server_pids)
    left = []
    for proc in psutil.process_iter(["status"]):
        try:  # orphaned stubs that exited wait as zombies until init reaps them
            if (
                os.getpgid(proc.pid) == supervised.process.pid
                and proc.info["status"] != psutil.STATUS_ZOMBIE
            ):
                left.append(proc.pid)
        except OSError:
            pass
    assert not left, left
