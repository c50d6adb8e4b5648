"""What a model folder says about its embeddings: pooling, normalization, prompts, dimensions.

Read once, by both steps and by ``triton-embed repository add``.

The sources are the files sentence-transformers itself reads (its ``SentenceTransformer``
loader, v2 to v5 formats):

* ``modules.json``: the module pipeline. Supported: one ``Transformer`` (path ``""``), one
  ``Pooling``, optionally one ``Normalize``. A ``Dense`` or any other module is refused
  (vLLM's pooling runner does not apply it, so the vectors would be wrong).
* ``<Pooling path>/config.json``: ``pooling_mode`` (v5: ``"mean"``, ``"cls"``, ``"lasttoken"``)
  or the legacy flags ``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``,
  ``pooling_mode_lasttoken``; ``include_prompt`` (default true); ``word_embedding_dimension``.
* ``config_sentence_transformers.json``: ``prompts`` (name -> text prepended to the input)
  and ``default_prompt_name``.
* ``config.json``: the hidden size, and the Matryoshka dimensions where declared the way vLLM
  reads them (``matryoshka_dimensions``; ``is_matryoshka: true`` alone allows any dimension).
* ``tokenizer.json``: a fast tokenizer must be there (the tokenizer step needs it).

A folder without ``modules.json`` (a plain Hugging Face folder) has no stated pooling: the
operator gives it (``repository add --pooling``, the ``pooling`` model parameter), otherwise
:class:`ModelFolderError` says so. Every error is one line naming the file and what is wrong.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_embed.options import quote

from triton_embed_server.models.model_files import model_max_length

#: Dimensions option meaning "any value from 1 to the full dimension".
ANY_DIMENSIONS = "any"


class ModelFolderError(ValueError):
    """A model folder lacks what serving it needs (one line: the file and what is missing)."""


class Pooling(str, enum.Enum):
    """How token vectors become one vector, in sentence-transformers' names.

    ``mean``: the mean of the token vectors (BERT-family sentence encoders); ``cls``: the first
    token's vector (bge, arctic-embed); ``lasttoken``: the last token's vector, the end-of-text
    token the tokenizer appends (decoder embedders: Qwen3-Embedding, gte-Qwen2, e5-mistral).
    """

    MEAN = "mean"
    CLS = "cls"
    LASTTOKEN = "lasttoken"

    @property
    def vllm(self) -> str:
        """VLLM's ``PoolerConfig.seq_pooling_type`` for this pooling."""
        return {"mean": "MEAN", "cls": "CLS", "lasttoken": "LAST"}[self.value]

    @classmethod
    def parse(cls, value: str, what: str = "pooling") -> Pooling:
        """Parse ``mean`` / ``cls`` / ``lasttoken`` (also ``last``, case-insensitive).

        Raises:
            ValueError: another value (names ``what`` and the allowed values).
        """
        text = str(value).strip().lower()
        text = {"last": "lasttoken", "last_token": "lasttoken", "cls_token": "cls"}.get(text, text)
        try:
            return cls(text)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ValueError(f"{what}={value!r} is not one of {allowed}") from None


# Legacy Pooling config flags (sentence-transformers < 5) and the pooling each selects.
_LEGACY_FLAGS = {
    "pooling_mode_mean_tokens": Pooling.MEAN,
    "pooling_mode_cls_token": Pooling.CLS,
    "pooling_mode_lasttoken": Pooling.LASTTOKEN,
}
_UNSUPPORTED_FLAGS = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


@dataclass(frozen=True)
class PromptSpec:
    """A model's instruction prompts: what the tokenizer step needs to know.

    Attributes:
        prompts: prompt name -> text prepended to the input (may be empty strings).
        default_prompt_name: the prompt applied when a request names none, or ``None``.
        include_prompt: pool over the prompt's tokens too (sentence-transformers'
            ``include_prompt``; false excludes the prompt from mean pooling).
    """

    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    include_prompt: bool = True

    def names(self) -> list[str]:
        """The ``input_type`` values this model accepts (``document`` always)."""
        return sorted({*self.prompts, "document"})

    def prompt(self, input_type: str | None) -> str:
        """The text prepended to an input of this ``input_type`` (``None``: the default).

        Raises:
            ValueError: a name the model has no prompt for (lists the names it has).
        """
        name = input_type if input_type is not None else self.default_prompt_name
        if name is None:
            return ""
        if name in self.prompts:
            return self.prompts[name]
        if name == "document":  # a model without a document prompt embeds documents as is
            return ""
        raise ValueError(
            f"request parameter input_type={quote(name)} is not a prompt of this model; "
            f"its input types are {', '.join(self.names())}"
        )


