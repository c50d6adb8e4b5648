"""The accuracy gate of a reduced precision: its vectors against float32's, on real text.

A model served at ``bfloat16`` (or another reduced precision) must return nearly the vectors
float32 returns, and rank the same neighbours. :func:`measure` embeds a fixed corpus of real
texts (the Debian fortunes, :func:`~triton_embed.corpus.read_fortunes`, every 7th up to
:data:`GATE_TEXTS`) with the model's own vLLM engine twice, at float32 and at the precision,
on the same token IDs, and :func:`compare` reports:

* per-text cosine of the two vectors: min, p1 (1st percentile) and mean;
* recall@10: of each text's 10 nearest neighbours by float32 cosine (itself left out), the
  share the precision's vectors also rank in their 10 nearest.

:data:`GATES` holds the least each precision must reach, and why. ``repository add --dtype``
runs the gate before it writes a reduced-precision model (:func:`gate_for_add`).
"""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from triton_embed_server.models.model_spec import quantization_of
from triton_embed_server.models.spec import ModelSpec, SpecParameters

#: Texts of the gate's corpus: enough for a stable 1st percentile (3 texts below it) and a
#: neighbour set where 10 nearest are a 3% slice, small enough for about a minute on 2 cores.
GATE_TEXTS = 300
#: Neighbours compared per text (recall@K).
RECALL_K = 10


@dataclass(frozen=True)
class Gate:
    """The least a precision's vectors must reach against float32's on the gate's corpus.

    Attributes:
        cosine_p1: 1st percentile of the per-text cosine.
        recall_at_10: mean share of the float32 10 nearest neighbours kept.
        why: where the numbers come from.
    """

    cosine_p1: float
    recall_at_10: float
    why: str


#: bfloat16 keeps float32's exponent with an 8-bit mantissa (relative error per value about
#: 2**-9 = 0.002); over a 384-value dot product the errors average out, and vLLM's CPU engine
#: measured cosine min 0.99989 / mean 0.99996 and 99% of the 10 nearest kept on
#: all-MiniLM-L6-v2 (shared PLATFORM.md). 0.999 leaves 10x that loss as the margin before a
#: model is refused; 0.95 recall is what a user of an approximate (HNSW) index already
#: accepts from the index alone. float16 has a 10-bit mantissa (4x finer), so the same bar.
#: int8 W8A8 (per-channel weights, per-token activations) loses about 10x more per value.
GATES = {
    "bfloat16": Gate(0.999, 0.95, "8-bit mantissa; engine measured p1 > 0.9999, 99% recall"),
    "float16": Gate(0.999, 0.95, "10-bit mantissa, finer than bfloat16: the same bar"),
    "int8": Gate(0.99, 0.95, "W8A8 rounds each value to 1/127 of its row's range"),
}


#: Least per-text cosine a served float32 vector must reach against sentence-transformers'
#: float32 vector of the same text: vLLM and sentence-transformers run the same math in a
#: different order (vLLM's own tests allow 1e-2 on the difference norm; 0.9999 is ours).
FLOAT32_COSINE_MIN = 0.9999


def cosine_floor(dtype: str) -> float:
    """Least per-text cosine to the float32 reference a vector served at ``dtype`` must reach.

    :data:`FLOAT32_COSINE_MIN` for float32 (and ``auto``, float32 on CPU); a reduced
    precision's gate bar (:data:`GATES`, its ``cosine_p1``) otherwise. For checks of served
    vectors (tests, the soak): a wrong vector (another text's, garbage) scores far below.
    """
    return GATES[dtype].cosine_p1 if dtype in GATES else FLOAT32_COSINE_MIN


@dataclass(frozen=True)
class AccuracyReport:
    """How close one precision's vectors came to float32's.

    Attributes:
        precision: the dtype (or quantization) measured.
        texts: texts compared.
        cosine_min, cosine_p1, cosine_mean: per-text cosine to float32 (1 = identical).
        recall_at_10: mean share of each text's float32 10 nearest neighbours kept (0..1).
        gate: the bar (:data:`GATES`), ``None`` when the precision has none.
    """

    precision: str
    texts: int
    cosine_min: float
    cosine_p1: float
    cosine_mean: float
    recall_at_10: float
    gate: Gate | None

    @property
    def passed(self) -> bool:
        """Whether both figures reach the gate (``True`` when there is no gate)."""
        if self.gate is None:
            return True
        return self.cosine_p1 >= self.gate.cosine_p1 and self.recall_at_10 >= self.gate.recall_at_10

    def describe(self) -> str:
        """One line: the figures, the bar and the verdict."""
        line = (
            f"accuracy of {self.precision} against float32 on {self.texts} real texts: cosine "
            f"min {self.cosine_min:.5f}, p1 {self.cosine_p1:.5f}, mean {self.cosine_mean:.5f}; "
            f"recall@{RECALL_K} {self.recall_at_10:.3f}"
        )
        if self.gate is None:
            return line + " (no gate for this precision)"
        verdict = "passed" if self.passed else "FAILED"
        return (
            f"{line}; gate: cosine p1 >= {self.gate.cosine_p1}, recall@{RECALL_K} >= "
            f"{self.gate.recall_at_10}: {verdict}"
        )


