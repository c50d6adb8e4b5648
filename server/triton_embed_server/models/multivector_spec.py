"""What a multi-vector (late interaction) model folder says: its layout, markers and lengths.

Three layouts are served (docs/sparse.md, "Multi-vector"):

* **Stanford ColBERT** (``HF_ColBERT``): ``config.json`` names the architecture
  ``HF_ColBERT`` and the checkpoint holds the projection ``linear.weight`` ``[dim, hidden]``
  next to the BERT weights (``bert.*``); ``artifact.metadata`` (the ``ColBERTConfig`` the
  checkpoint was saved with) gives ``query_maxlen``, ``doc_maxlen``, the marker tokens
  ``query_token_id`` / ``doc_token_id`` and ``attend_to_mask_tokens``; without it,
  ``ColBERTConfig``'s defaults (32, 220, ``[unused0]``, ``[unused1]``, false). vLLM 0.32
  serves it as ``ColBERTModel`` (``model_executor/models/colbert.py``).
* **PyLate**: a sentence-transformers folder whose ``modules.json`` lists a ``Transformer``
  (path ``""``) and one ``pylate.models.Dense.Dense`` projection (``1_Dense``);
  ``config_sentence_transformers.json`` gives ``query_prefix`` / ``document_prefix`` (the
  marker tokens PyLate adds to the tokenizer, ``[Q] `` / ``[D] ``), ``query_length``,
  ``document_length``, ``do_query_expansion`` and ``attend_to_expansion_tokens``. vLLM
  serves the transformer's own architecture and loads the projection from ``1_Dense``
  (``_load_st_projector``, which names PyLate's ``Dense``).
* **hidden states** (``repository add --kind multivector`` on any dense embedding folder):
  the last hidden state of every token, no projection, no markers, not normalized (as TEI's
  ``/embed_all`` returns them).

A text's tokens are ``[CLS] marker text [SEP]`` for ColBERT (the marker after the
tokenizer's leading special tokens, as both references put it at position 1); a query is
then filled to ``query_length`` with ``[MASK]`` (query augmentation). ColBERT's vectors are
the projection of each token's last hidden state, L2-normalized per token.

A ColBERT **document** leaves out the rows of punctuation tokens, as both references do
(:attr:`MultiVectorSpec.skiplist`): Stanford's ``ColBERTConfig.mask_punctuation`` (default
true; ``artifact.metadata``) skips, for each character of ``string.punctuation``, the first
token ID of ``tokenizer.encode(char, add_special_tokens=False)``; PyLate's ``skiplist_words``
(``config_sentence_transformers.json``, default ``string.punctuation``) skips
``convert_tokens_to_ids(word)`` of each word. Queries keep every row; hidden states skip none.
"""

from __future__ import annotations

import enum
import json
import string
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_embed_server.models.model_spec import (
    Need,
    architectures,
    model_max_length,
    module_kinds,
    read_json,
    require_fast_tokenizer,
)
from triton_embed_server.models.spec import ModelFolderError

#: Stanford ColBERT's architecture name (vLLM's registry maps it to ``ColBERTModel``).
STANFORD_ARCHITECTURE = "HF_ColBERT"
#: PyLate's projection module type, as ``modules.json`` names it.
PYLATE_DENSE = "pylate.models.Dense.Dense"
#: ``ColBERTConfig`` defaults (stanford-futuredata/ColBERT ``colbert/infra/config/settings.py``).
STANFORD_DEFAULTS = {
    "query_maxlen": 32,
    "doc_maxlen": 220,
    "query_token_id": "[unused0]",
    "doc_token_id": "[unused1]",
    "attend_to_mask_tokens": False,
    "mask_punctuation": True,
}
#: PyLate's ``ColBERT`` defaults (``pylate/models/colbert.py``).
PYLATE_DEFAULTS = {
    "query_prefix": "[Q] ",
    "document_prefix": "[D] ",
    "query_length": 32,
    "document_length": 180,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": False,
    "skiplist_words": list(string.punctuation),
}
#: The request's ``input_type`` values of a multi-vector model.
INPUT_TYPES = ("query", "document")


class Layout(str, enum.Enum):
    """Where a multi-vector model's facts come from (the module docstring)."""

    STANFORD = "stanford"
    PYLATE = "pylate"
    HIDDEN = "hidden"


#: The config parameters of a multi-vector model's spec, in both steps.
SPEC_KEYS = (
    "multivector_layout",
    "architecture",
    "dim",
    "normalize",
    "model_max_length",
    "query_length",
    "query_marker_id",
    "document_marker_id",
    "mask_id",
    "attend_expansion",
    "skiplist",
)


