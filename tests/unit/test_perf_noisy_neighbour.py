"""perf.noisy_neighbour: its tenants file is one the gateway loads, its summary's verdicts."""

from __future__ import annotations

from triton_embed.priority import Priority
from triton_embed_server.gateway.tenants import load_tenants

from perf.noisy_neighbour import TENANTS, summary, tenants_file


def test_the_tenants_file_gives_each_key_its_tenant_class_and_weight(tmp_path):
    path = tmp_path / "tenants.yaml"
    keys = tenants_file(path)
    tenants = load_tenants(path)
    assert sorted(keys) == sorted(TENANTS) == sorted(tenants.tenants)
    for name, (priority, weight) in TENANTS.items():
        tenant = tenants.identify(keys[name])
        assert (tenant.name, tenant.priority, tenant.weight) == (name, Priority(priority), weight)
    assert tenants.identify("not-a-key") is None


def test_the_summary_takes_medians_and_judges_each_target():
    rows = [
        {"phase": "search alone", "p50_ms": 20.0, "p99_ms": 30.0},
        {"phase": "search alone", "p50_ms": 22.0, "p99_ms": 34.0},
        {"phase": "search beside indexer", "p50_ms": 40.0, "p99_ms": 60.0},
        {"phase": "search beside indexer", "p50_ms": 44.0, "p99_ms": 70.0},
        {"phase": "indexer alone", "texts_per_s": 1000.0},
        {"phase": "indexer beside search", "texts_per_s": 790.0},
        {"phase": "shares", "share_3_fraction": 0.75},
    ]
    text = summary(rows)
    # p99 medians 32 and 65: 2.03 > 2; indexer 0.79 < 0.8; shares 0.75 / 0.25 = 3.00
    assert "| search p99 ms | 32.0 | 65.0 | 2.03 | <= 2 | missed |" in text
    assert "| indexer texts/s | 1,000 | 790 | 0.79 | >= 0.8 | missed |" in text
    assert "| share_3 : share_1 tokens | | | 3.00 | 3 +- 10% | met |" in text
