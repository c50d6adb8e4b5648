"""The engines' KV-cache budget and the NUMA-node memory check before the server starts.

The budget's arithmetic (:mod:`triton_embed_server.steps.kv_cache`) is checked on hand-written
``config.json`` files; the check (:mod:`triton_embed_server.host.node_memory`) on fake sysfs
trees: a 16 GiB node of a 24 GiB machine and several engines on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from triton_embed_server.host import node_memory
from triton_embed_server.host.node_memory import (
    ENGINE_BASE_BYTES,
    EngineNeed,
    NodeMemory,
    NodeMemoryError,
)
from triton_embed_server.steps import kv_cache
from triton_embed_server.steps.config import EmbedderConfig

from tests.helpers import MODEL_PATH

GIB = 1 << 30
MIB = 1 << 20
# The Qwen3-style test model of tests/model_factory.py: 2 layers, 1 KV head of 64, float32.
DECODER = {
    "model_type": "qwen3",
    "architectures": ["Qwen3Model"],
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "hidden_size": 128,
    "max_position_embeddings": 512,
    "torch_dtype": "float32",
}
# One engine step of the shipped limits (T = 16,384, S = 256) at max_length 128:
# 256 + floor((16,384 - 256) / 128) = 382 blocks x 128 tokens x 1,024 bytes a token.
# vLLM 0.32 on this host, given this budget for that model: "CPU KV cache size: 48,896
# tokens" (382 blocks), the engine started.
STEP_BYTES = 382 * 128 * 1024


def decoder_folder(path: Path, weights: int = 2 * MIB, **config) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**DECODER, **config}))
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    (path / "model.safetensors").write_bytes(b"\0" * weights)
    return path


def embedder_config(model: Path, count: int = 1, **params: str) -> dict:
    parameters = {"model_path": str(model), "numa_placement": "off", **params}
    return {
        "backend": "python",
        "instance_group": [{"count": count, "kind": "KIND_CPU"}],
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
    }


# ---- the budget ----------------------------------------------------------------------------


def test_a_decoder_step_budget_is_blocks_times_bytes_per_token(tmp_path):
    model = decoder_folder(tmp_path / "qwen")
    shape = kv_cache.kv_shape(model)
    assert shape.bytes_per_token(4) == 2 * 2 * 1 * 64 * 4 == 1024
    assert kv_cache.step_blocks(16384, 256, 128) == 382
    assert kv_cache.kv_cache_bytes(model, "float32", 16384, 256, 128) == STEP_BYTES
    # bfloat16 halves it; auto takes the checkpoint's dtype
    assert kv_cache.kv_cache_bytes(model, "bfloat16", 16384, 256, 128) == STEP_BYTES // 2
    assert kv_cache.kv_cache_bytes(model, "auto", 16384, 256, 128) == STEP_BYTES


@pytest.mark.parametrize(
    ("tokens", "seqs", "max_len", "blocks"),
    [
        (16384, 256, 512, 382),  # many short sequences: one block each, then 128 tokens a block
        (16384, 1, 512, 128),  # one sequence of T tokens
        (512, 256, 512, 256 + 2),  # T = 512: at most 256 sequences, 256 more tokens
        (600, 1, 600, 5),  # one full-length sequence: ceil(600 / 128)
        (128, 128, 128, 128),  # n = min(S, T)
    ],
)
def test_step_blocks(tokens, seqs, max_len, blocks):
    assert kv_cache.step_blocks(tokens, seqs, max_len) == blocks


def test_an_encoder_keeps_no_kv_cache():
    # all-MiniLM-L6-v2 is a BERT: vLLM's EncoderOnlyAttention allocates no KV cache
    assert kv_cache.kv_shape(MODEL_PATH).layers == 0
    assert kv_cache.kv_cache_bytes(MODEL_PATH, "float32", 16384, 256, 256) == 0


def test_head_dim_defaults_to_hidden_over_heads_and_kv_heads_to_heads(tmp_path):
    model = tmp_path / "m"
    decoder_folder(model)
    config = {k: v for k, v in DECODER.items() if k not in ("head_dim", "num_key_value_heads")}
    config["model_type"] = "llama"
    (model / "config.json").write_text(json.dumps(config))
    assert kv_cache.kv_shape(model) == kv_cache.KvShape("llama", 2, 2, 64)


def test_a_decoder_config_without_sizes_names_the_keys_and_the_parameter(tmp_path):
    model = tmp_path / "m"
    decoder_folder(model)
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    with pytest.raises(ValueError, match="num_hidden_layers.*kv_cache_bytes parameter"):
        kv_cache.kv_shape(model)


def test_the_config_computes_auto_and_passes_it_to_vllm(tmp_path):
    model = decoder_folder(tmp_path / "qwen")
    cfg = EmbedderConfig.from_model_config(embedder_config(model))
    assert cfg.kv_cache_bytes is None
    assert cfg.kv_cache_budget == STEP_BYTES
    assert cfg.llm_kwargs()["kv_cache_memory_bytes"] == STEP_BYTES
    # smaller limits, smaller budget: T = 1,024, S = 8 -> 8 + floor(1,016 / 128) = 15 blocks
    small = EmbedderConfig.from_model_config(
        embedder_config(model, max_num_batched_tokens="1024", max_num_seqs="8")
    )
    assert small.kv_cache_budget == 15 * 128 * 1024


def test_an_explicit_budget_is_kept_and_one_below_a_full_sequence_is_refused(tmp_path):
    model = decoder_folder(tmp_path / "qwen")
    cfg = EmbedderConfig.from_model_config(embedder_config(model, kv_cache_bytes="1000000"))
    assert cfg.llm_kwargs()["kv_cache_memory_bytes"] == 1_000_000
    with pytest.raises(ValueError) as info:
        EmbedderConfig.from_model_config(embedder_config(model, kv_cache_bytes="1000"))
    # one sequence of 128 tokens: 1 block of 128 x 1,024 bytes
    assert str(info.value) == (
        "parameter kv_cache_bytes=1000 is less than one sequence of max_length=128 tokens "
        f"needs (131072 bytes); set it to {STEP_BYTES} (one full engine step: triton-embed "
        "repository add writes it) or auto"
    )
    with pytest.raises(ValueError, match="kv_cache_bytes='lots' is not an integer"):
        EmbedderConfig.from_model_config(embedder_config(model, kv_cache_bytes="lots"))


def test_the_engine_refuses_the_legacy_variable_that_would_override_the_budget(monkeypatch):
    from triton_embed_server.steps.errors import EngineError
    from triton_embed_server.steps.vllm_engine import PoolingEngine

    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    cfg = EmbedderConfig.from_model_config(embedder_config(MODEL_PATH))
    with pytest.raises(EngineError, match="VLLM_CPU_KVCACHE_SPACE='4' is set and would override"):
        PoolingEngine(cfg)


# ---- the node's memory -----------------------------------------------------------------------


def fake_host(root: Path, nodes: dict[int, tuple[str, int, int]], machine_gib: int = 24) -> Path:
    """sysfs ``node`` folder: ``{node: (cpulist, MemTotal, MemFree)}`` bytes; /proc/meminfo."""
    sysfs = root / "node"
    for node, (cpus, total, free) in nodes.items():
        folder = sysfs / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
        (folder / "meminfo").write_text(
            f"Node {node} MemTotal:       {total // 1024} kB\n"
            f"Node {node} MemFree:        {free // 1024} kB\n"
            f"Node {node} MemUsed:        {(total - free) // 1024} kB\n"
            f"Node {node} Active(file):   {256 * 1024} kB\n"
            f"Node {node} Inactive(file): {256 * 1024} kB\n"
            f"Node {node} SReclaimable:   0 kB\n"
        )
    (root / "meminfo").write_text(
        f"MemTotal: {machine_gib * GIB // 1024} kB\nMemAvailable: {machine_gib * GIB // 1024} kB\n"
    )
    return sysfs


def test_a_node_is_read_as_vllm_reads_it_not_the_machine(tmp_path):
    sysfs = fake_host(tmp_path, {0: ("0-1", 16 * GIB, 12 * GIB)})
    mem = node_memory.read_node_memory(
        0, sysfs, tmp_path / "meminfo", cgroup_root=tmp_path / "none"
    )
    # MemFree + Active(file) + Inactive(file) + SReclaimable of the node, not the 24 GiB
    assert mem == NodeMemory(0, 16 * GIB, 12 * GIB + 512 * MIB)
    host = node_memory.read_node_memory(
        None, sysfs, tmp_path / "meminfo", cgroup_root=tmp_path / "none"
    )
    assert host == NodeMemory(None, 24 * GIB, 24 * GIB)


def test_a_cgroup_limit_caps_the_node(tmp_path):
    sysfs = fake_host(tmp_path, {0: ("0-1", 16 * GIB, 12 * GIB)})
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text(str(8 * GIB))
    (cgroup / "memory.current").write_text(str(3 * GIB))
    mem = node_memory.read_node_memory(0, sysfs, tmp_path / "meminfo", cgroup)
    assert mem == NodeMemory(0, 8 * GIB, 5 * GIB)


def repository_of(root: Path, models: dict[str, tuple[Path, int]]) -> Path:
    """A repository of embedder steps ``{name: (model folder, instances)}`` (the template's
    ``model.py`` line makes each one of ours)."""
    repo = root / "repo"
    for name, (model, count) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(
            "from triton_embed_server.steps.adapters.embedder import TritonPythonModel\n"
        )
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            f"instance_group [ {{ count: {count}, kind: KIND_CPU }} ]\n"
            f'parameters [ {{ key: "model_path", value: {{ string_value: "{model}" }} }},\n'
            '  { key: "numa_placement", value: { string_value: "off" } } ]\n'
        )
    return repo


def test_several_engines_on_a_16_gib_node_of_a_24_gib_machine(tmp_path):
    sysfs = fake_host(tmp_path, {0: ("0-1", 16 * GIB, 3 * GIB)})
    model = decoder_folder(tmp_path / "qwen", weights=100 * MIB)
    repo = repository_of(tmp_path, {"a_embedder": (model, 2), "b_embedder": (model, 2)})
    needs = node_memory.engine_needs([repo], allowed_cpus=[0, 1], numa_root=sysfs)
    each = STEP_BYTES + 100 * MIB + ENGINE_BASE_BYTES
    assert needs == [
        EngineNeed("a_embedder", 0, 0, STEP_BYTES, 100 * MIB),
        EngineNeed("a_embedder", 1, 0, STEP_BYTES, 100 * MIB),
        EngineNeed("b_embedder", 0, 0, STEP_BYTES, 100 * MIB),
        EngineNeed("b_embedder", 1, 0, STEP_BYTES, 100 * MIB),
    ]
    assert needs[0].total == each

    def memory(node):
        return node_memory.read_node_memory(node, sysfs, tmp_path / "meminfo", tmp_path / "x")

    # 4 x (47.75 + 100 + 640) MiB = 3.08 GiB against 3 + 0.5 (file pages) GiB: fits
    node_memory.require_fit(needs, memory)
    # a third model's two engines do not
    repo3 = repository_of(tmp_path / "3", {"a_embedder": (model, 2), "b_embedder": (model, 2),
                                           "c_embedder": (model, 2)})  # fmt: skip
    needs3 = node_memory.engine_needs([repo3], allowed_cpus=[0, 1], numa_root=sysfs)
    with pytest.raises(NodeMemoryError) as info:
        node_memory.require_fit(needs3, memory)
    need = 6 * each
    assert str(info.value) == (
        f"the CPU engines placed on NUMA node 0 need {need / GIB:.2f} GiB ({need} bytes) and "
        "it has 3.50 GiB available of 16.00 GiB: "
        + ", ".join(
            f"{m} 2 x 0.77 GiB (KV cache 0.05 GiB, weights 0.10 GiB, engine 0.62 GiB)"
            for m in ("a_embedder", "b_embedder", "c_embedder")
        )
        + ". Lower the instance_group count, max_num_batched_tokens or max_num_seqs (they size "
        "kv_cache_bytes), serve fewer models on this node (numa_placement=auto spreads "
        "instances over the nodes), or free memory on the node."
    )


def test_engines_are_counted_on_the_node_of_their_first_cpu(tmp_path):
    # two nodes of 8 CPUs; threads_bind=spread gives instance i its slice of the CPUs
    sysfs = fake_host(tmp_path, {0: ("0-7", 16 * GIB, 0), 1: ("8-15", 16 * GIB, 8 * GIB)})
    model = decoder_folder(tmp_path / "qwen")
    repo = repository_of(tmp_path, {"a_embedder": (model, 2)})
    needs = node_memory.engine_needs([repo], allowed_cpus=range(16), numa_root=sysfs)
    assert [(n.instance, n.node) for n in needs] == [(0, 0), (1, 1)]

    def memory(node):
        return node_memory.read_node_memory(node, sysfs, tmp_path / "meminfo", tmp_path / "x")

    short = node_memory.shortfalls(needs, memory)
    assert [(mem.node, [n.instance for n in ns]) for mem, ns in short] == [(0, [0])]


def test_gpu_engines_and_other_models_are_not_counted(tmp_path):
    sysfs = fake_host(tmp_path, {0: ("0-1", 16 * GIB, 1 * GIB)})
    model = decoder_folder(tmp_path / "qwen")
    repo = repository_of(tmp_path, {"a_embedder": (model, 1)})
    config = repo / "a_embedder" / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_CPU", "KIND_GPU"))
    (repo / "tokenizer").mkdir()
    (repo / "tokenizer" / "config.pbtxt").write_text('name: "tokenizer"\nbackend: "python"\n')
    assert node_memory.engine_needs([repo], allowed_cpus=[0, 1], numa_root=sysfs) == []


def test_the_supervisor_refuses_to_start_engines_that_do_not_fit(tmp_path, monkeypatch, capsys):
    from triton_embed_server.run.supervisor.command import main

    model = decoder_folder(tmp_path / "qwen")
    repo = repository_of(tmp_path, {"a_embedder": (model, 2)})
    monkeypatch.setattr(
        node_memory, "read_node_memory", lambda node: NodeMemory(node, 16 * GIB, 1 * GIB)
    )
    code = main(["--tritonserver", str(tmp_path / "never-run"), "--",
                 "--model-repository", str(repo)])  # fmt: skip
    assert code == node_memory.EXIT_TOO_SMALL == 78
    err = capsys.readouterr().err
    assert "[supervisor] engine memory: node 0: 2 CPU engine(s) (a_embedder) need 1.35 GiB" in err
    assert "[supervisor] error: the CPU engines placed on NUMA node 0 need 1.35 GiB" in err
    assert "it has 1.00 GiB available of 16.00 GiB: a_embedder 2 x 0.67 GiB" in err


def test_the_shipped_repository_fits_this_host():
    from triton_embed_server.models.repository.copies import MODEL_REPOSITORY
    from triton_embed_server.steps.config import served_dtype

    needs = node_memory.engine_needs([MODEL_REPOSITORY])
    assert [(n.model, n.kv_cache_bytes) for n in needs] == [("embedder", 0), ("embedder", 0)]
    # the float32 checkpoint, loaded at the shipped bfloat16 (half its bytes) where the CPUs
    # multiply bfloat16, else at float32 (the embedder's fallback)
    size = (MODEL_PATH / "model.safetensors").stat().st_size
    served = served_dtype(MODEL_REPOSITORY / "embedder")
    assert needs[0].weight_bytes == (size // 2 if served == "bfloat16" else size)
    node_memory.require_fit(needs)


def test_only_the_models_an_explicit_start_loads_are_counted(tmp_path):
    model = decoder_folder(tmp_path / "qwen")
    repo = repository_of(tmp_path, {"a_embedder": (model, 1), "b_embedder": (model, 1)})
    (repo / "a").mkdir()
    (repo / "a" / "config.pbtxt").write_text(
        'name: "a"\nplatform: "ensemble"\nensemble_scheduling { step [ '
        '{ model_name: "a_tokenizer" model_version: -1 }, '
        '{ model_name: "a_embedder" model_version: -1 } ] }\n'
    )
    explicit = ["--model-repository", str(repo), "--model-control-mode", "explicit"]
    assert node_memory.loaded_models(["--model-repository", str(repo)], [repo]) is None
    assert node_memory.loaded_models([*explicit, "--load-model", "*"], [repo]) is None
    assert node_memory.loaded_models([*explicit, "--load-model", "a"], [repo]) == {
        "a",
        "a_tokenizer",
        "a_embedder",
    }
    assert node_memory.loaded_models([*explicit, "--load-model=b_embedder"], [repo]) == {
        "b_embedder"
    }
