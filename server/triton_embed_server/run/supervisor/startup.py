"""A server start that makes no progress: seen from tritonserver's log and its CPU time.

While tritonserver loads its initial models its HTTP endpoint is closed (it opens once every
model is loaded), so the model states can only be read from its log. :class:`StartWatch` is
fed every log line (:meth:`StartWatch.feed`) and a sample of the CPU time of the server and
its stubs each poll (:meth:`StartWatch.sample`). It counts as progress:

* a model lifecycle line: ``loading: NAME:VERSION``, ``successfully loaded 'NAME'``,
  ``failed to load 'NAME'`` (``model_lifecycle.cc``), and the start of an instance's
  initialization, ``TRITONBACKEND_ModelInstanceInitialize: INSTANCE`` (``python_be.cc``);
* a stub process that appeared or went away;
* :data:`PROGRESS_CPU_S` seconds of CPU used by one process (the server or a stub) within
  the last :data:`PROGRESS_WINDOW_S` seconds (a model's ``initialize`` importing and loading
  an engine is CPU-bound in its own process).

A start with none of these for ``stall_s`` seconds has stalled (:meth:`StartWatch.stalled`):
a model's ``initialize`` that blocks, or the hang of issue 20 item 15, where every stub had
logged the end of its ``initialize`` and Triton never logged "successfully loaded" nor
opened its ports. A stalled tree is nearly idle: the stubs' health threads wake every 300 ms,
the server polls each stub once a second, and an idle vLLM engine polls its queues (about
0.01 s of CPU a second each: 4 engines summed 0.9 s in 20 s in a stalled start seen here,
which passed the earlier rule, CPU summed over the tree since the last progress, every 22 s,
so that start hung 600 s instead of being restarted after 60).
:meth:`StartWatch.describe` names the models still loading and their stubs for the log line.
"""

from __future__ import annotations

import re
import threading

#: CPU seconds one process must use within :data:`PROGRESS_WINDOW_S` to count as progress
#: of a start. A stalled tree used 0.010 s in 30 s (tritonserver and 3 stubs, health
#: polling) and 0.9 s in 20 s (4 idle vLLM engines) here: at most 0.1 s per process in 10 s;
#: a model that imports Python packages or loads weights uses 1 s within about a second of
#: a core's time, and within 10 s on a starved host (a tenth of a core).
PROGRESS_CPU_S = 1.0
#: The window of :data:`PROGRESS_CPU_S`, seconds.
PROGRESS_WINDOW_S = 10.0
#: Seconds without progress after which a start has stalled (``--stall-timeout-s``). The
#: longest stretch without progress of a normal start of the shipped repository measured
#: here was 1.7 s (a 29.9 s start; the supervisor's ready line states it each start); 60 s
#: is far above it and a quarter of the 240 s the hang of issue 20 item 15 was left to run.
DEFAULT_STALL_S = 60.0

_LOADING = re.compile(r'"loading: (?P<model>[^":]+):\d+"')
_LOADED = re.compile(r"\"successfully loaded '(?P<model>[^']+)'")
_FAILED = re.compile(r"\"failed to load '(?P<model>[^']+)'")
_INSTANCE = re.compile(r'"TRITONBACKEND_ModelInstanceInitialize: (?P<instance>\S+)')


