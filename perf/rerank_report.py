"""The reranking benchmark's summary: medians over the rounds, issue 23's ratios, latency.

A row (:mod:`perf.rerank`) is one run of one contender at one point: ``contender``,
``length`` (tokens per pair), ``batch`` (documents per request; 0 for the engine, which
has no requests), ``concurrency`` (requests in flight; engine replicas for the engine),
``round``, ``pairs_s``, ``tokens_s``, ``tokens_per_pair``, ``tokens_counted_by``,
``p50_ms``, ``p99_ms``, ``errors`` (and ``detail``).

A contender's figure in a round is its best over the concurrency points of that length and
documents per request (:func:`perf.report.round_bests`); the engine's is its figure at that
length. Figures are judged on the median over the rounds; a ratio is median / median, with
each round's own ratio beside it (the contenders of a round ran minutes apart at most).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from perf.report import round_bests

#: The order of the contenders in the tables.
CONTENDERS = ("triton_grpc", "gateway", "engine", "vllm_server", "infinity")
#: Issue 23's targets, judged on tokens/s median / median: (ours, theirs, ratio).
TARGETS = (
    ("triton_grpc", "engine", 0.9),
    ("triton_grpc", "vllm_server", 1.5),
    ("gateway", "engine", 0.9),
    ("gateway", "vllm_server", 1.5),
)
#: The engine's rows have no requests: ``batch`` 0 in every row of it.
ENGINE = "engine"


def per_round(rows: list[dict], contender: str, length: int, docs: int, key: str) -> dict:
    """``{round: best key}`` of ``contender`` at ``length`` tokens and ``docs`` per request.

    The engine's value is the same at every ``docs`` (its rows carry ``batch`` 0).
    """
    return round_bests(rows, (contender,), length, 0 if contender == ENGINE else docs, key)


@dataclass(frozen=True)
class Ratio:
    """One contender's tokens/s over another's at one point.

    Attributes:
        median: median over the rounds of ours / median of theirs (what is judged).
        best: the best round of ours / the best round of theirs.
        rounds: each round's ours / theirs, in round order (rounds both ran in).
    """

    median: float
    best: float
    rounds: tuple[float, ...]

    def verdict(self, target: float) -> str:
        """``met`` or ``NOT met`` against ``target``."""
        return "met" if self.median >= target else "NOT met"


def ratio(rows: list[dict], ours: str, theirs: str, length: int, docs: int) -> Ratio | None:
    """``ours`` / ``theirs`` in tokens/s at one point; ``None`` where either has no figure."""
    mine = per_round(rows, ours, length, docs, "tokens_s")
    other = per_round(rows, theirs, length, docs, "tokens_s")
    if not mine or not other:
        return None
    return Ratio(
        median=statistics.median(mine.values()) / statistics.median(other.values()),
        best=max(mine.values()) / max(other.values()),
        rounds=tuple(mine[k] / other[k] for k in sorted(mine) if other.get(k)),
    )


def latency(rows: list[dict], contender: str, length: int, docs: int) -> tuple | None:
    """At one request in flight: (median p50, median p99, least p99, most p99) in ms.

    Over the rounds' runs without errors; ``None`` where there are none.
    """
    runs = [
        r
        for r in rows
        if (r["contender"], r["length"], r["batch"], r["concurrency"])
        == (contender, length, docs, 1)
        and r["p99_ms"] is not None
        and not r["errors"]
    ]
    if not runs:
        return None
    p99 = [r["p99_ms"] for r in runs]
    return statistics.median(r["p50_ms"] for r in runs), statistics.median(p99), min(p99), max(p99)


def token_mismatches(rows: list[dict]) -> list[str]:
    """Contenders whose counted tokens per pair differ from the pairs' exact length.

    One line per (contender, length): the range counted over its runs and who counted. Their
    tokens/s is still pairs/s x the exact length (:func:`perf.rerank.record`).
    """
    counted: dict[tuple[str, int], list[float]] = {}
    by: dict[tuple[str, int], str] = {}
    for r in rows:
        if not r["errors"] and r.get("tokens_per_pair") not in (None, r["length"]):
            key = (r["contender"], r["length"])
            counted.setdefault(key, []).append(r["tokens_per_pair"])
            by[key] = r.get("tokens_counted_by") or "?"
    return [
        f"{name} at {length} tokens: {min(v):,.0f}-{max(v):,.0f} per pair in {len(v)} runs "
        f"(counted by {by[(name, length)]})"
        for (name, length), v in sorted(counted.items())
    ]


def points(rows: list[dict]) -> list[tuple[int, int]]:
    """The (length, documents per request) points of the rows, in order."""
    return sorted({(r["length"], r["batch"]) for r in rows if r["contender"] != ENGINE})


def _cell(values: dict, fmt: str = ",.0f") -> str:
    if not values:
        return "n/a"
    ordered = [values[k] for k in sorted(values)]
    median = format(statistics.median(ordered), fmt)
    return median + (
        f" ({' / '.join(format(v, fmt) for v in ordered)})" if len(ordered) > 1 else ""
    )


def summarize(rows: list[dict], facts: dict, out_dir: Path) -> str:
    """The markdown summary; also written to ``<out_dir>/summary.md``.

    Args:
        rows: every run.
        facts: the run's facts (:func:`perf.rerank.run`): ``skipped`` (contender -> why it
            was not measured), and where known ``started``, ``cpus``, ``idle_cpu_percent``
            (the machine's CPU with every server up and idle: how quiet it was).
        out_dir: where ``summary.md`` goes.

    Returns:
        The text: pairs/s and tokens/s per contender and point (median over the rounds,
        each round in brackets), issue 23's ratios with their verdicts, the latency at one
        request in flight, any token-count mismatch and the skipped contenders.
    """
    rounds = sorted({r["round"] for r in rows})
    present = [c for c in CONTENDERS if any(r["contender"] == c for r in rows)]
    grid = points(rows)
    header = " | ".join(f"{n} tok x {d} docs" for n, d in grid)
    lines = [
        f"Each contender's best over its concurrency points in each of {len(rounds)} round(s) "
        "(the contenders in turn at each point); median over the rounds, each round in "
        "brackets. The engine has no requests: its figure is per length.",
    ]
    if "idle_cpu_percent" in facts:
        lines.append(
            f"Run of {facts.get('started')} on {facts.get('cpus')} CPUs; the machine's CPU with "
            f"every server up and idle: {facts['idle_cpu_percent']:.1f}% (other work on the host)."
        )
    for key, unit in (("pairs_s", "pairs/s"), ("tokens_s", "tokens/s")):
        lines += ["", f"| {unit} | {header} |", "|---|" + "---|" * len(grid)]
        for c in present:
            cells = [_cell(per_round(rows, c, n, d, key)) for n, d in grid]
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    lines += ["", "Issue 23's targets (tokens/s, median / median; best / best; per round):", ""]
    for ours, theirs, target in TARGETS:
        for n, d in grid:
            got = ratio(rows, ours, theirs, n, d)
            if got is None:
                continue
            lines.append(
                f"- {n} tokens, {d} docs/request: {ours} / {theirs} = **{got.median:.2f}** "
                f"(target {target:.1f}: {got.verdict(target)}); best / best {got.best:.2f}; "
                "per round " + " / ".join(f"{x:.2f}" for x in got.rounds)
            )
    latency_rows = []
    for n, d in grid:
        for c in present:
            got = latency(rows, c, n, d)
            if got:
                latency_rows.append(
                    f"| {c} | {n} | {d} | {got[0]:.1f} | {got[1]:.1f} | {got[2]:.1f}-{got[3]:.1f} |"
                )
    if latency_rows:
        lines += [
            "",
            "Latency at 1 request in flight, ms (median over the rounds; p99 range):",
            "",
            "| contender | tokens/pair | docs/request | p50 | p99 | p99 range |",
            "|---|---|---|---|---|---|",
            *latency_rows,
        ]
    mismatches = token_mismatches(rows)
    lines += ["", "Tokens per pair as counted: " + ("; ".join(mismatches) or "exact in every run.")]
    failed = [r for r in rows if r["errors"]]
    if failed:
        lines.append(
            f"Runs with errors (left out of the figures): {len(failed)}; first: "
            f"{failed[0]['contender']}: {failed[0].get('detail', '')}"
        )
    notes = facts.get("skipped") or {}
    if notes:
        lines += ["", "Not measured:", ""]
        lines += [f"- {c}: skipped: {why}" for c, why in notes.items()]
    text = "\n".join(lines) + "\n"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.md").write_text(text)
    return text
