"""The client library's and the CLI's priority, and ``triton-embed usage`` (no server)."""

from __future__ import annotations

import io
import json
import urllib.error

import pytest
from triton_embed import InvalidInputError, cli_usage
from triton_embed.bulk import pool_embedder
from triton_embed.cli import build_parser, main
from triton_embed.client import EmbeddingClient
from triton_embed.options import RequestOptions
from triton_embed.priority import Priority, wire
from triton_embed.transport.priorities import REQUEST_PRIORITY

from tests import fake_triton as fake_server
from tests.unit.test_cli import StandInPool


@pytest.fixture
def fake_triton(monkeypatch):
    return fake_server.install(monkeypatch)


@pytest.mark.parametrize(
    ("priority", "sent"), [(None, 0), ("interactive", 1), ("batch", 2), ("BATCH", 2)]
)
def test_the_client_sends_its_priority_level_with_every_request(fake_triton, priority, sent):
    with EmbeddingClient("127.0.0.1:1", batch_size=2, priority=priority) as client:
        client.embed(["a", "b", "c"])
    assert fake_triton.priorities == [sent] * 2  # two requests of at most 2 texts
    # the class goes with the level, as a parameter the engine steps read (none by default)
    classes = [(p or {}).get("priority_class") for p in fake_triton.parameters]
    assert classes == [{0: None, 1: "interactive", 2: "batch"}[sent]] * 2


def test_wire_adds_the_class_to_a_copy_of_the_parameters():
    params = {"truncation": "END"}
    assert wire(2, params) == {
        "priority": 2, "parameters": {"truncation": "END", "priority_class": "batch"}
    }  # fmt: skip
    assert params == {"truncation": "END"}
    assert wire(1, None) == {"priority": 1, "parameters": {"priority_class": "interactive"}}
    assert wire(0, None) == {"parameters": None}
    assert wire(0, params) == {"parameters": params}


def test_the_steps_options_ignore_the_class_parameter():
    assert RequestOptions.from_parameters({"priority_class": "batch"}) == RequestOptions()


def test_an_unknown_priority_is_refused(fake_triton):
    with pytest.raises(InvalidInputError, match="priority must be one of interactive, batch"):
        EmbeddingClient("127.0.0.1:1", priority="urgent")


def test_the_cli_priority_defaults_embed_to_batch_and_query_to_interactive(tmp_path):
    parser = build_parser()
    embed = parser.parse_args(["embed", "c.txt", "-o", "out"])
    query = parser.parse_args(["query", "q", "--embeddings", "e.npy", "--corpus", "c.txt"])
    assert (embed.priority, query.priority) == ("batch", "interactive")
    assert parser.parse_args(["embed", "c", "-o", "o", "--priority", "interactive"]).priority == (
        "interactive"
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["embed", "c", "-o", "o", "--priority", "urgent"])


class LevelPool(StandInPool):
    levels: list[int] = []

    async def infer(self, model, inputs, outputs, parameters=None):
        LevelPool.levels.append(REQUEST_PRIORITY.get())
        return await super().infer(model, inputs, outputs, parameters)


@pytest.mark.parametrize(("flags", "level"), [([], 2), (["--priority", "interactive"], 1)])
def test_the_bulk_job_sends_batch_unless_told(monkeypatch, tmp_path, flags, level):
    StandInPool.sent, LevelPool.levels = [], []
    monkeypatch.setattr(pool_embedder, "UpstreamPool", LevelPool)
    corpus = tmp_path / "c.txt"
    corpus.write_text("one\ntwo\nthree\n")
    argv = ["embed", str(corpus), "-o", str(tmp_path / "out"), "--no-progress",
            "--url", "127.0.0.1:1", *flags]  # fmt: skip
    assert main(argv) == 0
    assert LevelPool.levels == [level]


class Answer(io.BytesIO):
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_usage_calls_the_gateway_with_the_admin_key(monkeypatch, tmp_path, capsys):
    key_file = tmp_path / "admin_key"
    key_file.write_text("admin-key-0123456789abcdef\n")
    seen = {}

    def urlopen(request, timeout):
        seen["url"], seen["headers"] = request.full_url, dict(request.header_items())
        return Answer(b"tenant,hour,requests,texts,tokens,cost_usd\n")

    monkeypatch.setattr(cli_usage.urllib.request, "urlopen", urlopen)
    argv = ["usage", "--gateway", "http://gw:8080/", "--format", "csv", "--tenant", "search",
            "--admin-key-file", str(key_file)]  # fmt: skip
    assert main(argv) == 0
    assert seen["url"] == "http://gw:8080/admin/usage?format=csv&tenant=search"
    assert seen["headers"] == {"Triton-embed-admin-key": "admin-key-0123456789abcdef"}
    assert capsys.readouterr().out == "tenant,hour,requests,texts,tokens,cost_usd\n"


def test_usage_reports_the_gateways_refusal(monkeypatch, tmp_path, capsys):
    key_file = tmp_path / "admin_key"
    key_file.write_text("admin-key-0123456789abcdef\n")
    body = json.dumps({"error": {"message": "invalid admin key"}}).encode()

    def urlopen(request, timeout):
        raise urllib.error.HTTPError(request.full_url, 401, "Unauthorized", {}, io.BytesIO(body))

    monkeypatch.setattr(cli_usage.urllib.request, "urlopen", urlopen)
    assert main(["usage", "--admin-key-file", str(key_file)]) == 1
    assert capsys.readouterr().err == (
        "triton-embed usage: error: http://127.0.0.1:8080 answered 401: invalid admin key\n"
    )


def test_a_long_class_is_quoted_cut():
    """A 20,000-character value must not make the gRPC error exceed the metadata limit."""
    with pytest.raises(ValueError) as err:
        Priority.parse("b" * 20000, "priority_class")
    assert len(str(err.value)) < 200
    assert "(20000 characters)" in str(err.value)
