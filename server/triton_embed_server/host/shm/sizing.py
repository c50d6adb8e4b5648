"""Shared memory of the Python-backend stubs: sized from the model configs, checked at start.

Every Python-backend model instance (``tokenizer``, ``embedder``) is a stub process that
exchanges tensors with ``tritonserver`` through one POSIX shared-memory region in
``/dev/shm``. What the backend does with it (python_backend r24.10, the branch of Triton
2.51; https://github.com/triton-inference-server/python_backend):

* ``src/stub_launcher.cc``: tritonserver creates one region per stub, named
  ``shm-region-prefix-name`` plus a random suffix (default prefix
  ``triton_python_backend_shm_region_``), at ``shm-default-byte-size`` bytes; it is
  removed when the instance is unloaded.
* ``src/python_be.cc`` (``TRITONBACKEND_Initialize``): the defaults are 1 MiB for
  ``shm-default-byte-size`` (which may not be smaller) and 1 MiB for
  ``shm-growth-byte-size`` (which must be > 0); both are set with
  ``--backend-config=python,<key>=<value>`` (README, "Managing Shared Memory").
* ``src/python_be.cc`` (``ProcessRequests``): the inputs of every request of one
  ``execute`` call are copied into the region before the stub runs, and the stub writes
  its output tensors there (``src/pb_tensor.cc``: a BYTES tensor as ``serialize_byte_tensor``
  makes it) before the server copies them into the responses: one call's inputs and
  outputs live in the region together, beside the request and response objects.
* ``src/shm_manager.cc``: the region is a Boost.Interprocess ``shared_memory_object``
  sized with ``truncate``, which calls ``posix_fallocate``: every page of the region is
  charged to ``/dev/shm`` when the stub starts (measured: ``st_blocks * 512`` equals the
  region's size right after start), and a ``/dev/shm`` without room fails the model's load
  ("Unable to initialize shared memory key ..."). An allocation that does not fit grows
  the region by ``growth * (n // growth + 1)`` bytes (``GrowIfNeeded``; without room the
  request fails: "Failed to increase the shared memory pool size ..."); a region never
  shrinks.

The sizes, from the configs the server loads (``<model>/configs/<name>.pbtxt`` with
``--model-config-name <name>`` when the model has it, else ``<model>/config.pbtxt``). A
BYTES element is a 4-byte length followed by its bytes (Triton's tensor format); ``B`` is
the model's ``max_batch_size``, the most elements one ``execute`` call receives:

* ``tokenizer``: inputs ``B * (4 + 4 * max_chars)`` (``TEXT``; UTF-8 takes at most 4
  bytes per character, RFC 3629); outputs ``B * (4 + 4 * max_length)`` (``TOKEN_IDS``,
  int32) plus ``B * 4`` (``NUM_TOKENS``). ``max_length`` and ``max_chars`` are parsed by
  :class:`~triton_embed_server.steps.config.TokenizerConfig`.
* ``embedder``: inputs ``B * (4 + 4 * max_length)`` (``TOKEN_IDS``); outputs
  ``B * (4 + 4 * dim)`` (``EMBEDDING``, float32), ``dim`` from the model folder
  (the embedder config's spec, :mod:`triton_embed_server.models.spec`).
* a reranker's ``pair_tokenizer``: inputs ``2 * B * (4 + 4 * max_chars)`` (``QUERY``,
  ``DOCUMENT``); outputs as the tokenizer's plus ``B * 4`` (``SEGMENT_START``);
  ``scorer``: inputs ``B * (4 + 4 * max_length) + B * 4``; outputs ``B * 4`` (``SCORE``).
* a sparse model's ``sparse_encoder``: inputs ``B * (4 + 4 * max_length)``
  (``TOKEN_IDS``); outputs ``B * (4 + 8 * vocab_size)`` (``SPARSE``: an int32 index and a
  float32 weight per non-zero entry, every entry at most; 15.6 MB for 64 texts of a
  30,522-entry BERT vocabulary). Its tokenizer is the ``tokenizer``.
* a multi-vector model's ``token_encoder``: inputs as the sparse encoder's; outputs
  ``B * (4 + 4 * max_length * dim)`` (``TOKEN_EMBEDDINGS``: every text at its full length;
  5.9 MB for 64 texts of 180 tokens of a 128-value ColBERT vector) and ``B * 4``
  (``NUM_TOKENS``, the rows of each matrix).
* a hybrid (BGE-M3) model's ``hybrid_encoder``: inputs as the sparse encoder's; outputs
  ``B * (4 + 4 * dim)`` (``EMBEDDING``), ``B * (4 + 8 * max_length)`` (``SPARSE``: one
  entry per token ID at most) and ``B * (4 + 4 * (max_length - 1) * colbert_dim)``
  (``TOKEN_EMBEDDINGS``), every head asked for.
* any other Python-backend model: no bound is known; it is counted at the backend's
  default region (1 MiB).

A step is known by its ``1/model.py`` adapter
(:func:`~triton_embed_server.models.repository.layout.step_kind`), so the steps ``repository
add`` writes (``NAME_tokenizer``, ``NAME_embedder``, ``NAME_scorer``) are sized as the
shipped ones.

Per model, a stub's region needs ``round_up_MiB(1 MiB + B * 4 KiB + 1.25 * (inputs +
outputs))``: the backend's own 1 MiB (its message queues and control block), 4 KiB per
request for the request and response objects (tensor names, shapes, parameters; every
element may be its own request), and a quarter more for the allocator's headers and
fragmentation. The 4 KiB and the quarter are margins chosen on the safe side, not
measured bounds; measured on the shipped repository with the backend's 1 MiB default, the
largest tokenizer call (64 texts of 16,384 four-byte characters) grew its region to 6 MiB
and the largest embedder call (256 x 256 token IDs) fit in 1 MiB, against 7 and 3 MiB
here. The ``python`` backend settings (one for all its models) are:

* ``shm-default-byte-size``: the largest region a model needs, so that the largest
  request the configs allow never grows a region;
* ``shm-growth-byte-size``: the largest single tensor, rounded up to MiB, so that a
  request beyond the configs (a text over ``max_chars`` is copied in before it is cut)
  grows a region once rather than in 1 MiB steps.

``/dev/shm`` must then hold, for every stub, ``max(shm-default-byte-size, region)`` of its
model, plus that again for the model whose stubs hold the most: the supervisor reloads a
model by starting its new instances before the old ones exit. With the computed default
that is ``(all stubs + the most stubs of one model) * shm-default-byte-size``. ``stubs`` is
the ``instance_group`` total (:func:`~triton_embed_server.models.instance_group.instance_count`),
``count`` on each visible GPU for a ``KIND_GPU`` group without a ``gpus`` list.
:func:`plan_repository` plans one repository, :func:`plan_arguments` those tritonserver
arguments name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triton_embed_server.host.shm.tritonserver_args import (
    BACKEND,
    DEFAULT_KEY,
    GROWTH_KEY,
    config_name,
    python_backend_settings,
    repository_paths,
)
from triton_embed_server.host.units import MIB, mib
from triton_embed_server.models.instance_group import instance_count, read_config_pbtxt

BACKEND_DEFAULT_BYTES = 1 * MIB  # python_be.cc: default and minimum shm-default-byte-size
LENGTH_PREFIX = 4  # bytes before each element of a BYTES tensor
UTF8_MAX = 4  # bytes per character, at most (RFC 3629)
INT32 = 4
FLOAT32 = 4
REQUEST_OVERHEAD = 4 * 1024  # request + response objects of one request, at most
FRAGMENTATION = 1.25  # allocator headers and fragmentation


def round_up(n: float, unit: int = MIB) -> int:
    """``n`` rounded up to a multiple of ``unit``."""
    return int(math.ceil(n / unit)) * unit


@dataclass(frozen=True)
class StepSize:
    """What one Python-backend model's stubs hold in shared memory.

    Attributes:
        model: the model folder's name.
        max_batch_size: elements one ``execute`` call receives at most (1 without batching).
        stubs: the model's stub processes.
        tensors: the largest input and output tensors of one call, ``{name: bytes}``
            (empty for a model whose bounds are unknown).
        inputs: the bytes of the call's inputs.
    """

    model: str
    max_batch_size: int
    stubs: int
    tensors: dict[str, int]
    inputs: int

    @property
    def io_bytes(self) -> int:
        """Inputs and outputs of the largest ``execute`` call."""
        return sum(self.tensors.values())

    @property
    def region_bytes(self) -> int:
        """What one stub's region needs (module docstring); the backend default if unknown."""
        if not self.tensors:
            return BACKEND_DEFAULT_BYTES
        return round_up(
            BACKEND_DEFAULT_BYTES
            + self.max_batch_size * REQUEST_OVERHEAD
            + FRAGMENTATION * self.io_bytes
        )

    def describe(self) -> str:
        """One line: the model, its stubs, its largest call and its region."""
        if not self.tensors:
            return (
                f"{self.model}: {self.stubs} stub(s), sizes unknown, counted at "
                f"{mib(self.region_bytes)} each"
            )
        outputs = self.io_bytes - self.inputs
        return (
            f"{self.model}: {self.stubs} stub(s); largest call {self.max_batch_size} elements, "
            f"inputs {self.inputs} B + outputs {outputs} B; needs {mib(self.region_bytes)}"
        )


