"""instance_group: instance counts from model configs (JSON and config.pbtxt), read one way."""

from __future__ import annotations

import pytest
from triton_embed_server.models.instance_group import (
    InstanceCount,
    instance_count,
    read_config_pbtxt,
)
from triton_embed_server.steps.config import EmbedderConfig


@pytest.mark.parametrize(
    "groups, per_device, total",
    [
        (None, 1, 1),
        ([], 1, 1),
        ([{}], 1, 1),
        ([{"count": 0}], 1, 1),
        ([{"count": 3, "kind": "KIND_CPU"}], 3, 3),
        ([{"count": 4, "kind": "KIND_GPU", "gpus": [0, 1]}], 4, 8),
        ([{"count": 2, "gpus": [0, 1]}, {"count": 3, "kind": "KIND_CPU"}], 2, 7),
    ],
)
def test_instance_count(groups, per_device, total):
    assert instance_count({"instance_group": groups}) == InstanceCount(per_device, total)


@pytest.mark.parametrize(
    "groups, gpus, total",
    [
        ([{"count": 4, "kind": "KIND_GPU"}], 8, 32),  # count on each visible GPU
        ([{"count": 4, "kind": "KIND_GPU"}], 0, 4),  # at least one
        ([{"count": 4, "kind": "KIND_GPU", "gpus": [0, 1]}], 8, 8),  # the list wins
        ([{"count": 2, "kind": "KIND_CPU"}], 8, 2),
        ([{"count": 4, "kind": "KIND_GPU"}, {"count": 1, "kind": "KIND_CPU"}], 2, 9),
    ],
)
def test_instance_count_with_the_visible_gpus(groups, gpus, total):
    assert instance_count({"instance_group": groups}, gpus).total == total
    assert instance_count({"instance_group": groups}, gpus).per_device == groups[0]["count"]


def test_pbtxt_and_live_json_give_the_same_count(make_config):
    live = make_config(instance_group=[{"count": 4, "kind": "KIND_GPU", "gpus": [0]}])
    assert instance_count(live) == InstanceCount(4, 4)
    assert EmbedderConfig.from_model_config(live).instances_per_device == 4


def test_read_config_pbtxt_gives_the_json_triton_serves(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text(
        '# an embedder\nname: "embedder"\n'
        "instance_group [\n  { count: 3, kind: KIND_GPU, gpus: [ 0, 1 ] }  # two GPUs\n]\n"
        'parameters [ { key: "k", value: { string_value: "v" } } ]\n'
    )
    config = read_config_pbtxt(path)
    assert config["instance_group"] == [{"count": 3, "kind": "KIND_GPU", "gpus": [0, 1]}]
    assert config["parameters"] == {"k": {"string_value": "v"}}
    assert instance_count(config) == InstanceCount(3, 6)


def test_read_config_pbtxt_errors_name_the_file(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "embedder"\ninstance_group [ { count: two } ]\n')
    with pytest.raises(ValueError, match=rf"^{path}: not a Triton model config: 2:"):
        read_config_pbtxt(path)
    with pytest.raises(OSError):
        read_config_pbtxt(tmp_path / "absent.pbtxt")
