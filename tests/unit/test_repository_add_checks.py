"""``repository add``: hostile ``--served-model-name`` values, and the engines' memory warning.

A served model name with a carriage return, a line feed, a NUL, a quote, a backslash or
thousands of characters used to be written into the ensemble's ``config.pbtxt`` where the
project's own reader (and Triton) could not read it back, and ``repository remove`` then
refused the model. Such names are refused before anything is written; good names round-trip
through add, list and remove.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from triton_embed_server.host import node_memory
from triton_embed_server.host.node_memory import NodeMemory
from triton_embed_server.models.instance_group import read_config_pbtxt

from tests.unit.test_cli_repository import add, run

ALLOWED = "use 1 to 200 characters from A-Z a-z 0-9 _ . : / @ + -, starting with a letter or digit"
GIB = 1 << 30


@pytest.mark.parametrize(
    "name",
    [
        "org/model\r",
        "org/model\rinjected",
        "org/model\n",
        'org/model\n  { key: "x", value: { string_value: "y" } }',
        "org/mo\x00del",
        'org/"model"',
        "org\\model",
        "org/model\t1",
        "org model",
        "-leading-dash",
        "caf\u00e9",
        "x" * 201,
    ],
)
def test_a_hostile_served_model_name_is_refused_and_nothing_is_written(capsys, tmp_path, name):
    repo = tmp_path / "repo"
    repo.mkdir()
    code, out, err = add(capsys, repo, f"--served-model-name={name}")
    assert code == 1
    assert f"--served-model-name {name[:40]!r}" in err
    assert "is not a served model name: " + ALLOWED in err
    assert out == ""
    assert list(repo.iterdir()) == [], "refused before the repository was touched"
    code, out, _ = run(capsys, "repository", "list", "--repository", str(repo))
    assert code == 0 and out.strip() == f"no embedding models or rerankers in {repo}"


def test_a_very_long_name_is_quoted_by_a_bounded_prefix(capsys, tmp_path):
    name = "a" * 100_000
    code, _, err = add(capsys, tmp_path / "repo", "--served-model-name", name)
    assert code == 1
    assert f"--served-model-name {'a' * 40!r} (... 100000 characters) is not" in err
    assert len(err) < 500


@pytest.mark.parametrize(
    "name",
    ["sentence-transformers/all-MiniLM-L6-v2", "org/model:v1.5", "team@org+exp_2", "x" * 200],
)
def test_good_names_round_trip_through_add_list_and_remove(capsys, tmp_path, name):
    repo = tmp_path / "repo"
    code, _, err = add(capsys, repo, "--served-model-name", name)
    assert code == 0, err
    params = read_config_pbtxt(repo / "embed" / "config.pbtxt")["parameters"]
    assert params["served_model_name"] == {"string_value": name}
    code, out, _ = run(capsys, "repository", "list", "--repository", str(repo), "--json")
    assert code == 0 and [m["name"] for m in json.loads(out)] == ["embed"]
    code, out, err = run(
        capsys, "repository", "remove", "--repository", str(repo), "--name", "embed"
    )
    assert code == 0, err
    assert sorted(p.name for p in repo.iterdir()) == []


def test_add_warns_when_the_engines_no_longer_fit_their_node(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(
        node_memory, "read_node_memory", lambda node: NodeMemory(node, 16 * GIB, GIB // 2)
    )
    repo = tmp_path / "repo"
    code, out, err = add(capsys, repo)
    assert code == 0, err
    assert out.startswith("added 'embed'")
    (line,) = err.splitlines()
    # 2 instances of all-MiniLM-L6-v2: no KV cache (BERT), 87 MiB of weights, 640 MiB each
    assert line.startswith("warning: the CPU engines placed on ")
    assert "need 1.42 GiB" in line
    assert (
        "it has 0.50 GiB available of 16.00 GiB: embedder 2 x 0.71 GiB (KV cache 0.00 GiB" in line
    )
    assert (repo / "embedder" / "config.pbtxt").is_file(), "the model is written all the same"


def test_add_is_quiet_when_they_fit(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(
        node_memory, "read_node_memory", lambda node: NodeMemory(node, 16 * GIB, 12 * GIB)
    )
    code, _, err = add(capsys, tmp_path / "repo")
    assert code == 0 and err == ""


def test_add_writes_the_kv_cache_budget_of_a_decoder(capsys, tmp_path, monkeypatch):
    from tests.model_factory import make_decoder_embedder

    monkeypatch.setattr(
        node_memory, "read_node_memory", lambda node: NodeMemory(node, 16 * GIB, 12 * GIB)
    )
    folder = make_decoder_embedder(tmp_path / "qwen", arch="qwen3")
    repo = tmp_path / "repo"
    code, _, err = add(capsys, repo, name="qwen", model=str(folder))
    assert code == 0, err

    def kv(path: Path) -> str:
        return read_config_pbtxt(path)["parameters"]["kv_cache_bytes"]["string_value"]

    # 2 layers x 1 KV head x 64 x 2 (K, V): CPU float32 4 bytes, 286 blocks (T 4,096, S 256);
    # GPU float16 2 bytes, 1,024 + floor((65,536 - 1,024) / 128) = 1,528 blocks
    assert kv(repo / "qwen_embedder" / "config.pbtxt") == str(286 * 128 * 2 * 64 * 2 * 4)
    assert kv(repo / "qwen_embedder" / "configs" / "gpu.pbtxt") == str(1528 * 128 * 2 * 64 * 2 * 2)
