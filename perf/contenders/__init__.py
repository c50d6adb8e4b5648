"""The contenders :mod:`perf.bench` measures, one module each.

Every contender returns one result dict per run: ``texts_s``, ``p50_ms``, ``p99_ms`` (None
where the contender has no per-request latency), ``errors``, and ``tokens_per_text`` where
it measured the tokens of the texts it actually sent (None or absent otherwise). The
reranking benchmark's (:mod:`perf.rerank`: ``triton_rerank``, ``rerank_engine``, the rerank
loads of ``openai_load`` and ``gateway``) return ``pairs_s`` and ``tokens_per_pair`` instead,
with ``tokens_counted_by`` (``server``, ``client`` or ``engine``).
"""

# The order of the rows in the summary table.
CONTENDERS = (
    "engine",
    "triton_pa",
    "triton_client",
    "gateway_float",
    "gateway_base64",
    "vllm_float",
    "vllm_base64",
)
