"""Where the engine is called: one in-process vLLM pooling engine per ``embedder`` instance.

The engine is fed token IDs only (``TokensPrompt``), never raw strings; tokenization is the
tokenizer step's job. Pooling and normalization are the model's own sentence-transformers
configuration (``modules.json``, ``1_Pooling/config.json``), which vLLM reads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from triton_embed_server.config import EmbedderConfig
from triton_embed_server.errors import EngineError, InvalidTokenIdsError


def instance_index(instance_name: str) -> int:
    """The replica index Triton gives an instance (``embedder_0_1`` -> 1; no suffix -> 0)."""
    match = re.search(r"_(\d+)$", instance_name)
    return int(match.group(1)) if match else 0


def cpu_slice(cpus: Sequence[int], index: int, count: int) -> list[int]:
    """The CPUs replica ``index`` of ``count`` binds to under ``threads_bind=spread``.

    The CPUs are split into ``count`` contiguous, disjoint slices (the first slices get the
    remainder); with more replicas than CPUs, replica ``i`` gets CPU ``i mod len(cpus)``.

    Raises:
        ValueError: ``cpus`` is empty or ``count`` < 1.
    """
    cpus = sorted(cpus)
    if not cpus or count < 1:
        raise ValueError(f"cannot split {len(cpus)} CPUs among {count} replicas")
    return list(chunk(cpus, index, count))


def chunk(items: Sequence, index: int, count: int) -> Sequence:
    """Part ``index`` of ``count`` contiguous, disjoint parts of ``items`` (the first parts take
    the remainder); with more parts than items, part ``i`` is item ``i mod len(items)``.
    The rule behind :func:`cpu_slice` and the doctor's whole-core slices.
    """
    index %= count
    if count >= len(items):
        return [items[index % len(items)]]
    base, extra = divmod(len(items), count)
    start = index * base + min(index, extra)
    return items[start : start + base + (1 if index < extra else 0)]


def engine_environment(
    config: EmbedderConfig,
    index: int,
    kind: str,
    device_id: int,
    cpus: Sequence[int],
    planned_cpus: Sequence[int] | None = None,
    cuda_visible_devices: str | None = None,
) -> dict[str, str]:
    """Environment variables to set before vLLM is imported in a replica's process.

    Args:
        config: the embedder's configuration.
        index: the replica's index (:func:`instance_index`).
        kind: ``args["model_instance_kind"]`` (``CPU`` or ``GPU``).
        device_id: ``args["model_instance_device_id"]``.
        cpus: the CPUs this process may run on (``os.sched_getaffinity(0)``).
        planned_cpus: a CPU replica's own CPUs from its NUMA placement
            (:mod:`~triton_embed_server.placement`); they replace the ``spread`` slice.
        cuda_visible_devices: the server's own ``CUDA_VISIBLE_DEVICES`` (a server started
            for one NUMA node sees only that node's GPUs); ``device_id`` indexes into it.

    Returns:
        ``CUDA_VISIBLE_DEVICES`` for a GPU replica (its own GPU, as the server numbers it), or
        ``VLLM_CPU_OMP_THREADS_BIND`` and ``OMP_NUM_THREADS`` for a CPU replica under
        ``threads_bind=spread``; empty otherwise.
    """
    env: dict[str, str] = {}
    if kind.upper() == "GPU":
        visible = [v.strip() for v in (cuda_visible_devices or "").split(",") if v.strip()]
        env["CUDA_VISIBLE_DEVICES"] = (
            visible[device_id] if device_id < len(visible) else str(device_id)
        )
    elif planned_cpus or config.threads_bind == "spread":
        mine = (
            sorted(planned_cpus)
            if planned_cpus
            else cpu_slice(cpus, index, config.instances_per_device)
        )
        env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in mine)
        env["OMP_NUM_THREADS"] = str(len(mine))
    return env


def validate_token_ids(
    token_ids: Sequence[int], index: int, vocab_size: int, max_length: int
) -> None:
    """Reject token IDs the engine must never see.

    Raises:
        InvalidTokenIdsError: empty, longer than ``max_length``, or an ID outside
            ``[0, vocab_size)`` (names the text index, the position and the limit).
    """
    n = len(token_ids)
    if n == 0:
        raise InvalidTokenIdsError(f"text {index} has no token IDs; send at least one token")
    if n > max_length:
        raise InvalidTokenIdsError(
            f"text {index} has {n} token IDs; the model accepts {max_length}; truncate it "
            "(the tokenizer step does this with truncation=END or START)"
        )
    arr = np.asarray(token_ids)
    bad = np.flatnonzero((arr < 0) | (arr >= vocab_size))
    if bad.size:
        pos = int(bad[0])
        raise InvalidTokenIdsError(
            f"text {index} has token ID {int(arr[pos])} at position {pos}, outside the "
            f"vocabulary [0, {vocab_size}); send IDs from this model's tokenizer"
        )


def decode_request_token_ids(
    payloads: Sequence[bytes], vocab_size: int, max_length: int
) -> list[list[int]]:
    """Decode and validate one request's ``TOKEN_IDS`` elements (little-endian int32).

    Returns:
        Per text, its token IDs.

    Raises:
        InvalidTokenIdsError: a payload is not whole int32 values, or fails
            :func:`validate_token_ids`.
    """
    from triton_embed.codec import decode_token_ids

    out = []
    for i, payload in enumerate(payloads):
        try:
            ids = decode_token_ids(payload)
        except ValueError as exc:
            raise InvalidTokenIdsError(f"text {i}: {exc}") from None
        validate_token_ids(ids, i, vocab_size, max_length)
        out.append(ids)
    return out


class PoolingEngine:
    """A vLLM ``LLM`` with the pooling runner, embedding batches of token-ID sequences."""

    def __init__(self, config: EmbedderConfig):
        from vllm import LLM

        self.config = config
        self._llm = LLM(**config.llm_kwargs())
        model_config = self._llm.llm_engine.model_config
        self.vocab_size = int(model_config.get_vocab_size())
        self.dim = int(model_config.get_hidden_size())

    def embed(self, token_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Embed pre-tokenized texts in one engine call.

        Args:
            token_ids: ``n`` sequences of token IDs, already validated.

        Returns:
            float32 ``[n, dim]``, pooled and normalized as the model's
            sentence-transformers config says (mean pooling, L2 norm for all-MiniLM-L6-v2).

        Raises:
            EngineError: the engine failed or returned a wrong number of vectors.
        """
        if not token_ids:
            return np.zeros((0, self.dim), dtype=np.float32)
        from vllm.inputs import TokensPrompt

        return self._encode([TokensPrompt(prompt_token_ids=list(ids)) for ids in token_ids])

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """Embed raw strings, tokenized by vLLM inside the engine call (what a one-step
        server does). Only the benchmark's ablation uses it (perf/ablations/): the product
        tokenizes in its own step.

        Returns:
            float32 ``[n, dim]``.

        Raises:
            EngineError: as :meth:`embed`.
        """
        return self._encode(list(texts)) if texts else np.zeros((0, self.dim), dtype=np.float32)

    def _encode(self, prompts: list) -> np.ndarray:
        try:
            # encode(pooling_task="embed") is what LLM.embed calls; it keeps each vector as a
            # tensor instead of converting it to a Python list.
            outputs = self._llm.encode(prompts, use_tqdm=False, pooling_task="embed")
        except Exception as exc:  # the engine's own failure, reported per request
            raise EngineError(f"the embedding engine failed: {type(exc).__name__}: {exc}") from exc
        if len(outputs) != len(prompts):
            raise EngineError(
                f"the engine returned {len(outputs)} vectors for {len(prompts)} texts"
            )
        import torch

        return torch.stack([o.outputs.data for o in outputs]).to(torch.float32).numpy()


def apply_placement(env: dict[str, str]) -> list[int]:
    """Apply a replica's placement to this process, before vLLM/torch are imported.

    Sets ``env`` and, when it names CPUs (``VLLM_CPU_OMP_THREADS_BIND``), pins the process
    to them with ``os.sched_setaffinity`` so every thread created later (OpenMP's included)
    inherits the binding. vLLM applies its own binding only when it spawns engine processes;
    an in-process engine inside a Triton stub needs this.

    Returns:
        The CPUs this process may run on afterwards.
    """
    os.environ.update(env)
    bind = env.get("VLLM_CPU_OMP_THREADS_BIND", "")
    if bind and bind not in ("auto", "nobind"):
        os.sched_setaffinity(0, {int(c) for c in bind.split(",")})
    return sorted(os.sched_getaffinity(0))