@dataclass(frozen=True)
class MultiVectorSpec:
    """A multi-vector model's serving facts.

    Attributes:
        layout: where the facts come from.
        architecture: the ``config.json`` architecture vLLM serves (``HF_ColBERT``,
            ``BertModel``...).
        dim: values per token vector (the projection's output; the hidden size without one).
        normalize: L2-normalize each token's vector (ColBERT: yes; hidden states: no).
        max_length: a document's token budget, special tokens and marker included (ColBERT's
            document length; the model's own limit for hidden states).
        query_length: a query's token budget, marker included; with :attr:`mask_id` a query
            is filled to it (augmentation); 0: queries have the document's budget.
        query_marker_id: the token put after the leading special tokens of a query (-1: none).
        document_marker_id: the same for a document (-1: none).
        mask_id: the token a query is filled with up to :attr:`query_length` (-1: queries
            are not augmented).
        attend_expansion: the reference attends to the ``[MASK]`` tokens (PyLate's
            ``attend_to_expansion_tokens``, Stanford's ``attend_to_mask_tokens``); when false
            (:attr:`masks_expansion`) the engine embeds queries outside vLLM, whose attention
            always attends to every token (docs/sparse.md, "Query augmentation").
        skiplist: token IDs whose rows a document's matrix leaves out (the module docstring's
            punctuation rule), ascending; empty: every row is kept.
    """

    layout: Layout
    architecture: str
    dim: int
    normalize: bool
    max_length: int
    query_length: int = 0
    query_marker_id: int = -1
    document_marker_id: int = -1
    mask_id: int = -1
    attend_expansion: bool = True
    skiplist: tuple[int, ...] = ()

    def parameters(self) -> dict[str, str]:
        """The spec as the steps' config parameters (:data:`SPEC_KEYS`)."""
        return {
            "multivector_layout": self.layout.value,
            "architecture": self.architecture,
            "dim": str(self.dim),
            "normalize": "true" if self.normalize else "false",
            "model_max_length": str(self.max_length),
            "query_length": str(self.query_length),
            "query_marker_id": str(self.query_marker_id),
            "document_marker_id": str(self.document_marker_id),
            "mask_id": str(self.mask_id),
            "attend_expansion": "true" if self.attend_expansion else "false",
            "skiplist": ",".join(str(i) for i in self.skiplist),
        }

    @property
    def masks_expansion(self) -> bool:
        """Whether a query's ``[MASK]`` expansion is left out as attention keys.

        True when queries are augmented (:attr:`mask_id`) and the reference does not attend
        to the expansion (:attr:`attend_expansion` false, both libraries' default).
        """
        return self.mask_id >= 0 and not self.attend_expansion

    def query_key_mask(self, token_ids: Sequence[int]) -> np.ndarray:
        """A query's attention mask as the reference builds it when :attr:`masks_expansion`.

        Both references pad a query to its length and turn the padding into ``[MASK]`` with
        the tokenizer's attention mask left at 0 there (Stanford's ``QueryTokenizer.
        tensorize``, PyLate's ``ColBERT.tokenize``): the expansion is the run of
        :attr:`mask_id` at the end of the IDs, after ``[SEP]``; a ``[MASK]`` the text itself
        holds stays attended. Every position is still a query of attention and keeps its row.
        IDs of ``[MASK]`` only (sent to the step directly) leave nothing out: some key must be.

        Args:
            token_ids: a query's token IDs (markers and expansion in).

        Returns:
            int64 ``[tokens]``: 1 for a key attended, 0 for the expansion's positions.
        """
        ids = np.asarray(token_ids, dtype=np.int64)
        mask = np.ones(len(ids), dtype=np.int64)
        real = np.flatnonzero(ids != self.mask_id)
        if self.mask_id >= 0 and len(real):
            mask[int(real[-1]) + 1 :] = 0
        return mask

    def marker_id(self, input_type: str) -> int:
        """The marker token of a ``query`` or a ``document`` (-1: none)."""
        return self.query_marker_id if input_type == "query" else self.document_marker_id

    def kept_rows(self, token_ids: Sequence[int], input_type: str) -> np.ndarray | None:
        """Which rows of a text's ``[tokens, dim]`` matrix are served.

        Args:
            token_ids: the text's token IDs, as the engine read them.
            input_type: ``query`` (every row kept) or ``document``.

        Returns:
            bool ``[tokens]``, false for a document's :attr:`skiplist` tokens; ``None`` when
            every row is kept (a query, or no skiplist).
        """
        if input_type == "query" or not self.skiplist:
            return None
        return ~np.isin(np.asarray(token_ids, dtype=np.int64), self.skiplist)

    def length(self, input_type: str, max_length: int) -> int:
        """A ``query``'s or ``document``'s token budget (``max_length``: the document's)."""
        if input_type == "query" and self.query_length:
            return min(self.query_length, max_length)
        return max_length


