"""What runs inside the Triton Python-backend stubs.

The step adapters, tokenization, token IDs, the vLLM engine, vectors, batching, step errors,
step metrics and step config.
"""
