"""Operations on a real server: custom metrics after real traffic, NUMA placement applied as
`triton-embed doctor` plans it, and the cost gauge on a priced server placed by a plan file."""

from __future__ import annotations

import json
import re
import time

import numpy as np
import psutil
import pytest
from triton_embed.cli import main as cli_main
from triton_embed.codec import encode_token_ids
from triton_embed_server.host import doctor
from triton_embed_server.host.placement.instance import instance_index
from triton_embed_server.host.topology import parse_cpu_list
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer
from triton_embed_server.steps.metrics import (
    NUMA_EVENTS,
    REPORT_INTERVAL_S,
    cost_per_million_tokens,
)

from tests.helpers import DIM, MAX_LENGTH, infer_embed, metric_sum, start_serve_sh, text_input

pytestmark = pytest.mark.integration

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenization happens in its own step of the ensemble.",
    "Ein Satz auf Deutsch, mit Umlauten: Grüße aus München.",
    "word " * 400,  # truncated to the 256-token budget
]


def embedder_stubs(server) -> dict[str, psutil.Process]:
    stubs = {}
    for p in psutil.Process(server.process.pid).children(recursive=True):
        cmd = p.cmdline()
        if any("/embedder/1/model.py" in a for a in cmd):
            stubs[next(a for a in cmd if a.startswith("embedder_"))] = p
    return stubs


def test_metrics_count_what_the_tokenizer_produced_and_failures_as_failures(
    server, grpc_client, hf_tokenizer
):
    expected_tokens = sum(min(len(hf_tokenizer(t)["input_ids"]), MAX_LENGTH) for t in TEXTS)
    time.sleep(REPORT_INTERVAL_S + 1)  # earlier tests' counts are flushed before the baseline
    before = server.metric_samples()
    for batch in (TEXTS[:1], TEXTS[1:3], TEXTS):
        infer_embed(grpc_client, batch)
    with pytest.raises(Exception, match="text 0 is empty"):
        grpc_client.infer("embed", [text_input([""])])
    bad = np.empty((1, 1), dtype=object)
    bad[0, 0] = encode_token_ids([[101, 999999, 102]])[0]
    import tritonclient.grpc as grpcclient

    inp = grpcclient.InferInput("TOKEN_IDS", [1, 1], "BYTES")
    inp.set_data_from_numpy(bad)
    with pytest.raises(Exception, match="outside the vocabulary"):
        grpc_client.infer("embedder", [inp])
    time.sleep(REPORT_INTERVAL_S + 1)  # the gauges' refresh
    after = server.metric_samples()

    def delta(name, **labels):
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    n_texts = 1 + 2 + len(TEXTS)
    for model in ("tokenizer", "embedder"):
        assert delta("triton_embed_tokens_total", model=model) == 2 * expected_tokens - sum(
            min(len(hf_tokenizer(t)["input_ids"]), MAX_LENGTH) for t in TEXTS[3:]
        ), model
        assert delta("triton_embed_texts_total", model=model) == n_texts, model
        assert delta("triton_embed_requests_succeeded_total", model=model) == 3, model
        assert delta("triton_embed_batch_texts_sum", model=model) == n_texts, model
        assert delta("triton_embed_batch_tokens_sum", model=model) == delta(
            "triton_embed_tokens_total", model=model
        )
        assert 1 <= delta("triton_embed_execute_seconds_count", model=model) <= 4, model
        assert 0 < delta("triton_embed_execute_seconds_sum", model=model) < 30, model
    assert delta("triton_embed_texts_truncated_total", model="tokenizer") == 1
    assert delta("triton_embed_requests_failed_total", model="tokenizer", reason="empty") == 1
    assert (
        delta("triton_embed_requests_failed_total", model="embedder", reason="invalid_token_ids")
        == 1
    )
    assert delta("triton_embed_requests_failed_total", model="embedder") == 1
    assert metric_sum(after, "triton_embed_tokens_per_second", model="embedder") > 0
    # execute-time buckets are cumulative: +Inf holds every observation
    assert delta("triton_embed_execute_seconds_bucket", model="embedder", le="+Inf") == delta(
        "triton_embed_execute_seconds_count", model="embedder"
    )


def test_embedder_instances_are_placed_where_the_doctor_plans(server):
    """numa_placement=auto: each instance's CPU affinity and memory node equal the plan."""
    stubs = embedder_stubs(server)
    server_cpus = sorted(psutil.Process(server.process.pid).cpu_affinity())
    plan = doctor.plan_placement(
        doctor.gather_host(process_cpus=lambda: server_cpus), cpu_instances=len(stubs)
    )
    samples = server.metric_samples()
    assert len(stubs) == len(plan.instances) >= 2
    for name, stub in stubs.items():
        want = plan.instances[instance_index(name)]
        assert tuple(sorted(stub.cpu_affinity())) == want.cpus, name
        threads_pinned = [
            t
            for t in stub.threads()
            if tuple(sorted(psutil.Process(t.id).cpu_affinity())) == want.cpus
        ]
        assert len(threads_pinned) >= len(stub.threads()) // 2, (
            name
        )  # the engine's threads inherit it
        numa_maps = open(f"/proc/{stub.pid}/numa_maps").read()
        assert f"bind:{want.numa_node}" in numa_maps, name  # memory bound to the node
        placed = [
            s
            for s in samples
            if s.name == "triton_embed_instance_placement" and s.labels["model_instance"] == name
        ]
        assert len(placed) == 1 and placed[0].value == 1
        assert placed[0].labels["numa_node"] == str(want.numa_node)
        assert parse_cpu_list(placed[0].labels["cpus"]) == list(want.cpus)
        events = {
            s.labels["event"]
            for s in samples
            if s.name == "triton_embed_numa_pages_total" and s.labels["model_instance"] == name
        }
        assert events == set(NUMA_EVENTS), name
    log = server.log_tail(200_000)
    for name in stubs:
        assert re.search(
            rf"embedder {name}: .*placement \(auto\): NUMA node \d+, CPUs [\d,-]+, memory bound",
            log,
        ), name


