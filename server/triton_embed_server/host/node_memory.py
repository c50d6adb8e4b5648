"""Do the CPU engines fit their NUMA nodes' memory? Checked before tritonserver starts.

vLLM's CPU worker binds each engine's memory to the NUMA node of its first CPU
(``vllm/v1/worker/cpu_worker.py``: ``init_cpu_memory_env([node])``) and refuses to start
when its KV cache is more than that node's available memory. On a host whose node holds a
fraction of the RAM, several engines on one node then fail one by one, late, with a
message that names neither the model nor the need. This module adds up, per node, what
every ``KIND_CPU`` engine instance (embedder or reranker scorer) of the model
repositories will hold there, and compares it with what the node has available, before any
engine starts (like the ``/dev/shm`` check, :mod:`triton_embed_server.host.shm`).

One engine's need: ``kv_cache_bytes`` (:mod:`triton_embed_server.steps.kv_cache`, as its config
says) + its weights at the engine's dtype (the ``*.safetensors`` files, else ``*.bin``,
scaled from the checkpoint's dtype) + :data:`ENGINE_BASE_BYTES` for the process itself
(Python, torch, vLLM, the stub). Measured here: an in-process ``vllm.LLM`` of the
Qwen3-style test model held 608 MiB of anonymous memory with a 48 MiB KV cache and 2 MiB of
weights, that is 558 MiB of its own; 640 MiB leaves a margin. GPU instances hold their KV
cache on the GPU and are not counted.

Which node: the instance's placement as the stub will decide it
(:func:`triton_embed_server.host.placement.instance.decide_placement`, the same ``numa_placement``
and
``threads_bind``), then the node of its first CPU, as vLLM picks it. A node's available
memory is vLLM's own figure (``vllm/utils/cpu_resource_utils.py``): ``MemFree +
Active(file) + Inactive(file) + SReclaimable`` of ``/sys/devices/system/node/nodeN/meminfo``
(``MemAvailable`` of ``/proc/meminfo`` without NUMA information), capped by the cgroup's
``memory.max - memory.current`` when a limit is set.

    python -m triton_embed_server.host.node_memory --model-repository model_repository
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.host.topology import SYSFS_NODE_ROOT
from triton_embed_server.host.units import MIB, gib

#: A CPU engine's own memory beyond its KV cache and weights (module docstring).
ENGINE_BASE_BYTES = 640 * MIB
EXIT_TOO_SMALL = 78  # sysexits.h EX_CONFIG, as the /dev/shm check
PROC_MEMINFO = Path("/proc/meminfo")
CGROUP_ROOT = Path("/sys/fs/cgroup")
_WEIGHT_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


class NodeMemoryError(RuntimeError):
    """The engines placed on a NUMA node need more than it has available (names them)."""


@dataclass(frozen=True)
class EngineNeed:
    """What one ``KIND_CPU`` engine instance (embedder or scorer) holds on its node.

    Attributes:
        model: the engine step model's name.
        instance: its index in the instance group.
        node: the NUMA node its memory is bound to (None: the host has no NUMA information).
        kv_cache_bytes: its KV-cache budget.
        weight_bytes: its weights at the engine's dtype.
    """

    model: str
    instance: int
    node: int | None
    kv_cache_bytes: int
    weight_bytes: int

    @property
    def total(self) -> int:
        """KV cache + weights + :data:`ENGINE_BASE_BYTES`."""
        return self.kv_cache_bytes + self.weight_bytes + ENGINE_BASE_BYTES


@dataclass(frozen=True)
class NodeMemory:
    """One NUMA node's memory now (vLLM's figures)."""

    node: int | None
    total: int
    available: int


def _meminfo(path: Path) -> dict[str, int]:
    """``{key: bytes}`` of a ``meminfo`` file (``Node N Key: V kB`` or ``Key: V kB``)."""
    out = {}
    for line in path.read_text().splitlines():
        head, _, rest = line.partition(":")
        parts = rest.split()
        if parts:
            out[head.split()[-1]] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def _cgroup_room(root: Path) -> tuple[int, int] | None:
    """(limit, limit - usage) of the cgroup v2 at ``root``; None without a limit."""
    try:
        limit = (root / "memory.max").read_text().strip()
        usage = int((root / "memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    if limit == "max":
        return None
    return int(limit), max(0, int(limit) - usage)


def read_node_memory(
    node: int | None,
    numa_root: Path = SYSFS_NODE_ROOT,
    proc_meminfo: Path = PROC_MEMINFO,
    cgroup_root: Path = CGROUP_ROOT,
) -> NodeMemory:
    """A node's total and available memory as vLLM computes them (module docstring).

    Raises:
        OSError: the meminfo file cannot be read.
    """
    path = numa_root / f"node{node}" / "meminfo" if node is not None else None
    if path is not None and path.is_file():
        info = _meminfo(path)
        total = info["MemTotal"]
        available = (
            info["MemFree"]
            + info.get("Active(file)", 0)
            + info.get("Inactive(file)", 0)
            + info.get("SReclaimable", 0)
        )
    else:
        info = _meminfo(proc_meminfo)
        total = info["MemTotal"]
        available = info["MemAvailable"] if "MemAvailable" in info else info["MemFree"]
    room = _cgroup_room(cgroup_root)
    if room is not None and room[0] < total:
        total, available = room[0], min(available, room[1])
    return NodeMemory(node, total, available)


def weight_bytes(model_path: Path, dtype: str) -> int:
    """The model's weights at the engine's ``dtype``: the checkpoint files, rescaled."""
    from triton_embed_server.steps.kv_cache import DTYPE_BYTES, _config

    path = Path(model_path)
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("*.bin"))
    stored = sum(f.stat().st_size for f in files)
    config = _config(path)
    stored_dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    have = _WEIGHT_DTYPE_BYTES.get(stored_dtype, 4)
    want = have if dtype == "auto" else DTYPE_BYTES.get(dtype, 4)
    return stored * want // have


def _first_node(cpus: Sequence[int], nodes: dict[int, tuple[int, ...]]) -> int | None:
    """The node of the lowest CPU (vLLM's ``get_allowed_cpu_list()[0]``)."""
    if not cpus or not nodes:
        return min(nodes) if nodes else None
    first = min(cpus)
    return next((n for n, members in nodes.items() if first in members), None)


def engine_needs(
    repositories: Iterable[Path],
    config_name: str | None = None,
    *,
    allowed_cpus: Sequence[int] | None = None,
    numa_root: Path = SYSFS_NODE_ROOT,
    auto_plan: Callable | None = None,
) -> list[EngineNeed]:
    """Every ``KIND_CPU`` engine instance of the repositories, with its node and need.

    Args:
        repositories: model repositories (every model whose ``1/model.py`` is our embedder,
            scorer, sparse, token or hybrid encoder).
        config_name: ``--model-config-name``, if given.
        allowed_cpus: the CPUs the server may use (None: this process's).
        numa_root: the sysfs NUMA folder.
        auto_plan: the host plan for ``numa_placement=auto`` (None:
            :func:`triton_embed_server.host.doctor.host_plan` with ``numa_root``).

    Raises:
        OSError: a config cannot be read.
        ValueError: a config or parameter is invalid (names the model).
    """
    from triton_embed_server.host.placement.instance import decide_placement, node_cpus
    from triton_embed_server.host.shm.sizing import model_config_path
    from triton_embed_server.models.instance_group import read_config_pbtxt
    from triton_embed_server.models.repository.layout import step_kind
    from triton_embed_server.steps.config import EmbedderConfig
    from triton_embed_server.steps.hybrid_config import HybridEncoderConfig
    from triton_embed_server.steps.multivector_config import TokenEncoderConfig
    from triton_embed_server.steps.rerank_config import ScorerConfig
    from triton_embed_server.steps.sparse_config import SparseEncoderConfig

    engine_configs = {
        "embedder": EmbedderConfig,
        "scorer": ScorerConfig,
        "sparse_encoder": SparseEncoderConfig,
        "token_encoder": TokenEncoderConfig,
        "hybrid_encoder": HybridEncoderConfig,
    }

    if auto_plan is None:
        from triton_embed_server.host.doctor import host_plan

        def auto_plan(kind, count, allowed):
            return host_plan(kind, count, allowed, numa_root=numa_root)

    allowed = sorted(os.sched_getaffinity(0) if allowed_cpus is None else allowed_cpus)
    nodes = node_cpus(numa_root)
    needs = []
    for repository in repositories:
        repository = Path(repository)
        for folder in sorted(p for p in repository.iterdir() if p.is_dir()):
            path = model_config_path(folder, config_name)
            if folder.name.startswith(".") or not path.is_file():
                continue
            engine_config = engine_configs.get(step_kind(folder) or "")
            if engine_config is None:
                continue
            config = read_config_pbtxt(path)
            groups = config.get("instance_group") or [{}]
            if any(g.get("kind", "KIND_CPU") != "KIND_CPU" for g in groups):
                continue
            try:
                emb = engine_config.from_model_config(config, repository)
            except ValueError as exc:
                raise ValueError(f"{folder}: {exc}") from None
            kv = int(emb.llm_kwargs().get("kv_cache_memory_bytes") or 0)
            weights = weight_bytes(emb.model_path, emb.dtype)
            for index in range(emb.instances_per_device):
                placement = decide_placement(
                    emb,
                    "CPU",
                    index,
                    allowed_cpus=allowed,
                    auto_plan=auto_plan,
                    numa_root=numa_root,
                )
                node = _first_node(placement.cpus or allowed, nodes)
                needs.append(EngineNeed(folder.name, index, node, kv, weights))
    return needs


def shortfalls(
    needs: Sequence[EngineNeed], memory: Callable[[int | None], NodeMemory] | None = None
) -> list[tuple[NodeMemory, list[EngineNeed]]]:
    """The nodes whose engines need more than they have available, with those engines.

    Args:
        needs: the engines (:func:`engine_needs`).
        memory: reads a node's memory (None: :func:`read_node_memory`; tests pass a fake).
    """
    memory = memory or read_node_memory
    out = []
    for node in sorted({n.node for n in needs}, key=lambda n: -1 if n is None else n):
        mine = [n for n in needs if n.node == node]
        mem = memory(node)
        if sum(n.total for n in mine) > mem.available:
            out.append((mem, mine))
    return out


def too_small_message(mem: NodeMemory, needs: Sequence[EngineNeed]) -> str:
    """One line: the node, the models and their needs, what it has, what to change."""
    where = "the host" if mem.node is None else f"NUMA node {mem.node}"
    need = sum(n.total for n in needs)
    per_model: dict[str, list[EngineNeed]] = {}
    for n in needs:
        per_model.setdefault(n.model, []).append(n)
    parts = ", ".join(
        f"{model} {len(ns)} x {gib(ns[0].total)} (KV cache {gib(ns[0].kv_cache_bytes)}, "
        f"weights {gib(ns[0].weight_bytes)}, engine {gib(ENGINE_BASE_BYTES)})"
        for model, ns in per_model.items()
    )
    return (
        f"the CPU engines placed on {where} need {gib(need)} ({need} bytes) and it has "
        f"{gib(mem.available)} available of {gib(mem.total)}: {parts}. Lower the "
        "instance_group count, max_num_batched_tokens or max_num_seqs (they size "
        "kv_cache_bytes), serve fewer models on this node (numa_placement=auto spreads "
        "instances over the nodes), or free memory on the node."
    )


def require_fit(
    needs: Sequence[EngineNeed], memory: Callable[[int | None], NodeMemory] | None = None
) -> None:
    """Raise unless every node has room for its engines.

    Raises:
        NodeMemoryError: one line per node short of memory (:func:`too_small_message`).
    """
    short = shortfalls(needs, memory)
    if short:
        raise NodeMemoryError(" ".join(too_small_message(mem, ns) for mem, ns in short))


def describe(needs: Sequence[EngineNeed], memory: Callable | None = None) -> list[str]:
    """One line per node: its engines' need and its available memory."""
    memory = memory or read_node_memory
    lines = []
    for node in sorted({n.node for n in needs}, key=lambda n: -1 if n is None else n):
        mine = [n for n in needs if n.node == node]
        mem = memory(node)
        models = ", ".join(sorted({n.model for n in mine}))
        where = "host" if node is None else f"node {node}"
        lines.append(
            f"{where}: {len(mine)} CPU engine(s) ({models}) need {gib(sum(n.total for n in mine))}"
            f"; {gib(mem.available)} available of {gib(mem.total)}"
        )
    return lines


def loaded_models(args: Sequence[str], repositories: Iterable[Path]) -> set[str] | None:
    """The models tritonserver loads at start (None: all of the repositories).

    With ``--model-control-mode explicit`` only the ``--load-model`` models load (``*``: all),
    and loading an ensemble loads its steps.
    """
    from triton_embed_server.host.shm.tritonserver_args import option_values
    from triton_embed_server.models.repository.layout import ensembles

    mode = (option_values(args, "--model-control-mode") or ["none"])[-1]
    names = option_values(args, "--load-model")
    if mode != "explicit" or "*" in names:
        return None
    loaded = set(names)
    for repository in repositories:
        for ensemble, steps in ensembles(Path(repository)).items():
            if ensemble in loaded:
                loaded.update(steps)
    return loaded


def check_arguments(args: Sequence[str], log: Callable[[str], None] | None = None) -> None:
    """Check the repositories of tritonserver arguments; the one call of every start path.

    A repository or config that cannot be read is left to tritonserver (logged, not raised).

    Raises:
        NodeMemoryError: a node cannot hold its engines.
    """
    from triton_embed_server.host.shm.tritonserver_args import config_name, repository_paths

    repositories = repository_paths(args)
    try:
        needs = engine_needs(repositories, config_name(args))
        loaded = loaded_models(args, repositories)
        if loaded is not None:
            needs = [n for n in needs if n.model in loaded]
        lines = describe(needs)
    except (OSError, ValueError) as exc:
        if log:
            log(f"engine memory not checked: {exc}")
        return
    if log:
        for line in lines:
            log(f"engine memory: {line}")
    require_fit(needs)


def main(argv: Iterable[str] | None = None) -> int:
    """``python -m triton_embed_server.host.node_memory``: print the needs; exit 1 if short."""
    parser = argparse.ArgumentParser(
        prog="python -m triton_embed_server.host.node_memory",
        description="Check that the CPU engines of a model repository fit their NUMA nodes.",
    )
    parser.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--model-config-name", default=None)
    opts = parser.parse_args(None if argv is None else list(argv))
    try:
        needs = engine_needs([opts.model_repository], opts.model_config_name)
        print("\n".join(describe(needs)) or "no CPU engines")
        require_fit(needs)
    except (OSError, ValueError, NodeMemoryError) as exc:
        print(f"node_memory: error: {exc}", file=sys.stderr)
        return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
