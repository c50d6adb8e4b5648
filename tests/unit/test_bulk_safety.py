"""Hostile and careless inputs to the bulk path: planted symbolic links, an input that changes.

Every file the bulk job writes in its output folder (the manifest's and the shards'
temporaries, the lock file) is created exclusively and never through a link
(``O_CREAT | O_EXCL | O_NOFOLLOW``): a link planted there pointing outside the folder leaves
its target untouched, and the job either succeeds or fails naming the link. An input that
grows, shrinks or is rewritten while the job reads it makes the job fail, naming the change,
with the output not complete (issue 20, items 6 and 7).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from triton_embed.bulk import shards
from triton_embed.bulk.job import LOCK, BulkJob
from triton_embed.bulk.pool_embedder import Batch
from triton_embed.bulk.settings import JobSettings
from triton_embed.bulk.sources import InputChangedError, Source
from triton_embed.bulk.verify import verify
from triton_embed.errors import EmbedClientError

OUTSIDE_TEXT = "a file outside the output folder\n"


def outside_file(tmp_path: Path) -> Path:
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir(exist_ok=True)
    path.write_text(OUTSIDE_TEXT)
    return path


def assert_untouched(path: Path, stat: os.stat_result) -> None:
    assert path.read_text() == OUTSIDE_TEXT
    now = path.stat()
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (stat.st_size, stat.st_mtime_ns,
                                                          stat.st_ino)  # fmt: skip


def text_input(folder: Path, n: int) -> Path:
    path = folder / "input.txt"
    path.write_text("".join(f"line {i}\n" for i in range(n)))
    return path


class FakeEmbedder:
    """Embeds "line i" as [i, 1]; runs ``after_first_call`` once; fails after ``fail_after``."""

    def __init__(self, after_first_call=None, fail_after: int | None = None):
        self.calls = 0
        self.after_first_call = after_first_call
        self.fail_after = fail_after

    async def embed(self, texts: list[str]) -> Batch:
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("server went away")
        self.calls += 1
        if self.calls == 2 and self.after_first_call is not None:
            self.after_first_call()
        await asyncio.sleep(0)
        values = np.array([float(t.split()[1]) for t in texts], dtype=np.float32)
        vectors = np.stack([values, np.ones_like(values)], axis=1)
        return Batch(vectors, np.full(len(texts), 3, dtype=np.int32), 0.001, 0)


def run(job: BulkJob, embedder: FakeEmbedder, size: int) -> None:
    try:
        asyncio.run(job._pipeline(embedder, size, lambda batch, count: None))
    finally:
        job.close()


# --- item 6: planted symbolic links -----------------------------------------------------------


def test_create_exclusive_refuses_a_link_and_a_dangling_link(tmp_path):
    target = outside_file(tmp_path)
    stat = target.stat()
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(FileExistsError):
        shards.create_exclusive(link)
    assert_untouched(target, stat)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "elsewhere" / "new.txt")
    with pytest.raises(FileExistsError):
        shards.create_exclusive(dangling)
    assert not (tmp_path / "elsewhere" / "new.txt").exists()


def test_manifest_temporary_planted_link_is_not_followed(tmp_path):
    target = outside_file(tmp_path)
    stat = target.stat()
    out = tmp_path / "out"
    out.mkdir()
    tmp = out / "._manifest.json.tmp"
    tmp.symlink_to(target)
    job = BulkJob(Source(text_input(tmp_path, 8)), out, [], JobSettings(shard_rows=3),
                  progress=False)  # fmt: skip
    run(job, FakeEmbedder(), size=2)
    assert_untouched(target, stat)
    assert not tmp.is_symlink() and not tmp.exists()
    manifest = out / shards.MANIFEST
    assert not manifest.is_symlink() and shards.read_manifest(out)["complete"] is True
    assert verify(out, Source(tmp_path / "input.txt")).problems == []


def test_every_temporary_planted_mid_run_is_not_followed(tmp_path):
    """Links planted at the manifest's and every shard's temporary after the job started."""
    target = outside_file(tmp_path)
    stat = target.stat()
    out = tmp_path / "out"
    job = BulkJob(Source(text_input(tmp_path, 8)), out, [], JobSettings(shard_rows=3),
                  progress=False)  # fmt: skip
    names = [f".{shards.shard_name(k)}.tmp" for k in range(3)] + ["._manifest.json.tmp"]

    def plant() -> None:
        for name in names:
            (out / name).unlink(missing_ok=True)
            (out / name).symlink_to(target)

    run(job, FakeEmbedder(after_first_call=plant), size=2)
    assert_untouched(target, stat)
    assert [p.name for p in out.iterdir() if p.is_symlink()] == []
    assert shards.read_manifest(out)["rows"] == 8
    assert verify(out, Source(tmp_path / "input.txt")).problems == []


def test_shard_file_that_is_a_link_is_replaced_not_written_through(tmp_path):
    target = outside_file(tmp_path)
    stat = target.stat()
    (tmp_path / "part-00000.parquet").symlink_to(target)
    schema = shards.schema("int64", "float32", 2, False)
    table = shards.table(schema, [0, 1], np.array([3, 3]), np.ones((2, 2), np.float32))
    shards.write_shard(tmp_path, 0, table, 0, "job")
    assert_untouched(target, stat)
    assert not (tmp_path / "part-00000.parquet").is_symlink()
    assert pq.read_table(tmp_path / "part-00000.parquet").num_rows == 2


def test_a_temporary_that_reappears_fails_naming_it(tmp_path, monkeypatch):
    """A link planted between the unlink and the exclusive create: refused, target untouched."""
    target = outside_file(tmp_path)
    stat = target.stat()
    real_unlink = os.unlink

    def unlink_then_plant(path, *args, **kwargs):
        real_unlink(path, *args, **kwargs)
        if str(path).endswith(".tmp"):
            os.symlink(target, path)

    monkeypatch.setattr(shards.os, "unlink", unlink_then_plant)
    (tmp_path / "._manifest.json.tmp").write_text("leftover")
    with pytest.raises(FileExistsError, match=r"\._manifest\.json\.tmp appeared while this job "
                       r"was replacing it: another process writes in"):  # fmt: skip
        shards.write_manifest(tmp_path, {"format": shards.FORMAT})
    assert_untouched(target, stat)
    assert not (tmp_path / shards.MANIFEST).exists()


def test_lock_file_that_is_a_link_is_refused(tmp_path):
    target = outside_file(tmp_path)
    stat = target.stat()
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).symlink_to(target)
    with pytest.raises(EmbedClientError, match=r"\.triton-embed\.lock is a symbolic link; the "
                       "job's lock file must be a plain file in the output folder: remove the "
                       "link"):  # fmt: skip
        BulkJob(Source(text_input(tmp_path, 4)), out, [], JobSettings(), progress=False)
    assert_untouched(target, stat)
    assert not (out / shards.MANIFEST).exists()


def test_lock_file_that_is_a_dangling_link_creates_nothing_outside(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere-lock"
    (out / LOCK).symlink_to(elsewhere)
    with pytest.raises(EmbedClientError, match="is a symbolic link"):
        BulkJob(Source(text_input(tmp_path, 4)), out, [], JobSettings(), progress=False)
    assert not elsewhere.exists()


def test_lock_file_that_is_a_fifo_is_refused(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / LOCK)
    with pytest.raises(EmbedClientError, match=r"\.triton-embed\.lock is not a plain file"):
        BulkJob(Source(text_input(tmp_path, 4)), out, [], JobSettings(), progress=False)


# --- item 7: an input that changes while it is read -------------------------------------------


def append_lines(path: Path, first: int, n: int):
    def append() -> None:
        with path.open("a") as f:
            f.write("".join(f"line {i}\n" for i in range(first, first + n)))

    return append


def test_input_grown_mid_run_fails_and_the_output_is_not_complete(tmp_path):
    path = text_input(tmp_path, 3000)
    out = tmp_path / "out"
    job = BulkJob(Source(path), out, [], JobSettings(shard_rows=1000, concurrency=2),
                  progress=False)  # fmt: skip
    embedder = FakeEmbedder(after_first_call=append_lines(path, 3000, 500))
    with pytest.raises(InputChangedError) as caught:
        run(job, embedder, size=100)
    message = str(caught.value)
    assert message.startswith(f"{path} changed while this job read it: it holds more than the "
                              "3000 records it held when the job started (lines were "
                              "appended). The output is not complete.")  # fmt: skip
    assert "then run the same command again, with --overwrite" in message
    manifest = shards.read_manifest(out)
    assert manifest["complete"] is False
    assert manifest["rows"] <= 3000
    assert all(e["first_record"] + e["rows"] <= 3000 for e in manifest["shards"])
    # the input as it is now is another input: a plain rerun is refused, --overwrite embeds it
    with pytest.raises(EmbedClientError, match="the input changed"):
        BulkJob(Source(path), out, [], JobSettings(shard_rows=1000), progress=False)
    again = BulkJob(Source(path), out, [], JobSettings(shard_rows=1000), progress=False,
                    overwrite=True)  # fmt: skip
    run(again, FakeEmbedder(), size=100)
    manifest = shards.read_manifest(out)
    assert (manifest["complete"], manifest["rows"]) == (True, 3500)
    assert verify(out, Source(path)).problems == []


def truncate_to_2500_lines(path: Path) -> None:
    with path.open("r+") as f:
        f.truncate(len("".join(f"line {i}\n" for i in range(2500))))


def rewrite_near_the_end(path: Path) -> None:
    """Same size, same line count, other bytes near the end: only the hash can tell."""
    data = bytearray(path.read_bytes())
    data[-3] = ord("8") if data[-3] != ord("8") else ord("7")  # "line 2999" -> "line 2989"
    with path.open("r+b") as f:
        f.write(data)


@pytest.mark.parametrize(
    "change, error",
    [
        pytest.param(
            truncate_to_2500_lines,
            r"2500 records were read, 3000 when the job started \(it was truncated or rewritten\)",
            id="truncated",
        ),
        pytest.param(
            rewrite_near_the_end,
            r"the bytes read \(SHA-256 [0-9a-f]{12}\.\.\.\) are not those of the file the job "
            r"started with \([0-9a-f]{12}\.\.\.\): it was rewritten",
            id="rewritten-in-place",
        ),
    ],
)
def test_input_changed_mid_run_fails(tmp_path, change, error):
    path = text_input(tmp_path, 3000)
    out = tmp_path / "out"
    job = BulkJob(Source(path), out, [], JobSettings(shard_rows=1000, concurrency=2),
                  progress=False)  # fmt: skip
    with pytest.raises(InputChangedError, match=error):
        run(job, FakeEmbedder(after_first_call=lambda: change(path)), size=100)
    manifest = shards.read_manifest(out)
    assert manifest["complete"] is False
    assert len(manifest["shards"]) < 3  # the last shard is not written from changed bytes


def test_unchanged_input_still_resumes(tmp_path):
    path = text_input(tmp_path, 3000)
    out = tmp_path / "out"
    job = BulkJob(Source(path), out, [], JobSettings(shard_rows=1000, concurrency=1),
                  progress=False)  # fmt: skip
    with pytest.raises(RuntimeError, match="server went away"):
        run(job, FakeEmbedder(fail_after=15), size=100)
    done = shards.read_manifest(out)["rows"]
    assert done == 1000  # shard 0 written, shard 1 was not finished
    again = BulkJob(Source(path), out, [], JobSettings(shard_rows=1000), progress=False)
    assert again.resumed_rows == done
    run(again, FakeEmbedder(), size=100)
    assert shards.read_manifest(out)["complete"] is True
    assert verify(out, Source(path)).problems == []


def parquet_input(folder: Path, n: int) -> Path:
    path = folder / "input.parquet"
    pq.write_table(pa.table({"text": [f"line {i}" for i in range(n)]}), path, row_group_size=100)
    return path


def test_parquet_input_grown_fails_before_anything_is_read(tmp_path):
    path = parquet_input(tmp_path, 300)
    source = Source(path)
    assert source.count() == 300
    source.fingerprint()
    pq.write_table(pa.table({"text": [f"line {i}" for i in range(400)]}), path)
    with pytest.raises(InputChangedError, match="more than the 300 records"):
        next(source.chunks(50))


def test_parquet_input_rewritten_in_place_mid_run_fails(tmp_path):
    path = parquet_input(tmp_path, 3000)
    out = tmp_path / "out"
    job = BulkJob(Source(path), out, [], JobSettings(shard_rows=1000, concurrency=2),
                  progress=False)  # fmt: skip
    size = path.stat().st_size

    def rewrite() -> None:
        with path.open("r+b") as f:  # a byte in the footer's key-value area: same rows
            f.seek(size - 12)
            byte = f.read(1)
            f.seek(size - 12)
            f.write(bytes([byte[0] ^ 0x01]))

    with pytest.raises(InputChangedError, match="it was rewritten"):
        run(job, FakeEmbedder(after_first_call=rewrite), size=100)
    assert shards.read_manifest(out)["complete"] is False


def test_parquet_and_jsonl_unchanged_inputs_run_through(tmp_path):
    path = parquet_input(tmp_path, 250)
    out = tmp_path / "out"
    run(BulkJob(Source(path), out, [], JobSettings(shard_rows=100), progress=False),
        FakeEmbedder(), size=30)  # fmt: skip
    assert verify(out, Source(path)).problems == []
    jsonl = tmp_path / "input.jsonl"
    jsonl.write_text("".join(f'{{"id": "d{i}", "text": "line {i}"}}\n' for i in range(250)))
    out2 = tmp_path / "out2"
    run(BulkJob(Source(jsonl), out2, [], JobSettings(shard_rows=100), progress=False),
        FakeEmbedder(), size=30)  # fmt: skip
    assert verify(out2, Source(jsonl)).problems == []
