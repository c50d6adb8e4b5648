"""Python-backend shared memory on a real server: the computed settings reach tritonserver and
its stubs, the largest request the configs allow is served without growing a region, and
every start path refuses a ``/dev/shm`` too small before starting tritonserver."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
from triton_embed.codec import decode_embeddings
from triton_embed_server.host import shm
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer, free_port
from triton_embed_server.run.supervisor.processes import child_stubs, tritonserver_below

from tests.helpers import COSINE_MIN, MAX_LENGTH, cosines, infer_embed, text_input

pytestmark = pytest.mark.integration

MAX_BATCH = 64  # the tokenizer's and the ensemble's max_batch_size
MAX_CHARS = 64 * MAX_LENGTH  # the tokenizer's max_chars (0 = 64 x max_length)
EXT_B = 0x20000  # CJK Unified Ideographs Extension B: 4 bytes each in UTF-8


def server_processes(server: TritonServer) -> tuple[psutil.Process, list[psutil.Process]]:
    """The tritonserver process under the launcher's supervisor, and its live stubs."""
    tritonserver = tritonserver_below(server.process.pid)
    assert tritonserver is not None, "no tritonserver process under the supervisor"
    return tritonserver, [p for p, _, _ in child_stubs(server.process.pid).values()]


def stub_regions(stubs: list[psutil.Process]) -> dict[str, tuple[str, int, int]]:
    """``{region name: (model, default, growth)}`` from the stubs' command lines.

    python_backend's stub_launcher.cc starts each stub as ``<stub> <model.py> <region>
    <shm-default-byte-size> <shm-growth-byte-size> ...``.
    """
    out = {}
    for stub in stubs:
        argv = stub.cmdline()
        at = next(i for i, a in enumerate(argv) if a.startswith(shm.DEFAULT_REGION_PREFIX))
        out[argv[at]] = (Path(argv[1]).parts[-3], int(argv[at + 1]), int(argv[at + 2]))
    return out


def region_sizes(names) -> dict[str, int]:
    return {n: (shm.SHM_DIR / n).stat().st_size for n in names}


def largest_texts() -> list[str]:
    """``MAX_BATCH`` texts of ``MAX_CHARS`` characters, nearly all 4 bytes in UTF-8.

    Text 0 is all 4-byte characters (the 65,536-byte worst case); the others start with a
    short distinct ASCII prefix so that their embeddings differ.
    """
    texts = []
    for i in range(MAX_BATCH):
        prefix = f"text number {i} of the largest request: " if i else ""
        body = (chr(EXT_B + (i * 997 + k) % 40_000) for k in range(MAX_CHARS - len(prefix)))
        texts.append(prefix + "".join(body))
    return texts


def test_tritonserver_and_its_stubs_run_with_the_computed_settings(server):
    plan = shm.plan_repository(server.model_repository)
    tritonserver, stubs = server_processes(server)
    argv = tritonserver.cmdline()
    for key, value in plan.settings().items():
        assert f"--backend-config=python,{key}={value}" in argv, argv
    regions = stub_regions(stubs)
    assert sorted(model for model, _, _ in regions.values()) == [
        "embedder",
        "embedder",
        "tokenizer",
    ]
    assert {(d, g) for _, d, g in regions.values()} == {
        (plan.default_byte_size, plan.growth_byte_size)
    }
    assert all(size >= plan.default_byte_size for size in region_sizes(regions).values())


