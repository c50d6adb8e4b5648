"""Model names: which are allowed, and the step names an ensemble's name gives."""

from __future__ import annotations

import re

from triton_embed.model_control import LEGACY_NAME, STEPS, step_names

#: A model name: what Triton accepts as a folder name and a client can type unquoted.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
MAX_NAME_CHARS = 100
#: A served model name (OpenAI's ``model``; a Hugging Face id such as
#: ``sentence-transformers/all-MiniLM-L6-v2``, or ``org/name:tag``): printable ASCII without
#: spaces, quotes or backslashes, so that it is written into ``config.pbtxt`` as it is and
#: read back the same by Triton and by ``repository list`` / ``remove``.
SERVED_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/@+-]*")
MAX_SERVED_NAME_CHARS = 200
__all__ = [
    "LEGACY_NAME",
    "MAX_NAME_CHARS",
    "MAX_SERVED_NAME_CHARS",
    "NAME_PATTERN",
    "SERVED_NAME_PATTERN",
    "STEPS",
    "check_name",
    "check_served_model_name",
    "step_names",
]


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


def check_served_model_name(name: str) -> str:
    """Return ``name`` if it can be a model's ``served_model_name``.

    Raises:
        RepositoryError: not 1 to 200 characters of ``A-Z a-z 0-9 _ . : / @ + -`` starting
            with a letter or digit (a control character, a space, a quote or a backslash
            would break the config's string or its readers); the message quotes at most 40
            characters of it.
    """
    if len(name) > MAX_SERVED_NAME_CHARS or not SERVED_NAME_PATTERN.fullmatch(name):
        shown = repr(name[:40]) + (f" (... {len(name)} characters)" if len(name) > 40 else "")
        raise RepositoryError(
            f"--served-model-name {shown} is not a served model name: use 1 to "
            f"{MAX_SERVED_NAME_CHARS} characters from A-Z a-z 0-9 _ . : / @ + -, starting "
            "with a letter or digit (e.g. sentence-transformers/all-MiniLM-L6-v2)"
        )
    return name