class StartWatch:
    """Progress of one tritonserver start; see the module docstring.

    Thread-safe: :meth:`feed` is called by the threads that forward the server's output,
    the rest by the supervisor's loop.

    Args:
        now: the start's time (``time.monotonic()``).
        stall_s: seconds without progress that make the start stalled.
        progress_cpu_s: CPU seconds that count as progress.
    """

    def __init__(
        self, now: float, stall_s: float = DEFAULT_STALL_S, progress_cpu_s: float = PROGRESS_CPU_S
    ):
        self.stall_s = stall_s
        self.progress_cpu_s = progress_cpu_s
        self.loading: dict[str, float] = {}  # model -> when its load started
        self.loaded: set[str] = set()
        self.failed: set[str] = set()
        self.instances: dict[str, float] = {}  # instance -> when its initialize started
        self.last_progress = now
        self.longest_quiet_s = 0.0  # the longest stretch without progress so far
        self.last_event = "the start"
        self._cpu: dict[int, float] = {}  # pid -> CPU seconds at the last sample
        self._history: dict[int, list[tuple[float, float]]] = {}  # pid -> (time, CPU s)
        self._cpu_since = 0.0  # CPU seconds of the whole tree since the last progress
        self._pending: list[str] = []  # lines fed since the last sample
        self._lock = threading.Lock()

    def feed(self, line: str) -> None:
        """One line of the server's output (a thread of the supervisor calls it)."""
        if '"' not in line:
            return
        with self._lock:
            self._pending.append(line)

    def _apply(self, line: str, now: float) -> bool:
        if m := _LOADING.search(line):
            self.loading[m["model"]] = now
            self.last_event = f"loading {m['model']!r}"
        elif m := _LOADED.search(line):
            self.loading.pop(m["model"], None)
            self.loaded.add(m["model"])
            self.last_event = f"{m['model']!r} loaded"
        elif m := _FAILED.search(line):
            self.loading.pop(m["model"], None)
            self.failed.add(m["model"])
            self.last_event = f"{m['model']!r} failed to load"
        elif m := _INSTANCE.search(line):
            self.instances[m["instance"]] = now
            self.last_event = f"instance {m['instance']} initializing"
        else:
            return False
        return True

    def sample(self, cpu_s: dict[int, float], now: float) -> None:
        """Record a poll: ``cpu_s`` is ``{pid: CPU seconds}`` of the server and its stubs."""
        with self._lock:
            lines, self._pending = self._pending, []
        progressed = False
        for line in lines:
            progressed |= self._apply(line, now)
        stubs_before = set(self._cpu)
        busiest = 0.0  # the most CPU one process used within the window
        for pid, seconds in cpu_s.items():
            self._cpu_since += max(0.0, seconds - self._cpu.get(pid, seconds))
            history = [
                (t, c) for t, c in self._history.get(pid, []) if now - t <= PROGRESS_WINDOW_S
            ]
            history.append((now, seconds))
            self._history[pid] = history
            busiest = max(busiest, seconds - history[0][1])
        self._history = {pid: h for pid, h in self._history.items() if pid in cpu_s}
        self._cpu = dict(cpu_s)
        if set(cpu_s) != stubs_before and stubs_before:
            progressed = True
            self.last_event = "a stub process started or exited"
        if busiest >= self.progress_cpu_s:
            progressed = True
            self.last_event = (
                f"{busiest:.1f} s of CPU used by one process in {PROGRESS_WINDOW_S:g} s"
            )
        self.longest_quiet_s = max(self.longest_quiet_s, now - self.last_progress)
        if progressed:
            self.last_progress = now
            self._cpu_since = 0.0

    def stalled(self, now: float) -> bool:
        """Whether nothing progressed for ``stall_s`` seconds."""
        return now - self.last_progress >= self.stall_s

    def describe(self, stubs: dict[int, tuple[str, str]], now: float) -> str:
        """The stall in words: what is still loading, its stubs, the last progress.

        Args:
            stubs: ``{pid: (model, instance name)}`` of the server's live stubs.
            now: the current time.
        """
        loading = sorted(self.loading)
        by_model: dict[str, list[str]] = {}
        for pid, (model, instance) in sorted(stubs.items()):
            by_model.setdefault(model, []).append(f"{instance} pid {pid}")
        if loading:
            models = "; ".join(
                f"model {m!r} loading for {now - self.loading[m]:.0f} s ("
                + (", ".join(by_model[m]) + " idle" if m in by_model else "no stub running")
                + ")"
                for m in loading
            )
        else:
            models = "no model load was logged"
        done = f"; loaded: {', '.join(sorted(self.loaded))}" if self.loaded else ""
        failed = f"; failed: {', '.join(sorted(self.failed))}" if self.failed else ""
        return (
            f"start stalled: no progress for {now - self.last_progress:.0f} s "
            f"(--stall-timeout-s {self.stall_s:g}; last: {self.last_event}; under "
            f"{self.progress_cpu_s:g} s of CPU used since); {models}{done}{failed}"
        )
