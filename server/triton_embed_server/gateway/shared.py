"""What the ``--workers N`` processes of one gateway share: token buckets, slots, usage.

With ``--workers N`` uvicorn runs N processes that each take connections. A tenant's
``tokens_per_minute``, ``burst`` and ``max_concurrency`` must hold for the gateway, not for
each worker, and ``GET /admin/usage`` must answer every worker's usage whichever worker
takes it. The parent process (:func:`~triton_embed_server.gateway.command.run`) creates a
private folder (mode 0700, removed at exit) and passes it to the workers; in it:

* ``limits.sqlite``, this module's :class:`SharedStore`: one SQLite database in WAL mode
  that every worker opens. Tables: ``buckets`` (a tenant's level and when it was computed),
  ``slots`` (a tenant's requests at the upstreams, per worker pid) and ``usage`` (requests,
  texts, tokens per tenant and UTC hour);
* the Prometheus multiprocess files (:mod:`~triton_embed_server.gateway.metrics`).

**Why SQLite in WAL mode.** Every operation is one short transaction (``BEGIN IMMEDIATE``:
read, compute, write), so the check and the update of a bucket or a slot count are atomic
across processes, without a lock of our own, a server, or a process that all requests
pass through. The folder lives for one run of the gateway, so the database need not
survive a crash of the machine: ``synchronous=OFF`` keeps a commit in the page cache
(no ``fsync``). A request makes up to five such operations (admit, slot, slot back,
charge, usage row): about 50 us in all on the 2-core reference machine
(``tests/unit/test_gateway_shared.py`` prints it), 80-120 us through the whole request path
(``python -m perf.gateway_workers``), against about 400 us of gateway CPU per request
(perf/README.md). That is cheap enough to keep each limit exactly, rather than have each
worker enforce 1/N of it, which refuses a tenant early whenever its requests land
unevenly on the workers (with a shared listening socket, whichever worker is idle takes a
connection, and a keep-alive client stays on one worker). The single-worker gateway does
not use this module: its buckets, slots and ledger stay in the process
(:class:`~.quota.TokenBucket`, :class:`~.fair.FairQueue`, :class:`~.usage.UsageLedger`).

**Clocks.** The buckets use ``time.monotonic`` (``CLOCK_MONOTONIC``: one clock for every
process of the machine); the usage rows ``time.time`` (UTC hours).

**A worker that dies** (uvicorn starts another) leaves its slots counted: every worker
drops the slots of pids that are no longer running when it opens the store, and again at
most once per :data:`REAP_INTERVAL_S` while a tenant is at its ``max_concurrency``.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from triton_embed_server.gateway.quota import refilled, wait_s
from triton_embed_server.gateway.usage import KEEP_HOURS, UsageLedger

#: The database's file name in the shared folder.
DB_NAME = "limits.sqlite"
#: Seconds a transaction waits for another worker's (never near: each takes microseconds).
BUSY_TIMEOUT_S = 10.0
#: Seconds between two checks for slots of dead workers while a tenant is at its cap.
REAP_INTERVAL_S = 1.0

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS buckets (tenant TEXT PRIMARY KEY, level REAL, updated REAL)",
    "CREATE TABLE IF NOT EXISTS slots (tenant TEXT, pid INTEGER, n INTEGER, "
    "PRIMARY KEY (tenant, pid))",
    "CREATE TABLE IF NOT EXISTS usage (tenant TEXT, hour INTEGER, requests INTEGER, "
    "texts INTEGER, tokens INTEGER, PRIMARY KEY (tenant, hour))",
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SharedStore:
    """One worker's connection to the shared database (opened in the worker process).

    Args:
        folder: the private folder the parent created.
        clock: monotonic seconds for the buckets (tests pass their own).
        wall_clock: seconds since the epoch for the usage rows (tests pass their own).

    Raises:
        sqlite3.Error: the database cannot be opened or created.
    """

    def __init__(
        self,
        folder: str | Path,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        self.path = Path(folder) / DB_NAME
        self.clock = clock
        self.wall_clock = wall_clock
        self.pid = os.getpid()
        self.db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=OFF")
        with self._write():
            for statement in _SCHEMA:
                self.db.execute(statement)
        self._reaped_at = -REAP_INTERVAL_S
        self.reap()

    def _write(self) -> _Transaction:
        return _Transaction(self.db)

    def close(self) -> None:
        """Close this worker's connection."""
        self.db.close()

    # ---- token buckets ---------------------------------------------------------------

    def bucket(self, tenant: str, tokens_per_minute: int, burst: int) -> SharedTokenBucket:
        """``tenant``'s bucket (created full if no worker has created it yet)."""
        with self._write():
            row = (tenant, float(burst), self.clock())
            self.db.execute("INSERT OR IGNORE INTO buckets VALUES (?, ?, ?)", row)
        return SharedTokenBucket(self, tenant, tokens_per_minute, burst)

    # ---- slots (max_concurrency) -----------------------------------------------------

    def try_acquire(self, tenant: str, cap: int) -> bool:
        """Take one of ``tenant``'s ``cap`` slots if the workers hold fewer; whether taken."""
        for attempt in range(2):
            with self._write():
                (held,) = self.db.execute(
                    "SELECT COALESCE(SUM(n), 0) FROM slots WHERE tenant = ?", (tenant,)
                ).fetchone()
                if held < cap:
                    self.db.execute(
                        "INSERT INTO slots VALUES (?, ?, 1) ON CONFLICT (tenant, pid) "
                        "DO UPDATE SET n = n + 1",
                        (tenant, self.pid),
                    )
                    return True
            if attempt or not self.reap(throttled=True):
                return False
        return False

    def release(self, tenant: str) -> None:
        """Give back one of ``tenant``'s slots taken by this worker."""
        with self._write():
            self.db.execute(
                "UPDATE slots SET n = n - 1 WHERE tenant = ? AND pid = ? AND n > 0",
                (tenant, self.pid),
            )

    def reap(self, throttled: bool = False) -> bool:
        """Drop the slots of workers that are no longer running; whether any were dropped.

        Args:
            throttled: do nothing if the last check was under :data:`REAP_INTERVAL_S` ago.
        """
        now = time.monotonic()
        if throttled and now - self._reaped_at < REAP_INTERVAL_S:
            return False
        self._reaped_at = now
        pids = [pid for (pid,) in self.db.execute("SELECT DISTINCT pid FROM slots")]
        dead = [pid for pid in pids if pid != self.pid and not _alive(pid)]
        if dead:
            with self._write():
                self.db.executemany("DELETE FROM slots WHERE pid = ?", [(pid,) for pid in dead])
        return bool(dead)

    # ---- usage -------------------------------------------------------------------------

    def record_usage(self, tenant: str, hour: int, texts: int, tokens: int) -> None:
        """Add one answered request of ``tenant`` in UTC ``hour`` (hours since the epoch)."""
        with self._write():
            self.db.execute(
                "INSERT INTO usage VALUES (?, ?, 1, ?, ?) ON CONFLICT (tenant, hour) DO UPDATE "
                "SET requests = requests + 1, texts = texts + excluded.texts, "
                "tokens = tokens + excluded.tokens",
                (tenant, hour, texts, tokens),
            )

    def drop_usage_before(self, hour: int) -> None:
        """Forget the usage rows of hours before ``hour``."""
        with self._write():
            self.db.execute("DELETE FROM usage WHERE hour < ?", (hour,))

    def usage_rows(self) -> list[tuple[str, int, int, int, int]]:
        """``(tenant, hour, requests, texts, tokens)`` of every worker, by tenant then hour."""
        return self.db.execute(
            "SELECT tenant, hour, requests, texts, tokens FROM usage ORDER BY tenant, hour"
        ).fetchall()


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an exception)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: object, *rest: object) -> None:
        self.db.execute("COMMIT" if kind is None else "ROLLBACK")


