"""scripts/monitoring: Prometheus rules (promtool) and the Grafana dashboard.

``promtool check rules`` / ``promtool test rules`` are Prometheus' own validators; the rules'
unit tests (prometheus_rules_test.yml) feed synthetic series and assert when each alert
fires. Grafana publishes no dashboard validator on PyPI, npm or Debian, so the dashboard's
structure is checked here and each panel query is parsed by promtool (as a recording rule
after substituting the template variables). Every metric name in the rules and the dashboard
must be an exported family below or a recorded series: a rename breaks these tests.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from triton_embed_server.run.launcher import REPO_ROOT

MONITORING = REPO_ROOT / "scripts" / "monitoring"
RULES = MONITORING / "prometheus_rules.yml"
RULES_TEST = MONITORING / "prometheus_rules_test.yml"
DASHBOARD = MONITORING / "grafana_dashboard.json"

# The families the server exports on :8002/metrics, and the gateway on its own /metrics
# (docs/operations.md, "Metric catalogue").
COUNTERS = {
    "triton_embed_requests_succeeded_total",
    "triton_embed_requests_failed_total",
    "triton_embed_texts_total",
    "triton_embed_tokens_total",
    "triton_embed_texts_truncated_total",
    "triton_embed_numa_pages_total",
    "triton_embed_gateway_requests_total",
    "triton_embed_gateway_upstream_retries_total",
    "triton_embed_gateway_inputs_total",
    "triton_embed_gateway_tokens_total",
    "triton_embed_gateway_tenant_requests_total",
    "triton_embed_gateway_tenant_texts_total",
    "triton_embed_gateway_tenant_tokens_total",
    "triton_embed_gateway_tenant_cost_usd_total",
    "triton_embed_gateway_tenant_refusals_total",
    "triton_embed_gateway_tenant_errors_total",
}
HISTOGRAMS = {
    "triton_embed_execute_seconds",
    "triton_embed_batch_texts",
    "triton_embed_batch_tokens",
    "triton_embed_gateway_request_duration_seconds",
}
GAUGES = {
    "triton_embed_hourly_price_usd",
    "triton_embed_cost_per_million_tokens_usd",
    "triton_embed_tokens_per_second",
    "triton_embed_instance_placement",
    "triton_embed_gateway_in_flight",
    "triton_embed_gateway_upstream_up",
}
OUR_FAMILIES = COUNTERS | HISTOGRAMS | GAUGES
TRITON_FAMILIES = {
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_request_duration_us",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_cpu_utilization",
    "nv_gpu_utilization",
    "nv_gpu_memory_used_bytes",
}

ALERTS = {
    "TritonEmbedNumaMissesAboveBaseline",
    "TritonEmbedThroughputBelowReference",
    "TritonEmbedQueueTimeRising",
    "TritonEmbedRequestFailures",
    "TritonEmbedGatewayNoUpstream",
    "TritonEmbedTenantRateLimited",
}
RECORDED = {
    "triton_embed:tokens_per_second:rate1m",
    "triton_embed:cost_per_million_tokens_usd:host",
    "triton_embed:numa_miss_ratio:rate5m",
    "triton_embed:reference_tokens_per_second",
}

# Grafana variables -> values that make a panel query plain PromQL.
GRAFANA_VARS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}


def load_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def dashboard_panels(dashboard: dict) -> list[dict]:
    """Every panel, those inside collapsed rows included."""
    out = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def dashboard_targets(dashboard: dict) -> list[tuple[dict, dict]]:
    return [(p, t) for p in dashboard_panels(dashboard) for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """Names of our and Triton's series (and our recorded ones) that a PromQL expression reads."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values are not names
    return set(re.findall(r"(?<![\w:$])((?:triton_embed|nv)[a-zA-Z0-9_:]*)", expr))


def is_known(name: str, recorded: set[str]) -> bool:
    if name in OUR_FAMILIES or name in TRITON_FAMILIES or name in recorded:
        return True
    base, _, suffix = name.rpartition("_")
    return suffix in ("bucket", "sum", "count") and base in HISTOGRAMS


def plain_promql(expr: str) -> str:
    """A panel query with Grafana's variables replaced (multi-value ones by ``.*``)."""
    return re.sub(r"\$\{?(\w+)\}?", lambda m: GRAFANA_VARS.get(m.group(1), ".*"), expr)


@pytest.fixture(scope="module")
def promtool() -> str:
    """scripts/setup.sh puts promtool into the venv; a missing one is a setup defect, not a skip."""
    venv = Path(sys.prefix) / "bin" / "promtool"
    path = str(venv) if venv.exists() else shutil.which("promtool")
    assert path, "promtool not installed: run scripts/setup.sh (from Debian's prometheus package)"
    return path


def run_promtool(promtool: str, *args: str) -> None:
    proc = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"promtool {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"


# ---- Prometheus rules ---------------------------------------------------------------------


def test_promtool_check_rules(promtool):
    run_promtool(promtool, "check", "rules", str(RULES))


def test_promtool_rule_unit_tests(promtool):
    run_promtool(promtool, "test", "rules", str(RULES_TEST))


def test_rules_define_the_alerts_and_recordings():
    rules = load_rules()
    assert {r["alert"] for r in rules if "alert" in r} == ALERTS
    assert RECORDED <= {r["record"] for r in rules if "record" in r}


