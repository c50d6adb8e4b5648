"""Config ablations: the ensemble served from changed copies of ``model_repository``.

Each variant is a copy of the repository with knobs changed (:func:`repository_variant`),
or a repository holding only the one-step model the design replaces
(``perf/ablations/embed_text``). :func:`config_ablation` serves each variant in turn and
loads it with perf_analyzer at 50 tokens.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import REPO_ROOT, TritonServer

from perf.contenders.triton_pa import perf_analyzer
from perf.corpora import exact_texts
from perf.report import plot_incremental, save

ABLATION_MODELS = REPO_ROOT / "perf" / "ablations"


def repository_variant(
    tmp: str,
    embedder_count: int | None = None,
    tokenizer_count: int | None = None,
    embedder_delay_us: int | None = None,
    ablation_model: str | None = None,
    output_format: str = "bytes",
) -> Path:
    """A copy of ``model_repository`` with knobs changed, or the one-step ablation model alone.

    Args:
        tmp: folder to create the repository in (as ``<tmp>/model_repository``).
        embedder_count: embedder instances (or, with ``ablation_model``, its instances;
            default 1 there).
        tokenizer_count: tokenizer instances.
        embedder_delay_us: the embedder's ``max_queue_delay_microseconds``.
        ablation_model: serve only this model of ``perf/ablations`` instead.
        output_format: the ablation model's ``output_format`` parameter (``json``/``bytes``).

    Returns:
        The repository folder.
    """
    repo = Path(tmp, "model_repository")
    if ablation_model:
        copy_repository(repo, ABLATION_MODELS, models=[ablation_model])
        edit_config(
            repo / ablation_model / "config.pbtxt",
            count=embedder_count or 1,
            parameters={"output_format": output_format},
        )
        return repo
    copy_repository(repo)
    edit_config(
        repo / "embedder" / "config.pbtxt",
        count=embedder_count,
        max_queue_delay_us=embedder_delay_us,
    )
    edit_config(repo / "tokenizer" / "config.pbtxt", count=tokenizer_count)
    return repo


# Each ablation: (title, model to load, repository_variant arguments) per variant.
# The incremental chart starts from the one-step design and adds one optimization at a time.
INCREMENTAL = [
    (
        "1 step, vLLM tokenizes, JSON out",
        "embed_text",
        {"ablation_model": "embed_text", "output_format": "json"},
    ),
    (
        "+ little-endian bytes out",
        "embed_text",
        {"ablation_model": "embed_text", "output_format": "bytes"},
    ),
    ("+ tokenizer step (ensemble), 1 replica", "embed", {"embedder_count": 1}),
    ("+ 2 pinned replicas (shipped)", "embed", {}),
    ("  variant: 2 tokenizer instances", "embed", {"tokenizer_count": 2}),
]
BATCHING = [
    (f"embedder delay {us} us", "embed", {"embedder_delay_us": us}) for us in (0, 1000, 4000)
]
INSTANCES = [(f"{n} embedder instance(s)", "embed", {"embedder_count": n}) for n in (1, 2, 4)]
ABLATIONS = {"instances": INSTANCES, "incremental": INCREMENTAL, "batching": BATCHING}
ABLATION_LOAD = [(1, 64), (16, 8)]  # (texts per request, requests in flight)


def config_ablation(name: str, variants: list, out_dir: Path, seconds: float = 8) -> list[dict]:
    """Serve each variant in turn and load it with perf_analyzer at 50 tokens.

    Args:
        name: the ablation's name (``<out_dir>/ablation_<name>.json`` and ``.csv``; the
            ``incremental`` one also draws ``incremental.png``).
        variants: ``(title, model, repository_variant arguments)`` per variant.
        out_dir: folder for the results.
        seconds: about the length of each perf_analyzer count window.

    Returns:
        One row per variant and :data:`ABLATION_LOAD` point.
    """
    texts = exact_texts(50)
    rows = []
    for title, model, knobs in variants:
        with tempfile.TemporaryDirectory() as tmp:
            with TritonServer(model_repository=repository_variant(tmp, **knobs)) as server:
                for batch, conc in ABLATION_LOAD:
                    result = perf_analyzer(server, texts, batch, conc, seconds, model=model)
                    row = {
                        "contender": title,
                        "length": 50,
                        "batch": batch,
                        "concurrency": conc,
                        "tokens_per_text": 50.0,
                        **result,
                        "tokens_s": result["texts_s"] * 50,
                    }
                    rows.append(row)
                    print(
                        f"{title:42s} batch={batch:2d} conc={conc:2d} "
                        f"{row['tokens_s']:9.0f} tokens/s "
                        f"p99={row['p99_ms'] or 0:8.1f} ms errors={row['errors']}",
                        flush=True,
                    )
    save(rows, out_dir, f"ablation_{name}")
    if name == "incremental":
        plot_incremental(rows, out_dir)
    return rows
