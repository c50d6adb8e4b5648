"""Model names: which are allowed, and the step names an ensemble's name gives."""

from __future__ import annotations

import re

from triton_embed.model_control import LEGACY_NAME, STEPS, step_names

#: A model name: what Triton accepts as a folder name and a client can type unquoted.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_NAME_CHARS = 100
__all__ = ["LEGACY_NAME", "MAX_NAME_CHARS", "NAME_PATTERN", "STEPS", "check_name", "step_names"]


class RepositoryError(ValueError):
    """A repository change that cannot be made (one line: what is wrong, what to do)."""


def check_name(name: str) -> str:
    """Return ``name`` if it can name a model.

    Raises:
        RepositoryError: not 1 to 100 characters of ``A-Z a-z 0-9 _ . -`` starting with a
            letter or digit.
    """
    if len(name) > MAX_NAME_CHARS or not NAME_PATTERN.fullmatch(name):
        raise RepositoryError(
            f"--name {name!r} is not a model name: use 1 to {MAX_NAME_CHARS} characters from "
            "A-Z a-z 0-9 _ . -, starting with a letter or digit"
        )
    return name