def test_alerts_tell_the_operator_what_to_do():
    for rule in load_rules():
        if "alert" not in rule:
            continue
        name = rule["alert"]
        assert rule.get("for"), f"{name}: no 'for' duration"
        assert rule.get("labels", {}).get("severity") in ("warning", "critical"), name
        annotations = rule.get("annotations", {})
        assert annotations.get("summary"), f"{name}: no summary"
        assert "triton-embed doctor" in annotations.get("description", ""), (
            f"{name}: the description must say what to run"
        )


def test_every_alert_is_unit_tested_firing_and_quiet():
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    cases = [case for t in tests for case in t.get("alert_rule_test", [])]
    for name in ALERTS:
        mine = [c for c in cases if c["alertname"] == name]
        assert any(c.get("exp_alerts") for c in mine), f"{name}: no case where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{name}: no case where it is quiet"


def test_rules_read_only_exported_or_recorded_series():
    rules = load_rules()
    recorded = {r["record"] for r in rules if "record" in r}
    for rule in rules:
        names = metric_names(rule["expr"])
        unknown = {n for n in names if not is_known(n, recorded)}
        assert not unknown, f"{rule.get('record') or rule['alert']} reads unknown series {unknown}"


def test_reference_throughput_is_the_committed_reference_row():
    # triton_pa (the ensemble under perf_analyzer), 50-token texts, batch 1, concurrency 32.
    ref = json.loads((REPO_ROOT / "perf" / "reference_cpu2.json").read_text())
    (row,) = [
        r
        for r in ref["rows"]
        if (r["contender"], r["length"], r["batch"], r["concurrency"]) == ("triton_pa", 50, 1, 32)
    ]
    (rule,) = [
        r for r in load_rules() if r.get("record") == "triton_embed:reference_tokens_per_second"
    ]
    value = float(re.fullmatch(r"vector\((\d+(?:\.\d+)?)\)", rule["expr"].strip()).group(1))
    assert value == pytest.approx(row["tokens_s"], abs=1.0)


def test_families_are_registered_by_the_serving_code():
    sources = "\n".join(
        p.read_text()
        for folder in (REPO_ROOT / "server" / "triton_embed_server", REPO_ROOT / "model_repository")
        for p in folder.rglob("*.py")
    )
    registered = {f for f in OUR_FAMILIES if f'"{f}"' in sources}
    assert registered == OUR_FAMILIES, (
        f"not registered by the serving code: {OUR_FAMILIES - registered}"
    )


# ---- Grafana dashboard -----------------------------------------------------------------------


def test_dashboard_variables():
    dashboard = load_dashboard()
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for name in ("instance", "model", "gateway"):
        assert variables[name]["type"] == "query"
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, var["name"]
            assert metric_names(var["definition"]) <= OUR_FAMILIES | TRITON_FAMILIES


def test_dashboard_panels_are_well_formed():
    dashboard = load_dashboard()
    panels = dashboard_panels(dashboard)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: dict[tuple[int, int], str] = {}
    for panel in panels:
        title = panel.get("title", panel["id"])
        pos = panel["gridPos"]
        assert all(isinstance(pos[k], int) for k in ("x", "y", "w", "h")), title
        assert pos["w"] > 0 and pos["h"] > 0 and pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, title
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{title} overlaps {cells[(x, y)]}"
                cells[(x, y)] = title
        if panel["type"] == "row":
            continue
        assert panel["type"] in ("timeseries", "stat", "table", "text"), title
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel.get("targets"), f"{title}: no query"
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), f"{title}: duplicate refId"
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"], title
            assert target["expr"].strip(), title


def test_dashboard_reads_only_exported_or_recorded_series():
    recorded = {r["record"] for r in load_rules() if "record" in r}
    used = set()
    for panel, target in dashboard_targets(load_dashboard()):
        names = metric_names(target["expr"])
        assert names, f"{panel['title']}/{target['refId']} reads no known series"
        unknown = {n for n in names if not is_known(n, recorded)}
        assert not unknown, f"{panel['title']}/{target['refId']} reads unknown series {unknown}"
        used |= names
    assert RECORDED <= used, f"recorded series not on the dashboard: {RECORDED - used}"


def test_dashboard_queries_parse_as_promql(promtool, tmp_path: Path):
    rules = [
        {
            "record": f"dashboard:panel_{panel['id']}_{target['refId']}",
            "expr": plain_promql(target["expr"]),
        }
        for panel, target in dashboard_targets(load_dashboard())
    ]
    assert rules and not any("$" in r["expr"] for r in rules)
    path = tmp_path / "dashboard_queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    run_promtool(promtool, "check", "rules", str(path))


def test_dashboard_shows_every_gateway_family():
    used = set()
    for _, target in dashboard_targets(load_dashboard()):
        used |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in metric_names(target["expr"])}
    gateway = {f for f in OUR_FAMILIES if f.startswith("triton_embed_gateway_")}
    assert gateway and gateway <= used, f"gateway families not on the dashboard: {gateway - used}"


def test_metric_names_finds_series_not_labels():
    expr = (
        "sum by (instance, numa_node) (rate(triton_embed_numa_pages_total"
        '{event="numa_miss", model=~"nv_x"}[5m])) / triton_embed:numa_miss_ratio:rate5m'
    )
    assert metric_names(expr) == {
        "triton_embed_numa_pages_total",
        "triton_embed:numa_miss_ratio:rate5m",
    }
    assert is_known("triton_embed_execute_seconds_bucket", set())
    assert not is_known("triton_embed_tokens_total_bucket", set())
    assert not is_known("triton_embed_token_total", set())
