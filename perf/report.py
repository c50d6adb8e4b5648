"""The benchmark's reports: rows to JSON/CSV, the summary table, plots, the regression guard.

A row is one run of one contender: ``contender``, ``length`` (tokens per text, or ``MIXED``),
``batch`` (texts per request; 0 for the engine), ``concurrency`` (requests in flight; engine
replicas for the engine), ``texts_s``, ``tokens_s``, ``tokens_per_text``, ``p50_ms``,
``p99_ms`` and ``errors``; rows of ``--mode gateway`` also carry their ``round``.
"""

from __future__ import annotations

import csv
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from perf.contenders import CONTENDERS
from perf.corpora import MIXED, label

REGRESSION_DROP = 0.10  # a run more than 10% below its reference row is a regression
VLLM = ("vllm_float", "vllm_base64")  # "vLLM's server": the better of its two encodings
# Issue 13's targets for the gateway (gateway_base64): against vLLM's server at 50 tokens
# for 1 and 16 texts per request, and against direct gRPC (triton_client) at 16 texts per
# request (the gateway may cost at most 10% of the throughput).
GATEWAY_VS_VLLM_TARGET = {(50, 1): 1.6, (50, 16): 1.6}
GATEWAY_VS_GRPC_TARGET = {16: 0.90}
# the contenders whose latency at concurrency 1 the summaries show
LATENCY_CONTENDERS = (
    "triton_pa",
    "triton_client",
    "gateway_base64",
    "gateway_float",
    "vllm_base64",
    "vllm_float",
)


