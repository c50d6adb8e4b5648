"""repository add's reranker configs: the scorer's engine step size per device."""

from __future__ import annotations

import re

import pytest
from triton_embed_server.models.repository import ModelOptions, add_model

from tests.reranker_factory import make_bert_cross_encoder


def step_tokens(config: str) -> int:
    found = re.search(r'key: "max_num_batched_tokens", value: \{ string_value: "(\d+)" \}', config)
    assert found, "no max_num_batched_tokens parameter"
    return int(found.group(1))


@pytest.mark.parametrize(
    "max_length, cpu, gpu",
    [
        (128, 4096, 16384),  # the templates' steps
        (8192, 8192, 16384),  # a long model: one full-length pair fits a step
        (20000, 20000, 20000),
    ],
)
def test_the_scorer_step_is_the_templates_or_one_full_pair(tmp_path, max_length, cpu, gpu):
    folder = make_bert_cross_encoder(tmp_path / "ce", max_length=max(max_length, 128))
    repository = tmp_path / "repo"
    # the model's positions bound max_length: make room for the longest case
    config = (folder / "config.json").read_text()
    (folder / "config.json").write_text(
        re.sub(r'"max_position_embeddings": \d+', '"max_position_embeddings": 20000', config)
    )
    add_model(repository, ModelOptions(name="rr", model=str(folder), max_length=max_length))
    scorer = repository / "rr_scorer"
    assert step_tokens((scorer / "config.pbtxt").read_text()) == cpu
    assert step_tokens((scorer / "configs" / "gpu.pbtxt").read_text()) == gpu
