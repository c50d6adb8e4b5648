"""The pair tokenizer step (``steps.pair_tokenization``) against ``transformers``, same folder.

A cross-encoder pair must get exactly the IDs and segment ids of ``tokenizer(query,
document, truncation=..., max_length=...)`` (what ``CrossEncoder`` feeds its model); a
decoder reranker's, the Qwen3-Reranker model card's IDs. Bad pairs fail their own request.
"""

from __future__ import annotations

import pytest
from triton_embed.rerank_options import PairOptions
from triton_embed_server.models.reranker_spec import QWEN3_TEMPLATE, Family
from triton_embed_server.steps.errors import (
    EmptyTextError,
    InvalidUtf8Error,
    TextTooLargeError,
    TooLongError,
    TooMuchWorkError,
)
from triton_embed_server.steps.pair_tokenization import PairRequest, PairTokenizer
from triton_embed_server.steps.rerank_config import PairTokenizerConfig

from tests.model_factory import fortune_texts
from tests.reranker_factory import make_bert_cross_encoder, make_qwen3_reranker

MAX_LENGTH = 64


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory):
    return make_bert_cross_encoder(tmp_path_factory.mktemp("bert-ce") / "model")


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return make_qwen3_reranker(tmp_path_factory.mktemp("qwen-rr") / "model")


def config_for(folder, family="cross_encoder", max_length=MAX_LENGTH, **params):
    values = {"model_path": str(folder), "family": family, "max_length": str(max_length)}
    values.update({k: str(v) for k, v in params.items()})
    return PairTokenizerConfig.from_model_config(
        {"max_batch_size": 64, "parameters": {k: {"string_value": v} for k, v in values.items()}}
    )


def request(pairs, **options):
    return PairRequest(
        [q.encode() for q, _ in pairs], [d.encode() for _, d in pairs], PairOptions(**options)
    )


def long_pairs():
    short = fortune_texts(2, seed=2, max_chars=50)
    texts = fortune_texts(12, seed=3, max_chars=150)
    long_doc = " ".join(fortune_texts(20, seed=4, max_chars=150))
    long_query = " ".join(fortune_texts(6, seed=5, max_chars=150))
    return [
        (short[0], short[1]),  # fits
        (texts[2], long_doc),  # the document is cut
        (long_query, texts[3]),  # the query is cut by longest_first
        (long_query, long_doc),  # both
        ("Grüße aus Köln: naïve café, 東京 🚀", "ça va? — «oui», señor ∑x²"),
    ]


@pytest.mark.parametrize("strategy", ["longest_first", "only_second"])
def test_cross_encoder_ids_and_segments_equal_transformers(bert_folder, strategy):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(bert_folder)
    tokenizer = PairTokenizer(config_for(bert_folder))
    pairs = long_pairs()
    if strategy == "only_second":
        pairs = [p for p in pairs if len(reference(p[0])["input_ids"]) < MAX_LENGTH - 8]
    (got,) = tokenizer.tokenize_requests([request(pairs, truncation=strategy)])
    want = reference(
        [q for q, _ in pairs],
        [d for _, d in pairs],
        truncation=strategy,
        max_length=MAX_LENGTH,
        return_token_type_ids=True,
    )
    assert got.token_ids == want["input_ids"]
    for ids, start, types in zip(
        got.token_ids, got.segment_starts, want["token_type_ids"], strict=True
    ):
        assert types == [0] * start + [1] * (len(ids) - start)
        assert start > 0
    assert max(got.num_tokens) == MAX_LENGTH
    assert got.num_input_tokens[0] == got.num_tokens[0]  # the short pair is not cut
    assert max(got.num_input_tokens) > MAX_LENGTH


def test_max_document_tokens_cuts_the_document_first(bert_folder):
    from transformers import AutoTokenizer

    reference = AutoTokenizer.from_pretrained(bert_folder)
    tokenizer = PairTokenizer(config_for(bert_folder))
    query, document = long_pairs()[1]
    (got,) = tokenizer.tokenize_requests([request([(query, document)], max_document_tokens=5)])
    doc_ids = reference(document, add_special_tokens=False)["input_ids"][:5]
    query_ids = reference(query, add_special_tokens=False)["input_ids"]
    cls, sep = reference.cls_token_id, reference.sep_token_id
    assert got.token_ids == [[cls, *query_ids, sep, *doc_ids, sep]]
    assert got.segment_starts == [len(query_ids) + 2]


def test_truncation_none_refuses_an_over_long_pair_and_keeps_the_others(bert_folder):
    tokenizer = PairTokenizer(config_for(bert_folder))
    pairs = long_pairs()
    over = (pairs[0][0], " ".join(fortune_texts(5, seed=6, max_chars=150)))  # < 1,024 characters
    short, long = request(pairs[:1], truncation="none"), request([over], truncation="none")
    ok, refused = tokenizer.tokenize_requests([short, long])
    assert len(ok.token_ids) == 1
    assert isinstance(refused, TooLongError)
    assert str(refused).startswith(f"pair 0 has {refused_tokens(refused)} tokens; the model")
    assert "truncation=longest_first" in str(refused)


def test_truncation_none_refuses_text_over_the_character_cap_before_tokenizing(bert_folder):
    tokenizer = PairTokenizer(config_for(bert_folder))
    cap = tokenizer.config.max_chars
    (result,) = tokenizer.tokenize_requests([request([("q", "x " * cap)], truncation="none")])
    assert isinstance(result, TooLongError)
    assert str(result).startswith(
        f"the document of pair 0 has {2 * cap} characters, over the {cap}-character cap"
    )


