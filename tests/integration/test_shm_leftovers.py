"""The ``/dev/shm`` regions of a SIGKILLed server are removed, another server's are not.

A stub killed together with its tritonserver cannot remove its region (the server created
it; python_backend removes it in its destructor, the stub when it exits by itself). Two
servers of tiny models (``tests/tiny_models.py``, two stub instances each) run at once; one
is SIGKILLed with its stubs, under the supervisor (which restarts it) and under
:class:`TritonServer` (whose :meth:`stop` cleans up): its regions are gone, the other's stay
(issue 20 item 16).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from triton_embed_server.run.launcher import TritonServer

from tests.tiny_models import tiny_repository

pytestmark = [pytest.mark.integration]


def present(names) -> set[str]:
    return {n for n in names if (Path("/dev/shm") / n).exists()}


@pytest.fixture
def two_servers(tmp_path):
    repo = tiny_repository(tmp_path / "repo", {"identity": 2})
    a = TritonServer(model_repository=repo, log_path=tmp_path / "a.log", ready_timeout_s=240)
    b = TritonServer(model_repository=repo, log_path=tmp_path / "b.log", ready_timeout_s=240)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_sigkill_under_the_supervisor_removes_only_that_servers_regions(two_servers):
    a, b = two_servers
    a_regions, b_regions = set(a.stub_regions()), set(b.stub_regions())
    assert len(a_regions) == len(b_regions) == 2 and not a_regions & b_regions
    assert present(a_regions | b_regions) == a_regions | b_regions
    (triton,) = psutil.Process(a.process.pid).children()  # the supervisor's tritonserver
    victims = [triton, *triton.children()]
    for proc in victims:  # the server and its stubs at once: no stub can clean up
        proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (a.is_ready() and set(a.stub_regions()) - a_regions):
        time.sleep(0.5)
    assert a.is_ready(), a.log_tail()
    log = a.log_path.read_text()
    assert "removed 2 shared-memory regions of the exited tritonserver" in log, log[-3000:]
    assert present(a_regions) == set()
    assert present(b_regions) == b_regions  # the other server's, untouched
    assert b.is_ready()


def test_sigkill_of_a_launched_server_then_stop_removes_only_its_regions(two_servers):
    a, b = two_servers
    a_regions, b_regions = set(a.stub_regions()), set(b.stub_regions())
    assert len(a_regions) == 2 and present(a_regions) == a_regions
    os.killpg(a.process.pid, signal.SIGKILL)  # supervisor, tritonserver and stubs
    a.process.wait()
    time.sleep(1)
    assert present(a_regions) == a_regions  # left behind: nobody could remove them
    a.stop()
    assert present(a_regions) == set()
    assert present(b_regions) == b_regions
    assert b.is_ready()
