"""When a dead tritonserver is restarted, and what the supervisor's exit status says.

:class:`RestartPolicy` is the restart budget and backoff; :func:`describe_exit` and
:func:`exit_status` turn a :class:`subprocess.Popen` return code into words and into the
shell's exit status; :data:`EXIT_RELOAD_FAILED` and :data:`EXIT_RESTARTS_EXHAUSTED` are the
supervisor's own exit codes.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass

EXIT_RELOAD_FAILED = 70  # --max-restarts 0 only: --max-reloads reloads in a row failed
EXIT_RESTARTS_EXHAUSTED = 75  # the restart budget is spent (sysexits EX_TEMPFAIL)


def describe_exit(returncode: int) -> str:
    """``returncode`` of :class:`subprocess.Popen` in words: a signal's name, or the code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name} (signal {-returncode})"
    return f"exited with code {returncode}"


def exit_status(returncode: int) -> int:
    """The shell's exit status for ``returncode``: ``128 + N`` for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class RestartPolicy:
    """How often a dead tritonserver is restarted, and after what delay.

    At most ``max_restarts`` restarts within any ``window_s`` seconds. The delay before a
    restart doubles with each restart still in the window: ``backoff_s``, ``2 * backoff_s``,
    ... up to ``backoff_max_s``. ``max_restarts = 0`` turns restarts off.
    """

    max_restarts: int = 5
    window_s: float = 600.0
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0

    def recent(self, history: Sequence[float], now: float) -> list[float]:
        """The restart times of ``history`` within the window that ends at ``now``."""
        return [t for t in history if now - t < self.window_s]

    def delay(self, history: Sequence[float], now: float) -> float | None:
        """Seconds to wait before restarting at ``now``, or ``None`` if the budget is spent.

        Args:
            history: the (monotonic) times of the earlier restarts.
            now: the current time on the same clock.
        """
        recent = len(self.recent(history, now))
        if recent >= self.max_restarts:
            return None
        return min(self.backoff_max_s, self.backoff_s * 2**recent)
