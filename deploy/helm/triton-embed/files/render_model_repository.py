r"""Copy a model repository and render the chart's values into its embedder configs.

The init container of the chart's Triton pods runs this before the main container starts
``scripts/serve.sh`` on the copy (``MODEL_REPOSITORY``)::

    python render_model_repository.py --source /opt/triton-embed/model_repository \
        --dest /models/repository --instances 4 --gpus 1 --hourly-price-usd 2.5 \
        --model-config-name gpu

Every engine step of this project in the repository (``embedder`` of the ``embed``
ensemble, ``NAME_embedder`` of a model that ``triton-embed repository add`` wrote, and
``NAME_scorer`` of a reranker beside it, docs/rerank.md) gets, in the config the server
loads (``configs/<name>.pbtxt`` with ``--model-config-name`` when the model has it, else
``config.pbtxt``):

* ``instance_group`` ``count``: ``--instances`` (per GPU on a ``KIND_GPU`` config, in the
  pod on a ``KIND_CPU`` one);
* the ``hourly_price_usd`` parameter: ``--hourly-price-usd``.

The copy is made by :func:`triton_embed_server.models.repository.copies.copy_repository` (which
precompiles every ``model.py``) and edited with
:func:`triton_embed_server.models.repository.copies.edit_config`; the source is never written. A
``--dest``
left by an earlier run of the pod is replaced. The shared-memory needs of the result
(:mod:`triton_embed_server.host.shm`) are printed for the pod's log.

Exit codes: 0 done; 2 bad arguments, or an embedder whose config does not fit the pod (a
``KIND_CPU`` config in a GPU pod or the reverse), a repository without any embedder of ours,
or a config the edit cannot change; the message names the file.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
from pathlib import Path

from triton_embed_server.host.shm.sizing import model_config_path, plan_repository
from triton_embed_server.models.instance_group import read_config_pbtxt
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.models.repository.layout import ensembles, step_kind

#: The steps that hold an engine (their ``instance_group`` count is the chart's).
ENGINE_STEPS = ("embedder", "scorer")


def engine_steps(repository: Path) -> list[str]:
    """The engine steps (embedders, rerankers' scorers) of this project's ensembles, by name.

    A step folder whose ``1/model.py`` imports this project's embedder or scorer adapter
    (:func:`triton_embed_server.models.repository.layout.step_kind`).
    """
    steps = {s for members in ensembles(repository).values() for s in members}
    return sorted(s for s in steps if step_kind(repository / s) in ENGINE_STEPS)


def render(
    source: Path,
    dest: Path,
    instances: int,
    gpus: int,
    hourly_price_usd: float,
    config_name: str | None,
) -> list[Path]:
    """Copy ``source`` to ``dest`` and set every embedder's count and price.

    Args:
        source: the model repository to copy (not written).
        dest: where the copy goes; replaced if it exists.
        instances: embedder ``instance_group`` count (per GPU when ``gpus`` > 0).
        gpus: GPUs of the pod (0: a CPU pod).
        hourly_price_usd: the embedders' ``hourly_price_usd`` (0 = no cost gauges).
        config_name: ``--model-config-name`` of the server (``gpu``), or None.

    Returns:
        The configs edited.

    Raises:
        ValueError: no embedder of this project in ``source``, an embedder config whose
            ``instance_group`` kind does not fit ``gpus``, or an edit that fails (names the
            file).
    """
    if dest.exists():
        shutil.rmtree(dest)
    copy_repository(dest, source)
    steps = engine_steps(dest)
    if not steps:
        raise ValueError(
            f"{source}: no embedding model of triton-embed (an ensemble whose steps import "
            "triton_embed_server.steps.adapters); write one with `triton-embed repository add`"
        )
    want = "KIND_GPU" if gpus > 0 else "KIND_CPU"
    edited = []
    for step in steps:
        path = model_config_path(dest / step, config_name)
        groups = read_config_pbtxt(path).get("instance_group") or [{}]
        kind = groups[0].get("kind", "KIND_AUTO")
        if kind not in ("KIND_AUTO", want):
            pod = f"a pod with {gpus} GPU(s)" if gpus else "a CPU pod (triton.gpusPerPod 0)"
            raise ValueError(
                f"{path.relative_to(dest)}: instance_group kind {kind}, but this is {pod}; "
                f"give the model a {want} config (`triton-embed repository add --device "
                f"{'gpu' if gpus else 'cpu'}`) or change triton.gpusPerPod"
            )
        edit_config(
            path,
            count=instances,
            parameters={"hourly_price_usd": format_price(hourly_price_usd)},
        )
        edited.append(path)
    return edited


def format_price(value: float) -> str:
    """A price as the config's string parameter: ``0``, ``2.5`` (no exponent, no ``.0``)."""
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"hourly price must be a finite number >= 0, got {value!r}")
    return format(value, "f").rstrip("0").rstrip(".") or "0"


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring. Returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="model repository to copy")
    parser.add_argument("--dest", type=Path, required=True, help="where the copy goes")
    parser.add_argument("--instances", type=int, required=True, help="embedder count per GPU")
    parser.add_argument("--gpus", type=int, default=0, help="GPUs of the pod (0: CPU pod)")
    parser.add_argument("--hourly-price-usd", type=float, default=0.0)
    parser.add_argument("--model-config-name", default="", help="gpu on GPU pods")
    args = parser.parse_args(argv)
    if args.instances < 1 or args.gpus < 0:
        parser.error("--instances must be >= 1 and --gpus >= 0")
    config_name = args.model_config_name or None
    try:
        edited = render(
            args.source,
            args.dest,
            args.instances,
            args.gpus,
            args.hourly_price_usd,
            config_name,
        )
        plan = plan_repository(args.dest, config_name, gpus=args.gpus or None)
    except (OSError, ValueError) as exc:
        print(f"render_model_repository: {exc}", file=sys.stderr)
        return 2
    for path in edited:
        print(
            f"{path.relative_to(args.dest)}: count {args.instances}, "
            f"hourly_price_usd {format_price(args.hourly_price_usd)}"
        )
    print(plan.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
