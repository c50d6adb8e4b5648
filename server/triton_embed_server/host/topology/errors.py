"""The one exception every topology parser raises."""

from __future__ import annotations


class TopologyParseError(ValueError):
    """A command's output could not be read; the message names the command and what was expected."""
