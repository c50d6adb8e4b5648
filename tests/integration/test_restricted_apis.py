"""Restricted APIs on a real server: without the admin key only health, metadata and gRPC inference.

The shared session server (launcher, a random key) shows the refusals; a private server
started by ``scripts/serve.sh`` (key generated into its own ``XDG_STATE_HOME``) shows that the
key unloads and loads models, that the refused code-carrying load really would run code, that
the supervisor's reloads carry the key, and that no log holds the key.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import stat
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import tritonclient.grpc as grpcclient
from triton_embed import AccessDeniedError, EmbeddingClient
from triton_embed.admin import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_FILE_ENV,
    default_key_file,
    grpc_headers,
    http_headers,
    read_key_file,
)
from triton_embed_server.host.admin_key import HTTP_RESTRICTED_APIS, RESTRICTED_APIS
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import free_port
from tritonclient.utils import InferenceServerException

from tests.helpers import DIM, infer_embed, run_cli, start_serve_sh

pytestmark = pytest.mark.integration

HTTP_REFUSAL = "This API is restricted, expecting header 'triton-embed-admin-key'"
GRPC_REFUSAL = (
    "This protocol is restricted, expecting header 'triton-grpc-protocol-triton-embed-admin-key'"
)
WRONG_KEY = "w" * 43
# One call per restricted API (HTTP): (api, method, path).
RESTRICTED_HTTP = [
    ("model-config", "GET", "/v2/models/embed/config"),
    ("model-repository", "POST", "/v2/repository/index"),
    ("statistics", "GET", "/v2/models/stats"),
    ("trace", "GET", "/v2/trace/setting"),
    ("logging", "GET", "/v2/logging"),
    ("shared-memory", "GET", "/v2/systemsharedmemory/status"),
]
OPEN_HTTP = [("GET", "/v2/health/ready"), ("GET", "/v2"), ("GET", "/v2/models/embed")]
INFER_PATH = "/v2/models/embed/infer"
ONE_TEXT = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}


def deep_nested_infer_body(depth: int = 100_000) -> bytes:
    """Issue 20's crash: an inference body whose ``data`` is nested ``depth`` levels (200 KB)."""
    data = "[" * depth + '"x"' + "]" * depth
    return (
        '{"inputs":[{"name":"TEXT","shape":[1,1],"datatype":"BYTES","data":' + data + "}]}"
    ).encode()


def grpc_health_check(grpc_url: str) -> bytes:
    """The raw ``grpc.health.v1.Health/Check`` answer (service ""), as a Kubernetes probe asks.

    ``b"\x08\x01"`` is ``HealthCheckResponse{status: SERVING}``, ``b"\x08\x02"`` NOT_SERVING.
    """
    import grpc

    with grpc.insecure_channel(grpc_url) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        return check(b"", timeout=10)


