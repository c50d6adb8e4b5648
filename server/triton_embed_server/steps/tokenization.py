"""The tokenizer step: bytes -> validated text -> token IDs within the token budget.

Where truncation and prompts are decided. Plain Python (no Triton imports) so that unit
tests and the benchmarks run it directly; :mod:`triton_embed_server.steps.adapters.tokenizer` only
adapts tensors.

Prompts: a request's ``input_type`` (else the model's ``default_prompt_name``) picks a prompt
of the model's ``config_sentence_transformers.json``; it is put in front of the text and the
two are tokenized as one string, as sentence-transformers does, so the IDs are the ones it
feeds the model (the tokenizer's own post-processor adds the special tokens: ``[CLS]``/
``[SEP]`` for BERT, the end-of-text token a last-token-pooled decoder pools on).

Truncation follows Hugging Face's rule for a single sequence: the text's own tokens are cut
to ``max_length - num_special_tokens`` and the special tokens are kept, so a truncated text
has exactly ``max_length`` tokens, the same IDs as ``tokenizer(prompt + text,
truncation=True, max_length=max_length)`` (``END``). ``START`` keeps the end of the text;
the prompt's tokens stay in front (with no prompt: ``truncation_side="left"``). ``CHUNK``
cuts the text into consecutive windows, each with the prompt and the special tokens, that
each fit the budget; the embedder step embeds them all and returns their token-weighted
mean (:mod:`triton_embed_server.steps.vectors`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triton_embed.hybrid_options import HybridOptions
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import DEFAULT_INVALID_UTF8, InvalidUtf8, RequestOptions, Truncation
from triton_embed.sparse_options import SparseOptions

from triton_embed_server.host.shm.sizing import UTF8_MAX
from triton_embed_server.models.model_spec import read_prompt_spec
from triton_embed_server.models.spec import PromptSpec
from triton_embed_server.steps.batching import flatten, split
from triton_embed_server.steps.config import TokenizerConfig
from triton_embed_server.steps.errors import (
    EmbedServingError,
    EmptyTextError,
    InvalidArgumentError,
    InvalidUtf8Error,
    TextTooLargeError,
    TooLongError,
    TooMuchWorkError,
)

# Applied only to texts longer than max_chars (see TextTokenizer._prepare).
_LONG_WHITESPACE = re.compile(r"\s{64,}")


def parse_request_options(parameters: Mapping[str, Any], kind: str = "embedding") -> RequestOptions:
    """Read a request's options from its KServe v2 request ``parameters``.

    The names, allowed values and defaults are those of :mod:`triton_embed.options` for an
    embedding model, of :mod:`triton_embed.sparse_options` for a sparse one (whose
    ``top_k`` and ``threshold`` are checked here too, for the engine step to apply), of
    :mod:`triton_embed.multivector_options` for a multi-vector one (``input_type`` ``query``
    or ``document``).

    Args:
        parameters: the request's parameters, e.g. ``{"truncation": "NONE"}``. Keys that
            Triton's protocols reserve (``sequence_id``, ``priority``, ...) are ignored.
        kind: the model kind of the step (``TokenizerConfig.kind``): ``embedding``,
            ``sparse``, ``multivector`` or ``hybrid``.

    Returns:
        The options the request set; the others are ``None`` (server default).

    Raises:
        InvalidArgumentError: an option has a value outside its allowed set (the message
            names the parameter, the value and the allowed values).
    """
    try:
        if kind == "sparse":
            return SparseOptions.from_parameters(parameters).text_options()
        if kind == "multivector":
            return MultiVectorOptions.from_parameters(parameters).text_options()
        if kind == "hybrid":
            return HybridOptions.from_parameters(parameters).text_options()
        return RequestOptions.from_parameters(parameters)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from None


@dataclass(frozen=True)
class TextRequest:
    """One inference request's texts and options, as the tokenizer step receives them.

    Attributes:
        texts: raw UTF-8 payloads, one per text, exactly as sent (NULs and control
            characters included).
        options: the request's options; an option left ``None`` takes the server default
            (``truncation`` and ``allow_empty`` from :class:`TokenizerConfig`,
            ``invalid_utf8`` from :data:`triton_embed.options.DEFAULT_INVALID_UTF8`).
    """

    texts: Sequence[bytes]
    options: RequestOptions = field(default_factory=RequestOptions)


#: One window of a text as the embedder pools it: ``(tokens, skip, weight)``: its length in
#: token IDs, how many of its leading tokens pooling leaves out (the prompt, when the model's
#: ``include_prompt`` is false), and its weight in the text's mean (its text tokens).
Window = tuple[int, int, int]


@dataclass(frozen=True)
class Tokenized:
    """Token IDs of one request's texts.

    Attributes:
        token_ids: per text, the IDs fed to the model (special tokens and prompt included):
            one window of at most ``max_length`` IDs, or with ``truncation=CHUNK`` several
            windows one after the other.
        windows: per text, its windows (:data:`Window`), in order; their lengths sum to
            ``len(token_ids[i])``.
        num_input_tokens: per text, tokens of the text as sent (after the character cap),
            special tokens and prompt included.
    """

    token_ids: list[list[int]]
    windows: list[list[Window]]
    num_input_tokens: list[int]

    @property
    def num_tokens(self) -> list[int]:
        """Per text, the tokens the model reads (``len(token_ids[i])``)."""
        return [len(ids) for ids in self.token_ids]


def decode_text(payload: bytes, index: int, replace: bool = False) -> str:
    """Decode one text's bytes as UTF-8; NULs and control characters are kept as sent.

    Args:
        payload: the text's bytes.
        index: the text's index in its request (for the message).
        replace: replace each invalid sequence with U+FFFD instead of raising.

    Raises:
        InvalidUtf8Error: names the text's index and the offending byte offset.
    """
    try:
        return payload.decode("utf-8", errors="replace" if replace else "strict")
    except UnicodeDecodeError as exc:
        raise InvalidUtf8Error(
            f"text {index} is not valid UTF-8: byte 0x{payload[exc.start]:02x} at byte offset "
            f"{exc.start} ({exc.reason}); send UTF-8 text, or set the request parameter "
            "invalid_utf8=replace to replace invalid bytes with U+FFFD"
        ) from None


def max_text_bytes(config: TokenizerConfig) -> int:
    """The most UTF-8 bytes one text may have: ``4 x max_chars x max_chunks``.

    The longest text any request may send is ``max_chars * max_chunks`` characters (the
    character cap of ``truncation=CHUNK``; ``END``/``START`` cut to ``max_chars``), and a
    character takes at most 4 bytes in UTF-8 (RFC 3629). A text over this size can only be
    cut or refused, and every byte of it is copied into the step's shared-memory region
    first, which never shrinks (:mod:`triton_embed_server.host.shm.sizing`).
    """
    return UTF8_MAX * config.max_chars * config.max_chunks


def check_text_size(payload: bytes, index: int, config: TokenizerConfig, limit: int) -> None:
    """Refuse a text of more than ``limit`` bytes, from its size alone (O(1), nothing decoded).

    Args:
        payload: the text's bytes.
        index: the text's index in its request (for the message).
        config: the step's config (for the message's arithmetic).
        limit: :func:`max_text_bytes` of ``config``.

    Raises:
        TextTooLargeError: names the text, its size, the limit and its arithmetic, and what
            to do; the text itself is not quoted.
    """
    if len(payload) > limit:
        why = (
            f"max_chunks={config.max_chunks}: the longest text truncation=CHUNK accepts"
            if offers_chunk(config)
            else f"max_chunks={config.max_chunks}: the longest text this model's step reads"
        )
        raise TextTooLargeError(
            f"text {index} is {len(payload)} bytes, over the limit of {limit} bytes per text "
            f"({UTF8_MAX} bytes per character x max_chars={config.max_chars} x {why}); "
            "split it into texts under the limit, or send only the part to embed"
        )


def offers_chunk(config: TokenizerConfig) -> bool:
    """Whether the step's kind offers ``truncation=CHUNK`` (sparse, multi-vector, hybrid: no)."""
    return config.kind not in ("sparse", "multivector", "hybrid")


