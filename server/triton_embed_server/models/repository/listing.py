"""``repository list``: the embedding models and rerankers of a repository, as their folders say."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.models.instance_group import (
    instance_count,
    instance_kind,
    read_config_pbtxt,
)
from triton_embed_server.models.model_files import resolve_model_path
from triton_embed_server.models.model_spec import (
    quantization_of,
    read_model_spec,
    read_prompt_spec,
)
from triton_embed_server.models.repository.layout import KIND_STEPS, ensembles, our_steps
from triton_embed_server.models.repository.names import RepositoryError, step_names
from triton_embed_server.models.spec import SpecParameters
from triton_embed_server.steps.config import EmbedderConfig, model_parameters
from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
from triton_embed_server.steps.multivector_config import TokenEncoderConfig
from triton_embed_server.steps.rerank_config import ScorerConfig
from triton_embed_server.steps.sparse_config import SparseEncoderConfig


@dataclass(frozen=True)
class ListedModel:
    """One embedding model of a repository, as ``repository list`` shows it.

    Attributes:
        name: the ensemble.
        steps: its step models, tokenizer first when known.
        kind: ``embedding``, ``reranker``, ``sparse``, ``multivector`` or ``hybrid``.
        model_path: the ``model_path`` parameter as written (``None`` when unreadable).
        device: ``cpu`` or ``gpu``: the kind of the embedder's ``instance_group``.
        instances: embedder instances (per GPU on ``gpu``).
        dtype: the embedder's ``dtype`` parameter as written (the server may run float32
            for ``bfloat16`` on CPUs without bfloat16 instructions; it logs why).
        quantization: ``int8`` for a compressed-tensors int8 folder (``triton-embed
            quantize``), ``none`` for float weights.
        max_length: the token budget per text in effect (the model's own when configured 0).
        spec: :meth:`~triton_embed_server.models.spec.ModelSpec.describe` of the folder, plus
            ``allowed_dimensions`` (in words); a reranker's: its family, architecture,
            activation and segments (:meth:`~triton_embed_server.models.reranker_spec.
            RerankerSpec.parameters`); a sparse model's: its architecture, pooling,
            vocabulary, default top-k and token budget
            (:meth:`~triton_embed_server.models.sparse_spec.SparseSpec.parameters`), plus
            its ``prompts`` (names); a multi-vector model's: its layout, dimension, lengths
            and markers (:meth:`~triton_embed_server.models.multivector_spec.
            MultiVectorSpec.parameters`).
        error: why the model cannot be served as it stands, or ``None``.
    """

    name: str
    steps: tuple[str, ...]
    kind: str = "embedding"
    model_path: str | None = None
    device: str | None = None
    instances: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    max_length: int | None = None
    spec: dict[str, Any] | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (``repository list --json``)."""
        out = asdict(self)
        out["steps"] = list(self.steps)
        return out


def list_models(repository: Path) -> list[ListedModel]:
    """The embedding models of ``repository``, by name.

    An ensemble is listed when its steps are our tokenizer and embedder, or when it has the
    step names ``repository add`` gives but they are missing or broken (then with its error).
    A model whose folder cannot be served is listed with the error, not raised.

    Raises:
        RepositoryError: ``repository`` is not a folder.
    """
    repository = Path(repository)
    if not repository.is_dir():
        raise RepositoryError(f"--repository {repository}: no such folder")
    out = []
    for name, steps in ensembles(repository).items():
        try:
            kind, tokenizer, embedder = our_steps(repository, name, steps)
        except RepositoryError as exc:
            if tuple(steps) in {step_names(name, kind) for kind in KIND_STEPS}:
                out.append(ListedModel(name=name, steps=tuple(steps), error=str(exc)))
            continue
        out.append(_describe(repository, name, kind, tokenizer, embedder))
    return out


def _describe(repository: Path, name: str, kind: str, tokenizer: str, embedder: str) -> ListedModel:
    listed = ListedModel(name=name, steps=(tokenizer, embedder), kind=kind)
    try:
        tok = read_config_pbtxt(repository / tokenizer / "config.pbtxt")
        emb = read_config_pbtxt(repository / embedder / "config.pbtxt")
    except (OSError, ValueError) as exc:
        return _with(listed, error=str(exc))
    tok_params, params = model_parameters(tok), model_parameters(emb)
    listed = _with(
        listed,
        model_path=params.get("model_path", ""),
        device=instance_kind(emb).removeprefix("KIND_").lower(),
        instances=instance_count(emb).per_device,
        dtype=params.get("dtype") or EmbedderConfig.dtype,
    )
    for key in ("model_path", "max_length"):
        if tok_params.get(key, "") != params.get(key, ""):
            return _with(
                listed,
                error=f"the steps' {key} parameters differ ({tokenizer}: "
                f"{tok_params.get(key, '')!r}, {embedder}: {params.get(key, '')!r}); "
                "they must be equal",
            )
    if kind == "reranker":
        try:
            folder = resolve_model_path(params.get("model_path", ""), repository)
            config = ScorerConfig.from_model_config(emb, repository)
        except (OSError, ValueError) as exc:
            return _with(listed, error=str(exc))
        spec = config.spec
        assert spec is not None  # noqa: S101 - ScorerConfig always reads it
        return _with(
            listed,
            quantization=quantization_of(folder),
            max_length=config.max_length,
            spec=spec.parameters(),
        )
    if kind in ("multivector", "hybrid"):
        config_class = TokenEncoderConfig if kind == "multivector" else HybridEncoderConfig
        try:
            folder = resolve_model_path(params.get("model_path", ""), repository)
            config = config_class.from_model_config(emb, repository)
        except (OSError, ValueError) as exc:
            return _with(listed, error=str(exc))
        assert config.spec is not None  # noqa: S101 - both configs always read it
        return _with(
            listed,
            quantization=quantization_of(folder),
            max_length=config.max_length,
            spec=config.spec.parameters(),
        )
    if kind == "sparse":
        try:
            folder = resolve_model_path(params.get("model_path", ""), repository)
            config = SparseEncoderConfig.from_model_config(emb, repository)
            prompts = read_prompt_spec(folder).prompts
        except (OSError, ValueError) as exc:
            return _with(listed, error=str(exc))
        assert config.spec is not None  # noqa: S101 - SparseEncoderConfig always reads it
        return _with(
            listed,
            quantization=quantization_of(folder),
            max_length=config.max_length,
            spec={**config.spec.parameters(), "prompts": sorted(prompts)},
        )
    try:
        folder = resolve_model_path(params.get("model_path", ""), repository)
        spec = read_model_spec(folder, SpecParameters.parse(params, "parameter "))
        max_length = int(params.get("max_length") or 0) or spec.max_length
    except (OSError, ValueError) as exc:
        return _with(listed, error=str(exc))
    described = {**spec.describe(), "allowed_dimensions": spec.allowed_dimensions()}
    return _with(
        listed, quantization=quantization_of(folder), max_length=max_length, spec=described
    )


def _with(listed: ListedModel, **changes: Any) -> ListedModel:
    return ListedModel(**{**asdict(listed), **changes})


def format_table(models: list[ListedModel]) -> str:
    """``repository list`` as a text table, one model per line (an error replaces columns)."""
    header = (
        "NAME",
        "KIND",
        "DEVICE",
        "DTYPE",
        "QUANTIZATION",
        "INSTANCES",
        "DIM",
        "POOLING",
        "NORMALIZE",
        "DIMENSIONS",
    )
    header += ("MAX_LENGTH", "PROMPTS", "STEPS", "MODEL_PATH")
    rows = []
    for m in models:
        steps = ",".join(m.steps)
        if m.error is not None or m.spec is None:
            rows.append((m.name, f"error: {m.error}"))
            continue
        s = m.spec
        common = (
            m.name,
            m.kind,
            str(m.device),
            str(m.dtype),
            str(m.quantization),
            str(m.instances),
        )
        if m.kind == "reranker":
            family = f"{s['family']} ({s['activation']})"
            rows.append(
                (*common, "-", family, "-", "-", str(m.max_length), "-", steps, str(m.model_path))
            )
            continue
        if m.kind == "multivector":
            skipped = len([i for i in s.get("skiplist", "").split(",") if i])
            layout = f"tokens {s['multivector_layout']}" + f" skip={skipped}" * bool(skipped)
            rows.append(
                (*common, s["dim"], layout, "-", "-", str(m.max_length), "query,document", steps)
                + (str(m.model_path),)
            )
            continue
        if m.kind == "hybrid":
            heads = f"dense,sparse,colbert {s['colbert_dim']}"
            rows.append(
                (*common, s["dim"], heads, "true", "-", str(m.max_length), "-", steps)
                + (str(m.model_path),)
            )
            continue
        if m.kind == "sparse":
            pooling = f"splade {s['splade_pooling']}"
            prompts = ",".join(s["prompts"]) or "-"
            rows.append(
                (*common, s["vocab_size"], pooling, "-", "-", str(m.max_length), prompts, steps)
                + (str(m.model_path),)
            )
            continue
        dims = s["dimensions"]
        allowed = "any" if dims == "any" else ",".join(map(str, sorted({*dims, s["dimension"]})))
        rows.append(
            (
                *common,
                str(s["dimension"]),
                s["pooling"],
                str(s["normalize"]).lower(),
                allowed,
                str(m.max_length),
                ",".join(s["prompts"]) or "-",
                steps,
                str(m.model_path),
            )
        )
    full = [r for r in [header, *rows] if len(r) == len(header)]
    widths = [max(len(r[i]) for r in full) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        if len(row) != len(header):
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]}")
        else:
            lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)
