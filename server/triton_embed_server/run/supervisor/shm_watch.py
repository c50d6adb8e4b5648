"""Give back the shared memory a request beyond the configs pinned: reload the grown model.

A Python-backend stub's ``/dev/shm`` region grows when one ``execute`` call's tensors do not
fit, and never shrinks (:mod:`triton_embed_server.host.shm.sizing`); Triton 2.51 has no limit of
its own on a gRPC message below 2 GiB, and a text is copied into the tokenizer's region
before the step can refuse it. One 100 MiB text left a region of 112 MiB until restart.

The plan (:func:`~triton_embed_server.host.shm.sizing.plan_arguments`) says what each model's stub
region is at start (``max(shm-default-byte-size, its region)``, the size the ``/dev/shm``
check counted) and the largest request the configs allow never grows it. A region larger
than that plus one growth step (``shm-growth-byte-size``, the margin: the backend grows a
region in such steps, and a text longer than ``max_chars`` with ``truncation=CHUNK`` may
take one) held a request beyond the plan. The supervisor then reloads the model with a
changed config (:meth:`~triton_embed_server.run.supervisor.core.Supervisor._load`): Triton
starts new instances with fresh regions, moves traffic to them once they are ready, and
unloads the old ones after their requests are answered; their stubs exit and remove their
regions (measured: ``/dev/shm`` back 10 s after a 100 MiB text). But on Triton 2.51, with
other requests served while the region grew, the replaced stub aborted in ``finalize`` (its
region then stays mapped by tritonserver) or tritonserver died (SIGSEGV) in 3 of 3 runs, so
the watch is off by default (docs/operations.md, "Shared memory"). At most one such reload
per model per ``interval_s`` (a client sending oversized texts in a loop costs one model load
per interval, not one per request).

The hook: :meth:`RegionWatch.check` once per supervisor poll, with the server's live stubs.
Off unless ``--shm-reclaim-interval-s`` is given (:data:`DEFAULT_INTERVAL_S`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from triton_embed_server.host.shm.check import SHM_DIR
from triton_embed_server.host.shm.sizing import mib
from triton_embed_server.host.shm.tritonserver_args import GROWTH_KEY, python_backend_settings

#: Seconds between two reloads of one model for its shared memory, at least, when it is on.
INTERVAL_S = 60.0
#: Off by default (0): on Triton 2.51, a reload after a region grew under concurrent traffic
#: was seen to crash the replaced stub as it exited (its region then stays mapped) or
#: tritonserver itself (SIGSEGV; the supervisor restarts it); see docs/operations.md.
DEFAULT_INTERVAL_S = 0.0
#: Seconds a reload waits for the replaced stubs to exit (their requests answered).
RETIRE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Oversize:
    """A model one of whose stub regions grew past its plan.

    Attributes:
        model: the model.
        region: the largest region's name in ``/dev/shm``.
        size: its size in bytes.
        planned: the region the plan gives one stub of the model.
        margin: bytes above ``planned`` tolerated (one growth step).
    """

    model: str
    region: str
    size: int
    planned: int
    margin: int

    def describe(self) -> str:
        """One line for the log: the model, the region, its size and the plan."""
        return (
            f"model {self.model!r}: shared-memory region {self.region} is {mib(self.size)}, "
            f"over the plan's {mib(self.planned)} per stub + {mib(self.margin)} margin "
            f"(one {GROWTH_KEY} step); a request beyond the configs grew it and a region "
            "never shrinks"
        )


class RegionWatch:
    """Compares each stub's region with its model's plan; says which model to reload when.

    Args:
        planned: ``{model: bytes}``, the region of one stub of each model at start.
        margin: bytes above the plan tolerated (the ``shm-growth-byte-size``).
        interval_s: seconds between two reloads of one model, at least.
        folder: where the regions are (``/dev/shm``).
        clock: ``time.monotonic`` (tests pass a fake).
    """

    def __init__(
        self,
        planned: Mapping[str, int],
        margin: int,
        interval_s: float = INTERVAL_S,
        folder: Path = SHM_DIR,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.planned = dict(planned)
        self.margin = margin
        self.interval_s = interval_s
        self.folder = Path(folder)
        self.clock = clock
        self._last: dict[str, float] = {}

    @classmethod
    def from_arguments(cls, args: Sequence[str], interval_s: float = INTERVAL_S):
        """The watch of a server started with ``args`` (its shm settings already added).

        Returns:
            None when ``interval_s`` is 0 (off) or the configs cannot be read (then the
            server reports them itself).
        """
        from triton_embed_server.host.shm.sizing import plan_arguments
        from triton_embed_server.host.shm.tritonserver_args import given_default_byte_size

        if interval_s <= 0:
            return None
        try:
            plan = plan_arguments(args)
        except (OSError, ValueError):
            return None
        try:
            growth = int(python_backend_settings(args).get(GROWTH_KEY) or plan.growth_byte_size)
        except ValueError:
            growth = plan.growth_byte_size
        return cls(plan.stub_bytes(given_default_byte_size(args)), growth, interval_s)

    def limit(self, model: str) -> int | None:
        """The largest region ``model``'s stubs may have (None: not in the plan)."""
        planned = self.planned.get(model)
        return None if planned is None else planned + self.margin

    def check(self, stubs: Mapping[int, tuple[str, str | None]]) -> list[Oversize]:
        """The models to reload now: a stub region over its limit, none reloaded recently.

        Args:
            stubs: the server's live stubs, ``{pid: (model, region name)}``.
        """
        largest: dict[str, tuple[int, str]] = {}
        for model, region in stubs.values():
            if not region or self.limit(model) is None:
                continue
            try:
                size = os.stat(self.folder / region).st_size
            except OSError:  # gone meanwhile
                continue
            if size > largest.get(model, (-1, ""))[0]:
                largest[model] = (size, region)
        now = self.clock()
        due = []
        for model, (size, region) in sorted(largest.items()):
            if size <= self.limit(model):
                continue
            if now - self._last.get(model, float("-inf")) < self.interval_s:
                continue
            self._last[model] = now
            due.append(Oversize(model, region, size, self.planned[model], self.margin))
        return due


