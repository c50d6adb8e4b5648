#!/usr/bin/env bash
# README command 1: set everything up, start tritonserver, embed a real corpus (Debian's
# fortunes), print throughput, answer nearest-neighbour queries, stop the server.
#   scripts/run.sh [--max-texts N] [--out-dir DIR] [--concurrency N] [--batch-size N]
#                   [--dtype float32|bfloat16]  (default: the shipped config, bfloat16 where the CPU has it)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"${ROOT}/scripts/setup.sh"
exec "${ROOT}/.venv/bin/python" "${ROOT}/scripts/main_job.py" "$@"
