"""What a reranker folder says: its family, its score's activation, its segments, its template.

Two families (docs/rerank.md):

* **cross-encoder**: ``config.json`` ``architectures`` names a ``*ForSequenceClassification``
  class with one label, the layout both ``transformers`` and sentence-transformers'
  ``CrossEncoder.save`` write (BERT/MiniLM, XLM-RoBERTa as in bge-reranker, ModernBERT).
  The score a client gets by default is that logit through the activation
  ``CrossEncoder.predict`` applies, found in sentence-transformers 5's order
  (``CrossEncoder.__init__``): ``activation_fn`` of ``config_sentence_transformers.json``,
  then ``config.json``'s ``sentence_transformers.activation_fn``, then the pre-v4 key
  ``sbert_ce_default_activation_function``, then the sigmoid for one label. (vLLM reads only
  ``config.json``, which ``CrossEncoder.save`` leaves stale: the scorer asks vLLM for the raw
  logit and applies this activation itself.) Segment ids matter where ``type_vocab_size``
  is above 1: the query's tokens are segment 0, the document's segment 1 (unless the tokenizer's
  ``model_input_names`` leave ``token_type_ids`` out, as ``transformers`` then does).
* **decoder reranker** (Qwen3-Reranker): a causal LM whose score is ``P(yes)`` against ``no``
  for the last token of its prompt template (:class:`DecoderTemplate`), i.e.
  ``sigmoid(logit(yes) - logit(no))``; vLLM serves it as a one-label classifier built from
  those two rows of the LM head (``hf_overrides`` of :func:`decoder_hf_overrides`, vLLM's
  ``is_original_qwen3_reranker`` conversion). Only asked for explicitly (``--kind reranker``):
  a causal LM folder does not say that it is a reranker.
"""

from __future__ import annotations

import enum
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
from triton_embed_server.models.spec import ModelFolderError

#: The architecture suffix of a cross-encoder's ``config.json``.
CLASSIFIER_SUFFIX = "ForSequenceClassification"
#: Causal LMs vLLM turns into a yes/no reranker (``vllm/model_executor/models/config.py``).
DECODER_ARCHITECTURES = {"Qwen3ForCausalLM": "Qwen3ForSequenceClassification"}


class Family(str, enum.Enum):
    """The two kinds of reranker checkpoint."""

    CROSS_ENCODER = "cross_encoder"
    DECODER = "decoder"


class Activation(str, enum.Enum):
    """What turns the model's logit into the score a client gets by default."""

    SIGMOID = "sigmoid"
    IDENTITY = "identity"


# sentence-transformers' stored activation paths (``fullname`` of the module) we apply.
_ACTIVATIONS = {
    "torch.nn.modules.activation.Sigmoid": Activation.SIGMOID,
    "torch.nn.Sigmoid": Activation.SIGMOID,
    "torch.nn.modules.linear.Identity": Activation.IDENTITY,
    "torch.nn.Identity": Activation.IDENTITY,
}


@dataclass(frozen=True)
class DecoderTemplate:
    """A decoder reranker's prompt: ``prefix + pair + suffix``, the pair as ``pair_format``.

    The Qwen3-Reranker model card's template (Qwen/Qwen3-Reranker-0.6B, "Usage"): a system
    turn that asks for "yes" or "no", the user turn ``<Instruct>``, ``<Query>`` and
    ``<Document>`` lines (:attr:`pair_format`) and an empty thinking block in the assistant turn.
    """

    prefix: str
    pair_format: str
    suffix: str
    default_instruction: str
    yes: str = "yes"
    no: str = "no"

    def pair(self, query: str, document: str, instruction: str | None = None) -> str:
        """The user turn of one pair (without prefix and suffix)."""
        return self.pair_format.format(
            instruction=instruction or self.default_instruction, query=query, document=document
        )

    def document_offset(self, query: str, instruction: str | None = None) -> int:
        """Characters of :meth:`pair` before the document's first character."""
        return len(self.pair(query, "", instruction))


QWEN3_TEMPLATE = DecoderTemplate(
    prefix=(
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
        'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
        "<|im_end|>\n<|im_start|>user\n"
    ),
    pair_format="<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    default_instruction=(
        "Given a web search query, retrieve relevant passages that answer the query"
    ),
)


#: The config parameters of a reranker's spec, in both steps (:meth:`RerankerSpec.parameters`).
SPEC_KEYS = ("family", "architecture", "activation", "segments", "model_max_length")


@dataclass(frozen=True)
class RerankerSpec:
    """A reranker's serving facts.

    Attributes:
        family: cross-encoder or decoder reranker.
        architecture: the ``config.json`` architecture, e.g. ``BertForSequenceClassification``.
        activation: the default score activation (a decoder reranker's: the sigmoid).
        segments: the model reads segment ids (``type_vocab_size`` > 1).
        max_length: the model's token budget per pair, special tokens (and template) included.
    """

    family: Family
    architecture: str
    activation: Activation
    segments: bool
    max_length: int

    def parameters(self) -> dict[str, str]:
        """The spec as the steps' config parameters (:data:`SPEC_KEYS`).

        What ``repository add`` writes into both steps and the steps read back.
        """
        return {
            "family": self.family.value,
            "architecture": self.architecture,
            "activation": self.activation.value,
            "segments": "true" if self.segments else "false",
            "model_max_length": str(self.max_length),
        }

    @property
    def template(self) -> DecoderTemplate | None:
        """The decoder reranker's prompt template; None for a cross-encoder."""
        return QWEN3_TEMPLATE if self.family is Family.DECODER else None


