"""The TCP ports MQTT is served on (IANA's registrations, and docs/design.md's WebSocket ports).

The local cluster's HAProxy and the cloud's Network Load Balancer listen on these; ingest
nodes listen on whatever their settings say behind them.
"""

from __future__ import annotations

MQTT_PORT = 1883
"""MQTT over TCP (IANA "mqtt", MQTT 5.0 section 4.2)."""

MQTT_TLS_PORT = 8883
"""MQTT over TLS (IANA "secure-mqtt", MQTT 5.0 section 4.2)."""
