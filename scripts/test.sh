#!/usr/bin/env bash
# README command 2: set everything up and run the whole test suite (unit + integration,
# slow fault tests included) against a real tritonserver. Extra arguments go to pytest.
#   scripts/test.sh              # everything
#   scripts/test.sh -m "not integration"   # the fast loop
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"${ROOT}/scripts/setup.sh"
cd "$ROOT"
# Quality gates first: lint and format (configured in pyproject.toml).
"${ROOT}/.venv/bin/ruff" check .
"${ROOT}/.venv/bin/ruff" format --check .
set +e
"${ROOT}/.venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [[ $rc -eq 5 ]]; then
    echo "test.sh: pytest collected no tests; that is a failure" >&2
    exit 1
fi
exit $rc
