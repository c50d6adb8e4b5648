"""Noisy neighbour: an interactive tenant beside a batch one; batch tenants' shares by weight.

An interactive tenant's latency beside a batch tenant indexing at full speed, and two batch
tenants' token shares by weight.

    .venv/bin/python -m perf.noisy_neighbour                 # 2 rounds, about 6 min on 2 cores
    .venv/bin/python -m perf.noisy_neighbour --rounds 1 --seconds 10

One real ``tritonserver`` (the shipped ``model_repository``) and the gateway in front of it
with a tenants file (docs/tenants.md) of four tenants: ``search`` (interactive), ``indexer``
(batch), ``share_1`` and ``share_3`` (batch, weights 1 and 3). In each round, the order of
the first three phases reversed in even rounds:

* ``search`` alone: single-text requests (50-token real texts) through the gateway's OpenAI
  route at a steady ``--search-rate`` for ``--seconds``; its p50/p99 latency.
* ``indexer`` alone: the bulk CLI as a user runs it (``triton-embed embed``, ``--priority``
  batch, its default; ``--concurrency 8``; ``--indexer-batch`` texts per request, by default
  64, the server's ``max_batch_size`` and the CLI's own default) over ``--texts`` real short
  texts, straight to the server's gRPC port (the bulk job does not go through the gateway; its class
  is what the server's queues see); its texts/s from its own summary.
* both: the same CLI run and, until it ends, ``search`` at the same rate.
* shares: ``share_1`` and ``share_3`` each keep ``--share-flight`` requests of 16 texts in
  flight through the gateway for ``--share-seconds`` (tokens counted after its first
  quarter: the shares converge within about 20 s); the gateway's ``--max-upstream-requests``
  (:data:`UPSTREAM_SLOTS`) is below their sum, so its fair scheduler decides who goes; the
  tokens each was served (the responses' ``usage.prompt_tokens``) and the share of each.

Targets (issue 25, on 2 cores): ``search`` p99 beside the indexer at most 2x alone;
``indexer`` beside ``search`` at least 0.8x alone; shares within 10% of 1:3. Rows go to
``<out>/noisy_neighbour_batch<indexer-batch>_max<...>_call<...>.json``, the summary to
stdout. ``--embedder-max-batch`` and ``--batch-call-tokens`` serve a copy of the repository
with the embedder's ``max_batch_size`` / ``batch_call_tokens`` changed (variants).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from triton_embed_server.run.launcher import REPO_ROOT, Gateway, TritonServer

from perf.bulk import FLAGS
from perf.bulk import corpus as bulk_corpus
from perf.bulk import run as bulk_run
from perf.corpora import corpus
from perf.dynamic_batching import Variant, variant_repository
from perf.report import save

#: tenant -> (priority class, weight).
TENANTS = {
    "search": ("interactive", 1),
    "indexer": ("batch", 1),
    "share_1": ("batch", 1),
    "share_3": ("batch", 3),
}
#: The gateway's upstream slots in this run: below the share tenants' requests in flight.
UPSTREAM_SLOTS = 8
SHARE_TEXTS = 16


def tenants_file(path: Path) -> dict[str, str]:
    """Write the run's tenants file; ``{tenant: its API key}``."""
    keys = {name: secrets.token_hex(16) for name in TENANTS}
    lines = ["tenants:"]
    for name, (priority, weight) in TENANTS.items():
        digest = hashlib.sha256(keys[name].encode()).hexdigest()
        lines += [f"  - name: {name}", f"    keys_sha256: [{digest}]",
                  f"    priority: {priority}", f"    weight: {weight}"]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return keys


async def _post(session, url: str, key: str, texts: list[str]) -> tuple[int, int]:
    """One OpenAI embeddings request; (HTTP status, tokens served)."""
    body = {"model": "embed", "input": texts, "encoding_format": "base64"}
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(url, json=body, headers=headers) as resp:
        answer = await resp.json(content_type=None)
        tokens = answer.get("usage", {}).get("prompt_tokens", 0) if resp.status == 200 else 0
        return resp.status, tokens


async def steady(url: str, key: str, texts: list[str], rate: float, stop) -> dict:
    """Single-text requests at ``rate`` per second (open loop) until ``stop()``; latencies."""
    import aiohttp

    latencies, failures, tasks = [], 0, []

    async def one(session, text):
        nonlocal failures
        t0 = time.perf_counter()
        status, _ = await _post(session, url, key, [text])
        if status == 200:
            latencies.append(time.perf_counter() - t0)
        else:
            failures += 1

    async with aiohttp.ClientSession() as session:
        start, k = time.perf_counter(), 0
        while not stop():
            tasks.append(asyncio.create_task(one(session, texts[k % len(texts)])))
            k += 1
            await asyncio.sleep(max(0.0, start + k / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
    lat = np.asarray(latencies) * 1000
    return {
        "requests": k,
        "failures": failures,
        "p50_ms": float(np.percentile(lat, 50)),
        "p99_ms": float(np.percentile(lat, 99)),
    }


async def flood(url: str, keys: dict[str, str], texts: list[str], flight: int, seconds: float):
    """Each tenant of ``keys`` keeps ``flight`` requests in flight; tokens served per tenant."""
    import aiohttp

    served = dict.fromkeys(keys, 0)
    end = time.perf_counter() + seconds
    warm = time.perf_counter() + seconds / 4  # tokens counted after the first quarter

    async def worker(session, tenant, k):
        while time.perf_counter() < end:
            batch = [texts[(k + j) % len(texts)] for j in range(SHARE_TEXTS)]
            status, tokens = await _post(session, url, keys[tenant], batch)
            if status == 200 and time.perf_counter() > warm:
                served[tenant] += tokens

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session, t, k) for t in keys for k in range(flight)))
    return served


