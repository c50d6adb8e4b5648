"""Prompts, START with a prompt, and CHUNK windows in the tokenizer step (real tokenizer).

The reference is transformers' tokenizer of the same folder: sentence-transformers feeds the
model ``tokenizer(prompt + text)``, so the step's IDs must equal those.
"""

from __future__ import annotations

import json
import shutil

import pytest
from triton_embed.options import RequestOptions, Truncation
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import InvalidArgumentError, TooLongError
from triton_embed_server.steps.tokenization import TextRequest, TextTokenizer

from tests.helpers import MODEL_PATH

QUERY = "Represent this question for retrieval: "
LONG = " ".join(f"item {i} is number {i * 7}" for i in range(60))  # ~360 tokens


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    dest = tmp_path_factory.mktemp("prompted") / "model"
    dest.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        shutil.copy(MODEL_PATH / name, dest / name)
    shutil.copy(MODEL_PATH / "modules.json", dest / "modules.json")
    (dest / "1_Pooling").mkdir()
    (dest / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_mean_tokens": True, "include_prompt": False})
    )
    (dest / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": QUERY, "document": ""}, "default_prompt_name": "query"})
    )
    return dest


@pytest.fixture(scope="module")
def hf(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def make(folder, max_length=64, max_chunks=4) -> TextTokenizer:
    params = {"model_path": str(folder), "max_length": str(max_length)}
    params["max_chunks"] = str(max_chunks)
    config = {"parameters": {k: {"string_value": v} for k, v in params.items()}}
    return TextTokenizer(TokenizerConfig.from_model_config(config))


def one(tok, text, **options):
    [result] = tok.tokenize_requests([TextRequest([text.encode()], RequestOptions(**options))])
    if isinstance(result, Exception):
        raise result
    return result


def test_the_default_prompt_is_tokenized_with_the_text(folder, hf):
    tok = make(folder)
    got = one(tok, "where is the fox?")
    assert got.token_ids == [hf(QUERY + "where is the fox?")["input_ids"]]
    assert got.num_tokens == [len(got.token_ids[0])]


def test_document_has_no_prompt_and_an_unknown_type_lists_the_names(folder, hf):
    tok = make(folder)
    assert one(tok, "a fox", input_type="document").token_ids == [hf("a fox")["input_ids"]]
    with pytest.raises(InvalidArgumentError) as info:
        one(tok, "a fox", input_type="code")
    assert str(info.value) == (
        "request parameter input_type='code' is not a prompt of this model; "
        "its input types are document, query"
    )


def test_include_prompt_false_skips_what_sentence_transformers_skips(folder, hf):
    tok = make(folder)
    got = one(tok, "where is the fox?")
    # sentence-transformers: len(tokenizer(prompt)) minus its trailing special token.
    skip = len(hf(QUERY)["input_ids"]) - 1
    assert got.windows == [[(len(got.token_ids[0]), skip, got.windows[0][0][2])]]
    assert one(tok, "x", input_type="document").windows[0][0][1] == 0


def test_end_truncation_equals_transformers_with_the_prompt(folder, hf):
    tok = make(folder)
    got = one(tok, LONG, truncation="END")
    assert got.token_ids == [hf(QUERY + LONG, truncation=True, max_length=64)["input_ids"]]


def test_start_truncation_keeps_the_prompt_and_the_end_of_the_text(folder, hf):
    tok = make(folder)
    got = one(tok, LONG, truncation="START").token_ids[0]
    prompt = hf(QUERY, add_special_tokens=False)["input_ids"]
    text = hf(LONG, add_special_tokens=False)["input_ids"]
    room = 64 - 2 - len(prompt)
    assert got == [101, *prompt, *text[-room:], 102]


def test_chunk_windows_tile_the_text_each_with_prompt_and_special_tokens(folder, hf):
    tok = make(folder, max_length=64, max_chunks=16)
    got = one(tok, LONG, truncation="CHUNK")
    prompt = hf(QUERY, add_special_tokens=False)["input_ids"]
    text = hf(LONG, add_special_tokens=False)["input_ids"]
    room = 64 - 2 - len(prompt)
    pieces = [text[k : k + room] for k in range(0, len(text), room)]
    want = [[101, *prompt, *piece, 102] for piece in pieces]
    assert got.token_ids == [[i for w in want for i in w]]
    skip = len(hf(QUERY)["input_ids"]) - 1
    assert got.windows == [[(len(w), skip, len(p)) for w, p in zip(want, pieces, strict=True)]]
    assert got.num_tokens == [sum(len(w) for w in want)]
    assert all(len(w) <= 64 for w in want) and len(want) > 1


def test_chunk_limits_are_invalid_argument_naming_them(folder):
    tok = make(folder, max_length=64, max_chunks=2)
    with pytest.raises(TooLongError) as info:
        one(tok, LONG, truncation="CHUNK")
    assert "windows of 64 tokens with truncation=CHUNK, over the limit of 2" in str(info.value)
    # over max_chars (64 x 64) x max_chunks (2) = 8,192 characters, under the 4 x 8,192-byte
    # size limit that refuses a text before it is decoded (test_text_size.py)
    huge = "word " * 2000
    with pytest.raises(TooLongError) as info:
        one(tok, huge, truncation="CHUNK")
    assert "over the 8192-character cap of truncation=CHUNK (2 windows of 64 tokens)" in str(
        info.value
    )


def test_a_short_text_is_one_window_whatever_the_truncation(folder, hf):
    tok = make(folder)
    for truncation in Truncation:
        got = one(tok, "short", truncation=truncation)
        assert len(got.windows[0]) == 1
        assert got.token_ids == [hf(QUERY + "short")["input_ids"]]
