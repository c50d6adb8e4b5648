"""The tiny model folders of tests/model_factory.py load and encode as intended.

sentence-transformers checks run everywhere (a few seconds); the vLLM checks (marked
``integration`` and ``slow``) load each folder in vLLM in-process and compare with
sentence-transformers on the same token IDs.
"""

from __future__ import annotations

import contextlib
import gc
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import COSINE_MIN
from tests.model_factory import (
    DECODER_PROMPTS,
    ENCODER_PROMPTS,
    EOS_TOKEN,
    HIDDEN_SIZE,
    MEAN_ENCODER_PROMPTS,
    fortune_texts,
    make_cls_encoder,
    make_decoder_embedder,
    make_mean_encoder,
)

MATRYOSHKA = [32, 64, 128]
ST_FILES = [
    "modules.json",
    "sentence_bert_config.json",
    "1_Pooling/config.json",
    "config_sentence_transformers.json",
]
HF_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]

# kind -> (maker, options, architecture, pooling mode, normalized, prompts)
KINDS = {
    "qwen2": (make_decoder_embedder, {}, "Qwen2Model", "lasttoken", True, DECODER_PROMPTS),
    "qwen3": (
        make_decoder_embedder,
        {"arch": "qwen3", "matryoshka_dimensions": MATRYOSHKA},
        "Qwen3Model",
        "lasttoken",
        True,
        DECODER_PROMPTS,
    ),
    "llama": (
        make_decoder_embedder,
        {"arch": "llama"},
        "LlamaModel",
        "lasttoken",
        True,
        DECODER_PROMPTS,
    ),
    "cls": (make_cls_encoder, {}, "BertModel", "cls", True, ENCODER_PROMPTS),
    "mean": (make_mean_encoder, {}, "BertModel", "mean", False, MEAN_ENCODER_PROMPTS),
}
# What vLLM should make of each folder's 1_Pooling/config.json and modules.json.
VLLM_POOLING = {"lasttoken": "LAST", "cls": "CLS", "mean": "MEAN"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {kind: maker(root / kind, **opts) for kind, (maker, opts, *_) in KINDS.items()}


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return fortune_texts(6)


def load_st(path: Path, **kwargs):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu", **kwargs)


def token_ids(model, text: str) -> list[int]:
    return model.tokenizer(text)["input_ids"]


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def test_fortune_texts_are_real_distinct_and_seeded():
    texts = fortune_texts(50)
    assert texts == fortune_texts(50)
    assert texts != fortune_texts(50, seed=1)
    assert len(set(texts)) == 50
    assert all(0 < len(t) <= 150 and t == t.strip() for t in texts)
    short = fortune_texts(5, max_chars=80)
    assert len(short) == 5 and all(len(t) <= 80 for t in short)
    with pytest.raises(ValueError, match="fortunes"):
        fortune_texts(10**6)


@pytest.mark.parametrize("kind", list(KINDS))
def test_folder_loads_in_sentence_transformers(folders, texts, kind):
    _, _, arch, mode, normalized, prompts = KINDS[kind]
    path = folders[kind]
    for name in HF_FILES + ST_FILES:
        assert (path / name).is_file(), name
    config = read_json(path / "config.json")
    assert config["architectures"] == [arch]
    assert config["hidden_size"] == HIDDEN_SIZE
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    assert config.get("head_dim", 64) == 64

    model = load_st(path)
    pooling = model[1]
    assert pooling.pooling_mode == mode
    assert pooling.include_prompt is (kind != "mean")
    assert model.get_embedding_dimension() == HIDDEN_SIZE
    assert model.max_seq_length == 128
    assert model.prompts == prompts
    assert model.default_prompt_name is None
    assert (len(model) == 3) is normalized

    tok = model.tokenizer
    ids = token_ids(model, texts[0])
    if mode == "lasttoken":
        eos = tok.convert_tokens_to_ids(EOS_TOKEN)
        assert ids[-1] == eos and eos not in ids[:-1]
        assert tok.pad_token == EOS_TOKEN
    else:
        assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id
        assert token_ids(model, "HELLO World") == token_ids(model, "hello world")

    vectors = model.encode(texts)
    assert vectors.shape == (len(texts), HIDDEN_SIZE) and vectors.dtype == np.float32
    assert np.isfinite(vectors).all()
    norms = np.linalg.norm(vectors, axis=1)
    if normalized:
        np.testing.assert_allclose(norms, 1.0, atol=1e-5)
    else:
        assert not np.allclose(norms, 1.0, atol=1e-2)
    # Different texts give clearly different vectors (not just float noise), so that a
    # 0.9999 cosine against another implementation means something.
    pairwise = cosines(vectors[:, None, :], vectors[None, :, :])
    assert pairwise[~np.eye(len(texts), dtype=bool)].max() < 0.99
    with_prompt = model.encode(texts[:1], prompt_name="query")
    assert cosines(with_prompt[0], vectors[0]) < 0.999


@pytest.mark.parametrize("kind", list(KINDS))
def test_auto_tokenizer_matches_tokenizer_json(folders, kind):
    """transformers rebuilds some tokenizers by model type (qwen2): same IDs as the file."""
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = folders[kind]
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(path))
    assert read_json(path / "tokenizer_config.json")["tokenizer_class"] == "PreTrainedTokenizerFast"
    for text in fortune_texts(200, seed=3) + ["", "  two  spaces\n\n\ttab", "ünïcödé 日本語 😀"]:
        assert auto(text)["input_ids"] == raw.encode(text).ids, text
    # fortune_texts' promise: behind the longest prompt they fit 128 tokens.
    prompt = max(KINDS[kind][5].values(), key=len)
    encodings = raw.encode_batch([prompt + t for t in fortune_texts(2000)])
    assert max(len(e.ids) for e in encodings) <= 128


