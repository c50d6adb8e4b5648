"""The benchmark's reports: rows to JSON/CSV, the summary table, plots, the regression guard.

A row is one run of one contender: ``contender``, ``length`` (tokens per text, or ``MIXED``),
``batch`` (texts per request; 0 for the engine), ``concurrency`` (requests in flight; engine
replicas for the engine), ``texts_s``, ``tokens_s``, ``tokens_per_text``, ``p50_ms``,
``p99_ms`` and ``errors``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from perf.contenders import CONTENDERS
from perf.corpora import MIXED, label

REGRESSION_DROP = 0.10  # a run more than 10% below its reference row is a regression


def save(rows: list[dict], out_dir: Path, stem: str, **meta) -> None:
    """``<stem>.json`` (rows plus ``meta``) and ``<stem>.csv`` (one line per run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    fields = sorted({k for r in rows for k in r if k != "detail"})
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def best(rows: list[dict], contender: str, length: int, batch: int | None = None) -> float:
    """Best tokens/s of a contender at one length (and texts per request)."""
    vals = [
        r["tokens_s"]
        for r in rows
        if r["contender"] == contender
        and r["length"] == length
        and (batch is None or r["batch"] == batch)
        and not r["errors"]
    ]
    return max(vals, default=0.0)


def summarize(rows: list[dict], out_dir: Path) -> str:
    """Markdown table of best throughput per contender and the headline ratios."""
    lengths = sorted({r["length"] for r in rows}, key=lambda n: (n == MIXED, n))
    batches = sorted({r["batch"] for r in rows if r["batch"]})
    # engine rows: batch 0, "concurrency" = engine replicas; the ceiling is the best layout
    lines = [
        "| contender | "
        + " | ".join(f"len {label(n)}, {b}/req" for n in lengths for b in batches)
        + " |",
        "|---|" + "---|" * (len(lengths) * len(batches)),
    ]
    for c in CONTENDERS:
        cells = [
            f"{best(rows, c, n, None if c == 'engine' else b):,.0f}"
            for n in lengths
            for b in batches
        ]
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Best tokens/s over the concurrency sweep. Headline ratios (targets from issue 4):"
    )
    for n in lengths:
        engine = best(rows, "engine", n)
        for b in batches:
            ours = best(rows, "triton_pa", n, b)
            theirs = max(best(rows, "vllm_float", n, b), best(rows, "vllm_base64", n, b))
            short = n == 50
            lines.append(
                f"- len {label(n)}, {b} text(s)/request: ensemble / engine = "
                f"{ours / engine if engine else float('nan'):.2f} "
                f"(target {0.90 if short else 0.85}); "
                f"ensemble / vLLM server = {ours / theirs if theirs else float('nan'):.2f} "
                f"(target {1.8 if short else 1.6})"
            )
    conc1 = [
        (c, r["p99_ms"])
        for c in ("triton_pa", "vllm_float", "vllm_base64")
        for r in rows
        if r["contender"] == c
        and r["length"] == lengths[0]
        and r["batch"] == 1
        and r["concurrency"] == 1
    ]
    if conc1:
        lines.append(
            f"- p99 latency at concurrency 1, len {label(lengths[0])}, 1 text/request: "
            + ", ".join(f"{c} {p:.1f} ms" for c, p in conc1 if p is not None)
        )
    text = "\n".join(lines) + "\n"
    (out_dir / "summary.md").write_text(text)
    try:
        plot(rows, out_dir)
    except Exception as exc:  # noqa: BLE001 - plots are a convenience
        print(f"plotting failed: {exc}")
    return text


def plot(rows: list[dict], out_dir: Path) -> None:
    """Draw ``throughput_len<length>_batch<texts per request>.png`` per length and batch.

    Each holds tokens/s vs concurrency per contender (the engine ceiling as a dashed line)
    and p50/p99 request latency vs concurrency.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contenders = [c for c in CONTENDERS if c != "engine"]  # the engine is the dashed line
    for n in sorted({r["length"] for r in rows}):
        for b in sorted({r["batch"] for r in rows if r["batch"]}):
            fig, (ax, lat) = plt.subplots(1, 2, figsize=(11, 4))
            for c in contenders:
                pts = sorted(
                    (r["concurrency"], r["tokens_s"], r["p50_ms"], r["p99_ms"])
                    for r in rows
                    if r["contender"] == c
                    and r["length"] == n
                    and r["batch"] == b
                    and not r["errors"]
                )
                if not pts:
                    continue
                conc, tps, p50, p99 = zip(*pts, strict=True)
                line = ax.plot(conc, tps, marker="o", label=c)[0]
                if None not in p99:
                    lat.plot(conc, p99, marker="o", color=line.get_color(), label=f"{c} p99")
                    lat.plot(
                        conc,
                        p50,
                        marker=".",
                        linestyle=":",
                        color=line.get_color(),
                        label=f"{c} p50",
                    )
            ax.axhline(
                best(rows, "engine", n), linestyle="--", color="gray", label="engine ceiling"
            )
            ax.set(
                xlabel="concurrent requests",
                ylabel="tokens/s",
                xscale="log",
                title=f"{label(n)}-token texts, {b} per request: throughput",
            )
            lat.set(
                xlabel="concurrent requests",
                ylabel="request latency, ms",
                xscale="log",
                yscale="log",
                title="latency percentiles",
            )
            ax.legend(fontsize=7)
            lat.legend(fontsize=6, ncol=2)
            fig.tight_layout()
            fig.savefig(out_dir / f"throughput_len{label(n)}_batch{b}.png", dpi=100)
            plt.close(fig)


def plot_incremental(rows: list[dict], out_dir: Path) -> None:
    """The incremental chart: tokens/s per design step, per load (``incremental.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(dict.fromkeys(r["contender"] for r in rows))
    loads = list(dict.fromkeys((r["batch"], r["concurrency"]) for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(loads)
    for k, (b, c) in enumerate(loads):
        vals = [
            next(
                (
                    r["tokens_s"]
                    for r in rows
                    if r["contender"] == s and (r["batch"], r["concurrency"]) == (b, c)
                ),
                0,
            )
            for s in steps
        ]
        bars = ax.bar(
            [i + k * width for i in range(len(steps))],
            vals,
            width,
            label=f"{b} text(s)/request, {c} in flight",
        )
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    ax.set_xticks(
        [i + width * (len(loads) - 1) / 2 for i in range(len(steps))],
        steps,
        rotation=12,
        fontsize=8,
    )
    ax.set(
        ylabel="tokens/s (50-token texts)", title="One optimization at a time (perf_analyzer, gRPC)"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "incremental.png", dpi=100)
    plt.close(fig)


def compare(rows: list[dict], reference: Path) -> list[str]:
    """Rows more than 10% below the matching reference row."""
    ref = json.loads(reference.read_text())["rows"]
    key = lambda r: (r["contender"], r["length"], r["batch"], r["concurrency"])  # noqa: E731
    ref_by_key = {key(r): r for r in ref}
    drops = []
    for r in rows:
        base = ref_by_key.get(key(r))
        if base and base["tokens_s"] and r["tokens_s"] < (1 - REGRESSION_DROP) * base["tokens_s"]:
            drops.append(
                f"{key(r)}: {r['tokens_s']:.0f} tokens/s vs reference {base['tokens_s']:.0f} "
                f"({r['tokens_s'] / base['tokens_s'] - 1:+.0%})"
            )
    return drops
