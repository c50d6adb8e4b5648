"""Real host-topology outputs for the parser tests: ``tests/data/topology`` (see its README.md).

A test takes one of these arguments and pytest runs it once per capture of that command:

* ``topo_m_name`` -- the ``nvidia-smi topo -m`` captures,
* ``p2p_name`` -- the ``nvidia-smi topo -p2p r`` captures,
* ``lscpu_name`` -- the ``lscpu`` captures,
* ``numactl_name`` -- the ``numactl --hardware`` captures,
* ``capture_name`` -- all of them.

The ``capture`` fixture reads a capture by file name, ``expected`` its ``expected_<name>.json``,
``captures_dir`` is the folder and ``capture_names`` all the names above,
``h200_capture`` a file of ``tests/data/topology_h200`` (one H200 host: driver 580.159.04, one
GPU, one NUMA node, 16 CPUs). The folders are part of the repository: a missing one fails.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "data"
CAPTURES = DATA / "topology"
H200_CAPTURES = DATA / "topology_h200"

TOPO_M = [f"topo_m_0{i}.txt" for i in range(1, 8)]
P2P = ["p2p_r_01.txt", "p2p_r_02.txt"]
LSCPU = [f"lscpu_0{i}.txt" for i in range(1, 6)]
NUMACTL = [f"numactl_0{i}.txt" for i in range(1, 5)]
ALL = TOPO_M + P2P + LSCPU + NUMACTL

BY_ARGUMENT = {
    "topo_m_name": TOPO_M,
    "p2p_name": P2P,
    "lscpu_name": LSCPU,
    "numactl_name": NUMACTL,
    "capture_name": ALL,
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    for argument, names in BY_ARGUMENT.items():
        if argument in metafunc.fixturenames:
            metafunc.parametrize(argument, names)


@pytest.fixture
def captures_dir() -> Path:
    return CAPTURES


@pytest.fixture
def capture_names() -> list[str]:
    return list(ALL)


@pytest.fixture
def capture() -> Callable[[str], str]:
    return lambda name: (CAPTURES / name).read_text()


@pytest.fixture
def expected() -> Callable[[str], dict]:
    return lambda name: json.loads((CAPTURES / f"expected_{Path(name).stem}.json").read_text())


@pytest.fixture
def h200_capture() -> Callable[[str], str]:
    return lambda name: (H200_CAPTURES / name).read_text()