def decoder_hf_overrides(architecture: str) -> dict[str, Any]:
    """VLLM's ``hf_overrides`` that serve a causal LM as a yes/no reranker (one label).

    The classifier's weight is ``lm_head[yes] - lm_head[no]`` and its sigmoid equals the
    softmax over ``[no, yes]`` (vLLM 0.32 ``model_executor/models/adapters.py``, conversion
    ``from_2_way_softmax`` behind ``is_original_qwen3_reranker``).
    """
    template = QWEN3_TEMPLATE
    return {
        "architectures": [DECODER_ARCHITECTURES[architecture]],
        "classifier_from_token": [template.no, template.yes],
        "is_original_qwen3_reranker": True,
    }


def is_cross_encoder(path: Path) -> bool:
    """Whether ``path/config.json`` names a ``*ForSequenceClassification`` architecture.

    Raises:
        ModelFolderError: ``config.json`` is missing or not a JSON object.
    """
    config = read_json(Path(path) / "config.json", Need.REQUIRED)
    return any(a.endswith(CLASSIFIER_SUFFIX) for a in architectures(config))


def _num_labels(config: dict[str, Any]) -> int:
    labels = config.get("id2label")
    if isinstance(labels, dict) and labels:
        return len(labels)
    value = config.get("num_labels", 2)  # transformers' PretrainedConfig default
    return value if isinstance(value, int) else 2


def _stored_activation(path: Path, config: dict[str, Any]) -> tuple[Path, Any]:
    """``(file, stored value)`` of the activation, in sentence-transformers 5's order."""
    st_file = path / "config_sentence_transformers.json"
    stored = read_json(st_file, Need.OPTIONAL).get("activation_fn")
    if stored is not None:
        return st_file, stored
    st = config.get("sentence_transformers")
    stored = (st.get("activation_fn") if isinstance(st, dict) else None) or config.get(
        "sbert_ce_default_activation_function"
    )
    return path / "config.json", stored


def read_reranker_spec(path: Path, decoder: bool = False) -> RerankerSpec:
    """The reranker facts of a model folder.

    Args:
        path: the model folder.
        decoder: read it as a decoder reranker (``--kind reranker`` on a causal LM).

    Raises:
        ModelFolderError: not a reranker of either family (a classifier of several labels, a
            causal LM vLLM cannot convert, a decoder tokenizer without single ``yes``/``no``
            tokens), an activation other than sigmoid or identity, or no ``tokenizer.json``
            (one line naming the file and what to do).
    """
    path = Path(path)
    file = path / "config.json"
    config = read_json(file, Need.REQUIRED)
    require_fast_tokenizer(path)
    names = architectures(config)
    max_length = model_max_length(path, config)
    if decoder:
        known = [a for a in names if a in DECODER_ARCHITECTURES]
        if not known:
            raise ModelFolderError(
                f"{file}: architectures {names} are not a decoder reranker triton-embed serves "
                f"({', '.join(DECODER_ARCHITECTURES)}, as Qwen3-Reranker)"
            )
        _check_answer_tokens(path / "tokenizer.json")
        return RerankerSpec(Family.DECODER, known[0], Activation.SIGMOID, False, max_length)
    classifiers = [a for a in names if a.endswith(CLASSIFIER_SUFFIX)]
    if not classifiers:
        raise ModelFolderError(
            f"{file}: architectures {names} name no *{CLASSIFIER_SUFFIX} class; a reranker is "
            "a cross-encoder checkpoint (AutoModelForSequenceClassification), or a causal LM "
            "of the Qwen3-Reranker kind with --kind reranker"
        )
    labels = _num_labels(config)
    if labels != 1:
        raise ModelFolderError(
            f"{file}: {labels} labels; a reranker has one (a relevance logit per pair): "
            "this folder is a classifier, which triton-embed does not serve"
        )
    source, stored = _stored_activation(path, config)
    if stored is None:
        activation = Activation.SIGMOID
    elif stored in _ACTIVATIONS:
        activation = _ACTIVATIONS[stored]
    else:
        raise ModelFolderError(
            f"{source}: activation_fn {str(stored)[:80]!r} is not one triton-embed applies "
            "(Sigmoid or Identity of torch.nn)"
        )
    return RerankerSpec(
        Family.CROSS_ENCODER, classifiers[0], activation, _segments(path, config), max_length
    )


def _segments(path: Path, config: dict[str, Any]) -> bool:
    """Whether the reference feeds the model segment ids.

    The model has segment embeddings (``type_vocab_size`` > 1) and its tokenizer returns
    them: ``transformers`` passes ``token_type_ids`` to the model only when the tokenizer's
    ``model_input_names`` hold them (BERT's do; a ``tokenizer_config.json`` that lists names
    without them turns them off).
    """
    if int(config.get("type_vocab_size") or 0) <= 1:
        return False
    names = read_json(path / "tokenizer_config.json", Need.HINT).get("model_input_names")
    return not isinstance(names, list) or "token_type_ids" in names


def _check_answer_tokens(tokenizer_json: Path) -> None:
    """A decoder reranker's tokenizer must have ``yes`` and ``no`` as single tokens.

    Raises:
        ModelFolderError: either is missing (names the file).
    """
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_json))
    missing = [
        t for t in (QWEN3_TEMPLATE.yes, QWEN3_TEMPLATE.no) if tokenizer.token_to_id(t) is None
    ]
    if missing:
        raise ModelFolderError(
            f"{tokenizer_json}: no single token for {missing}; a decoder reranker answers with "
            "the tokens 'yes' and 'no'"
        )