def compare(reference: np.ndarray, candidate: np.ndarray, precision: str) -> AccuracyReport:
    """The gate's figures for ``candidate`` vectors against the ``reference`` (float32) ones.

    Args:
        reference: ``[n, dim]`` float32 vectors, ``n > RECALL_K``.
        candidate: ``[n, dim]`` vectors of the same texts at ``precision``.
        precision: its name, for :data:`GATES` and the report.

    Raises:
        ValueError: shapes differ or too few texts for recall@10.
    """
    if reference.shape != candidate.shape or reference.ndim != 2:
        raise ValueError(f"shapes differ: {reference.shape} against {candidate.shape}")
    n = reference.shape[0]
    if n <= RECALL_K:
        raise ValueError(f"{n} texts: recall@{RECALL_K} needs more than {RECALL_K}")
    ref = _unit(reference)
    got = _unit(candidate)
    cosine = np.einsum("ij,ij->i", ref, got)
    recall = np.mean(
        [len(a & b) / RECALL_K for a, b in zip(_nearest(ref), _nearest(got), strict=True)]
    )
    return AccuracyReport(
        precision=precision,
        texts=n,
        cosine_min=float(cosine.min()),
        cosine_p1=float(np.percentile(cosine, 1)),
        cosine_mean=float(cosine.mean()),
        recall_at_10=float(recall),
        gate=GATES.get(precision),
    )


def _unit(vectors: np.ndarray) -> np.ndarray:
    v = vectors.astype(np.float64)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def _nearest(unit: np.ndarray) -> list[set[int]]:
    """Each row's :data:`RECALL_K` nearest other rows by cosine."""
    sims = unit @ unit.T
    np.fill_diagonal(sims, -np.inf)
    top = np.argpartition(-sims, RECALL_K, axis=1)[:, :RECALL_K]
    return [set(row.tolist()) for row in top]


def gate_texts(count: int = GATE_TEXTS) -> list[str]:
    """The gate's corpus: every 7th Debian fortune, as written, the first ``count``."""
    from triton_embed.corpus import read_fortunes

    return [text for _, text in read_fortunes()][::7][:count]


def measure(
    folder: Path,
    spec: ModelSpec,
    precision: str,
    max_length: int,
    texts: list[str] | None = None,
    candidate: Path | None = None,
    candidate_dtype: str = "float32",
    reference: np.ndarray | None = None,
) -> AccuracyReport:
    """Embed the gate's texts at float32 and at ``precision`` with vLLM; :func:`compare` them.

    The two engines run one after the other in this process (the pooling and
    normalization of ``spec``; texts tokenized as documents, cut at ``max_length``).

    Args:
        folder: the model folder.
        spec: the model's spec with the operator's overrides.
        precision: the engine ``dtype`` to check (``bfloat16``, ``float16``), or ``int8``
            for a ``candidate`` folder.
        max_length: token budget per text.
        texts: the corpus; ``None``: :func:`gate_texts`.
        candidate: the folder to run at ``precision`` (a quantized copy of ``folder``);
            ``None``: ``folder`` itself.
        candidate_dtype: the engine ``dtype`` the ``candidate`` runs at: the activations
            around its int8 layers and its float layers (``float32`` or ``bfloat16``). Gate
            an int8 copy at the dtype it will be served at.
        reference: ``folder``'s float32 vectors of ``texts`` (:func:`reference_vectors`),
            to reuse across calls; ``None``: computed here.

    Raises:
        RuntimeError: an engine failed to start or embed (vLLM's message).
    """
    base, ids = _engine_inputs(folder, spec, max_length, texts)
    # Pooled, not normalized: cosine and the neighbours by cosine do not depend on the norm.
    reference = _embed(base, ids) if reference is None else reference
    if candidate is not None:
        got = _embed(replace(base, model_path=Path(candidate), dtype=candidate_dtype), ids)
    else:
        got = _embed(replace(base, dtype=precision), ids)
    return compare(reference, got, precision)


def reference_vectors(
    folder: Path, spec: ModelSpec, max_length: int, texts: list[str] | None = None
) -> np.ndarray:
    """``folder``'s float32 vLLM vectors of the gate's texts (pooled): :func:`measure`'s reference.

    Returns:
        float32 ``[texts, dim]``, not normalized.

    Raises:
        RuntimeError: the engine failed to start or embed.
    """
    base, ids = _engine_inputs(folder, spec, max_length, texts)
    return _embed(base, ids)


def _engine_inputs(folder: Path, spec: ModelSpec, max_length: int, texts: list[str] | None):
    """The float32 engine config of ``folder`` and the token IDs of the gate's texts."""
    from transformers import AutoTokenizer

    from triton_embed_server.steps.config import EmbedderConfig

    texts = gate_texts() if texts is None else texts
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    base = EmbedderConfig(
        model_path=Path(folder),
        max_length=max_length,
        spec_parameters=SpecParameters.parse(spec.parameters(), "parameter "),
        max_num_batched_tokens=max(16384, max_length),
    )
    return base, ids


