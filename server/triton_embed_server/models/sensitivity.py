"""Which linear layers an int8 W8A8 copy must keep in float: per-layer sensitivity, simulated.

The method is *partial quantization* by layer sensitivity (Wu, Judd, Zhang, Isaev and
Micikevicius, "Integer Quantization for Deep Learning Inference: Principles and Empirical
Evaluation", NVIDIA 2020, arXiv:2004.09602, section 5.1): quantize **one** layer at a time,
measure the model's accuracy, rank the layers by the loss each one causes alone, then leave the
most sensitive layers unquantized, one more at a time, until the accuracy target is met. Here:

* the accuracy is the gate's (:mod:`triton_embed_server.models.accuracy`: per-text cosine to
  the float32 vectors and recall@10 of the float32 neighbours), measured on
  :func:`calibration_texts` (fortunes the gate's corpus does not hold, so the gate that
  confirms the choice is not the set the choice was made on);
* int8 is simulated in torch on the float model (:class:`W8A8Linear`), as vLLM's CPU kernels
  compute it: weights symmetric int8 with one scale per output channel (absolute maximum /
  127, as :func:`~triton_embed_server.models.quantize.quantize` writes them), activations
  symmetric int8 with one scale per token computed at run time, an integer product, then
  ``acc x activation scale x weight scale (+ bias)`` in float32, cast to the engine's dtype;
* the unit is one linear layer **as vLLM runs it** (:func:`linear_units`): vLLM fuses a
  layer's query, key and value (and a gated MLP's gate and up) projections into one GEMM and
  refuses a checkpoint whose fused parts differ in scheme, so they stay together;
* a layer's sensitivity (:func:`sensitivity_key`) is the recall@10 it costs alone, ties
  broken by the mean cosine it costs.

:func:`simulated_keep` then finds the fewest of the ranked layers to keep in float for the
simulated copy to pass the gate (a bisection over the ranking); ``triton-embed quantize
--keep-float auto`` confirms it with vLLM's own int8 kernels
(:func:`~triton_embed_server.models.quantize.quantize_to_gate`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from triton_embed_server.models.accuracy import GATES, AccuracyReport, compare

if TYPE_CHECKING:
    import torch

#: Sibling projections vLLM fuses into one linear layer (``packed_modules_mapping`` of its
#: BERT, Llama and Qwen models: ``qkv_proj``, ``gate_up_proj``); they are kept together.
FUSED_SIBLINGS = (
    ("query", "key", "value"),
    ("q_proj", "k_proj", "v_proj"),
    ("gate_proj", "up_proj"),
)
#: Texts of the ranking's corpus: as many as the gate's, so recall@10 means the same.
CALIBRATION_TEXTS = 300
#: Texts per torch forward pass of the simulation.
BATCH_TEXTS = 32
#: int8's symmetric range (``-127..127``; -128 unused, as compressed-tensors' symmetric int8).
INT8_MAX = 127.0


def calibration_texts(count: int = CALIBRATION_TEXTS) -> list[str]:
    """The ranking's corpus: every 7th Debian fortune from the 4th, the first ``count``.

    Disjoint from the gate's corpus (:func:`~triton_embed_server.models.accuracy.gate_texts`,
    every 7th from the 1st).
    """
    from triton_embed.corpus import read_fortunes

    return [text for _, text in read_fortunes()][3::7][:count]


def linear_units(model: torch.nn.Module, ignore: Sequence[str] = ()) -> list[tuple[str, ...]]:
    """The model's linear layers as vLLM runs them: fused siblings as one unit, in model order.

    Args:
        model: a Hugging Face model (``nn.Linear`` submodules).
        ignore: compressed-tensors patterns (module names, or ``re:`` regexes) of layers
            that stay float in any case (the pooler, ``--keep-float`` patterns).

    Returns:
        One tuple of ``nn.Linear`` module names per unit (``("encoder.layer.0.attention.self
        .query", "...key", "...value")``, ``("encoder.layer.0.output.dense",)``, ...).
    """
    import torch

    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    names = [n for n in names if not any(_matches(n, p) for p in ignore)]
    units: list[tuple[str, ...]] = []
    taken: set[str] = set()
    for name in names:
        if name in taken:
            continue
        parent, _, leaf = name.rpartition(".")
        group = next((g for g in FUSED_SIBLINGS if leaf in g), None)
        siblings = [f"{parent}.{s}" if parent else s for s in group] if group else []
        unit = tuple(s for s in siblings if s in names) if group else (name,)
        taken.update(unit)
        units.append(unit)
    return units


def _matches(name: str, pattern: str) -> bool:
    """compressed-tensors' rule: an exact name, or ``re:REGEX`` matched from the start."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    return name == pattern


def keep_pattern(unit: Sequence[str]) -> str:
    """A compressed-tensors ``ignore`` pattern for exactly the modules of ``unit``.

    A ``re:`` pattern that also matches the names under a prefix (vLLM names BERT's layers
    ``model.encoder...``, Hugging Face ``encoder...``); it matches every fused part, as vLLM
    requires of a fused layer.
    """
    parts = "|".join(re.escape(n) for n in unit)
    return rf"re:^(.+\.)?({parts})$"


def describe_unit(unit: Sequence[str]) -> str:
    """A unit's short name: ``encoder.layer.0.attention.self.{query,key,value}``."""
    if len(unit) == 1:
        return unit[0]
    parent = unit[0].rpartition(".")[0]
    return f"{parent}.{{{','.join(n.rpartition('.')[2] for n in unit)}}}"


class W8A8Linear:
    """A linear layer computed as vLLM's CPU int8 W8A8 kernels compute it (a simulation).

    Weights: ``q = round(w / s_w)``, ``s_w`` = row absolute maximum / 127 (float32
    ``[out, 1]``). Activations: per token, ``a = round(x / s_x)``, ``s_x`` = the token's
    absolute maximum / 127, clamped to ``[-127, 127]``. Output: ``(a @ q.T) x s_x x s_w.T +
    bias`` in float32, cast to the input's dtype (float32 or bfloat16). The integer product is
    carried in float32, exact while a sum stays below 2**24 (127**2 x 1,040 terms).
    """

    def __init__(self, linear: torch.nn.Linear):
        import torch

        w = linear.weight.detach().float()
        self.weight_scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / INT8_MAX
        self.weight_int = torch.round(w / self.weight_scale).clamp(-INT8_MAX, INT8_MAX)
        self.bias = None if linear.bias is None else linear.bias.detach().float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: ``[..., in]`` float32 or bfloat16; returns ``[..., out]`` of its dtype."""
        import torch

        x32 = x.float()
        scale = x32.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / INT8_MAX
        a = torch.round(x32 / scale).clamp(-INT8_MAX, INT8_MAX)
        y = (a @ self.weight_int.T) * scale * self.weight_scale.T
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)


@contextmanager
def simulated_int8(model: torch.nn.Module, names: Sequence[str]) -> Iterator[None]:
    """Run the ``nn.Linear`` modules ``names`` of ``model`` as :class:`W8A8Linear` inside.

    Their ``forward`` is replaced for the duration and put back after, also on error.
    """
    modules = dict(model.named_modules())
    saved: list[str] = []
    try:
        for name in names:
            modules[name].forward = W8A8Linear(modules[name])
            saved.append(name)
        yield
    finally:
        for name in saved:
            del modules[name].forward  # the class's forward again


@dataclass(frozen=True)
class Sensitivity:
    """How much rounding one unit alone to int8 moves the vectors (simulated).

    Attributes:
        unit: the unit's ``nn.Linear`` names (:func:`linear_units`).
        report: the gate's figures with only this unit int8.
    """

    unit: tuple[str, ...]
    report: AccuracyReport


def sensitivity_key(s: Sensitivity) -> tuple[float, float]:
    """Sort key, most sensitive first: recall@10 lost, then mean cosine lost (both negated)."""
    return (-(1.0 - s.report.recall_at_10), -(1.0 - s.report.cosine_mean))


class Simulator:
    """A float model and its gate figures under simulated int8, on a fixed tokenized corpus.

    Args:
        folder: the model folder (``AutoModel``).
        pooling: ``mean``, ``cls`` or ``lasttoken`` (the spec's pooling, as vLLM pools).
        dtype: the engine dtype around the int8 layers (``float32`` or ``bfloat16``); the
            reference is the float32 model.
        max_length: token budget per text.
        texts: the corpus; ``None``: :func:`calibration_texts`.
    """

    def __init__(
        self,
        folder: Path,
        pooling: str,
        dtype: str,
        max_length: int,
        texts: list[str] | None = None,
    ):
        import torch
        from transformers import AutoModel, AutoTokenizer

        texts = calibration_texts() if texts is None else texts
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
        self._order = np.argsort([len(x) for x in ids], kind="stable")
        pad = tokenizer.pad_token_id or 0
        self._batches = []
        for start in range(0, len(ids), BATCH_TEXTS):
            rows = [ids[i] for i in self._order[start : start + BATCH_TEXTS]]
            width = max(map(len, rows))
            input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for r, row in enumerate(rows):
                input_ids[r, : len(row)] = torch.tensor(row)
                mask[r, : len(row)] = 1
            self._batches.append((input_ids, mask))
        self.pooling = pooling
        self.model = AutoModel.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
        if dtype == "float32":
            self.reference = self.embed()
        else:
            reference = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
            self.reference = self.embed(reference)
            del reference

    def embed(self, model: torch.nn.Module | None = None) -> np.ndarray:
        """The corpus' pooled vectors, float32 ``[texts, hidden]``, in the corpus' order."""
        import torch

        model = self.model if model is None else model
        out = []
        with torch.inference_mode():
            for input_ids, mask in self._batches:
                hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state.float()
                out.append(_pool(hidden, mask, self.pooling))
        vectors = torch.cat(out).numpy()
        result = np.empty_like(vectors)
        result[self._order] = vectors
        return result

    def report(self, int8_names: Sequence[str]) -> AccuracyReport:
        """The gate's figures (precision ``int8``) with ``int8_names`` simulated int8."""
        with simulated_int8(self.model, int8_names):
            return compare(self.reference, self.embed(), "int8")


def _pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """Pool ``hidden`` ``[batch, tokens, dim]`` over each row's real tokens, as vLLM does."""
    import torch

    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "lasttoken":
        return hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]
    m = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * m).sum(dim=1) / m.sum(dim=1)


def rank_units(sim: Simulator, units: Sequence[tuple[str, ...]]) -> list[Sensitivity]:
    """Each unit's :class:`Sensitivity` alone (one forward pass each), most sensitive first."""
    found = [Sensitivity(tuple(u), sim.report(u)) for u in units]
    return sorted(found, key=sensitivity_key)


def unit_names(units: Sequence[Sequence[str]]) -> list[str]:
    """The ``nn.Linear`` names of ``units``, flattened."""
    return [n for u in units for n in u]


def simulated_keep(sim: Simulator, ranked: Sequence[Sensitivity]) -> tuple[int, AccuracyReport]:
    """The fewest of ``ranked`` to keep float for the simulated copy to pass the int8 gate.

    Returns:
        ``(k, report)``: keep ``ranked[:k]`` float; ``report`` is that copy's (simulated).
        ``k = len(ranked)`` (nothing int8) when no smaller set passes.
    """
    reports: dict[int, AccuracyReport] = {}

    def passes(k: int) -> bool:
        reports[k] = sim.report(unit_names([s.unit for s in ranked[k:]]))
        return _passes(reports[k])

    k = bisect_smallest(passes, 0, len(ranked))
    return k, reports.get(k) or sim.report([])


def _passes(report: AccuracyReport) -> bool:
    gate = GATES["int8"]
    return report.cosine_p1 >= gate.cosine_p1 and report.recall_at_10 >= gate.recall_at_10


def bisect_smallest(passes: Callable[[int], bool], low: int, high: int) -> int:
    """The smallest ``k`` in ``[low, high]`` with ``passes(k)``, by bisection.

    ``passes`` is taken to be monotone (false up to some ``k``, true from it); ``high`` is
    returned without calling ``passes(high)`` when nothing below passes.
    """
    while low < high:
        mid = (low + high) // 2
        if passes(mid):
            high = mid
        else:
            low = mid + 1
    return low


def walk_smallest(
    passes: Callable[[int], bool], start: int, high: int, tries: int
) -> tuple[int | None, int]:
    """The smallest passing ``k`` near ``start``, one step at a time, at most ``tries`` calls.

    From ``start``: while ``passes``, step down (stopping at 0 or at the first failure);
    while it fails, step up (stopping at the first pass, at ``high`` or when ``tries`` run
    out). For a check too costly to bisect (a vLLM engine run) that ``start`` predicts well;
    ``passes`` is taken to be monotone, as for :func:`bisect_smallest`.

    Returns:
        ``(k, calls)``: the smallest passing ``k`` seen (``None`` when none passed) and the
        calls made.
    """
    calls, k, best, down = 0, start, None, None
    while calls < tries and 0 <= k <= high:
        calls += 1
        if passes(k):
            best = k
            if down is False:  # came up from a failure at k - 1
                break
            down, k = True, k - 1
        else:
            if down:  # k failed, k + 1 passed
                break
            down, k = False, k + 1
    return best, calls
