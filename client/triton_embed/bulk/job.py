"""``triton-embed embed INPUT -o OUT_DIR``: a corpus embedded into Parquet shards, resumably.

The input is read :data:`READ_CHUNK`-sized chunks at a time (:mod:`.sources`), cut into
requests of the ensemble's ``max_batch_size`` (or ``batch_size``), sent with at most
``concurrency`` in flight over one or several servers (:class:`.pool_embedder.PoolEmbedder`), and
the answers are written in input order as shards of ``shard_rows`` rows (:mod:`.shards`).
What is held at once is one shard's rows plus the requests in flight, whatever the corpus
size. The vector column follows the model's kind (:mod:`.kinds`): ``embedding`` for an
embedding model, ``sparse`` for a sparse one, ``tokens`` for a multi-vector one, and for a
hybrid model that of the head ``--output-kind`` picks (dense by default); the manifest
records it (``kind``: the kind of vectors written) once the model is known, and a rerun that
would write another kind is refused.

Resuming: the manifest records the job (:func:`job_identity`: the input's fingerprint, the
model, the request options of both kinds, the shard size, the columns) and each finished
shard. Running the same command again continues with the first shard not in the manifest
(adopting a shard file that was renamed into place just before a crash), so every record is
embedded once. An output folder made by another job (other input, model or options) is
refused, unless ``overwrite``.
"""

from __future__ import annotations

import asyncio
import errno
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from triton_embed.bulk import shards
from triton_embed.bulk.kinds import COLUMNS
from triton_embed.bulk.pool_embedder import Batch, PoolEmbedder
from triton_embed.bulk.settings import JobSettings, differences, job_id_of, job_identity
from triton_embed.bulk.sources import Chunk, Source
from triton_embed.errors import EmbedClientError, InvalidInputError
from triton_embed.options import DEFAULT_EMBEDDING_TYPE
from triton_embed.transport.catalog import ModelInfo, ModelKind

#: The lock file of an output folder (hidden: Parquet readers skip it).
LOCK = ".triton-embed.lock"
#: Each answered request is kept until the ones before it are answered: at most this many
#: times ``concurrency`` requests are outstanding (sent or waiting for their turn).
WINDOW_FACTOR = 2


class JobMismatchError(EmbedClientError):
    """The output folder holds another job's output (other input, model or options)."""


@dataclass
class Progress:
    """Counts of a run, for the progress bar and the closing summary."""

    texts: int = 0
    tokens: int = 0
    retries: int = 0
    latencies_s: list[float] = field(default_factory=list)


