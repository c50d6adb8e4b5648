"""The engines' memory is checked before tritonserver starts, through the real supervisor.

An embedder whose KV-cache budget is more than its NUMA node has available is refused by
the supervisor (exit 78) with one message naming the model, the need and the node's free
memory, before any tritonserver or engine starts. (That the shipped budgets start real
engines on a node smaller than the machine: tests/integration/test_model_families.py, four
vLLM engines, one of them a decoder with a KV cache, and the session server.)
"""

from __future__ import annotations

import re
import time

import pytest
from triton_embed_server.host import node_memory
from triton_embed_server.models.repository.copies import copy_repository, edit_config
from triton_embed_server.run.launcher import TritonServer

pytestmark = pytest.mark.integration


def test_a_kv_cache_beyond_the_node_is_refused_before_the_start(tmp_path):
    needs = node_memory.engine_needs([copy_repository(tmp_path / "probe")])
    node = needs[0].node
    mem = node_memory.read_node_memory(node)
    too_much = mem.total * 2  # more than the node holds, whatever is free
    repo = copy_repository(tmp_path / "model_repository")
    edit_config(
        repo / "embedder" / "config.pbtxt",
        count=1,
        parameters={"kv_cache_bytes": str(too_much), "numa_placement": "off"},
    )
    server = TritonServer(model_repository=repo, ready_timeout_s=60)
    started = time.monotonic()
    with pytest.raises(RuntimeError) as info:
        server.start()
    elapsed = time.monotonic() - started
    text = str(info.value)
    where = "the host" if node is None else f"NUMA node {node}"
    assert "tritonserver exited with 78" in text
    assert f"[supervisor] error: the CPU engines placed on {where} need " in text
    assert f"embedder 1 x {(too_much + needs[0].weight_bytes) / 2**30 + 0.625:.2f} GiB" in text
    assert f"(KV cache {too_much / 2**30:.2f} GiB" in text
    # this host's node grows and shrinks (its MemTotal moved from 9.1 to 12.3 GiB in a day)
    assert re.search(r"it has \d+\.\d\d GiB available of \d+\.\d\d GiB: embedder 1 x ", text)
    assert "Lower the instance_group count, max_num_batched_tokens or max_num_seqs" in text
    assert "successfully loaded" not in text and "tritonserver (pid" not in text
    assert elapsed < 30, "refused at once, before any engine"
