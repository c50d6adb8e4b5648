"""``python -m triton_embed_server.host.shm check|args``: print the sizes, or the arguments to add.

Called from ``scripts/serve.sh`` (``args``) and by hand (``check``):

    python -m triton_embed_server.host.shm check --model-repository model_repository
    python -m triton_embed_server.host.shm args --model-repository model_repository [...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path

from triton_embed_server.host.shm.check import SharedMemoryError, require_space, server_arguments
from triton_embed_server.host.shm.sizing import mib, plan_repository


def main(argv: Iterable[str] | None = None) -> int:
    """``check`` or ``args``; see :mod:`triton_embed_server.host.shm.sizing` for the sizes.

    ``args [--gpus N] -- <tritonserver arguments>`` (or ``args <tritonserver arguments>``)
    prints the arguments to add, one a line; ``check --model-repository DIR`` prints the
    sizes. Both exit 1 with the message when ``/dev/shm`` is too small.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        own, server_args = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    elif argv[:1] == ["args"]:
        own, server_args = argv[:1], argv[1:]
    else:
        own, server_args = argv, []
    parser = argparse.ArgumentParser(
        prog="python -m triton_embed_server.host.shm",
        description="Size the Python-backend shared memory and check /dev/shm.",
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="print the sizes; exit 1 if /dev/shm is too small")
    check.add_argument("--model-repository", type=Path, default=Path("model_repository"))
    check.add_argument("--model-config-name", default=None)
    check.add_argument("--servers", type=int, default=1, help="servers sharing this /dev/shm")
    args = sub.add_parser("args", help="print the tritonserver arguments to add, one a line")
    for p in (check, args):
        p.add_argument("--gpus", type=int, default=None, help="GPUs each server sees")
    opts = parser.parse_args(own)
    if opts.command == "args":
        try:
            full = server_arguments(server_args, opts.gpus)
        except SharedMemoryError as exc:
            print(f"shm: error: {exc}", file=sys.stderr)
            return 1
        added = full[len(server_args) :]
        if added:
            print("\n".join(added))
        return 0
    if server_args:
        parser.error(f"check takes no tritonserver arguments: {' '.join(server_args)}")
    try:
        plan = plan_repository(opts.model_repository, opts.model_config_name, opts.gpus)
    except (OSError, ValueError) as exc:
        print(f"shm: error: {exc}", file=sys.stderr)
        return 1
    print(plan.describe())
    servers = max(1, opts.servers)
    needed = plan.needed_bytes() * servers
    what = f"{servers} servers' Python-backend stubs" if servers > 1 else "the stubs"
    try:
        space = require_space(needed, what)
    except SharedMemoryError as exc:
        print(f"shm: error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {space.path} has {mib(space.free)} free, {mib(needed)} needed")
    return 0
