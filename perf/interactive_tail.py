"""Where an interactive request's tail goes beside the bulk CLI: the embedder step alone.

One text's token IDs straight to the ``embedder`` step (KServe, interactive class), 10 a
second, while ``triton-embed embed`` indexes 12,000 real short texts through the ensemble at
the batch class; no gateway, no tokenizer step on the measured path. Prints the requests'
p50/p90/p95/p99/max and the embedder's engine calls (count, mean duration and tokens, and
how many took at most 50 / 100 ms) from the step's own metrics.

    .venv/bin/python -m perf.interactive_tail               # 2 rounds, ~3 min on 2 cores
    .venv/bin/python -m perf.interactive_tail --replicas 1  # one engine replica: a core free

With every engine call under 50-100 ms, a tail well above "one call + one's own call" is
spent outside the step's queue (perf/README.md, "Noisy neighbour").
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from triton_embed.codec import encode_token_ids
from triton_embed.priority import Priority, wire
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import TritonServer
from triton_embed_server.steps.metrics import REPORT_INTERVAL_S

from perf.bulk import FLAGS
from perf.bulk import corpus as bulk_corpus
from perf.bulk import run as bulk_run
from perf.corpora import MAX_TOKENS, MODEL, corpus


def token_ids_input(ids: list[int]):
    """The embedder's ``TOKEN_IDS`` input of one text."""
    import tritonclient.grpc as grpcclient

    arr = np.empty((1, 1), dtype=object)
    arr[0, 0] = encode_token_ids([ids])[0]
    tensor = grpcclient.InferInput("TOKEN_IDS", [1, 1], "BYTES")
    tensor.set_data_from_numpy(arr)
    return tensor


def engine_calls(before: list, after: list) -> str:
    """The embedder's engine calls between two metric scrapes, in words."""
    from tests.helpers import metric_sum

    def delta(name: str, **labels) -> float:
        labels = {"model": "embedder", **labels}
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    calls = delta("triton_embed_execute_seconds_count") or 1
    mean_ms = 1000 * delta("triton_embed_execute_seconds_sum") / calls
    mean_tokens = delta("triton_embed_batch_tokens_sum") / calls
    return (
        f"{calls:.0f} engine calls, mean {mean_ms:.1f} ms and {mean_tokens:.0f} tokens; <= 50 ms: "
        f"{delta('triton_embed_execute_seconds_bucket', le='0.05'):.0f}, <= 100 ms: "
        f"{delta('triton_embed_execute_seconds_bucket', le='0.1'):.0f}"
    )


def index(source: Path, work: Path, server, into: dict, done: threading.Event) -> None:
    """The bulk CLI's run over ``source`` (its figures into ``into``); ``done`` set after."""
    try:
        into.update(bulk_run("stream", source, work, server, FLAGS))
    finally:
        done.set()


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.interactive_tail [--rounds 2] [--replicas 2] [--rate 10]``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=2, help="embedder instance_group count")
    parser.add_argument("--rate", type=float, default=10.0, help="interactive requests/s")
    args = parser.parse_args(argv)
    import tritonclient.grpc as grpcclient
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(MODEL))
    ids = [tokenizer(t, truncation=True, max_length=MAX_TOKENS)["input_ids"] for t in corpus(50)[0]]
    interactive = wire(Priority.INTERACTIVE.level, None)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        source = bulk_corpus(work / "corpus.jsonl", 12000)
        repo = copy_repository(work / "model_repository")
        edit_config(repo / "embedder" / "config.pbtxt", count=args.replicas)
        with TritonServer(ready_timeout_s=600, model_repository=repo) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            for k in range(20):  # warm
                client.infer("embedder", [token_ids_input(ids[k % len(ids)])])
            for rnd in range(1, args.rounds + 1):
                done, indexed = threading.Event(), {}
                before = server.metric_samples()
                thread = threading.Thread(target=index, args=(source, work, server, indexed, done))
                thread.start()
                latencies, k, due = [], 0, time.perf_counter()
                while not done.is_set():
                    due += 1 / args.rate
                    start = time.perf_counter()
                    client.infer("embedder", [token_ids_input(ids[k % len(ids)])], **interactive)
                    latencies.append(1000 * (time.perf_counter() - start))
                    k += 1
                    time.sleep(max(0.0, due - time.perf_counter()))
                thread.join()
                time.sleep(REPORT_INTERVAL_S + 1)
                ms = np.array(latencies)
                p = {q: np.percentile(ms, q) for q in (50, 90, 95, 99)}
                print(
                    f"round {rnd}: {len(ms)} requests, p50 {p[50]:.1f} p90 {p[90]:.1f} p95 "
                    f"{p[95]:.1f} p99 {p[99]:.1f} max {ms.max():.1f} ms; indexer "
                    f"{indexed.get('texts_per_s')} texts/s; "
                    f"{engine_calls(before, server.metric_samples())}",
                    flush=True,
                )
            client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
