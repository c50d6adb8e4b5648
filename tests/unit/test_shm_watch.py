"""The supervisor's shared-memory watch (issue 20 item 2): which grown model to reload, when."""

from __future__ import annotations

import os

from triton_embed_server.host.shm.sizing import MIB
from triton_embed_server.run.launcher import REPO_ROOT
from triton_embed_server.run.supervisor.shm_watch import Oversize, RegionWatch


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def region(folder, name, size):
    path = folder / name
    with open(path, "wb") as f:
        f.truncate(size)
    return name


def test_the_limits_are_the_plan_per_stub_plus_one_growth_step():
    args = [
        "--model-repository", str(REPO_ROOT / "model_repository"),
        f"--backend-config=python,shm-default-byte-size={7 * MIB}",
        f"--backend-config=python,shm-growth-byte-size={5 * MIB}",
    ]  # fmt: skip
    watch = RegionWatch.from_arguments(args, interval_s=30)
    assert watch.planned == {"embedder": 7 * MIB, "tokenizer": 7 * MIB}
    assert watch.margin == 5 * MIB and watch.interval_s == 30
    assert watch.limit("tokenizer") == 12 * MIB and watch.limit("embed") is None
    bigger = RegionWatch.from_arguments(
        [*args, f"--backend-config=python,shm-default-byte-size={20 * MIB}"]
    )
    assert bigger.planned["tokenizer"] == 20 * MIB  # the size the server really starts with
    assert RegionWatch.from_arguments(args, interval_s=0) is None  # off
    assert RegionWatch.from_arguments(["--model-repository", "/nonexistent"]) is None


def test_a_region_over_its_limit_is_reported_once_per_interval(tmp_path):
    clock = Clock()
    watch = RegionWatch({"tokenizer": 7 * MIB, "embedder": 7 * MIB}, 5 * MIB, 60, tmp_path, clock)
    tok = region(tmp_path, "triton_python_backend_shm_region_a", 7 * MIB)
    emb = region(tmp_path, "triton_python_backend_shm_region_b", 7 * MIB)
    stubs = {11: ("tokenizer", tok), 12: ("embedder", emb), 13: ("embed", None)}
    assert watch.check(stubs) == []
    region(tmp_path, tok, 12 * MIB)  # one growth step: tolerated
    assert watch.check(stubs) == []
    region(tmp_path, tok, 112 * MIB)  # a 100 MiB text was copied in
    [over] = watch.check(stubs)
    assert over == Oversize("tokenizer", tok, 112 * MIB, 7 * MIB, 5 * MIB)
    assert over.describe() == (
        f"model 'tokenizer': shared-memory region {tok} is 112.0 MiB, over the plan's 7.0 MiB "
        "per stub + 5.0 MiB margin (one shm-growth-byte-size step); a request beyond the "
        "configs grew it and a region never shrinks"
    )
    clock.now += 59  # rate limit: not again within the interval
    assert watch.check(stubs) == []
    clock.now += 1
    assert [o.model for o in watch.check(stubs)] == ["tokenizer"]
    region(tmp_path, emb, 30 * MIB)  # another model has its own interval
    assert [o.model for o in watch.check(stubs)] == ["embedder"]


def test_the_largest_region_of_a_model_is_named_and_gone_regions_are_skipped(tmp_path):
    watch = RegionWatch({"embedder": 7 * MIB}, 5 * MIB, 60, tmp_path, Clock())
    a = region(tmp_path, "triton_python_backend_shm_region_a", 20 * MIB)
    b = region(tmp_path, "triton_python_backend_shm_region_b", 40 * MIB)
    stubs = {1: ("embedder", a), 2: ("embedder", b), 3: ("embedder", "gone"), 4: ("other", a)}
    [over] = watch.check(stubs)
    assert (over.region, over.size) == (b, 40 * MIB)
    os.unlink(tmp_path / a)
    os.unlink(tmp_path / b)
    assert RegionWatch({"embedder": MIB}, MIB, 60, tmp_path, Clock()).check(stubs) == []


def test_the_command_line_turns_the_watch_on_and_it_is_off_by_default(monkeypatch):
    from triton_embed_server.run.supervisor import command, core

    seen = []
    monkeypatch.setattr(core.Supervisor, "run", lambda self: seen.append(self.shm_watch) or 0)
    server = ["--model-repository", str(REPO_ROOT / "model_repository")]
    command.main(["--tritonserver", "/bin/true", "--shm-reclaim-interval-s", "60", "--", *server])
    command.main(["--tritonserver", "/bin/true", "--", *server])
    on, off = seen
    assert on.planned == {"embedder": 7 * MIB, "tokenizer": 7 * MIB}
    assert (on.margin, on.interval_s) == (5 * MIB, 60) and off is None
