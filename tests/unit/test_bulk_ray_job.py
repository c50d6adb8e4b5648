"""The command line of ``python -m triton_embed.bulk.ray_job``, without Ray (issue 21).

Its ``--url``, ``--model`` and request options' flags are ``triton-embed embed``'s (defaults,
bounds, choices), and what they say reaches the actors' constructor arguments: ``main`` runs
against a stand-in ``ray`` module and a stand-in ``embed_dataset`` that records its arguments.
"""

from __future__ import annotations

import json
import os
import sys
import types

import pytest
from triton_embed.bulk import ray_data, ray_job
from triton_embed.cli import build_parser as cli_parser
from triton_embed.client import DEFAULT_MODEL, DEFAULT_URL
from triton_embed.options import RequestOptions

DRIVER_KEY = "the-drivers-admin-key-0123"


class StandInDataset:
    """``ray.data.Dataset`` of 3 rows: records what is read and written."""

    def __init__(self, log: list, path: str, **kwargs):
        log.append(("read", path, kwargs))
        self.log = log

    def write_parquet(self, path: str) -> None:
        self.log.append(("write", path))

    def count(self) -> int:
        return 3


def run_job(monkeypatch, argv: list[str]) -> tuple[dict, list]:
    """``ray_job.main(argv)`` over stand-ins; returns embed_dataset's arguments and Ray's log."""
    log: list = []
    made: dict = {}
    ray = types.ModuleType("ray")
    ray.init = lambda **kwargs: log.append(("init", kwargs))
    ray.data = types.SimpleNamespace(read_parquet=lambda p, **kw: StandInDataset(log, p, **kw))
    monkeypatch.setitem(sys.modules, "ray", ray)

    def embed_dataset(ds, urls, **kwargs):
        made.update(urls=urls, **kwargs)
        return ds

    monkeypatch.setattr(ray_data, "embed_dataset", embed_dataset)
    monkeypatch.setenv("TRITON_EMBED_ADMIN_KEY", DRIVER_KEY)
    assert ray_job.main(argv) == 0
    return made, log


def test_defaults_are_the_clis_and_a_corpus_is_documents(monkeypatch, tmp_path, capsys):
    made, log = run_job(monkeypatch, [str(tmp_path / "in"), "s3://bucket/out"])
    assert made == {
        "urls": DEFAULT_URL,
        "model": DEFAULT_MODEL,
        "concurrency": 2,
        "batch_size": 256,
        "text_column": "text",
        "id_column": "id",
        "include_text": False,
        "node_local_port": None,
        "output_kind": None,  # a hybrid model: its dense vectors
        "admin_key": DRIVER_KEY,  # the driver's key travels to the actors
        "input_type": "document",
    }
    assert log == [
        ("init", {"address": None, "log_to_driver": False}),
        ("read", str(tmp_path / "in"), {"override_num_blocks": 8}),
        ("write", "s3://bucket/out"),
        ("read", "s3://bucket/out", {}),
    ]
    assert json.loads(capsys.readouterr().out)["rows"] == 3


def test_every_flag_reaches_the_actors(monkeypatch, tmp_path):
    option_flags = ["--truncation", "chunk", "--allow-empty", "--input-type", "query",
                    "--dimensions", "64", "--embedding-type", "float16",
                    "--normalize", "false"]  # fmt: skip
    argv = ["in", "out", "--url", "a:1,b:2", "--model", "m", "--concurrency", "3",
            "--batch-size", "64", "--blocks", "5", "--text-field", "body", "--id-field", "key",
            "--include-text", "--node-local-port", "8001", *option_flags,
            "--address", "head:6379"]  # fmt: skip
    monkeypatch.chdir(tmp_path)
    made, log = run_job(monkeypatch, argv)
    assert made == {
        "urls": "a:1,b:2",
        "model": "m",
        "concurrency": 3,
        "batch_size": 64,
        "text_column": "body",
        "id_column": "key",
        "include_text": True,
        "node_local_port": 8001,
        "output_kind": None,
        "admin_key": DRIVER_KEY,
        "truncation": "CHUNK",
        "allow_empty": True,
        "input_type": "query",
        "dimensions": 64,
        "embedding_type": "float16",
        "normalize": False,
    }
    assert log[0] == ("init", {"address": "head:6379", "log_to_driver": False})
    assert log[1] == ("read", os.path.join(tmp_path, "in"), {"override_num_blocks": 5})
    # The actors' options are those the CLI's flags make.
    options = {k: made[k] for k in RequestOptions.__dataclass_fields__ if k in made}
    cli_args = cli_parser().parse_args(["embed", "c.txt", "-o", "d", *option_flags])
    assert RequestOptions(**options) == RequestOptions.from_args(cli_args, "document")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dimensions", "0"], "argument --dimensions: must be >= 1, got 0"),
        (["--dimensions", "x"], "argument --dimensions: 'x' is not a whole number"),
        (["--embedding-type", "int8"], "argument --embedding-type: invalid choice: 'int8'"),
        (["--truncation", "middle"], "argument --truncation: invalid choice: 'MIDDLE'"),
        (["--normalize", "maybe"], "argument --normalize: value='maybe' must be true or false"),
        (["--input-type", " "], "input_type=' ' must be a prompt name such as query or document"),
    ],
)
def test_option_flags_out_of_bounds_are_usage_errors(monkeypatch, capsys, flags, message):
    monkeypatch.setitem(sys.modules, "ray", None)  # refused before Ray is imported
    with pytest.raises(SystemExit) as info:
        ray_job.main(["in", "out", *flags])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_the_shared_flags_have_the_clis_defaults_and_choices():
    job = {a.dest: a for a in ray_job.build_parser()._actions}
    embed = cli_parser()._subparsers._group_actions[0].choices["embed"]
    cli = {a.dest: a for a in embed._actions}
    for dest in ("url", "model", "truncation", "allow_empty", "dimensions", "embedding_type",
                 "normalize"):  # fmt: skip
        same = ("option_strings", "default", "choices", "type")
        assert [getattr(job[dest], k) for k in same] == [getattr(cli[dest], k) for k in same]
