"""Per-tenant usage by the hour: requests, texts, tokens and their USD cost.

The gateway records every answered request of a tenant here (:meth:`UsageLedger.record`)
and serves the table at ``GET /admin/usage`` (behind the admin key; ``?format=csv`` for
CSV, JSON otherwise), which ``triton-embed usage`` calls. Cost is tokens x the tenants
file's ``usd_per_million_tokens`` / 10^6 (docs/operations.md, "Cost per million tokens",
gives the figure: hourly price / tokens per second). The ledger keeps the last
:data:`KEEP_HOURS` hours; for longer history scrape the Prometheus counters
(``triton_embed_gateway_tenant_tokens_total``). With ``--workers N`` the workers keep one
table in their shared store (:class:`~triton_embed_server.gateway.shared.SharedUsageLedger`),
so whichever worker answers, the route gives the sum of all of them.
"""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

#: Hours of usage kept (31 days).
KEEP_HOURS = 31 * 24
#: The columns of a usage row, in order.
COLUMNS = ("tenant", "hour", "requests", "texts", "tokens", "cost_usd")


@dataclass
class _Row:
    requests: int = 0
    texts: int = 0
    tokens: int = 0


class UsageLedger:
    """Usage per tenant and UTC hour.

    Args:
        clock: seconds since the epoch (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.time):
        self.clock = clock
        self._rows: dict[tuple[str, int], _Row] = {}

    def record(self, tenant: str, texts: int, tokens: int) -> None:
        """Count one answered request of ``tenant`` with the texts and tokens it was served."""
        hour = int(self.clock()) // 3600
        row = self._rows.get((tenant, hour))
        if row is None:
            row = self._rows[(tenant, hour)] = _Row()
            oldest = hour - KEEP_HOURS
            for key in [k for k in self._rows if k[1] <= oldest]:
                del self._rows[key]
        row.requests += 1
        row.texts += texts
        row.tokens += tokens

    def table(self) -> list[tuple[str, int, int, int, int]]:
        """``(tenant, hour, requests, texts, tokens)``, by tenant then hour (hours since 1970)."""
        return [(t, h, r.requests, r.texts, r.tokens) for (t, h), r in sorted(self._rows.items())]

    def rows(self, usd_per_million_tokens: float) -> list[dict]:
        """The table, by tenant then hour: ``hour`` is ISO 8601 UTC (``2026-12-07T11:00:00Z``)."""
        out = []
        for tenant, hour, requests, texts, tokens in self.table():
            out.append(
                {
                    "tenant": tenant,
                    "hour": datetime.fromtimestamp(hour * 3600, UTC).strftime("%Y-%m-%dT%H:00:00Z"),
                    "requests": requests,
                    "texts": texts,
                    "tokens": tokens,
                    "cost_usd": round(tokens * usd_per_million_tokens / 1e6, 9),
                }
            )
        return out


def to_csv(rows: list[dict]) -> str:
    """The rows as CSV with a header line (:data:`COLUMNS`)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