@dataclass(frozen=True)
class ShmPlan:
    """The shared memory of one server: the backend settings and what ``/dev/shm`` must hold.

    Attributes:
        repositories: the model repositories.
        steps: their Python-backend models.
    """

    repositories: tuple[Path, ...]
    steps: tuple[StepSize, ...]

    @property
    def default_byte_size(self) -> int:
        """``shm-default-byte-size``: the largest region a model needs."""
        return max([BACKEND_DEFAULT_BYTES, *(s.region_bytes for s in self.steps)])

    @property
    def growth_byte_size(self) -> int:
        """``shm-growth-byte-size``: the largest single tensor, rounded up to MiB."""
        largest = [n for s in self.steps for n in s.tensors.values()]
        return max(BACKEND_DEFAULT_BYTES, round_up(max(largest, default=0)))

    def stub_bytes(self, default_byte_size: int | None = None) -> dict[str, int]:
        """What one stub of each model holds: its region at start, or what it grows to.

        Args:
            default_byte_size: the ``shm-default-byte-size`` the server runs with (None: the
                computed one).
        """
        default = self.default_byte_size if default_byte_size is None else default_byte_size
        return {s.model: max(default, s.region_bytes) for s in self.steps}

    def reload_bytes(self, default_byte_size: int | None = None) -> int:
        """The stubs of the model that holds the most, again: a reload runs old and new at once."""
        each = self.stub_bytes(default_byte_size)
        return max((s.stubs * each[s.model] for s in self.steps), default=0)

    def needed_bytes(self, default_byte_size: int | None = None) -> int:
        """What ``/dev/shm`` must hold for every stub of this server (module docstring).

        Args:
            default_byte_size: the ``shm-default-byte-size`` the server runs with (None: the
                computed one).
        """
        each = self.stub_bytes(default_byte_size)
        return sum(s.stubs * each[s.model] for s in self.steps) + self.reload_bytes(
            default_byte_size
        )

    def settings(self) -> dict[str, int]:
        """``{shm-default-byte-size: ..., shm-growth-byte-size: ...}``."""
        return {DEFAULT_KEY: self.default_byte_size, GROWTH_KEY: self.growth_byte_size}

    def backend_config_args(self, given: Sequence[str] = ()) -> list[str]:
        """The ``--backend-config=python,<key>=<bytes>`` arguments ``given`` does not set."""
        present = python_backend_settings(given)
        return [
            f"--backend-config={BACKEND},{key}={value}"
            for key, value in self.settings().items()
            if key not in present
        ]

    def describe(self, default_byte_size: int | None = None) -> str:
        """Lines for logs and the CLI: each model, the settings and the total."""
        each = self.stub_bytes(default_byte_size)
        parts = ", ".join(f"{s.stubs} {s.model} x {mib(each[s.model])}" for s in self.steps)
        return "\n".join(
            [
                *(s.describe() for s in self.steps),
                f"python backend: {DEFAULT_KEY}={self.default_byte_size} "
                f"{GROWTH_KEY}={self.growth_byte_size}",
                f"/dev/shm needed: {mib(self.needed_bytes(default_byte_size))} (stubs: {parts}; "
                f"+ {mib(self.reload_bytes(default_byte_size))} while a model reloads)",
            ]
        )