def save(rows: list[dict], out_dir: Path, stem: str, **meta) -> None:
    """``<stem>.json`` (rows plus ``meta``) and ``<stem>.csv`` (one line per run)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{stem}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    fields = sorted({k for r in rows for k in r if k != "detail"})
    with (out_dir / f"{stem}.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def recorder(texts: dict[int, tuple[list[str], float]], rows: list[dict]) -> Callable:
    """``record(contender, length, batch, conc, result, **extra)``: a row into ``rows``, printed.

    ``tokens_per_text`` is the mean over the texts actually sent where the contender measured
    it (mixed lengths), else the corpus's (exact-length texts); ``extra`` (``round``) is
    stored in the row.
    """

    def record(contender, length, batch, conc, result, **extra):
        per_text = result.pop("tokens_per_text", None) or texts[length][1]
        row = {
            "contender": contender,
            "length": length,
            "batch": batch,
            "concurrency": conc,
            "tokens_per_text": per_text,
            **extra,
            **result,
            "tokens_s": result["texts_s"] * per_text,
        }
        rows.append(row)
        print(
            f"{contender:14s} len={label(length):>5s} batch={batch:2d} conc={conc:2d} "
            f"{row['tokens_s']:9.0f} tokens/s  p99={row['p99_ms'] or 0:8.1f} ms  "
            f"errors={row['errors']}" + "".join(f"  {k}={v}" for k, v in extra.items()),
            flush=True,
        )

    return record


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
    for n in lengths:
        for b in batches:
            gateway = best(rows, "gateway_base64", n, b)
            if not gateway:
                continue
            vllm = max(best(rows, c, n, b) for c in VLLM)
            grpc = best(rows, "triton_client", n, b)
            lines.append(
                f"- len {label(n)}, {b} text(s)/request: gateway_base64 / vLLM server = "
                f"{_ratio(gateway, vllm)}{_target(GATEWAY_VS_VLLM_TARGET.get((n, b)))}; "
                f"gateway_base64 / triton_client = "
                f"{_ratio(gateway, grpc)}{_target(GATEWAY_VS_GRPC_TARGET.get(b))}"
            )
    conc1 = [
        (c, r["p50_ms"], r["p99_ms"])
        for c in LATENCY_CONTENDERS
        for r in rows
        if r["contender"] == c
        and r["length"] == lengths[0]
        and r["batch"] == 1
        and r["concurrency"] == 1
        and r["p99_ms"] is not None
    ]
    if conc1:
        lines.append(
            f"- p50 / p99 latency at concurrency 1, len {label(lengths[0])}, 1 text/request: "
            + ", ".join(f"{c} {p50:.1f} / {p99:.1f} ms" for c, p50, p99 in conc1)
        )
    text = "\n".join(lines) + "\n"
    (out_dir / "summary.md").write_text(text)
    try:
        plot(rows, out_dir)
    except Exception as exc:  # noqa: BLE001 - plots are a convenience
        print(f"plotting failed: {exc}")
    return text


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}" if ours and theirs else "n/a"


def _target(target: float | None) -> str:
    return f" (target {target:.2f})" if target else ""


def _verdict(ratio: float | None, target: float | None) -> str:
    if not target or ratio is None:
        return ""
    return f"target {target:.2f}: {'met' if ratio >= target else 'NOT met'}"


def round_bests(
    rows: list[dict],
    contenders: tuple[str, ...],
    length: int,
    batch: int,
    key: str = "tokens_s",
) -> dict:
    """Per round, the best ``key`` (tokens/s) over the concurrency sweep of any of ``contenders``.

    ``contenders`` of more than one name give "the better of them" in each round (vLLM's
    server: the better of its two encodings). Runs with errors never count.

    Returns:
        ``{round: best value}``.
    """
    out: dict[int, float] = {}
    for r in rows:
        if (
            r["contender"] in contenders
            and r["length"] == length
            and r["batch"] == batch
            and not r["errors"]
        ):
            out[r["round"]] = max(out.get(r["round"], 0.0), r[key])
    return out


def _spread(values: list[float], fmt: str = ",.0f") -> tuple[str, str, str]:
    """(best, median, the values in round order) as table cells."""
    if not values:
        return "n/a", "n/a", ""
    return (
        format(max(values), fmt),
        format(statistics.median(values), fmt),
        " / ".join(format(v, fmt) for v in values),
    )


def summarize_rounds(rows: list[dict], out_dir: Path) -> str:
    """Summary of ``--mode gateway``: best and median of each contender over the rounds.

    For each length and batch: every contender's best tokens/s over the concurrency sweep
    in each round, then the best and the median of those; "vLLM server" is the better of
    its two encodings in each round. The ratios against issue 13's targets are given as
    best / best, median / median and per round (contenders measured next to each other);
    a target is met when the median / median ratio reaches it. Then p50 and p99 latency at
    concurrency 1 (the median over the rounds, and the range of the p99). Also writes
    ``summary.md``, the per-point plots of the medians (:func:`plot`) and
    ``gateway_rounds.png`` (:func:`plot_rounds`).

    Returns:
        The markdown text.
    """
    lengths = sorted({r["length"] for r in rows}, key=lambda n: (n == MIXED, n))
    batches = sorted({r["batch"] for r in rows if r["batch"]})
    rounds = sorted({r["round"] for r in rows})
    present = [c for c in CONTENDERS if any(r["contender"] == c for r in rows)]
    series = [(c, (c,)) for c in present]
    if all(c in present for c in VLLM):
        series.append(("vLLM server (better encoding per round)", VLLM))
    points = [(n, b) for n in lengths for b in batches]
    lines = [
        f"Best tokens/s over the concurrency sweep in each of {len(rounds)} rounds (the "
        "contenders in turn at each point); best and median over the rounds, and each "
        "round's value.",
        "",
        "| contender | "
        + " | ".join(
            f"len {label(n)}, {b}/req: {what}"
            for n, b in points
            for what in ("best", "median", "rounds")
        )
        + " |",
        "|---|" + "---|" * (3 * len(points)),
    ]
    for name, group in series:
        cells = []
        for n, b in points:
            per_round = round_bests(rows, group, n, b)
            cells.extend(_spread([per_round[k] for k in sorted(per_round)]))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios (issue 13's targets; judged on median / median):", ""]
    for n, b in points:
        gateway = round_bests(rows, ("gateway_base64",), n, b)
        for theirs, group, target in (
            ("vLLM server", VLLM, GATEWAY_VS_VLLM_TARGET.get((n, b))),
            ("triton_client", ("triton_client",), GATEWAY_VS_GRPC_TARGET.get(b)),
        ):
            other = round_bests(rows, group, n, b)
            if not gateway or not other:
                continue
            paired = [gateway[k] / other[k] for k in sorted(gateway) if other.get(k)]
            median = statistics.median(gateway.values()) / statistics.median(other.values())
            verdict = _verdict(median, target)
            lines.append(
                f"- len {label(n)}, {b} text(s)/request, gateway_base64 / {theirs}: "
                f"best / best {max(gateway.values()) / max(other.values()):.2f}, "
                f"median / median {median:.2f}, per round "
                + " / ".join(f"{x:.2f}" for x in paired)
                + (f" ({verdict})" if verdict else "")
            )
    latency = []
    for n in lengths:
        for c in LATENCY_CONTENDERS:
            runs = [
                r
                for r in rows
                if r["contender"] == c
                and r["length"] == n
                and r["batch"] == 1
                and r["concurrency"] == 1
                and r["p99_ms"] is not None
            ]
            if not runs:
                continue
            p50 = statistics.median(r["p50_ms"] for r in runs)
            p99s = [r["p99_ms"] for r in runs]
            latency.append(
                f"| {c} | {label(n)} | {p50:.1f} | {statistics.median(p99s):.1f} | "
                f"{min(p99s):.1f}-{max(p99s):.1f} |"
            )
    if latency:
        lines += [
            "",
            "Latency at concurrency 1, 1 text/request (median over the rounds; p99 range):",
            "",
            "| contender | length | p50 ms | p99 ms | p99 range ms |",
            "|---|---|---|---|---|",
            *latency,
        ]
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.md").write_text(text)
    try:
        plot(median_rows(rows), out_dir)
        plot_rounds(rows, out_dir)
    except Exception as exc:  # noqa: BLE001 - plots are a convenience
        print(f"plotting failed: {exc}")
    return text


def median_rows(rows: list[dict]) -> list[dict]:
    """One row per contender and point: the median over the rounds of each measure.

    Runs with errors are left out; a point whose every run failed keeps one failed row.
    """
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["contender"], r["length"], r["batch"], r["concurrency"]), []).append(r)
    out = []
    for (contender, length, batch, conc), runs in groups.items():
        ok = [r for r in runs if not r["errors"]]
        if not ok:
            out.append(dict(runs[0], round=None))
            continue
        row = {"contender": contender, "length": length, "batch": batch, "concurrency": conc}
        for key in ("texts_s", "tokens_s", "tokens_per_text", "p50_ms", "p99_ms"):
            vals = [r[key] for r in ok if r.get(key) is not None]
            row[key] = statistics.median(vals) if vals else None
        row["errors"] = 0
        out.append(row)
    return out


def plot_rounds(rows: list[dict], out_dir: Path) -> None:
    """``gateway_rounds.png``: per length and batch, each contender's best tokens/s per round.

    Bars: the median over the rounds; dots: each round's value (its best over the
    concurrency sweep).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted({(r["length"], r["batch"]) for r in rows if r["batch"]})
    present = [c for c in CONTENDERS if any(r["contender"] == c for r in rows)]
    fig, axes = plt.subplots(1, len(points), figsize=(5.5 * len(points), 4), squeeze=False)
    for ax, (n, b) in zip(axes[0], points, strict=True):
        for i, c in enumerate(present):
            per_round = list(round_bests(rows, (c,), n, b).values())
            if not per_round:
                continue
            median = statistics.median(per_round)
            ax.bar(i, median, color=f"C{i}")
            ax.text(i, median, f"{median:,.0f}", ha="center", va="bottom", fontsize=7)
            ax.plot([i] * len(per_round), per_round, "k.", markersize=5)
        ax.set_xticks(range(len(present)), present, rotation=25, ha="right", fontsize=8)
        ax.set(
            ylabel="tokens/s (best over concurrency)",
            title=f"{label(n)}-token texts, {b} per request",
        )
    fig.suptitle("Median over the rounds (bars) and each round (dots)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out_dir / "gateway_rounds.png", dpi=100)
    plt.close(fig)


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
            ceiling = best(rows, "engine", n)
            if ceiling:
                ax.axhline(ceiling, linestyle="--", color="gray", label="engine ceiling")
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
