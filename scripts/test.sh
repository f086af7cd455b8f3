#!/usr/bin/env bash
# Install what is missing, then run the whole test suite (it starts its own servers).
# Extra arguments go to pytest. "No tests ran" counts as a failure.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bash "$CORMORANT_ROOT/scripts/bootstrap.sh"
cd "$CORMORANT_ROOT"

status=0
"$(cormorant_python)" -m pytest -q -ra --timeout=300 "$@" || status=$?
if [ "$status" -eq 5 ]; then
    echo "test.sh: no tests were collected" >&2
    exit 1
fi
exit "$status"
