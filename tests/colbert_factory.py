"""Tiny seeded ColBERT models in both layouts, and their reference token IDs and vectors.

No ColBERT checkpoint ships in a package, and neither Stanford's ``colbert-ai`` nor PyLate is
installed here, so the tests write both layouts with ``transformers``, ``safetensors`` and
plain JSON, the files those libraries save, and compute the reference as the libraries do:

* :func:`make_stanford_colbert`: a Stanford ``HF_ColBERT`` checkpoint: ``config.json`` with
  ``architectures: ["HF_ColBERT"]``, ``model.safetensors`` holding the BERT weights under
  ``bert.`` and the projection ``linear.weight`` ``[dim, hidden]``, ``artifact.metadata``
  (the ``ColBERTConfig``: ``query_maxlen``, ``doc_maxlen``, ``query_token_id`` ``[unused0]``,
  ``doc_token_id`` ``[unused1]``, ``attend_to_mask_tokens``), the markers in the vocabulary;
* :func:`make_pylate_colbert`: a PyLate folder: the ``BertModel`` saved by ``transformers``
  with PyLate's added prefix tokens ``[Q] `` / ``[D] `` (embeddings resized), ``modules.json``
  (``Transformer`` + ``pylate.models.Dense.Dense`` at ``1_Dense``), ``1_Dense/config.json``
  and ``1_Dense/model.safetensors`` (``linear.weight``), ``config_sentence_transformers.json``
  (``query_prefix``, ``document_prefix``, ``query_length``, ``document_length``,
  ``do_query_expansion``, ``attend_to_expansion_tokens``);
* :func:`reference_inputs`: the token IDs and the attention mask each reference's tokenizer
  makes (Stanford's ``QueryTokenizer`` / ``DocTokenizer.tensorize``, since 2024: the text
  tokenized to ``length - 1`` tokens, the marker inserted at position 1; before, ``". " +
  text`` with position 1 overwritten, the same IDs; PyLate's ``tokenize``: the same with its
  prefix token); a query padded to its length, the padding turned into ``[MASK]`` (Stanford
  replaces the pad IDs; PyLate pads with the mask token as its pad token), the attention mask
  left at 0 on the padding unless the folder says to attend to it
  (``attend_to_mask_tokens``, ``attend_to_expansion_tokens``); :func:`reference_ids`: the IDs;
* :func:`reference_vectors`: ``transformers``' last hidden states of those IDs (with the
  reference's attention mask when given, else every position attended), times the
  projection, L2-normalized per token, every row kept (a ``[MASK]`` row too); without a
  projection, the hidden states as they are (TEI's ``/embed_all``); a document's rows of
  :func:`reference_skiplist` tokens left out;
* :func:`reference_skiplist`: the punctuation token IDs each reference drops from a document
  (Stanford's ``ColBERT.skiplist`` when ``mask_punctuation``: each ``string.punctuation``
  character's first ID of ``encode(char, add_special_tokens=False)``; PyLate's
  ``skiplist_words`` through ``convert_tokens_to_ids``).

Shapes: hidden 128, 2 heads of 64, 2 layers (:mod:`tests.model_factory`), ColBERT dim 32.
"""

from __future__ import annotations

import json
import string
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from tests.model_factory import (
    HIDDEN_SIZE,
    INIT_STD,
    INTERMEDIATE_SIZE,
    MAX_POSITIONS,
    NUM_HEADS,
    NUM_LAYERS,
    _save_tokenizer,
)

#: Values per ColBERT token vector.
COLBERT_DIM = 32
QUERY_LENGTH = 16
DOCUMENT_LENGTH = 48
STANFORD_MARKERS = ("[unused0]", "[unused1]")
PYLATE_PREFIXES = ("[Q] ", "[D] ")


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _bert(path: Path, seed: int, added: Sequence[str], pooler: bool):
    """A seeded ``BertModel`` and its tokenizer (with ``added`` tokens) saved at ``path``."""
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from tests.model_factory import BERT_SPECIAL_TOKENS

    path.mkdir(parents=True, exist_ok=True)
    ids = _save_tokenizer(path, "wordpiece")
    backend = Tokenizer.from_file(str(path / "tokenizer.json"))
    backend.add_tokens([AddedToken(t, normalized=False) for t in added])
    BertTokenizerFast(
        tokenizer_object=backend, model_max_length=MAX_POSITIONS, **BERT_SPECIAL_TOKENS
    ).save_pretrained(path)
    ids["vocab_size"] = backend.get_vocab_size(with_added_tokens=True)
    config = BertConfig(
        hidden_size=HIDDEN_SIZE,
        num_attention_heads=NUM_HEADS,
        num_hidden_layers=NUM_LAYERS,
        intermediate_size=INTERMEDIATE_SIZE,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_STD,
        dtype="float32",
        **ids,
    )
    torch.manual_seed(seed)
    model = BertModel(config, add_pooling_layer=pooler)
    with torch.no_grad():
        model.embeddings.token_type_embeddings.weight.mul_(0.1)
    projection = torch.randn(COLBERT_DIM, HIDDEN_SIZE) * HIDDEN_SIZE**-0.5
    return model, config, projection


