#!/usr/bin/env bash
# What a contributor's change must pass before the tests (docs/contributing.md), in the order
# a failure is cheapest to fix: ruff's lint rules and its formatting over the whole repository,
# mypy --strict over services, spark_emr, infra and bench (pyproject.toml [tool.mypy] files),
# and the documentation site built with --strict (a broken link, a missing page in the nav or
# a generated reference that no longer builds fails it). Every check runs; any failure fails
# the script. scripts/test.sh runs it before pytest.
set -uo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CORMORANT_ROOT"
PY="$(cormorant_python)"

failed=()
run() {
    echo "check: $*"
    "$@" || failed+=("$*")
}
run "$PY" -m ruff check .
run "$PY" -m ruff format --check .
run "$PY" -m mypy
# The site goes to a scratch directory: a check leaves no build output in the worktree.
site="$(mktemp -d)"
# Not --quiet: it drops the warnings that --strict counts, and a broken link would pass.
# (Material for MkDocs prints an end-of-life notice on every build: not a finding.)
NO_MKDOCS_2_WARNING=1 run "$PY" -m mkdocs build --strict --site-dir "$site"
rm -rf "$site"

if [ "${#failed[@]}" -gt 0 ]; then
    printf 'check: FAILED: %s\n' "${failed[@]}" >&2
    exit 1
fi
echo "check: all passed"
