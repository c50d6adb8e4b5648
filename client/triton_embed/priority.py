"""Request priority classes and the Triton priority levels they map to, defined once.

Triton's dynamic batcher keeps one queue per priority level (``priority_levels``) and serves
a lower level number first; a request that sends no priority (0) gets
``default_priority_level``. Every step config the repository renders (tokenizer, embedder,
pair tokenizer, scorer, sparse encoder; CPU and GPU variants) states the levels below, and a
unit test checks them against this module (tests/unit/test_priority_configs.py):

==============  =====  ===============================================================
class           level  who
==============  =====  ===============================================================
``interactive`` 1      search queries, agents: served first; the server's default level
``batch``       2      bulk indexing (``triton-embed embed`` sends it by default)
==============  =====  ===============================================================

A step's ``default_queue_policy`` is the interactive level's bound and timeout (it is what a
request without a priority gets, as before priorities existed); ``priority_queue_policy``
``key: 2`` is the batch level's own bound and timeout.

A request's class also travels as the request parameter :data:`CLASS_PARAMETER`
(``priority_class``): Triton's Python backend cannot read a request's priority level, and
the engine steps need the class to run interactive work first and batch work in short
engine calls (``server/triton_embed_server/steps/engine_queue.py``). The client library,
the gateway and the bulk job send both, from one setting (:func:`wire`); a raw
``tritonclient`` caller sends ``priority=2`` and ``parameters={"priority_class": "batch"}``.
"""

from __future__ import annotations

import enum

from triton_embed.quoting import quote

#: Priority levels of every step's dynamic batcher (``priority_levels``).
PRIORITY_LEVELS = 2
#: The batch level's queue timeout over the interactive level's: it waits behind the
#: interactive queue (its bound is the same).
BATCH_TIMEOUT_FACTOR = 2


class Priority(str, enum.Enum):
    """A request's class: ``interactive`` (level 1, first) or ``batch`` (level 2)."""

    INTERACTIVE = "interactive"
    BATCH = "batch"

    @property
    def level(self) -> int:
        """The Triton priority level sent with the request (1 is served first)."""
        return _LEVELS[self]

    @classmethod
    def parse(cls, value: Priority | str, what: str = "priority") -> Priority:
        """``value`` as a :class:`Priority` (case-insensitive).

        Raises:
            ValueError: not ``interactive`` or ``batch`` (names ``what`` and the values).
        """
        if isinstance(value, Priority):
            return value
        try:
            return cls(str(value).strip().lower())
        except ValueError:
            raise ValueError(
                f"{what} must be one of {', '.join(p.value for p in cls)}; got {quote(value)}"
            ) from None


_LEVELS = {Priority.INTERACTIVE: 1, Priority.BATCH: 2}
#: The request parameter that names a request's class to the engine steps (absent:
#: interactive).
CLASS_PARAMETER = "priority_class"
#: The level of a request that sends none (``default_priority_level``): interactive.
DEFAULT_PRIORITY = Priority.INTERACTIVE
DEFAULT_PRIORITY_LEVEL = DEFAULT_PRIORITY.level


def level_of(priority: Priority | str | None) -> int:
    """The priority sent on the wire: 0 (the server's default level) for ``None``.

    Raises:
        ValueError: an unknown class name.
    """
    return 0 if priority is None else Priority.parse(priority).level


def wire(level: int, parameters: dict | None) -> dict:
    """``tritonclient`` keyword arguments that send a request at priority level ``level``.

    Args:
        level: the Triton priority level (:func:`level_of`; 0: the server's default).
        parameters: the request's other KServe v2 parameters, or ``None``.

    Returns:
        ``{"parameters": ..., "priority": level}``: ``parameters`` with
        :data:`CLASS_PARAMETER` added for a non-default level (a copy; the argument is not
        changed), ``None`` when there are none; no ``priority`` key for level 0.
    """
    params = dict(parameters or {})
    out: dict = {}
    if level:
        out["priority"] = level
        params[CLASS_PARAMETER] = _CLASSES[level].value
    out["parameters"] = params or None
    return out


_CLASSES = {level: cls for cls, level in _LEVELS.items()}