class SharedTokenBucket:
    """A tenant's bucket in the shared store: :class:`~.quota.TokenBucket`'s interface.

    Args:
        store: the worker's store.
        tenant: the tenant's name (the row).
        tokens_per_minute: the refill rate.
        burst: the bucket's size, tokens.
    """

    def __init__(self, store: SharedStore, tenant: str, tokens_per_minute: int, burst: int):
        self.store = store
        self.tenant = tenant
        self.rate_per_s = tokens_per_minute / 60.0
        self.burst = float(burst)

    def _update(self, change: Callable[[float], float]) -> None:
        db, now = self.store.db, self.store.clock()
        with self.store._write():
            level, updated = db.execute(
                "SELECT level, updated FROM buckets WHERE tenant = ?", (self.tenant,)
            ).fetchone()
            level = change(refilled(level, now - updated, self.rate_per_s, self.burst))
            db.execute(
                "UPDATE buckets SET level = ?, updated = ? WHERE tenant = ?",
                (level, max(now, updated), self.tenant),
            )

    @property
    def level(self) -> float:
        """The level now, tokens (refilled; may be below 0)."""
        level, updated = self.store.db.execute(
            "SELECT level, updated FROM buckets WHERE tenant = ?", (self.tenant,)
        ).fetchone()
        return refilled(level, self.store.clock() - updated, self.rate_per_s, self.burst)

    def reconfigure(self, tokens_per_minute: int, burst: int) -> None:
        """New rate and size (a reloaded tenants file); the level is kept, capped at ``burst``."""
        self._update(lambda level: level)
        self.rate_per_s = tokens_per_minute / 60.0
        self.burst = float(burst)
        self._update(lambda level: min(level, self.burst))

    def retry_after_s(self) -> int:
        """0 when a request may go now, else the whole seconds until it may (>= 1)."""
        return wait_s(self.level, self.rate_per_s)

    def reserve(self, tokens: int) -> int:
        """:meth:`~.quota.TokenBucket.reserve`, in one transaction of the shared store."""
        wait: list[int] = []

        def take(level: float) -> float:
            wait.append(wait_s(level, self.rate_per_s))
            return level if wait[0] else level - tokens

        self._update(take)
        return wait[0]

    def charge(self, tokens: int) -> None:
        """Take ``tokens`` (negative: give back), the level at most ``burst`` (may go below 0)."""
        self._update(lambda level: min(self.burst, level - tokens))


class SharedUsageLedger(UsageLedger):
    """:class:`~.usage.UsageLedger` whose rows are every worker's, in the shared store.

    Args:
        store: the worker's store (its ``wall_clock`` dates the rows).
    """

    def __init__(self, store: SharedStore):
        super().__init__(store.wall_clock)
        self.store = store
        self._kept_from = 0

    def record(self, tenant: str, texts: int, tokens: int) -> None:
        """Count one answered request of ``tenant`` with the texts and tokens it was served."""
        hour = int(self.clock()) // 3600
        if hour - KEEP_HOURS + 1 > self._kept_from:
            self._kept_from = hour - KEEP_HOURS + 1
            self.store.drop_usage_before(self._kept_from)
        self.store.record_usage(tenant, hour, texts, tokens)

    def table(self) -> list[tuple[str, int, int, int, int]]:
        """Every worker's rows: ``(tenant, hour, requests, texts, tokens)``."""
        return self.store.usage_rows()
