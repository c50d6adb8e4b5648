"""``triton-embed gateway`` and ``python -m triton_embed_server.gateway``: one set of flags."""

from __future__ import annotations

import argparse

import pytest
from triton_embed.cli import build_parser
from triton_embed_server.gateway import command
from triton_embed_server.gateway.command import add_gateway_args
from triton_embed_server.gateway.settings import NOT_FLAGS, GatewaySettings


def test_the_cli_subcommand_takes_the_gateway_flags():
    args = build_parser().parse_args(
        ["gateway", "--upstream", "10.0.0.1:8001,10.0.0.2:8001", "--upstream", "[::1]:9001",
         "--port", "9080", "--max-body-mb", "4", "--max-in-flight", "64", "--workers", "2",
         "--merge-in-flight", "0"]
    )  # fmt: skip
    settings = GatewaySettings.from_args(args)
    assert settings.upstreams == ("10.0.0.1:8001,10.0.0.2:8001", "[::1]:9001")
    assert [str(t) for t in settings.targets] == ["10.0.0.1:8001", "10.0.0.2:8001", "[::1]:9001"]
    assert (settings.host, settings.port) == ("127.0.0.1", 9080)
    assert settings.max_body_bytes == 4 * 2**20
    assert (settings.max_in_flight, settings.workers, settings.merge_in_flight) == (64, 2, 0)
    assert (settings.default_model, settings.timeout_s) == ("embed", 60.0)
    assert GatewaySettings.from_json(settings.to_json()) == settings


def test_merging_is_off_by_default_and_a_negative_merge_in_flight_is_refused(capsys):
    args = build_parser().parse_args(["gateway", "--upstream", "127.0.0.1:8001"])
    assert GatewaySettings.from_args(args).merge_in_flight == 0
    assert GatewaySettings(upstreams=("127.0.0.1:8001",)).merge_in_flight == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gateway", "--upstream", "h:1", "--merge-in-flight", "-1"])
    assert "--merge-in-flight" in capsys.readouterr().err
    with pytest.raises(ValueError, match="merge_in_flight must be >= 0"):
        GatewaySettings(upstreams=("127.0.0.1:8001",), merge_in_flight=-1)


def test_every_flag_reaches_the_settings_and_the_flag_defaults_are_the_settings_defaults():
    parser = argparse.ArgumentParser()
    add_gateway_args(parser)
    args = parser.parse_args(["--upstream", "127.0.0.1:8001"])
    assert GatewaySettings.from_args(args) == GatewaySettings(upstreams=("127.0.0.1:8001",))
    # Every flag has its field (``--upstream`` fills ``upstreams``): none is parsed and dropped.
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    fields = set(GatewaySettings.__dataclass_fields__) - NOT_FLAGS
    assert {"upstreams" if d == "upstream" else d for d in dests} == fields


def test_upstream_is_required_and_checked(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["gateway"])
    assert "--upstream" in capsys.readouterr().err
    assert command.main(["--upstream", "host"]) == 1
    assert "upstream 'host' is not HOST:PORT" in capsys.readouterr().err


def test_an_unreadable_key_file_stops_the_gateway_before_it_listens(tmp_path, capsys):
    missing = tmp_path / "missing"
    assert command.main(["--upstream", "127.0.0.1:1", "--api-key-file", str(missing)]) == 1
    assert str(missing) in capsys.readouterr().err


def test_the_limit_flags_reach_the_settings_and_their_defaults_are_the_stated_ones():
    from triton_embed_server.gateway.settings import (
        DEFAULT_MAX_BODY_BYTES,
        DEFAULT_MAX_REQUEST_TOKENS,
    )

    defaults = GatewaySettings.from_args(
        build_parser().parse_args(["gateway", "--upstream", "127.0.0.1:8001"])
    )
    assert defaults.max_body_bytes == DEFAULT_MAX_BODY_BYTES == 33_632_256
    assert defaults.max_request_tokens == DEFAULT_MAX_REQUEST_TOKENS == 131_072
    assert (defaults.header_timeout_s, defaults.body_timeout_s) == (20.0, 20.0)
    args = build_parser().parse_args(
        ["gateway", "--upstream", "127.0.0.1:8001", "--max-request-tokens", "1000",
         "--header-timeout-s", "2.5", "--body-timeout-s", "3"]
    )  # fmt: skip
    settings = GatewaySettings.from_args(args)
    assert (settings.max_request_tokens, settings.header_timeout_s) == (1000, 2.5)
    assert settings.body_timeout_s == 3.0
    assert GatewaySettings.from_json(settings.to_json()) == settings
    with pytest.raises(ValueError, match=r"header_timeout_s=0: each must be > 0"):
        GatewaySettings(upstreams=("127.0.0.1:8001",), header_timeout_s=0)


def test_a_worker_process_builds_its_app_from_the_settings_in_the_environment(monkeypatch):
    import logging

    from triton_embed_server.gateway import routes as app

    settings = GatewaySettings(upstreams=("127.0.0.1:8001",), log_level="warning")
    monkeypatch.setenv(app.SETTINGS_ENV, settings.to_json())
    monkeypatch.setattr(logging.root, "handlers", [])  # basicConfig configures afresh
    built = app.create_app_from_env()
    paths = {route.path for route in built.routes}
    assert {"/v1/embeddings", "/embed"} <= paths
    assert logging.root.level == logging.WARNING
