"""The TCP ports MQTT is served on (IANA's registrations, and docs/design.md's WebSocket ports).

The local cluster's HAProxy and the cloud's Network Load Balancer listen on these; ingest
nodes listen on whatever their settings say behind them.
"""

from __future__ import annotations

MQTT_PORT = 1883
"""MQTT over TCP (IANA "mqtt", MQTT 5.0 section 4.2)."""

MQTT_TLS_PORT = 8883
"""MQTT over TLS (IANA "secure-mqtt", MQTT 5.0 section 4.2)."""

MQTT_WS_PORT = 8083
"""MQTT over WebSocket (``ws://host:8083/mqtt``, MQTT 5.0 section 6): the local HAProxy's
port, and the ingest nodes' WebSocket listener behind a load balancer that ends TLS."""

MQTT_WSS_PORT = 8084
"""MQTT over WebSocket over TLS (``wss://host:8084/mqtt``): the local HAProxy's port, and the
ingest nodes' own TLS WebSocket listener when TLS passes through to them."""

MQTT_WSS_PUBLIC_PORT = 443
"""Where browsers and clients behind strict firewalls reach MQTT over WebSocket over TLS on
the internet (``wss://host/mqtt``): the HTTPS port."""