def test_same_call_writes_the_same_folder_in_another_process(tmp_path):
    # Another process: tokenizer training that depends on hash-map order would show here.
    script = (
        "import sys; from tests.model_factory import make_cls_encoder, make_decoder_embedder; "
        "make_cls_encoder(sys.argv[1] + '/cls'); make_decoder_embedder(sys.argv[1] + '/dec')"
    )
    root = Path(__file__).resolve().parents[2]
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "a")], cwd=root, check=True)
    make_cls_encoder(tmp_path / "b" / "cls")
    make_decoder_embedder(tmp_path / "b" / "dec")
    for name in ("cls", "dec"):
        a, b = tmp_path / "a" / name, tmp_path / "b" / name
        files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
        assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
        for f in files:
            assert (a / f).read_bytes() == (b / f).read_bytes(), f
    other = make_cls_encoder(tmp_path / "seed1", seed=1)
    a = tmp_path / "a" / "cls"
    assert (a / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (other / "tokenizer.json").read_bytes()


def test_decoder_matryoshka_goes_into_config_json(folders):
    config = read_json(folders["qwen3"] / "config.json")
    assert config["matryoshka_dimensions"] == MATRYOSHKA and config["is_matryoshka"] is True
    assert "matryoshka_dimensions" not in read_json(folders["qwen2"] / "config.json")


def test_decoder_options(tmp_path, texts):
    path = make_decoder_embedder(
        tmp_path / "opts",
        arch="qwen3",
        prompts=False,
        normalize=False,
        max_seq_length=64,
    )
    assert [m["type"].rsplit(".", 1)[-1] for m in read_json(path / "modules.json")] == [
        "Transformer",
        "Pooling",
    ]
    model = load_st(path)
    assert read_json(path / "config_sentence_transformers.json")["prompts"] == {}
    assert not any(model.prompts.values()) and model.max_seq_length == 64
    assert not np.allclose(np.linalg.norm(model.encode(texts), axis=1), 1.0, atol=1e-2)

    path = make_decoder_embedder(tmp_path / "default", default_prompt_name="query")
    model = load_st(path)
    assert model.default_prompt_name == "query"
    np.testing.assert_allclose(
        model.encode(texts[:2]), model.encode(texts[:2], prompt_name="query"), atol=1e-6
    )


def test_decoder_without_sentence_transformers_files(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    path = make_decoder_embedder(tmp_path / "bare", arch="llama", sentence_transformers_files=False)
    assert sorted(p.name for p in path.iterdir()) == sorted(HF_FILES)
    assert AutoConfig.from_pretrained(str(path)).architectures == ["LlamaModel"]
    tok = AutoTokenizer.from_pretrained(str(path))
    assert tok("hello")["input_ids"][-1] == tok.convert_tokens_to_ids(EOS_TOKEN)


def test_cls_encoder_without_prompts_or_normalize(tmp_path):
    model = load_st(make_cls_encoder(tmp_path / "plain", prompts=False, normalize=False))
    assert not any(model.prompts.values()) and len(model) == 2


def test_mean_encoder_include_prompt_decides_whether_prompt_tokens_are_averaged(tmp_path, texts):
    excluded = load_st(make_mean_encoder(tmp_path / "excl", include_prompt=False))
    included = load_st(make_mean_encoder(tmp_path / "incl", include_prompt=True))
    assert included[1].include_prompt is True
    # Same seed, same weights: without a prompt the two agree ...
    np.testing.assert_allclose(excluded.encode(texts[:2]), included.encode(texts[:2]), rtol=1e-5)
    # ... with one, the excluded model averages only the text's own tokens.
    a = excluded.encode(texts[:2], prompt_name="query")
    b = included.encode(texts[:2], prompt_name="query")
    assert (cosines(a, b) < 0.999).all()
    out = excluded[0](
        excluded.tokenize([MEAN_ENCODER_PROMPTS["query"] + texts[0]])
    )  # [CLS] prompt text [SEP]
    prompt_len = len(token_ids(excluded, MEAN_ENCODER_PROMPTS["query"])) - 1
    manual = out["token_embeddings"][0, prompt_len:].mean(0).detach().numpy()
    np.testing.assert_allclose(a[0], manual, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- vLLM, in-process


@pytest.fixture
def vllm_env(monkeypatch):
    # The engine in this process (no spawned engine core), a small KV cache, nothing fetched.
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("VLLM_NO_USAGE_STATS", "1")


@contextlib.contextmanager
def running_llm(path: Path, **kwargs):
    """An in-process vLLM engine on ``path``, shut down on the way out.

    Shut down explicitly, not left to the garbage collector: a finalizer that runs late tears
    down the process-wide distributed state the next engine is using ("pipeline model
    parallel group is not initialized").
    """
    from vllm import LLM

    llm = LLM(
        model=str(path),
        runner="pooling",
        dtype="float32",
        enforce_eager=True,
        max_model_len=128,
        gpu_memory_utilization=0.1,
        seed=0,
        **kwargs,
    )
    try:
        yield llm
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def vllm_encode(llm, ids: list[list[int]], task: str = "embed", **kwargs) -> list[np.ndarray]:
    from vllm.inputs import TokensPrompt

    outputs = llm.encode(
        [TokensPrompt(prompt_token_ids=i) for i in ids], pooling_task=task, use_tqdm=False, **kwargs
    )
    return [o.outputs.data.float().numpy() for o in outputs]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kind", list(KINDS))
def test_vllm_matches_sentence_transformers(folders, texts, vllm_env, kind, capsys):
    from vllm import PoolingParams
    from vllm.exceptions import VLLMValidationError

    _, _, _, mode, normalized, _ = KINDS[kind]
    path = folders[kind]
    model = load_st(path)
    ids = [token_ids(model, t) for t in texts]
    ids.append(token_ids(model, DECODER_PROMPTS["query"] + texts[0]))
    reference = model.encode(texts + [DECODER_PROMPTS["query"] + texts[0]])

    with running_llm(path) as llm:
        pooler = llm.llm_engine.model_config.pooler_config
        vectors = np.stack(vllm_encode(llm, ids))
        assert vectors.shape == reference.shape
        cos = cosines(vectors, reference)
        with capsys.disabled():
            print(
                f"\n{kind}: vLLM seq_pooling_type={pooler.seq_pooling_type} "
                f"use_activation={pooler.use_activation}, min cosine to "
                f"sentence-transformers {cos.min():.7f}"
            )
        assert pooler.seq_pooling_type == VLLM_POOLING[mode]
        assert pooler.use_activation is normalized
        assert (cos >= COSINE_MIN).all(), cos
        np.testing.assert_allclose(
            np.linalg.norm(vectors, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-4
        )
        if kind == "qwen3":
            short = np.stack(vllm_encode(llm, ids, pooling_params=PoolingParams(dimensions=32)))
            assert short.shape == (len(ids), 32)
            # vLLM truncates and then normalizes; sentence-transformers truncates last.
            np.testing.assert_allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-5)
            assert (cosines(short, reference[:, :32]) >= COSINE_MIN).all()
            with pytest.raises(VLLMValidationError, match="Matryoshka"):
                vllm_encode(llm, ids[:1], pooling_params=PoolingParams(dimensions=48))
        elif mode == "lasttoken":
            with pytest.raises(VLLMValidationError, match="Matryoshka"):
                vllm_encode(llm, ids[:1], pooling_params=PoolingParams(dimensions=32))


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["qwen2", "cls"])
def test_vllm_token_embed_and_pooler_overrides(folders, texts, vllm_env, kind):
    """Per-token vectors need ``PoolerConfig(task="token_embed")``; explicit settings win."""
    import torch
    from vllm import PoolingParams
    from vllm.config import PoolerConfig

    model = load_st(folders[kind])
    ids = [token_ids(model, t) for t in texts[:3]]
    with torch.no_grad():
        tokens = [
            model[0](
                {"input_ids": torch.tensor([i]), "attention_mask": torch.ones(1, len(i), dtype=int)}
            )["token_embeddings"][0].numpy()
            for i in ids
        ]

    # An LLM serves one pooling task: "embed" by default, "token_embed" only when asked.
    with running_llm(folders[kind]) as llm:
        with pytest.raises(ValueError, match="token_embed"):
            vllm_encode(llm, ids, task="token_embed")
        # use_activation per request: the raw pooled hidden state, not normalized.
        raw = np.stack(vllm_encode(llm, ids, pooling_params=PoolingParams(use_activation=False)))
        pos = -1 if kind == "qwen2" else 0
        expected = np.stack([t[pos] for t in tokens])
        np.testing.assert_allclose(raw, expected, rtol=1e-4, atol=1e-4)

    with running_llm(folders[kind], pooler_config=PoolerConfig(task="token_embed")) as llm:
        per_token = vllm_encode(llm, ids, task="token_embed")
        for got, want in zip(per_token, tokens, strict=True):
            assert got.shape == want.shape == (len(got), HIDDEN_SIZE)
            assert (cosines(got, want) >= COSINE_MIN).all()
            # The Normalize module makes vLLM normalize every token vector.
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
        plain = PoolingParams(use_activation=False)
        for got, want in zip(
            vllm_encode(llm, ids, task="token_embed", pooling_params=plain), tokens, strict=True
        ):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        with pytest.raises(ValueError, match="embed"):
            vllm_encode(llm, ids, task="embed")

    # Explicit pooler settings override the folder's (last-token / CLS, normalized) files.
    pooler = PoolerConfig(seq_pooling_type="MEAN", use_activation=False)
    with running_llm(folders[kind], pooler_config=pooler) as llm:
        means = np.stack(vllm_encode(llm, ids))
        expected = np.stack([t.mean(0) for t in tokens])
        np.testing.assert_allclose(means, expected, rtol=1e-4, atol=1e-4)
        assert not np.allclose(np.linalg.norm(means, axis=1), 1.0, atol=1e-2)