def is_multivector(path: Path) -> bool:
    """Whether a folder is a ColBERT model (either ColBERT layout of the module docstring).

    Raises:
        ModelFolderError: ``config.json`` is missing or not a JSON object, or
            ``modules.json`` is there and unreadable.
    """
    path = Path(path)
    config = read_json(path / "config.json", Need.REQUIRED)
    if STANFORD_ARCHITECTURE in architectures(config):
        return True
    return any(m.get("type") == PYLATE_DENSE for _, m in module_kinds(path))


def read_multivector_spec(path: Path, hidden: bool = False) -> MultiVectorSpec:
    """The multi-vector facts of a folder.

    Args:
        path: the model folder.
        hidden: a dense embedding folder asked for its token embeddings (``--kind
            multivector``); a ColBERT folder is read as ColBERT either way.

    Raises:
        ModelFolderError: no ``tokenizer.json``, a ColBERT folder whose projection, markers
            or lengths cannot be read, or a dense folder with a ``Dense`` module (one line
            naming the file and what to do).
    """
    path = Path(path)
    config = read_json(path / "config.json", Need.REQUIRED)
    require_fast_tokenizer(path)
    names = architectures(config)
    if STANFORD_ARCHITECTURE in names:
        return _stanford(path, config)
    modules = module_kinds(path)
    if any(m.get("type") == PYLATE_DENSE for _, m in modules):
        return _pylate(path, config, modules)
    if not hidden:
        raise ModelFolderError(
            f"{path / 'config.json'}: architectures {names} and no PyLate Dense module: not a "
            "ColBERT model; pass --kind multivector to serve its token embeddings (hidden states)"
        )
    dense = [k for k, m in modules if k == "Dense"]
    if dense:
        raise ModelFolderError(
            f"{path / 'modules.json'}: a Dense module projects the pooled vector; the token "
            "embeddings served are the hidden states before it, which this folder's pipeline "
            "does not state: serve it as an embedding model"
        )
    hidden_size = config.get("hidden_size")
    if not isinstance(hidden_size, int) or isinstance(hidden_size, bool) or hidden_size < 1:
        raise ModelFolderError(f"{path / 'config.json'}: hidden_size must be a whole number >= 1")
    return MultiVectorSpec(
        layout=Layout.HIDDEN,
        architecture=names[0] if names else "",
        dim=hidden_size,
        normalize=False,
        max_length=model_max_length(path, config),
    )


def _token_id(path: Path, token: str, what: str) -> int:
    """The ID of ``token`` in ``path/tokenizer.json`` (added tokens included).

    Raises:
        ModelFolderError: the tokenizer has no such token (names ``what``).
    """
    from tokenizers import Tokenizer

    found = Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id(token)
    if found is None:
        raise ModelFolderError(
            f"{path / 'tokenizer.json'}: no token {token!r} ({what}); the tokenizer saved with "
            "the model has it"
        )
    return int(found)


