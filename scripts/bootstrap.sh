#!/usr/bin/env bash
# Install what the local cluster and the tests need on a Debian machine, idempotently:
# system packages (only those missing), Cormorant itself with its test extra (which pulls in
# the analytics extra: pyspark, pandas, pyarrow, matplotlib, boto3), the Kafka jars and the
# Spark Kafka connector's jars (through Maven, cached under ~/.cache/cormorant). Run as root
# or with sudo.
set -euo pipefail

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$CORMORANT_ROOT"

# Kafka and Spark (pyspark's JVM) need a JRE 17 and Maven (their jars come from Maven
# Central); setpriv (util-linux) runs PostgreSQL as its own user when we are root; the
# analytics report's page is checked in a real headless Chromium (driven by Playwright);
# Prometheus (and its promtool) checks monitoring/'s scrape configurations and dashboard
# queries against the test cluster (it is installed, never started as a system service).
PACKAGES=(
    ca-certificates python3 python3-venv python3-pip
    openjdk-17-jre-headless maven
    redis-server postgresql haproxy
    mosquitto mosquitto-clients
    util-linux
    chromium
    prometheus
)

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    SUDO=(sudo)
fi

# A JDK or Maven installed outside apt (SDKMAN, Temurin tarballs) serves as well.
command -v java >/dev/null && PACKAGES=("${PACKAGES[@]/openjdk-17-jre-headless}")
command -v mvn >/dev/null && PACKAGES=("${PACKAGES[@]/maven}")
# npm fetches MQTT.js for the browser test of MQTT over WebSocket; a Node.js installed
# otherwise (NodeSource ships npm with it) serves as well.
command -v npm >/dev/null || PACKAGES+=(nodejs npm)

missing=()
for pkg in "${PACKAGES[@]}"; do
    [ -n "$pkg" ] || continue
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$pkg")
    fi
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -q
    "${SUDO[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
    # Debian's package starts a system-wide Prometheus on :9090 (every address) where
    # systemd runs; the tests start their own on loopback: stop and disable the one we
    # just installed (a Prometheus that was there before is left alone).
    if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
        "${SUDO[@]}" systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
fi

if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "bootstrap: Cormorant needs Python >= 3.11, python3 is $(python3 -V 2>&1)" >&2
    exit 1
fi

PY="$(cormorant_python)"
echo "bootstrap: installing Cormorant into $PY"
# The versions pinned in constraints.txt (bash scripts/lock.sh regenerates it), as the
# container images and the EMR environment install them.
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore \
    -c constraints.txt -e '.[test]'

# MQTT.js's browser bundle, served by the WebSocket test to a headless Chromium (no CDN).
MQTTJS_VERSION=5.16.0
MQTTJS_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/cormorant/npm"
if ! grep -qs "\"version\": \"$MQTTJS_VERSION\"" "$MQTTJS_DIR/node_modules/mqtt/package.json"; then
    echo "bootstrap: fetching MQTT.js $MQTTJS_VERSION into $MQTTJS_DIR"
    mkdir -p "$MQTTJS_DIR"
    npm install --silent --no-audit --no-fund --prefix "$MQTTJS_DIR" "mqtt@$MQTTJS_VERSION"
fi

"$PY" -m services.cli fetch-kafka
"$PY" -m services.cli analytics fetch-jars >/dev/null