def http(base: str, method: str, path: str, body: bytes | None = None, headers=None):
    """One HTTP call; returns ``(status, body text)`` for errors too."""
    if body is None and method == "POST":
        body = b"{}"
    req = urllib.request.Request(
        base + path,
        data=body,
        method=method,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


def code_carrying_load(name: str, marker: Path) -> bytes:
    """A repository load whose ``file:1/model.py`` override writes ``marker`` when imported."""
    code = (
        "from pathlib import Path\n"
        f"Path({str(marker)!r}).write_text('model code ran inside the server')\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )
    config = {
        "name": name,
        "backend": "python",
        "max_batch_size": 0,
        "input": [{"name": "IN", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [1]}],
    }
    parameters = {
        "config": json.dumps(config),
        "file:1/model.py": base64.b64encode(code.encode()).decode(),
    }
    return json.dumps({"parameters": parameters}).encode()


def env_without_key(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This environment minus any admin key, with an empty ``XDG_STATE_HOME``."""
    env = {k: v for k, v in os.environ.items() if k not in (ADMIN_KEY_ENV, ADMIN_KEY_FILE_ENV)}
    return {**env, "XDG_STATE_HOME": str(tmp_path / "no-state"), **extra}


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return run_cli(*args, env=env)


# ---- the shared server: refusals -------------------------------------------------------------


def test_an_unauthenticated_load_with_code_is_refused_and_the_code_never_runs(server, tmp_path):
    marker = tmp_path / "marker"
    body = code_carrying_load("intruder", marker)
    for headers in (None, http_headers(WRONG_KEY)):
        status, text = http(
            server.http_url, "POST", "/v2/repository/models/intruder/load", body, headers
        )
        print(f"load with a file:1/model.py override, {headers and 'wrong key'}: {status} {text}")
        assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL})
    time.sleep(2)
    assert not marker.exists()
    status, index = http(
        server.http_url, "POST", "/v2/repository/index", headers=server.admin_http_headers
    )
    assert status == 200 and "intruder" not in index
    assert "intruder" not in server.log_tail(2_000_000)  # Triton never started loading it


def test_an_unauthenticated_unload_of_embed_is_refused_over_http_and_grpc(server, grpc_client):
    for headers in (None, http_headers(WRONG_KEY)):
        status, text = http(
            server.http_url, "POST", "/v2/repository/models/embed/unload", headers=headers
        )
        assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL})
    for headers in (None, grpc_headers(WRONG_KEY)):
        with pytest.raises(InferenceServerException) as info:
            grpc_client.unload_model("embed", headers=headers)
        print(f"gRPC unload: {info.value.status()} {info.value.message()}")
        assert info.value.message() == GRPC_REFUSAL
    assert server.is_ready() and grpc_client.is_model_ready("embed")
    vectors, _ = infer_embed(grpc_client, ["still serving"])
    assert len(vectors) == 1


def test_every_api_but_health_metadata_and_grpc_inference_needs_the_key(server, grpc_client):
    assert {api for api, _, _ in RESTRICTED_HTTP} == set(RESTRICTED_APIS)
    assert set(HTTP_RESTRICTED_APIS) == set(RESTRICTED_APIS) | {"inference"}
    for api, method, path in RESTRICTED_HTTP:
        status, text = http(server.http_url, method, path)
        assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL}), api
        status, _ = http(server.http_url, method, path, headers=server.admin_http_headers)
        assert status == 200, api
    for method, path in OPEN_HTTP:
        assert http(server.http_url, method, path)[0] == 200, path
    # HTTP inference: refused without the key (the gateway is the HTTP API), served with it
    body = json.dumps(ONE_TEXT).encode()
    for headers in (None, http_headers(WRONG_KEY)):
        status, text = http(server.http_url, "POST", INFER_PATH, body, headers)
        assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL})
    status, text = http(server.http_url, "POST", INFER_PATH, body, server.admin_http_headers)
    assert status == 200 and '"NUM_TOKENS"' in text
    restricted_grpc = {
        "model-config": lambda h: grpc_client.get_model_config("embed", headers=h),
        "model-repository": lambda h: grpc_client.get_model_repository_index(headers=h),
        "statistics": lambda h: grpc_client.get_inference_statistics("embed", headers=h),
        "trace": lambda h: grpc_client.get_trace_settings(headers=h),
        "logging": lambda h: grpc_client.get_log_settings(headers=h),
        "shared-memory": lambda h: grpc_client.get_system_shared_memory_status(headers=h),
    }
    assert set(restricted_grpc) == set(RESTRICTED_APIS)
    for api, call in restricted_grpc.items():
        with pytest.raises(InferenceServerException, match="restricted") as info:
            call(None)
        assert info.value.message() == GRPC_REFUSAL, api
        call(server.admin_grpc_headers)  # no exception
    assert grpc_client.is_server_ready() and grpc_client.is_model_ready("embed")
    assert grpc_client.get_model_metadata("embed").name == "embed"


def test_a_keyless_100000_level_body_is_refused_before_triton_parses_it(server, grpc_client):
    # Sent to a server without the HTTP inference restriction, this body kills tritonserver
    # (SIGSEGV in its HTTP frontend's JSON parser; reproduced with 2.51 here). The
    # restriction is checked on the URL and header first: the body is never parsed.
    body = deep_nested_infer_body()
    assert 200_000 <= len(body) < 201_000
    for headers in (None, http_headers(WRONG_KEY)):
        status, text = http(server.http_url, "POST", INFER_PATH, body, headers)
        assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL})
    assert server.process.poll() is None and server.is_ready()
    status, text = http(
        server.http_url,
        "POST",
        INFER_PATH,
        json.dumps(ONE_TEXT).encode(),
        server.admin_http_headers,
    )
    assert status == 200 and '"NUM_TOKENS"' in text
    vectors, _ = infer_embed(grpc_client, ["still serving after the deep body"])
    assert len(vectors) == 1


def test_keyless_malformed_json_gets_the_refusal_and_the_key_holder_gets_tritons_answer(server):
    # Issue 20, item 14: Triton answers malformed JSON with its own status (500 in 2.51, not a
    # 400). Only the gateway is the HTTP API; a keyless caller now never reaches the parser.
    for body in (b'{"inputs": [', b"not json", b""):
        status, text = http(server.http_url, "POST", INFER_PATH, body)
        assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL}), body
    status, text = http(
        server.http_url, "POST", INFER_PATH, b'{"inputs": [', server.admin_http_headers
    )
    # Triton's own answer (the key holder reaches its parser): 500, documented in
    # docs/operations.md "Ports"; the gateway answers such bodies with a 4xx
    assert status == 500, text
    assert json.loads(text)["error"].startswith("failed to parse the request JSON buffer")
    assert server.is_ready()


def test_the_grpc_health_check_that_the_chart_probes_answers_serving_without_the_key(server):
    assert grpc_health_check(server.grpc_url) == b"\x08\x01"  # SERVING: the server is ready


def test_the_client_sends_the_key_to_read_max_batch_size(server, monkeypatch, tmp_path):
    for name, value in env_without_key(tmp_path).items():
        monkeypatch.setenv(name, value)
    for name in (ADMIN_KEY_ENV, ADMIN_KEY_FILE_ENV):
        monkeypatch.delenv(name, raising=False)
    with EmbeddingClient(server.grpc_url, admin_key=server.admin_key) as client:
        assert client.max_batch_size == 64
    monkeypatch.setenv(ADMIN_KEY_ENV, server.admin_key)
    with EmbeddingClient(server.grpc_url) as client:
        assert client.max_batch_size == 64
    monkeypatch.delenv(ADMIN_KEY_ENV)
    key_file = tmp_path / "key"
    key_file.write_text(server.admin_key + "\n")
    monkeypatch.setenv(ADMIN_KEY_FILE_ENV, str(key_file))
    with EmbeddingClient(server.grpc_url) as client:
        assert client.max_batch_size == 64
    monkeypatch.delenv(ADMIN_KEY_FILE_ENV)
    with pytest.raises(AccessDeniedError, match="TRITON_EMBED_ADMIN_KEY.*batch_size="):
        EmbeddingClient(server.grpc_url)
    with pytest.raises(AccessDeniedError, match="expecting header"):
        EmbeddingClient(server.grpc_url, admin_key=WRONG_KEY)
    # inference needs no key: with a batch size given, no key or a wrong one (a stale key
    # file) still embeds
    for key in (None, WRONG_KEY):
        with EmbeddingClient(server.grpc_url, batch_size=8, admin_key=key) as client:
            assert (client.batch_size, client.max_batch_size) == (8, 8)
            assert client.embed(["no key needed"]).shape == (1, DIM)


def test_the_cli_without_the_key_is_refused(server, tmp_path, grpc_client):
    proc = cli(
        "repository", "unload", "embed", "--url", server.grpc_url, env=env_without_key(tmp_path)
    )
    assert proc.returncode == 1, proc.stderr
    assert "refused" in proc.stderr and GRPC_REFUSAL in proc.stderr
    assert "Traceback" not in proc.stderr
    assert grpc_client.is_model_ready("embed")


def test_the_key_is_in_no_log_of_the_shared_server(server):
    log = server.log_path.read_text(errors="replace")
    # the log holds tritonserver's options table and the supervisor's messages
    assert "| server_version" in log and "[supervisor]" in log
    assert server.admin_key not in log


# ---- a private server started by scripts/serve.sh ---------------------------------------------


SERVED_ADDRESS = "127.0.0.2"  # BIND_ADDRESS of the serve.sh server (Linux routes 127/8 to lo)


@dataclass
class Served:
    process: subprocess.Popen
    http_url: str
    grpc_url: str
    key_file: Path
    log_path: Path
    env: dict[str, str]

    @property
    def key(self) -> str:
        return read_key_file(self.key_file)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stubs(self, model: str) -> list[psutil.Process]:
        out = []
        for p in psutil.Process(self.process.pid).children(recursive=True):
            try:
                cmd = p.cmdline()
                if cmd and "triton_python_backend_stub" in cmd[0] and f"/{model}/1/" in cmd[1]:
                    out.append(p)
            except (psutil.Error, IndexError):
                pass
        return out


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``scripts/serve.sh`` on a copy of the repository (one embedder instance), no key given."""
    tmp = tmp_path_factory.mktemp("served")
    repo = copy_repository(tmp / "model_repository")
    edit_config(repo / "embedder" / "config.pbtxt", count=1)
    http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = env_without_key(
        tmp,
        MODEL_REPOSITORY=str(repo),
        XDG_STATE_HOME=str(tmp / "state"),
        # another loopback address: gRPC and metrics follow it, HTTP must stay on 127.0.0.1
        BIND_ADDRESS=SERVED_ADDRESS,
    )
    log_path = tmp / "serve.log"
    proc = start_serve_sh((http_port, grpc_port, metrics_port), env, log_path)
    srv = Served(
        proc,
        f"http://127.0.0.1:{http_port}",
        f"{SERVED_ADDRESS}:{grpc_port}",
        default_key_file(env),
        log_path,
        env,
    )
    try:
        deadline = time.monotonic() + float(os.environ.get("TRITON_READY_TIMEOUT_S", "400"))
        while not _ready(srv):
            if proc.poll() is not None:
                pytest.fail(f"serve.sh exited with {proc.returncode}:\n{srv.log()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"serve.sh not ready:\n{srv.log()[-3000:]}")
            time.sleep(1)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        try:  # the server's stubs share serve.sh's process group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _ready(srv: Served) -> bool:
    try:
        return http(srv.http_url, "GET", "/v2/health/ready")[0] == 200
    except OSError:  # not listening yet
        return False


def test_serve_sh_generates_an_owner_only_key_and_restricts_the_apis(served):
    assert stat.S_IMODE(served.key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(served.key_file.parent.stat().st_mode) == 0o700
    assert f"restricted APIs need the key from {served.key_file} (generated" in served.log()
    assert http(served.http_url, "GET", "/v2/models/embed/config")[0] == 403
    status, text = http(
        served.http_url, "GET", "/v2/models/embed/config", headers=http_headers(served.key)
    )
    assert status == 200 and json.loads(text)["name"] == "embed"


def test_serve_sh_keeps_the_http_port_on_loopback_whatever_bind_address_says(served):
    port = int(served.http_url.rsplit(":", 1)[1])
    grpc_port = int(served.grpc_url.rsplit(":", 1)[1])
    listening = {
        (c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)  # gRPC: an IPv4-mapped socket
        for p in [
            psutil.Process(served.process.pid),
            *psutil.Process(served.process.pid).children(True),
        ]
        for c in p.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert ("127.0.0.1", port) in listening and (SERVED_ADDRESS, port) not in listening
    assert (SERVED_ADDRESS, grpc_port) in listening
    with pytest.raises(OSError):  # nothing on BIND_ADDRESS's HTTP port
        http(f"http://{SERVED_ADDRESS}:{port}", "GET", "/v2/health/ready")
    assert http(served.http_url, "GET", "/v2/health/ready")[0] == 200
    status, text = http(served.http_url, "POST", INFER_PATH, deep_nested_infer_body())
    assert (status, json.loads(text)) == (403, {"error": HTTP_REFUSAL})
    assert grpc_health_check(served.grpc_url) == b"\x08\x01"
    with EmbeddingClient(served.grpc_url, batch_size=4) as client:  # gRPC inference: no key
        assert client.embed(["served over gRPC"]).shape == (1, DIM)


def test_with_the_key_embed_unloads_and_loads_again(served):
    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        client.unload_model("embed", headers=grpc_headers(served.key))
        assert not client.is_model_ready("embed")
        with pytest.raises(InferenceServerException):
            infer_embed(client, ["unloaded"])
        env = {**served.env, ADMIN_KEY_FILE_ENV: str(served.key_file)}
        proc = cli("repository", "load", "embed", "--url", served.grpc_url, env=env)
        assert proc.returncode == 0, proc.stderr
        assert f"loaded 'embed' at {served.grpc_url}" in proc.stdout
        assert client.is_model_ready("embed")
        assert len(infer_embed(client, ["loaded again"])[0]) == 1
        # the HTTP load with the key: the intruder test below
    finally:
        client.close()


def test_with_the_key_the_refused_load_would_have_run_its_code(served, tmp_path):
    """The control: the request refused without the key is a working code injection."""
    marker = tmp_path / "marker"
    body = code_carrying_load("intruder", marker)
    path = "/v2/repository/models/intruder/load"
    assert http(served.http_url, "POST", path, body)[0] == 403
    time.sleep(1)
    assert not marker.exists()
    assert http(served.http_url, "POST", path, body, http_headers(served.key))[0] == 200
    assert marker.read_text() == "model code ran inside the server"


def test_the_supervisor_reloads_a_killed_stub_with_the_key(served):
    (victim,) = served.stubs("tokenizer")
    victim.kill()
    deadline = time.monotonic() + 180
    while "reloaded 'tokenizer'" not in served.log() and time.monotonic() < deadline:
        time.sleep(1)
    log = served.log()
    assert "reloaded 'tokenizer'" in log, log[-3000:]
    assert "cannot read the config" not in log and "HTTP Error 403" not in log
    client = grpcclient.InferenceServerClient(served.grpc_url)
    try:
        assert len(infer_embed(client, ["after the reload"])[0]) == 1
    finally:
        client.close()


def test_the_key_is_in_no_log_of_serve_sh(served):
    log = served.log()
    # tritonserver's options table, the supervisor's messages and serve.sh's own lines
    assert "| server_version" in log and "[supervisor]" in log and "admin_key:" in log
    assert served.key not in log