def round_rows(args, server, gateway, keys, texts, source, work, k) -> list[dict]:
    """One round's phases as rows."""
    url = f"{gateway.base_url}/v1/embeddings"
    rows = []
    flags = [*FLAGS[:FLAGS.index("--batch-size") + 1], str(args.indexer_batch),
             *FLAGS[FLAGS.index("--batch-size") + 2:]]  # fmt: skip

    def index() -> dict:
        return bulk_run("stream", source, work, server, flags)

    def search_alone():
        end = time.perf_counter() + args.seconds
        result = asyncio.run(steady(url, keys["search"], texts, args.search_rate,
                                    lambda: time.perf_counter() > end))  # fmt: skip
        rows.append({"phase": "search alone", "round": k, **result})

    def indexer_alone():
        indexed = index()
        rows.append({"phase": "indexer alone", "round": k, **indexed})

    async def both():
        done = False

        def index_then_stop():
            nonlocal done
            try:
                return index()
            finally:
                done = True

        search = steady(url, keys["search"], texts, args.search_rate, lambda: done)
        indexed, searched = await asyncio.gather(asyncio.to_thread(index_then_stop), search)
        rows.append({"phase": "indexer beside search", "round": k, **indexed})
        rows.append({"phase": "search beside indexer", "round": k, **searched})

    phases = [search_alone, indexer_alone, lambda: asyncio.run(both())]
    for phase in phases if k % 2 else phases[::-1]:
        phase()
        print(json.dumps(rows[-1]), flush=True)
    shares = {t: keys[t] for t in ("share_1", "share_3")}
    served = asyncio.run(flood(url, shares, texts, args.share_flight, args.share_seconds))
    total = sum(served.values()) or 1
    rows.append({"phase": "shares", "round": k, **{f"{t}_tokens": n for t, n in served.items()},
                 "share_3_fraction": served["share_3"] / total})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    return rows


def summary(rows: list[dict]) -> str:
    """The targets against the medians over rounds."""

    def median(phase, field):
        return statistics.median(r[field] for r in rows if r["phase"] == phase)

    p99_ratio = median("search beside indexer", "p99_ms") / median("search alone", "p99_ms")
    kept = median("indexer beside search", "texts_per_s") / median("indexer alone", "texts_per_s")
    share = median("shares", "share_3_fraction")
    ratio = share / (1 - share)

    def verdict(ok):
        return "met" if ok else "missed"

    return "\n".join([
        "| figure | alone | beside the other | ratio | target | verdict |",
        "|---|---|---|---|---|---|",
        f"| search p50 ms | {median('search alone', 'p50_ms'):.1f} | "
        f"{median('search beside indexer', 'p50_ms'):.1f} | | | |",
        f"| search p99 ms | {median('search alone', 'p99_ms'):.1f} | "
        f"{median('search beside indexer', 'p99_ms'):.1f} | {p99_ratio:.2f} | <= 2 | "
        f"{verdict(p99_ratio <= 2)} |",
        f"| indexer texts/s | {median('indexer alone', 'texts_per_s'):,.0f} | "
        f"{median('indexer beside search', 'texts_per_s'):,.0f} | {kept:.2f} | >= 0.8 | "
        f"{verdict(kept >= 0.8)} |",
        f"| share_3 : share_1 tokens | | | {ratio:.2f} | 3 +- 10% | "
        f"{verdict(abs(ratio / 3 - 1) <= 0.1)} |",
    ])  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.noisy_neighbour [--rounds 2] [--seconds 20] ...``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="search alone")
    parser.add_argument("--share-seconds", type=float, default=60.0, help="the shares phase")
    parser.add_argument("--search-rate", type=float, default=10.0, help="requests/s")
    parser.add_argument("--texts", type=int, default=12000, help="the indexer's corpus")
    parser.add_argument("--indexer-batch", type=int, default=64, help="texts per request")
    parser.add_argument("--share-flight", type=int, default=32, help="per share tenant")
    parser.add_argument(
        "--embedder-max-batch", type=int, help="serve a copy with this embedder max_batch_size"
    )
    parser.add_argument(
        "--batch-call-tokens", type=int, help="serve a copy with this embedder batch_call_tokens"
    )
    parser.add_argument(
        "--interactive-window-s", type=float, help="... and this embedder interactive_window_s"
    )
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "results")
    args = parser.parse_args(argv)
    texts = corpus(50)[0]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        keys = tenants_file(work / "tenants.yaml")
        source = bulk_corpus(work / "corpus.jsonl", args.texts)
        served = {}
        queue = (args.batch_call_tokens, args.interactive_window_s)
        if args.embedder_max_batch or queue != (None, None):
            variant = Variant(
                max_batch_size=args.embedder_max_batch,
                batch_call_tokens=args.batch_call_tokens,
                interactive_window_s=args.interactive_window_s,
            )
            served["model_repository"] = variant_repository(work / "variant", variant)
        with TritonServer(ready_timeout_s=600, **served) as server, Gateway(
            [server.grpc_url], server.admin_key, api_key=keys["search"],
            tenants=work / "tenants.yaml",
            extra_args=["--max-upstream-requests", str(UPSTREAM_SLOTS)],
        ) as gateway:  # fmt: skip
            for k in range(1, args.rounds + 1):
                rows += round_rows(args, server, gateway, keys, texts, source, work, k)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    knobs = {
        "max": args.embedder_max_batch,
        "call": args.batch_call_tokens,
        "window": args.interactive_window_s,
    }
    stem = f"noisy_neighbour_batch{args.indexer_batch}" + "".join(
        f"_{k}{'shipped' if v is None else f'{v:g}'}" for k, v in knobs.items()
    )
    save(rows, args.out, stem, **meta)
    print(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
