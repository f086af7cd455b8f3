#!/usr/bin/env bash
# Regenerate constraints.txt: every package that Cormorant and all its extras resolve to,
# pinned (uv's resolver, for Python 3.11 on every platform). The Dockerfile, the EMR
# environment (docs/analytics.md) and scripts/bootstrap.sh (hence CI) install with
# `-c constraints.txt`, so an image, a Spark job's environment and a CI run get the same
# versions. Pins already in the file are kept while they still satisfy pyproject.toml; pass
# --upgrade to move every pin to the newest allowed version (then run scripts/test.sh).
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CORMORANT_ROOT"
PY="$(cormorant_python)"
"$PY" -m uv --version >/dev/null 2>&1 \
    || "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore uv
"$PY" -m uv pip compile pyproject.toml --all-extras --universal --python-version 3.11 \
    --custom-compile-command "bash scripts/lock.sh" --quiet --output-file constraints.txt "$@"
