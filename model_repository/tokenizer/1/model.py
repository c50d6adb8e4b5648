"""Triton Python-backend entry point of the tokenizer step (from `triton-embed repository add`).

The adapter lives in the installed package (triton_embed_server.steps.adapters.tokenizer); this file
only sets the locale first: the stub's embedded interpreter starts with an ASCII locale and
torch/transformers read UTF-8 files at import time (docs/troubleshooting.md).
"""

import locale

locale.setlocale(locale.LC_ALL, "C.UTF-8")

from triton_embed_server.steps.adapters.tokenizer import TritonPythonModel  # noqa: E402

__all__ = ["TritonPythonModel"]
