#!/usr/bin/env bash
# Install what is missing, then bring the local cluster up (MQTT on 127.0.0.1:1883).
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bash "$CORMORANT_ROOT/scripts/bootstrap.sh"
cd "$CORMORANT_ROOT"
exec "$(cormorant_python)" -m services.cli up "$@"
