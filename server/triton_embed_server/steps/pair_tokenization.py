"""The pair tokenizer step: (query, document) bytes -> token IDs of each pair, within the budget.

Where a reranker's pairs are encoded and truncated. Plain Python (no Triton imports);
:mod:`triton_embed_server.steps.adapters.pair_tokenizer` only adapts tensors.

A **cross-encoder** pair is encoded as ``transformers`` encodes ``tokenizer(query, document,
truncation=..., max_length=max_length)`` (what sentence-transformers' ``CrossEncoder``
calls): query and document are tokenized without special tokens, the document is first cut
to the request's ``max_document_tokens``, then the ``tokenizers`` library's own pair
truncation (``longest_first``: one token at a time from the longer sequence; ``only_second``:
from the document) and post-processor (the model's pair template, ``[CLS] q [SEP] d [SEP]``
or ``<s> q </s></s> d </s>``, with segment ids) run, so the IDs are the reference's. The
pair's segment start (its first token of segment 1, where the model reads segment ids) goes
with the IDs: the scorer hands it to vLLM, whose pre-tokenized path would drop segment ids.

A **decoder reranker** pair is its template's text (:class:`~triton_embed_server.models.
reranker_spec.DecoderTemplate`) tokenized whole, cut at the end to the room the template's
prefix and suffix leave (the Qwen3-Reranker model card's recipe), then
``prefix + pair + suffix``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from triton_embed.rerank_options import DEFAULT_PAIR_TRUNCATION, PairOptions, PairTruncation

from triton_embed_server.host.shm.sizing import UTF8_MAX
from triton_embed_server.steps.errors import (
    EmbedServingError,
    EmptyTextError,
    InvalidUtf8Error,
    TextTooLargeError,
    TooLongError,
    TooMuchWorkError,
)
from triton_embed_server.steps.rerank_config import PairTokenizerConfig
from triton_embed_server.steps.tokenization import plain_backend


@dataclass(frozen=True)
class PairRequest:
    """One inference request's pairs and options, as the pair tokenizer step receives them.

    Attributes:
        queries: raw UTF-8 payloads, the query of each pair.
        documents: raw UTF-8 payloads, the document of each pair (as many as ``queries``).
        options: the request's options (``None`` fields: the server's defaults).
    """

    queries: Sequence[bytes]
    documents: Sequence[bytes]
    options: PairOptions = field(default_factory=PairOptions)


@dataclass(frozen=True)
class PairTokenized:
    """Token IDs of one request's pairs.

    Attributes:
        token_ids: per pair, the IDs the model reads (special tokens or template included),
            at most ``max_length``.
        segment_starts: per pair, the index of its first segment-1 token where the model
            reads segment ids, else 0 (every token segment 0).
        num_input_tokens: per pair, its tokens before truncation.
    """

    token_ids: list[list[int]]
    segment_starts: list[int]
    num_input_tokens: list[int]

    @property
    def num_tokens(self) -> list[int]:
        """Per pair, the tokens the model reads."""
        return [len(ids) for ids in self.token_ids]


class PairTokenizer:
    """A Hugging Face fast tokenizer encoding query-document pairs with the product's rules.

    Built once per model instance (in ``initialize``), never per request.
    """

    def __init__(self, config: PairTokenizerConfig):
        self.config = config
        path = config.model_path / "tokenizer.json"
        self._plain = plain_backend(path)
        self.max_payload_bytes = UTF8_MAX * config.max_chars
        self._template = config.spec.template
        if self._template is not None:
            t = self._template
            self._prefix = self._plain.encode(t.prefix, add_special_tokens=False).ids
            self._suffix = self._plain.encode(t.suffix, add_special_tokens=False).ids
            self._room = config.max_length - len(self._prefix) - len(self._suffix)
            if self._room < 2:
                raise ValueError(
                    f"max_length={config.max_length} leaves no room for a pair next to the "
                    f"template's {len(self._prefix) + len(self._suffix)} tokens"
                )
            return
        self._truncating = {}
        for strategy in (PairTruncation.LONGEST_FIRST, PairTruncation.ONLY_SECOND):
            backend = plain_backend(path)
            backend.enable_truncation(config.max_length, strategy=strategy.value)
            self._truncating[strategy] = backend
        self._specials = self._plain.num_special_tokens_to_add(is_pair=True)

    def tokenize_requests(
        self, requests: Sequence[PairRequest]
    ) -> list[PairTokenized | EmbedServingError]:
        """Tokenize all pairs of one ``execute`` call in one batched tokenizer call.

        A bad pair fails its own request (the KServe v2 norm: the whole request); the
        other requests are still tokenized.

        Returns:
            Per request, in order, a :class:`PairTokenized` or the error for that request.
        """
        results: list[PairTokenized | EmbedServingError | None] = [None] * len(requests)
        texts: list[str] = []
        valid: list[tuple[int, int, list[tuple[str, str]]]] = []  # (request, first text, pairs)
        for r, req in enumerate(requests):
            try:
                pairs = self._decode(req)
            except EmbedServingError as exc:
                results[r] = exc
                continue
            valid.append((r, len(texts), pairs))
            if self._template is None:
                texts += [q for q, _ in pairs] + [d for _, d in pairs]
            else:
                instruction = req.options.instruction
                texts += [self._template.pair(q, d, instruction) for q, d in pairs]
        encodings = self._plain.encode_batch(texts, add_special_tokens=False) if texts else []
        for r, first, pairs in valid:
            options = requests[r].options
            try:
                if self._template is None:
                    n = len(pairs)
                    queries, documents = encodings[first : first + n], encodings[first + n :]
                    tokenized = self._cross_pairs(queries, documents[:n], options)
                else:
                    mine = encodings[first : first + len(pairs)]
                    tokenized = self._decoder_pairs(mine, pairs, options)
                results[r] = self._check_budget(tokenized)
            except EmbedServingError as exc:
                results[r] = exc
        return results  # type: ignore[return-value]

    def _decode(self, request: PairRequest) -> list[tuple[str, str]]:
        """The request's pairs as text, checked and capped.

        Raises:
            EmbedServingError: a query or document that is too large, not UTF-8 or empty
                (names the pair's index).
        """
        opts = request.options
        replace = opts.invalid_utf8 is not None and opts.invalid_utf8.value == "replace"
        truncation = opts.truncation or DEFAULT_PAIR_TRUNCATION
        return [
            (
                self._text(q, i, "query", replace, truncation),
                self._text(d, i, "document", replace, truncation),
            )
            for i, (q, d) in enumerate(zip(request.queries, request.documents, strict=True))
        ]

    def _text(
        self, payload: bytes, index: int, what: str, replace: bool, truncation: PairTruncation
    ) -> str:
        if len(payload) > self.max_payload_bytes:
            raise TextTooLargeError(
                f"the {what} of pair {index} is {len(payload)} bytes, over the limit of "
                f"{self.max_payload_bytes} bytes ({UTF8_MAX} bytes per character x max_chars="
                f"{self.config.max_chars}); send at most {self.config.max_chars} characters"
            )
        try:
            text = payload.decode("utf-8", errors="replace" if replace else "strict")
        except UnicodeDecodeError as exc:
            raise InvalidUtf8Error(
                f"the {what} of pair {index} is not valid UTF-8: byte "
                f"0x{payload[exc.start]:02x} at byte offset {exc.start} ({exc.reason}); send "
                "UTF-8 text, or set the request parameter invalid_utf8=replace"
            ) from None
        if not text.strip():
            raise EmptyTextError(
                f"the {what} of pair {index} is empty; send at least one non-blank character"
            )
        cap = self.config.max_chars
        if len(text) > cap:
            if truncation is PairTruncation.NONE:
                raise TooLongError(
                    f"the {what} of pair {index} has {len(text)} characters, over the "
                    f"{cap}-character cap applied before tokenization (the model reads "
                    f"{self.config.max_length} tokens per pair); shorten it or set the request "
                    "parameter truncation=longest_first or only_second"
                )
            text = text[:cap]
        return text

    def _cross_pairs(self, queries: list, documents: list, options: PairOptions) -> PairTokenized:
        truncation = options.truncation or DEFAULT_PAIR_TRUNCATION
        limit = self.config.max_length
        ids, starts, counts = [], [], []
        for i, (q, d) in enumerate(zip(queries, documents, strict=True)):
            counts.append(len(q.ids) + len(d.ids) + self._specials)
            if options.max_document_tokens is not None:
                d.truncate(options.max_document_tokens)
            if truncation is PairTruncation.NONE:
                pair = self._plain.post_process(q, d, add_special_tokens=True)
                if len(pair.ids) > limit:
                    raise TooLongError(
                        f"pair {i} has {len(pair.ids)} tokens; the model reads {limit} per pair; "
                        "shorten it or set the request parameter truncation=longest_first or "
                        "only_second"
                    )
            else:
                try:
                    pair = self._truncating[truncation].post_process(q, d, add_special_tokens=True)
                except Exception:  # tokenizers: "Second sequence not long enough to be truncated"
                    raise TooLongError(
                        f"pair {i}: its query has {len(q.ids)} tokens, leaving no room for the "
                        f"document in the model's {limit} tokens per pair with "
                        "truncation=only_second; shorten the query or set "
                        "truncation=longest_first"
                    ) from None
            ids.append(pair.ids)
            starts.append(_segment_start(pair.type_ids) if self.config.spec.segments else 0)
        return PairTokenized(ids, starts, counts)

    def _decoder_pairs(
        self, encodings: list, pairs: list[tuple[str, str]], options: PairOptions
    ) -> PairTokenized:
        truncation = options.truncation or DEFAULT_PAIR_TRUNCATION
        template = self._template
        assert template is not None  # noqa: S101 - only called for the decoder family
        ids, counts = [], []
        special = len(self._prefix) + len(self._suffix)
        for i, (enc, (query, _)) in enumerate(zip(encodings, pairs, strict=True)):
            body = enc.ids
            counts.append(len(body) + special)
            if options.max_document_tokens is not None:
                start = template.document_offset(query, options.instruction)
                body = _cut_document(body, enc.offsets, start, options.max_document_tokens)
            if len(body) > self._room:
                if truncation is PairTruncation.NONE:
                    raise TooLongError(
                        f"pair {i} has {len(body) + special} tokens with the model's prompt "
                        f"template; the model reads {self.config.max_length} per pair; shorten "
                        "it or set the request parameter truncation=longest_first or only_second"
                    )
                body = body[: self._room]
            ids.append(self._prefix + list(body) + self._suffix)
        return PairTokenized(ids, [0] * len(ids), counts)

    def _check_budget(self, tokenized: PairTokenized) -> PairTokenized:
        """``tokenized`` if its tokens fit the request's token budget, before any engine work.

        Raises:
            TooMuchWorkError: names the count, the budget and what to do.
        """
        budget = self.config.max_request_tokens
        total = sum(len(ids) for ids in tokenized.token_ids)
        if budget and total > budget:
            raise TooMuchWorkError(
                f"the request's {len(tokenized.token_ids)} pairs come to {total} tokens, over "
                f"the budget of {budget} tokens per request (max_request_tokens; at most "
                f"{self.config.max_length} tokens per pair); send fewer or shorter pairs per "
                "request, or max_document_tokens"
            )
        return tokenized


def _segment_start(type_ids: Sequence[int]) -> int:
    """Index of the first segment-1 token (0 when there is none)."""
    for i, t in enumerate(type_ids):
        if t == 1:
            return i
    return 0


def _cut_document(
    ids: Sequence[int], offsets: Sequence[tuple[int, int]], start: int, keep: int
) -> list[int]:
    """``ids`` with at most ``keep`` tokens ending after character ``start`` (the document's).

    A token that spans the document's first character (byte-level BPE joins the space in
    front of a word to it) counts as the document's.
    """
    out: list[int] = []
    kept = 0
    for token, (_, end) in zip(ids, offsets, strict=True):
        if end > start:
            if kept == keep:
                continue  # the template's text after the document has no tokens past it
            kept += 1
        out.append(token)
    return out
