"""The KV-cache budget of one ``embedder`` engine, in bytes, from the model and its limits.

vLLM 0.32's CPU worker (``vllm/v1/worker/cpu_worker.py``) sizes the KV cache in one of two
ways:

* without an explicit size it reserves ``gpu_memory_utilization`` of the *NUMA node's*
  ``MemTotal`` (``vllm/utils/cpu_resource_utils.py``: ``/sys/devices/system/node/nodeN``)
  per engine, minus the engine's RSS, and refuses to start when that is more than the
  node's available memory ("Available memory on node 0 ... is less than requested memory
  for kv"). On a host whose node holds a fraction of the RAM, several engines bound to one
  node run out, whatever the KV cache really needs;
* with ``kv_cache_memory_bytes`` (the ``LLM`` engine argument; ``VLLM_CPU_KVCACHE_SPACE``
  is its legacy whole-GiB form and overrides it, ``vllm/platforms/cpu.py``) it allocates
  exactly that, checks only that the node has it available, and ignores
  ``gpu_memory_utilization``.

So every engine gets an explicit budget: the ``kv_cache_bytes`` parameter of the embedder's
config (written by ``triton-embed repository add``, and passed as ``kv_cache_memory_bytes``
by :meth:`~triton_embed_server.steps.config.EmbedderConfig.llm_kwargs`). It is what one engine
step of the configured limits holds, no more:

* bytes per token: ``2 (K and V) x num_hidden_layers x num_key_value_heads x head_dim x
  dtype bytes`` (``config.json``; ``num_key_value_heads`` defaults to
  ``num_attention_heads``, ``head_dim`` to ``hidden_size / num_attention_heads``; 4 bytes for
  ``float32``, 2 for ``float16``/``bfloat16``). An encoder-only model (BERT and its family,
  :data:`ENCODER_ONLY_MODEL_TYPES`) keeps no KV cache at all in vLLM
  (``EncoderOnlyAttention``): 0;
* blocks: vLLM's CPU backend pages the cache in blocks of :data:`BLOCK_TOKENS` = 128 tokens
  (``vllm/platforms/cpu.py``), and a sequence holds ``ceil(len / 128)`` blocks. One step
  schedules at most ``S = max_num_seqs`` sequences of at most ``T = max_num_batched_tokens``
  tokens together, each at most ``max_model_len``; a pooling request is done in its step and
  frees its blocks. The most blocks one step can hold is ``n + floor((T - n) / 128)`` with
  ``n = min(S, T)`` (every sequence's first block, then one more per 128 further tokens),
  and never fewer than one full-length sequence's ``ceil(max_model_len / 128)``;
* budget: ``blocks x 128 x bytes per token``.

For example, the Qwen3-style test model of ``tests/model_factory.py`` (2 layers, 1 KV head of
64, float32: ``2 x 2 x 1 x 64 x 4 = 1,024`` bytes a token) with the shipped CPU limits
(``S = 256``, ``T = 16,384``, ``max_model_len = 128``): ``256 + floor(16,128 / 128) = 382``
blocks, ``382 x 128 x 1,024 = 50,069,504`` bytes (47.75 MiB); vLLM 0.32 given that budget
reports "CPU KV cache size: 48,896 tokens" (382 blocks) and starts. all-MiniLM-L6-v2 (BERT): 0.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

#: Tokens per KV-cache block on vLLM's CPU backend (``vllm/platforms/cpu.py``: 128 unless
#: the user sets ``block_size``).
BLOCK_TOKENS = 128
#: Bytes of one KV element by the engine's ``dtype`` (``auto``: the checkpoint's, see
#: :func:`dtype_bytes`).
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
#: ``config.json`` ``model_type`` values whose vLLM models use ``EncoderOnlyAttention`` and
#: so allocate no KV cache (``vllm/model_executor/models/{bert,roberta,modernbert,
#: bert_with_rope}.py``). Any other model type is budgeted as a decoder (on the safe side).
ENCODER_ONLY_MODEL_TYPES = frozenset(
    {
        "bert",
        "roberta",
        "xlm-roberta",
        "modernbert",
        "nomic_bert",
        "new",
        "gte",
        "jina_bert",
        "distilbert",
        "electra",
        "mpnet",
        "camembert",
    }
)


@dataclass(frozen=True)
class KvShape:
    """What one token holds in the KV cache of a model, from its ``config.json``.

    Attributes:
        model_type: ``config.json`` ``model_type``.
        layers: attention layers holding a cache (0 for an encoder-only model).
        kv_heads: key/value heads per layer.
        head_dim: elements per head.
    """

    model_type: str
    layers: int
    kv_heads: int
    head_dim: int

    def bytes_per_token(self, element_bytes: int) -> int:
        """``2 x layers x kv_heads x head_dim x element_bytes`` (K and V)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * element_bytes


