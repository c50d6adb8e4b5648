"""Where an instance is pinned: the only module that changes the process's CPUs and memory.

Triton's ``--host-policy`` NUMA settings do not reach Python-backend stub processes, so each
``embedder`` instance applies its own
:class:`~triton_embed_server.host.placement.instance.InstancePlacement`
in ``initialize``, before vLLM and torch start their threads, which inherit both bindings.
vLLM binds OpenMP threads itself only in the engine processes it spawns; an in-process engine
inside a Triton stub needs the process pinned.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform

from triton_embed_server.host.placement.instance import InstancePlacement

# set_mempolicy(2) system call numbers (Linux uapi unistd tables) and MPOL_BIND (mempolicy.h).
_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
_MPOL_BIND = 2


def bind_memory(node: int) -> bool:
    """Bind this thread's future allocations (and its future threads') to NUMA ``node``.

    What ``numactl --membind`` does, through ``set_mempolicy(MPOL_BIND)``.

    Returns:
        False where the system call is unavailable or refused (no NUMA in the kernel, a
        seccomp filter): placement then covers CPUs only.
    """
    number = _SET_MEMPOLICY.get(platform.machine())
    if number is None or node < 0:
        return False
    words = node // 64 + 1
    mask = (ctypes.c_ulong * words)()
    mask[node // 64] = 1 << (node % 64)
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(number, _MPOL_BIND, mask, ctypes.c_ulong(words * 64 + 1)) == 0


def apply_placement(placement: InstancePlacement) -> InstancePlacement:
    """Apply a placement to this process; call once, before vLLM or torch is imported.

    Sets the placement's engine environment, pins the process to its CPUs
    (``os.sched_setaffinity``) and, when it is placed on one node (not ``off``), binds its
    memory to that node.

    Returns:
        The placement with ``bound_memory`` set.
    """
    os.environ.update(placement.env)
    if placement.cpus:
        os.sched_setaffinity(0, set(placement.cpus))
    node = placement.memory_node
    bound = bind_memory(node) if node is not None else False
    return dataclasses.replace(placement, bound_memory=bound)
