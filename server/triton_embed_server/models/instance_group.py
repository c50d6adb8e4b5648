"""How many instances a model runs: the one reader of Triton's ``instance_group``.

Triton hands ``initialize`` the model config as JSON and serves the same JSON at
``GET /v2/models/<name>/config``; a ``config.pbtxt`` is the same ``ModelConfig`` message in
protobuf text format, which :func:`read_config_pbtxt` turns into that JSON. Every instance
count in this project comes from :func:`instance_count` over that JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class InstanceCount:
    """A model's instance counts.

    Attributes:
        per_device: the first group's ``count``: copies on each listed GPU (``KIND_GPU``) or
            in the host (``KIND_CPU``); the copies that share one device.
        total: the stub processes the groups ask for: per group ``count`` times the number
            of GPUs it lists (1 when it lists none; a ``KIND_GPU`` group without a list runs
            ``count`` copies on every GPU, so this is a lower bound there unless the number
            of visible GPUs was given).
    """

    per_device: int
    total: int


def instance_kind(model_config: Mapping[str, Any]) -> str:
    """The first ``instance_group``'s kind: ``KIND_CPU``, ``KIND_GPU`` or ``KIND_AUTO``."""
    return str((model_config.get("instance_group") or [{}])[0].get("kind", "KIND_AUTO"))


def instance_count(model_config: Mapping[str, Any], gpus: int | None = None) -> InstanceCount:
    """The instance counts of a model config (JSON form).

    A missing ``instance_group`` or ``count`` means 1, as in Triton's model configuration
    (``count`` defaults to 1).

    Args:
        model_config: the config, as Triton serves it or :func:`read_config_pbtxt` reads it.
        gpus: the GPUs the server sees, if known: a ``KIND_GPU`` group without a ``gpus``
            list then counts ``count`` copies on each of them (at least one).
    """
    groups = model_config.get("instance_group") or [{}]
    counts = [max(1, int(group.get("count", 1) or 1)) for group in groups]

    def devices(group: Mapping[str, Any]) -> int:
        listed = len(group.get("gpus") or [])
        if not listed and gpus is not None and group.get("kind") == "KIND_GPU":
            return max(1, gpus)
        return max(1, listed)

    total = sum(n * devices(group) for n, group in zip(counts, groups, strict=True))
    return InstanceCount(per_device=counts[0], total=total)


def read_config_pbtxt(path: Path) -> dict[str, Any]:
    """A ``config.pbtxt`` in the JSON form Triton serves (protobuf field names).

    Raises:
        OSError: the file cannot be read.
        ValueError: it is not a ``ModelConfig`` in protobuf text format (names the file).
    """
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    text = path.read_text()
    try:
        message = text_format.Parse(text, model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        raise ValueError(f"{path}: not a Triton model config: {exc}") from None
    return json_format.MessageToDict(message, preserving_proto_field_name=True)
