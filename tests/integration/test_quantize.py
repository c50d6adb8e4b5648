"""``triton-embed quantize`` end to end: the int8 copy runs on vLLM's int8 kernels and the
accuracy gate compares its vectors with the float32 engine's on the same token IDs."""

from __future__ import annotations

import re

import pytest
from triton_embed.cli import main
from triton_embed_server.host.cpu_features import cpu_flags, int8_note

from tests.model_factory import make_cls_encoder

pytestmark = pytest.mark.integration

REPORT = re.compile(
    r"accuracy of int8 against float32 on 300 real texts: cosine min ([\d.]+), p1 ([\d.]+), "
    r"mean ([\d.]+); recall@10 ([\d.]+); gate: cosine p1 >= 0.99, recall@10 >= 0.95: "
    r"(passed|FAILED)"
)


def test_quantize_writes_a_copy_vllm_serves_and_gates_it(tmp_path, capsys):
    source = make_cls_encoder(tmp_path / "bge", seed=5)
    out = tmp_path / "bge-int8"
    code = main(["quantize", str(source), str(out), "--accept-accuracy"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"wrote {out}: 12 linear layers int8 W8A8" in printed
    found = REPORT.search(printed)
    assert found, printed
    cos_min, cos_p1, cos_mean, recall = map(float, found.groups()[:4])
    note = int8_note(cpu_flags())
    if note is not None:  # no VNNI: oneDNN's AVX2 int8 path, far off float32; said so
        assert f"note: {note}; the gate below measures this host" in printed
        assert 0.0 < cos_min <= cos_p1 <= cos_mean < 1.0
    else:
        # int8 rounding moves each vector, it does not scramble it (a wrong scale or layout
        # would give cosines near 0, as a broken smoothing did while this was written)
        assert 0.9 < cos_min <= cos_p1 <= cos_mean < 1.0
        assert 0.5 < recall <= 1.0
    assert found.group(5) == ("passed" if cos_p1 >= 0.99 and recall >= 0.95 else "FAILED")
    assert (out / "model.safetensors").is_file()  # kept: --accept-accuracy


def test_a_copy_below_the_gate_is_removed_with_exit_1(tmp_path, capsys):
    source = make_cls_encoder(tmp_path / "bge", seed=5)
    out = tmp_path / "bge-int8"
    code = main(["quantize", str(source), str(out)])
    printed = capsys.readouterr().out
    found = REPORT.search(printed)
    assert found, printed
    if found.group(5) == "passed":
        assert code == 0 and out.is_dir()
    else:
        assert code == 1 and not out.exists()
        assert f"removed {out}: below the int8 gate" in printed
