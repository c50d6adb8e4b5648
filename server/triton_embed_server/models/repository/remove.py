"""``repository remove``: a model's ensemble and its two steps, nothing else."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from triton_embed_server.models.repository.layout import TEMP_PREFIX, ensembles, our_steps
from triton_embed_server.models.repository.names import RepositoryError, check_name


def removable(repository: Path, name: str, what: str = "removing") -> tuple[str, str, str]:
    """The model folders of the model ``name``: ensemble, tokenizer step, engine step.

    Args:
        repository: the model repository folder.
        name: the ensemble.
        what: the verb of the refusal (``removing``, ``replacing``).

    Raises:
        RepositoryError: ``name`` is not a model of the repository, not an ensemble whose
            steps are ours, or a step is also a step of another ensemble.
    """
    repository = Path(repository)
    check_name(name)
    found = ensembles(repository)
    if name not in found:
        if not (repository / name).exists():
            raise RepositoryError(
                f"{repository} has no model {name!r} (triton-embed repository list "
                f"--repository {repository} lists its embedding models)"
            )
        raise RepositoryError(
            f"{repository / name} is not an ensemble (no readable config.pbtxt with platform "
            f'"ensemble"); not {what} it'
        )
    try:
        _, tokenizer, engine = our_steps(repository, name, found[name])
    except RepositoryError as exc:
        raise RepositoryError(f"{exc}; not {what} it") from None
    for step in (tokenizer, engine):
        others = sorted(e for e, steps in found.items() if step in steps and e != name)
        if others:
            raise RepositoryError(
                f"{repository / step} is also a step of ensemble {others[0]!r}; not {what} "
                f"{name!r} (remove {others[0]!r} first)"
            )
    return name, tokenizer, engine


def remove_model(repository: Path, name: str) -> list[Path]:
    """Delete the model ``name`` (an embedding model or a reranker): its ensemble and steps.

    The three folders are first moved together into a temporary folder of the repository,
    the ensemble first (a server polling the repository never sees it without its steps),
    then deleted.

    Returns:
        The model folders removed.

    Raises:
        RepositoryError: as :func:`removable`.
        OSError: a folder cannot be moved (the ones moved are put back).
    """
    repository = Path(repository)
    folders = removable(repository, name)
    temp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX + "remove-", dir=repository))
    moved: list[str] = []
    try:
        for model in folders:
            (repository / model).rename(temp / model)
            moved.append(model)
    except OSError:
        for model in reversed(moved):
            (temp / model).rename(repository / model)
        shutil.rmtree(temp, ignore_errors=True)
        raise
    shutil.rmtree(temp)
    return [repository / model for model in folders]