@pytest.fixture(scope="module")
def priced_server(tmp_path_factory):
    """One embedder instance placed by a doctor plan file, with a price and a 5 s window."""
    tmp = tmp_path_factory.mktemp("priced")
    plan = tmp / "plan.json"
    assert cli_main(["doctor", "--cpu-instances", "1", "--plan-out", str(plan)]) == 0
    repo = copy_repository(tmp / "repository")
    edit_config(
        repo / "embedder" / "config.pbtxt",
        count=1,
        parameters={"numa_placement": str(plan), "hourly_price_usd": "0.36", "cost_window_s": "5"},
    )
    srv = TritonServer(model_repository=repo, ready_timeout_s=400)
    srv.start()
    yield srv, json.loads(plan.read_text())
    srv.stop()


def test_cost_gauge_follows_price_and_measured_throughput(priced_server):
    srv, plan = priced_server
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(srv.grpc_url)
    t_end = time.monotonic() + 4
    while time.monotonic() < t_end:
        infer_embed(client, TEXTS[:3] * 4)
    client.close()
    time.sleep(REPORT_INTERVAL_S + 0.5)
    samples = srv.metric_samples()
    tps = metric_sum(samples, "triton_embed_tokens_per_second", model="embedder")
    cost = metric_sum(samples, "triton_embed_cost_per_million_tokens_usd", model="embedder")
    assert metric_sum(samples, "triton_embed_hourly_price_usd", model="embedder") == pytest.approx(
        0.36
    )
    assert tps > 100
    # every series the shipped dashboard and alert rules read exists on a real server
    shipped = "".join(
        (REPO_ROOT / "scripts" / "monitoring" / f).read_text()
        for f in ("grafana_dashboard.json", "prometheus_rules.yml")
    )
    # (the gateway's own families are checked on a real gateway: test_gateway.py)
    referenced = set(re.findall(r"\btriton_embed_[a-z_]+", shipped)) - set(
        re.findall(r"\btriton_embed_gateway_[a-z_]+", shipped)
    )
    names = {smp.name for smp in samples}
    missing = {r for r in referenced if r not in names and f"{r}_bucket" not in names}  # histogram
    assert len(referenced) >= 10 and not missing, missing
    # the gauge and the throughput come from the same refresh (but are scraped a moment
    # apart, so allow one refresh of drift)
    assert cost == pytest.approx(cost_per_million_tokens(0.36, tps), rel=0.25)
    # the instance sits where the plan file says
    (stub,) = embedder_stubs(srv).values()
    assert sorted(stub.cpu_affinity()) == plan["instances"][0]["cpus"]
    assert re.search(r"placement \(/.*plan\.json\): NUMA node 0", srv.log_tail(200_000))
    # idle: after the window, the throughput is 0 and the cost per token undefined (NaN)
    time.sleep(5 + REPORT_INTERVAL_S + 0.5)
    samples = srv.metric_samples()
    assert metric_sum(samples, "triton_embed_tokens_per_second", model="embedder") == 0
    assert np.isnan(
        metric_sum(samples, "triton_embed_cost_per_million_tokens_usd", model="embedder")
    )


@pytest.mark.slow
def test_serve_script_per_numa_node_serves_and_stops(tmp_path):
    """PER_NUMA_NODE=1 scripts/serve.sh: the doctor's plan decides the servers (one here)."""
    import os
    import signal
    import urllib.request

    from triton_embed import EmbeddingClient
    from triton_embed.admin import ADMIN_KEY_ENV
    from triton_embed_server.host.admin_key import generate_key
    from triton_embed_server.run.launcher import free_port

    http, grpc, metrics = free_port(), free_port(), free_port()
    key = generate_key()  # given, so serve.sh writes no key file into this user's home
    env = {**os.environ, "PER_NUMA_NODE": "1", ADMIN_KEY_ENV: key}
    proc = start_serve_sh((http, grpc, metrics), env, tmp_path / "serve.log")
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            try:
                if (
                    urllib.request.urlopen(
                        f"http://127.0.0.1:{http}/v2/health/ready", timeout=2
                    ).status
                    == 200
                ):
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(1)
        with EmbeddingClient(f"127.0.0.1:{grpc}", admin_key=key) as client:
            assert client.embed(["per node"]).shape == (1, DIM)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) in (0, 1)  # 1: Triton's exit timeout (README, faults)
        out = (tmp_path / "serve.log").read_text()
        assert re.search(rf"per_node: NUMA node 0: grpc 127\.0\.0\.1:{grpc}", out), out[:2000]
        assert "triton-embed-admin-key=***" in out and key not in out  # per_node's commands
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
