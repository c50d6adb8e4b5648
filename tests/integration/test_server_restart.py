"""A dead tritonserver is restarted by the supervisor, within a budget. One supervised server.

The cases run in order on the same supervisor (``--max-restarts 2``): SIGKILL and SIGABRT are
each followed by a restart on the same ports with the same models, and a third kill spends
the budget: the supervisor exits 75 with its message and leaves no process behind
(docs/operations.md, "A dead tritonserver").
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request

import psutil
import pytest
import tritonclient.grpc as grpcclient
from triton_embed_server.run.supervised_server import SupervisedServer
from triton_embed_server.run.supervisor import EXIT_RESTARTS_EXHAUSTED, stub_parent_pid
from tritonclient.utils import InferenceServerException

from tests.helpers import DIM, infer_embed

pytestmark = [pytest.mark.integration, pytest.mark.slow]

READY_TIMEOUT_S = 400  # a start on 2 shared cores takes 25-100 s
MODELS = ("embed", "tokenizer", "embedder")
WATCHING = "watching stub processes per model"


@pytest.fixture(scope="module")
def supervised(tmp_path_factory):
    log = tmp_path_factory.mktemp("restart") / "supervisor.log"
    sup = SupervisedServer(log, ["--max-restarts", "2", "--restart-backoff-s", "0.5"])
    try:
        sup.wait_for_line(WATCHING, 1, READY_TIMEOUT_S)
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


def kill_and_recover(sup: SupervisedServer, sig: signal.Signals, restart: int) -> dict[str, float]:
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
    sup.wait_for_line(WATCHING, restart + 1, READY_TIMEOUT_S)
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
