"""What a hybrid (BGE-M3) model folder says: its encoder, its two heads, its special tokens.

The layout served is BAAI/bge-m3's (FlagEmbedding's ``BGEM3FlagModel``): a Hugging Face
encoder folder (``config.json`` architectures ``XLMRobertaModel``, or another ``*Model``
encoder vLLM serves, with a fast ``tokenizer.json``) and, next to it, two PyTorch state
dicts of ``torch.nn.Linear`` heads:

* ``colbert_linear.pt``: ``weight`` ``[colbert_dim, hidden]`` and ``bias`` ``[colbert_dim]``
  (BGE-M3: 1024 x 1024), applied to every token's last hidden state but the first;
* ``sparse_linear.pt``: ``weight`` ``[1, hidden]`` and ``bias`` ``[1]``, one weight per token.

From one forward pass (FlagEmbedding ``BGEM3Model._dense_embedding``, ``_sparse_embedding``,
``_colbert_embedding``, and ``BGEM3FlagModel``'s post-processing), per text of ``n`` tokens
with last hidden states ``h`` ``[n, hidden]``:

* dense: ``h[0]`` (the CLS token), L2-normalized;
* sparse: ``relu(sparse_linear(h))`` per token; per token ID the largest weight over its
  occurrences, the tokenizer's CLS, EOS, PAD and UNK tokens left out, weights > 0 kept;
* ColBERT: ``colbert_linear(h[1:])`` (CLS left out, the final EOS kept: ``n - 1`` rows),
  each row L2-normalized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.models.model_spec import (
    Need,
    architectures,
    model_max_length,
    read_json,
    require_fast_tokenizer,
)
from triton_embed_server.models.multivector_spec import _token_id
from triton_embed_server.models.spec import ModelFolderError

#: The head files next to the encoder's weights.
COLBERT_FILE = "colbert_linear.pt"
SPARSE_FILE = "sparse_linear.pt"
#: The tokenizer's special tokens the sparse output leaves out (FlagEmbedding's
#: ``unused_tokens``), by their ``tokenizer_config.json`` key.
SKIPPED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")
#: The config parameters of a hybrid model's spec, in both steps.
SPEC_KEYS = (
    "architecture",
    "dim",
    "colbert_dim",
    "vocab_size",
    "model_max_length",
    "skipped_token_ids",
)


@dataclass(frozen=True)
class HybridSpec:
    """A hybrid model's serving facts.

    Attributes:
        architecture: the ``config.json`` architecture vLLM serves (``XLMRobertaModel``).
        dim: values of the dense vector (the encoder's hidden size).
        colbert_dim: values of each ColBERT token vector (``colbert_linear``'s rows).
        vocab_size: the length of the sparse vectors (``config.json`` ``vocab_size``).
        max_length: the model's own token budget per text, special tokens included.
        skipped_token_ids: token IDs the sparse output leaves out (CLS, EOS, PAD, UNK).
    """

    architecture: str
    dim: int
    colbert_dim: int
    vocab_size: int
    max_length: int
    skipped_token_ids: tuple[int, ...] = ()

    def parameters(self) -> dict[str, str]:
        """The spec as the steps' config parameters (:data:`SPEC_KEYS`)."""
        return {
            "architecture": self.architecture,
            "dim": str(self.dim),
            "colbert_dim": str(self.colbert_dim),
            "vocab_size": str(self.vocab_size),
            "model_max_length": str(self.max_length),
            "skipped_token_ids": ",".join(str(i) for i in self.skipped_token_ids),
        }


def is_hybrid(path: Path) -> bool:
    """Whether a folder is a BGE-M3-style model: both head files next to ``config.json``."""
    path = Path(path)
    return (path / COLBERT_FILE).is_file() and (path / SPARSE_FILE).is_file()


def head_shape(file: Path, rows: int | None, hidden: int) -> int:
    """The rows of a saved ``torch.nn.Linear`` state dict, checked against the encoder.

    Args:
        file: the ``.pt`` file (a state dict with ``weight`` and ``bias``).
        rows: the rows it must have (``None``: any).
        hidden: the encoder's hidden size (its columns).

    Raises:
        ModelFolderError: unreadable, no ``weight``/``bias``, or the wrong shapes.
    """
    import torch

    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's own reasons: missing file, pickle, zip
        raise ModelFolderError(f"{file}: unreadable ({type(exc).__name__}: {exc})") from None
    weight = state.get("weight") if isinstance(state, dict) else None
    bias = state.get("bias") if isinstance(state, dict) else None
    if not isinstance(weight, torch.Tensor) or not isinstance(bias, torch.Tensor):
        raise ModelFolderError(f"{file}: not a torch.nn.Linear state dict (weight and bias)")
    want_rows = weight.shape[0] if rows is None else rows
    if tuple(weight.shape) != (want_rows, hidden) or tuple(bias.shape) != (want_rows,):
        raise ModelFolderError(
            f"{file}: weight {tuple(weight.shape)}, bias {tuple(bias.shape)}; the encoder's "
            f"hidden size is {hidden}, so a head of {want_rows} outputs has weight "
            f"({want_rows}, {hidden}) and bias ({want_rows},)"
        )
    return int(want_rows)


def _whole(config: dict[str, Any], file: Path, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ModelFolderError(f"{file}: {key} must be a whole number >= 1, got {value!r}")
    return value


def _skipped_ids(path: Path) -> tuple[int, ...]:
    """The token IDs of :data:`SKIPPED_TOKENS` that the tokenizer states, ascending."""
    stated = read_json(path / "tokenizer_config.json", Need.HINT)
    ids = set()
    for key in SKIPPED_TOKENS:
        token = stated.get(key)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and token:
            ids.add(_token_id(path, token, key))
    return tuple(sorted(ids))


def read_hybrid_spec(path: Path) -> HybridSpec:
    """The hybrid facts of a folder (the module docstring's layout).

    Raises:
        ModelFolderError: no ``tokenizer.json``, a missing or misshapen head file, no
            encoder architecture, or a ``hidden_size``/``vocab_size`` that is no whole
            number (one line naming the file and what to do).
    """
    path = Path(path)
    file = path / "config.json"
    config = read_json(file, Need.REQUIRED)
    require_fast_tokenizer(path)
    for head in (COLBERT_FILE, SPARSE_FILE):
        if not (path / head).is_file():
            raise ModelFolderError(
                f"{path / head}: missing; a BGE-M3 folder has {COLBERT_FILE} and {SPARSE_FILE} "
                "(torch.nn.Linear state dicts) next to the encoder"
            )
    names = architectures(config)
    encoders = [a for a in names if a.endswith("Model")]
    if not encoders:
        raise ModelFolderError(
            f"{file}: architectures {names}; a hybrid model's encoder is a plain *Model "
            "(XLMRobertaModel for BGE-M3), whose last hidden states the heads read"
        )
    hidden = _whole(config, file, "hidden_size")
    head_shape(path / SPARSE_FILE, 1, hidden)
    return HybridSpec(
        architecture=encoders[0],
        dim=hidden,
        colbert_dim=head_shape(path / COLBERT_FILE, None, hidden),
        vocab_size=_whole(config, file, "vocab_size"),
        max_length=model_max_length(path, config),
        skipped_token_ids=_skipped_ids(path),
    )
