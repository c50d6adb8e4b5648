"""The admin key: where it comes from, its file, the tritonserver flags, who sends it."""

from __future__ import annotations

import io
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from triton_embed import AccessDeniedError, ServerUnavailableError
from triton_embed.admin import (
    ADMIN_HEADER,
    ADMIN_KEY_ENV,
    ADMIN_KEY_FILE_ENV,
    GRPC_ADMIN_HEADER,
    KEY_PATTERN,
    default_key_file,
    grpc_headers,
    http_headers,
    read_admin_key,
)
from triton_embed.errors import map_error
from triton_embed_server.host import admin_key
from triton_embed_server.host.admin_key import (
    HTTP_OPEN_APIS,
    HTTP_RESTRICTED_APIS,
    OPEN_APIS,
    RESTRICTED_APIS,
    ensure_admin_key,
    redact,
    restricted_http_headers,
    tritonserver_args,
    write_key_file,
)

KEY = "k" * 20 + "-_.~" + "0123456789"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_generated_key_file_is_owner_only_even_with_an_open_umask(tmp_path):
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    old = os.umask(0)  # the most permissive umask: the file must still be 0600
    try:
        key, source = ensure_admin_key(env)
    finally:
        os.umask(old)
    path = tmp_path / "state" / "triton-embed" / "admin_key"
    assert default_key_file(env) == path
    assert source == f"{path} (generated, mode 0600)"
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert KEY_PATTERN.fullmatch(key) and len(key) == 43  # token_urlsafe(32)
    assert path.read_text() == key + "\n"
    assert ensure_admin_key(env) == (key, str(path))  # read back, not regenerated
    assert read_admin_key(env) == key  # the client finds the same key
    assert [p.name for p in path.parent.iterdir()] == ["admin_key"]  # no temporary file left


def test_two_writers_end_up_with_the_first_key(tmp_path):
    path = tmp_path / "admin_key"
    first, second = "a" * 43, "b" * 43
    assert write_key_file(path, first) == first
    assert write_key_file(path, second) == first
    assert path.read_text().strip() == first
    assert [p.name for p in tmp_path.iterdir()] == ["admin_key"]


def test_the_environment_variable_wins_then_the_named_file_then_the_default(tmp_path):
    named = tmp_path / "named_key"
    named.write_text("n" * 30 + "\n")
    default = {"XDG_STATE_HOME": str(tmp_path)}
    write_key_file(default_key_file(default), "d" * 30)
    both = {**default, ADMIN_KEY_ENV: KEY, ADMIN_KEY_FILE_ENV: str(named)}
    assert ensure_admin_key(both) == (KEY, ADMIN_KEY_ENV)
    assert read_admin_key(both) == KEY
    file_only = {**default, ADMIN_KEY_FILE_ENV: str(named)}
    assert ensure_admin_key(file_only) == ("n" * 30, f"{ADMIN_KEY_FILE_ENV}={named}")
    assert read_admin_key(file_only) == "n" * 30
    assert ensure_admin_key(default)[0] == "d" * 30
    assert read_admin_key({"XDG_STATE_HOME": str(tmp_path / "nothing")}) is None


def test_a_named_key_file_must_exist(tmp_path):
    env = {ADMIN_KEY_FILE_ENV: str(tmp_path / "missing"), "XDG_STATE_HOME": str(tmp_path)}
    with pytest.raises(FileNotFoundError, match="missing"):
        ensure_admin_key(env)
    with pytest.raises(FileNotFoundError):
        read_admin_key(env)
    assert not default_key_file(env).exists()  # no key generated behind the caller's back


@pytest.mark.parametrize("bad", ["short", "has:colon" * 3, "has=equals" * 3, "sp ace" * 5])
def test_an_unusable_key_is_refused_without_repeating_it(bad, tmp_path):
    with pytest.raises(ValueError) as info:
        ensure_admin_key({ADMIN_KEY_ENV: bad})
    assert bad not in str(info.value) and ADMIN_KEY_ENV in str(info.value)
    with pytest.raises(ValueError) as info:
        tritonserver_args(bad)
    assert bad not in str(info.value)


def test_a_key_file_others_can_read_gets_a_warning_without_the_key(tmp_path, capsys):
    path = tmp_path / "key"
    path.write_text(KEY)
    path.chmod(0o644)
    assert ensure_admin_key({ADMIN_KEY_FILE_ENV: str(path)})[0] == KEY
    err = capsys.readouterr().err
    assert "mode 0644" in err and KEY not in err


def test_the_flags_leave_health_and_metadata_open_and_inference_open_on_grpc_only():
    assert tritonserver_args(KEY) == [
        "--http-restricted-api=shared-memory,model-config,model-repository,statistics,trace,"
        f"logging,inference:triton-embed-admin-key={KEY}",
        "--grpc-restricted-protocol=shared-memory,model-config,model-repository,statistics,"
        f"trace,logging:triton-embed-admin-key={KEY}",
    ]
    assert set(OPEN_APIS) == {"inference", "health", "metadata"}
    assert set(HTTP_OPEN_APIS) == {"health", "metadata"}
    assert set(HTTP_RESTRICTED_APIS) == set(RESTRICTED_APIS) | {"inference"}
    # Triton reads a restricted protocol's gRPC header with this prefix (tritonserver --help).
    assert GRPC_ADMIN_HEADER == f"triton-grpc-protocol-{ADMIN_HEADER}"