def make_stanford_colbert(
    path: str | Path,
    *,
    seed: int = 0,
    attend_to_mask_tokens: bool = True,
    mask_punctuation: bool | None = None,
) -> Path:
    """A Stanford ``HF_ColBERT`` checkpoint (module docstring); ``mask_punctuation`` stated
    in ``artifact.metadata`` unless ``None`` (``ColBERTConfig``'s default, true)."""
    from safetensors.torch import save_file

    path = Path(path)
    model, config, projection = _bert(path, seed, STANFORD_MARKERS, pooler=False)
    weights = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    weights["linear.weight"] = projection.contiguous()
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.architectures = ["HF_ColBERT"]
    config.save_pretrained(path)
    _write_json(
        path / "artifact.metadata",
        {
            "query_maxlen": QUERY_LENGTH,
            "doc_maxlen": DOCUMENT_LENGTH,
            "query_token_id": STANFORD_MARKERS[0],
            "doc_token_id": STANFORD_MARKERS[1],
            "query_token": "[Q]",
            "doc_token": "[D]",
            "dim": COLBERT_DIM,
            "attend_to_mask_tokens": attend_to_mask_tokens,
            "similarity": "cosine",
            **({} if mask_punctuation is None else {"mask_punctuation": mask_punctuation}),
        },
    )
    return path


def make_pylate_colbert(
    path: str | Path, *, seed: int = 0, attend_to_expansion_tokens: bool = True
) -> Path:
    """A PyLate ColBERT folder (module docstring)."""
    from safetensors.torch import save_file

    path = Path(path)
    model, config, projection = _bert(path, seed, PYLATE_PREFIXES, pooler=True)
    model.save_pretrained(path)
    dense = path / "1_Dense"
    dense.mkdir(exist_ok=True)
    save_file({"linear.weight": projection.contiguous()}, str(dense / "model.safetensors"))
    _write_json(
        dense / "config.json",
        {
            "in_features": HIDDEN_SIZE,
            "out_features": COLBERT_DIM,
            "bias": False,
            "activation_function": "torch.nn.modules.linear.Identity",
            "use_residual": False,
        },
    )
    _write_json(
        path / "modules.json",
        [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Dense", "type": "pylate.models.Dense.Dense"},
        ],
    )
    _write_json(
        path / "sentence_bert_config.json",
        {"max_seq_length": DOCUMENT_LENGTH - 1, "do_lower_case": False},
    )
    _write_json(
        path / "config_sentence_transformers.json",
        {
            "query_prefix": PYLATE_PREFIXES[0],
            "document_prefix": PYLATE_PREFIXES[1],
            "query_length": QUERY_LENGTH,
            "document_length": DOCUMENT_LENGTH,
            "attend_to_expansion_tokens": attend_to_expansion_tokens,
            "do_query_expansion": True,
            "skiplist_words": list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"),
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "MaxSim",
        },
    )
    return path


def reference_ids(path: Path, texts: Sequence[str], side: str) -> list[list[int]]:
    """The token IDs the folder's reference library makes of ``texts`` (module docstring).

    ``side``: ``query`` or ``document``. A folder without ColBERT files: the tokenizer's own
    IDs (``[CLS] text [SEP]``), cut to ``sentence_bert_config.json``'s ``max_seq_length``.
    """
    return reference_inputs(path, texts, side)[0]