@dataclass(frozen=True)
class ModelSpec:
    """What one model folder's embeddings are.

    Attributes:
        path: the model folder.
        pooling: how token vectors are pooled.
        prompting: the prompts and whether pooling includes them.
        normalize: the model ends with a ``Normalize`` module (L2 norm 1 vectors).
        dimension: length of the full vector (float32 values).
        max_length: the model's own token budget, special tokens included.
        matryoshka_dimensions: the shorter dimensions the model was trained for (ascending),
            ``None`` when it declares none.
        any_dimensions: every dimension from 1 to ``dimension`` is allowed.
    """

    path: Path
    pooling: Pooling
    prompting: PromptSpec
    normalize: bool
    dimension: int
    max_length: int
    matryoshka_dimensions: tuple[int, ...] | None = None
    any_dimensions: bool = False

    def allowed_dimensions(self) -> str:
        """The dimensions a request may ask for, in words (for error messages)."""
        if self.any_dimensions:
            return f"any value from 1 to {self.dimension}"
        dims = sorted({*(self.matryoshka_dimensions or ()), self.dimension})
        return ", ".join(str(d) for d in dims)

    def check_dimensions(self, dimensions: int) -> None:
        """Raise ``ValueError`` unless a request may cut vectors to ``dimensions`` values."""
        ok = (
            1 <= dimensions <= self.dimension
            if self.any_dimensions
            else dimensions == self.dimension or dimensions in (self.matryoshka_dimensions or ())
        )
        if not ok:
            raise ValueError(
                f"request parameter dimensions={quote(dimensions)} is not a dimension of this "
                f"model; allowed: {self.allowed_dimensions()}"
            )

    def describe(self) -> dict[str, Any]:
        """A JSON-ready summary (``repository list``, the gateway's model list)."""
        return {
            "model_path": str(self.path),
            "pooling": self.pooling.value,
            "include_prompt": self.prompting.include_prompt,
            "normalize": self.normalize,
            "dimension": self.dimension,
            "max_length": self.max_length,
            "prompts": sorted(self.prompting.prompts),
            "default_prompt_name": self.prompting.default_prompt_name,
            "dimensions": ANY_DIMENSIONS
            if self.any_dimensions
            else list(self.matryoshka_dimensions or ()),
        }


def read_model_spec(
    path: Path,
    *,
    pooling: str = "",
    normalize: str = "",
    dimensions: str = "",
) -> ModelSpec:
    """Read a model folder's embedding spec, with the operator's overrides.

    Args:
        path: a local model folder (``config.json``, ``tokenizer.json``, weights).
        pooling: ``""`` (the folder's ``Pooling`` module), or ``mean``/``cls``/``lasttoken``.
        normalize: ``""`` (the folder: a ``Normalize`` module or not; ``true`` without
            sentence-transformers files), ``true`` or ``false``.
        dimensions: ``""`` (the folder's ``config.json``), :data:`ANY_DIMENSIONS`, or a
            comma-separated list of allowed shorter dimensions, e.g. ``"64,128,256"``.

    Raises:
        ModelFolderError: a file is missing, unreadable or states something unsupported,
            or no pooling is stated anywhere (one line, naming the file).
        ValueError: an override is malformed (names the option).
    """
    path = Path(path)
    config = _json(path / "config.json", required=True)
    if not (path / "tokenizer.json").is_file():
        raise ModelFolderError(
            f"{path / 'tokenizer.json'}: missing; the tokenizer step needs a fast (Rust) "
            "tokenizer file (save one with AutoTokenizer.from_pretrained(...).save_pretrained)"
        )
    modules = _modules(path)
    pooling_config: dict[str, Any] = {}
    normalize_module = False
    if modules is not None:
        pooling_dir, normalize_module = _pipeline(path, modules)
        pooling_config = _json(pooling_dir / "config.json", required=True)
    if pooling:
        chosen = Pooling.parse(pooling)
    elif pooling_config:
        chosen = _pooling_from_config(pooling_dir / "config.json", pooling_config)
    else:
        raise ModelFolderError(
            f"{path / 'modules.json'}: missing, so the folder states no pooling; give one "
            "(repository add --pooling mean|cls|lasttoken, or the pooling model parameter)"
        )
    norm = _flag(normalize, "normalize") if normalize else (normalize_module or modules is None)
    dimension = _dimension(path, config, pooling_config)
    matryoshka, any_dims = _matryoshka(path, config, dimension, dimensions)
    return ModelSpec(
        path=path,
        pooling=chosen,
        prompting=_prompting(path, pooling_config),
        normalize=norm,
        dimension=dimension,
        max_length=model_max_length(path),
        matryoshka_dimensions=matryoshka,
        any_dimensions=any_dims,
    )