def test_the_api_lists_match_the_real_tritonserver():
    binary = Path(sys.prefix) / "bin" / "tritonserver"
    if not binary.exists():
        pytest.skip("tritonserver not installed (scripts/setup.sh)")
    proc = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    help_text = proc.stdout + proc.stderr
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        section = help_text[help_text.index(flag) :]
        allowed = re.search(r"Allowed (?:APIs|protocols):(.*?)\n\s*\n", section, re.S).group(1)
        names = set(re.findall(r"[a-z][a-z-]*", allowed))
        assert names == set(RESTRICTED_APIS) | set(OPEN_APIS), flag


def test_the_supervisor_reads_the_header_from_the_server_flags():
    args = ["--http-port", "1", *tritonserver_args(KEY)]
    assert restricted_http_headers(args) == {ADMIN_HEADER: KEY}
    assert restricted_http_headers(args, "model-config") == {ADMIN_HEADER: KEY}
    assert restricted_http_headers(args, "inference") == {ADMIN_HEADER: KEY}
    assert restricted_http_headers(args, "health") == {}
    assert restricted_http_headers(["--http-restricted-api", f"model-repository:h={KEY}"]) == {
        "h": KEY
    }
    assert restricted_http_headers(["--http-port", "1"]) == {}


def test_redact_hides_the_key_in_both_flag_forms():
    args = ["x", *tritonserver_args(KEY), "--http-restricted-api", f"trace:h={KEY}", "--y"]
    shown = redact(args)
    assert KEY not in " ".join(shown)
    assert shown[1].startswith("--http-restricted-api=shared-memory,") and shown[1].endswith(
        ":triton-embed-admin-key=***"
    )
    assert shown[2].startswith("--grpc-restricted-protocol=")
    assert shown[3:] == ["--http-restricted-api", "trace:h=***", "--y"]
    assert args[1].endswith(KEY)  # the input is left alone


def test_the_command_line_tool_never_shows_the_key_to_a_person(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(ADMIN_KEY_ENV, KEY)
    assert admin_key.main([]) == 0
    out = capsys.readouterr()
    assert KEY not in out.out + out.err and ADMIN_KEY_ENV in out.out
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, as in serve.sh
    assert admin_key.main(["--tritonserver-args"]) == 0
    assert sys.stdout.getvalue().splitlines() == tritonserver_args(KEY)
    assert KEY not in capsys.readouterr().err


def test_headers_carry_the_key_only_when_there_is_one():
    assert http_headers(KEY) == {"triton-embed-admin-key": KEY}
    assert grpc_headers(KEY) == {"triton-grpc-protocol-triton-embed-admin-key": KEY}
    assert http_headers(None) == grpc_headers(None) == {}


def test_the_default_key_file_follows_xdg_state_home():
    assert default_key_file({"XDG_STATE_HOME": "/s"}) == Path("/s/triton-embed/admin_key")
    assert default_key_file({"HOME": "/h"}) == Path("/h/.local/state/triton-embed/admin_key")


class _Refused(Exception):
    def status(self):
        return "StatusCode.UNAVAILABLE"

    def message(self):
        return (
            "This protocol is restricted, expecting header "
            "'triton-grpc-protocol-triton-embed-admin-key'"
        )


def test_a_refused_call_is_access_denied_not_server_unavailable():
    error = map_error(_Refused(), "h:1")
    assert isinstance(error, AccessDeniedError) and not isinstance(error, ServerUnavailableError)
    assert "expecting header" in str(error)


def test_the_supervisor_sends_the_key_on_config_reads_and_reloads(monkeypatch):
    from triton_embed_server.run import supervisor
    from triton_embed_server.run.supervisor import server_api

    sent = []

    class Response(io.BytesIO):
        status = 200

    def fake_urlopen(req, timeout=None):
        sent.append(req)
        return Response(json.dumps({"name": "embed"}).encode())

    monkeypatch.setattr(server_api.urllib.request, "urlopen", fake_urlopen)
    sup = supervisor.Supervisor(["tritonserver", "--http-port", "1", *tritonserver_args(KEY)])
    assert sup._load("embed")
    assert [(r.get_method(), r.full_url) for r in sent] == [
        ("GET", "http://127.0.0.1:1/v2/models/embed/config"),
        ("POST", "http://127.0.0.1:1/v2/repository/models/embed/load"),
    ]
    assert all(r.get_header(ADMIN_HEADER.capitalize()) == KEY for r in sent)
    # without restriction flags nothing extra is sent
    sent.clear()
    assert supervisor.Supervisor(["tritonserver", "--http-port", "1"])._load("embed")
    assert all(r.get_header(ADMIN_HEADER.capitalize()) is None for r in sent)
