"""Shared fixtures of the unit tests (no server, no GPU, no vLLM)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import triton_config


@pytest.fixture
def make_config() -> Callable[..., dict]:
    """``make_config({"key": "value"}, instance_group=[...])`` -> Triton-shaped config dict."""
    return triton_config


@pytest.fixture
def make_model_dir(tmp_path: Path) -> Callable[..., Path]:
    """Create a fake model folder holding the given JSON files.

    ``make_model_dir("name", config={...}, tokenizer_config={...}, sentence_bert_config={...})``
    writes ``config.json`` (always, ``{}`` by default) and the other files only when given.
    """

    def make(
        name: str = "model",
        config: dict | None = None,
        tokenizer_config: dict | str | None = None,
        sentence_bert_config: dict | str | None = None,
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True)
        files = {
            "config.json": config if config is not None else {},
            "tokenizer_config.json": tokenizer_config,
            "sentence_bert_config.json": sentence_bert_config,
        }
        for fname, content in files.items():
            if content is None:
                continue
            text = content if isinstance(content, str) else json.dumps(content)
            (folder / fname).write_text(text)
        return folder

    return make


@pytest.fixture
def node_sysfs() -> Callable[..., Path]:
    """``node_sysfs(root, {0: "0-3", 1: "4-7"})``: a fake ``/sys/devices/system/node`` holding
    ``node<N>/cpulist`` for each node; returns ``root``."""

    def make(root: Path, nodes: dict[int, str]) -> Path:
        for n, cpulist in nodes.items():
            (root / f"node{n}").mkdir(parents=True)
            (root / f"node{n}" / "cpulist").write_text(cpulist + "\n")
        return root

    return make