class TextTokenizer:
    """A Hugging Face fast tokenizer with the product's truncation and validation rules.

    Built once per model instance (in ``initialize``), never per request.
    """

    def __init__(self, config: TokenizerConfig):
        self.config = config
        self._backend = plain_backend(config.model_path / "tokenizer.json")
        self.vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
        self.prefix, self.suffix = _special_tokens_around(self._backend)
        self.body_budget = config.max_length - len(self.prefix) - len(self.suffix)
        # A multi-vector model's input_type picks its markers, not a prompt (it has none).
        self.multivector = config.multivector
        self.prompting = (
            PromptSpec() if config.kind == "multivector" else read_prompt_spec(config.model_path)
        )
        self._pool_skip: dict[str, int] = {}
        self.max_text_bytes = max_text_bytes(config)
        if self.body_budget < 1:
            raise ValueError(
                f"max_length={config.max_length} leaves no room for text next to "
                f"{len(self.prefix) + len(self.suffix)} special tokens"
            )

    @property
    def backend(self):
        """The ``tokenizers.Tokenizer`` it tokenizes with (the decoder decodes with it too)."""
        return self._backend

    def tokenize_requests(
        self, requests: Sequence[TextRequest]
    ) -> list[Tokenized | EmbedServingError]:
        """Tokenize all requests of one ``execute`` call in one batched tokenizer call.

        Each text is tokenized with its request's prompt in front (``input_type``, else the
        model's default prompt), as sentence-transformers does: ``prompt + text`` as one
        string. A bad text fails its own request (the KServe v2 norm: the whole request,
        since the response has one status); the other requests are still tokenized.

        Returns:
            Per request, in order, a :class:`Tokenized` or the error for that request.
        """
        results: list[Tokenized | EmbedServingError | None] = [None] * len(requests)
        valid: list[tuple[int, Truncation, str, str]] = []
        prepared: list[list[str]] = []
        for r, req in enumerate(requests):
            opts = req.options
            truncation = opts.truncation or self.config.truncation
            allow_empty = self.config.allow_empty if opts.allow_empty is None else opts.allow_empty
            replace = (opts.invalid_utf8 or DEFAULT_INVALID_UTF8) is InvalidUtf8.REPLACE
            try:
                prompt = "" if self.config.kind == "multivector" else self._prompt(opts.input_type)
                prepared.append(
                    [
                        prompt + self._prepare(p, i, truncation, allow_empty, replace)
                        for i, p in enumerate(req.texts)
                    ]
                )
            except EmbedServingError as exc:
                results[r] = exc
                continue
            valid.append((r, truncation, prompt, opts.input_type or "document"))
        flat, counts = flatten(prepared)
        encodings = self._backend.encode_batch(flat, add_special_tokens=False)
        for (r, truncation, prompt, side), request_encodings in zip(
            valid, split(encodings, counts), strict=True
        ):
            try:
                if self.multivector is not None:
                    tokenized = self._finish_marked(request_encodings, truncation, side)
                else:
                    tokenized = self._finish(request_encodings, truncation, prompt)
                results[r] = self._check_budget(tokenized)
            except EmbedServingError as exc:
                results[r] = exc
        return results  # type: ignore[return-value]

    def _check_budget(self, tokenized: Tokenized) -> Tokenized:
        """``tokenized`` if its tokens fit the request's token budget, before any engine work.

        Raises:
            TooMuchWorkError: more tokens than ``max_request_tokens`` (names the count, the
                budget and its arithmetic).
        """
        budget = self.config.max_request_tokens
        if not budget:
            return tokenized
        total = sum(len(ids) for ids in tokenized.token_ids)
        if total > budget:
            c = self.config
            raise TooMuchWorkError(
                f"the request's {len(tokenized.token_ids)} texts come to {total} tokens, over "
                f"the budget of {budget} tokens per request (the tokenizer's "
                f"max_request_tokens; at most {c.max_length} tokens per text, {c.max_chunks} "
                "windows with truncation=CHUNK); send fewer or shorter texts per request, or "
                "truncation=END"
            )
        return tokenized

    def _prompt(self, input_type: str | None) -> str:
        try:
            return self.prompting.prompt(input_type)
        except ValueError as exc:
            raise InvalidArgumentError(str(exc)) from None

    def pool_skip(self, prompt: str) -> int:
        """Leading tokens that pooling leaves out for inputs with ``prompt`` in front.

        Zero unless the model's ``include_prompt`` is false. Then it is what
        sentence-transformers computes (``Transformer._get_prompt_length``): the length of
        the prompt tokenized alone with special tokens, less a trailing special token.
        """
        if self.prompting.include_prompt or not prompt:
            return 0
        if prompt not in self._pool_skip:
            enc = self._backend.encode(prompt, add_special_tokens=True)
            self._pool_skip[prompt] = len(enc.ids) - (1 if enc.special_tokens_mask[-1] else 0)
        return self._pool_skip[prompt]

    def _prepare(
        self, payload: bytes, index: int, truncation: Truncation, allow_empty: bool, replace: bool
    ) -> str:
        check_text_size(payload, index, self.config, self.max_text_bytes)
        text = decode_text(payload, index, replace)
        if not text and not allow_empty:
            raise EmptyTextError(
                f"text {index} is empty; send at least one character, or set the request "
                "parameter allow_empty=true to embed it"
            )
        chunked = truncation is Truncation.CHUNK
        cap = self.config.max_chars * (self.config.max_chunks if chunked else 1)
        if len(text) > cap:
            # Long whitespace runs carry no tokens for WordPiece/BPE pre-tokenizers; collapse
            # them so that a text padded with whitespace keeps its words under the cap.
            text = _LONG_WHITESPACE.sub(" ", text)
        if len(text) > cap:
            if chunked:
                raise TooLongError(
                    f"text {index} has {len(text)} characters, over the {cap}-character cap of "
                    f"truncation=CHUNK ({self.config.max_chunks} windows of "
                    f"{self.config.max_length} tokens); split it, or set truncation=END or START"
                )
            if truncation is Truncation.NONE:
                raise TooLongError(
                    f"text {index} has {len(text)} characters, over the {cap}-character cap "
                    f"applied before tokenization (the model accepts {self.config.max_length} "
                    "tokens); shorten it or set the request parameter truncation=END, START "
                    "or CHUNK"
                )
            text = text[:cap] if truncation is Truncation.END else text[-cap:]
        return text

    def _finish(self, encodings: list, truncation: Truncation, prompt: str) -> Tokenized:
        special = len(self.prefix) + len(self.suffix)
        skip = self.pool_skip(prompt)
        ids: list[list[int]] = []
        windows: list[list[Window]] = []
        counts: list[int] = []
        for i, enc in enumerate(encodings):
            body = enc.ids
            counts.append(len(body) + special)
            head = _prompt_token_count(enc, len(prompt)) if prompt else 0
            pieces = self._windows(i, body, head, truncation)
            text_ids: list[int] = []
            text_windows: list[Window] = []
            for piece in pieces:
                text_ids += self.prefix
                text_ids += piece
                text_ids += self.suffix
                text_windows.append((len(piece) + special, skip, len(piece) - head))
            ids.append(text_ids)
            windows.append(text_windows)
        return Tokenized(ids, windows, counts)

    def _finish_marked(self, encodings: list, truncation: Truncation, side: str) -> Tokenized:
        """A multi-vector model's IDs: ``prefix marker text suffix``, a query filled with masks.

        The marker (ColBERT's ``[Q]`` or ``[D]``) follows the tokenizer's leading special
        tokens (``[CLS]``), where both references put it (Stanford's tokenizers overwrite
        position 1, PyLate inserts its prefix token there); the text is cut to the side's
        length (a query's ``query_length``, a document's ``max_length``, marker and special
        tokens included); a query of a model with augmentation is then filled to
        ``query_length`` with the mask token (Stanford's ``QueryTokenizer`` pads with
        ``[MASK]``, PyLate pads with the mask token as its pad token).
        """
        spec = self.multivector
        assert spec is not None  # noqa: S101 - only called for a multi-vector tokenizer
        marker = spec.marker_id(side)
        head = self.prefix + ([marker] if marker >= 0 else [])
        limit = spec.length(side, self.config.max_length)
        budget = limit - len(head) - len(self.suffix)
        fill = limit if side == "query" and spec.mask_id >= 0 else 0
        ids: list[list[int]] = []
        windows: list[list[Window]] = []
        counts: list[int] = []
        for i, enc in enumerate(encodings):
            body = enc.ids
            counts.append(len(body) + len(head) + len(self.suffix))
            piece = self._windows(i, body, 0, truncation, budget, limit)[0]
            text_ids = head + piece + self.suffix
            text_ids += [spec.mask_id] * (fill - len(text_ids))
            ids.append(text_ids)
            windows.append([(len(text_ids), 0, len(piece))])
        return Tokenized(ids, windows, counts)

    def _windows(
        self,
        index: int,
        body: list[int],
        head: int,
        truncation: Truncation,
        budget: int | None = None,
        limit: int | None = None,
    ) -> list[list[int]]:
        """The body tokens of each window of one text (without special tokens).

        ``head`` leading tokens are the prompt's: ``START`` and ``CHUNK`` keep them in front
        of every window and cut only the text. ``budget``: the text tokens of one window
        (default :attr:`body_budget`); ``limit``: the tokens the messages name (default
        ``max_length``).
        """
        budget = self.body_budget if budget is None else budget
        limit = self.config.max_length if limit is None else limit
        if len(body) <= budget:
            return [body]
        n = len(body) + (limit - budget)
        if truncation is Truncation.NONE:
            raise TooLongError(
                f"text {index} has {n} tokens; the model accepts {limit}; "
                "shorten it or set the request parameter truncation="
                + ("END, START or CHUNK" if offers_chunk(self.config) else "END or START")
            )
        if truncation is Truncation.END:
            return [body[:budget]]
        room = budget - head
        if room < 1:
            raise TooLongError(
                f"text {index}: its prompt takes {head} of the {budget} tokens left next to "
                f"the special tokens, leaving no room for text with truncation={truncation.value}; "
                "use a shorter prompt or truncation=END"
            )
        prompt, text = body[:head], body[head:]
        if truncation is Truncation.START:
            return [prompt + text[-room:]]
        count = -(-len(text) // room)
        if count > self.config.max_chunks:
            raise TooLongError(
                f"text {index} has {n} tokens: {count} windows of {self.config.max_length} "
                f"tokens with truncation=CHUNK, over the limit of {self.config.max_chunks} "
                "(the tokenizer's max_chunks); split it, or set truncation=END or START"
            )
        return [prompt + text[k : k + room] for k in range(0, len(text), room)]


def _prompt_token_count(encoding, prompt_chars: int) -> int:
    """Leading tokens of ``prompt + text`` that start inside the prompt's characters."""
    count = 0
    for start, _ in encoding.offsets:
        if start >= prompt_chars:
            break
        count += 1
    return count


def plain_backend(path: Path):
    """The ``tokenizers.Tokenizer`` of ``path`` (a ``tokenizer.json``), truncation and padding off.

    Read with the Rust ``tokenizers`` library alone, as Text Embeddings Inference does: no
    ``transformers`` (whose import takes torch and ~9 s per stub on 2 cores).
    """
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(str(path))
    plain.no_truncation()
    plain.no_padding()
    return plain


def _special_tokens_around(backend) -> tuple[list[int], list[int]]:
    """The special-token IDs the post-processor puts before and after a single sequence.

    Found by encoding a one-word probe and reading its special-tokens mask, which works for
    BERT (``[CLS] x [SEP]``), RoBERTa/XLM-R (``<s> x </s>``) and models with none.
    """
    enc = backend.encode("hello", add_special_tokens=True)
    mask = enc.special_tokens_mask
    content = [i for i, m in enumerate(mask) if not m]
    if not content:
        raise ValueError("the tokenizer's post-processor leaves no content tokens for a probe text")
    first, last = content[0], content[-1]
    return list(enc.ids[:first]), list(enc.ids[last + 1 :])