def model_config_path(folder: Path, config_name: str | None) -> Path:
    """The config Triton loads for a model: ``configs/<name>.pbtxt`` if present, else default."""
    if config_name:
        custom = folder / "configs" / f"{config_name}.pbtxt"
        if custom.is_file():
            return custom
    return folder / "config.pbtxt"


def visible_gpu_count() -> int | None:
    """GPUs the CUDA driver shows this process (``CUDA_VISIBLE_DEVICES`` applies); None if none.

    Asks ``libcuda`` (``cuInit``, ``cuDeviceGetCount``), as Triton does; None when there is
    no driver.
    """
    import ctypes

    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    if cuda.cuInit(0) != 0:
        return None
    count = ctypes.c_int(0)
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    return count.value


def step_size(
    name: str,
    config: dict[str, Any],
    repository: Path,
    gpus: int | None = None,
    kind: str | None = None,
) -> StepSize | None:
    """The shared memory of one model (None: not a Python-backend model).

    Args:
        name: the model folder's name.
        config: its config.
        repository: the model repository.
        gpus: GPUs the server sees (for ``KIND_GPU`` counts).
        kind: which of this project's steps it is (``tokenizer``, ``embedder``,
            ``pair_tokenizer``, ``scorer``, ``sparse_encoder``, ``token_encoder``,
            ``hybrid_encoder``: its
            ``1/model.py``
            adapter); None: by the
            shipped names ``tokenizer`` and ``embedder``.

    Raises:
        ValueError: a parameter the sizes depend on is invalid, or the model folder does not
            tell the embedding dimension.
    """
    from triton_embed_server.steps.config import EmbedderConfig, TokenizerConfig
    from triton_embed_server.steps.rerank_config import PairTokenizerConfig, ScorerConfig

    if config.get("backend") != BACKEND:
        return None
    batch = max(1, int(config.get("max_batch_size") or 0))
    stubs = instance_count(config, gpus).total
    kind = kind or name
    if kind == "tokenizer":
        tok = TokenizerConfig.from_model_config(config, repository)
        tensors = {
            "TEXT": batch * (LENGTH_PREFIX + UTF8_MAX * tok.max_chars),
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * tok.max_length),
            "NUM_TOKENS": batch * INT32,
        }
        return StepSize(name, batch, stubs, tensors, tensors["TEXT"])
    if kind == "embedder":
        emb = EmbedderConfig.from_model_config(config, repository)
        dim = emb.dimension
        tensors = {
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * emb.max_length),
            "EMBEDDING": batch * (LENGTH_PREFIX + FLOAT32 * dim),
        }
        return StepSize(name, batch, stubs, tensors, tensors["TOKEN_IDS"])
    if kind == "pair_tokenizer":
        pair = PairTokenizerConfig.from_model_config(config, repository)
        text = batch * (LENGTH_PREFIX + UTF8_MAX * pair.max_chars)
        tensors = {
            "QUERY": text,
            "DOCUMENT": text,
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * pair.max_length),
            "SEGMENT_START": batch * INT32,
            "NUM_TOKENS": batch * INT32,
        }
        return StepSize(name, batch, stubs, tensors, 2 * text)
    if kind == "scorer":
        scorer = ScorerConfig.from_model_config(config, repository)
        tensors = {
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * scorer.max_length),
            "SEGMENT_START": batch * INT32,
            "SCORE": batch * FLOAT32,
        }
        return StepSize(name, batch, stubs, tensors, tensors["TOKEN_IDS"] + batch * INT32)
    if kind == "sparse_encoder":
        from triton_embed_server.steps.sparse_config import SparseEncoderConfig

        sparse = SparseEncoderConfig.from_model_config(config, repository)
        assert sparse.spec is not None  # noqa: S101 - SparseEncoderConfig always reads it
        tensors = {
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * sparse.max_length),
            "SPARSE": batch * (LENGTH_PREFIX + (INT32 + FLOAT32) * sparse.spec.vocab_size),
        }
        return StepSize(name, batch, stubs, tensors, tensors["TOKEN_IDS"])
    if kind == "token_encoder":
        from triton_embed_server.steps.multivector_config import TokenEncoderConfig

        tokens = TokenEncoderConfig.from_model_config(config, repository)
        tensors = {
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * tokens.max_length),
            # Every text of the batch at max_length rows (several requests may share a batch,
            # each under its own max_response_bytes).
            "TOKEN_EMBEDDINGS": batch
            * (LENGTH_PREFIX + FLOAT32 * tokens.max_length * tokens.spec.dim),
            "NUM_TOKENS": batch * INT32,  # the rows of each matrix
        }
        return StepSize(name, batch, stubs, tensors, tensors["TOKEN_IDS"])
    if kind == "hybrid_encoder":
        from triton_embed_server.steps.hybrid_config import HybridEncoderConfig

        hybrid = HybridEncoderConfig.from_model_config(config, repository)
        rows = hybrid.max_length
        tensors = {
            "TOKEN_IDS": batch * (LENGTH_PREFIX + INT32 * rows),
            "EMBEDDING": batch * (LENGTH_PREFIX + FLOAT32 * hybrid.spec.dim),
            # At most one entry per token (the weight per token ID).
            "SPARSE": batch * (LENGTH_PREFIX + (INT32 + FLOAT32) * rows),
            "TOKEN_EMBEDDINGS": batch
            * (LENGTH_PREFIX + FLOAT32 * (rows - 1) * hybrid.spec.colbert_dim),
        }
        return StepSize(name, batch, stubs, tensors, tensors["TOKEN_IDS"])
    return StepSize(name, batch, stubs, {}, 0)