#: vLLM's switch for an engine in this process: without it each engine runs in a child
#: process that lives (and polls) as long as this one, slowing what runs after the gate.
IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def _embed(config, ids: list[list[int]]) -> np.ndarray:
    from triton_embed_server.steps.vllm_engine import PoolingEngine

    before = os.environ.get(IN_PROCESS_ENV)
    os.environ[IN_PROCESS_ENV] = "0"
    try:
        engine = PoolingEngine(config)
        out = engine.embed(ids)
    except Exception as exc:
        raise RuntimeError(f"the {config.dtype} engine failed: {exc}") from exc
    finally:
        if before is None:
            os.environ.pop(IN_PROCESS_ENV, None)
        else:
            os.environ[IN_PROCESS_ENV] = before
    del engine
    gc.collect()
    return out


#: The file in an int8 copy (``triton-embed quantize``) that says which engine dtype it was
#: gated at, and the figures.
GATE_RECORD = "triton_embed_quantize.json"
#: Engine dtypes an int8 copy is gated and served at on CPUs (around its int8 layers).
INT8_DTYPES = ("float32", "bfloat16")


def write_gate_record(folder: Path, dtype: str, report: AccuracyReport | None) -> None:
    """Write :data:`GATE_RECORD` into an int8 copy: the dtype it is meant for, the figures.

    Args:
        folder: the int8 copy.
        dtype: the engine dtype the gate ran it at (:data:`INT8_DTYPES`).
        report: the gate's report; ``None``: not gated (``--no-gate``).
    """
    gate = None
    if report is not None:
        gate = {**asdict(report), "passed": report.passed}
    record = {"dtype": dtype, "gate": gate}
    (Path(folder) / GATE_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def read_gate_record(folder: Path) -> dict | None:
    """The :data:`GATE_RECORD` of an int8 copy (``dtype``, ``gate``), or ``None`` if absent.

    Raises:
        ValueError: the file is not a JSON object with a ``dtype`` of :data:`INT8_DTYPES`.
    """
    path = Path(folder) / GATE_RECORD
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(record, dict) or record.get("dtype") not in INT8_DTYPES:
        raise ValueError(f"{path}: no dtype of {', '.join(INT8_DTYPES)}")
    return record


def check_int8_record(folder: Path, dtype: str, accept: bool, say: Callable[[str], None]) -> None:
    """``repository add``'s check of an int8 copy: gated by ``quantize`` at ``dtype``, passed.

    An int8 copy cannot be gated against itself: ``quantize`` gated it against the float32
    model at the engine dtype it was made for and wrote :data:`GATE_RECORD`; serving it at
    another dtype, or a copy that failed, is refused unless ``accept``.

    Raises:
        ValueError: what is wrong and what to do (not when ``accept``).
    """
    record = read_gate_record(folder)
    if record is None or record["gate"] is None:
        say(
            f"note: {folder} is int8 without a gate record ({GATE_RECORD}): its accuracy "
            "was not measured; triton-embed quantize gates the copies it writes"
        )
        return
    gate, gated = record["gate"], record["dtype"]
    say(
        f"int8 copy gated by triton-embed quantize with the engine at {gated}: cosine p1 "
        f"{gate['cosine_p1']:.5f}, recall@{RECALL_K} {gate['recall_at_10']:.3f}: "
        f"{'passed' if gate['passed'] else 'FAILED'}"
    )
    problem = None
    if not gate["passed"]:
        problem = "it failed the accuracy gate (kept with --accept-accuracy)"
    elif dtype != gated:
        problem = (
            f"it passed the gate with the engine at {gated}, not at --dtype {dtype}; "
            f"quantize again with --dtype {dtype}, or add it at --dtype {gated}"
        )
    if problem is not None and not accept:
        raise ValueError(f"int8 copy {folder}: {problem}; or pass --accept-accuracy")


def gate_for_add(
    accept: bool, say: Callable[[str], None]
) -> Callable[[Path, ModelSpec, str, int], None]:
    """The check ``repository add`` runs before writing a reduced-precision model.

    Args:
        accept: write the model even when the gate fails (``--accept-accuracy``).
        say: where the report line goes (the CLI prints it).

    Returns:
        ``check(folder, spec, dtype, max_length)``, raising ``ValueError`` (the report and
        what to do) when the gate fails and ``accept`` is false. An int8 copy is not
        measured again: :func:`check_int8_record` reads what ``quantize`` measured.
    """

    def check(folder: Path, spec: ModelSpec, dtype: str, max_length: int) -> None:
        if quantization_of(folder) == "int8":
            check_int8_record(folder, dtype, accept, say)
            return
        report = measure(folder, spec, dtype, max_length)
        say(report.describe())
        if not report.passed and not accept:
            raise ValueError(
                f"--dtype {dtype} fails the accuracy gate ({report.describe()}); keep float32, "
                "or pass --accept-accuracy to write it anyway"
            )

    return check