def _skiplist(path: Path, words: Any, rule: str) -> tuple[int, ...]:
    """The token IDs of a ColBERT document's skipped rows (the module docstring's rules).

    Args:
        path: the model folder (its ``tokenizer.json``).
        words: the characters or words to skip.
        rule: ``stanford`` (the first ID of each word encoded without special tokens) or
            ``pylate`` (the word's vocabulary ID; the unknown token's for a word not in it,
            as ``convert_tokens_to_ids``).

    Raises:
        ModelFolderError: ``words`` is not a list of strings (names the file).
    """
    from tokenizers import Tokenizer

    if not isinstance(words, (list, tuple, str)) or not all(isinstance(w, str) for w in words):
        raise ModelFolderError(
            f"{path / 'config_sentence_transformers.json'}: skiplist_words must be a list of "
            f"strings, got {words!r}"
        )
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    unk = getattr(tokenizer.model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if isinstance(unk, str) else None
    ids = set()
    for word in words:
        if rule == "stanford":
            found = tokenizer.encode(word, add_special_tokens=False).ids[:1]
        else:
            found = [tokenizer.token_to_id(word)]
            found = [unk_id] if found == [None] else found
        ids.update(i for i in found if i is not None)
    return tuple(sorted(ids))


def _mask_id(path: Path) -> int:
    """The tokenizer's mask token ID (``tokenizer_config.json`` ``mask_token``, else ``[MASK]``)."""
    stated = read_json(path / "tokenizer_config.json", Need.HINT).get("mask_token") or "[MASK]"
    if isinstance(stated, dict):
        stated = stated.get("content") or "[MASK]"
    return _token_id(path, str(stated), "the mask token of query augmentation")


def _whole(value: Any, file: Path, key: str, low: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ModelFolderError(f"{file}: {key} must be a whole number >= {low}, got {value!r}")
    return value


def _positions(config: dict[str, Any], document: int) -> int:
    """The model's position limit (``max_position_embeddings``; ``document`` when absent).

    Not :func:`model_max_length`: a ColBERT folder's own lengths are its document and query
    lengths; sentence-transformers' ``max_seq_length`` of a PyLate folder is one less (PyLate
    inserts the marker after tokenizing).
    """
    value = config.get("max_position_embeddings")
    return value if isinstance(value, int) and value > 0 else document


def _checked_lengths(file: Path, query: int, document: int, own: int) -> int:
    """The document length in force, ``min(document, own)``; refuses a query longer than it."""
    document = min(document, own)
    if query > document:
        raise ModelFolderError(
            f"{file}: query length {query} is more than the document length {document}; "
            "triton-embed serves queries within the document budget"
        )
    return document


def _stanford(path: Path, config: dict[str, Any]) -> MultiVectorSpec:
    """A Stanford ``HF_ColBERT`` checkpoint's spec."""
    file = path / "artifact.metadata"
    stated = {**STANFORD_DEFAULTS, **read_json(file, Need.OPTIONAL)}
    dim = _projection_rows(path)
    query = _whole(stated["query_maxlen"], file, "query_maxlen", 4)
    document = _whole(stated["doc_maxlen"], file, "doc_maxlen", 4)
    return MultiVectorSpec(
        layout=Layout.STANFORD,
        architecture=STANFORD_ARCHITECTURE,
        dim=dim,
        normalize=True,
        max_length=_checked_lengths(file, query, document, _positions(config, document)),
        query_length=query,
        query_marker_id=_token_id(path, str(stated["query_token_id"]), "query_token_id"),
        document_marker_id=_token_id(path, str(stated["doc_token_id"]), "doc_token_id"),
        mask_id=_mask_id(path),
        attend_expansion=bool(stated["attend_to_mask_tokens"]),
        skiplist=(
            _skiplist(path, string.punctuation, "stanford") if stated["mask_punctuation"] else ()
        ),
    )


def _projection_rows(path: Path) -> int:
    """Rows of the checkpoint's ``linear.weight`` (the ColBERT dimension), from its header.

    Raises:
        ModelFolderError: no ``model.safetensors``, or no 2-D ``linear.weight`` in it.
    """
    file = path / "model.safetensors"
    try:
        with open(file, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise ModelFolderError(f"{file}: unreadable safetensors header ({exc})") from None
    for name, entry in header.items():
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if name.endswith("linear.weight") and isinstance(shape, list) and len(shape) == 2:
            return int(shape[0])
    raise ModelFolderError(
        f"{file}: no linear.weight (the ColBERT projection) in the checkpoint; a HF_ColBERT "
        "checkpoint saves it next to the BERT weights"
    )


def _pylate(
    path: Path, config: dict[str, Any], modules: list[tuple[str, dict[str, Any]]]
) -> MultiVectorSpec:
    """A PyLate folder's spec (``Transformer`` + PyLate ``Dense``)."""
    file = path / "modules.json"
    kinds = [k for k, _ in modules]
    if kinds != ["Transformer", "Dense"] or str(modules[0][1].get("path", "")) != "":
        raise ModelFolderError(
            f"{file}: modules {', '.join(kinds)}; a PyLate model triton-embed serves has the "
            f'Transformer at the folder\'s root (path "") and one {PYLATE_DENSE}'
        )
    dense_file = path / str(modules[1][1].get("path", "")) / "config.json"
    dense = read_json(dense_file, Need.REQUIRED)
    dim = _whole(dense.get("out_features"), dense_file, "out_features")
    if dense.get("use_residual"):
        raise ModelFolderError(f"{dense_file}: use_residual is not served (vLLM loads a Linear)")
    st_file = path / "config_sentence_transformers.json"
    stated = {**PYLATE_DEFAULTS, **read_json(st_file, Need.OPTIONAL)}
    query = _whole(stated["query_length"], st_file, "query_length", 4)
    document = _whole(stated["document_length"], st_file, "document_length", 4)
    expand = bool(stated["do_query_expansion"])
    names = architectures(config)
    return MultiVectorSpec(
        layout=Layout.PYLATE,
        architecture=names[0] if names else "",
        dim=dim,
        normalize=True,
        max_length=_checked_lengths(st_file, query, document, _positions(config, document)),
        query_length=query,
        query_marker_id=_token_id(path, str(stated["query_prefix"]), "query_prefix"),
        document_marker_id=_token_id(path, str(stated["document_prefix"]), "document_prefix"),
        mask_id=_mask_id(path) if expand else -1,
        attend_expansion=bool(stated["attend_to_expansion_tokens"]),
        skiplist=_skiplist(path, stated["skiplist_words"], "pylate"),
    )