def plan_repository(
    repository: Path,
    config_name: str | None = None,
    gpus: int | None = None,
    gpu_counter: Callable[[], int | None] = visible_gpu_count,
) -> ShmPlan:
    """The shared-memory plan of a model repository.

    Args:
        repository: the model repository.
        config_name: ``--model-config-name``, if given.
        gpus: GPUs the server sees; None asks ``gpu_counter`` when a ``KIND_GPU`` group
            without a ``gpus`` list needs it (no answer: one GPU, a lower bound).
        gpu_counter: counts the visible GPUs (tests pass a fake).

    Raises:
        OSError: the repository or a config cannot be read.
        ValueError: a config is not a Triton model config, or a parameter is invalid.
    """
    repository = Path(repository)
    configs = {}
    for folder in sorted(p for p in repository.iterdir() if p.is_dir()):
        path = model_config_path(folder, config_name)
        if path.is_file():
            configs[folder.name] = read_config_pbtxt(path)
    if gpus is None and any(
        g.get("kind") == "KIND_GPU" and not g.get("gpus")
        for c in configs.values()
        if c.get("backend") == BACKEND
        for g in c.get("instance_group") or []
    ):
        gpus = gpu_counter()
    from triton_embed_server.models.repository.layout import step_kind

    steps = []
    for name, config in configs.items():
        try:
            step = step_size(name, config, repository, gpus, step_kind(repository / name))
        except ValueError as exc:
            raise ValueError(f"{repository / name}: {exc}") from None
        if step is not None:
            steps.append(step)
    return ShmPlan((repository,), tuple(steps))


def plan_arguments(args: Sequence[str], gpus: int | None = None) -> ShmPlan:
    """The plan of the repositories and config name given in tritonserver arguments.

    Every ``--model-repository`` (tritonserver serves them all; ``--model-store`` is its old
    name); the last ``--model-config-name``.

    Raises:
        OSError: a repository or a config cannot be read.
        ValueError: no repository is given, or a config or a parameter is invalid.
    """
    repositories = repository_paths(args)
    if not repositories:
        raise ValueError("no --model-repository in the tritonserver arguments")
    plans = [plan_repository(r, config_name(args), gpus) for r in repositories]
    return ShmPlan(tuple(repositories), tuple(step for plan in plans for step in plan.steps))