def test_the_largest_request_is_served_without_growing_a_region(
    server, grpc_client, reference_model
):
    plan = shm.plan_repository(server.model_repository)
    _, stubs = server_processes(server)
    regions = stub_regions(stubs)
    before = region_sizes(regions)
    texts = largest_texts()
    assert [len(t) for t in texts] == [MAX_CHARS] * MAX_BATCH
    sent = sum(len(t.encode()) for t in texts)
    assert len(texts[0].encode()) == 4 * MAX_CHARS and sent > 4 * 10**6  # > 4 x the 1 MiB default

    # the tokenizer's largest call, through the ensemble
    elements, num_tokens = infer_embed(grpc_client, texts)
    assert num_tokens.tolist() == [MAX_LENGTH] * MAX_BATCH
    got = decode_embeddings(elements)
    want = reference_model.encode(texts, convert_to_numpy=True)
    cos = cosines(got, want)
    assert cos.min() >= COSINE_MIN, f"worst text {int(cos.argmin())}: cosine {cos.min():.6f}"

    # the embedder's largest call: 256 x max_length token IDs (the tokenizer's, four times)
    token_ids = grpc_client.infer("tokenizer", [text_input(texts)]).as_numpy("TOKEN_IDS")
    assert all(len(t) == 4 * MAX_LENGTH for t in token_ids.reshape(-1))
    ids = np.tile(token_ids.reshape(-1, 1), (4, 1))
    assert ids.shape == (256, 1)
    inp = grpcclient.InferInput("TOKEN_IDS", [256, 1], "BYTES")
    inp.set_data_from_numpy(ids)
    out = grpc_client.infer("embedder", [inp], client_timeout=600).as_numpy("EMBEDDING")
    again = decode_embeddings(out.reshape(-1))
    assert cosines(again, np.tile(got, (4, 1))).min() >= COSINE_MIN

    after = region_sizes(regions)
    assert after == before, f"a region grew: {before} -> {after}"
    assert sent < plan.default_byte_size


# ---- refusals: a repository whose largest request no /dev/shm holds -------------------------


@pytest.fixture(scope="module")
def huge_repository(tmp_path_factory):
    """The shipped repository with max_chars = 2**40: 64 x 4 TiB texts."""
    repo = copy_repository(tmp_path_factory.mktemp("shm") / "repo")
    edit_config(repo / "tokenizer" / "config.pbtxt", parameters={"max_chars": str(2**40)})
    return repo


def test_launcher_refuses_before_starting(huge_repository):
    srv = TritonServer(model_repository=huge_repository)
    with pytest.raises(shm.SharedMemoryError, match=r"^/dev/shm has .* MiB free of .* MiB; the "):
        srv.start()
    assert srv.process is None


def run_until_done(argv, tmp_path, env=None):
    """Run a start command; kill its process group if it is still running after 120 s."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    return proc.returncode, out, err


@pytest.mark.parametrize(
    "how",
    ["supervisor", "serve.sh", "serve.sh SUPERVISE=0", "shm check"],
)
def test_start_paths_refuse_before_starting_tritonserver(huge_repository, tmp_path, how):
    marker = tmp_path / "started"
    fake = tmp_path / "tritonserver"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\n")
    fake.chmod(0o755)
    ports = [str(free_port()) for _ in range(3)]  # unused: nothing may start
    serve = [str(REPO_ROOT / "scripts" / "serve.sh"), "--grpc-port", ports[0]]
    serve += ["--http-port", ports[1], "--metrics-port", ports[2]]
    env = {"MODEL_REPOSITORY": str(huge_repository), "RESTRICTED_APIS": "0"}
    argv, want_code, want_prefix = {
        "supervisor": (
            [
                sys.executable,
                "-m",
                "triton_embed_server.run.supervisor",
                "--tritonserver",
                str(fake),
            ]
            + ["--", "--model-repository", str(huge_repository)],
            shm.EXIT_TOO_SMALL,
            "[supervisor] error: /dev/shm has ",
        ),
        "serve.sh": (serve, shm.EXIT_TOO_SMALL, "[supervisor] error: /dev/shm has "),
        "serve.sh SUPERVISE=0": (serve, 1, "shm: error: /dev/shm has "),
        "shm check": (
            [sys.executable, "-m", "triton_embed_server.host.shm", "check"]
            + ["--model-repository", str(huge_repository)],
            1,
            "shm: error: /dev/shm has ",
        ),
    }[how]
    if how == "serve.sh SUPERVISE=0":
        env["SUPERVISE"] = "0"
    code, _, err = run_until_done(argv, tmp_path, env)
    assert code == want_code, err
    line = next(line for line in err.splitlines() if "/dev/shm has " in line)
    assert line.startswith(want_prefix), err
    assert f"stubs of {huge_repository} need " in line or "the stubs need " in line
    assert "docker run --shm-size=" in line and "sizeLimit: " in line
    assert not marker.exists()
