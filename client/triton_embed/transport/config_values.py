"""Model config values as the catalog reads them: parameters, batch sizes, token budgets.

Plain functions over Triton's model config JSON (``get_model_config(..., as_json=True)``);
none raises on a missing or malformed value (``None`` or the default instead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triton_embed.options import OptionError, parse_flag
from triton_embed.serving_limits import REQUEST_TEXTS, request_token_budget


def parameter(config: Mapping[str, Any], key: str) -> str:
    """A model config parameter's string value ("" when absent)."""
    value = (config.get("parameters") or {}).get(key) or {}
    return str(value.get("string_value", "")).strip()


def request_tokens(
    tokenizer_config: Mapping[str, Any], max_length: int | None, max_chunks: int
) -> int | None:
    """The tokenizer step's budget per request: its parameter, else the step's default."""
    stated = int_parameter(tokenizer_config, "max_request_tokens")
    if stated:
        return stated
    if max_length is None:
        return None
    texts = batch_size_of(tokenizer_config, REQUEST_TEXTS)
    return request_token_budget(texts, max_length, max_chunks)


def int_parameter(config: Mapping[str, Any], key: str) -> int | None:
    """A whole-number parameter (``None`` when absent, empty, 0 or not a number)."""
    text = parameter(config, key)
    try:
        value = int(text)
    except ValueError:
        return None
    return value if value > 0 else None


def batch_size_of(config: Mapping[str, Any] | None, default: int) -> int:
    """``max_batch_size`` of a config (``default`` when absent or 0)."""
    if not config:
        return default
    return int(config.get("max_batch_size") or 0) or default


def allow_empty(tokenizer_config: Mapping[str, Any]) -> bool:
    """The tokenizer step's ``allow_empty`` parameter (``false`` when absent or unreadable)."""
    try:
        return parse_flag(parameter(tokenizer_config, "allow_empty") or "false")
    except OptionError:
        return False
