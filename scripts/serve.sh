#!/usr/bin/env bash
# Run the real tritonserver on this repository's model_repository, in the foreground.
#
#   scripts/serve.sh                                  # CPU config, loopback, ports 8000/8001/8002
#                                                     # (HTTP 8000: loopback only, see below)
#   scripts/serve.sh --grpc-port 9001 --http-port 9000 --metrics-port 9002
#   scripts/serve.sh --model-config-name gpu          # embedder/configs/gpu.pbtxt
#   BIND_ADDRESS=0.0.0.0 scripts/serve.sh             # expose gRPC and metrics on every interface
#   PER_NUMA_NODE=1 scripts/serve.sh                  # one server per NUMA node (numactl-bound,
#                                                     # ports +10 per node; see docs/operations.md)
#   GATEWAY_PORT=8080 scripts/serve.sh                # also the HTTP gateway (OpenAI, TEI APIs) on
#                                                     # that port, in front of this server's gRPC port
#   GATEWAY_PORT=8080 GATEWAY_ARGS="--default-reranker rerank --max-body-mb 8" scripts/serve.sh
#                                                     # gateway flags (triton-embed gateway --help)
#   GATEWAY_PORT=8080 GATEWAY_TENANTS=/etc/triton-embed/tenants.yaml scripts/serve.sh
#                                                     # the gateway's tenants file (docs/tenants.md);
#                                                     # SIGHUP to this script re-reads it
#   MODEL_REPOSITORY=/srv/models scripts/serve.sh     # another model repository (default: this
#                                                     # checkout's model_repository)
#   OTLP_ENDPOINT=http://otel-collector:4318 scripts/serve.sh
#                                                     # traces: Triton's, the steps' and the
#                                                     # gateway's spans to that OTLP/HTTP URL;
#                                                     # OTLP_TRACE_RATE=N: 1 in N requests without
#                                                     # a traceparent traced too (default 1)
#
# Extra arguments go to tritonserver unchanged (later ones win). Needs scripts/setup.sh first.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TRITONSERVER="${ROOT}/.venv/bin/tritonserver"
[[ -x "$TRITONSERVER" ]] || { echo "serve.sh: ${TRITONSERVER} not found; run scripts/setup.sh first" >&2; exit 1; }
ADDR="${BIND_ADDRESS:-127.0.0.1}"
# The supervisor runs tritonserver (explicit model control, all models loaded) and reloads a
# model whose Python-backend stub process died; SUPERVISE=0 runs tritonserver bare.
SUPERVISOR=("${ROOT}/.venv/bin/python" -m triton_embed_server.run.supervisor --)
[[ "${SUPERVISE:-1}" == "0" ]] && SUPERVISOR=("$TRITONSERVER")
# Restricted APIs (docs/operations.md): every API but inference, health and metadata needs the
# admin key, and over HTTP inference too; from TRITON_EMBED_ADMIN_KEY, the file
# TRITON_EMBED_ADMIN_KEY_FILE, or generated into $XDG_STATE_HOME/triton-embed/admin_key (0600).
# RESTRICTED_APIS=0 leaves them open.
# Ports (docs/operations.md, "Ports"): Triton's HTTP port listens on loopback only, whatever
# BIND_ADDRESS says: Triton 2.51's HTTP frontend bounds no body and dies (SIGSEGV) on a 150 MiB
# body before any check, and on a 200 KB JSON body nested 100,000 levels deep. It serves the
# supervisor and local tools; users' HTTP goes to the gateway (GATEWAY_PORT), gRPC to BIND_ADDRESS.
HTTP_ADDR=127.0.0.1
RESTRICT=()
if [[ "${RESTRICTED_APIS:-1}" != "0" ]]; then
    flags="$("${ROOT}/.venv/bin/python" -m triton_embed_server.host.admin_key --tritonserver-args)"
    mapfile -t RESTRICT <<< "$flags"
fi
# Traces (docs/operations.md, "Traces"): Triton's OpenTelemetry trace flags, and the steps'
# span endpoint (TRITON_EMBED_OTLP_ENDPOINT, triton_embed_server.run.trace_args), inherited
# by the Python-backend stubs.
TRACE=()
if [[ -n "${OTLP_ENDPOINT:-}" ]]; then
    flags="$("${ROOT}/.venv/bin/python" -m triton_embed_server.run.trace_args \
        "$OTLP_ENDPOINT" "${OTLP_TRACE_RATE:-1}")"
    mapfile -t TRACE <<< "$flags"
    export TRITON_EMBED_OTLP_ENDPOINT="$OTLP_ENDPOINT"
