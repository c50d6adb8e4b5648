"""How long the service takes to serve again after a stub or tritonserver dies.

    .venv/bin/python scripts/recovery_times.py [--repeats 3] [--cases ...] [--json out.json]

Starts one ``python -m triton_embed_server.run.supervisor`` server on free loopback ports (the
shipped ``model_repository``), waits until it is ready, and then, for each case and repeat,
kills one process and probes the service every 0.2 s (``/v2/health/ready`` and a one-text
``embed`` request) until every request has succeeded 12 times in a row again and the
supervisor says it has recovered. The supervisor runs with its defaults, except that every
restart waits the first backoff (1 s) only. Cases:

* ``embedder-stub``: SIGKILL one of the two embedder stubs (the supervisor reloads
  ``embedder``; the other instance keeps serving meanwhile);
* ``tokenizer-stub``: SIGKILL the only tokenizer stub (every request fails until the reload);
* ``server-sigkill``, ``server-sigabrt``: SIGKILL / SIGABRT tritonserver itself (the
  supervisor restarts it).

Times are from the kill: ``ready`` (``/v2/health/ready`` answers 200 again after its last
failure; 0 when it never failed), ``first embed`` (the first successful request after the
killed server is gone), ``all ok`` (the start of the final run of successful requests) and
``supervisor`` (the supervisor's own account: ``reloaded 'model' in`` or ``ready again``).
Prints a markdown table. Stops every process it started, even on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
from triton_embed_server.run.supervised_server import SupervisedServer

CASES = ("embedder-stub", "tokenizer-stub", "server-sigkill", "server-sigabrt")
STREAK = 12
TIMEOUT_S = 600


def embed_once(client=None, url: str = "") -> bool:
    """One one-text ``embed`` request on ``client``, or on a new connection to ``url``.

    The new channel gets its own subchannel pool: gRPC shares connections between channels
    to the same target, and a shared one that failed waits out its reconnect backoff.
    """
    if client is None:
        local = [("grpc.use_local_subchannel_pool", 1)]
        with grpcclient.InferenceServerClient(url, channel_args=local) as fresh:
            return embed_once(fresh)
    text = np.array([[b"recovery probe"]], dtype=object)
    inp = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    inp.set_data_from_numpy(text)
    try:
        client.infer("embed", [inp], client_timeout=30)
        return True
    except Exception:  # noqa: BLE001 - UNAVAILABLE, "not healthy", timeouts: all failures
        return False


def measure(sup: SupervisedServer, case: str, index: int) -> dict[str, float | str]:
    """Kill what ``case`` names, probe until recovered, return the times."""
    server = sup.server()
    if case.endswith("-stub"):
        model = case.split("-")[0]
        stubs = []
        for child in server.children():  # a stub killed earlier stays a zombie of the server
            try:
                if f"/{model}/" in " ".join(child.cmdline()):
                    stubs.append(child)
            except psutil.Error:
                pass
        victim, done_needle = stubs[0], f"reloaded '{model}'"
        done_count = sum(done_needle in line for line in sup.supervisor_lines()) + 1
        sig = signal.SIGKILL
    else:
        victim, done_needle = server, "watching stub processes"
        done_count = sum(done_needle in line for line in sup.supervisor_lines()) + 1
        sig = signal.SIGABRT if case.endswith("sigabrt") else signal.SIGKILL
    samples: list[tuple[float, bool, bool, bool]] = []  # (t, ready, ok, ok on the old channel)
    url = f"127.0.0.1:{sup.ports['grpc']}"
    client = grpcclient.InferenceServerClient(url)  # a long-lived channel, as clients keep
    assert embed_once(client)
    t0 = time.monotonic()
    victim.send_signal(sig)
    if victim is server:
        server.wait(timeout=120)  # the dying server answers a moment longer (SIGABRT)
    gone = time.monotonic() - t0
    try:
        while time.monotonic() - t0 < TIMEOUT_S:
            if sup.process.poll() is not None:
                raise RuntimeError(f"the supervisor exited:\n{sup.log()[-4000:]}")
            ready, ok, ok_old = sup.ready(), embed_once(url=url), embed_once(client)
            samples.append((time.monotonic() - t0, ready, ok, ok_old))
            recovered = sum(done_needle in line for line in sup.supervisor_lines()) >= done_count
            failures = [i + 1 for i, s in enumerate(samples) if not s[2]]
            streak = len(samples) - max(failures, default=0)
            if recovered and streak >= STREAK and samples[-1][3]:
                break
            time.sleep(0.2)
        else:
            raise RuntimeError(f"{case}: not recovered after {TIMEOUT_S} s")
    finally:
        client.close()
    last_not_ready = max((i for i, s in enumerate(samples) if not s[1]), default=None)
    last_failure = max((i for i, s in enumerate(samples) if not s[2]), default=None)
    said_needle = f"{done_needle} in" if victim is not server else "ready again"
    said = [line for line in sup.supervisor_lines() if said_needle in line]
    numbers = re.findall(r"(?:in|again) ([\d.]+) s", said[-1]) if said else []
    return {
        "case": case,
        "repeat": index + 1,
        "gone_s": round(gone, 2),
        "ready_s": 0.0
        if last_not_ready is None
        else round(samples[min(last_not_ready + 1, len(samples) - 1)][0], 1),
        "first_embed_s": round(next(s[0] for s in samples if s[2]), 1),
        "first_embed_old_channel_s": round(next(s[0] for s in samples if s[3]), 1),
        "all_ok_s": 0.0 if last_failure is None else round(samples[last_failure + 1][0], 1),
        "supervisor_s": float(numbers[0]) if numbers else float("nan"),
        "failed_probes": sum(not s[2] for s in samples),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the cases; print the table; return 0 when every case recovered."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", default="embedder-stub,tokenizer-stub,server-sigkill")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {', '.join(CASES)}")
    restarts = sum(c.startswith("server") for c in cases) * args.repeats
    log_path = Path(tempfile.mkstemp(prefix="recovery-", suffix=".log")[1])
    # Every restart with the first backoff (1 s), so that the repeats measure the same thing.
    own = ["--max-restarts", str(restarts + 1), "--restart-backoff-max-s", "1"]
    sup = SupervisedServer(log_path, own)
    rows = []
    try:
        sup.wait_for_line("watching stub processes", 1, TIMEOUT_S)
        for case in cases:
            for i in range(args.repeats):
                rows.append(measure(sup, case, i))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        sup.stop()
        print(f"supervisor log: {log_path}", file=sys.stderr)
    print(f"\n{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.0f} GiB")
    print(
        "| case | repeat | ready (s) | first embed (s) | all ok (s) | old channel (s) "
        "| supervisor (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['repeat']} | {r['ready_s']} | {r['first_embed_s']} | "
            f"{r['all_ok_s']} | {r['first_embed_old_channel_s']} | {r['supervisor_s']} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
