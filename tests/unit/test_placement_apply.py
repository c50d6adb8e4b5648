"""placement.apply: environment, CPU affinity and memory binding, each applied in a child
process (pinning is process-wide and must not leak into pytest)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def apply_in_child(placement: str, after: str = "") -> dict:
    """Run ``apply_placement(<placement>)`` in a child; returns the JSON it prints."""
    code = (
        "import json, os\n"
        "from triton_embed_server.host.placement.apply import apply_placement\n"
        "from triton_embed_server.host.placement.instance import InstancePlacement\n"
        f"p = apply_placement({placement})\n"
        f"{after}\n"
        "print(json.dumps({'bound': p.bound_memory, 'affinity': sorted(os.sched_getaffinity(0)),"
        " 'omp': os.environ.get('OMP_NUM_THREADS'), 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),"
        " 'bind_lines': globals().get('bind_lines')}))\n"
    )
    env = {
        k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")
    }
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_apply_pins_the_process_and_sets_the_engine_environment():
    cpu = sorted(os.sched_getaffinity(0))[0]
    got = apply_in_child(
        f"InstancePlacement((), ({cpu},), None, 'off', "
        f"{{'VLLM_CPU_OMP_THREADS_BIND': '{cpu}', 'OMP_NUM_THREADS': '1'}})"
    )
    assert got == {"bound": False, "affinity": [cpu], "omp": "1", "cuda": None, "bind_lines": None}


def test_apply_without_cpus_leaves_affinity_alone():
    everything = sorted(os.sched_getaffinity(0))
    got = apply_in_child("InstancePlacement((), (), 3, 'off', {'CUDA_VISIBLE_DEVICES': '3'})")
    assert (got["affinity"], got["cuda"], got["bound"]) == (everything, "3", False)


def test_apply_off_does_not_bind_memory_even_on_one_node():
    got = apply_in_child("InstancePlacement((0,), (), None, 'off')")
    assert got["bound"] is False


@pytest.mark.skipif(not Path("/sys/devices/system/node/node0").exists(), reason="no NUMA sysfs")
def test_apply_pins_cpus_and_binds_memory():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    got = apply_in_child(
        f"InstancePlacement((0,), ({cpu},), None, 'auto')",
        after=(
            "import mmap\n"
            "m = mmap.mmap(-1, 1 << 20); m.write(b'x' * (1 << 20))  # mapped after binding\n"
            "bind_lines = open('/proc/self/numa_maps').read().count('bind:0')"
        ),
    )
    assert got["affinity"] == [cpu]
    assert got["bound"] is True
    assert got["bind_lines"] >= 1  # the kernel reports the MPOL_BIND policy on node 0
