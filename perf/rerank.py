"""Reranking throughput side by side in one run (issue 23): ours against vLLM and the engine.

    .venv/bin/python -m perf.rerank            # about 20 min on 2 cores (35 with Infinity)
    .venv/bin/python -m perf.rerank --smoke    # 2-3 min: every contender runs once, briefly

Model: a MiniLM-L6 BERT cross-encoder made offline (:mod:`perf.cross_encoder`:
all-MiniLM-L6-v2's encoder, a seeded classifier head, ``CrossEncoder.save``), served by
every contender from the same folder. Pairs: real Debian fortunes cut with its tokenizer to
exactly 64 or 256 tokens per pair, special tokens included (a 16-token query, the document
the rest; :func:`perf.corpora.exact_pairs`). A request is one query with 16 or 64 documents.

Contenders (every server up for the whole run; Triton's is made by ``repository add``'s
code, :func:`triton_embed_server.models.repository.add_model`, as shipped: 2 scorer
instances, one core each):

* ``triton_grpc``: our reranker ensemble over gRPC (``tritonclient.grpc.aio``), every
  ``SCORE`` decoded; tokens from the answers' ``NUM_TOKENS``.
* ``gateway``: our HTTP gateway in front of that same server, ``POST /v1/rerank`` with
  ``{model, query, documents, top_n}``; skipped, with a note, when the gateway has no
  rerank route (probed first).
* ``vllm_server``: vLLM's OpenAI server (``--runner pooling``) on the same folder, its
  ``/rerank`` route (Jina-style ``{model, query, documents}``); tokens from ``usage``.
* ``engine``: the in-process vLLM engine on token IDs, as our scorer step calls it, one
  engine per core, summed: the ceiling.
* ``infinity``: Infinity's ``/rerank`` (torch engine) when ``perf/setup_infinity.sh`` has
  installed it; otherwise skipped with a note.

In each round, at each point (length, documents per request), every contender runs in
turn (:data:`ORDER`) at each concurrency; the engine runs once per length and round. The
summary (:mod:`perf.rerank_report`) judges issue 23's targets on median / median over the
rounds: ours (gRPC, and the gateway) >= 0.9 x the engine and >= 1.5 x vLLM's server.
Writes ``<out>/results.json`` (rows and the run's facts), ``results.csv`` and
``summary.md`` (default ``perf/rerank/``, git-ignored).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.bench import idle_cpu
from perf.contenders import infinity
from perf.contenders.gateway import RerankGateway, gateway_rerank_load
from perf.contenders.infinity import InfinityServer
from perf.contenders.openai_load import probe_rerank, rerank_load
from perf.contenders.rerank_engine import rerank_engine_ceiling
from perf.contenders.triton_rerank import ENSEMBLE, grpc_rerank_load
from perf.contenders.vllm_server import SERVED_MODEL, VllmServer
from perf.corpora import PairCorpus, exact_pairs
from perf.cross_encoder import MAX_LENGTH
from perf.report import save
from perf.rerank_report import ENGINE, summarize

#: The order of the contenders' turns at each point of a round.
ORDER = ("triton_grpc", "gateway", "vllm_server", "engine", "infinity")


@dataclass(frozen=True)
class Plan:
    """What one run measures.

    Attributes:
        lengths: tokens per pair, special tokens included.
        docs: documents per request (one query each).
        concurrency: requests in flight at each point (1 gives the latency rows).
        seconds: measurement time of one run.
        rounds: how many times the whole sweep runs.
    """

    lengths: tuple[int, ...]
    docs: tuple[int, ...]
    concurrency: tuple[int, ...]
    seconds: float
    rounds: int


#: The measurement. Concurrency: 1 for latency; 4 and 8 requests of 16-64 pairs keep
#: 64-512 pairs in flight, where the embedding sweeps found every contender's best at
#: 16-64 texts per request (perf/README.md: 8 in flight at 16 texts, 4-8 at 64).
FULL = Plan(lengths=(64, 256), docs=(16, 64), concurrency=(1, 4, 8), seconds=8.0, rounds=3)
#: ``--smoke``: one round, a few points of about 2 s: that everything starts, runs, stops.
SMOKE = Plan(lengths=(64,), docs=(16,), concurrency=(1, 4), seconds=2.0, rounds=1)


def build_model(folder: Path) -> Path:
    """The benchmark's cross-encoder in ``folder`` (``python -m perf.cross_encoder``).

    A child process, so that torch's threads never run in the process that generates load.

    Raises:
        RuntimeError: it failed (the message holds its output's end).
    """
    done = subprocess.run(
        [sys.executable, "-m", "perf.cross_encoder", str(folder)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the cross-encoder failed:\n{done.stderr[-3000:]}")
    return folder


def make_repository(root: Path, model: Path) -> Path:
    """A model repository holding the reranker ensemble :data:`ENSEMBLE` of ``model``."""
    from triton_embed_server.models.repository import ModelOptions, add_model

    repository = root / "model_repository"
    add_model(repository, ModelOptions(name=ENSEMBLE, model=str(model)))
    return repository


def record(
    rows: list[dict],
    contender: str,
    corpus: PairCorpus,
    docs: int,
    conc: int,
    round_: int,
    result: dict,
) -> None:
    """Append one run's row (see :mod:`perf.rerank_report`) and print it.

    tokens/s is pairs/s x the pairs' exact length (every pair is cut to it and checked), the
    same for every contender; the contender's own count stays in ``tokens_per_pair`` as a check
    (Infinity's ``usage`` counts characters, not tokens: about 4.2 per token here).
    """
    row = {
        "contender": contender,
        "length": corpus.length,
        "batch": docs,
        "concurrency": conc,
        "round": round_,
        **result,
        "tokens_s": result["pairs_s"] * corpus.length,
    }
    rows.append(row)
    print(
        f"round {round_} {contender:12s} {corpus.length:4d} tokens x {docs:2d} docs conc={conc:2d} "
        f"{row['pairs_s']:8.1f} pairs/s {row['tokens_s']:9.0f} tokens/s "
        f"p99={row['p99_ms'] or 0:8.1f} ms errors={row['errors']}",
        flush=True,
    )


def progress(message: str, _t0: float = time.monotonic()) -> None:
    """Print ``message`` with the seconds since this module was imported."""
    print(f"[{time.monotonic() - _t0:6.1f} s] {message}", flush=True)


#: Infinity's rerank request fields beyond ``model``, ``query`` and ``documents``.
INFINITY_OPTIONS = {"return_documents": False}


def start_infinity(stack: contextlib.ExitStack, model: Path) -> tuple[str | None, str | None]:
    """Infinity's ``/rerank`` on ``model`` when it is installed and serves it.

    Returns:
        ``(its rerank URL, None)``, or ``(None, why not)``.
    """
    if not infinity.available("torch"):
        return (
            None,
            "Infinity is not installed (bash perf/setup_infinity.sh puts it in perf/.infinity/)",
        )
    try:
        server = stack.enter_context(InfinityServer("torch", reranker=model))
    except RuntimeError as exc:
        return None, f"Infinity did not serve the model: {str(exc)[:500]}"
    problem = probe_rerank(server.rerank_url, infinity.SERVED_MODEL, INFINITY_OPTIONS)
    if problem:
        return None, f"Infinity does not rerank with the model: {problem}"
    return server.rerank_url, None


@dataclass
class Servers:
    """The servers of a run, up; each HTTP contender's route, model name and fields.

    Attributes:
        triton: our tritonserver with the reranker ensemble.
        routes: contender -> ``(rerank URL, model, further request fields)`` for the HTTP
            contenders that serve (``top_n`` of the gateway is set per request).
        notes: contender -> why it is not measured.
        pids: server name -> process id (for the idle CPU check).
    """

    triton: TritonServer
    routes: dict[str, tuple[str, str, dict]]
    notes: dict[str, str]
    pids: dict[str, int]

    def measure(self, contender: str, corpus: PairCorpus, docs: int, conc: int, seconds: float):
        """One run of an HTTP or gRPC contender at one point; its result."""
        if contender == "triton_grpc":
            return grpc_rerank_load(self.triton.grpc_url, corpus, docs, conc, seconds)
        url, served, options = self.routes[contender]
        if contender == "gateway":
            return gateway_rerank_load(url, corpus, docs, conc, seconds, served)
        return rerank_load(url, corpus, docs, conc, seconds, model=served, options=options)

    def serves(self, contender: str) -> bool:
        """Whether ``contender`` has requests to measure (the engine has none)."""
        return contender == "triton_grpc" or contender in self.routes


def start_servers(stack: contextlib.ExitStack, model: Path, tmp: Path) -> Servers:
    """Start every server of a run on ``model`` (each stopped when ``stack`` closes).

    vLLM's server starts first and comes up while tritonserver and the gateway start.
    """
    vllm = VllmServer(model=model, max_model_len=MAX_LENGTH)
    stack.push(vllm)  # stopped on the way out even if something fails before it is ready
    vllm.start()
    server = stack.enter_context(
        TritonServer(model_repository=make_repository(tmp, model), ready_timeout_s=600)
    )
    progress(f"tritonserver ready (log: {server.log_path})")
    routes, notes = {}, {}
    gateway = stack.enter_context(RerankGateway(server, ENSEMBLE))
    if gateway.url:
        routes["gateway"] = (gateway.url, ENSEMBLE, {})
    else:
        notes["gateway"] = gateway.note
    progress(f"gateway: {gateway.url or 'skipped: ' + gateway.note}")
    vllm.wait_ready()
    routes["vllm_server"] = (vllm.rerank_url, SERVED_MODEL, {})
    progress(f"vLLM's server ready (log: {vllm.log.name})")
    url, why = start_infinity(stack, model)
    if url:
        routes["infinity"] = (url, infinity.SERVED_MODEL, INFINITY_OPTIONS)
    else:
        notes["infinity"] = why
    progress(f"Infinity: {url or 'skipped: ' + why}")
    return Servers(server, routes, notes, {"triton": server.process.pid, "vllm": vllm.proc.pid})


def run(plan: Plan) -> tuple[list[dict], dict]:
    """Build the model and the pairs, start every server, run the rounds; (rows, facts)."""
    rows: list[dict] = []
    replicas = min(2, len(os.sched_getaffinity(0)))
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rerank-bench-")))
        model = build_model(tmp / "model")
        corpora = {n: exact_pairs(model, n) for n in plan.lengths}
        progress(f"model and pairs ready: {model}")
        servers = start_servers(stack, model, tmp)
        idle, cores = idle_cpu(servers.pids, min(plan.seconds, 5.0))
        progress(
            f"every server up and idle: machine CPU {idle:.1f}%, the servers' cores "
            + ", ".join(f"{k} {v:.3f}" for k, v in cores.items())
        )
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        for k in range(1, plan.rounds + 1):
            for corpus in corpora.values():
                for d in plan.docs:
                    for contender in ORDER:
                        if contender == ENGINE and d == plan.docs[0]:
                            result = rerank_engine_ceiling(model, corpus, plan.seconds, replicas)
                            record(rows, ENGINE, corpus, 0, replicas, k, result)
                        for c in plan.concurrency if servers.serves(contender) else ():
                            result = servers.measure(contender, corpus, d, c, plan.seconds)
                            record(rows, contender, corpus, d, c, k, result)
    facts = {
        "started": started,
        "plan": dataclasses.asdict(plan),
        "order": list(ORDER),
        "cpus": len(os.sched_getaffinity(0)),
        "engine_replicas": replicas,
        "idle_cpu_percent": idle,
        "idle_server_cores": cores,
        "skipped": servers.notes,
    }
    return rows, facts


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="one round, a few 2 s points")
    parser.add_argument("--rounds", type=int, help=f"rounds (default {FULL.rounds})")
    parser.add_argument("--seconds", type=float, help=f"per run (default {FULL.seconds:g})")
    for flag, default, what in (
        ("--lengths", FULL.lengths, "tokens per pair"),
        ("--docs", FULL.docs, "documents per request"),
        ("--concurrency", FULL.concurrency, "requests in flight"),
    ):
        parser.add_argument(
            flag, type=int_list, help=f"{what}, e.g. {','.join(map(str, default))} (the default)"
        )
    parser.add_argument(
        "--out",
        type=Path,
        default=REPO_ROOT / "perf" / "rerank",
        help="results.json, results.csv, summary.md (default perf/rerank/)",
    )
    return parser


def int_list(value: str) -> tuple[int, ...]:
    """Parse ``"16,64"`` into ``(16, 64)``."""
    return tuple(int(x) for x in value.split(","))


def plan_of(args: argparse.Namespace) -> Plan:
    """The plan the command line asks for: :data:`SMOKE` or :data:`FULL`, flags over it."""
    plan = SMOKE if args.smoke else FULL
    given = {
        k: getattr(args, k)
        for k in ("rounds", "seconds", "lengths", "docs", "concurrency")
        if getattr(args, k)
    }
    return dataclasses.replace(plan, **given)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; exit status 1 when any run had errors."""
    args = build_parser().parse_args(argv)
    plan = plan_of(args)
    # SIGTERM unwinds like Ctrl-C, so the servers this run started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows, facts = run(plan)
    save(rows, args.out, "results", **facts)
    print()
    print(summarize(rows, facts, args.out))
    failed = [r for r in rows if r["errors"]]
    if failed:
        print(
            f"{len(failed)} runs had errors: {[(r['contender'], r.get('detail')) for r in failed]}"
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
