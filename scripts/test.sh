#!/usr/bin/env bash
# Install what is missing, run the checks a contributor's change must pass (scripts/check.sh:
# ruff, ruff format, mypy --strict, the documentation site built with --strict), then the
# whole test suite (it starts its own servers), listing its 25 slowest steps (--durations).
# A failed check fails the run before any test.
# Extra arguments go to pytest. "No tests ran" counts as a failure.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bash "$CORMORANT_ROOT/scripts/bootstrap.sh"
cd "$CORMORANT_ROOT"
bash scripts/check.sh

status=0
"$(cormorant_python)" -m pytest -q -ra --timeout=300 --durations=25 "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: no tests were collected" >&2
    exit 1
fi
exit "$status"
