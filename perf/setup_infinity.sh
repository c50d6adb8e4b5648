#!/usr/bin/env bash
# Install the Infinity embedding server (infinity-emb) for perf.bench's `infinity_*` contenders.
#
#   bash perf/setup_infinity.sh      # idempotent; about 3 minutes the first time
#
# Infinity 0.0.78 pins sentence-transformers<4, click<8.2, typer 0.12 and uvicorn<0.33, which
# clash with the project's .venv, so it gets its own virtual environment: perf/.infinity/venv
# (git-ignored). Its optimum/ONNX backend needs an ONNX export of the model; this script makes
# one in perf/.infinity/model-onnx (a copy of the model folder plus model.onnx), from the same
# all-MiniLM-L6-v2 package the rest of the project uses. No model-hub download.
#
# Pins, and why (each found by trying, 2026-12-01):
#   torch==2.13.0+cpu     the CPU build the project uses (PyPI's default wheel is the CUDA one)
#   optimum 2.1 + optimum-onnx 0.1   optimum 1.x imports torch.onnx internals torch 2.13 lacks
#   transformers 4.57.6   what optimum 2.1 resolves to; 5.x is outside infinity's range
#   numpy<2, pyarrow<21   numpy 2 is what pyarrow 21+ needs; the model package needs numpy 1
# The export uses --library-name transformers: a sentence-transformers export names its output
# `token_embeddings`, while Infinity's optimum engine reads `last_hidden_state`.
# max_position_embeddings is set to 256 in the copy's config.json: Infinity's optimum engine
# truncates at that value, and every other contender truncates at the model's 256-token budget
# (sentence_bert_config.json), so all of them embed the same tokens. perf/.infinity/
# model-onnx-int8 holds the same folder with the export quantized to int8 (model_quantized.onnx).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="${ROOT}/perf/.infinity"
VENV="${HERE}/venv"
ONNX_MODEL="${HERE}/model-onnx"
ONNX_INT8_MODEL="${HERE}/model-onnx-int8"
PYTHON="${PYTHON:-python3}"
SPECS=(
    "infinity-emb[server,torch,optimum]==0.0.78" "torch==2.13.0+cpu" "numpy<2"
    "optimum==2.1.0" "optimum-onnx==0.1.0" "transformers==4.57.6" "pyarrow>=14,<21"
)

fail() { echo "setup_infinity.sh: ERROR: $1" >&2; exit 1; }
step() { echo "==> $*"; }

[[ -x "${ROOT}/.venv/bin/python" ]] || fail "run scripts/setup.sh first (the model comes from the project's .venv)"
MODEL="$("${ROOT}/.venv/bin/python" -c 'from perf.corpora import MODEL; print(MODEL)')"

if ! "${VENV}/bin/python" -c 'import infinity_emb, optimum.onnxruntime' 2>/dev/null; then
    step "creating ${VENV} with Infinity 0.0.78 (torch and optimum/ONNX backends)"
    mkdir -p "${HERE}"
    "${PYTHON}" -m venv "${VENV}"
    "${VENV}/bin/pip" install -q "${SPECS[@]}" 2>&1 | { grep -v -E "^WARNING: Location 'file:" || true; }
    "${VENV}/bin/python" -c 'import infinity_emb, optimum.onnxruntime' \
        || fail "Infinity installed but does not import; see the pins above"
fi

if [[ ! -f "${ONNX_MODEL}/model.onnx" ]]; then
    step "exporting the model to ONNX for Infinity's optimum engine: ${ONNX_MODEL}"
    rm -rf "${ONNX_MODEL}" "${HERE}/export"
    cp -r "${MODEL}" "${ONNX_MODEL}"
    HF_HUB_OFFLINE=1 "${VENV}/bin/optimum-cli" export onnx --model "${MODEL}" \
        --task feature-extraction --library-name transformers "${HERE}/export" >/dev/null 2>&1 \
        || fail "optimum-cli export failed; run it by hand to see why"
    mv "${HERE}/export/model.onnx" "${ONNX_MODEL}/model.onnx"
    rm -rf "${HERE}/export"
    "${VENV}/bin/python" - "${ONNX_MODEL}/config.json" <<'EOF'
import json, sys
path = sys.argv[1]
config = json.load(open(path))
config["max_position_embeddings"] = 256
json.dump(config, open(path, "w"), indent=2)
EOF
fi
if [[ ! -f "${ONNX_INT8_MODEL}/model_quantized.onnx" ]]; then
    # perf.precision's int8 peer: ONNX Runtime's dynamic quantization through optimum (its
    # avx512_vnni config, int8 weights per channel), the int8 path Infinity documents.
    step "quantizing the ONNX export to int8 (ONNX Runtime dynamic quantization): ${ONNX_INT8_MODEL}"
    rm -rf "${ONNX_INT8_MODEL}" "${HERE}/quantized"
    "${VENV}/bin/optimum-cli" onnxruntime quantize --onnx_model "${ONNX_MODEL}" --avx512_vnni \
        --per_channel -o "${HERE}/quantized" >/dev/null 2>&1 \
        || fail "optimum-cli onnxruntime quantize failed; run it by hand to see why"
    mkdir -p "${ONNX_INT8_MODEL}"
    find "${ONNX_MODEL}" -maxdepth 1 -type f ! -name "*.onnx" -exec cp {} "${ONNX_INT8_MODEL}/" \;
    for sub in "${ONNX_MODEL}"/*/; do cp -r "${sub}" "${ONNX_INT8_MODEL}/"; done
    mv "${HERE}/quantized/model_quantized.onnx" "${ONNX_INT8_MODEL}/model_quantized.onnx"
    rm -rf "${HERE}/quantized"
fi
step "Infinity ready: ${VENV}/bin/infinity_emb (ONNX model: ${ONNX_MODEL})"