def read_prompt_spec(path: Path) -> PromptSpec:
    """Read a model folder's prompts and ``include_prompt`` (no pooling needed).

    Raises:
        ModelFolderError: as :func:`read_model_spec`, for these files.
    """
    path = Path(path)
    modules = _modules(path)
    pooling_config: dict[str, Any] = {}
    if modules is not None:
        pooling_dir, _ = _pipeline(path, modules)
        pooling_config = _json(pooling_dir / "config.json", required=True)
    return _prompting(path, pooling_config)


def _prompting(path: Path, pooling_config: dict[str, Any]) -> PromptSpec:
    where = path / "config_sentence_transformers.json"
    st_config = _json(where, required=False)
    prompts = st_config.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ModelFolderError(f"{where}: prompts must be an object of name -> text")
    default_name = st_config.get("default_prompt_name")
    if default_name is not None and default_name not in prompts:
        raise ModelFolderError(
            f"{where}: default_prompt_name {default_name!r} is not one of its prompts"
        )
    return PromptSpec(
        prompts=dict(prompts),
        default_prompt_name=default_name,
        include_prompt=bool(pooling_config.get("include_prompt", True)),
    )


def _json(path: Path, required: bool) -> dict[str, Any]:
    if not path.is_file():
        if required:
            raise ModelFolderError(f"{path}: missing")
        return {}
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ModelFolderError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _modules(path: Path) -> list[dict[str, Any]] | None:
    file = path / "modules.json"
    if not file.is_file():
        return None
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(value, list) or not all(isinstance(m, dict) for m in value):
        raise ModelFolderError(f"{file}: expected a list of module objects")
    return value


def _pipeline(path: Path, modules: list[dict[str, Any]]) -> tuple[Path, bool]:
    """The Pooling module's folder and whether a Normalize module follows; refuse the rest."""
    file = path / "modules.json"
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    unsupported = [k for k in kinds if k not in ("Transformer", "Pooling", "Normalize")]
    if unsupported:
        raise ModelFolderError(
            f"{file}: module {unsupported[0]!r} is not supported (served: Transformer, "
            "Pooling, Normalize); the vectors would differ from the model's"
        )
    if kinds.count("Pooling") != 1:
        raise ModelFolderError(
            f"{file}: expected one Pooling module, found {kinds.count('Pooling')}"
        )
    pooling = modules[kinds.index("Pooling")]
    return path / str(pooling.get("path", "")), "Normalize" in kinds


def _pooling_from_config(file: Path, config: dict[str, Any]) -> Pooling:
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        try:
            return Pooling.parse(mode, f"{file}: pooling_mode")
        except ValueError as exc:
            raise ModelFolderError(f"{exc}; other poolings are not supported") from None
    chosen = [p for flag, p in _LEGACY_FLAGS.items() if config.get(flag)]
    other = [flag for flag in _UNSUPPORTED_FLAGS if config.get(flag)]
    if other or len(chosen) != 1:
        found = ", ".join([*(f for f in _LEGACY_FLAGS if config.get(f)), *other]) or "none"
        raise ModelFolderError(
            f"{file}: exactly one of pooling_mode_mean_tokens, pooling_mode_cls_token, "
            f"pooling_mode_lasttoken must be true (found: {found})"
        )
    return chosen[0]


def _dimension(path: Path, config: dict[str, Any], pooling_config: dict[str, Any]) -> int:
    for value in (pooling_config.get("word_embedding_dimension"), config.get("hidden_size")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise ModelFolderError(
        f"{path / 'config.json'}: no hidden_size (and no Pooling word_embedding_dimension)"
    )


def _matryoshka(
    path: Path, config: dict[str, Any], dimension: int, option: str
) -> tuple[tuple[int, ...] | None, bool]:
    if option.strip().lower() == ANY_DIMENSIONS:
        return None, True
    if option.strip():
        dims = _dimension_list(option.split(","), "dimensions", dimension)
        return dims, False
    declared = config.get("matryoshka_dimensions")
    if declared is not None:
        if not isinstance(declared, list):
            raise ModelFolderError(f"{path / 'config.json'}: matryoshka_dimensions must be a list")
        try:
            return _dimension_list(declared, "matryoshka_dimensions", dimension), False
        except ValueError as exc:
            raise ModelFolderError(f"{path / 'config.json'}: {exc}") from None
    return None, bool(config.get("is_matryoshka", False))


def _dimension_list(values: list[Any], what: str, dimension: int) -> tuple[int, ...]:
    dims = []
    for raw in values:
        try:
            value = int(str(raw).strip())
        except ValueError:
            raise ValueError(f"{what}: {raw!r} is not an integer") from None
        if not 1 <= value <= dimension:
            raise ValueError(f"{what}: {value} is outside 1..{dimension} (the full dimension)")
        dims.append(value)
    return tuple(sorted(set(dims)))


def _flag(value: str, what: str) -> bool:
    text = value.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ValueError(f"{what}={value!r} must be true or false")