class BulkJob:
    """One corpus into one output folder.

    Args:
        source: the input.
        out_dir: the output folder (created if missing).
        urls: gRPC endpoints of the servers (``host:port``, several balanced).
        settings: :class:`JobSettings`.
        overwrite: replace another job's output in ``out_dir`` instead of refusing.
        progress: show a progress bar on stderr (when it is a terminal).

    Raises:
        JobMismatchError: ``out_dir`` holds another job's output (says what differs).
        EmbedClientError: ``out_dir`` is not a folder, or holds files that are no job's.
    """

    def __init__(
        self,
        source: Source,
        out_dir: str | Path,
        urls,
        settings: JobSettings,
        *,
        overwrite: bool = False,
        progress: bool = True,
    ):
        self.source = source
        self.out_dir = Path(out_dir)
        self.urls = urls
        self.settings = settings
        self.show_progress = progress
        self.total = source.count()
        if not self.total:
            raise EmbedClientError(f"{source.path} holds no texts")
        self.identity = job_identity(source, settings)
        self.job_id = job_id_of(self.identity)
        self.manifest = self._open(overwrite)
        self.resumed_rows_at_start = self.manifest["rows"]
        self.model_dimension: int | None = settings.options.dimensions
        self.counts = Progress()

    # ---- the output folder ----------------------------------------------------------------

    def _open(self, overwrite: bool) -> dict:
        out = self.out_dir
        if out.exists() and not out.is_dir():
            raise EmbedClientError(f"-o {out} is a file; name a folder (or a .npy file)")
        try:
            out.mkdir(parents=True, exist_ok=True)
            self._lock()
            return self._open_locked(overwrite)
        except OSError as exc:
            raise EmbedClientError(
                f"cannot write -o {out}: {exc.strerror or exc} ({exc.filename or out})"
            ) from None

    def _lock(self) -> None:
        """Hold an exclusive lock on the folder for the life of the job (one writer only).

        Raises:
            EmbedClientError: another ``triton-embed embed`` is writing to the folder.
        """
        import fcntl
        import os
        import stat

        path = self.out_dir / LOCK
        # Never through a link: a planted one would make the job create or lock a file
        # elsewhere. The lock file stays between runs, so an existing plain file is fine.
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            fd = os.open(path, flags, 0o666)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise EmbedClientError(
                f"{path} is a symbolic link; the job's lock file must be a plain file in the "
                "output folder: remove the link (or name another -o folder) and run again"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise EmbedClientError(
                f"{path} is not a plain file; remove it (or name another -o folder) and run again"
            )
        self._lock_file = open(fd, "r+b")  # noqa: SIM115 - held until exit
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock_file.close()
            raise EmbedClientError(
                f"{self.out_dir} is being written by another 'triton-embed embed'; wait for it "
                "to finish (or stop it), or name another -o folder"
            ) from None

    def close(self) -> None:
        """Release the folder's lock (:meth:`run` does when it ends)."""
        lock = getattr(self, "_lock_file", None)
        if lock is not None and not lock.closed:
            lock.close()  # closing the file releases the flock

    def _open_locked(self, overwrite: bool) -> dict:
        out = self.out_dir
        try:
            manifest = shards.read_manifest(out)
        except ValueError as exc:
            raise EmbedClientError(f"{exc}; name another -o folder") from None
        ours = [p for p in out.iterdir() if shards.is_shard_file(p.name)]
        if manifest is None and ours and not overwrite:
            raise EmbedClientError(
                f"{out} holds shard files (part-NNNNN.parquet) but no {shards.MANIFEST}; name "
                "another -o folder or pass --overwrite"
            )
        if manifest is not None and not overwrite:
            changed = differences(manifest.get("job", {}), self.identity)
            nothing_written = not manifest["shards"] and not manifest["complete"] and not ours
            if changed and not nothing_written:
                raise JobMismatchError(
                    f"{out} holds the output of another job: {'; '.join(changed)}. Name "
                    "another -o folder, or pass --overwrite to replace it"
                )
            if changed:  # a run that stopped before its first shard: nothing to keep
                manifest = None
        if overwrite and (manifest is not None or ours):
            for path in ours:
                path.unlink()
            (out / shards.MANIFEST).unlink(missing_ok=True)
            manifest = None
        if manifest is None:
            manifest = {
                "format": shards.FORMAT,
                "job": self.identity,
                "job_id": self.job_id,
                "model": self.settings.model,
                "kind": None,  # the model's, once the servers say (_settle_kind)
                "embedding_type": (
                    self.settings.options.embedding_type or DEFAULT_EMBEDDING_TYPE
                ).value,  # fmt: skip
                "dimension": None,
                "shard_rows": self.settings.shard_rows,
                "shards": [],
                "rows": 0,
                "tokens": 0,
                "complete": False,
            }
        manifest["job"] = self.identity  # the input's path may have moved
        self._tidy(manifest)
        shards.write_manifest(out, manifest)
        return manifest

    def _tidy(self, manifest: dict) -> None:
        """Adopt a finished shard the manifest missed; delete temporaries and later shards."""
        done = manifest["shards"]
        if not manifest["complete"]:
            index = len(done)
            entry = shards.shard_entry_if_complete(
                self.out_dir, index, index * self.settings.shard_rows, self.job_id
            )
            if entry is not None:
                done.append(entry)
                manifest["rows"] += entry["rows"]
                manifest["tokens"] += entry["tokens"]
        keep = {entry["file"] for entry in done}
        for path in self.out_dir.iterdir():
            if shards.is_shard_file(path.name) and path.name not in keep:
                path.unlink()

    # ---- the run --------------------------------------------------------------------------

    @property
    def resumed_rows(self) -> int:
        """Records already embedded when this run started."""
        return len(self.manifest["shards"]) * self.settings.shard_rows

    def run(self) -> dict:
        """Embed what is left; returns the closing summary (this run's figures).

        Raises:
            InvalidInputError: the server refused a text (names the file, line and id); the
                finished shards are kept.
            ServerUnavailableError: the servers stayed unreachable through the retries.
        """
        try:
            if self.manifest["complete"]:
                return self._summary(0.0, already_complete=True)
            t0 = time.perf_counter()
            asyncio.run(self._run())
            return self._summary(time.perf_counter() - t0)
        finally:
            self.close()

    async def _run(self) -> None:
        settings = self.settings
        total = self.total
        bar = tqdm(
            total=total,
            initial=min(self.resumed_rows, total),
            unit="text",
            disable=None if self.show_progress else True,  # None: only on a terminal
            file=sys.stderr,
            smoothing=0.05,
        )
        t0 = time.perf_counter()

        def advance(batch: Batch, count: int) -> None:
            self.counts.texts += count
            self.counts.tokens += int(batch.num_tokens.sum())
            self.counts.retries += batch.retries
            self.counts.latencies_s.append(batch.seconds)
            bar.update(count)
            elapsed = time.perf_counter() - t0
            bar.set_postfix_str(f"{self.counts.tokens / elapsed:,.0f} tokens/s", refresh=False)

        try:
            async with PoolEmbedder(
                self.urls,
                settings.model,
                settings.options,
                sparse=settings.sparse,
                output=settings.output,
                timeout_s=settings.timeout_s,
                admin_key=settings.admin_key,
                retry=settings.retry,
                priority=settings.priority,
            ) as embedder:
                self._settle_kind(embedder.info)
                self.model_dimension = self.model_dimension or embedder.info.dimension
                size = min(settings.batch_size or embedder.max_batch_size, embedder.max_batch_size)
                await self._pipeline(embedder, size, advance)
        finally:
            bar.close()

    def _settle_kind(self, info: ModelInfo) -> None:
        """Record the kind of vectors written in the manifest; refuse another than the shards'.

        Args:
            info: the model as the job writes it (a hybrid model's view: its head's kind).

        Raises:
            JobMismatchError: shards of the other kind are written (an output folder holds
                one vector column).
        """
        manifest, kind = self.manifest, info.kind
        written = manifest.get("kind") or ModelKind.EMBEDDING.value  # older manifests: dense
        if manifest["shards"] and written != kind.value:
            raise JobMismatchError(
                f"{self.out_dir} holds {len(manifest['shards'])} shards of {written} vectors "
                f"and model {self.settings.model!r} now gives {kind.value} vectors (a "
                f"{COLUMNS[kind]!r} column; of a hybrid model, --output-kind picks them). Name "
                "another -o folder, or pass --overwrite to replace them"
            )
        if manifest.get("kind") != kind.value:
            manifest["kind"] = kind.value
            if not manifest["shards"]:  # sparse, tokens: no embedding type; the dimension
                other = kind in (ModelKind.SPARSE, ModelKind.MULTIVECTOR)
                embedding_type = self.settings.options.embedding_type or DEFAULT_EMBEDDING_TYPE
                manifest["embedding_type"] = None if other else embedding_type.value
                manifest["dimension"] = info.dimension if other else None
            shards.write_manifest(self.out_dir, manifest)

    def _requests(self, size: int):
        """``(shard index, chunk)`` of every request left, cut at shard boundaries."""
        rows = self.settings.shard_rows
        for chunk in self.source.chunks(size, self.resumed_rows):
            start = 0
            while start < len(chunk.texts):
                record = chunk.start + start
                stop = min(len(chunk.texts), start + rows - record % rows)
                yield (
                    record // rows,
                    Chunk(
                        record,
                        chunk.ids[start:stop],
                        chunk.texts[start:stop],
                        chunk.lines[start:stop],
                    ),
                )
                start = stop

    async def _pipeline(self, embedder: PoolEmbedder, size: int,
                        advance: Callable[[Batch, int], None]) -> None:  # fmt: skip
        gate = asyncio.Semaphore(self.settings.concurrency)
        window = WINDOW_FACTOR * self.settings.concurrency
        pending: deque = deque()
        shard_index = len(self.manifest["shards"])
        held: list[tuple[Chunk, Batch]] = []

        async def send(chunk: Chunk) -> Batch:
            async with gate:
                return await embedder.embed(chunk.texts)

        async def take() -> None:
            nonlocal shard_index, held
            index, chunk, task = pending.popleft()
            try:
                batch = await task
            except InvalidInputError as exc:
                raise self._input_error(exc, chunk) from None
            held.append((chunk, batch))
            advance(batch, len(chunk.texts))
            if sum(len(c.texts) for c, _ in held) == self.settings.shard_rows:
                await self._write(shard_index, held)  # complete: on disk before anything else
                shard_index, held = shard_index + 1, []
            assert index == shard_index or not held, "requests are taken in input order"

        try:
            for index, chunk in self._requests(size):
                while len(pending) >= window:
                    await take()
                pending.append((index, chunk, asyncio.ensure_future(send(chunk))))
            while pending:
                await take()
            if held:
                await self._write(shard_index, held)
        finally:
            for _, _, task in pending:
                task.cancel()
            await asyncio.gather(*(t for _, _, t in pending), return_exceptions=True)
        self.manifest["complete"] = True
        shards.write_manifest(self.out_dir, self.manifest)

    async def _write(self, index: int, held: list[tuple[Chunk, Batch]]) -> None:
        """Write shard ``index`` from its requests' answers and record it in the manifest."""
        vectors = [b.vectors for _, b in held]  # the column's chunks: no copy into one array
        manifest, include_text = self.manifest, self.settings.include_text
        if manifest.get("kind") == ModelKind.SPARSE.value:
            shard_schema = shards.sparse_schema(self.source.id_type, include_text)
        elif manifest.get("kind") == ModelKind.MULTIVECTOR.value:
            if manifest["dimension"] is None:
                manifest["dimension"] = self.model_dimension or vectors[0].dim
            shard_schema = shards.tokens_schema(
                self.source.id_type, manifest["dimension"], include_text
            )
        else:
            if manifest["dimension"] is None:
                width = vectors[0].shape[1]
                manifest["dimension"] = self.model_dimension or (
                    width * 8 if manifest["embedding_type"] == "ubinary" else width
                )
            shard_schema = shards.schema(self.source.id_type, manifest["embedding_type"],
                                         manifest["dimension"], include_text)  # fmt: skip
        texts = [t for c, _ in held for t in c.texts] if self.settings.include_text else None
        table = shards.table(
            shard_schema,
            [i for c, _ in held for i in c.ids],
            np.concatenate([b.num_tokens for _, b in held]),
            vectors,
            texts,
        )
        first = held[0][0].start
        entry = await asyncio.get_running_loop().run_in_executor(
            None, shards.write_shard, self.out_dir, index, table, first, self.job_id
        )
        manifest["shards"].append(entry)
        manifest["rows"] += entry["rows"]
        manifest["tokens"] += entry["tokens"]
        shards.write_manifest(self.out_dir, manifest)

    def _input_error(self, exc: InvalidInputError, chunk: Chunk) -> EmbedClientError:
        kept = len(self.manifest["shards"])
        if exc.index is None:  # the request's options, not a text
            return InvalidInputError(
                f"the server refused the request: {exc}. Change the flag it names and run "
                f"again{' with --overwrite' if kept else ''}"
            )
        where = str(self.source.path)
        if exc.index is not None and 0 <= exc.index < len(chunk.texts):
            line = chunk.lines[exc.index]
            label = "row" if self.source.format == "parquet" else "line"
            where = f"{where} {label} {line} (id {chunk.ids[exc.index]!r})"
        return InvalidInputError(
            f"{where}: {exc}. The {kept} finished shards are kept; fix the input, then run "
            "again with --overwrite (the input's fingerprint changes)"
        )

    def _summary(self, seconds: float, already_complete: bool = False) -> dict:
        lat = np.asarray(self.counts.latencies_s or [0.0]) * 1000
        manifest = self.manifest
        return {
            "texts": self.counts.texts,
            "tokens": self.counts.tokens,
            "seconds": round(seconds, 3),
            "texts_per_s": round(self.counts.texts / seconds, 1) if seconds else 0.0,
            "tokens_per_s": round(self.counts.tokens / seconds, 1) if seconds else 0.0,
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "retries": self.counts.retries,
            "dim": manifest["dimension"],
            "kind": manifest.get("kind") or ModelKind.EMBEDDING.value,
            "shards": len(manifest["shards"]),
            "rows": manifest["rows"],
            "resumed_from_row": self.resumed_rows_at_start,
            "already_complete": already_complete,
        }
