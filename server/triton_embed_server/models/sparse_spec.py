"""What a sparse (SPLADE) model folder says: its architecture, its pooling, its vocabulary.

Two layouts are served (docs/sparse.md):

* a sentence-transformers ``SparseEncoder`` folder: ``modules.json`` lists a transformer
  module (``MLMTransformer``, or ``Transformer`` with ``transformer_task: fill-mask`` as
  sentence-transformers 5.4+ writes it) and a ``SpladePooling`` module, whose
  ``config.json`` gives ``pooling_strategy`` (``max`` or ``sum``) and
  ``activation_function`` (``relu``); ``config_sentence_transformers.json`` may state
  prompts;
* a plain Hugging Face SPLADE checkpoint: ``config.json`` names a ``*ForMaskedLM``
  architecture and there is no ``modules.json``; it is read as SPLADE v2 and later are
  (``max`` pooling of ``log1p(relu(logits))``, the SPLADE++ and SPLADE-v3 recipe).

The weight of vocabulary entry ``j`` for a text is ``pool over its tokens t of
log1p(relu(logit[t, j]))``, every token included (special tokens and prompt too; padding
excluded), as ``SpladePooling`` computes it. vLLM 0.32 runs SPLADE on BERT only
(``BertSpladeSparseEmbeddingModel``), so the architecture must be ``BertForMaskedLM``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.models.model_spec import (
    Need,
    architectures,
    model_max_length,
    module_kinds,
    read_json,
    require_fast_tokenizer,
)
from triton_embed_server.models.spec import ModelFolderError

#: The architecture suffix of a masked-language model, the body of every SPLADE model.
MLM_SUFFIX = "ForMaskedLM"
#: The masked-language architectures served (vLLM 0.32's SPLADE model is BERT's).
SERVED_ARCHITECTURES = ("BertForMaskedLM",)
#: ``SpladePooling`` strategies served.
POOLINGS = ("max", "sum")
#: The module types of a served ``SparseEncoder`` pipeline, by class name.
TRANSFORMER_MODULES = ("MLMTransformer", "Transformer")
SPLADE_POOLING = "SpladePooling"
#: The config parameters of a sparse model's spec, in both steps (:meth:`SparseSpec.parameters`).
SPEC_KEYS = ("architecture", "splade_pooling", "vocab_size", "model_max_length")


@dataclass(frozen=True)
class SparseSpec:
    """A sparse model's serving facts.

    Attributes:
        architecture: the ``config.json`` architecture, e.g. ``BertForMaskedLM``.
        pooling: ``max`` or ``sum`` over the text's tokens (``SpladePooling``'s strategy).
        vocab_size: the length of the model's sparse vectors (its vocabulary, ``config.json``).
        max_length: the model's own token budget per text, special tokens included.
    """

    architecture: str
    pooling: str
    vocab_size: int
    max_length: int

    def parameters(self) -> dict[str, str]:
        """The spec as the steps' config parameters (:data:`SPEC_KEYS`).

        What ``repository add`` writes into both steps and the engine step reads back.
        """
        return {
            "architecture": self.architecture,
            "splade_pooling": self.pooling,
            "vocab_size": str(self.vocab_size),
            "model_max_length": str(self.max_length),
        }


def is_sparse_encoder(path: Path) -> bool:
    """Whether a folder is a sparse (SPLADE) model.

    It is when ``modules.json`` lists a ``SpladePooling`` module, or when there is no
    ``modules.json`` and ``config.json`` names a ``*ForMaskedLM`` architecture.

    Raises:
        ModelFolderError: ``config.json`` is missing or not a JSON object, or
            ``modules.json`` is there and unreadable.
    """
    path = Path(path)
    config = read_json(path / "config.json", Need.REQUIRED)
    kinds = [k for k, _ in module_kinds(path)]
    if kinds:
        return SPLADE_POOLING in kinds
    return any(a.endswith(MLM_SUFFIX) for a in architectures(config))


def read_sparse_spec(path: Path) -> SparseSpec:
    """The sparse-model facts of a folder (either layout of the module docstring).

    Raises:
        ModelFolderError: not a sparse model triton-embed serves: no ``tokenizer.json``, an
            architecture other than :data:`SERVED_ARCHITECTURES`, a module other than one
            transformer and one ``SpladePooling``, a pooling other than ``max``/``sum``, an
            activation other than ``relu`` (one line naming the file and what to do).
    """
    path = Path(path)
    file = path / "config.json"
    config = read_json(file, Need.REQUIRED)
    require_fast_tokenizer(path)
    names = architectures(config)
    served = [a for a in names if a in SERVED_ARCHITECTURES]
    if not served:
        raise ModelFolderError(
            f"{file}: architectures {names} are not a sparse model triton-embed serves "
            f"({', '.join(SERVED_ARCHITECTURES)}: vLLM 0.32 runs SPLADE on BERT only)"
        )
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool) or vocab_size < 1:
        raise ModelFolderError(f"{file}: vocab_size must be a whole number >= 1")
    pooling = _splade_pooling(path)
    return SparseSpec(
        architecture=served[0],
        pooling=pooling,
        vocab_size=vocab_size,
        max_length=model_max_length(path, config),
    )


def _splade_pooling(path: Path) -> str:
    """The ``SpladePooling`` module's strategy (``max`` without ``modules.json``).

    Raises:
        ModelFolderError: another module, no or several ``SpladePooling`` modules, or a
            strategy or activation not served.
    """
    kinds = module_kinds(path)
    if not kinds:
        return "max"
    file = path / "modules.json"
    other = [k for k, _ in kinds if k not in (*TRANSFORMER_MODULES, SPLADE_POOLING)]
    if other or [k for k, _ in kinds].count(SPLADE_POOLING) != 1 or len(kinds) != 2:
        found = ", ".join(k for k, _ in kinds)
        raise ModelFolderError(
            f"{file}: modules {found}; a sparse model triton-embed serves has one transformer "
            f"module ({' or '.join(TRANSFORMER_MODULES)}) followed by one {SPLADE_POOLING}"
        )
    if kinds[0][0] not in TRANSFORMER_MODULES or str(kinds[0][1].get("path", "")) != "":
        raise ModelFolderError(
            f'{file}: the first module must be the transformer, at the folder\'s root (path "")'
        )
    pooling_file = path / str(kinds[1][1].get("path", "")) / "config.json"
    pooling_config = read_json(pooling_file, Need.REQUIRED)
    strategy = pooling_config.get("pooling_strategy", "max")
    if strategy not in POOLINGS:
        raise ModelFolderError(
            f"{pooling_file}: pooling_strategy {strategy!r} is not one of {', '.join(POOLINGS)}"
        )
    activation = pooling_config.get("activation_function", "relu")
    if activation != "relu":
        raise ModelFolderError(
            f"{pooling_file}: activation_function {activation!r} is not served (only relu: "
            "log1p(relu(logits)), as vLLM's SPLADE pooler computes)"
        )
    return strategy
