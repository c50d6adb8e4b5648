"""shm: the Python backend's shared-memory sizes from the configs, and the /dev/shm check.

The expected numbers are worked out by hand from the config values, following the formula
of :mod:`triton_embed_server.host.shm` (MiB = 1,048,576 bytes).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from triton_embed_server.host import doctor, per_node, shm
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run import supervisor
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

SHIPPED = REPO_ROOT / "model_repository"
MIB = 1_048_576


def fake_statvfs(monkeypatch, total: int, free: int) -> None:
    """Make every ``os.statvfs`` answer ``total`` bytes, ``free`` of them free (4 KiB blocks)."""

    def statvfs(path):
        blocks, avail = total // 4096, free // 4096
        return os.statvfs_result((4096, 4096, blocks, avail, avail, 0, 0, 0, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs)


def no_process_started(monkeypatch) -> None:
    """Fail the test if a process is started."""

    def popen(*args, **kwargs):
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", popen)


# ---- the arithmetic ---------------------------------------------------------------------------


def test_shipped_repository_by_hand():
    plan = shm.plan_repository(SHIPPED)
    steps = {s.model: s for s in plan.steps}
    assert sorted(steps) == ["embedder", "tokenizer"]  # the ensemble has no stub
    tok, emb = steps["tokenizer"], steps["embedder"]
    # tokenizer: max_batch_size 64, max_length 256 (all-MiniLM-L6-v2's own), max_chars 0 =
    # 64 x 256 = 16,384; 1 instance.
    assert (tok.max_batch_size, tok.stubs) == (64, 1)
    assert tok.tensors == {
        "TEXT": 4_194_560,  # 64 x (4 + 4 x 16,384) = 64 x 65,540
        "TOKEN_IDS": 65_792,  # 64 x (4 + 4 x 256) = 64 x 1,028
        "NUM_TOKENS": 256,  # 64 x 4
    }
    assert tok.inputs == 4_194_560
    # 1 MiB + 64 x 4,096 + 1.25 x 4,260,608 = 1,048,576 + 262,144 + 5,325,760 = 6,636,480
    # -> 7 MiB
    assert tok.region_bytes == 7 * MIB == 7_340_032
    # embedder: max_batch_size 256, max_length 256, dim 384 (hidden_size); 2 instances.
    assert (emb.max_batch_size, emb.stubs) == (256, 2)
    assert emb.tensors == {
        "TOKEN_IDS": 263_168,  # 256 x (4 + 4 x 256)
        "EMBEDDING": 394_240,  # 256 x (4 + 4 x 384) = 256 x 1,540
    }
    # 1 MiB + 256 x 4,096 + 1.25 x 657,408 = 1,048,576 + 1,048,576 + 821,760 = 2,918,912
    # -> 3 MiB
    assert emb.region_bytes == 3 * MIB
    assert plan.default_byte_size == 7_340_032  # the larger region
    assert plan.growth_byte_size == 5 * MIB == 5_242_880  # TEXT, 4,194,560 -> 5 MiB
    # every stub at the 7 MiB default: (1 + 2) x 7 MiB, + 2 x 7 MiB for an embedder reload
    assert plan.reload_bytes() == 14 * MIB
    assert plan.needed_bytes() == 35 * MIB == 36_700_160
    assert plan.backend_config_args() == [
        "--backend-config=python,shm-default-byte-size=7340032",
        "--backend-config=python,shm-growth-byte-size=5242880",
    ]


def test_gpu_config_counts_count_on_every_gpu():
    # configs/gpu.pbtxt: 4 embedder instances per GPU; the tokenizer has no gpu config and
    # keeps config.pbtxt (1 instance).
    one = shm.plan_repository(SHIPPED, "gpu", gpus=1)
    assert {s.model: s.stubs for s in one.steps} == {"embedder": 4, "tokenizer": 1}
    assert one.needed_bytes() == (5 + 4) * 7 * MIB == 66_060_288
    eight = shm.plan_repository(SHIPPED, "gpu", gpus=8)
    assert {s.model: s.stubs for s in eight.steps} == {"embedder": 32, "tokenizer": 1}
    assert eight.needed_bytes() == (33 + 32) * 7 * MIB == 477_102_080


def test_visible_gpus_are_asked_only_when_a_config_needs_them():
    def refuse():
        raise AssertionError("no KIND_GPU group in the CPU configs")

    assert shm.plan_repository(SHIPPED, gpu_counter=refuse).needed_bytes() == 35 * MIB
    plan = shm.plan_repository(SHIPPED, "gpu", gpu_counter=lambda: 2)
    assert {s.model: s.stubs for s in plan.steps}["embedder"] == 8
    unknown = shm.plan_repository(SHIPPED, "gpu", gpu_counter=lambda: None)
    assert {s.model: s.stubs for s in unknown.steps}["embedder"] == 4  # one GPU, a lower bound


def edited_copy(tmp_path: Path) -> Path:
    repo = copy_repository(tmp_path / "repo")
    tokenizer = repo / "tokenizer" / "config.pbtxt"
    edit_config(tokenizer, parameters={"max_length": "128", "max_chars": "1000"})
    tokenizer.write_text(tokenizer.read_text().replace("max_batch_size: 64", "max_batch_size: 8"))
    edit_config(repo / "embedder" / "config.pbtxt", count=3, parameters={"max_length": "128"})
    return repo


def test_edited_copy_by_hand(tmp_path):
    plan = shm.plan_repository(edited_copy(tmp_path))
    steps = {s.model: s for s in plan.steps}
    tok, emb = steps["tokenizer"], steps["embedder"]
    assert tok.tensors == {
        "TEXT": 32_032,  # 8 x (4 + 4 x 1,000)
        "TOKEN_IDS": 4_128,  # 8 x (4 + 4 x 128)
        "NUM_TOKENS": 32,
    }
    # 1,048,576 + 8 x 4,096 + 1.25 x 36,192 = 1,048,576 + 32,768 + 45,240 = 1,126,584 -> 2 MiB
    assert tok.region_bytes == 2 * MIB
    assert emb.stubs == 3
    assert emb.tensors == {"TOKEN_IDS": 132_096, "EMBEDDING": 394_240}  # 256 x 516, 256 x 1,540
    # 1,048,576 + 1,048,576 + 1.25 x 526,336 = 2,097,152 + 657,920 = 2,755,072 -> 3 MiB
    assert emb.region_bytes == 3 * MIB
    assert plan.default_byte_size == 3 * MIB
    assert plan.growth_byte_size == 1 * MIB  # EMBEDDING, 394,240 -> 1 MiB
    assert plan.needed_bytes() == (1 + 3) * 3 * MIB + 3 * 3 * MIB == 22_020_096


def test_other_python_models_are_counted_at_the_default(tmp_path):
    repo = edited_copy(tmp_path)
    (repo / "extra").mkdir()
    (repo / "extra" / "config.pbtxt").write_text(
        'name: "extra"\nbackend: "python"\ninstance_group [ { count: 2, kind: KIND_CPU } ]\n'
    )
    plan = shm.plan_repository(repo)
    extra = {s.model: s for s in plan.steps}["extra"]
    assert (extra.stubs, extra.tensors, extra.region_bytes) == (2, {}, MIB)
    assert "sizes unknown" in extra.describe()
    # its 2 stubs get the 3 MiB default region too
    assert plan.needed_bytes() == (1 + 3 + 2) * 3 * MIB + 3 * 3 * MIB


def test_a_given_default_counts_for_every_stub():
    plan = shm.plan_repository(SHIPPED)
    assert plan.needed_bytes(64 * MIB) == (3 + 2) * 64 * MIB
    # a smaller default: each stub grows to what its model needs
    assert plan.stub_bytes(MIB) == {"embedder": 3 * MIB, "tokenizer": 7 * MIB}
    # + the tokenizer's 7 MiB again: the model whose stubs hold the most
    assert plan.needed_bytes(MIB) == 2 * 3 * MIB + 7 * MIB + 7 * MIB


def test_invalid_parameter_names_the_model(tmp_path):
    repo = copy_repository(tmp_path / "repo")
    edit_config(repo / "tokenizer" / "config.pbtxt", parameters={"max_chars": "lots"})
    with pytest.raises(ValueError, match=r"tokenizer: parameter max_chars='lots' is not an"):
        shm.plan_repository(repo)


# ---- arguments --------------------------------------------------------------------------------


def test_python_backend_settings_both_forms_last_wins():
    args = [
        "--backend-config=python,shm-default-byte-size=1",
        "--backend-config",
        "python,shm-growth-byte-size=2",
        "--backend-config=onnxruntime,shm-default-byte-size=9",
        "--backend-config=python,shm-default-byte-size=3",
    ]
    assert shm.python_backend_settings(args) == {
        "shm-default-byte-size": "3",
        "shm-growth-byte-size": "2",
    }
    assert shm.given_default_byte_size(args) == 3
    assert shm.given_default_byte_size(["--backend-config=python,shm-default-byte-size=x"]) is None


def test_server_arguments_add_only_the_missing_keys(tmp_path, monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=64 * MIB)
    base = ["--model-repository", str(SHIPPED)]
    assert shm.server_arguments(base, path=tmp_path) == [
        *base,
        "--backend-config=python,shm-default-byte-size=7340032",
        "--backend-config=python,shm-growth-byte-size=5242880",
    ]
    given = [*base, "--backend-config", "python,shm-growth-byte-size=1048576"]
    assert shm.server_arguments(given, path=tmp_path) == [
        *given,
        "--backend-config=python,shm-default-byte-size=7340032",
    ]
    both = [*given, "--backend-config=python,shm-default-byte-size=8388608"]
    assert shm.server_arguments(both, path=tmp_path) == both


def test_server_arguments_check_with_the_given_default(tmp_path, monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=40 * MIB)
    base = ["--model-repository", str(SHIPPED)]
    assert len(shm.server_arguments(base, path=tmp_path)) == 4  # 35 MiB fit in 40
    big = [*base, "--backend-config=python,shm-default-byte-size=16777216"]
    with pytest.raises(shm.SharedMemoryError, match=r"need 80\.0 MiB"):  # (3 + 2) x 16 MiB
        shm.server_arguments(big, path=tmp_path)


def test_unreadable_configs_leave_the_arguments_to_tritonserver(tmp_path):
    notes = []
    for args in (["--http-port", "1"], ["--model-repository", str(tmp_path / "nowhere")]):
        assert shm.server_arguments(args, log=notes.append) == args
    assert (
        notes[0] == "shared memory not sized: no --model-repository in the tritonserver arguments"
    )
    assert notes[1].startswith("shared memory not sized: ")


def test_every_model_repository_is_counted(tmp_path):
    other = copy_repository(tmp_path / "other", models=["embedder"])
    plan = shm.plan_arguments(["--model-repository", str(SHIPPED), f"--model-repository={other}"])
    assert [s.model for s in plan.steps] == ["embedder", "tokenizer", "embedder"]
    assert plan.needed_bytes() == (1 + 2 + 2) * 7 * MIB + 2 * 7 * MIB


# ---- the check --------------------------------------------------------------------------------


def test_too_small_message_says_needed_free_and_how(tmp_path, monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=10 * MIB)
    with pytest.raises(shm.SharedMemoryError) as err:
        shm.require_space(35 * MIB, "the stubs", tmp_path)
    assert str(err.value) == (
        f"{tmp_path} has 10.0 MiB free of 64.0 MiB; the stubs need 35.0 MiB (36700160 bytes). "
        "Give the server at least 89 MiB of shared memory: docker run --shm-size=89m, or in "
        "Kubernetes an emptyDir with medium: Memory and sizeLimit: 89Mi mounted at "
        f"{tmp_path}; or lower max_batch_size, max_chars or the instance_group count in the "
        "model configs."
    )


def test_regions_already_there_are_named(tmp_path, monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=10 * MIB)
    for name in ("a", "b"):
        (tmp_path / f"triton_python_backend_shm_region_{name}").write_bytes(b"x" * MIB)
    (tmp_path / "something_else").write_bytes(b"x" * MIB)
    with pytest.raises(shm.SharedMemoryError) as err:
        shm.require_space(35 * MIB, "the stubs", tmp_path)
    assert (
        "(36700160 bytes). 2 Python-backend region(s) already there hold 2.0 MiB; remove "
        "those of servers that no longer run. Give the server at least 89 MiB"
    ) in str(err.value)


def test_enough_room_passes(tmp_path, monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=35 * MIB)
    space = shm.require_space(35 * MIB, "the stubs", tmp_path)
    assert (space.total, space.free, space.regions) == (64 * MIB, 35 * MIB, 0)


# ---- every start path refuses before starting anything ----------------------------------------


def test_launcher_refuses_before_starting(monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=20 * MIB)
    no_process_started(monkeypatch)
    server = TritonServer()
    with pytest.raises(shm.SharedMemoryError, match=r"has 20\.0 MiB free .* need 35\.0 MiB"):
        server.start()
    assert server.process is None and server.log_path is None


def test_launcher_command_carries_the_settings(monkeypatch):
    fake_statvfs(monkeypatch, total=64 * MIB, free=64 * MIB)
    command = TritonServer(extra_args=["--log-verbose", "0"]).command()
    assert command[-2:] == [
        "--backend-config=python,shm-default-byte-size=7340032",
        "--backend-config=python,shm-growth-byte-size=5242880",
    ]
    assert command[command.index("--") + 1 :][:2] == ["--model-repository", str(SHIPPED)]


def test_supervisor_refuses_before_starting(monkeypatch, capsys):
    fake_statvfs(monkeypatch, total=64 * MIB, free=20 * MIB)
    no_process_started(monkeypatch)
    code = supervisor.main(
        ["--tritonserver", "/nonexistent", "--", "--model-repository", str(SHIPPED)]
    )
    assert code == shm.EXIT_TOO_SMALL == 78
    err = capsys.readouterr().err
    assert "[supervisor] error: /dev/shm has 20.0 MiB free of 64.0 MiB; the Python-backend " in err
    assert "need 35.0 MiB" in err and "--shm-size=" in err


def test_per_node_checks_all_its_servers_before_starting(monkeypatch, capsys):
    host = doctor.gather_host()  # this host, read before processes are forbidden
    monkeypatch.setattr(doctor, "gather_host", lambda: host)
    fake_statvfs(monkeypatch, total=64 * MIB, free=20 * MIB)
    no_process_started(monkeypatch)
    assert per_node.main(["--", "--model-repository", str(SHIPPED)]) == 78
    err = capsys.readouterr().err
    assert err.startswith("per_node: error: /dev/shm has 20.0 MiB free")
    assert "need 35.0 MiB" in err or "need 70.0 MiB" in err  # one server per NUMA node


def test_cli_check_and_args(monkeypatch, capsys):
    fake_statvfs(monkeypatch, total=64 * MIB, free=64 * MIB)
    assert shm.main(["check", "--model-repository", str(SHIPPED)]) == 0
    out = capsys.readouterr().out
    assert "shm-default-byte-size=7340032 shm-growth-byte-size=5242880" in out
    assert "/dev/shm needed: 35.0 MiB" in out and out.rstrip().endswith("35.0 MiB needed")
    assert shm.main(["check", "--model-repository", str(SHIPPED), "--servers", "2"]) == 1
    assert "2 servers' Python-backend stubs need 70.0 MiB" in capsys.readouterr().err
    given = "--backend-config=python,shm-default-byte-size=8388608"
    assert shm.main(["args", "--", "--model-repository", str(SHIPPED), given]) == 0
    assert capsys.readouterr().out == "--backend-config=python,shm-growth-byte-size=5242880\n"
    assert shm.main(["args", "--model-repository", str(SHIPPED)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    fake_statvfs(monkeypatch, total=64 * MIB, free=MIB)
    assert shm.main(["args", "--model-repository", str(SHIPPED)]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("shm: error: /dev/shm has 1.0 MiB")
