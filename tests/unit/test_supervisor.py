from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from triton_embed_server.run.launcher import free_port
from triton_embed_server.run.supervisor import (
    EXIT_RESTARTS_EXHAUSTED,
    RestartPolicy,
    busy_ports,
    child_stubs,
    describe_exit,
    exit_status,
    is_running,
    leftover_stubs,
    option_value,
    process_created_at,
    remove_shm_regions,
    server_arguments,
    server_endpoints,
    stop_processes,
    stub_model_name,
    stub_parent_pid,
    stub_shm_region,
)
from triton_embed_server.run.supervisor.startup import StartWatch


def test_stub_model_name_reads_the_model_folder():
    cmd = [
        "/x/backends/python/triton_python_backend_stub",
        "/repo/model_repository/embedder/1/model.py",
        "triton_python_backend_shm_region_1",
        "1048576",
        "1048576",
        "123",
        "/x",
        "336",
        "embedder_0_1",
        "DEFAULT",
    ]
    assert stub_model_name(cmd) == "embedder"
    assert stub_model_name(["/usr/bin/python", "x.py"]) is None
    assert stub_model_name([]) is None


def test_option_value_last_wins_and_equals_form():
    args = ["--http-port", "1", "--grpc-port=5", "--http-port=9"]
    assert option_value(args, "--http-port", "8000") == "9"
    assert option_value(args, "--grpc-port", "8001") == "5"
    assert option_value(args, "--metrics-port", "8002") == "8002"


def test_server_arguments_adds_explicit_model_control_and_loose_readiness_unless_given():
    assert server_arguments(["--model-repository", "r"]) == [
        "--model-repository",
        "r",
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--strict-readiness",
        "false",
    ]
    given = ["--model-control-mode=poll", "--strict-readiness=true"]
    assert server_arguments(given) == given


# ---- whole-server restarts: budget, backoff, ports, stub reaping ---------------------------

STUB_CMD = [
    "/x/backends/python/triton_python_backend_stub",
    "/repo/model_repository/embedder/1/model.py",
    "triton_python_backend_shm_region_0f1e",
    "1048576",
    "1048576",
    "4242",
    "/x",
    "336",
    "embedder_0_1",
    "DEFAULT",
]


def test_restart_delay_doubles_per_recent_restart_up_to_the_cap():
    policy = RestartPolicy(max_restarts=10, window_s=600, backoff_s=1, backoff_max_s=5)
    history: list[float] = []
    delays = []
    for now in (100.0, 110.0, 120.0, 130.0, 140.0):
        delays.append(policy.delay(history, now))
        history.append(now)
    assert delays == [1, 2, 4, 5, 5]


def test_restart_budget_is_n_per_window_and_recovers_as_the_window_slides():
    policy = RestartPolicy(max_restarts=2, window_s=60, backoff_s=1, backoff_max_s=30)
    assert policy.delay([], 0.0) == 1
    assert policy.delay([0.0], 10.0) == 2
    assert policy.delay([0.0, 10.0], 20.0) is None  # a third death within 60 s: give up
    assert policy.delay([0.0, 10.0], 59.9) is None
    assert policy.delay([0.0, 10.0], 60.0) == 2  # the restart at 0 left the window
    assert policy.delay([0.0, 10.0], 70.0) == 1  # both left: the backoff starts over
    assert policy.recent([0.0, 10.0, 50.0], 65.0) == [10.0, 50.0]


def test_max_restarts_zero_never_restarts():
    assert RestartPolicy(max_restarts=0).delay([], 0.0) is None


def test_exit_descriptions_and_statuses():
    assert describe_exit(-9) == "killed by SIGKILL (signal 9)"
    assert describe_exit(-6) == "killed by SIGABRT (signal 6)"
    assert describe_exit(1) == "exited with code 1"
    assert exit_status(-9) == 137 and exit_status(-15) == 143
    assert exit_status(0) == 0 and exit_status(1) == 1
    assert EXIT_RESTARTS_EXHAUSTED not in (0, 1, 70, 137, 143)


def test_stub_parent_pid_and_shm_region_from_the_command_line():
    assert stub_parent_pid(STUB_CMD) == 4242
    assert stub_shm_region(STUB_CMD) == "triton_python_backend_shm_region_0f1e"
    assert stub_parent_pid(["/usr/bin/python", "a", "b", "c", "d", "1"]) is None
    assert stub_shm_region([*STUB_CMD[:2], "../etc/passwd", *STUB_CMD[3:]]) is None
    assert stub_parent_pid(STUB_CMD[:4]) is None


