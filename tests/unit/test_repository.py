"""The model-repository helper: copies, and config.pbtxt edits checked by protobuf's parser."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from triton_embed.priority import Priority
from triton_embed_server.models.repository.copies import (
    MODEL_REPOSITORY,
    copy_repository,
    edit_config,
    set_instance_group,
    set_max_queue_delay,
    set_parameter,
    set_queue_policy,
)
from triton_embed_server.run.launcher import REPO_ROOT
from tritonclient.grpc import model_config_pb2


def parse(text: str) -> model_config_pb2.ModelConfig:
    """The config as Triton reads it (ModelConfig in protobuf text format)."""
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.fixture
def repo(tmp_path):
    return copy_repository(tmp_path / "model_repository")


def test_copy_repository_copies_the_shipped_repository_file_for_file(tmp_path):
    repo = copy_repository(tmp_path / "repo")

    def files(root):
        return {
            p.relative_to(root): p.read_bytes()
            for p in root.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }

    assert files(repo) == files(MODEL_REPOSITORY)
    assert sorted(p.name for p in repo.iterdir()) == ["embed", "embedder", "tokenizer"]


def test_copy_repository_leaves_stale_pycache_behind_and_precompiles(tmp_path):
    import importlib.util
    import sys

    source = tmp_path / "source"
    (source / "m" / "1" / "__pycache__").mkdir(parents=True)
    (source / "m" / "1" / "__pycache__" / "model.cpython-312.pyc").write_bytes(b"\0")
    (source / "m" / "1" / "model.py").write_text("x = 1\n")
    (source / "m" / "config.pbtxt").write_text('name: "m"\n')
    fresh = importlib.util.cache_from_source("model.py").split("/")[-1]
    for k, models in enumerate((None, ["m"])):
        repo = copy_repository(tmp_path / str(k), source, models=models)
        assert sorted(str(p.relative_to(repo)) for p in repo.rglob("*")) == [
            "m",
            "m/1",
            "m/1/__pycache__",
            f"m/1/__pycache__/{fresh}",
            "m/1/model.py",
            "m/config.pbtxt",
        ]
        # an import of the copy finds its bytecode up to date and writes nothing
        before = (repo / "m" / "1").stat().st_mtime_ns
        spec = importlib.util.spec_from_file_location(f"m{k}", repo / "m" / "1" / "model.py")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert (repo / "m" / "1").stat().st_mtime_ns == before
        assert sys.implementation.cache_tag in fresh


def test_copy_repository_of_chosen_models_and_its_errors(tmp_path):
    source = REPO_ROOT / "perf" / "ablations"
    repo = copy_repository(tmp_path / "a", source, models=["embed_text"])
    assert [p.name for p in repo.iterdir()] == ["embed_text"]  # not the README next to it
    assert parse((repo / "embed_text" / "config.pbtxt").read_text()).name == "embed_text"
    with pytest.raises(FileExistsError, match="exists"):
        copy_repository(repo)
    with pytest.raises(ValueError, match=r"no model folder .*\['README.md'\]"):
        copy_repository(tmp_path / "b", source, models=["README.md"])
    assert not (tmp_path / "b").exists()


def test_edit_config_changes_only_the_asked_fields(repo):
    config = repo / "embedder" / "config.pbtxt"
    before = parse(config.read_text())
    text = edit_config(
        config,
        count=1,
        max_queue_delay_us=0,
        parameters={"model_path": "/models/my model", "hourly_price_usd": "0.36"},
    )
    assert config.read_text() == text
    after = parse(text)
    assert [(g.count, g.kind) for g in after.instance_group] == [
        (1, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    assert after.dynamic_batching.max_queue_delay_microseconds == 0
    assert params(after) == {
        **params(before),
        "model_path": "/models/my model",
        "hourly_price_usd": "0.36",
    }
    # everything else, comments included, is as shipped
    after.ClearField("instance_group")
    after.ClearField("dynamic_batching")
    after.ClearField("parameters")
    for field in ("instance_group", "dynamic_batching", "parameters"):
        before.ClearField(field)
    assert after == before
    shipped = (MODEL_REPOSITORY / "embedder" / "config.pbtxt").read_text()
    assert [x for x in text.splitlines() if x.lstrip().startswith("#")] == [
        x for x in shipped.splitlines() if x.lstrip().startswith("#")
    ]
    assert len(text.splitlines()) == len(shipped.splitlines())


def test_gpu_variant_count_kind_and_tokenizer(repo):
    gpu = repo / "embedder" / "configs" / "gpu.pbtxt"
    text = edit_config(gpu, count=8, kind="KIND_CPU")
    assert [(g.count, g.kind) for g in parse(text).instance_group] == [
        (8, model_config_pb2.ModelInstanceGroup.KIND_CPU)
    ]
    tok = parse(edit_config(repo / "tokenizer" / "config.pbtxt", count=3))
    assert [g.count for g in tok.instance_group] == [3]
    assert tok.dynamic_batching.max_queue_delay_microseconds == 500  # untouched


@pytest.mark.parametrize(
    "config",
    ["tokenizer/config.pbtxt", "embedder/config.pbtxt", "embedder/configs/gpu.pbtxt"],
)
def test_every_step_ships_a_bounded_queue_that_rejects(config):
    policy = parse((MODEL_REPOSITORY / config).read_text()).dynamic_batching.default_queue_policy
    assert policy.max_queue_size > 0
    assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
    assert policy.default_timeout_microseconds > 0
    assert not policy.allow_timeout_override


def test_edit_config_sets_the_queue_policy_and_nothing_else(repo):
    config = repo / "embedder" / "config.pbtxt"
    before = parse(config.read_text())
    after = parse(edit_config(config, max_queue_size=4, queue_timeout_us=2_000_000))
    policy = after.dynamic_batching.default_queue_policy
    assert (policy.max_queue_size, policy.default_timeout_microseconds) == (4, 2_000_000)
    assert policy.timeout_action == before.dynamic_batching.default_queue_policy.timeout_action
    before.dynamic_batching.default_queue_policy.max_queue_size = 4
    before.dynamic_batching.default_queue_policy.default_timeout_microseconds = 2_000_000
    # the batch level: the same bound, BATCH_TIMEOUT_FACTOR (2) times the timeout
    batch = after.dynamic_batching.priority_queue_policy[Priority.BATCH.level]
    assert (batch.max_queue_size, batch.default_timeout_microseconds) == (4, 4_000_000)
    before.dynamic_batching.priority_queue_policy[Priority.BATCH.level].max_queue_size = 4
    before.dynamic_batching.priority_queue_policy[
        Priority.BATCH.level
    ].default_timeout_microseconds = 4_000_000
    assert after == before
    only_size = parse(edit_config(repo / "tokenizer" / "config.pbtxt", max_queue_size=0))
    assert only_size.dynamic_batching.default_queue_policy.max_queue_size == 0  # unbounded
    assert (
        only_size.dynamic_batching.priority_queue_policy[Priority.BATCH.level].max_queue_size == 0
    )
    assert only_size.dynamic_batching.default_queue_policy.default_timeout_microseconds > 0


def test_parameter_values_are_escaped_as_protobuf_strings():
    text = (MODEL_REPOSITORY / "tokenizer" / "config.pbtxt").read_text()
    odd = 'C:\\models\\"quoted"\nline'
    assert params(parse(set_parameter(text, "model_path", odd)))["model_path"] == odd


def test_the_one_step_ablation_model_output_format(tmp_path):
    repo = copy_repository(tmp_path / "r", REPO_ROOT / "perf" / "ablations", models=["embed_text"])
    cfg = parse(
        edit_config(
            repo / "embed_text" / "config.pbtxt", count=2, parameters={"output_format": "bytes"}
        )
    )
    assert params(cfg)["output_format"] == "bytes"
    assert [g.count for g in cfg.instance_group] == [2]


CONFIG = """
# instance_group [ { count: 9 } ] in a comment is not the field
name: "m"
instance_group [ { count: 2, kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
parameters [
  { key: "note", value: { string_value: "count: 5, key: \\"model_path\\"" } },
  { key: "model_path", value: { string_value: "a" } }
]
"""


def test_fields_in_comments_and_string_values_are_never_edited():
    text = set_instance_group(CONFIG, count=4)
    text = set_parameter(text, "model_path", "b")
    text = set_max_queue_delay(text, 7)
    cfg = parse(text)
    assert [g.count for g in cfg.instance_group] == [4]
    assert params(cfg) == {"note": 'count: 5, key: "model_path"', "model_path": "b"}
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 7
    assert "# instance_group [ { count: 9 } ] in a comment" in text


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: set_parameter(t, "no_such_key", "x"), 'key "no_such_key", found 0'),
        (lambda t: set_instance_group(t.replace("count: 2, ", ""), count=1), "count field"),
        (lambda t: set_instance_group(t, kind="KIND_TPU"), "kind must be one of"),
        (lambda t: set_instance_group(t, count=0), "integer >= 1"),
        (lambda t: set_instance_group(t.replace("instance_group", "x_group"), count=1), "found 0"),
        (
            lambda t: set_instance_group(t.replace("CPU }", "CPU }, { count: 1 }"), count=3),
            "found 2",
        ),
        (
            lambda t: set_instance_group(
                t + "instance_group [ { count: 1, kind: KIND_GPU } ]\n", count=3
            ),
            "expected one instance_group block, found 2",
        ),
        (
            lambda t: set_max_queue_delay(t.replace("max_queue_delay", "x_delay"), 1),
            "max_queue_delay_microseconds, found 0",
        ),
        (lambda t: set_max_queue_delay(t, -1), "integer >= 0"),
        (lambda t: set_queue_policy(t, max_queue_size=4), "default_queue_policy block, found 0"),
        (
            lambda t: set_queue_policy(
                t.replace("100 }", "100 default_queue_policy { max_queue_size: 1 } }"),
                timeout_us=5,
            ),
            "default_timeout_microseconds, found 0",
        ),
        (
            # a policy outside dynamic_batching is not the one edited
            lambda t: set_queue_policy(t + "default_queue_policy { max_queue_size: 1 }\n", 2),
            "default_queue_policy block, found 0",
        ),
        (lambda t: set_queue_policy(t, max_queue_size=-1), "max_queue_size must be an integer"),
        (lambda t: set_queue_policy(t, timeout_us=1.5), "default_timeout_microseconds must be"),
    ],
)
def test_a_missing_or_ambiguous_field_is_an_error(edit, message):
    with pytest.raises(ValueError, match=message):
        edit(CONFIG)


def test_edit_config_names_the_file_and_leaves_it_unchanged_on_error(repo):
    config = repo / "tokenizer" / "config.pbtxt"
    before = config.read_text()
    with pytest.raises(ValueError, match=r"tokenizer/config.pbtxt: .*no_such_key"):
        edit_config(config, count=2, parameters={"no_such_key": "x"})
    assert config.read_text() == before
    with pytest.raises(ValueError, match="dynamic_batching block, found 0"):
        edit_config(repo / "embed" / "config.pbtxt", max_queue_delay_us=0)