fi
if [[ "${PER_NUMA_NODE:-0}" == "1" && -n "${GATEWAY_PORT:-}" ]]; then
    echo "serve.sh: GATEWAY_PORT is not supported with PER_NUMA_NODE=1; run triton-embed gateway" \
        "--upstream with every node's gRPC port instead (docs/operations.md, Gateway)" >&2
    exit 1
fi
if [[ "${PER_NUMA_NODE:-0}" == "1" ]]; then
    # The doctor's plan decides the servers; each runs under the supervisor with its own ports.
    exec "${ROOT}/.venv/bin/python" -m triton_embed_server.host.per_node --bind-address "$ADDR" -- \
        --model-repository "${MODEL_REPOSITORY:-${ROOT}/model_repository}" --log-verbose 0 \
        "${RESTRICT[@]}" "${TRACE[@]}" "$@"
fi
# Python-backend shared memory (docs/operations.md, "Shared memory"): the supervisor sizes it
# from the configs after checking /dev/shm; a bare tritonserver gets the same arguments here
# (the script stops with the message if /dev/shm is too small).
SHM_ARGS=()
if [[ "${SUPERVISE:-1}" == "0" ]]; then
    shm_args="$("${ROOT}/.venv/bin/python" -m triton_embed_server.host.shm args -- \
        --model-repository "${MODEL_REPOSITORY:-${ROOT}/model_repository}" "$@")"
    [[ -z "$shm_args" ]] || mapfile -t SHM_ARGS <<< "$shm_args"
fi
SERVER=("${SUPERVISOR[@]}"
    --model-repository "${MODEL_REPOSITORY:-${ROOT}/model_repository}"
    --grpc-address "$ADDR" --http-address "$HTTP_ADDR" --metrics-address "$ADDR"
    "${SHM_ARGS[@]}"
    --log-verbose 0
    "${RESTRICT[@]}"
    "${TRACE[@]}"
    "$@")
[[ -n "${GATEWAY_PORT:-}" ]] || exec "${SERVER[@]}"

# The gateway (docs/operations.md, "Gateway"): in the background, on the same address, in
# front of this server's gRPC port (the last --grpc-port given, as tritonserver reads it). It
# finds the admin key where the server does. The server stays the script's main job: TERM
# and INT are forwarded to it (HUP to the gateway: it re-reads GATEWAY_TENANTS), and once it
# has exited the gateway is stopped by its PID.
GRPC_PORT=8001
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[i]}" in
        --grpc-port=*) GRPC_PORT="${args[i]#--grpc-port=}" ;;
        --grpc-port) GRPC_PORT="${args[i + 1]:-$GRPC_PORT}" ;;
    esac
done
case "$ADDR" in
    0.0.0.0) UPSTREAM="127.0.0.1:${GRPC_PORT}" ;;
    ::) UPSTREAM="[::1]:${GRPC_PORT}" ;;
    *:*) UPSTREAM="[${ADDR}]:${GRPC_PORT}" ;;
    *) UPSTREAM="${ADDR}:${GRPC_PORT}" ;;
esac
GATEWAY_FLAGS=()
[[ -z "${GATEWAY_ARGS:-}" ]] || read -r -a GATEWAY_FLAGS <<< "$GATEWAY_ARGS"
[[ -z "${GATEWAY_TENANTS:-}" ]] || GATEWAY_FLAGS+=(--tenants "$GATEWAY_TENANTS")
[[ -z "${OTLP_ENDPOINT:-}" ]] || GATEWAY_FLAGS+=(--otlp-endpoint "$OTLP_ENDPOINT")
"${ROOT}/.venv/bin/python" -m triton_embed_server.gateway --upstream "$UPSTREAM" \
    --host "$ADDR" --port "$GATEWAY_PORT" "${GATEWAY_FLAGS[@]}" &
GATEWAY_PID=$!
stop_gateway() {
    kill -TERM "$GATEWAY_PID" 2>/dev/null || true
    wait "$GATEWAY_PID" 2>/dev/null || true
}
trap stop_gateway EXIT
"${SERVER[@]}" &
SERVER_PID=$!
trap 'kill -TERM "$SERVER_PID" 2>/dev/null || true' TERM INT
# HUP: the gateway re-reads its tenants file (docs/tenants.md, "Reload"); the server goes on.
trap 'kill -HUP "$GATEWAY_PID" 2>/dev/null || true' HUP
status=0
while :; do
    wait "$SERVER_PID" && status=0 || status=$?
    kill -0 "$SERVER_PID" 2>/dev/null || break  # a trapped signal interrupted the wait
done
exit "$status"
