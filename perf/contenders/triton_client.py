"""Contender ``triton_client``: the ``embed`` ensemble driven by our client library.

The client decodes every vector, as an application would.
"""

from __future__ import annotations

import time

import numpy as np
from triton_embed_server.run.launcher import TritonServer


def client_library(
    server: TritonServer,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    model: str = "embed",
) -> dict:
    """Load the ensemble with our client library, every vector decoded.

    Args:
        server: the running server.
        texts: the corpus; sent in whole passes, so mixed lengths keep their proportions.
        batch: texts per request.
        conc: requests in flight.
        seconds: measurement time.
        model: the ensemble to load.

    Returns:
        A contender result; ``tokens_per_text`` is the server's own count per text sent.
    """
    from triton_embed import EmbeddingClient

    # whole passes over the corpus, so mixed lengths are sent in their true proportions
    payload = texts * max(1, -(-batch * conc * 4 // len(texts)))
    latencies, n, tokens, errors = [], 0, 0, 0
    with EmbeddingClient(
        server.grpc_url, batch_size=batch, max_concurrency=conc, admin_key=server.admin_key
    ) as client:
        client.embed(payload[:batch], model=model)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            try:
                result = client.embed_with_details(payload, model=model)
            except Exception:  # noqa: BLE001 - counted, not fatal
                errors += 1
                continue
            latencies.extend(result.latencies_s)
            n += len(payload)
            tokens += int(result.num_tokens.sum())  # the server's own count per text
        dt = time.perf_counter() - t0
    lat = np.asarray(latencies) * 1000
    return {
        "texts_s": n / dt,
        "p50_ms": float(np.percentile(lat, 50)) if len(lat) else None,
        "p99_ms": float(np.percentile(lat, 99)) if len(lat) else None,
        "errors": errors,
        "tokens_per_text": tokens / n if n else None,
    }
