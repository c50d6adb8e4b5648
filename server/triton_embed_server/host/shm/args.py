"""The shared-memory settings added to tritonserver arguments, after the ``/dev/shm`` check.

Part of :mod:`triton_embed_server.host.shm`: :func:`server_arguments` is what every start path
calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from triton_embed_server.host.shm.check import SHM_DIR, require_space
from triton_embed_server.host.shm.options import (
    DEFAULT_REGION_PREFIX,
    PREFIX_KEY,
    given_default_byte_size,
    option_values,
    python_backend_settings,
)
from triton_embed_server.host.shm.sizing import ShmPlan, plan_repository


def plan_arguments(args: Sequence[str], gpus: int | None = None) -> ShmPlan:
    """The plan of the repositories and config name given in tritonserver arguments.

    Every ``--model-repository`` (tritonserver serves them all; ``--model-store`` is its old
    name); the last ``--model-config-name``.

    Raises:
        OSError: a repository or a config cannot be read.
        ValueError: no repository is given, or a config or a parameter is invalid.
    """
    repositories = [
        Path(v)
        for name in ("--model-repository", "--model-store")
        for v in option_values(args, name)
    ]
    if not repositories:
        raise ValueError("no --model-repository in the tritonserver arguments")
    config_name = (option_values(args, "--model-config-name") or [""])[-1] or None
    plans = [plan_repository(r, config_name, gpus) for r in repositories]
    return ShmPlan(tuple(repositories), tuple(step for plan in plans for step in plan.steps))


def server_arguments(
    args: Sequence[str],
    gpus: int | None = None,
    path: Path = SHM_DIR,
    log: Callable[[str], None] | None = None,
) -> list[str]:
    """``args`` plus the shared-memory settings they lack, after checking ``/dev/shm``.

    The one function every start path calls (launcher, supervisor, ``scripts/serve.sh``).
    Settings the caller gives (``--backend-config=python,shm-default-byte-size=...``) are
    kept. When the configs cannot be read, ``args`` come back unchanged and tritonserver
    reports the error itself.

    Args:
        args: tritonserver arguments (``--model-repository`` and ``--model-config-name``
            are read from them).
        gpus: GPUs the server sees; None asks the CUDA driver if a config needs it.
        path: the shared-memory folder.
        log: where the plan and any note go (one line each); None is silent.

    Raises:
        SharedMemoryError: ``path`` has less free space than the stubs need.
    """
    args = list(args)
    try:
        plan = plan_arguments(args, gpus)
    except (OSError, ValueError) as exc:
        if log:
            log(f"shared memory not sized: {exc}")
        return args
    prefix = python_backend_settings(args).get(PREFIX_KEY) or DEFAULT_REGION_PREFIX
    default = given_default_byte_size(args)
    if log:
        for line in plan.describe(default).splitlines():
            log(f"shared memory: {line}")
    where = ", ".join(str(r) for r in plan.repositories)
    require_space(plan.needed_bytes(default), f"the Python-backend stubs of {where}", path, prefix)
    return [*args, *plan.backend_config_args(args)]
