"""The ``/dev/shm`` check at start: free space, its error, the settings added after it.

Part of :mod:`triton_embed_server.host.shm`: :func:`require_space` compares what the stubs need
(:mod:`triton_embed_server.host.shm.sizing`) with what ``/dev/shm`` has free;
:func:`server_arguments`, which every start path calls, checks the repositories of
tritonserver arguments and adds the shared-memory settings they lack.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.host.shm.sizing import MIB, mib, plan_arguments, round_up
from triton_embed_server.host.shm.tritonserver_args import (
    DEFAULT_REGION_PREFIX,
    PREFIX_KEY,
    given_default_byte_size,
    python_backend_settings,
)

SHM_DIR = Path("/dev/shm")
EXIT_TOO_SMALL = 78  # sysexits.h EX_CONFIG: the host is configured wrong


class SharedMemoryError(RuntimeError):
    """``/dev/shm`` cannot hold what the stubs need (the message says how to fix it)."""


@dataclass(frozen=True)
class ShmSpace:
    """``/dev/shm`` now: its size, what is free, and the stub regions already in it."""

    path: Path
    total: int
    free: int
    regions: int
    region_bytes: int


def shm_space(path: Path = SHM_DIR, region_prefix: str = DEFAULT_REGION_PREFIX) -> ShmSpace:
    """``statvfs`` of ``path`` and the Python-backend regions in it (bytes written)."""
    st = os.statvfs(path)
    regions, used = 0, 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        entries = []
    for entry in entries:
        if entry.name.startswith(region_prefix):
            try:
                used += entry.stat().st_blocks * 512
            except OSError:
                continue
            regions += 1
    return ShmSpace(path, st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize, regions, used)


def too_small_message(needed: int, space: ShmSpace, what: str) -> str:
    """The one message of a failed check: needed, free, and how to give more."""
    used = space.total - space.free
    size = round_up(used + needed)
    size_m = size // MIB
    stale = (
        f" {space.regions} Python-backend region(s) already there hold "
        f"{mib(space.region_bytes)}; remove those of servers that no longer run."
        if space.regions
        else ""
    )
    return (
        f"{space.path} has {mib(space.free)} free of {mib(space.total)}; {what} need "
        f"{mib(needed)} ({needed} bytes).{stale} Give the server at least {size_m} MiB of "
        f"shared memory: docker run --shm-size={size_m}m, or in Kubernetes an emptyDir with "
        f"medium: Memory and sizeLimit: {size_m}Mi mounted at {space.path}; or lower "
        "max_batch_size, max_chars or the instance_group count in the model configs."
    )


def require_space(
    needed: int,
    what: str,
    path: Path = SHM_DIR,
    region_prefix: str = DEFAULT_REGION_PREFIX,
) -> ShmSpace:
    """Check that ``path`` has ``needed`` bytes free.

    Args:
        needed: bytes the stubs need.
        what: who needs them, for the message ("the Python-backend stubs of ...").
        path: the shared-memory folder.
        region_prefix: the name prefix of the backend's regions.

    Returns:
        The space found.

    Raises:
        SharedMemoryError: not enough is free (:func:`too_small_message`).
    """
    space = shm_space(path, region_prefix)
    if space.free < needed:
        raise SharedMemoryError(too_small_message(needed, space, what))
    return space


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