def test_server_endpoints_follow_tritonserver_defaults_and_options():
    assert server_endpoints([]) == [
        ("http", "0.0.0.0", 8000),
        ("grpc", "0.0.0.0", 8001),
        ("metrics", "0.0.0.0", 8002),
    ]
    args = ["--http-address", "127.0.0.1", "--http-port=9000", "--allow-metrics", "false"]
    assert server_endpoints(["--allow-grpc=0", *args]) == [("http", "127.0.0.1", 9000)]


def test_busy_ports_sees_a_listener_and_not_a_closed_port():
    port = free_port()
    endpoint = [("http", "127.0.0.1", port)]
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()
        assert busy_ports(endpoint) == endpoint
    assert busy_ports(endpoint) == []


def test_stop_processes_sigterm_then_sigkill_after_the_grace():
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
            " print('ready', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stubborn.stdout.readline() == "ready\n"
        logged: list[str] = []
        t0 = time.monotonic()
        killed = stop_processes(
            [psutil.Process(polite.pid), psutil.Process(stubborn.pid)], 1.0, logged.append
        )
        elapsed = time.monotonic() - t0
        assert killed == [stubborn.pid]
        assert polite.wait(5) == -signal.SIGTERM and stubborn.wait(5) == -signal.SIGKILL
        assert 1.0 <= elapsed < 5 and str(stubborn.pid) in logged[0]
    finally:
        for p in (polite, stubborn):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_stubs_are_found_below_their_server_and_by_their_parent_argument(tmp_path):
    script = tmp_path / "repo" / "embedder" / "1" / "model.py"
    script.parent.mkdir(parents=True)
    script.write_text("import time; print('up', flush=True); time.sleep(60)")
    started_at = process_created_at(os.getpid())  # this test stands in for the server
    region = "triton_python_backend_shm_region_test"
    stub = subprocess.Popen(
        [STUB_CMD[0], str(script), region, "1", "1", str(os.getpid()), "/x"],
        executable=sys.executable,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert stub.stdout.readline() == "up\n"
        (proc, model, shm_region) = child_stubs(os.getpid())[stub.pid]
        assert (proc.pid, model, shm_region) == (stub.pid, "embedder", region)
        assert is_running(proc)
        assert leftover_stubs(os.getpid(), started_at)[stub.pid][1] == region
        assert stub.pid not in leftover_stubs(os.getpid(), started_at + 3600)  # started before
        assert stub.pid not in leftover_stubs(os.getpid() + 1_000_000, started_at)
    finally:
        stub.kill()
        stub.wait()
    assert not is_running(proc)


def test_remove_shm_regions_removes_what_is_there(tmp_path):
    (tmp_path / "triton_python_backend_shm_region_a").write_bytes(b"x")
    regions = ["triton_python_backend_shm_region_a", "triton_python_backend_shm_region_b", None]
    assert remove_shm_regions(regions, tmp_path) == ["triton_python_backend_shm_region_a"]
    assert list(tmp_path.iterdir()) == []


# A stand-in for tritonserver: answers /v2/health/ready on --http-port, exits 0 on SIGTERM,
# and kills itself with FAKE_DEATH after FAKE_LIFE_S seconds (or exits FAKE_EXIT at once).
FAKE_SERVER = textwrap.dedent(
    """
    import http.server, os, signal, sys, threading, time
    if os.environ.get("FAKE_EXIT"):
        sys.exit(int(os.environ["FAKE_EXIT"]))
    if os.environ.get("FAKE_HANG"):  # a load that never finishes: no HTTP endpoint
        signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
        time.sleep(3600)
    args = sys.argv[1:]
    port = int(args[args.index("--http-port") + 1])

    class Ready(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/ready" else 404)
            self.end_headers()

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Ready)
    server.allow_reuse_address = True
    signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print("fake server up", os.getpid(), flush=True)
    life = float(os.environ.get("FAKE_LIFE_S", "3600"))
    time.sleep(life)
    os.kill(os.getpid(), getattr(signal, os.environ.get("FAKE_DEATH", "SIGKILL")))
    """
)


@pytest.fixture()
def fake_tritonserver(tmp_path):
    path = tmp_path / "tritonserver"
    path.write_text(f"#!{sys.executable}\n{FAKE_SERVER}")
    path.chmod(0o755)
    return path


def supervise(fake, log, *own, env=None):
    """Start the supervisor on the fake server, its output to ``log``."""
    ports = [free_port() for _ in range(3)]
    cmd = [
        sys.executable,
        "-m",
        "triton_embed_server.run.supervisor",
        *("--tritonserver", str(fake), "--poll-s", "0.2", *own),
        "--",
        *("--http-address", "127.0.0.1", "--http-port", str(ports[0])),
        *("--grpc-address", "127.0.0.1", "--grpc-port", str(ports[1])),
        *("--metrics-address", "127.0.0.1", "--metrics-port", str(ports[2])),
    ]
    with open(log, "wb") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def finish(proc, log, timeout_s=60):
    """Wait for the supervisor; kill its process group whatever happens."""
    try:
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    return proc.returncode, log.read_text()


def test_a_dying_server_is_restarted_until_the_budget_is_spent(fake_tritonserver, tmp_path):
    log = tmp_path / "log"
    proc = supervise(
        fake_tritonserver,
        log,
        *("--max-restarts", "2", "--restart-backoff-s", "0.1"),
        env={"FAKE_LIFE_S": "1", "FAKE_DEATH": "SIGABRT"},
    )
    code, out = finish(proc, log)
    assert code == EXIT_RESTARTS_EXHAUSTED, out
    assert out.count("fake server up") == 3, out  # the first start and 2 restarts
    assert out.count("killed by SIGABRT (signal 6) after") == 3
    assert "restarting tritonserver (restart 1; 1 of at most 2 in 600 s; backoff 0.1 s)" in out
    assert "(restart 2; 2 of at most 2 in 600 s; backoff 0.2 s)" in out  # the backoff doubled
    assert out.count("tritonserver ready again") == 2
    assert "giving up" in out and "orchestrator" in out and "--max-restarts 2" in out


def test_sigterm_stops_without_restart_and_returns_the_server_code(fake_tritonserver, tmp_path):
    log = tmp_path / "log"
    proc = supervise(fake_tritonserver, log, "--max-restarts", "5")
    deadline = time.monotonic() + 30
    while "watching stub processes" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    code, out = finish(proc, log)
    assert code == 0, out
    assert out.count("fake server up") == 1 and "restarting" not in out
    assert "(asked to stop)" in out


def test_a_server_that_never_became_ready_is_not_restarted(fake_tritonserver, tmp_path):
    log = tmp_path / "log"
    proc = supervise(fake_tritonserver, log, "--max-restarts", "5", env={"FAKE_EXIT": "3"})
    code, out = finish(proc, log)
    assert code == 3, out
    assert "exited with code 3 after" in out and "never ready" in out and "not restarting" in out


def test_a_server_not_ready_in_time_is_stopped(fake_tritonserver, tmp_path):
    log = tmp_path / "log"
    proc = supervise(fake_tritonserver, log, "--ready-timeout-s", "1", env={"FAKE_HANG": "1"})
    code, out = finish(proc, log)
    assert code == 1, out  # it exited 0 on SIGTERM, but it never served
    assert "not ready after 1 s (--ready-timeout-s); stopping it" in out
    assert "not restarting" in out


def test_restarts_off_returns_the_server_exit_status(fake_tritonserver, tmp_path):
    log = tmp_path / "log"
    env = {"FAKE_LIFE_S": "1", "FAKE_DEATH": "SIGKILL"}
    proc = supervise(fake_tritonserver, log, "--max-restarts", "0", env=env)
    code, out = finish(proc, log)
    assert code == 137, out
    assert "restarting" not in out


# --- a start that makes no progress (issue 20 item 15) ----------------------------------------


def lifecycle(*events: str) -> list[str]:
    """Triton 2.51 log lines (the format of ``model_lifecycle.cc`` and ``python_be.cc``)."""
    lines = {
        "loading": 'I1202 00:38:28.474817 5776 model_lifecycle.cc:472] "loading: {}:1"',
        "instance": 'I1202 00:38:30.133957 5776 python_be.cc:2249] "TRITONBACKEND_ModelInstance'
        'Initialize: {} (CPU device 0)"',
        "loaded": "I1202 00:38:43.004791 5776 model_lifecycle.cc:839] \"successfully loaded '{}'\"",
        "failed": "I1202 00:40:06.597943 5776 model_lifecycle.cc:777] \"failed to load '{}'\"",
    }
    return [lines[kind].format(name) for kind, name in (e.split(":") for e in events)]


def test_start_watch_a_hang_after_every_initialize_is_a_stall():
    """Issue 20 item 15's hang: instances initialized, nothing loaded, the tree idle."""
    watch = StartWatch(now=0.0, stall_s=60.0)
    for line in lifecycle("loading:tokenizer", "loading:embedder", "instance:tokenizer_0_0",
                          "instance:embedder_0_0", "instance:embedder_0_1"):  # fmt: skip
        watch.feed(line + "\n")
    watch.feed("tiny model: initialize done\n")  # not a lifecycle line
    stubs = {11: 5.0, 12: 7.0, 13: 7.0, 10: 3.0}
    watch.sample(stubs, now=35.0)  # the lines arrive: progress at 35 s
    assert watch.last_event == "instance embedder_0_1 initializing"
    for t in range(36, 95):  # a minute of health polling: 10 ms of CPU per second in all
        stubs = {pid: cpu + 0.0025 for pid, cpu in stubs.items()}
        watch.sample(stubs, now=float(t))
        assert not watch.stalled(float(t))
    watch.sample(stubs, now=95.0)
    assert watch.stalled(95.0)
    described = watch.describe(
        {11: ("tokenizer", "tokenizer_0_0"), 12: ("embedder", "embedder_0_0"),
         13: ("embedder", "embedder_0_1")}, now=95.0,
    )  # fmt: skip
    assert described == (
        "start stalled: no progress for 60 s (--stall-timeout-s 60; last: instance embedder_0_1 "
        "initializing; under 1 s of CPU used since); model 'embedder' loading for 60 s "
        "(embedder_0_0 pid 12, embedder_0_1 pid 13 idle); model 'tokenizer' loading for 60 s "
        "(tokenizer_0_0 pid 11 idle)"
    )
    assert watch.longest_quiet_s == 60.0


def test_start_watch_idle_vllm_engines_polling_are_no_progress():
    """A stalled start seen here: 4 idle vLLM engines used 0.9 s of CPU in 20 s together."""
    watch = StartWatch(now=0.0, stall_s=60.0)
    stubs = {10: 3.0, 11: 5.0, 12: 5.0, 13: 5.0, 14: 5.0}
    for t in range(1, 60):
        stubs = {pid: cpu + (0.01125 if pid != 10 else 0.0) for pid, cpu in stubs.items()}
        watch.sample(stubs, now=float(t))
        assert not watch.stalled(float(t))
    watch.sample(stubs, now=60.0)
    assert watch.stalled(60.0)  # 0.9 s summed every 20 s no longer counts as progress
    busy = {**stubs, 12: stubs[12] + 1.2}  # one engine loading: 1.2 s within the window
    watch.sample(busy, now=61.0)
    assert not watch.stalled(61.0) and "by one process" in watch.last_event


def test_start_watch_cpu_use_and_model_states_are_progress():
    watch = StartWatch(now=0.0, stall_s=10.0)
    watch.sample({1: 0.0, 2: 0.0}, now=1.0)
    for t in range(2, 40):  # a busy initialize: 0.2 s of CPU per second, 1 s every 5 s
        watch.sample({1: 0.0, 2: 0.2 * t}, now=float(t))
        assert not watch.stalled(float(t)), t
    assert watch.longest_quiet_s < 6
    watch.feed(lifecycle("loaded:tokenizer")[0])
    watch.sample({1: 0.0, 2: 7.8}, now=48.0)  # 8 s idle, then the line: progress again
    assert not watch.stalled(57.0) and watch.loaded == {"tokenizer"}
    watch.sample({1: 0.0}, now=58.0)  # a stub exited: progress
    assert watch.last_event == "a stub process started or exited" and not watch.stalled(67.0)
    watch.feed(lifecycle("loading:embedder")[0])
    watch.feed(lifecycle("failed:embedder")[0])
    watch.sample({1: 0.0}, now=60.0)
    assert watch.failed == {"embedder"} and watch.loading == {}
    assert watch.stalled(70.0)
    assert watch.describe({}, now=70.0).endswith(
        "no model load was logged; loaded: tokenizer; failed: embedder"
    )


def test_a_stalled_start_is_restarted_the_first_too(fake_tritonserver, tmp_path):
    log = tmp_path / "log"
    proc = supervise(
        fake_tritonserver,
        log,
        *("--stall-timeout-s", "1", "--max-restarts", "1", "--restart-backoff-s", "0.1"),
        env={"FAKE_HANG": "1"},
    )
    code, out = finish(proc, log)
    assert code == EXIT_RESTARTS_EXHAUSTED, out
    assert out.count("start stalled: no progress for 1 s (--stall-timeout-s 1; last: ") == 2, out
    assert "no model load was logged; stopping tritonserver (pid " in out
    assert "was stopped: its start stalled after" in out
    assert "restarting tritonserver (restart 1;" in out and "never ready" not in out
