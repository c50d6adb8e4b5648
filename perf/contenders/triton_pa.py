"""Contender ``triton_pa``: the ``embed`` ensemble over gRPC, driven by ``perf_analyzer``.

perf_analyzer (2.51, installed in the environment by ``scripts/setup.sh``) measures in count
windows; for mixed-length texts the tokens come from the server's own counters.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from triton_embed.admin import GRPC_ADMIN_HEADER
from triton_embed_server.run.launcher import TritonServer
from triton_embed_server.steps.metrics import REPORT_INTERVAL_S

EXPECTED_TOKENS_S = 8000  # sizes perf_analyzer's count windows (the 2-core reference machine)


def write_input_data(path: Path, texts: list[str]) -> Path:
    """Write perf_analyzer's ``--input-data`` JSON: one ``TEXT`` [1] request per text, in turn.

    Returns:
        ``path``.
    """
    path.write_text(json.dumps({"data": [{"TEXT": {"content": [t], "shape": [1]}} for t in texts]}))
    return path


def perf_analyzer_command(
    url: str, data: Path, *options: str, model: str = "embed", admin_key: str | None = None
) -> list[str]:
    """The perf_analyzer 2.51 command line that loads ``model`` over gRPC at ``url``.

    perf_analyzer reads the model config (and statistics), restricted APIs on our servers:
    ``admin_key`` goes in ``-H triton-grpc-protocol-triton-embed-admin-key:<key>``. (Its
    ``--help`` says ``-H`` is ignored for gRPC; 2.51 does send it on the config read, and
    without it stops with "failed to get model config: This protocol is restricted".)

    Args:
        url: the server's gRPC ``host:port``.
        data: an ``--input-data`` JSON file (:func:`write_input_data`).
        *options: further perf_analyzer options (concurrency, windows, ``-f`` ...).
        model: the model to load.
        admin_key: the server's admin key (:attr:`TritonServer.admin_key`); ``None`` sends
            none (a server started without restrictions).

    Returns:
        The argv, starting with the environment's ``bin/perf_analyzer`` wrapper.
    """
    binary = Path(sys.prefix) / "bin" / "perf_analyzer"
    key = ["-H", f"{GRPC_ADMIN_HEADER}:{admin_key}"] if admin_key else []
    return [
        str(binary), "-m", model, "-i", "grpc", "-u", url, *key,
        "--input-data", str(data), *options,
    ]  # fmt: skip


def background_load_options(concurrency: int, seconds: float) -> list[str]:
    """perf_analyzer options for a load that runs under a profile of ``seconds``.

    ``concurrency`` requests in flight; time windows (``--measurement-interval`` and the
    ``-p`` stability window) of ``5 x seconds``, in ms, so the load outlasts the profile.
    """
    window_ms = str(int(seconds * 5000))
    return [
        "--concurrency-range", str(concurrency), "--measurement-interval", window_ms,
        "-p", window_ms,
    ]  # fmt: skip


def perf_analyzer(
    server: TritonServer,
    texts: list[str],
    batch: int,
    conc: int,
    seconds: float,
    model: str = "embed",
    tokens_per_text: float = 50.0,
    count_tokens: bool = False,
) -> dict:
    """Load ``model`` with perf_analyzer over gRPC; texts/s = inferences/s (batch elements).

    Count windows of about ``seconds`` each at this machine's ~8,000 tokens/s (at least two
    requests per client in flight), so a window holds thousands of short requests and still
    completes for long batched ones.

    Args:
        server: the running server.
        texts: texts to send, one per batch element, in turn.
        batch: texts per request.
        conc: requests in flight.
        seconds: about the length of one count window.
        model: the model to load (``embed``, or an ablation model).
        tokens_per_text: tokens per text, to size the windows.
        count_tokens: measure the tokens per text sent by the server's own counters
            (:func:`served_counts` before and after); for mixed-length texts.

    Returns:
        A contender result; a failed run has ``errors`` 1 and perf_analyzer's output tail
        in ``detail``.
    """
    first = max(2 * conc, int(seconds * EXPECTED_TOKENS_S / (tokens_per_text * batch)))
    with tempfile.TemporaryDirectory() as tmp:
        data = write_input_data(Path(tmp, "data.json"), texts)
        out_csv = Path(tmp, "out.csv")
        before = served_counts(server) if count_tokens else None
        # A window of a few long requests can miss perf_analyzer's stability rule three
        # times running; it then asks for bigger windows, so the second try doubles it.
        for window in (first, 2 * first):
            cmd = perf_analyzer_command(
                server.grpc_url,
                data,
                "-b",
                str(batch),
                "--concurrency-range",
                str(conc),
                # count windows: a time window shorter than one request's latency (16 long
                # texts x 32 in flight) records nothing
                "--measurement-mode",
                "count_windows",
                "--measurement-request-count",
                str(window),
                "--stability-percentage",
                "50",
                "--max-trials",
                "3",
                "-f",
                str(out_csv),
                model=model,
                admin_key=server.admin_key,
            )
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
            if "Failed to obtain stable measurement" not in proc.stdout + proc.stderr:
                break
        if proc.returncode != 0 or not out_csv.exists():
            return {
                "texts_s": 0.0,
                "p50_ms": None,
                "p99_ms": None,
                "errors": 1,
                "detail": (proc.stdout + proc.stderr)[-500:],
            }
        row = next(csv.DictReader(out_csv.open()))
        result = {
            "texts_s": float(row["Inferences/Second"]),
            "p50_ms": float(row["p50 latency"]) / 1000,
            "p99_ms": float(row["p99 latency"]) / 1000,
            "errors": 0,
        }
        if before:
            time.sleep(2 * REPORT_INTERVAL_S)  # the stubs flush their counters once a second
            after = served_counts(server)
            texts = after[0] - before[0]
            result["tokens_per_text"] = (after[1] - before[1]) / texts if texts else None
        return result


def served_counts(server: TritonServer) -> tuple[float, float]:
    """Texts and tokens the tokenizer step has served so far, by the server's own count.

    Returns:
        ``(texts, tokens)``: the sums of ``triton_embed_texts_total`` and
        ``triton_embed_tokens_total`` (tokens after truncation) over the tokenizer's instances.
    """
    totals = {"triton_embed_texts_total": 0.0, "triton_embed_tokens_total": 0.0}
    for sample in server.metric_samples():
        if sample.name in totals and sample.labels.get("model") == "tokenizer":
            totals[sample.name] += sample.value
    return totals["triton_embed_texts_total"], totals["triton_embed_tokens_total"]
