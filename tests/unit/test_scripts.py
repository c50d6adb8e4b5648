"""The Python scripts under ``scripts/`` build their command line (README's main job included).

``scripts/main_job.py`` is what ``scripts/run.sh`` runs on a fresh machine; no other test
imports it, so a moved or renamed helper it uses would only show on that first run. Its
``--help`` builds the whole parser without starting a server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[2] / "scripts").glob("*.py"))


def test_the_main_job_is_among_the_scripts():
    assert "main_job.py" in {s.name for s in SCRIPTS}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_answers_help(script: Path):
    done = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith(f"usage: {script.name}")
