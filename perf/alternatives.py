"""``--mode alternatives``: ours against what users would pick instead, alternated in rounds.

Every server is up for the whole run: our ``embed`` ensemble on one tritonserver, our gateway
in front of it (as shipped: no request merging) and a second one with ``--merge-in-flight 4``
(``gateway_merge_base64``), vLLM's
OpenAI server, and Infinity with its torch and its optimum/ONNX engines (when
``perf/setup_infinity.sh`` has run). In each round, for each length (50 and 256 tokens, the
mixed corpus), every contender of :data:`PLAN` runs at its points, one after the other; the
in-process contenders (``sentence_transformers``, ``engine``) start a child process for their
turn. A contender's figure in a round is its best tokens/s over its points; the summary gives
the best and the median over the rounds, so the machine's drift over minutes (20-30% here)
hits every contender alike and does not decide a ratio. Targets (issue 16) are judged on
median / median.

Points are ``(texts per request, requests in flight)``. Concurrency 1 with one text gives
the latency rows. The servers' points hold each one's best throughput in earlier sweeps
(perf/README.md): 32-64 in flight at 1 text per request, 8 in flight at 16.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from triton_embed_server.run.launcher import TritonServer

from perf.contenders import infinity
from perf.contenders.engine import engine_ceiling
from perf.contenders.gateway import GatewayServer, gateway_load
from perf.contenders.infinity import SERVED_MODEL, InfinityServer
from perf.contenders.openai_load import embeddings_load
from perf.contenders.sentence_transformers import sentence_transformers_encode
from perf.contenders.triton_pa import perf_analyzer
from perf.contenders.vllm_server import VllmServer, vllm_load
from perf.corpora import MIXED, corpus, label, mixed_corpus
from perf.report import recorder, save

LENGTHS = (50, 256, MIXED)
ROUNDS = 2
DURATION_S = 8.0
#: contender -> its points; the order is the order of turns in a round.
PLAN: dict[str, tuple[tuple[int, int], ...]] = {
    "sentence_transformers": ((0, 0),),
    "triton_pa": ((1, 1), (1, 32), (16, 8)),
    "infinity_torch": ((1, 1), (1, 32), (1, 64), (16, 8)),
    "gateway_base64": ((1, 1), (1, 64), (16, 8)),
    "engine": ((0, 2),),
    "infinity_onnx": ((1, 1), (1, 32), (1, 64), (16, 8)),
    "vllm_base64": ((1, 1), (1, 64), (16, 8)),
    "gateway_merge_base64": ((1, 64),),
}
#: Issue 16's throughput targets: (ours, theirs, length or None for every length) -> ratio.
TARGETS = (
    ("triton_pa", ("sentence_transformers",), None, 1.0),
    ("triton_pa", ("infinity_torch", "infinity_onnx"), None, 1.5),
    ("gateway_base64", ("vllm_base64",), 50, 2.0),
)
#: Issue 16's latency target: p99 at concurrency 1, one text, ours <= vLLM's server.
LATENCY = (("triton_pa", "gateway_base64"), "vllm_base64")


def run_alternatives(
    out_dir: Path,
    lengths: list[int] | None = None,
    rounds: int = ROUNDS,
    seconds: float = DURATION_S,
) -> list[dict]:
    """Every contender of :data:`PLAN` in turn, ``rounds`` times; rows saved to ``out_dir``.

    Args:
        out_dir: where ``alternatives.json`` / ``.csv`` go.
        lengths: length keys (default :data:`LENGTHS`).
        rounds: how many times the whole plan runs.
        seconds: measurement time of one point (per batch size for sentence-transformers).

    Returns:
        The rows (``round`` set in each).
    """
    lengths = list(lengths or LENGTHS)
    texts = {n: corpus(n) for n in lengths}
    counts = {MIXED: list(mixed_corpus()[1])} if MIXED in lengths else {}
    rows: list[dict] = []
    record = recorder(texts, rows)
    engines = infinity.ENGINES if infinity.available() else ()
    if not engines:
        print("Infinity not installed (bash perf/setup_infinity.sh): its contenders are skipped")
    plan = {k: v for k, v in PLAN.items() if not k.startswith("infinity_") or engines}
    replicas = min(2, len(os.sched_getaffinity(0)))
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    with (
        TritonServer() as server,
        GatewayServer(server) as gateway,
        GatewayServer(server, extra_args=["--merge-in-flight", "4"]) as merging,
        VllmServer() as vllm,
    ):
        infinities = {}
        try:
            for engine in engines:
                infinities[engine] = InfinityServer(engine).__enter__()
            vllm_url = f"http://127.0.0.1:{vllm.port}/v1/embeddings"

            def measure(contender: str, n: int, b: int, c: int) -> dict:
                sent, tokens = texts[n][0], counts.get(n)
                if contender == "sentence_transformers":
                    return sentence_transformers_encode(n, seconds)
                if contender == "engine":
                    return engine_ceiling(n, seconds, replicas)
                if contender == "triton_pa":
                    return perf_analyzer(
                        server, sent, b, c, seconds,
                        tokens_per_text=texts[n][1], count_tokens=n == MIXED,
                    )  # fmt: skip
                if contender.startswith("infinity_"):
                    url = infinities[contender.split("_")[1]].url
                    return embeddings_load(
                        url, sent, b, c, seconds, "base64",
                        model=SERVED_MODEL, options={}, text_tokens=tokens,
                    )  # fmt: skip
                if contender == "vllm_base64":
                    return vllm_load(vllm_url, sent, b, c, seconds, "base64", text_tokens=tokens)
                url = merging.url if "merge" in contender else gateway.url
                return gateway_load(url, sent, b, c, seconds, "base64", text_tokens=tokens)

            for k in range(1, rounds + 1):
                for n in lengths:
                    for contender, points in plan.items():
                        for b, c in points:
                            record(contender, n, b, c, measure(contender, n, b, c), round=k)
        finally:
            for srv in infinities.values():
                srv.__exit__()
    save(
        rows,
        out_dir,
        "alternatives",
        mode="alternatives",
        started=started,
        rounds=rounds,
        order=list(plan),
        duration_s=seconds,
        cpus=len(os.sched_getaffinity(0)),
    )
    return rows


def per_round(rows: list[dict], contenders: tuple[str, ...], length: int) -> dict[int, float]:
    """``{round: best tokens/s}`` of any of ``contenders`` at ``length`` over all its points."""
    out: dict[int, float] = {}
    for r in rows:
        if r["contender"] in contenders and r["length"] == length and not r["errors"]:
            out[r["round"]] = max(out.get(r["round"], 0.0), r["tokens_s"])
    return out


def latency(rows: list[dict], contender: str, length: int) -> tuple[float, float] | None:
    """(median p50, median p99) in ms over the rounds at concurrency 1, one text."""
    runs = [
        r
        for r in rows
        if r["contender"] == contender
        and r["length"] == length
        and (r["batch"], r["concurrency"]) == (1, 1)
        and r["p99_ms"] is not None
        and not r["errors"]
    ]
    if not runs:
        return None
    return (
        statistics.median(r["p50_ms"] for r in runs),
        statistics.median(r["p99_ms"] for r in runs),
    )


def summarize_alternatives(rows: list[dict], out_dir: Path) -> str:
    """The tables of ``--mode alternatives``; also written to ``<out_dir>/alternatives.md``.

    Per length: each contender's best tokens/s per round (over its points), the best and
    median of those, and the points that gave it; then the issue 16 ratios, median / median
    (and best / best, per round); then p50/p99 at concurrency 1.

    Returns:
        The markdown text.
    """
    lengths = sorted({r["length"] for r in rows}, key=lambda n: (n == MIXED, n))
    present = [c for c in PLAN if any(r["contender"] == c for r in rows)]
    lines = [
        "Tokens/s: each contender's best over its points in each round; best and median over "
        "the rounds (the contenders in turn, every server up).",
        "",
        "| contender | "
        + " | ".join(f"{label(n)}: best | median | rounds" for n in lengths)
        + " |",
        "|---|" + "---|---|---|" * len(lengths),
    ]
    for c in present:
        cells = []
        for n in lengths:
            values = [v for _, v in sorted(per_round(rows, (c,), n).items())]
            if values:
                cells += [
                    f"{max(values):,.0f}",
                    f"{statistics.median(values):,.0f}",
                    " / ".join(f"{v:,.0f}" for v in values),
                ]
            else:
                cells += ["n/a"] * 3
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios against issue 16's targets (judged on median / median):", ""]
    for ours, theirs, only, target in TARGETS:
        for n in lengths:
            if only is not None and n != only:
                continue
            mine = per_round(rows, (ours,), n)
            # "their best backend": the better contender by median
            candidates = [per_round(rows, (t,), n) for t in theirs]
            candidates = [x for x in candidates if x]
            if not mine or not candidates:
                continue
            other = max(candidates, key=lambda x: statistics.median(x.values()))
            med = statistics.median(mine.values()) / statistics.median(other.values())
            paired = [mine[k] / other[k] for k in sorted(mine) if other.get(k)]
            name = " or ".join(theirs) if len(theirs) > 1 else theirs[0]
            lines.append(
                f"- {label(n)}: {ours} / {name}: median / median **{med:.2f}** "
                f"(target {target:.1f}: {'met' if med >= target else 'NOT met'}), "
                f"best / best {max(mine.values()) / max(other.values()):.2f}, per round "
                + " / ".join(f"{x:.2f}" for x in paired)
            )
    lines += [
        "",
        "Latency at concurrency 1, one text per request (median over the rounds), ms:",
        "",
        "| length | " + " | ".join(f"{c} p50 / p99" for c in (*LATENCY[0], LATENCY[1])) + " |",
        "|---|" + "---|" * (len(LATENCY[0]) + 1),
    ]
    for n in lengths:
        cells = []
        for c in (*LATENCY[0], LATENCY[1]):
            got = latency(rows, c, n)
            cells.append(f"{got[0]:.1f} / {got[1]:.1f}" if got else "n/a")
        lines.append(f"| {label(n)} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "alternatives.md").write_text(text)
    try:
        plot_alternatives(rows, out_dir / "alternatives.png")
    except Exception as exc:  # noqa: BLE001 - the plot is a convenience
        print(f"plotting failed: {exc}")
    return text


def plot_alternatives(rows: list[dict], path: Path) -> None:
    """Bars: each contender's median tokens/s per length, the rounds' range as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in rows}, key=lambda n: (n == MIXED, n))
    present = [c for c in PLAN if any(r["contender"] == c for r in rows)]
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(present)
    for i, c in enumerate(present):
        med, low, high = [], [], []
        for n in lengths:
            values = list(per_round(rows, (c,), n).values()) or [0.0]
            m = statistics.median(values)
            med.append(m)
            low.append(m - min(values))
            high.append(max(values) - m)
        xs = [j + i * width for j in range(len(lengths))]
        ax.bar(xs, med, width, yerr=[low, high], label=c, capsize=2)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(lengths))])
    ax.set_xticklabels(["mixed" if n == MIXED else f"{n} tokens" for n in lengths])
    ax.set_ylabel("tokens/s (median of rounds; bars: range)")
    ax.set_title("Ours vs sentence-transformers, Infinity, vLLM (best point per contender)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
