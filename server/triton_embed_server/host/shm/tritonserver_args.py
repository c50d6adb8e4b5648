"""Reading tritonserver arguments: the python backend's shared-memory settings, the repositories.

Part of :mod:`triton_embed_server.host.shm` (the sizes are explained in
:mod:`triton_embed_server.host.shm.sizing`): the settings' names, :func:`option_values` (any
option), :func:`python_backend_settings` and :func:`given_default_byte_size` (the
``--backend-config=python,<key>=<value>`` settings), :func:`repository_paths` and
:func:`config_name` (what the server loads).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

BACKEND = "python"
DEFAULT_KEY = "shm-default-byte-size"
GROWTH_KEY = "shm-growth-byte-size"
PREFIX_KEY = "shm-region-prefix-name"
DEFAULT_REGION_PREFIX = "triton_python_backend_shm_region_"


def python_backend_settings(args: Sequence[str]) -> dict[str, str]:
    """The ``python`` backend's ``--backend-config`` settings in tritonserver arguments.

    Both ``--backend-config=python,k=v`` and ``--backend-config python,k=v``; the last wins.
    """
    settings = {}
    for value in option_values(args, "--backend-config"):
        backend, _, setting = value.partition(",")
        key, sep, item = setting.partition("=")
        if backend == BACKEND and sep:
            settings[key] = item
    return settings


def given_default_byte_size(args: Sequence[str]) -> int | None:
    """The ``shm-default-byte-size`` tritonserver arguments set (None: not set, or not a number).

    A value that is not a number is left to tritonserver, which rejects it.
    """
    value = python_backend_settings(args).get(DEFAULT_KEY)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def option_values(args: Sequence[str], name: str) -> list[str]:
    """Every value of ``--name VALUE`` and ``--name=VALUE`` in ``args``, in order."""
    values = []
    for i, arg in enumerate(args):
        if arg == name and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith(name + "="):
            values.append(arg.split("=", 1)[1])
    return values


def repository_paths(args: Sequence[str]) -> list[Path]:
    """Every ``--model-repository`` in tritonserver arguments (``--model-store``: its old name).

    tritonserver serves them all.
    """
    return [
        Path(v)
        for name in ("--model-repository", "--model-store")
        for v in option_values(args, name)
    ]


def config_name(args: Sequence[str]) -> str | None:
    """The last ``--model-config-name`` in tritonserver arguments (None: none, or empty)."""
    return (option_values(args, "--model-config-name") or [""])[-1] or None
