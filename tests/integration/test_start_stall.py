"""A server start that makes no progress is caught, named and restarted (issue 20 item 15).

A real stalled load: a Python-backend model whose ``initialize`` logs its end and then
blocks for ever without using CPU (``tests/tiny_models.py``), next to a model that loads.
The supervisor sees no model state change in the server's log, no stub come or go and no
CPU used for ``--stall-timeout-s``, logs ``[supervisor] start stalled: ...`` naming the model
still loading and its stub, stops the server and restarts it; :class:`TritonServer` (the
tests' and ``scripts/main_job.py``'s launcher) waits through that one restart (Triton 2.51's
own hang after every instance initialized passes then) and fails at the second stall with
the first stall's line, instead of waiting for its own timeout. Tiny models: each server
starts in seconds.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from triton_embed_server.run.launcher import TritonServer, free_port
from triton_embed_server.run.supervisor import EXIT_RESTARTS_EXHAUSTED, SHM_PREFIX

from tests.tiny_models import tiny_repository

pytestmark = [pytest.mark.integration]

STALL_S = 8


def regions() -> set[str]:
    return {p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(SHM_PREFIX)}


def test_launcher_fails_at_the_second_stall_naming_the_stalled_model(tmp_path):
    repo = tiny_repository(tmp_path / "repo", {"identity": 1, "stall": 1}, stall={"stall"})
    server = TritonServer(
        model_repository=repo,
        supervisor_args=["--stall-timeout-s", str(STALL_S)],
        ready_timeout_s=240,
        log_path=tmp_path / "tritonserver.log",
    )
    before = regions()
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as caught:
            server.start()
    finally:
        server.stop()
    elapsed = time.monotonic() - t0
    message = str(caught.value)
    first = message.splitlines()[0]
    print(first, f"({elapsed:.1f} s)")
    assert first.startswith(
        f"tritonserver did not start: [supervisor] start stalled: no progress for {STALL_S} s "
        f"(--stall-timeout-s {STALL_S}; last: "
    ), first
    assert re.search(r"; model 'stall' loading for \d+ s \(stall_0_0 pid \d+ idle\)", first), first
    assert "; loaded: identity" in first
    assert "it will be restarted" in first
    log = (tmp_path / "tritonserver.log").read_text()
    assert "tiny model: initialize of stall_0_0 done" in log  # the stub got to its end
    assert "successfully loaded 'stall'" not in log
    assert log.count("[supervisor] start stalled:") == 2  # restarted once, then given up
    assert elapsed < 120, f"took {elapsed:.0f} s"  # not the 240 s ready timeout
    assert not [p for p in psutil.process_iter() if _in_group(p, server.process.pid)]
    assert not regions() - before  # its stubs' regions are gone


def _in_group(proc, pgid: int) -> bool:
    import os

    try:
        return os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE
    except (OSError, psutil.Error):
        return False


def test_supervisor_restarts_a_stalled_start_then_gives_up(tmp_path):
    """The first start too is restarted (a stall is no bad command line), within the budget."""
    repo = tiny_repository(tmp_path / "repo", {"stall": 1}, stall={"stall"})
    command = [sys.executable, "-m", "triton_embed_server.run.supervisor", "--stall-timeout-s",
               str(STALL_S), "--max-restarts", "1", "--restart-backoff-s", "0.5", "--",
               "--model-repository", str(repo)]  # fmt: skip
    for name in ("http", "grpc", "metrics"):
        command += [f"--{name}-address", "127.0.0.1", f"--{name}-port", str(free_port())]
    log_path = tmp_path / "supervisor.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    try:
        code = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert code == EXIT_RESTARTS_EXHAUSTED, log[-3000:]
    stalls = re.findall(r"\[supervisor\] start stalled: .*", log)
    assert len(stalls) == 2, log[-3000:]
    assert all("model 'stall' loading for" in line for line in stalls)
    assert "was stopped: its start stalled" in log
    assert "restarting tritonserver (restart 1;" in log
    assert "never ready" not in log
    assert "giving up: tritonserver was already restarted 1 times" in log