def reclaim(supervisor, stubs: Mapping[int, tuple[str, str | None]]) -> None:
    """Reload every model whose stub region grew past its plan, and log it.

    Called once per poll of a ready server by the supervisor (its ``shm_watch`` set).
    The replaced stubs exit once Triton has unloaded their version (their requests
    answered); a region one of them leaves behind is removed once it is gone.

    Args:
        supervisor: the :class:`~triton_embed_server.run.supervisor.core.Supervisor`.
        stubs: its server's live stubs, ``{pid: (model, region name)}``.
    """
    from triton_embed_server.run.supervisor.processes import is_running, remove_shm_regions

    for over in supervisor.shm_watch.check(stubs):
        supervisor.log(f"{over.describe()}; reloading {over.model!r} to give it back")
        t0 = time.monotonic()
        old = {pid: region for pid, (model, region) in stubs.items() if model == over.model}
        if not supervisor._load(over.model):
            supervisor.log(f"reload of {over.model!r} for its shared memory failed; kept as is")
            continue
        procs = [supervisor._seen[pid][0] for pid in old if pid in supervisor._seen]
        deadline = time.monotonic() + RETIRE_TIMEOUT_S
        while any(is_running(p) for p in procs) and time.monotonic() < deadline:
            time.sleep(0.25)
        left = [p.pid for p in procs if is_running(p)]
        removed = remove_shm_regions(r for pid, r in old.items() if pid not in left)
        gone = [r for pid, r in old.items() if r and pid not in left]
        still = _still_mapped(supervisor.process.pid, gone)
        if still:
            supervisor.log(
                f"the replaced stubs of {over.model!r} are gone but tritonserver still maps "
                f"their regions ({', '.join(still)}): a stub that exited abnormally leaves its "
                "version unloading for ever in Triton 2.51, and the region's pages stay charged "
                "to /dev/shm until the server restarts"
            )
        supervisor.log(
            f"reloaded {over.model!r} for its shared memory in {time.monotonic() - t0:.1f} s: "
            f"{len(procs) - len(left)} of {len(procs)} old stubs gone"
            + (f" ({len(removed)} regions they left removed)" if removed else "")
            + (f"; still running: {', '.join(map(str, left))}" if left else "")
            + f"; next such reload of {over.model!r} in {supervisor.shm_watch.interval_s:g} s"
            " at the earliest"
        )


def _still_mapped(pid: int, regions: Sequence[str], wait_s: float = 10.0) -> list[str]:
    """The ``regions`` process ``pid`` still maps after ``wait_s`` seconds (its unload done).

    Triton unmaps a replaced stub's region when it finishes unloading that version, a moment
    after the stub exits.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            return []
        still = [r for r in regions if r in maps]
        if not still or time.monotonic() >= deadline:
            return still
        time.sleep(0.5)