def refused_tokens(error) -> int:
    return int(str(error).split(" has ")[1].split(" ")[0])


def test_only_second_with_a_query_over_the_budget_is_a_clear_error(bert_folder):
    tokenizer = PairTokenizer(config_for(bert_folder))
    query = " ".join(fortune_texts(10, seed=8, max_chars=150))
    (result,) = tokenizer.tokenize_requests([request([(query, "short")], truncation="only_second")])
    assert isinstance(result, TooLongError)
    assert "leaving no room for the document" in str(result)
    assert "truncation=longest_first" in str(result)


@pytest.mark.parametrize(
    ("query", "document", "error", "message"),
    [
        (b"q", b"", EmptyTextError, "the document of pair 0 is empty"),
        (b"   ", b"d", EmptyTextError, "the query of pair 0 is empty"),
        (
            b"q",
            b"\xff\xfe",
            InvalidUtf8Error,
            "the document of pair 0 is not valid UTF-8: byte 0xff",
        ),
    ],
)
def test_bad_pairs_fail_their_request_alone(bert_folder, query, document, error, message):
    tokenizer = PairTokenizer(config_for(bert_folder))
    good = request([("a query", "a document")])
    bad = PairRequest([query], [document])
    first, second, third = tokenizer.tokenize_requests([good, bad, good])
    assert isinstance(second, error) and str(second).startswith(message)
    assert first.token_ids == third.token_ids and len(first.token_ids) == 1


def test_invalid_utf8_can_be_replaced(bert_folder):
    tokenizer = PairTokenizer(config_for(bert_folder))
    (result,) = tokenizer.tokenize_requests(
        [PairRequest([b"q"], [b"ok \xff"], PairOptions(invalid_utf8="replace"))]
    )
    assert len(result.token_ids) == 1


def test_huge_payloads_are_refused_by_size_before_decoding(bert_folder):
    tokenizer = PairTokenizer(config_for(bert_folder))
    huge = b"x" * (tokenizer.max_payload_bytes + 1)
    (result,) = tokenizer.tokenize_requests([PairRequest([b"q"], [huge])])
    assert isinstance(result, TextTooLargeError)
    assert f"over the limit of {tokenizer.max_payload_bytes} bytes" in str(result)


def test_the_request_token_budget_is_checked_before_any_engine_work(bert_folder):
    tokenizer = PairTokenizer(config_for(bert_folder, max_request_tokens=100))
    pairs = [
        (q, d) for q, d in zip(fortune_texts(8, seed=1), fortune_texts(8, seed=2), strict=True)
    ]
    (result,) = tokenizer.tokenize_requests([request(pairs)])
    assert isinstance(result, TooMuchWorkError)
    assert "over the budget of 100 tokens per request" in str(result)


def test_spec_read_from_the_folder(bert_folder, qwen_folder):
    bert = config_for(bert_folder).spec
    assert (bert.family, bert.segments, bert.architecture) == (
        Family.CROSS_ENCODER, True, "BertForSequenceClassification"
    )  # fmt: skip
    assert bert.max_length == 128  # CrossEncoder(max_length=128).save
    qwen = config_for(qwen_folder, family="decoder").spec
    assert (qwen.family, qwen.segments, qwen.template) == (Family.DECODER, False, QWEN3_TEMPLATE)


def test_decoder_ids_equal_the_model_cards_recipe(qwen_folder):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(qwen_folder)
    t = QWEN3_TEMPLATE
    max_length = 160
    tokenizer = PairTokenizer(config_for(qwen_folder, family="decoder", max_length=max_length))
    pairs = long_pairs()
    (got,) = tokenizer.tokenize_requests([request(pairs, instruction="Find the joke")])
    prefix = tok.encode(t.prefix, add_special_tokens=False)
    suffix = tok.encode(t.suffix, add_special_tokens=False)
    room = max_length - len(prefix) - len(suffix)
    want = [
        prefix + tok.encode(t.pair(q, d, "Find the joke"), add_special_tokens=False)[:room] + suffix
        for q, d in pairs
    ]
    assert got.token_ids == want
    assert got.segment_starts == [0] * len(pairs)
    assert max(got.num_tokens) == max_length


def test_decoder_max_document_tokens_keeps_that_many_document_tokens(qwen_folder):
    from tokenizers import Tokenizer

    t = QWEN3_TEMPLATE
    tokenizer = PairTokenizer(config_for(qwen_folder, family="decoder", max_length=400))
    query, document = "what is it?", " ".join(fortune_texts(3, seed=9))
    (cut,) = tokenizer.tokenize_requests([request([(query, document)], max_document_tokens=4)])
    backend = Tokenizer.from_file(str(qwen_folder / "tokenizer.json"))
    enc = backend.encode(t.pair(query, document), add_special_tokens=False)
    start = t.document_offset(query)
    before = sum(1 for _, end in enc.offsets if end <= start)  # the template's tokens
    prefix = backend.encode(t.prefix, add_special_tokens=False).ids
    suffix = backend.encode(t.suffix, add_special_tokens=False).ids
    assert cut.token_ids == [prefix + enc.ids[: before + 4] + suffix]
    assert len(enc.ids) > before + 4