def _config(model_path: Path) -> dict:
    try:
        return json.loads((Path(model_path) / "config.json").read_text("utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{model_path}: cannot read config.json: {exc}") from None


def kv_shape(model_path: Path) -> KvShape:
    """The KV shape of the model folder (module docstring).

    Raises:
        ValueError: ``config.json`` is unreadable, or a decoder's lacks the sizes.
    """
    config = _config(model_path)
    config = config.get("text_config") or config
    model_type = str(config.get("model_type", ""))
    if model_type in ENCODER_ONLY_MODEL_TYPES:
        return KvShape(model_type, 0, 0, 0)
    try:
        layers = int(config["num_hidden_layers"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise ValueError(
            f"{model_path}/config.json: cannot size the KV cache (needs num_hidden_layers, "
            f"num_attention_heads and hidden_size or head_dim): {type(exc).__name__}: {exc}; "
            "set the embedder's kv_cache_bytes parameter explicitly"
        ) from None
    return KvShape(model_type, layers, kv_heads, head_dim)


def dtype_bytes(dtype: str, model_path: Path) -> int:
    """Bytes of one element at the engine's ``dtype`` (``auto``: ``config.json``'s; else 4)."""
    if dtype == "auto":
        config = _config(model_path)
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return DTYPE_BYTES.get(dtype, 4)


def step_blocks(
    max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, block: int = BLOCK_TOKENS
) -> int:
    """The most KV blocks one engine step holds (module docstring).

    ``max(n + floor((T - n) / block), ceil(max_model_len / block))`` with
    ``n = min(max_num_seqs, T)``, ``T = max_num_batched_tokens``.
    """
    n = min(max_num_seqs, max_num_batched_tokens)
    return max(n + (max_num_batched_tokens - n) // block, math.ceil(max_model_len / block))


def min_blocks(max_model_len: int, block: int = BLOCK_TOKENS) -> int:
    """The fewest blocks vLLM accepts: one sequence of ``max_model_len`` tokens."""
    return math.ceil(max_model_len / block)


def kv_cache_bytes(
    model_path: Path,
    dtype: str,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
) -> int:
    """The KV-cache budget of one engine: one step of the configured limits (module docstring).

    Returns:
        Bytes, 0 for an encoder-only model.

    Raises:
        ValueError: the model folder's ``config.json`` does not tell the sizes.
    """
    per_token = kv_shape(model_path).bytes_per_token(dtype_bytes(dtype, model_path))
    blocks = step_blocks(max_num_batched_tokens, max_num_seqs, max_model_len)
    return blocks * BLOCK_TOKENS * per_token


def min_kv_cache_bytes(model_path: Path, dtype: str, max_model_len: int) -> int:
    """The smallest budget vLLM starts with: one full-length sequence's blocks (0: encoder)."""
    per_token = kv_shape(model_path).bytes_per_token(dtype_bytes(dtype, model_path))
    return min_blocks(max_model_len) * BLOCK_TOKENS * per_token
