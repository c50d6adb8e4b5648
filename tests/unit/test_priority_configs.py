"""Every step config the repository ships or renders states the levels of triton_embed.priority."""

from __future__ import annotations

import pytest
from google.protobuf import text_format
from triton_embed.priority import (
    DEFAULT_PRIORITY,
    DEFAULT_PRIORITY_LEVEL,
    PRIORITY_LEVELS,
    Priority,
    level_of,
)
from triton_embed_server.models.repository.render import TEMPLATES
from triton_embed_server.run.launcher import REPO_ROOT
from tritonclient.grpc import model_config_pb2

#: Every step config with a dynamic batcher: the shipped ones (the templates link to them)
#: and the other kinds' templates; CPU and GPU variants.
STEP_CONFIGS = sorted(
    {
        p.resolve()
        for p in [
            *(REPO_ROOT / "model_repository").rglob("*.pbtxt"),
            *TEMPLATES.rglob("*.pbtxt"),  # type: ignore[attr-defined]
        ]
        if "dynamic_batching" in p.read_text()
    }
)


def test_the_levels_are_two_interactive_first():
    assert PRIORITY_LEVELS == len(Priority) == 2
    assert (Priority.INTERACTIVE.level, Priority.BATCH.level) == (1, 2)
    assert DEFAULT_PRIORITY is Priority.INTERACTIVE and DEFAULT_PRIORITY_LEVEL == 1
    assert level_of(None) == 0 and level_of("BATCH") == 2
    with pytest.raises(ValueError, match="priority must be one of interactive, batch; got 'x'"):
        level_of("x")


def test_every_step_config_is_found():
    names = {p.name for p in STEP_CONFIGS}
    assert {
        "config.pbtxt",
        "gpu.pbtxt",
        "pair_tokenizer.pbtxt",
        "scorer_cpu.pbtxt",
        "scorer_gpu.pbtxt",
        "sparse_encoder_cpu.pbtxt",
        "sparse_encoder_gpu.pbtxt",
        "token_encoder_cpu.pbtxt",
        "token_encoder_gpu.pbtxt",
        "hybrid_encoder_cpu.pbtxt",
        "hybrid_encoder_gpu.pbtxt",
    } <= names
    assert len(STEP_CONFIGS) == 12  # tokenizer, embedder CPU/GPU, pair tokenizer, scorer x2,
    # sparse encoder x2, token encoder x2, hybrid encoder x2 (the sparse, multi-vector and
    # hybrid tokenizers are the shipped tokenizer's template)


@pytest.mark.parametrize("path", STEP_CONFIGS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_step_has_the_levels_and_a_queue_policy_per_level(path):
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    batching = config.dynamic_batching
    assert batching.priority_levels == PRIORITY_LEVELS
    assert batching.default_priority_level == DEFAULT_PRIORITY_LEVEL
    # The default level's bound is default_queue_policy; every other level has its own.
    others = {p.level for p in Priority} - {DEFAULT_PRIORITY_LEVEL}
    assert set(batching.priority_queue_policy) == others
    interactive = batching.default_queue_policy
    batch = batching.priority_queue_policy[Priority.BATCH.level]
    for policy in (interactive, batch):
        assert policy.max_queue_size > 0
        assert policy.timeout_action == model_config_pb2.ModelQueuePolicy.REJECT
        assert not policy.allow_timeout_override
    assert batch.default_timeout_microseconds == 2 * interactive.default_timeout_microseconds
    assert batch.max_queue_size == interactive.max_queue_size
