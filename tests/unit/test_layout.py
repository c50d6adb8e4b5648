"""Package layout: the client package (``triton_embed``) never imports the server package.

A client-only install (``pip install triton-embed`` on a laptop) has no ``triton_embed_server``
dependencies (transformers, vLLM, Triton's Python backend), so importing any client module
must not pull it in. Checked in a fresh interpreter, where nothing was imported before.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
CLIENT_MODULES = (
    "triton_embed",
    "triton_embed.cli",
    "triton_embed.client",
    "triton_embed.codec",
    "triton_embed.corpus",
    "triton_embed.errors",
    "triton_embed.options",
)


def server_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter on this checkout; the server modules it loaded."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'triton_embed_server']\n"
        "print(json.dumps(sorted(loaded)))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT / "client"), str(REPO_ROOT / "server"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_client_package_loads_no_server_module():
    assert server_modules_after(f"import {', '.join(CLIENT_MODULES)}") == []


def test_the_server_package_is_importable_in_the_probe():
    # The probe can see the server package, so an empty list above means "not imported",
    # not "not found".
    assert "triton_embed_server.steps.errors" in server_modules_after(
        "import triton_embed_server.steps.errors"
    )


def test_building_the_cli_parser_loads_no_server_module():
    code = "import triton_embed.cli\ntriton_embed.cli.build_parser()"
    assert server_modules_after(code) == []
