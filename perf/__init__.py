"""Benchmarks of the embedding service; run each from the repository root with ``python -m``.

* :mod:`perf.bench`: our ensemble side by side with vLLM's server and the engine ceiling.
* :mod:`perf.stub_profile`: CPU per process and py-spy profiles of the stubs under load.
* :mod:`perf.gpu_sweep`: embedder replicas per GPU (BERT-base, random weights).
* :mod:`perf.rerank`: our reranker ensemble and gateway side by side with vLLM's server and
  the engine ceiling (issue 23).
"""