def reference_inputs(
    path: Path, texts: Sequence[str], side: str
) -> tuple[list[list[int]], list[list[int]]]:
    """The token IDs and the attention mask the folder's reference makes (module docstring).

    Each text is tokenized alone, as a batch of one (a document is not padded).
    """
    from transformers import AutoTokenizer

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    query = side == "query"
    st = path / "config_sentence_transformers.json"
    if (path / "artifact.metadata").is_file():  # Stanford's QueryTokenizer / DocTokenizer
        meta = json.loads((path / "artifact.metadata").read_text())
        length = meta["query_maxlen"] if query else meta["doc_maxlen"]
        marker = meta["query_token_id" if query else "doc_token_id"]
        expand, attend = query, meta.get("attend_to_mask_tokens", False)
    elif st.is_file() and "query_prefix" in json.loads(st.read_text()):  # PyLate's tokenize
        conf = json.loads(st.read_text())
        length = conf["query_length"] if query else conf["document_length"]
        marker = conf["query_prefix" if query else "document_prefix"]
        expand = query and conf["do_query_expansion"]
        attend = conf["attend_to_expansion_tokens"]
        tok.pad_token = tok.mask_token  # PyLate pads with the mask token
    else:
        max_length = json.loads((path / "sentence_bert_config.json").read_text())["max_seq_length"]
        ids = [tok(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
        return ids, [[1] * len(x) for x in ids]
    marker_id = tok.convert_tokens_to_ids(marker)
    padding = "max_length" if expand else False
    all_ids, all_masks = [], []
    for text in texts:
        enc = tok(text, truncation=True, max_length=length - 1, padding=padding)
        ids = enc["input_ids"][:1] + [marker_id] + enc["input_ids"][1:]
        mask = enc["attention_mask"][:1] + [1] + enc["attention_mask"][1:]
        if expand:
            ids = [tok.mask_token_id if t == tok.pad_token_id else t for t in ids]
            mask = [1] * len(mask) if attend else mask
        all_ids.append(ids)
        all_masks.append(mask)
    return all_ids, all_masks


def reference_skiplist(path: Path) -> set[int]:
    """The token IDs whose rows the folder's reference drops from a document (docstring)."""
    from transformers import AutoTokenizer

    path = Path(path)
    tok = AutoTokenizer.from_pretrained(str(path))
    if (path / "artifact.metadata").is_file():  # Stanford's ColBERT.__init__
        meta = json.loads((path / "artifact.metadata").read_text())
        if not meta.get("mask_punctuation", True):
            return set()
        return {tok.encode(c, add_special_tokens=False)[0] for c in string.punctuation}
    st = path / "config_sentence_transformers.json"
    if st.is_file() and "query_prefix" in json.loads(st.read_text()):  # PyLate's ColBERT
        words = json.loads(st.read_text()).get("skiplist_words", list(string.punctuation))
        return {tok.convert_tokens_to_ids(w) for w in words}
    return set()


def reference_vectors(
    path: Path,
    token_ids: Sequence[Sequence[int]],
    sides: Sequence[str] | None = None,
    masks: Sequence[Sequence[int]] | None = None,
) -> list[np.ndarray]:
    """Per text float32 ``[rows, dim]``: the reference vectors of those IDs.

    ``transformers``' last hidden states (with each text's attention mask from ``masks``,
    :func:`reference_inputs`; ``None``: every token attended), projected by the ColBERT
    projection and L2-normalized per token, one row per token; a folder without one: the
    hidden states. A text whose ``sides`` entry is ``document`` (``None``: none is) loses the
    rows of its :func:`reference_skiplist` tokens, as the reference's document encoder drops
    them.
    """
    import torch
    from safetensors.torch import load_file
    from transformers import BertConfig, BertModel

    path = Path(path)
    config = BertConfig.from_pretrained(str(path))
    projection = None
    if (path / "artifact.metadata").is_file():
        weights = load_file(str(path / "model.safetensors"))
        projection = weights.pop("linear.weight")
        model = BertModel(config, add_pooling_layer=False)
        model.load_state_dict({k.removeprefix("bert."): v for k, v in weights.items()})
    else:
        model = BertModel.from_pretrained(str(path))
        dense = path / "1_Dense" / "model.safetensors"
        if dense.is_file():
            projection = load_file(str(dense))["linear.weight"]
    model.eval()
    skip = reference_skiplist(path)
    out = []
    with torch.no_grad():
        for i, ids in enumerate(token_ids):
            keys = None if masks is None else torch.tensor([list(masks[i])])
            hidden = model(input_ids=torch.tensor([list(ids)]), attention_mask=keys)
            hidden = hidden.last_hidden_state[0]
            if projection is not None:
                hidden = torch.nn.functional.normalize(hidden @ projection.T, dim=-1)
            if sides is not None and sides[i] == "document":
                hidden = hidden[[t not in skip for t in ids]]
            out.append(hidden.float().numpy())
    return out
